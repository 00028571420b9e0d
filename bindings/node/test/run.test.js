'use strict'
// Every public path of Sandbox.run against the real process backend: tools, caps, results,
// receipts. Non-zero exits and limits are data, not rejections.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const net = require('node:net')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const { Sandbox, Tool, doctor, version, helperPath } = require('..')
const { tempDir, marker } = require('./helpers.js')

const sandbox = new Sandbox()

describe('Sandbox', () => {
  test('defaults: auto backend, strict', () => {
    assert.equal(sandbox.backend, 'auto')
    assert.equal(sandbox.strict, true)
  })

  test('options: backend and strictness', async () => {
    const relaxed = new Sandbox({ backend: 'process', strict: false })
    assert.equal(relaxed.backend, 'process')
    assert.equal(relaxed.strict, false)
    const result = await relaxed.run(['true'])
    assert.equal(result.receipt.strictness, 'best_effort')
    assert.equal(result.receipt.backend, 'process')
  })

  test('the packaged helper is found without PATH or $STRATA_HELPER', async () => {
    assert.ok(fs.statSync(helperPath).mode & 0o111, `${helperPath} is executable`)
    const report = doctor()
    const processReport = report.backends.find((b) => b.backend === 'process')
    const helper = processReport.checks.find((c) => c.name === 'helper')
    assert.equal(helper.ok, true, helper.detail)
    assert.equal(helper.detail, process.env.STRATA_HELPER ?? helperPath)
  })

  test('an explicit helper option is used', async () => {
    const explicit = new Sandbox({ helper: helperPath })
    assert.equal((await explicit.run(['true'])).exitCode, 0)
  })

  test('version is the crate version', () => {
    assert.match(version, /^\d+\.\d+\.\d+/)
    assert.equal(version, require('../package.json').version)
  })
})

describe('tools', () => {
  test('an argv array runs the command directly', async () => {
    const result = await sandbox.run(['echo', 'hello', '$HOME'])
    assert.equal(result.stdout, 'hello $HOME\n', 'no shell expansion')
    assert.equal(result.exitCode, 0)
    assert.equal(result.success, true)
    assert.equal(result.status, 'exit code 0')
  })

  test('Tool.command is the same as an argv array', async () => {
    assert.deepEqual(Tool.command(['ls', '-l']), { kind: 'command', argv: ['ls', '-l'] })
    const result = await sandbox.run(Tool.command(new Set(['echo', 'from-iterable'])))
    assert.equal(result.stdout, 'from-iterable\n')
  })

  test('Tool.script python', async () => {
    const result = await sandbox.run(Tool.script('python', 'import sys\nprint(sum(range(10)))\nprint("err", file=sys.stderr)'))
    assert.equal(result.stdout, '45\n')
    assert.equal(result.stderr, 'err\n')
  })

  test('Tool.script javascript', async () => {
    const result = await sandbox.run(Tool.script('javascript', 'console.log(6 * 7)'))
    assert.equal(result.stdout, '42\n')
  })

  test('Tool.script sh', async () => {
    const result = await sandbox.run(Tool.script('sh', 'echo $((2 + 3)) | sed s/5/five/'))
    assert.equal(result.stdout, 'five\n')
  })

  test('Tool.wasm runs a WebAssembly module on the wasm backend', async (t) => {
    const dir = tempDir(t)
    const module = path.join(dir, 'hello.wat')
    fs.writeFileSync(
      module,
      `(module
        (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
        (memory (export "memory") 1)
        (data (i32.const 16) "hello from wasm\\n")
        (func (export "_start")
          (i32.store (i32.const 0) (i32.const 16))
          (i32.store (i32.const 4) (i32.const 16))
          (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))`,
    )
    const tool = Tool.wasm(module, ['a', 'b'])
    assert.deepEqual(tool, { kind: 'wasm', module, args: ['a', 'b'] })
    const wasm = doctor().backends.find((b) => b.backend === 'wasm')
    if (!wasm.available) {
      t.skip(`SKIPPED LOUDLY: the wasm backend is unavailable here: ${wasm.reason}`)
      return
    }
    const result = await sandbox.run(tool, { readOnly: dir })
    assert.equal(result.stdout, 'hello from wasm\n')
    assert.equal(result.receipt.backend, 'wasm')
  })
})

