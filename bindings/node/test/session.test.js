'use strict'
// Sessions from Node: files across calls on the process and wasm backends, exact copies,
// refusals of what a tool planted, per-call timeouts, abort, and nothing left behind.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const crypto = require('node:crypto')

const { Sandbox, Session, Tool, InvalidRequestError, CancelledError } = require('..')
const { tempDir } = require('./helpers.js')

const sandbox = new Sandbox({ backend: 'process' })

function sessionDirs() {
  return fs.readdirSync(os.tmpdir()).filter((name) => name.startsWith('strata-session-'))
}

describe('Session', () => {
  test('files persist across calls; close removes the directory and refuses later calls', async () => {
    const before = new Set(sessionDirs())
    const s = sandbox.session()
    assert.ok(s instanceof Session)
    assert.match(s.id, /^s-[0-9a-f]{32}$/)
    assert.equal(s.workdir, '/workspace')
    await s.writeFile('notes.txt', 'one\n')
    assert.equal((await s.run(['/bin/sh', '-c', 'echo two >> notes.txt'])).exitCode, 0)
    const result = await s.run(['/bin/sh', '-c', 'cat /workspace/notes.txt; pwd'])
    assert.equal(result.stdout, 'one\ntwo\n/workspace\n')
    const listed = await s.listFiles()
    assert.deepEqual(listed.map((e) => [e.path, e.kind]), [['/workspace/notes.txt', 'file']])
    await s.close()
    assert.equal(s.closed, true)
    assert.deepEqual(sessionDirs().filter((d) => !before.has(d)), [])
    await assert.rejects(s.run(['true']), (e) => e instanceof InvalidRequestError && /is closed/.test(e.message))
    await assert.rejects(s.readFile('notes.txt'), InvalidRequestError)
    await s.close()
  })

  test('binary upload, download and reads are exact, NUL bytes included', async (t) => {
    const dir = tempDir(t)
    const blob = crypto.randomBytes(200_000)
    fs.mkdirSync(path.join(dir, 'src', 'deep'), { recursive: true })
    fs.writeFileSync(path.join(dir, 'src', 'deep', 'blob.bin'), blob)
    fs.writeFileSync(path.join(dir, 'src', 'nul.txt'), Buffer.from([0, 97, 0, 0]))
    const s = sandbox.session()
    try {
      const up = await s.upload(path.join(dir, 'src'), 'in')
      assert.deepEqual([up.files, up.bytes], [2, blob.length + 4])
      const hashed = await s.run([
        '/usr/bin/python3',
        '-c',
        "import hashlib; d=open('in/deep/blob.bin','rb').read(); open('out.bin','wb').write(d[::-1]); print(hashlib.sha256(d).hexdigest())",
      ])
      assert.equal(hashed.stdout.trim(), crypto.createHash('sha256').update(blob).digest('hex'))
      assert.deepEqual(await s.readFile('out.bin'), Buffer.from(blob).reverse())
      await s.writeFile('/workspace/u8.bin', new Uint8Array([1, 0, 2]))
      assert.deepEqual(await s.readFile('u8.bin'), Buffer.from([1, 0, 2]))
      await s.download('in', path.join(dir, 'back'))
      assert.deepEqual(fs.readFileSync(path.join(dir, 'back', 'nul.txt')), Buffer.from([0, 97, 0, 0]))
    } finally {
      await s.close()
    }
  })

  test('a planted symlink is never followed and paths cannot leave the workdir', async (t) => {
    const dir = tempDir(t)
    const s = sandbox.session()
    try {
      assert.equal((await s.run(['/bin/sh', '-c', 'ln -s /etc/shadow leak; ln -s / up'])).exitCode, 0)
      for (const p of ['leak', 'up/etc/passwd', '../etc/passwd', '/etc/passwd']) {
        await assert.rejects(s.readFile(p), InvalidRequestError, p)
      }
      await assert.rejects(s.download('.', path.join(dir, 'out')), /symlink/)
      assert.equal(fs.existsSync(path.join(dir, 'out')), false)
    } finally {
      await s.close()
    }
  })

  test('per-call timeout, zero meaning none, and abort', async () => {
    const s = sandbox.session({ timeoutMs: 500 })
    try {
      assert.equal((await s.run(['sleep', '3'])).timedOut, true)
      assert.equal((await s.run(['/bin/sh', '-c', 'sleep 1; echo done'], { timeoutMs: 0 })).stdout, 'done\n')
      await assert.rejects(s.run(['true'], { timeoutMs: -1 }), InvalidRequestError)
      await assert.rejects(s.run(['true'], { at: '/x' }), InvalidRequestError)
      const controller = new AbortController()
      const running = s.run(['sleep', '30'], { timeoutMs: 0, signal: controller.signal })
      setTimeout(() => controller.abort(), 300)
      await assert.rejects(running, CancelledError)
    } finally {
      await s.close()
    }
  })

  test('sessions are isolated; bad options are refused before anything is made', async () => {
    const before = new Set(sessionDirs())
    assert.throws(() => sandbox.session(null, { workdir: 'relative' }), InvalidRequestError)
    assert.throws(() => sandbox.session(null, { maxTransfer: 'lots' }), InvalidRequestError)
    assert.throws(() => sandbox.session(null, { bogus: 1 }), InvalidRequestError)
    assert.deepEqual(sessionDirs().filter((d) => !before.has(d)), [])
    const a = sandbox.session()
    const b = sandbox.session(null, { maxTransfer: 8 })
    try {
      await a.writeFile('secret', 'a only')
      assert.deepEqual(await b.listFiles(), [])
      const probe = await b.run(['/bin/sh', '-c', 'cat /workspace/secret 2>/dev/null || echo none'])
      assert.equal(probe.stdout, 'none\n')
      await assert.rejects(b.writeFile('big', 'x'.repeat(9)), /too large/)
      await assert.rejects(b.writeFile('n', 42), InvalidRequestError)
    } finally {
      await a.close()
      await b.close()
    }
  })

  test('a wasm session runs python on files from earlier calls', async () => {
    const wasm = new Sandbox({ backend: 'wasm' })
    const s = wasm.session()
    try {
      await s.writeFile('in.txt', 'wasm')
      const first = await s.run(Tool.script('python', "open('/workspace/out.txt','w').write(open('/workspace/in.txt').read()*2)"))
      assert.equal(first.exitCode, 0, first.stderr)
      const second = await s.run(Tool.script('python', "print(open('/workspace/out.txt').read())"))
      assert.equal(second.stdout.trim(), 'wasmwasm')
      assert.equal(second.receipt.backend, 'wasm')
    } finally {
      await s.close()
    }
  })
})

