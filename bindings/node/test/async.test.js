'use strict'
// The asynchronous paths: AbortSignal kills the sandbox and leaves no process behind,
// streaming callbacks, 100 concurrent runs, and an event loop that never waits for a run.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const { execFileSync } = require('node:child_process')
const { getEventListeners, once } = require('node:events')
const fs = require('node:fs')
const path = require('node:path')
const { Worker } = require('node:worker_threads')

const { Sandbox, Tool, CancelledError } = require('..')
const { marker, processesWith, rejection, tempDir } = require('./helpers.js')

const sandbox = new Sandbox()
const pkg = JSON.stringify(path.join(__dirname, '..'))

/** A run that prints `ready`, then sleeps; every process in it carries `tag` in its env. */
function sleeper(tag) {
  return [Tool.script('sh', 'echo ready; sleep 1000 & sleep 1000; wait'), { env: { STRATA_TAG: tag } }]
}

describe('AbortSignal', () => {
  test('aborting a running sandbox kills it, rejects with AbortError, and leaves no process', async () => {
    const tag = marker()
    const controller = new AbortController()
    let alive = []
    const [tool, caps] = sleeper(tag)
    const run = sandbox.run(tool, caps, {
      signal: controller.signal,
      onStdout: () => {
        alive = processesWith(tag)
        controller.abort(new Error('stop'))
      },
    })
    const error = await rejection(run)
    assert.ok(error instanceof CancelledError, `${error.name}: ${error.message}`)
    assert.equal(error.name, 'AbortError')
    assert.equal(error.code, 'cancelled')
    assert.equal(error.cause.message, 'stop')
    assert.ok(alive.length >= 1, `the probe sees the sandbox's processes while it runs: ${alive}`)
    assert.deepEqual(processesWith(tag), [], 'no process of the run is left once the promise settles')
    assert.equal(getEventListeners(controller.signal, 'abort').length, 0, 'the abort listener is removed')
  })

  test('an abort after the run finished changes nothing', async () => {
    const controller = new AbortController()
    const result = await sandbox.run(['echo', 'done'], {}, { signal: controller.signal })
    assert.equal(getEventListeners(controller.signal, 'abort').length, 0)
    controller.abort()
    assert.equal(result.stdout, 'done\n')
  })

  test('one signal aborts many runs', async () => {
    const tag = marker()
    const controller = new AbortController()
    const [tool, caps] = sleeper(tag)
    let started = 0
    const runs = Array.from({ length: 5 }, () =>
      sandbox.run(tool, caps, {
        signal: controller.signal,
        onStdout: () => {
          started += 1
          if (started === 5) controller.abort()
        },
      }),
    )
    const outcomes = await Promise.allSettled(runs)
    for (const outcome of outcomes) {
      assert.equal(outcome.status, 'rejected')
      assert.equal(outcome.reason.code, 'cancelled')
    }
    assert.deepEqual(processesWith(tag), [])
  })

  test('runs sharing a signal add one listener to it, removed after the last', async () => {
    const controller = new AbortController()
    const runs = Array.from({ length: 30 }, () => sandbox.run(['true'], {}, { signal: controller.signal }))
    assert.equal(getEventListeners(controller.signal, 'abort').length, 1)
    await Promise.all(runs)
    assert.equal(getEventListeners(controller.signal, 'abort').length, 0)
  })

  test('AbortSignal.timeout works as a deadline', async () => {
    const tag = marker()
    const [tool, caps] = sleeper(tag)
    const error = await rejection(sandbox.run(tool, caps, { signal: AbortSignal.timeout(300) }))
    assert.equal(error.code, 'cancelled')
    assert.equal(error.cause.name, 'TimeoutError')
    assert.deepEqual(processesWith(tag), [])
  })

  test('a throwing output callback cancels the run and rejects with what it threw', async () => {
    const tag = marker()
    const [tool, caps] = sleeper(tag)
    const thrown = new Error('callback failed')
    const error = await rejection(
      sandbox.run(tool, caps, {
        onStdout: () => {
          throw thrown
        },
      }),
    )
    assert.equal(error, thrown)
    assert.deepEqual(processesWith(tag), [])
  })
})

