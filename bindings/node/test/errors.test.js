'use strict'
// Bad input is rejected with the right code, and nothing runs: every case below asks for a
// tool that would leave a marker file in a read-write directory, and the file never appears.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const strata = require('..')
const { Sandbox, Tool, StrataError, InvalidRequestError, CancelledError } = strata
const { tempDir, rejection } = require('./helpers.js')

const sandbox = new Sandbox()

const ERROR_CLASSES = {
  InvalidRequestError: 'invalid_request',
  DeniedError: 'denied',
  BackendUnavailableError: 'backend_unavailable',
  UnenforceableError: 'unenforceable',
  LimitExceededError: 'limit_exceeded',
  ToolFailedError: 'tool_failed',
  CancelledError: 'cancelled',
  SetupFailedError: 'setup_failed',
  InternalError: 'internal',
}

describe('error classes', () => {
  test('one Error subclass per kind, with a stable code', () => {
    for (const [name, code] of Object.entries(ERROR_CLASSES)) {
      const Cls = strata[name]
      const error = new Cls('message')
      assert.ok(error instanceof Cls)
      assert.ok(error instanceof StrataError)
      assert.ok(error instanceof Error)
      assert.equal(error.code, code)
      assert.equal(error.message, 'message')
      assert.equal(error.name, name === 'CancelledError' ? 'AbortError' : name)
      assert.match(error.stack, new RegExp(error.name))
    }
    const base = new StrataError('m', 'denied', { cause: 'why' })
    assert.equal(base.code, 'denied')
    assert.equal(base.cause, 'why')
  })
})

/** Runs `attempt(toolThatLeavesAMarker, capsGrantingTheMarkerDir)` and checks the rejection. */
async function refusedAndNothingRan(t, code, attempt, Cls = StrataError) {
  const dir = tempDir(t)
  const markerFile = path.join(dir, 'ran')
  const tool = ['touch', markerFile]
  const caps = { readWrite: dir }
  const error = await rejection(Promise.resolve().then(() => attempt(tool, caps)))
  assert.ok(error instanceof Cls, `${error.name}: ${error.message}`)
  assert.ok(error instanceof StrataError)
  assert.equal(error.code, code, error.message)
  assert.equal(fs.existsSync(markerFile), false, 'nothing ran')
  // Sanity check: the same tool with good input does leave the marker.
  const ok = await sandbox.run(tool, caps)
  assert.equal(ok.exitCode, 0, ok.stderr)
  assert.equal(fs.existsSync(markerFile), true)
  return error
}

describe('bad input is rejected with invalid_request and nothing runs', () => {
  const cases = {
    'an unknown caps key': (tool, caps) => sandbox.run(tool, { ...caps, readonly: ['/etc'] }),
    'caps that are not an object': (tool) => sandbox.run(tool, 'readOnly=/etc'),
    'a string for an array': (tool, caps) => sandbox.run(tool, { ...caps, env: ['A=1'] }),
    'a NaN timeout': (tool, caps) => sandbox.run(tool, { ...caps, timeoutMs: NaN }),
    'a negative timeout': (tool, caps) => sandbox.run(tool, { ...caps, timeoutMs: -1 }),
    'a zero timeout': (tool, caps) => sandbox.run(tool, { ...caps, timeoutMs: 0 }),
    'a fractional process count': (tool, caps) => sandbox.run(tool, { ...caps, processes: 1.5 }),
    'a bad size': (tool, caps) => sandbox.run(tool, { ...caps, memory: '12 parsecs' }),
    'a bad network policy': (tool, caps) => sandbox.run(tool, { ...caps, net: 'everything' }),
    'a bad network rule': (tool, caps) => sandbox.run(tool, { ...caps, net: ['example.com:99999'] }),
    'a relative mount path': (tool, caps) => sandbox.run(tool, { ...caps, readOnly: 'etc' }),
    'a mount path with ..': (tool, caps) => sandbox.run(tool, { ...caps, readOnly: '/tmp/../etc' }),
    'a mount over /proc': (tool, caps) => sandbox.run(tool, { ...caps, mounts: [{ host: '/tmp', guest: '/proc' }] }),
    'a bad mount access': (tool, caps) => sandbox.run(tool, { ...caps, mounts: [{ host: '/tmp', access: 'rwx' }] }),
    'a missing mount source': (tool, caps) => sandbox.run(tool, { ...caps, readOnly: '/nonexistent/strata' }),
    'a bad env name': (tool, caps) => sandbox.run(tool, { ...caps, env: { 'A=B': '1' } }),
    'a bad stdin': (tool, caps) => sandbox.run(tool, { ...caps, stdin: 42 }),
    'a shell string for a tool': (tool, caps) => sandbox.run(tool.join(' '), caps),
    'an empty argv': (tool, caps) => sandbox.run([], caps),
    'a non-string argument': (tool, caps) => sandbox.run([...tool, 3], caps),
    'an unknown tool kind': (tool, caps) => sandbox.run({ kind: 'shell', argv: tool }, caps),
    'an unknown tool field': (tool, caps) => sandbox.run({ kind: 'command', argv: tool, shell: true }, caps),
    'an unknown script language': (tool, caps) => sandbox.run(Tool.script('ruby', 'puts 1'), caps),
    'a missing script source': (tool, caps) => sandbox.run({ kind: 'script', language: 'sh' }, caps),
    'a missing program': (tool, caps) => sandbox.run(['/nonexistent/program'], caps),
    'an unknown run option': (tool, caps) => sandbox.run(tool, caps, { timeout: 5 }),
    'a callback that is not a function': (tool, caps) => sandbox.run(tool, caps, { onStdout: 'print' }),
    'a signal that is not an AbortSignal': (tool, caps) => sandbox.run(tool, caps, { signal: true }),
    'a zero cpu share': (tool, caps) => sandbox.run(tool, { ...caps, cpus: 0 }),
    'an unknown container runtime': (tool, caps) => sandbox.run(tool, { ...caps, image: '/x', runtime: 'lxc' }),
    'a container runtime without an image': (tool, caps) => sandbox.run(tool, { ...caps, runtime: 'docker' }),
    'a relative container workspace': (tool, caps) => sandbox.run(tool, { ...caps, image: '/x', workspace: 'ws' }),
  }
  for (const [name, attempt] of Object.entries(cases)) {
    test(name, async (t) => {
      const error = await refusedAndNothingRan(t, 'invalid_request', attempt, InvalidRequestError)
      assert.ok(error.message.length > 10, error.message)
    })
  }

  test('an unknown caps key is named in the message', async () => {
    const error = await rejection(sandbox.run(['true'], { readOnyl: '/etc' }))
    assert.match(error.message, /unknown field `readOnyl`/)
    assert.match(error.message, /readOnly/)
  })
})