describe('results', () => {
  test('a non-zero exit resolves: it is data', async () => {
    const result = await sandbox.run(['sh', '-c', 'echo out; echo err >&2; exit 7'])
    assert.equal(result.exitCode, 7)
    assert.equal(result.success, false)
    assert.equal(result.stdout, 'out\n')
    assert.equal(result.stderr, 'err\n')
    assert.equal(result.signal, null)
    assert.equal(result.limit, null)
  })

  test('death by signal', async () => {
    const result = await sandbox.run(['sh', '-c', 'kill -9 $$'])
    assert.equal(result.exitCode, null)
    assert.equal(result.signal, 9)
    assert.equal(result.success, false)
  })

  test('the wall-clock timeout ends the run with timedOut', async () => {
    const result = await sandbox.run(['sleep', '30'], { timeoutMs: 200 })
    assert.equal(result.timedOut, true)
    assert.equal(result.limit, 'wall')
    assert.equal(result.exitCode, null)
  })

  test('the output limit cuts a flood', async () => {
    const result = await sandbox.run(['yes'], { maxOutput: '4K' })
    assert.equal(result.stdoutTruncated, true)
    assert.equal(result.limit, 'output')
    assert.ok(result.stdout.length <= 4096)
  })

  test('the process limit stops a fork bomb', async () => {
    const result = await sandbox.run(Tool.script('sh', 'for i in $(seq 100); do sleep 5 & done; wait'), {
      processes: 8,
      timeoutMs: 20000,
    })
    assert.equal(result.limit, 'pids', `status: ${result.status}`)
    assert.ok(result.receipt.denials.some((d) => d.capability === 'pids'))
  })

  test('the fields of a result, and the receipt', async () => {
    const result = await sandbox.run(['true'])
    assert.deepEqual(Object.keys(result).sort(), [
      'durationMs',
      'exitCode',
      'limit',
      'nativeMs',
      'receipt',
      'signal',
      'status',
      'stderr',
      'stderrTruncated',
      'stdout',
      'stdoutTruncated',
      'success',
      'timedOut',
      'usage',
    ])
    assert.equal(typeof result.durationMs, 'number')
    assert.ok(result.nativeMs >= result.durationMs, 'the native call contains the run')
    assert.deepEqual(Object.keys(result.usage).sort(), ['peakMemoryBytes', 'systemCpuUs', 'userCpuUs'])
    const { receipt } = result
    assert.equal(receipt.backend, 'process')
    assert.deepEqual(receipt.layers, ['process'])
    assert.equal(receipt.strictness, 'strict')
    assert.deepEqual(receipt.gaps, [])
    assert.equal(receipt.network, undefined, 'no allowlist, no egress decisions')
    assert.ok(!('network' in receipt))
    for (const capability of ['fs', 'net', 'env', 'processes', 'syscalls', 'memory', 'wall']) {
      assert.ok(
        receipt.enforced.some((e) => e.capability === capability),
        `receipt enforces ${capability}: ${JSON.stringify(receipt.enforced)}`,
      )
    }
    assert.deepEqual(JSON.parse(JSON.stringify(result)), result, 'results are plain JSON data')
  })

  test('invalid UTF-8 output becomes U+FFFD', async () => {
    const result = await sandbox.run(['printf', 'a\\377b'])
    assert.equal(result.stdout, 'a\uFFFDb')
  })
})

