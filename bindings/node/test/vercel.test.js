'use strict'
// `strata-sandbox/vercel` on real Strata sessions: the @vercel/sandbox shape (StrataSandbox)
// driven directly and through the real `bash-tool` package (its createBashTool takes it as
// a Vercel sandbox) inside a real `ai` generateText loop, and the AI SDK's
// Experimental_SandboxSession shape (StrataSandboxSession) driven directly and as
// `experimental_sandbox` of a real generateText call. The models are the SDK's own mock
// models (`ai/test`): no network, no model calls.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { PassThrough } = require('node:stream')
const ts = require('typescript')

const { Sandbox, LiveSandbox, InvalidRequestError, CancelledError } = require('..')
const vercel = require('../vercel.js')
const { StrataSandbox, Command, CommandFinished, StrataSandboxSession } = vercel
const { tempDir, marker, processesWith, rejection } = require('./helpers.js')

const CAPS = { timeoutMs: 20_000 }

/** A StrataSandbox on a fresh session, stopped when the test ends. */
async function strataSandbox(t, params = {}) {
  const sandbox = await StrataSandbox.create({ caps: CAPS, ...params })
  t.after(() => sandbox.stop())
  return sandbox
}

/** A StrataSandboxSession on a fresh session, closed when the test ends. */
function sandboxSession(t, options) {
  const session = new Sandbox().session(CAPS)
  t.after(() => session.close())
  return new StrataSandboxSession(session, options)
}

async function streamText(stream) {
  const chunks = []
  for await (const chunk of stream) chunks.push(Buffer.from(chunk))
  return Buffer.concat(chunks).toString('utf8')
}

async function webStreamBytes(stream) {
  const chunks = []
  const reader = stream.getReader()
  for (;;) {
    const { value, done } = await reader.read()
    if (done) return Buffer.concat(chunks)
    assert.ok(value instanceof Uint8Array)
    chunks.push(Buffer.from(value))
  }
}

const ALL_BYTES = Buffer.from(Array.from({ length: 256 }, (_, i) => i))

describe('package surface', () => {
  test('vercel.d.ts declares exactly the runtime exports, and ES modules get them', async () => {
    const file = path.join(__dirname, '..', 'vercel.d.ts')
    const source = ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.ES2022, true)
    const classes = source.statements
      .filter((s) => ts.isClassDeclaration(s) && ts.getCombinedModifierFlags(s) & ts.ModifierFlags.Export)
      .map((s) => s.name.text)
    assert.deepEqual(classes.sort(), Object.keys(vercel).sort())
    const esm = await import('strata-sandbox/vercel')
    for (const name of Object.keys(vercel)) assert.equal(esm[name], vercel[name], name)
  })

  test('the package exports and ships the subpath', () => {
    const pkg = require('../package.json')
    assert.deepEqual(pkg.exports['./vercel'], { types: './vercel.d.ts', default: './vercel.js' })
    for (const file of ['vercel.js', 'vercel.d.ts']) assert.ok(pkg.files.includes(file), file)
  })
})

