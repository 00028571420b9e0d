// Benchmark: what `await sandbox.run()` costs from Node.js beyond the Rust call it makes,
// next to `child_process.spawn` of the same command, in the same process and run.
//
//   node bench/overhead.mjs [runs]        (default 300 runs per series, after 30 warm-up runs)
//
// Per call it records the wall time JavaScript observes (hrtime around the await) and
// `result.nativeMs`, the wall time of the Rust `Sandbox::run_with` call measured inside the
// binding. Their difference is the binding's overhead: argument conversion, the hand-off to
// the run pool, the threadsafe-function wake-up of the event loop, result conversion and
// Promise resolution. Target: <= 30 us (DESIGN.md: bindings <= 2 us beyond the run itself).
//
// The comparison runs `/bin/true` both ways: through a full sandbox (namespaces, landlock,
// seccomp, cgroup) and through a plain `child_process.spawn` (no isolation at all).
//
// Both ends of a run are thread hand-offs (to the run pool, and back to the event loop), so
// the overhead is mostly scheduler wake-up latency: it grows with machine load, which is
// printed with the results, next to a worker_threads ping-pong as the floor for two hops.

import { spawn } from 'node:child_process'
import os from 'node:os'
import { Worker } from 'node:worker_threads'
import { Sandbox } from 'strata-sandbox'

const runs = Number(process.argv[2] ?? 300)

const warmup = 30
const sandbox = new Sandbox({ backend: 'process' })
const tool = ['/bin/true']

function stats(values) {
  const sorted = [...values].sort((a, b) => a - b)
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
  const mean = sorted.reduce((a, b) => a + b, 0) / sorted.length
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99), min: sorted[0], mean }
}

function fmt(s, unit) {
  const f = (v) => (unit === 'us' ? v.toFixed(1) : v.toFixed(3))
  return `p50 ${f(s.p50)} ${unit}  p90 ${f(s.p90)}  p99 ${f(s.p99)}  min ${f(s.min)}  mean ${f(s.mean)}`
}

async function strataSeries(n) {
  const wall = []
  const native = []
  const overhead = []
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    const result = await sandbox.run(tool)
    const t1 = process.hrtime.bigint()
    if (result.exitCode !== 0) throw new Error(`run failed: ${result.status} ${result.stderr}`)
    const wallMs = Number(t1 - t0) / 1e6
    wall.push(wallMs)
    native.push(result.nativeMs)
    overhead.push((wallMs - result.nativeMs) * 1000)
  }
  return { wall: stats(wall), native: stats(native), overhead: stats(overhead) }
}

function spawnOnce() {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint()
    const child = spawn('/bin/true', [], { stdio: ['ignore', 'pipe', 'pipe'] })
    child.on('error', reject)
    child.on('close', (code) => {
      if (code !== 0) reject(new Error(`spawn exit ${code}`))
      else resolve(Number(process.hrtime.bigint() - t0) / 1e6)
    })
  })
}

async function spawnSeries(n) {
  const wall = []
  for (let i = 0; i < n; i++) wall.push(await spawnOnce())
  return stats(wall)
}

// The Promise machinery alone: a request that Rust refuses inside `Sandbox::run_with`
// (a relative mount path fails caps validation), so no sandbox is built, but the call goes
// JS -> conversion -> run pool -> Rust -> threadsafe function -> Promise like any run.
async function roundTripSeries(n) {
  const wall = []
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    try {
      await sandbox.run(tool, { readOnly: 'relative/path' })
      throw new Error('expected a refusal')
    } catch (error) {
      if (error.code !== 'invalid_request') throw error
    }
    wall.push(Number(process.hrtime.bigint() - t0) / 1000)
  }
  return stats(wall)
}