describe('caps', () => {
  test('deny by default: no host files, no env, no network', async () => {
    const secret = marker()
    process.env.STRATA_TEST_SECRET = secret
    try {
      const result = await sandbox.run(Tool.script('sh', 'ls /home /root /etc/passwd 2>&1; env'))
      assert.doesNotMatch(result.stdout, new RegExp(secret), 'host env is not inherited')
      assert.match(result.stdout, /No such file/)
    } finally {
      delete process.env.STRATA_TEST_SECRET
    }
  })

  test('readOnly grants a path that cannot be written', async (t) => {
    const dir = tempDir(t)
    fs.writeFileSync(path.join(dir, 'data.txt'), 'granted\n')
    const read = await sandbox.run(['cat', path.join(dir, 'data.txt')], { readOnly: [dir] })
    assert.equal(read.stdout, 'granted\n')
    const write = await sandbox.run(['sh', '-c', `echo x > ${dir}/data.txt; echo y > ${dir}/new.txt`], {
      readOnly: dir,
    })
    assert.notEqual(write.exitCode, 0)
    assert.equal(fs.readFileSync(path.join(dir, 'data.txt'), 'utf8'), 'granted\n')
    assert.equal(fs.existsSync(path.join(dir, 'new.txt')), false)
  })

  test('readWrite grants a writable path', async (t) => {
    const dir = tempDir(t)
    const result = await sandbox.run(['sh', '-c', `echo written > ${dir}/out.txt`], { readWrite: dir })
    assert.equal(result.exitCode, 0, result.stderr)
    assert.equal(fs.readFileSync(path.join(dir, 'out.txt'), 'utf8'), 'written\n')
  })

  test('mounts map a host path to another sandbox path', async (t) => {
    const dir = tempDir(t)
    fs.writeFileSync(path.join(dir, 'f'), 'mapped\n')
    const result = await sandbox.run(['cat', '/data/f'], { mounts: [{ host: dir, guest: '/data' }] })
    assert.equal(result.stdout, 'mapped\n')
    const rw = await sandbox.run(['sh', '-c', 'echo w > /out/g'], { mounts: [{ host: dir, guest: '/out', access: 'rw' }] })
    assert.equal(rw.exitCode, 0, rw.stderr)
    assert.equal(fs.readFileSync(path.join(dir, 'g'), 'utf8'), 'w\n')
  })

  test('a symlinked grant is refused unless followSymlinks', async (t) => {
    const dir = tempDir(t)
    fs.mkdirSync(path.join(dir, 'real'))
    fs.writeFileSync(path.join(dir, 'real', 'f'), 'linked\n')
    const link = path.join(dir, 'link')
    fs.symlinkSync(path.join(dir, 'real'), link)
    await assert.rejects(sandbox.run(['cat', `${link}/f`], { readOnly: link }), (error) => {
      assert.equal(error.code, 'invalid_request')
      assert.match(error.message, /is a symlink/)
      assert.match(error.message, /followSymlinks/)
      return true
    })
    const result = await sandbox.run(['cat', '/data/f'], { mounts: [{ host: link, guest: '/data', followSymlinks: true }] })
    assert.equal(result.stdout, 'linked\n')
    const fsLine = result.receipt.enforced.find((e) => e.mechanism.startsWith('mount namespace'))
    assert.match(fsLine.detail, /symlinks followed from/)
  })

  test('readWrite keeps git hooks read-only unless protectHostExecuted is false', async (t) => {
    const dir = tempDir(t)
    fs.mkdirSync(path.join(dir, '.git', 'hooks'), { recursive: true })
    const hook = path.join(dir, '.git', 'hooks', 'pre-commit')
    fs.writeFileSync(hook, 'original\n')
    const attack = ['sh', '-c', `echo evil > ${hook}`]
    const denied = await sandbox.run(attack, { readWrite: dir })
    assert.notEqual(denied.exitCode, 0)
    assert.equal(fs.readFileSync(hook, 'utf8'), 'original\n')
    assert.ok(denied.receipt.enforced.some((e) => e.detail.includes(`host-executed paths read-only: ${path.join(dir, '.git', 'hooks')}`)))
    const allowed = await sandbox.run(attack, { readWrite: dir, protectHostExecuted: false })
    assert.equal(allowed.exitCode, 0, allowed.stderr)
    assert.equal(fs.readFileSync(hook, 'utf8'), 'evil\n')
  })

  test('env is exactly what is declared', async () => {
    const result = await sandbox.run(['env'], { env: { GREETING: 'hi there', LANG: 'C' } })
    assert.match(result.stdout, /^GREETING=hi there$/m)
    assert.match(result.stdout, /^LANG=C$/m)
    assert.doesNotMatch(result.stdout, /^NODE_|^npm_/m)
  })

  test('stdin from a string, a Buffer and a Uint8Array', async () => {
    for (const stdin of ['text in', Buffer.from('buffer in'), new TextEncoder().encode('bytes in')]) {
      const result = await sandbox.run(['cat'], { stdin })
      assert.equal(result.stdout, Buffer.from(stdin).toString())
    }
  })

  test('workdir', async () => {
    const result = await sandbox.run(['pwd'], { workdir: '/work' })
    assert.equal(result.stdout, '/work\n')
    assert.equal((await sandbox.run(['pwd'])).stdout, '/tmp\n')
  })

  test('net none: the host loopback is unreachable', async (t) => {
    let connections = 0
    const server = net.createServer((socket) => {
      connections += 1
      socket.destroy()
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    t.after(() => server.close())
    const { port } = server.address()
    const probe = `import socket\ntry:\n  socket.create_connection(("127.0.0.1", ${port}), timeout=2)\n  print("connected")\nexcept OSError as e:\n  print("refused", e)`
    const result = await sandbox.run(Tool.script('python', probe), { net: 'none' })
    assert.match(result.stdout, /^refused/)
    assert.equal(connections, 0, 'the listener got nothing')
  })

  test('limits in all their forms are accepted', async () => {
    const result = await sandbox.run(['true'], {
      timeoutMs: 10_000,
      cpuTimeMs: 5_000,
      memory: '256M',
      processes: 32,
      maxOutput: 65536,
      fileSize: '1M',
      openFiles: 64,
      disk: '8M',
      addressSpace: '4G',
      system: 'runtime',
      net: 'none',
    })
    assert.equal(result.exitCode, 0)
    assert.ok(result.receipt.enforced.some((e) => e.capability === 'memory' && e.detail.includes('256')))
  })

  test('cpus sets the CPU quota named in the receipt', async () => {
    const result = await sandbox.run(['true'], { cpus: 0.5 })
    assert.equal(result.exitCode, 0)
    const quota = result.receipt.enforced.find((e) => e.mechanism === 'cgroup cpu quota')
    assert.ok(quota, JSON.stringify(result.receipt.enforced))
    assert.match(quota.detail, /0\.5 core/)
  })

  test('image runs the tool in a container image (native runtime)', async () => {
    // The repository's test images, built from Debian packages (cached; never pulled).
    const repo = path.join(__dirname, '..', '..', '..')
    execFileSync(path.join(repo, 'scripts', 'build-test-images.sh'), { stdio: 'ignore' })
    const image = path.join(repo, '.ci', 'cache', 'images', 'python-oci')
    const containers = new Sandbox({ backend: 'container' })
    const result = await containers.run(['python3', '-c', 'import os; print(os.path.exists("/usr/bin/python3"), os.getuid())'], {
      image,
      runtime: 'native',
      cpus: 1,
    })
    assert.equal(result.exitCode, 0, result.stderr)
    assert.equal(result.stdout.split(' ')[0], 'True')
    assert.equal(result.receipt.backend, 'container')
    assert.equal(result.receipt.container.runtime, 'native')
    assert.match(result.receipt.container.digest, /^sha256:/)
  })

  test('undefined and null keys keep their defaults', async () => {
    const result = await sandbox.run(['true'], { timeoutMs: undefined, memory: null, env: undefined })
    assert.equal(result.exitCode, 0)
    assert.equal((await sandbox.run(['true'], null)).exitCode, 0)
  })

  test('agent: its own host identity, stable across runs; fresh runs get another', async (t) => {
    assert.equal(process.getuid(), 0, 'run the suite as root (.ci/run does)')
    const dir = tempDir(t)
    fs.chmodSync(dir, 0o755)
    const result = await sandbox.run(['/bin/sh', '-c', `touch ${dir}/made`], { readWrite: [dir], agent: 'node-agent' })
    assert.equal(result.exitCode, 0, result.stderr)
    const id = result.receipt.identity
    assert.equal(id.agent, 'node-agent')
    assert.equal(id.source, 'agent')
    assert.notEqual(id.host_uid, 0)
    assert.equal(fs.statSync(path.join(dir, 'made')).uid, id.host_uid)
    const again = (await sandbox.run(['true'], { agent: 'node-agent' })).receipt.identity
    assert.equal(again.host_uid, id.host_uid)
    const fresh = (await sandbox.run(['true'])).receipt.identity
    assert.equal(fresh.source, 'fresh')
    assert.notEqual(fresh.host_uid, id.host_uid)
    await assert.rejects(sandbox.run(['true'], { agent: '../evil' }), /agent name/)
  })
})