describe('StrataSandbox (the @vercel/sandbox Sandbox shape)', () => {
  test('runCommand(cmd, args) waits and returns a CommandFinished', async (t) => {
    const sandbox = await strataSandbox(t)
    assert.match(sandbox.sandboxId, /^s-[0-9a-f]{32}$/)
    assert.equal(sandbox.name, sandbox.sandboxId)
    assert.equal(sandbox.sandboxId, sandbox.session.id)
    assert.equal(sandbox.cwd, '/workspace')
    assert.equal(sandbox.status, 'running')
    const done = await sandbox.runCommand('sh', ['-c', 'echo out; echo err >&2; pwd'])
    assert.ok(done instanceof CommandFinished)
    assert.equal(done.exitCode, 0)
    assert.equal(done.cwd, '/workspace')
    assert.match(done.cmdId, /^cmd_[0-9a-f]+$/)
    assert.equal(await done.stdout(), 'out\n/workspace\n')
    assert.equal(await done.stderr(), 'err\n')
    // Both streams, each in order (how lines of the two interleave depends on the pipes).
    assert.deepEqual((await done.output('both')).split('\n').sort(), ['', '/workspace', 'err', 'out'])
    assert.equal(done.result.exitCode, 0)
    assert.equal(await done.wait(), done)
  })

  test('a failing command is data; refusals and sudo reject', async (t) => {
    const sandbox = await strataSandbox(t)
    const failed = await sandbox.runCommand('sh', ['-c', 'echo nope >&2; exit 3'])
    assert.equal(failed.exitCode, 3)
    assert.equal(await failed.stderr(), 'nope\n')
    assert.ok((await rejection(sandbox.runCommand({ cmd: 'id', sudo: true }))) instanceof InvalidRequestError)
    assert.ok((await rejection(sandbox.runCommand({ cmd: 'id', nope: 1 }))) instanceof InvalidRequestError)
    assert.ok((await rejection(sandbox.runCommand(''))) instanceof InvalidRequestError)
  })

  test('the object form: cwd, env, and stdout/stderr writables', async (t) => {
    const sandbox = await strataSandbox(t)
    await sandbox.mkDir('sub/deeper')
    await sandbox.mkDir('sub/deeper') // like mkdir -p: no error when it exists
    const out = new PassThrough()
    const err = new PassThrough()
    const outText = streamText(out)
    const errText = streamText(err)
    const done = await sandbox.runCommand({
      cmd: 'sh',
      args: ['-c', 'pwd; echo "$GREETING $OTHER"; echo warn >&2'],
      cwd: 'sub/deeper',
      env: { GREETING: 'hello', OTHER: 'a b=c' },
      stdout: out,
      stderr: err,
    })
    out.end()
    err.end()
    assert.equal(done.exitCode, 0)
    assert.equal(done.cwd, '/workspace/sub/deeper')
    assert.equal(await done.stdout(), '/workspace/sub/deeper\nhello a b=c\n')
    assert.equal(await outText, '/workspace/sub/deeper\nhello a b=c\n')
    assert.equal(await errText, 'warn\n')
    // An absolute cwd, and a program whose name has a `=` (not read as a variable).
    const abs = await sandbox.runCommand({ cmd: 'pwd', cwd: '/workspace/sub' })
    assert.equal(await abs.stdout(), '/workspace/sub\n')
    await sandbox.writeFiles([{ path: 'sub/a=b', content: '#!/bin/sh\necho ran "$X"\n', mode: 0o755 }])
    const odd = await sandbox.runCommand({ cmd: './a=b', cwd: 'sub', env: { X: 'x' } })
    assert.equal(await odd.stdout(), 'ran x\n')
    assert.ok((await rejection(sandbox.runCommand({ cmd: 'true', env: { 'BAD NAME': 'x' } }))) instanceof InvalidRequestError)
  })

  test('writeFiles, readFile (a Node stream), readFileToBuffer: binary exact, null when missing', async (t) => {
    const sandbox = await strataSandbox(t)
    await sandbox.writeFiles([
      { path: 'bin/all.bytes', content: ALL_BYTES },
      { path: '/workspace/notes/hello.txt', content: 'héllo\n' },
      { path: 'u8.bin', content: new Uint8Array([1, 2, 3]) },
    ])
    const stream = await sandbox.readFile({ path: 'bin/all.bytes' })
    assert.ok(stream && typeof stream.pipe === 'function', 'a Node.js readable stream')
    const chunks = []
    for await (const chunk of stream) chunks.push(chunk)
    assert.deepEqual(Buffer.concat(chunks), ALL_BYTES)
    assert.deepEqual(await sandbox.readFileToBuffer({ path: '/workspace/bin/all.bytes' }), ALL_BYTES)
    assert.equal((await sandbox.readFileToBuffer({ path: 'hello.txt', cwd: 'notes' })).toString(), 'héllo\n')
    assert.deepEqual([...(await sandbox.readFileToBuffer({ path: 'u8.bin' }))], [1, 2, 3])
    // Commands see the files, and what they write is read back.
    const seen = await sandbox.runCommand('sh', ['-c', 'cat notes/hello.txt; wc -c < bin/all.bytes; echo made > made.txt'])
    assert.equal(await seen.stdout(), 'héllo\n256\n')
    assert.equal((await sandbox.readFileToBuffer({ path: 'made.txt' })).toString(), 'made\n')
    // Missing files are null, as in @vercel/sandbox.
    assert.equal(await sandbox.readFile({ path: 'nope.txt' }), null)
    assert.equal(await sandbox.readFileToBuffer({ path: 'no/such/dir/file' }), null)
    assert.equal(await sandbox.readFileToBuffer({ path: 'made.txt/below' }), null)
    // Paths outside the session's directory are refused, never read.
    assert.ok((await rejection(sandbox.readFileToBuffer({ path: '/etc/passwd' }))) instanceof InvalidRequestError)
    assert.ok((await rejection(sandbox.readFileToBuffer({ path: '../../etc/passwd' }))) instanceof InvalidRequestError)
    assert.ok((await rejection(sandbox.writeFiles([{ path: '/tmp/x', content: 'x' }]))) instanceof InvalidRequestError)
  })

  test('writeFiles applies a mode; downloadFile copies to the host', async (t) => {
    const sandbox = await strataSandbox(t)
    await sandbox.writeFiles([{ path: 'tool.sh', content: '#!/bin/sh\necho tool ran\n', mode: 0o755 }])
    const ran = await sandbox.runCommand('./tool.sh')
    assert.equal(ran.exitCode, 0)
    assert.equal(await ran.stdout(), 'tool ran\n')
    const dir = tempDir(t)
    const out = await sandbox.downloadFile({ path: 'tool.sh' }, { path: 'nested/copy.sh', cwd: dir }, { mkdirRecursive: true })
    assert.equal(out, path.join(dir, 'nested/copy.sh'))
    assert.equal(fs.readFileSync(out, 'utf8'), '#!/bin/sh\necho tool ran\n')
    assert.equal(await sandbox.downloadFile({ path: 'missing' }, { path: path.join(dir, 'x') }), null)
    assert.equal(fs.existsSync(path.join(dir, 'x')), false)
  })

  test('detached: logs() streams lines in order (replayed from the start), wait() ends it', async (t) => {
    const sandbox = await strataSandbox(t)
    const command = await sandbox.runCommand({
      cmd: 'sh',
      args: ['-c', 'echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; exit 4'],
      detached: true,
    })
    assert.ok(command instanceof Command)
    assert.ok(!(command instanceof CommandFinished))
    assert.equal(command.exitCode, null)
    assert.equal((await sandbox.getCommand(command.cmdId)).cmdId, command.cmdId)
    const lines = []
    for await (const line of command.logs()) lines.push(line)
    assert.deepEqual(lines, [
      { stream: 'stdout', data: 'one\n' },
      { stream: 'stderr', data: 'two\n' },
      { stream: 'stdout', data: 'three\n' },
    ])
    const finished = await command.wait()
    assert.ok(finished instanceof CommandFinished)
    assert.equal(finished.exitCode, 4)
    assert.equal(command.exitCode, 4)
    assert.equal(await finished.stdout(), 'one\nthree\n')
    const again = []
    for await (const line of finished.logs()) again.push(line.data)
    assert.deepEqual(again, ['one\n', 'two\n', 'three\n'])
    assert.ok((await rejection(sandbox.getCommand(command.cmdId))) instanceof InvalidRequestError)
  })

  test('detached: kill() ends the command and everything it started', async (t) => {
    const sandbox = await strataSandbox(t)
    const tag = marker()
    const command = await sandbox.runCommand({
      cmd: 'sh',
      args: ['-c', 'echo started; sleep 1000 & exec sleep 1000'],
      env: { TAG: tag },
      detached: true,
      timeoutMs: 0,
    })
    const logs = command.logs()
    assert.deepEqual((await logs.next()).value, { stream: 'stdout', data: 'started\n' })
    assert.ok(processesWith(tag).length >= 1, 'the command runs')
    const began = Date.now()
    await command.kill()
    const finished = await command.wait()
    assert.equal(finished.exitCode, 128 + 15)
    assert.ok(Date.now() - began < 10_000)
    assert.deepEqual(processesWith(tag), [])
    assert.equal((await logs.next()).done, true)
    await command.kill() // idempotent
    const other = await sandbox.runCommand({ cmd: 'sleep', args: ['1000'], detached: true })
    await other.kill('SIGKILL')
    assert.equal((await other.wait()).exitCode, 137)
    await assert.rejects(other.kill('SIGSTOP'), InvalidRequestError)
  })

  test('signal cancels a call; wait({ signal }) only stops waiting; logs().close() ends iteration', async (t) => {
    const sandbox = await strataSandbox(t)
    const error = await rejection(sandbox.runCommand('sleep', ['1000'], { signal: AbortSignal.timeout(300) }))
    assert.ok(error instanceof CancelledError, String(error))
    const detached = await sandbox.runCommand({ cmd: 'sleep', args: ['1000'], detached: true, signal: AbortSignal.timeout(300) })
    assert.ok((await rejection(detached.wait())) instanceof CancelledError)

    const long = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'echo hi; exec sleep 1000'], detached: true })
    const waitError = await rejection(long.wait({ signal: AbortSignal.timeout(200) }))
    assert.equal(waitError.name, 'TimeoutError')
    assert.equal(long.exitCode, null, 'still running')
    const logs = long.logs()
    assert.equal((await logs.next()).value.data, 'hi\n')
    const pending = logs.next()
    logs.close()
    assert.equal((await pending).done, true)
    await long.kill()
  })

  test('domain() throws: no inbound network', async (t) => {
    const sandbox = await strataSandbox(t)
    assert.throws(() => sandbox.domain(3000), /No route for port 3000/)
  })

  test('stop() kills running commands and closes the session; stop is idempotent', async () => {
    const sandbox = await StrataSandbox.create({ caps: CAPS })
    await sandbox.writeFiles([{ path: 'a.txt', content: 'a' }])
    const running = await sandbox.runCommand({ cmd: 'sleep', args: ['1000'], detached: true, timeoutMs: 0 })
    await sandbox.stop()
    assert.equal((await running.wait()).exitCode, 137)
    assert.equal(sandbox.status, 'stopped')
    assert.equal(sandbox.session.closed, true)
    assert.ok((await rejection(sandbox.runCommand('true'))) instanceof InvalidRequestError)
    assert.ok((await rejection(sandbox.readFileToBuffer({ path: 'a.txt' }))) instanceof InvalidRequestError)
    await sandbox.stop()
  })

  test('wraps an existing session, with its workdir', async (t) => {
    const session = new Sandbox().session(CAPS, { workdir: '/work' })
    t.after(() => session.close())
    const sandbox = new StrataSandbox(session)
    assert.equal(sandbox.cwd, '/work')
    await sandbox.writeFiles([{ path: 'x.txt', content: 'x' }])
    assert.equal(await (await sandbox.runCommand('cat', ['/work/x.txt'])).stdout(), 'x')
    assert.throws(() => new StrataSandbox({}), InvalidRequestError)
  })
})