// Reference: two thread hand-offs with nothing else, the floor of any design that runs
// blocking work off the JavaScript thread and reports back: a worker_threads ping-pong,
// hot (the worker answers at once) and cold (the worker first sleeps `waitMs`, as long as a
// sandboxed run takes, so both threads are idle when woken; only the time beyond the wait
// is counted).
async function hopSeries(n, waitMs) {
  const worker = new Worker(
    `const { parentPort } = require('node:worker_threads')
     const cell = new Int32Array(new SharedArrayBuffer(4))
     parentPort.on('message', (ms) => { if (ms > 0) Atomics.wait(cell, 0, 0, ms); parentPort.postMessage(ms) })`,
    { eval: true },
  )
  const wall = []
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    await new Promise((resolve) => {
      worker.once('message', resolve)
      worker.postMessage(waitMs)
    })
    wall.push(Number(process.hrtime.bigint() - t0) / 1000 - waitMs * 1000)
  }
  await worker.terminate()
  return stats(wall)
}

async function concurrent(n) {
  const t0 = process.hrtime.bigint()
  await Promise.all(Array.from({ length: n }, () => sandbox.run(tool)))
  return Number(process.hrtime.bigint() - t0) / 1e6
}

await strataSeries(warmup)
await spawnSeries(warmup)
await roundTripSeries(warmup)
// Interleave the two series so both see the same machine state.
const strata = await strataSeries(runs)
const spawned = await spawnSeries(runs)
const roundTrip = await roundTripSeries(runs)
const hotHops = await hopSeries(runs, 0)
const coldHops = await hopSeries(Math.min(runs, 100), Math.round(strata.native.p50))
const parallelMs = await concurrent(100)

console.log(
  `strata-sandbox bench: ${runs} sequential runs of ${tool.join(' ')} each way (node ${process.version}, ` +
    `${os.cpus().length} cpus, load average ${os.loadavg()[0].toFixed(1)})`,
)
console.log(`  await sandbox.run()       ${fmt(strata.wall, 'ms')}`)
console.log(`  Rust Sandbox::run_with    ${fmt(strata.native, 'ms')}`)
console.log(`  binding overhead/call     ${fmt(strata.overhead, 'us')}   (target <= 30 us)`)
console.log(`  round trip, no sandbox    ${fmt(roundTrip, 'us')}   (refused inside Rust)`)
console.log(`  worker ping-pong, hot     ${fmt(hotHops, 'us')}   (two thread hops, for reference)`)
console.log(`  worker ping-pong, cold    ${fmt(coldHops, 'us')}   (the same after a ${Math.round(strata.native.p50)} ms idle wait)`)
console.log(
  `  => binding work beyond the two hops: ${(roundTrip.p50 - hotHops.p50).toFixed(1)} us hot (round trip - hot ping-pong), ` +
    `${(strata.overhead.p50 - coldHops.p50).toFixed(1)} us per run (overhead - cold ping-pong), p50`,
)
console.log(`  child_process.spawn       ${fmt(spawned, 'ms')}   (no isolation)`)
console.log(`  ratio sandbox/spawn (p50) ${(strata.wall.p50 / spawned.p50).toFixed(2)}x`)
console.log(`  overhead share of a run   ${((strata.overhead.p50 / 1000 / strata.wall.p50) * 100).toFixed(3)}% (p50)`)
console.log(`  100 concurrent runs       ${parallelMs.toFixed(1)} ms wall (${((100 / parallelMs) * 1000).toFixed(0)} runs/s)`)
console.log(
  JSON.stringify({
    runs,
    overhead_us_p50: +strata.overhead.p50.toFixed(1),
    overhead_us_mean: +strata.overhead.mean.toFixed(1),
    round_trip_us_p50: +roundTrip.p50.toFixed(1),
    worker_hot_us_p50: +hotHops.p50.toFixed(1),
    worker_cold_us_p50: +coldHops.p50.toFixed(1),
    beyond_hops_hot_us: +(roundTrip.p50 - hotHops.p50).toFixed(1),
    beyond_hops_run_us: +(strata.overhead.p50 - coldHops.p50).toFixed(1),
    sandbox_ms_p50: +strata.wall.p50.toFixed(3),
    rust_ms_p50: +strata.native.p50.toFixed(3),
    spawn_ms_p50: +spawned.p50.toFixed(3),
    ratio_sandbox_over_spawn: +(strata.wall.p50 / spawned.p50).toFixed(2),
    concurrent_100_ms: +parallelMs.toFixed(1),
  }),
)
