// Type-level test of index.d.ts (`tsc -p tsconfig.json`, no emit): every export used as
// documented, and misuses that must not compile marked with @ts-expect-error. The runtime
// side of the same surface is test/exports.test.js.

// `ai` (v7) is an ES module: its types come in as such into this CommonJS-typed file.
declare const ai: typeof import('ai', { with: { 'resolution-mode': 'import' } })
const { tool: aiTool, generateText, stepCountIs } = ai
import {
  aiSdkTool,
  BackendUnavailableError,
  CancelledError,
  codeTool,
  commandTool,
  DeniedError,
  doctor,
  helperPath,
  InternalError,
  InvalidRequestError,
  LimitExceededError,
  LiveSandbox,
  removeSnapshot,
  Sandbox,
  Session,
  snapshots,
  SetupFailedError,
  StrataError,
  Tool,
  ToolFailedError,
  UnenforceableError,
  version,
} from 'strata-sandbox'
import type {
  AiSdkTool,
  BackendName,
  Caps,
  ContainerRuntime,
  DoctorReport,
  EgressDecision,
  EgressRefusal,
  ErrorCode,
  LimitKind,
  NetworkReceipt,
  Receipt,
  RunOptions,
  RunResult,
  SandboxTool,
  Secret,
  FileEntry,
  LiveEntry,
  LiveExecResult,
  LiveExit,
  LiveOutput,
  LiveProcess,
  PublishedPort,
  SnapshotInfo,
  ToolInput,
  ToolOutput,
  Transfer,
} from 'strata-sandbox'

async function sandboxes(): Promise<void> {
  const sandbox = new Sandbox()
  const configured = new Sandbox({ backend: 'process', strict: false, helper: helperPath })
  const backend: BackendName = configured.backend
  const strict: boolean = sandbox.strict
  // @ts-expect-error: not a backend
  new Sandbox({ backend: 'vm' })
  // @ts-expect-error: unknown option
  new Sandbox({ strictness: 'best_effort' })
  void backend
  void strict
}