/** A StrataSandbox on a fresh live sandbox, stopped when the test ends. */
async function liveSandbox(t, params = {}) {
  const sandbox = await StrataSandbox.create({ live: true, ...params })
  t.after(() => sandbox.stop())
  return sandbox
}

async function until(what, done, ms = 20000) {
  const deadline = Date.now() + ms
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

describe('StrataSandbox on a live sandbox (create({ live: true }))', () => {
  test('a detached server keeps running between commands and its published port reaches it', async (t) => {
    const sandbox = await liveSandbox(t, { ports: [8000] })
    assert.ok(sandbox.live instanceof LiveSandbox)
    assert.equal(sandbox.sandboxId, sandbox.live.id)
    assert.equal(sandbox.cwd, '/workspace')
    await sandbox.writeFiles([{ path: 'site/index.html', content: 'served from the sandbox\n' }])
    const server = await sandbox.runCommand({
      cmd: 'python3',
      args: ['-u', '-m', 'http.server', '8000', '--bind', '127.0.0.1'],
      cwd: 'site',
      detached: true,
    })
    assert.equal(server.exitCode, null)
    const url = sandbox.domain(8000)
    assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/)
    // Its first line says it listens (before that, a connection to the port is reset).
    for await (const line of server.logs()) if (line.data.includes('Serving HTTP')) break
    const response = await fetch(`${url}/index.html`, { signal: AbortSignal.timeout(20000) })
    assert.equal(await response.text(), 'served from the sandbox\n')
    // Later commands run in the same sandbox, next to the server.
    const listed = await sandbox.runCommand('sh', ['-c', 'ls site; kill -0 $(pgrep -f http.server) && echo alive'])
    assert.equal(await listed.stdout(), 'index.html\nalive\n')
    assert.throws(() => sandbox.domain(9000), /No route for port 9000: publish it/)
    await server.kill('SIGKILL')
    assert.equal(server.exitCode, 137)
  })

  test('kill() sends its signal to that command only: a trap runs and the sandbox goes on', async (t) => {
    const sandbox = await liveSandbox(t)
    const command = await sandbox.runCommand({
      cmd: 'sh',
      args: ['-c', 'trap "echo got TERM; exit 3" TERM; echo ready; while :; do sleep 0.05; done'],
      detached: true,
    })
    for await (const line of command.logs()) if (line.data.includes('ready')) break
    await command.kill('SIGTERM')
    const finished = await command.wait()
    assert.equal(finished.exitCode, 3)
    assert.match(await finished.stdout(), /ready\ngot TERM\n/)
    assert.equal(finished.result.exitCode, 3)
    assert.equal(typeof finished.result.durationMs, 'number')
    const after = await sandbox.runCommand('echo', ['still here'])
    assert.equal(await after.stdout(), 'still here\n')
  })

  test('cwd, env and exit codes; signal cancels a command with a CancelledError', async (t) => {
    const sandbox = await liveSandbox(t)
    await sandbox.mkDir('a/b')
    const result = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'pwd; echo $GREETING; exit 5'], cwd: 'a/b', env: { GREETING: 'hi' } })
    assert.ok(result instanceof CommandFinished)
    assert.equal(result.exitCode, 5)
    assert.equal(await result.stdout(), '/workspace/a/b\nhi\n')
    const controller = new AbortController()
    const running = sandbox.runCommand({ cmd: 'sleep', args: ['1000'], signal: controller.signal })
    setTimeout(() => controller.abort(), 200)
    assert.ok((await rejection(running)) instanceof CancelledError)
    await assert.rejects(sandbox.runCommand({ cmd: 'true', env: { 'BAD NAME': 'x' } }), InvalidRequestError)
    await assert.rejects(sandbox.runCommand({ cmd: 'true', sudo: true }), InvalidRequestError)
  })

  test('files: written where commands see them, binary exact, null when missing, modes applied', async (t) => {
    const sandbox = await liveSandbox(t)
    const bytes = Buffer.from([0, 1, 2, 255, 254, 10])
    await sandbox.writeFiles([
      { path: 'bin.dat', content: bytes },
      { path: 'tool.sh', content: '#!/bin/sh\necho tool ran\n', mode: 0o755 },
    ])
    assert.deepEqual(await sandbox.readFileToBuffer({ path: '/workspace/bin.dat' }), bytes)
    assert.equal(await (await sandbox.runCommand('./tool.sh')).stdout(), 'tool ran\n')
    await sandbox.runCommand('sh', ['-c', 'echo made by a command > made.txt'])
    assert.equal((await sandbox.readFileToBuffer({ path: 'made.txt' })).toString(), 'made by a command\n')
    assert.equal(await sandbox.readFileToBuffer({ path: 'missing.txt' }), null)
    assert.equal(await sandbox.readFile({ path: 'missing.txt' }), null)
  })

  test('stop() ends every process of the sandbox (its commands end with 137) and removes its workdir', async () => {
    const workdirs = () => fs.readdirSync(fs.realpathSync(os.tmpdir())).filter((name) => name.startsWith('strata-vercel-'))
    const before = workdirs()
    const sandbox = await StrataSandbox.create({ live: true })
    assert.equal(workdirs().length, before.length + 1)
    const tag = marker()
    const running = await sandbox.runCommand({ cmd: 'sh', args: ['-c', 'setsid sleep 1000 & exec sleep 1000'], env: { TAG: tag }, detached: true })
    await until('its processes run', () => processesWith(tag).length >= 2)
    await sandbox.stop()
    assert.equal((await running.wait()).exitCode, 137)
    assert.equal(sandbox.status, 'stopped')
    assert.deepEqual(processesWith(tag), [], 'nothing of the sandbox is left, not even what left with setsid')
    assert.deepEqual(workdirs(), before, 'its private workdir is gone')
    await sandbox.stop()
  })

  test('bad create parameters are refused before anything starts', async () => {
    await assert.rejects(StrataSandbox.create({ ports: [8000] }), /need a live sandbox/)
    await assert.rejects(StrataSandbox.create({ live: 'yes' }), InvalidRequestError)
    await assert.rejects(StrataSandbox.create({ live: true, timeout: -1 }), InvalidRequestError)
    await assert.rejects(StrataSandbox.create({ live: true, maxTransfer: 1 }), InvalidRequestError)
    await assert.rejects(StrataSandbox.create({ live: true, ports: [70000] }), InvalidRequestError)
    assert.throws(() => new StrataSandboxSession({ live: true }), InvalidRequestError)
    assert.throws(() => new StrataSandboxSession(new Sandbox().session(), { workdir: '/tmp' }), /live sandbox/)
  })

  test('StrataSandboxSession on it: background processes survive between runs, spawn takes stdin, files', async (t) => {
    const sandbox = await liveSandbox(t)
    const session = new StrataSandboxSession(sandbox)
    assert.match(session.description, /all in the same sandbox/)
    await session.run({ command: 'sleep 1000 & echo $! > bg.pid' })
    const alive = await session.run({ command: 'kill -0 $(cat bg.pid) && echo alive; pwd' })
    assert.deepEqual(alive, { exitCode: 0, stdout: 'alive\n/workspace\n', stderr: '' })
    const reader = await session.spawn({ command: 'read a; echo got:$a; echo err >&2; exit 2', stdin: true })
    const writer = reader.stdin.getWriter()
    await writer.write(new TextEncoder().encode('hi\n'))
    await writer.close()
    const [out, err] = await Promise.all([streamText(reader.stdout), streamText(reader.stderr)])
    assert.deepEqual([out, err, (await reader.wait()).exitCode], ['got:hi\n', 'err\n', 2])
    const sleeper = await session.spawn({ command: 'sleep 1000' })
    await sleeper.kill()
    assert.equal((await sleeper.wait()).exitCode, 137)
    const controller = new AbortController()
    const aborted = session.run({ command: 'sleep 1000', abortSignal: controller.signal })
    setTimeout(() => controller.abort(), 200)
    assert.ok((await rejection(aborted)) instanceof CancelledError)
    await session.writeTextFile({ path: 'notes/a.txt', content: 'note' })
    assert.equal(await session.readTextFile({ path: 'notes/a.txt' }), 'note')
    assert.deepEqual(await session.stat({ path: 'notes/a.txt' }), { type: 'file', size: 4 })
    assert.deepEqual(await session.listDirectory({ path: 'notes' }), [{ name: 'a.txt', type: 'file' }])
    assert.equal(await session.deleteFile({ path: 'notes/a.txt' }), true)
    assert.equal(await session.readTextFile({ path: 'notes/a.txt' }), null)
    assert.equal(await session.deleteFile({ path: 'notes/a.txt' }), false)
  })

  test('bash-tool (the real package) runs its tools in the live sandbox', async (t) => {
    const { createBashTool } = await import('bash-tool')
    const sandbox = await liveSandbox(t)
    const { tools } = await createBashTool({ sandbox, destination: sandbox.cwd, files: { 'data/n.txt': '4\n5\n' } })
    const options = { toolCallId: 'c', messages: [], context: {} }
    const summed = await tools.bash.execute({ command: "awk '{ s += $1 } END { print s }' data/n.txt" }, options)
    assert.deepEqual(summed, { stdout: '9\n', stderr: '', exitCode: 0 })
    // A background process started by one tool call is there for the next one.
    await tools.bash.execute({ command: 'sleep 1000 & echo $! > bg.pid' }, options)
    const alive = await tools.bash.execute({ command: 'kill -0 $(cat bg.pid) && echo alive' }, options)
    assert.equal(alive.stdout, 'alive\n')
  })
})