describe('Session on the microvm backend', () => {
  test('files persist between calls in fresh guests', async () => {
    const { execFileSync } = require('node:child_process')
    const root = path.resolve(__dirname, '..', '..', '..')
    const target = process.env.CARGO_TARGET_DIR ?? path.join(root, 'target')
    const agent = path.join(target, 'release', 'strata-guest-agent')
    assert.ok(fs.existsSync(agent), `${agent} missing: cargo build --release --workspace --bins`)
    execFileSync(path.join(root, 'scripts', 'build-vm-guest.sh'), { stdio: ['ignore', 'ignore', 'inherit'] })
    process.env.STRATA_VM_AGENT = agent
    const vm = new Sandbox({ backend: 'microvm' })
    const s = vm.session()
    try {
      await s.writeFile('in.bin', Buffer.from([97, 0, 98]))
      const first = await s.run(['/bin/sh', '-c', "od -An -c in.bin | tr -s ' ' > seen.txt"])
      assert.equal(first.exitCode, 0, first.stderr)
      assert.equal(first.receipt.backend, 'microvm')
      const second = await s.run(['/bin/sh', '-c', 'cat seen.txt; echo more >> seen.txt'])
      assert.equal(second.stdout.trim(), 'a \\0 b')
      assert.equal((await s.readFile('seen.txt')).toString(), ' a \\0 b\nmore\n')
    } finally {
      await s.close()
    }
  })
})