async function runs(sandbox: Sandbox): Promise<void> {
  const tools: ToolInput[] = [
    ['echo', 'hi'],
    Tool.command(['ls', '-l']),
    Tool.script('python', 'print(1)'),
    Tool.script('javascript', 'console.log(1)'),
    Tool.script('sh', 'echo 1'),
    Tool.wasm('/tmp/module.wasm'),
    Tool.wasm('/tmp/module.wasm', ['--flag']),
  ]
  const caps: Caps = {
    readOnly: ['/data'],
    readWrite: '/out',
    mounts: [{ host: '/srv', guest: '/srv', access: 'ro' }, { host: '/cache', followSymlinks: true }],
    protectHostExecuted: true,
    system: 'runtime',
    env: { LANG: 'C' },
    net: 'none',
    stdin: Buffer.from('input'),
    workdir: '/work',
    timeoutMs: 5000,
    cpuTimeMs: 5000,
    memory: '256M',
    processes: 16,
    output: 1 << 20,
    fileSize: '1M',
    openFiles: 64,
    disk: '8M',
    addressSpace: '4G',
    cpus: 0.5,
    egressBytes: '100M',
    egressConnections: 8,
  }
  const token: Secret = { env: 'API_TOKEN', value: 'v', hosts: ['api.example.com', '*.example.org'] }
  const secretCaps: Caps = { net: 'allow:api.example.com:443', secrets: [token] }
  const sentWith: string[][] = []
  void secretCaps
  const containerCaps: Caps = { image: '/images/python-oci', runtime: 'native', workspace: '/srv/ws' }
  const runtimes: ContainerRuntime[] = ['native', 'docker', 'podman', 'runsc']
  void [containerCaps, runtimes]
  const nets: NonNullable<Caps['net']>[] = ['host', 'allow:pypi.org:443', ['pypi.org', { host: '1.1.1.1', port: 53 }], { allow: [] }]
  const controller = new AbortController()
  const options: RunOptions = {
    signal: controller.signal,
    onStdout: (chunk: Buffer) => process.stdout.write(chunk),
    onStderr: (chunk) => process.stderr.write(chunk),
    check: true,
  }
  for (const tool of tools) {
    const result: RunResult = await sandbox.run(tool, caps, options)
    const code: number | null = result.exitCode
    const signal: number | null = result.signal
    const limit: LimitKind | null = result.limit
    const text: string = result.stdout + result.stderr + result.status
    const flags: boolean[] = [result.timedOut, result.success, result.stdoutTruncated, result.stderrTruncated]
    const times: number[] = [result.durationMs, result.nativeMs, result.usage.peakMemoryBytes, result.usage.userCpuUs, result.usage.systemCpuUs]
    const receipt: Receipt = result.receipt
    const mechanisms: string[] = receipt.enforced.map((e) => `${e.capability}: ${e.mechanism} (${e.detail})`)
    const gaps: string[] = receipt.gaps.map((g) => g.reason)
    const digest: string | undefined = receipt.container?.digest
    const network: NetworkReceipt | undefined = receipt.network
    const refused: EgressDecision[] = network?.decisions.filter((d) => !d.allowed) ?? []
    const why: (EgressRefusal | undefined)[] = refused.map((d) => d.refusal)
    const budgets: (LimitKind | undefined)[] = refused.map((d) => d.limit)
    sentWith.push(...(network?.decisions.map((d) => d.secrets ?? []) ?? []))
    const moved: number = (network?.bytes ?? 0) + (network?.connections ?? 0) + (network?.dropped ?? 0)
    void [code, signal, limit, text, flags, times, mechanisms, gaps, receipt.denials, receipt.layers, digest]
    void [why, budgets, moved, network?.enforcer, network?.rules]
  }
  await sandbox.run(['true'])
  await sandbox.run(['true'], null)
  void nets
  // @ts-expect-error: a tool is never a shell string
  await sandbox.run('ls -l')
  // @ts-expect-error: unknown caps key
  await sandbox.run(['true'], { readonyl: '/etc' })
  // @ts-expect-error: durations are numbers of milliseconds
  await sandbox.run(['true'], { timeoutMs: '5s' })
  // @ts-expect-error: the Node name is egressBytes
  await sandbox.run(['true'], { egress_bytes: '1M' })
  // @ts-expect-error: a secret needs its value
  await sandbox.run(['true'], { net: 'allow:api.example.com', secrets: [{ env: 'T', hosts: ['api.example.com'] }] })
  // @ts-expect-error: a secret's hosts are a list
  await sandbox.run(['true'], { net: 'allow:api.example.com', secrets: [{ env: 'T', value: 'v', hosts: 'api.example.com' }] })
  // @ts-expect-error: a connection budget is a number
  await sandbox.run(['true'], { egressConnections: '8' })
  // @ts-expect-error: not a refusal family
  const refusal: EgressRefusal = 'timeout'
  void refusal
  // @ts-expect-error: unknown run option
  await sandbox.run(['true'], {}, { timeout: 5 })
  // @ts-expect-error: not a script language
  Tool.script('ruby', 'puts 1')
}

function errors(error: unknown): string {
  if (error instanceof StrataError) {
    const code: ErrorCode = error.code
    const details = [error.backend, error.guarantee, error.limit, error.stage, error.result?.stdout]
    void details
    return code
  }
  const all: StrataError[] = [
    new InvalidRequestError('m'),
    new DeniedError('m'),
    new BackendUnavailableError('m'),
    new UnenforceableError('m'),
    new LimitExceededError('m'),
    new ToolFailedError('m'),
    new CancelledError('m', { cause: new Error('why') }),
    new SetupFailedError('m'),
    new InternalError('m'),
    new StrataError('m', 'denied'),
  ]
  const cancelled: 'cancelled' = new CancelledError('m').code
  void cancelled
  return all.map((e) => e.code).join()
}