describe('bash-tool (the real package) on a StrataSandbox', () => {
  test('createBashTool takes it as a Vercel sandbox: bash, readFile and writeFile tools', async (t) => {
    const { createBashTool } = await import('bash-tool')
    const sandbox = await strataSandbox(t)
    const { tools, bash } = await createBashTool({
      sandbox,
      destination: sandbox.cwd,
      files: { 'data/numbers.txt': '1\n2\n3\n' },
    })
    assert.match(bash.description, /WORKING DIRECTORY: \/workspace/)
    assert.match(bash.description, /data\/numbers\.txt/)
    const options = { toolCallId: 'c', messages: [], context: {} }
    const summed = await tools.bash.execute({ command: "awk '{ s += $1 } END { print s }' data/numbers.txt" }, options)
    assert.deepEqual(summed, { stdout: '6\n', stderr: '', exitCode: 0 })
    assert.deepEqual(await tools.writeFile.execute({ path: 'out/report.md', content: '# six\n' }, options), { success: true })
    assert.equal((await sandbox.readFileToBuffer({ path: 'out/report.md' })).toString(), '# six\n')
    assert.deepEqual(await tools.readFile.execute({ path: 'data/numbers.txt' }, options), { content: '1\n2\n3\n' })
    const failed = await tools.bash.execute({ command: 'cat missing.txt' }, options)
    assert.equal(failed.exitCode, 1)
    assert.match(failed.stderr, /missing\.txt/)
  })

  test('a generateText loop runs the bash tool in the session', async (t) => {
    const ai = require('ai')
    const { MockLanguageModelV4 } = require('ai/test')
    const { createBashTool } = await import('bash-tool')
    const sandbox = await strataSandbox(t)
    await sandbox.writeFiles([{ path: 'src/app.py', content: 'print("hi")\n' }])
    const { tools } = await createBashTool({ sandbox, destination: sandbox.cwd })
    const model = scriptedModel(MockLanguageModelV4, [
      { toolName: 'writeFile', input: { path: 'src/test_app.py', content: 'assert 1 + 1 == 2\n' } },
      { toolName: 'bash', input: { command: 'ls src && python3 src/test_app.py && echo passed' } },
    ])
    const result = await ai.generateText({ model, tools, prompt: 'add a test and run it', stopWhen: ai.stepCountIs(5) })
    assert.equal(result.text, 'done')
    const bashResult = result.steps[1].toolResults[0]
    assert.equal(bashResult.toolName, 'bash')
    assert.deepEqual(bashResult.output, { stdout: 'app.py\ntest_app.py\npassed\n', stderr: '', exitCode: 0 })
  })
})