describe('streaming', () => {
  test('onStdout and onStderr get every chunk, in order, before the promise settles', async () => {
    const out = []
    const err = []
    let settled = false
    const script = 'for i in $(seq 1 50); do echo "out $i"; echo "err $i" >&2; done'
    const result = await sandbox.run(Tool.script('sh', script), {}, {
      onStdout: (chunk) => {
        assert.ok(Buffer.isBuffer(chunk))
        assert.equal(settled, false)
        out.push(chunk)
      },
      onStderr: (chunk) => {
        assert.equal(settled, false)
        err.push(chunk)
      },
    })
    settled = true
    assert.equal(Buffer.concat(out).toString(), result.stdout)
    assert.equal(Buffer.concat(err).toString(), result.stderr)
    assert.match(result.stdout, /^out 1\n[^]*out 50\n$/)
  })

  test('chunks arrive while the run goes on', async (t) => {
    // The tool waits for a file the callback creates when it sees the first line: the run
    // can only finish if that chunk was delivered while it was still running.
    const dir = tempDir(t)
    const result = await sandbox.run(
      Tool.script('sh', `echo first; while [ ! -e ${dir}/go ]; do sleep 0.01; done; echo second`),
      { readOnly: dir, timeoutMs: 60_000 },
      {
        onStdout: (chunk) => {
          if (chunk.toString().includes('first')) fs.writeFileSync(path.join(dir, 'go'), '')
        },
      },
    )
    assert.equal(result.stdout, 'first\nsecond\n', result.status)
  })

  test('only the stream asked for is delivered', async () => {
    const out = []
    const result = await sandbox.run(['sh', '-c', 'echo o; echo e >&2'], {}, { onStdout: (c) => out.push(c) })
    assert.equal(Buffer.concat(out).toString(), 'o\n')
    assert.equal(result.stderr, 'e\n')
  })
})

describe('concurrency and the event loop', () => {
  test('100 concurrent runs all finish with their own output', async () => {
    const runs = Array.from({ length: 100 }, (_, i) => sandbox.run(['echo', `run ${i}`], { timeoutMs: 120_000 }))
    const results = await Promise.all(runs)
    results.forEach((result, i) => {
      assert.equal(result.exitCode, 0, result.stderr)
      assert.equal(result.stdout, `run ${i}\n`)
    })
  })

  test('the event loop keeps turning while a run is in flight', async (t) => {
    // The tool waits for a file that only an event-loop callback, scheduled after run()
    // returned, creates: the run can only finish if the loop turned while it ran.
    const dir = tempDir(t)
    const run = sandbox.run(
      Tool.script('sh', `while [ ! -e ${dir}/go ]; do sleep 0.01; done; echo released`),
      { readOnly: dir, timeoutMs: 60_000 },
    )
    setImmediate(() => fs.writeFileSync(path.join(dir, 'go'), ''))
    const result = await run
    assert.equal(result.stdout, 'released\n', result.status)
  })

  test('a run in flight keeps the process alive, which exits by itself once runs end', () => {
    // Runs share one threadsafe function per thread, referenced only while runs are in
    // flight: a script whose only pending work is a run waits for it, then exits by itself.
    const script = `const { Sandbox } = require(${pkg})
      const s = new Sandbox()
      s.run(['sh', '-c', 'sleep 0.2; echo late'])
        .then((r) => { process.stdout.write(r.stdout); return s.run(['true']) })
        .then(() => process.stdout.write('done\\n'))`
    const out = execFileSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 })
    assert.equal(out, 'late\ndone\n')
  })

  test('runs work in worker threads, which end by themselves after', async () => {
    const worker = new Worker(
      `const { parentPort } = require('node:worker_threads')
       const { Sandbox } = require(${pkg})
       const s = new Sandbox()
       Promise.all([s.run(['echo', 'one']), s.run(['echo', 'two'])])
         .then((rs) => parentPort.postMessage(rs.map((r) => r.stdout).join('')))`,
      { eval: true },
    )
    const [message] = await once(worker, 'message')
    assert.equal(message, 'one\ntwo\n')
    const [code] = await once(worker, 'exit')
    assert.equal(code, 0)
  })

  test('a worker terminated while its run is in flight does not take the process down', async () => {
    const worker = new Worker(
      `const { parentPort } = require('node:worker_threads')
       const { Sandbox } = require(${pkg})
       new Sandbox().run(['sleep', '0.3'], {}, { onStdout: () => {} })
       parentPort.postMessage('started')`,
      { eval: true },
    )
    await once(worker, 'message')
    await worker.terminate()
    // The run ends after its thread is gone: its events are dropped, and runs here go on.
    await new Promise((resolve) => setTimeout(resolve, 500))
    assert.equal((await sandbox.run(['echo', 'still here'])).stdout, 'still here\n')
  })

  test('run returns a pending promise at once', () => {
    const promise = sandbox.run(['true'])
    assert.ok(promise instanceof Promise)
    return promise
  })
})