async function adapters(sandbox: Sandbox): Promise<void> {
  const python: SandboxTool<{ code: string }> = codeTool({ sandbox, language: 'python', caps: { readOnly: '/data' } })
  const shell = codeTool({ language: 'sh', name: 'shell', description: 'Runs sh.' })
  const command: SandboxTool<{ argv: string[] }> = commandTool({ caps: { timeoutMs: 1000 } })
  const output: ToolOutput = await python.execute({ code: 'print(1)' }, { signal: AbortSignal.timeout(1000) })
  await command.execute({ argv: ['ls'] })
  // @ts-expect-error: codeTool takes { code }
  await shell.execute({ argv: ['ls'] })
  // The generic shape as an OpenAI function-calling tool.
  const openAi = { type: 'function' as const, function: { name: python.name, description: python.description, parameters: python.parameters } }
  void openAi
  void output

  // The Vercel AI SDK: tool() of the real `ai` package accepts the adapter's result.
  const forAi: AiSdkTool<{ code: string }> = aiSdkTool(python)
  const viaTool = aiTool(forAi)
  const out = await viaTool.execute?.({ code: 'print(1)' }, { toolCallId: 'c', messages: [], context: {} })
  void out
  const tools = { python: aiSdkTool(python), command: aiSdkTool(command) }
  type Model = Parameters<typeof generateText>[0]['model']
  const call = (model: Model) => generateText({ model, tools, stopWhen: stepCountIs(3), prompt: 'hi' })
  void call
}

async function sessions(sandbox: Sandbox): Promise<void> {
  const s: Session = sandbox.session({ readOnly: '/data' }, { workdir: '/work', maxTransfer: '1M' })
  const r: RunResult = await s.run(['ls'], { timeoutMs: 0, onStdout: (c: Buffer) => void c })
  await s.writeFile('a.txt', 'text')
  await s.writeFile('b.bin', new Uint8Array([0]))
  const data: Buffer = await s.readFile('a.txt')
  const moved: Transfer = await s.upload('/tmp/x', 'x')
  const entries: FileEntry[] = await s.listFiles()
  const kinds: Array<'file' | 'dir' | 'symlink' | 'other'> = entries.map((e) => e.kind)
  await s.download('x', '/tmp/y')
  await s.remove('x')
  await s.close()
  // @ts-expect-error: session calls take no caps
  await s.run(['ls'], { readOnly: '/data' })
  void [r, data, moved, kinds, s.id, s.workdir, s.closed]
}

async function liveSandboxes(): Promise<void> {
  const live: LiveSandbox = await new Sandbox().start({ timeoutMs: 1000 }, { ttl: 60, publish: [8000] })
  const done: LiveExecResult = await live.exec(['ls'], { env: { A: 'b' }, timeout: 5, stdin: 'x' })
  const out: Buffer = done.stdout
  const pid: number = await live.spawn(['sh', '-i'], { tty: { rows: 24, cols: 80 } })
  for await (const chunk of live.output(pid, { signal: AbortSignal.timeout(1000) })) {
    const c: LiveOutput = chunk
    void c
  }
  const ended: LiveExit = await live.wait(pid)
  const listed: LiveProcess[] = await live.ps()
  const how: 'freezer' | 'signals' | 'vm' = await live.pause()
  await live.resume()
  const port: PublishedPort = await live.publish(8001, { hostPort: 0 })
  const entries: LiveEntry[] = await live.listDir('/tmp')
  const again: LiveSandbox = await LiveSandbox.attach(live.id)
  const snap: SnapshotInfo = await live.snapshot({ name: 'n', snapshotDir: '/tmp/s' })
  const carried: string[] = snap.carries
  const children: LiveSandbox[] = await live.fork(2, { ttl: 60 })
  const restored: LiveSandbox = await new Sandbox().startFrom('n', { snapshotDir: '/tmp/s', ttl: 5 })
  const all: SnapshotInfo[] = await snapshots({ snapshotDir: '/tmp/s' })
  await removeSnapshot('n')
  void [carried, children, restored, all]
  // @ts-expect-error: argv, never a shell string
  await live.exec('ls -l')
  await live.stop()
  void [out, ended, listed, how, port, entries, again, live.stopped]
}

const report: DoctorReport = doctor()
const available: string[] = report.backends.filter((b) => b.available).map((b) => b.backend)
const withHelper: DoctorReport = doctor({ helper: helperPath })
const v: string = version
void [available, withHelper, v, sandboxes, runs, errors, adapters, sessions, liveSandboxes]