/** A mock model that calls the given tools one step each, then answers 'done'. */
function scriptedModel(MockModel, calls) {
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 1, text: 1, reasoning: undefined },
  }
  let step = 0
  return new MockModel({
    doGenerate: async () => {
      const call = calls[step++]
      if (!call) {
        return { content: [{ type: 'text', text: 'done' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] }
      }
      return {
        content: [{ type: 'tool-call', toolCallId: `call-${step}`, toolName: call.toolName, input: JSON.stringify(call.input) }],
        finishReason: { unified: 'tool-calls', raw: undefined },
        usage,
        warnings: [],
      }
    },
  })
}

describe('StrataSandboxSession (the AI SDK Experimental_SandboxSession shape)', () => {
  test('run: bash, workingDirectory, env, exit codes; abortSignal kills', async (t) => {
    const sandbox = sandboxSession(t)
    assert.match(sandbox.description, /Strata sandbox session s-[0-9a-f]{32}/)
    assert.match(sandbox.description, /\/workspace/)
    assert.deepEqual(await sandbox.run({ command: 'echo "$((6 * 7))"; echo e >&2; [[ 1 == 1 ]] && exit 5' }), {
      exitCode: 5,
      stdout: '42\n',
      stderr: 'e\n',
    })
    await sandbox.writeTextFile({ path: 'dir/keep.txt', content: 'k' })
    const where = await sandbox.run({ command: 'pwd; ls; echo "$NAME"', workingDirectory: 'dir', env: { NAME: 'strata' } })
    assert.deepEqual(where, { exitCode: 0, stdout: '/workspace/dir\nkeep.txt\nstrata\n', stderr: '' })
    const error = await rejection(sandbox.run({ command: 'sleep 1000', abortSignal: AbortSignal.timeout(300) }))
    assert.equal(error.name, 'AbortError')
    const aborted = AbortSignal.abort()
    assert.equal((await rejection(sandbox.run({ command: 'touch ran', abortSignal: aborted }))).name, 'AbortError')
    assert.equal(await sandbox.readFile({ path: 'ran' }), null)
  })

  test('spawn: stdout/stderr byte streams while it runs, wait() for the exit code', async (t) => {
    const sandbox = sandboxSession(t)
    const proc = await sandbox.spawn({ command: 'echo first; sleep 0.3; printf "\\377\\000" >&2; echo second; exit 2' })
    const reader = proc.stdout.getReader()
    const first = await reader.read()
    assert.equal(Buffer.from(first.value).toString(), 'first\n') // before the command ended
    reader.releaseLock()
    const [rest, err, status] = await Promise.all([webStreamBytes(proc.stdout), webStreamBytes(proc.stderr), proc.wait()])
    assert.equal(rest.toString(), 'second\n')
    assert.deepEqual([...err], [0xff, 0x00])
    assert.deepEqual(status, { exitCode: 2 })
  })

  test('spawn: kill() ends it and what it started; abortSignal rejects wait(); stdin is refused up front', async (t) => {
    const sandbox = sandboxSession(t)
    const tag = marker()
    const proc = await sandbox.spawn({ command: 'sleep 1000 & echo up; wait', env: { TAG: tag } })
    const reader = proc.stdout.getReader()
    assert.equal(Buffer.from((await reader.read()).value).toString(), 'up\n')
    assert.ok(processesWith(tag).length >= 1)
    await proc.kill()
    assert.deepEqual(await proc.wait(), { exitCode: 137 })
    assert.deepEqual(processesWith(tag), [])
    assert.equal((await reader.read()).done, true)
    await proc.kill() // idempotent

    const controller = new AbortController()
    const aborted = await sandbox.spawn({ command: 'sleep 1000', abortSignal: controller.signal })
    const reason = new Error('stop it')
    controller.abort(reason)
    assert.equal(await rejection(aborted.wait()), reason)

    await assert.rejects(sandbox.spawn({ command: 'touch spawned', stdin: true }), InvalidRequestError)
    assert.equal(await sandbox.stat({ path: 'spawned' }), null, 'nothing ran')
    // A consumer that stops reading does not break the run.
    const noisy = await sandbox.spawn({ command: 'seq 1 20000' })
    await noisy.stdout.cancel()
    assert.deepEqual(await noisy.wait(), { exitCode: 0 })
  })

  test('files: text (with line ranges), binary, streams; null when missing', async (t) => {
    const sandbox = sandboxSession(t)
    await sandbox.writeTextFile({ path: 'a/b/lines.txt', content: 'one\ntwo\nthree\nfour\n' })
    assert.equal(await sandbox.readTextFile({ path: 'a/b/lines.txt' }), 'one\ntwo\nthree\nfour\n')
    assert.equal(await sandbox.readTextFile({ path: '/workspace/a/b/lines.txt', startLine: 2, endLine: 3 }), 'two\nthree')
    assert.equal(await sandbox.readTextFile({ path: 'a/b/lines.txt', startLine: 4, endLine: 99 }), 'four\n')
    await sandbox.writeTextFile({ path: 'latin1.txt', content: 'é', encoding: 'latin1' })
    assert.deepEqual([...(await sandbox.readBinaryFile({ path: 'latin1.txt' }))], [0xe9])
    assert.equal(await sandbox.readTextFile({ path: 'latin1.txt', encoding: 'latin1' }), 'é')
    await sandbox.writeBinaryFile({ path: 'all.bytes', content: new Uint8Array(ALL_BYTES) })
    const bytes = await sandbox.readBinaryFile({ path: 'all.bytes' })
    assert.ok(bytes instanceof Uint8Array)
    assert.deepEqual(Buffer.from(bytes), ALL_BYTES)
    const source = new ReadableStream({
      start(controller) {
        controller.enqueue(new Uint8Array([1, 2]))
        controller.enqueue(new Uint8Array([3]))
        controller.close()
      },
    })
    await sandbox.writeFile({ path: 'streamed.bin', content: source })
    assert.deepEqual([...(await webStreamBytes(await sandbox.readFile({ path: 'streamed.bin' })))], [1, 2, 3])
    assert.equal((await sandbox.run({ command: 'od -An -tu1 streamed.bin' })).stdout.trim().split(/\s+/).join(','), '1,2,3')
    for (const read of ['readFile', 'readBinaryFile', 'readTextFile']) {
      assert.equal(await sandbox[read]({ path: 'missing.txt' }), null, read)
      assert.equal(await sandbox[read]({ path: 'no/such/dir.txt' }), null, read)
    }
    await assert.rejects(sandbox.readTextFile({ path: '/etc/hostname' }), InvalidRequestError)
    await assert.rejects(sandbox.writeTextFile({ path: '/etc/x', content: 'x' }), InvalidRequestError)
    await assert.rejects(sandbox.writeTextFile({ path: 'a/b', content: 'onto a directory' }))
  })

  test('stat, listDirectory and deleteFile', async (t) => {
    const sandbox = sandboxSession(t)
    await sandbox.writeTextFile({ path: 'd/file.txt', content: '12345' })
    await sandbox.writeTextFile({ path: 'd/sub/inner.txt', content: 'x' })
    assert.equal((await sandbox.run({ command: 'ln -s file.txt d/link && ln -s nowhere d/dangling' })).exitCode, 0)
    assert.deepEqual(await sandbox.stat({ path: 'd/file.txt' }), { type: 'file', size: 5 })
    assert.equal((await sandbox.stat({ path: 'd' })).type, 'directory')
    assert.equal((await sandbox.stat({ path: '/workspace' })).type, 'directory')
    assert.deepEqual(await sandbox.stat({ path: 'd/link' }), { type: 'file', size: 5 }, 'links are followed')
    assert.equal(await sandbox.stat({ path: 'd/dangling' }), null)
    assert.equal(await sandbox.stat({ path: 'd/none' }), null)
    assert.equal(await sandbox.stat({ path: 'd/file.txt/below' }), null)
    const entries = (await sandbox.listDirectory({ path: 'd' })).sort((a, b) => a.name.localeCompare(b.name))
    assert.deepEqual(entries, [
      { name: 'dangling', type: 'symlink' },
      { name: 'file.txt', type: 'file' },
      { name: 'link', type: 'symlink' },
      { name: 'sub', type: 'directory' },
    ])
    assert.deepEqual(await sandbox.listDirectory({ path: 'd/sub' }), [{ name: 'inner.txt', type: 'file' }])
    assert.equal(await sandbox.listDirectory({ path: 'nothing/here' }), null)
    await assert.rejects(sandbox.listDirectory({ path: 'd/file.txt' }))
    assert.equal(await sandbox.deleteFile({ path: 'd/link' }), true)
    assert.equal(await sandbox.readTextFile({ path: 'd/file.txt' }), '12345', 'the link, not its target')
    assert.equal(await sandbox.deleteFile({ path: 'd/file.txt' }), true)
    assert.equal(await sandbox.deleteFile({ path: 'd/file.txt' }), false)
    await assert.rejects(sandbox.deleteFile({ path: 'd/sub' }), InvalidRequestError)
    assert.equal(await sandbox.readTextFile({ path: 'd/sub/inner.txt' }), 'x')
  })

  test('a StrataSandbox and a StrataSandboxSession share one session', async (t) => {
    const sandbox = await strataSandbox(t)
    const session = new StrataSandboxSession(sandbox, { description: 'custom' })
    assert.equal(session.session, sandbox.session)
    assert.equal(session.description, 'custom')
    await session.writeTextFile({ path: 'shared.txt', content: 'both' })
    assert.equal((await sandbox.readFileToBuffer({ path: 'shared.txt' })).toString(), 'both')
  })

  test('generateText (ai v7) hands it to tools as experimental_sandbox', async (t) => {
    const ai = require('ai')
    const { MockLanguageModelV4 } = require('ai/test')
    const sandbox = sandboxSession(t, { caps: CAPS })
    let seenDescription
    const shell = ai.tool({
      description: ({ experimental_sandbox }) => `Run a command. ${experimental_sandbox.description}`,
      inputSchema: ai.jsonSchema({ type: 'object', properties: { command: { type: 'string' } }, required: ['command'] }),
      execute: async ({ command }, { experimental_sandbox, abortSignal }) => experimental_sandbox.run({ command, abortSignal }),
    })
    const save = ai.tool({
      description: 'Save a note.',
      inputSchema: ai.jsonSchema({ type: 'object', properties: { text: { type: 'string' } }, required: ['text'] }),
      execute: async ({ text }, { experimental_sandbox }) => {
        await experimental_sandbox.writeTextFile({ path: 'notes/today.md', content: text })
        return (await experimental_sandbox.stat({ path: 'notes/today.md' })).size
      },
    })
    const model = scriptedModel(MockLanguageModelV4, [
      { toolName: 'save', input: { text: 'remember the milk\n' } },
      { toolName: 'shell', input: { command: 'cat notes/today.md | tr a-z A-Z' } },
    ])
    const doGenerate = model.doGenerate.bind(model)
    model.doGenerate = async (options) => {
      seenDescription ??= options.tools.find((tool) => tool.name === 'shell').description
      return doGenerate(options)
    }
    const result = await ai.generateText({
      model,
      prompt: 'save a note and read it back loudly',
      tools: { shell, save },
      experimental_sandbox: sandbox,
      stopWhen: ai.stepCountIs(5),
    })
    assert.equal(result.text, 'done')
    assert.match(seenDescription, /^Run a command\. Strata sandbox session s-/)
    assert.match(seenDescription, /Commands are stopped after 20 s/)
    assert.equal(result.steps[0].toolResults[0].output, 'remember the milk\n'.length)
    assert.deepEqual(result.steps[1].toolResults[0].output, { exitCode: 0, stdout: 'REMEMBER THE MILK\n', stderr: '' })
    assert.equal(await sandbox.readTextFile({ path: 'notes/today.md' }), 'remember the milk\n')
  })
})
