'use strict'
// Live sandboxes from Node: one sandbox for a task (files and spawned processes kept
// between execs), output as an async iterator, AbortSignal, pause and resume, files that
// never follow a planted symlink, published ports, typed errors, and nothing left once
// stopped.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const net = require('node:net')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const { Sandbox, LiveSandbox, InvalidRequestError, CancelledError } = require('..')
const { tempDir, marker, processesWith } = require('./helpers.js')

const sandbox = new Sandbox({ backend: 'process' })

async function until(what, done, ms = 20000) {
  const deadline = Date.now() + ms
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

describe('LiveSandbox', () => {
  test('files and spawned processes live between execs; stop ends them all', async () => {
    const live = await sandbox.start()
    assert.ok(live instanceof LiveSandbox)
    assert.match(live.id, /^sb-/)
    assert.equal((await live.exec(['sh', '-c', 'echo kept > /tmp/note'])).exitCode, 0)
    const result = await live.exec(['sh', '-c', 'cat /tmp/note; echo err >&2; exit 3'])
    assert.deepEqual([result.exitCode, result.stdout.toString(), result.stderr.toString()], [3, 'kept\n', 'err\n'])
    assert.equal((await live.exec(['cat'], { stdin: 'piped' })).stdout.toString(), 'piped')
    const mark = marker()
    const pid = await live.spawn(['sh', '-c', 'sleep 1000'], { env: { MARK: mark } })
    await until('the spawned process runs', () => processesWith(mark).length > 0)
    const listed = (await live.ps()).find((p) => p.pid === pid)
    assert.equal(listed.state, 'running')
    await live.stop()
    assert.equal(live.stopped, true)
    assert.deepEqual(processesWith(mark), [], 'stop ends every process of the sandbox')
    await assert.rejects(live.exec(['true']), InvalidRequestError)
  })

  test('output is an async iterator until the process exits; abort kills an exec', async () => {
    const live = await sandbox.start()
    try {
      const pid = await live.spawn(['sh', '-c', 'echo one; sleep 0.2; echo two >&2; exit 4'])
      const chunks = []
      for await (const chunk of live.output(pid)) chunks.push(chunk)
      const text = (stream) => Buffer.concat(chunks.filter((c) => c.stream === stream).map((c) => c.data)).toString()
      assert.equal(text('stdout'), 'one\n')
      assert.equal(text('stderr'), 'two\n')
      assert.equal((await live.wait(pid)).exitCode, 4)
      const controller = new AbortController()
      const running = live.exec(['sleep', '1000'], { signal: controller.signal })
      setTimeout(() => controller.abort(), 200)
      await assert.rejects(running, CancelledError)
    } finally {
      await live.stop()
    }
  })

  test('pause stops the processes, resume continues them', async () => {
    const live = await sandbox.start()
    try {
      const pid = await live.spawn(['sh', '-c', 'i=0; while :; do i=$((i+1)); [ $((i % 5000)) = 0 ] && echo $i; done'])
      await until('the loop prints', async () => (await live.logs(pid)).length > 0)
      assert.ok(['freezer', 'signals'].includes(await live.pause()))
      assert.equal((await live.info()).paused, true)
      await new Promise((r) => setTimeout(r, 300))
      const before = (await live.logs(pid)).length
      await new Promise((r) => setTimeout(r, 700))
      assert.equal((await live.logs(pid)).length, before, 'nothing runs while paused')
      await assert.rejects(live.exec(['true']), (e) => e instanceof InvalidRequestError && /paused/.test(e.message))
      await live.resume()
      assert.equal((await live.info()).paused, false)
      await until('the loop prints again', async () => (await live.logs(pid)).length > before)
    } finally {
      await live.stop()
    }
  })

  test('files in and out never follow a planted symlink', async (t) => {
    const live = await sandbox.start()
    try {
      await live.writeFile('/tmp/d/a.txt', 'from node')
      assert.equal((await live.exec(['cat', '/tmp/d/a.txt'])).stdout.toString(), 'from node')
      assert.deepEqual((await live.listDir('/tmp/d')).map((e) => e.name), ['a.txt'])
      assert.equal((await live.stat('/tmp/d/a.txt')).kind, 'file')
      await live.mkdir('/tmp/d/sub', { parents: true })
      await live.rename('/tmp/d/a.txt', '/tmp/d/sub/b.txt')
      assert.equal((await live.readFile('/tmp/d/sub/b.txt')).toString(), 'from node')
      const host = tempDir(t)
      fs.mkdirSync(path.join(host, 'tree', 'x'), { recursive: true })
      fs.writeFileSync(path.join(host, 'tree', 'x', 'y.bin'), Buffer.from([0, 1, 255]))
      assert.equal((await live.upload(path.join(host, 'tree'), '/tmp/up')).files, 1)
      assert.equal((await live.download('/tmp/up', path.join(host, 'back'))).bytes, 3)
      assert.deepEqual([...fs.readFileSync(path.join(host, 'back', 'x', 'y.bin'))], [0, 1, 255])
      await live.exec(['ln', '-s', '/etc/hostname', '/tmp/link'])
      await assert.rejects(live.readFile('/tmp/link'), InvalidRequestError)
      await assert.rejects(live.readFile('../etc/passwd'), InvalidRequestError)
      await live.remove('/tmp/d')
      assert.equal((await live.exec(['test', '-e', '/tmp/d'])).exitCode, 1)
    } finally {
      await live.stop()
    }
  })

  test('a published port reaches the server inside', async () => {
    const live = await sandbox.start()
    try {
      const server =
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n" +
        "s.bind(('127.0.0.1',8000))\ns.listen(8)\nwhile True:\n  c,_=s.accept()\n  c.sendall(b'hi from inside')\n  c.close()\n"
      await live.spawn(['/usr/bin/python3', '-c', server])
      const port = await live.publish(8000)
      assert.equal(port.hostIp, '127.0.0.1')
      assert.equal(port.guestPort, 8000)
      const answer = () =>
        new Promise((resolve) => {
          const socket = net.connect(port.hostPort, '127.0.0.1')
          const got = []
          socket.on('data', (d) => got.push(d))
          socket.on('end', () => resolve(Buffer.concat(got).toString()))
          socket.on('error', () => resolve(''))
        })
      await until('the server answers', async () => (await answer()) === 'hi from inside')
    } finally {
      await live.stop()
    }
  })

  test('bad input is a typed error and nothing runs', async () => {
    await assert.rejects(sandbox.start(undefined, { ttl: 'long' }), InvalidRequestError)
    await assert.rejects(sandbox.start(undefined, { publish: [0] }), InvalidRequestError)
    await assert.rejects(sandbox.start(undefined, { nope: 1 }), InvalidRequestError)
    const live = await sandbox.start()
    try {
      await assert.rejects(live.exec([]), InvalidRequestError)
      await assert.rejects(live.exec('ls -l'), InvalidRequestError)
      await assert.rejects(live.exec(['true'], { env: { 'BAD NAME': 'x' } }), InvalidRequestError)
      await assert.rejects(live.kill(999999), InvalidRequestError)
      await assert.rejects(live.spawn(['true'], { tty: { rows: 0, cols: 80 } }), InvalidRequestError)
    } finally {
      await live.stop()
    }
    await assert.rejects(LiveSandbox.attach('sb-0000000000000000'), InvalidRequestError)
  })

  test('a live sandbox in an image runs every exec there; stop ends it', async () => {
    // The repository's test images, built from Debian packages (cached; never pulled).
    const repo = path.join(__dirname, '..', '..', '..')
    execFileSync(path.join(repo, 'scripts', 'build-test-images.sh'), { stdio: 'ignore' })
    const image = path.join(repo, '.ci', 'cache', 'images', 'python-oci')
    const live = await new Sandbox({ backend: 'container' }).start({ image, timeoutMs: 30000 })
    let stopped = false
    try {
      const info = await live.info()
      assert.equal(info.backend, 'container')
      assert.equal(info.receipt.container.runtime, 'native')
      const ran = await live.exec(['python3', '-c', 'print(6 * 7)'])
      assert.deepEqual([ran.exitCode, ran.stdout.toString()], [0, '42\n'])
      assert.equal((await live.exec(['sh', '-c', 'echo kept > /usr/note'])).exitCode, 0)
      assert.equal((await live.exec(['cat', '/usr/note'])).stdout.toString(), 'kept\n')
      const mark = marker()
      await live.spawn(['sh', '-c', 'sleep 1000'], { env: { MARK: mark } })
      await until('the spawned process runs', () => processesWith(mark).length > 0)
      await live.stop()
      stopped = true
      assert.deepEqual(processesWith(mark), [], 'stop ends every process of the sandbox')
    } finally {
      if (!stopped) await live.stop()
    }
  })
})

describe('LiveSandbox on the microVM backend', () => {
  test('every exec runs in one VM; pause stops its vCPUs; files go through the guest agent', async () => {
    const root = path.resolve(__dirname, '..', '..', '..')
    const target = process.env.CARGO_TARGET_DIR || path.join(root, 'target')
    const agent = path.join(target, 'release', 'strata-guest-agent')
    assert.ok(fs.existsSync(agent), `${agent} missing: cargo build --release --workspace --bins`)
    execFileSync(path.join(root, 'scripts', 'build-vm-guest.sh'), { stdio: 'ignore' })
    process.env.STRATA_VM_AGENT = agent
    const live = await new Sandbox({ backend: 'microvm' }).start()
    try {
      assert.equal((await live.info()).backend, 'microvm')
      const boot = (await live.exec(['cat', '/proc/sys/kernel/random/boot_id'])).stdout.toString()
      await live.writeFile('/tmp/in.txt', 'from node')
      const again = await live.exec(['sh', '-c', 'cat /tmp/in.txt; echo; cat /proc/sys/kernel/random/boot_id'])
      assert.equal(again.stdout.toString(), `from node\n${boot}`)
      assert.equal((await live.readFile('/tmp/in.txt')).toString(), 'from node')
      assert.equal(await live.pause(), 'vm')
      await live.resume()
      assert.equal((await live.exec(['true'])).exitCode, 0)
    } finally {
      await live.stop()
    }
  })
})
