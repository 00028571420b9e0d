// The official E2B JS SDK against `strata serve --e2b`: sandboxes, commands, files, PTY,
// watch and the API key check. Starts its own server (the binary: $STRATA_BIN, else
// $CARGO_TARGET_DIR/release/strata).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import path from 'node:path'
import fs from 'node:fs'
import os from 'node:os'

const key = 'strata-e2b-node-test-key-01'
let server
let Sandbox, CommandExitError
let serverUrl
const snapshots = fs.mkdtempSync(path.join(os.tmpdir(), 'strata-e2b-node-'))

before(async () => {
  const target = process.env.CARGO_TARGET_DIR ?? path.resolve(import.meta.dirname, '../../../target')
  const bin = process.env.STRATA_BIN ?? path.join(target, 'release', 'strata')
  server = spawn(bin, ['serve', '--e2b', '127.0.0.1:0', '--api-key', key, '--snapshot-dir', snapshots], { stdio: ['ignore', 'pipe', 'inherit'] })
  const line = await new Promise((resolve, reject) => {
    server.once('error', reject)
    createInterface({ input: server.stdout }).once('line', resolve)
  })
  assert.match(line, /^http:\/\//)
  serverUrl = line
  process.env.E2B_API_URL = line
  process.env.E2B_SANDBOX_URL = line
  process.env.E2B_API_KEY = key
  ;({ Sandbox, CommandExitError } = await import('e2b'))
})

after(async () => {
  server.kill('SIGTERM')
  const code = await new Promise((resolve) => server.once('exit', resolve))
  assert.equal(code, 0)
  fs.rmSync(snapshots, { recursive: true, force: true })
})

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

test('create, run, kill', async () => {
  const sb = await Sandbox.create({ metadata: { suite: 'node' }, envs: { FROM_CREATE: 'yes' } })
  try {
    const result = await sb.commands.run('echo $FROM_CREATE; echo err >&2; pwd')
    assert.deepEqual([result.stdout, result.stderr, result.exitCode], ['yes\n/home/user\n', 'err\n', 0])
    await assert.rejects(sb.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)
    const listed = await Sandbox.list({ query: { metadata: { suite: 'node' } } }).nextItems()
    assert.deepEqual(listed.map((s) => s.sandboxId), [sb.sandboxId])
    assert.equal(await sb.isRunning(), true)
  } finally {
    await sb.kill()
  }
  assert.equal(await sb.isRunning(), false)
})

test('background commands, stdin, kill', async () => {
  const sb = await Sandbox.create()
  try {
    const cat = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(cat.pid, 'piped\n')
    await sb.commands.closeStdin(cat.pid)
    assert.equal((await cat.wait()).stdout, 'piped\n')
    const sleeper = await sb.commands.run('sleep 60', { background: true })
    assert.ok((await sb.commands.list()).some((p) => p.pid === sleeper.pid))
    assert.equal(await sb.commands.kill(sleeper.pid), true)
    await assert.rejects(sleeper.wait(), CommandExitError)
  } finally {
    await sb.kill()
  }
})

test('files and watch', async () => {
  const sb = await Sandbox.create()
  try {
    await sb.files.write('dir/a.txt', 'hello')
    assert.equal(await sb.files.read('dir/a.txt'), 'hello')
    const bytes = new Uint8Array([0, 1, 2, 255])
    await sb.files.write('/tmp/b.bin', bytes)
    assert.deepEqual(await sb.files.read('/tmp/b.bin', { format: 'bytes' }), bytes)
    assert.deepEqual((await sb.files.list('dir')).map((e) => e.name), ['a.txt'])
    assert.equal(await sb.files.exists('dir/nope'), false)
    assert.equal(await sb.files.makeDir('/tmp/d'), true)
    assert.equal(await sb.files.makeDir('/tmp/d'), false)
    await sb.files.rename('dir/a.txt', '/tmp/d/a.txt')
    assert.equal((await sb.files.getInfo('/tmp/d/a.txt')).size, 5)
    await sb.files.remove('/tmp/d')
    assert.equal(await sb.files.exists('/tmp/d'), false)
    const events = []
    const watch = await sb.files.watchDir('/tmp', (event) => events.push(event))
    await sb.files.write('/tmp/seen.txt', 'x')
    for (let i = 0; i < 50 && !events.some((e) => e.name === 'seen.txt'); i++) await sleep(100)
    await watch.stop()
    assert.ok(events.some((e) => e.name === 'seen.txt' && e.type === 'create'), JSON.stringify(events))
  } finally {
    await sb.kill()
  }
})

test('pty input and resize', async () => {
  const sb = await Sandbox.create()
  try {
    let out = ''
    const term = await sb.pty.create({ rows: 24, cols: 80, onData: (d) => { out += Buffer.from(d).toString() } })
    const waitFor = async (text) => {
      for (let i = 0; i < 100 && !out.includes(text); i++) await sleep(100)
      assert.ok(out.includes(text), out)
    }
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await waitFor('24 80')
    await sb.pty.resize(term.pid, { rows: 30, cols: 90 })
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await waitFor('30 90')
    assert.equal(await sb.pty.kill(term.pid), true)
  } finally {
    await sb.kill()
  }
})

test('a wrong API key is refused', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'not-a-key-of-this-server' }), /key/i)
})

test('snapshot, fork and getHost', async () => {
  const sb = await Sandbox.create({ timeoutMs: 120_000 })
  const made = []
  try {
    await sb.files.write('/home/user/kept.txt', 'from the parent')
    const snapshot = await sb.createSnapshot({ name: 'node-snap' })
    assert.equal(snapshot.snapshotId, 'node-snap:default')
    const child = await Sandbox.create(snapshot.snapshotId)
    made.push(child)
    assert.equal(await child.files.read('/home/user/kept.txt'), 'from the parent')
    assert.equal(await Sandbox.deleteSnapshot(snapshot.snapshotId), true)

    const forks = await sb.fork({ count: 2, timeoutMs: 60_000 })
    assert.equal(forks.length, 2)
    for (const fork of forks) {
      assert.ok(!(fork instanceof Error), String(fork))
      made.push(fork)
      assert.equal(await fork.files.read('/home/user/kept.txt'), 'from the parent')
    }

    await sb.files.write('/tmp/srv.py', [
      'import http.server',
      'class H(http.server.BaseHTTPRequestHandler):',
      '    def do_GET(self):',
      '        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")',
      'http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()',
    ].join('\n'))
    await sb.commands.run('python3 /tmp/srv.py', { background: true })
    const host = sb.getHost(8080)
    assert.ok(host.startsWith(`8080-${sb.sandboxId}.`), host)
    // No wildcard DNS here: send the request to the server with the Host getHost names.
    const { request } = await import('node:http')
    const get = () => new Promise((resolve, reject) => {
      const req = request(serverUrl, { headers: { host } }, (res) => {
        let body = ''
        res.on('data', (chunk) => { body += chunk })
        res.on('end', () => resolve([res.statusCode, body]))
      })
      req.on('error', reject)
      req.end()
    })
    let answer
    for (let i = 0; i < 50; i++) {
      answer = await get()
      if (answer[0] === 200) break
      await sleep(200)
    }
    assert.deepEqual(answer, [200, 'ok'])
  } finally {
    for (const other of made) await other.kill()
    await sb.kill()
  }
})