describe('other refusals carry their own code', () => {
  test('an aborted signal: cancelled, nothing runs', async (t) => {
    const reason = new Error('user pressed stop')
    const error = await refusedAndNothingRan(
      t,
      'cancelled',
      (tool, caps) => sandbox.run(tool, caps, { signal: AbortSignal.abort(reason) }),
      CancelledError,
    )
    assert.equal(error.name, 'AbortError')
    assert.equal(error.cause, reason)
  })

  test('a network the backend cannot enforce: unenforceable (strict)', async (t) => {
    // A microvm guest's only way out is the egress proxy: host networking is refused
    // before anything boots (and before the guest is looked for).
    const vm = new Sandbox({ backend: 'microvm' })
    const error = await refusedAndNothingRan(t, 'unenforceable', (tool) =>
      vm.run(tool, { net: 'host' }),
    )
    assert.ok(error instanceof strata.UnenforceableError)
    assert.match(error.guarantee, /net/)
  })

  test('a tool the backend cannot run here: backend_unavailable', async (t) => {
    // The microvm guest has no JavaScript runtime: refused before anything boots.
    const error = await refusedAndNothingRan(t, 'backend_unavailable', () =>
      new Sandbox({ backend: 'microvm' }).run(Tool.script('javascript', 'console.log(1)'), {}),
    )
    assert.ok(error instanceof strata.BackendUnavailableError)
    assert.equal(error.backend, 'microvm')
  })

  test('a missing helper: backend_unavailable at run time', async (t) => {
    const broken = new Sandbox({ helper: '/nonexistent/strata-helper' })
    const error = await refusedAndNothingRan(t, 'backend_unavailable', (tool, caps) => broken.run(tool, caps))
    assert.match(error.message, /nonexistent/)
  })
})

describe('constructor errors are thrown synchronously', () => {
  for (const [name, options] of Object.entries({
    'an unknown backend': { backend: 'vm' },
    'an unknown option': { strictness: 'best_effort' },
    'a non-boolean strict': { strict: 'no' },
    'a non-string helper': { helper: 42 },
    'options that are not an object': 'process',
  })) {
    test(name, () => {
      assert.throws(
        () => new Sandbox(options),
        (error) => error instanceof InvalidRequestError && error.code === 'invalid_request',
      )
    })
  }
})

describe('check: a failed run rejects, with its result', () => {
  test('tool_failed', async () => {
    const error = await rejection(sandbox.run(['sh', '-c', 'echo partial; exit 3'], {}, { check: true }))
    assert.ok(error instanceof strata.ToolFailedError)
    assert.equal(error.code, 'tool_failed')
    assert.equal(error.result.exitCode, 3)
    assert.equal(error.result.stdout, 'partial\n')
  })

  test('limit_exceeded', async () => {
    const error = await rejection(sandbox.run(['sleep', '30'], { timeoutMs: 100 }, { check: true }))
    assert.ok(error instanceof strata.LimitExceededError)
    assert.equal(error.limit, 'wall')
    assert.equal(error.result.timedOut, true)
  })

  test('a successful checked run resolves', async () => {
    assert.equal((await sandbox.run(['true'], {}, { check: true })).exitCode, 0)
  })
})
