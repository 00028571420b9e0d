// Type-level test of vercel.d.ts (`tsc -p tsconfig.json`, no emit): the classes used as
// documented, and checked against the real upstream types they mirror: the AI SDK's
// Experimental_SandboxSession (ai 7) and bash-tool's sandbox types. Those packages are ES
// modules, so their types are imported as such into this CommonJS-typed file.

import type { Experimental_SandboxSession, Experimental_SandboxProcess } from 'ai' with { 'resolution-mode': 'import' }
import type { CreateBashToolOptions, VercelSandboxInstance } from 'bash-tool' with { 'resolution-mode': 'import' }
import { type LiveSandbox, Sandbox } from 'strata-sandbox'
import {
  Command,
  CommandFinished,
  type LogLine,
  type SessionLike,
  StrataSandbox,
  StrataSandboxSession,
} from 'strata-sandbox/vercel'

declare const ai: typeof import('ai', { with: { 'resolution-mode': 'import' } })
declare const session: SessionLike

export async function vercelShape(): Promise<void> {
  const sandbox = await StrataSandbox.create({ sandbox: new Sandbox(), caps: { timeoutMs: 10_000 }, workdir: '/workspace' })
  const wrapped = new StrataSandbox(session, { caps: { net: 'none' } })
  const id: string = wrapped.sandboxId + sandbox.name + sandbox.cwd
  void id

  const done: CommandFinished = await sandbox.runCommand('ls', ['-l'], { signal: AbortSignal.timeout(1000) })
  const code: number = done.exitCode
  const text: string = await done.stdout()
  void code
  void text
  const running: Command = await sandbox.runCommand({ cmd: 'sleep', args: ['5'], detached: true, env: { A: 'b' }, cwd: 'sub' })
  // @ts-expect-error: a running command's exit code may be null
  const notYet: number = running.exitCode
  void notYet
  for await (const line of running.logs()) {
    const l: LogLine = line
    if (l.stream === 'stdout') process.stdout.write(l.data)
  }
  const finished: CommandFinished = await running.wait({ signal: AbortSignal.timeout(1000) })
  void finished
  await running.kill('SIGKILL')
  await running.kill(15)
  // @ts-expect-error: not a signal that ends a command
  await running.kill('SIGSTOP')
  const waited: CommandFinished = await sandbox.runCommand({ cmd: 'true' })
  void waited

  await sandbox.writeFiles([{ path: 'a.txt', content: Buffer.from('a') }, { path: 'b.sh', content: '#!/bin/sh\n', mode: 0o755 }])
  const stream = await sandbox.readFile({ path: 'a.txt' })
  stream?.pipe(process.stdout)
  const bytes: Buffer | null = await sandbox.readFileToBuffer({ path: 'a.txt', cwd: '/workspace' })
  void bytes
  const host: string | null = await sandbox.downloadFile({ path: 'a.txt' }, { path: '/tmp/a.txt' }, { mkdirRecursive: true })
  void host
  await sandbox.mkDir('x/y')
  await sandbox.stop()
  // @ts-expect-error: commands are argv, not one shell string with options
  await sandbox.runCommand({ command: 'ls' })

  // bash-tool takes it where it takes a @vercel/sandbox instance.
  const asVercel: VercelSandboxInstance = sandbox
  const bashOptions: CreateBashToolOptions = { sandbox, destination: sandbox.cwd }
  void asVercel
  void bashOptions
}

export async function liveShape(live: LiveSandbox): Promise<void> {
  const sandbox = await StrataSandbox.create({ live: true, ports: [3000], timeout: 600_000, caps: { memory: '1G' } })
  const url: string = sandbox.domain(3000)
  void url
  const server: Command = await sandbox.runCommand({ cmd: 'npm', args: ['run', 'dev'], detached: true })
  const result = server.result
  if (result && 'durationMs' in result) void result.durationMs
  const onLive = new StrataSandboxSession(live, { workdir: '/work' })
  const fromLiveSandbox = new StrataSandboxSession(sandbox)
  void onLive
  void fromLiveSandbox
  const attached = new StrataSandbox(live, { workdir: '/work', ports: [{ hostIp: '127.0.0.1', hostPort: 4000, guestPort: 3000 }] })
  const inner: LiveSandbox | null = attached.live
  void inner
  // @ts-expect-error: ports are numbers
  await StrataSandbox.create({ live: true, ports: ['3000'] })
  await sandbox.stop()
}

export async function aiSdkShape(): Promise<void> {
  const sandboxSession = new StrataSandboxSession(session, { timeoutMs: 5000 })
  const fromSandbox = new StrataSandboxSession(await StrataSandbox.create(), { description: 'mine' })
  void fromSandbox

  // It is an Experimental_SandboxSession of the real `ai` package.
  const upstream: Experimental_SandboxSession = sandboxSession
  const proc: Experimental_SandboxProcess = await upstream.spawn({ command: 'ls' })
  void proc
  const { exitCode, stdout } = await sandboxSession.run({ command: 'echo hi', env: { A: 'b' }, workingDirectory: 'sub' })
  void exitCode
  void stdout
  const spawned = await sandboxSession.spawn({ command: 'sleep 1' })
  const reader = spawned.stdout.getReader()
  void reader
  await spawned.kill()
  const writable = await sandboxSession.spawn({ command: 'cat', stdin: true })
  const input: WritableStream<Uint8Array> = writable.stdin
  void input
  const text: string | null = await sandboxSession.readTextFile({ path: 'a.txt', startLine: 1, endLine: 2 })
  void text
  const entries = await sandboxSession.listDirectory({ path: '.' })
  entries?.forEach((entry) => entry.type === 'symlink')

  type Model = Parameters<typeof ai.generateText>[0]['model']
  const call = (model: Model) =>
    ai.generateText({
      model,
      prompt: 'hi',
      experimental_sandbox: sandboxSession,
      tools: {
        shell: ai.tool({
          description: ({ experimental_sandbox }) => `Runs bash. ${experimental_sandbox?.description ?? ''}`,
          inputSchema: ai.jsonSchema<{ command: string }>({ type: 'object', properties: { command: { type: 'string' } } }),
          execute: async ({ command }, { experimental_sandbox }) => experimental_sandbox?.run({ command }),
        }),
      },
    })
  void call
}
