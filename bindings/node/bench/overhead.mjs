// Benchmark: what `await sandbox.run()` costs from Node.js beyond the Rust call it makes,
// next to `child_process.spawn` of the same command, and what the thread hops alone cost on
// this machine (the floor under any binding that runs blocking work off the JS thread).
//
//   node bench/overhead.mjs [runs]        (default 300 runs per series, after warm-up)
//   STRATA_BENCH_PACKAGE=<dir> node bench/overhead.mjs
//                                         (the same bench against another build of the
//                                         package, e.g. a copy of the previous one, to
//                                         compare before/after in one session)
//
// What it measures:
//
// - binding overhead/call: per sequential `await sandbox.run(['/bin/true'])`, the wall time
//   JavaScript observes (hrtime around the await) minus `result.nativeMs`, the wall time of
//   the Rust `Sandbox::run_with` call measured on the thread that makes it. The difference is
//   everything the binding adds: argument conversion, the hand-off to the run pool (hop one),
//   the threadsafe call back to the event loop (hop two), result conversion and Promise
//   resolution. Target: <= 30 us.
// - round trip, no sandbox: a run Rust refuses at once (a relative mount path), so the same
//   path with nothing to wait for in between: the binding's work when every thread is hot.
// - hops (native probe): the same two hops around a sleep as long as a run, timed in Rust:
//   hop one from just before the hand-off to the pool thread running, hop two from just
//   before the threadsafe call to the JavaScript callback running; "probe overhead" is the
//   probe's wall time in JavaScript minus the time the pool thread slept (timer slack of the
//   sleep excluded, unlike a ping-pong timed from JavaScript). Hop two after an idle wait is
//   the floor of any design that settles a Promise from another thread, one hop or two.
// - hop 2 in real runs: the same hop-back latency, for the runs of the first series (the
//   addon keeps the last one per thread). Next to the idle probe's it shows what the
//   sandbox's own teardown (cgroup removal, namespace cleanup in the kernel), running at
//   that moment on the same two CPUs, adds.
// - JS-thread CPU per call: on-CPU time of the main thread over a series, per call (from
//   /proc/<pid>/task/<pid>/schedstat): the binding's own work on the event loop, as it runs
//   between sandboxes, with cold caches, context switches included.
// - child_process.spawn of /bin/true (no isolation) next to the sandboxed run, and 100
//   concurrent sandboxed runs.
//
// The series are interleaved in blocks so that all see the same machine state; the load
// average is printed before and after (other work on the machine shows up in every number).

import { spawn } from 'node:child_process'
import fs from 'node:fs'
import { createRequire } from 'node:module'
import os from 'node:os'
import path from 'node:path'

const runs = Number(process.argv[2] ?? 300)
const blocks = 10
const perBlock = Math.max(1, Math.round(runs / blocks))
const warmup = 30

const packageDir = process.env.STRATA_BENCH_PACKAGE ? path.resolve(process.env.STRATA_BENCH_PACKAGE) : null
const require = createRequire(import.meta.url)
const { Sandbox } = packageDir ? require(packageDir) : await import('strata-sandbox')
const { addonPath } = require(packageDir ? path.join(packageDir, 'platform.js') : '../platform.js')
const native = require(addonPath)

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

const sinceUs = (t0) => Number(process.hrtime.bigint() - t0) / 1000
const schedstat = `/proc/${process.pid}/task/${process.pid}/schedstat`
/** On-CPU time of the JavaScript thread so far, microseconds (null where /proc lacks it). */
function threadCpuUs() {
  try {
    return Number(fs.readFileSync(schedstat, 'latin1').split(' ')[0]) / 1000
  } catch {
    return null
  }
}

async function strataSeries(n, out) {
  const cpu0 = threadCpuUs()
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    const result = await sandbox.run(tool)
    const wallUs = sinceUs(t0)
    if (result.exitCode !== 0) throw new Error(`run failed: ${result.status} ${result.stderr}`)
    out.wall.push(wallUs / 1000)
    out.native.push(result.nativeMs)
    out.overhead.push(wallUs - result.nativeMs * 1000)
    if (hasProbe) out.hopB.push(native.probeLastHopUs())
  }
  if (cpu0 !== null) out.cpu.push((threadCpuUs() - cpu0) / n)
}

function spawnOnce() {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint()
    const child = spawn('/bin/true', [], { stdio: ['ignore', 'pipe', 'pipe'] })
    child.on('error', reject)
    child.on('close', (code) => {
      if (code !== 0) reject(new Error(`spawn exit ${code}`))
      else resolve(sinceUs(t0) / 1000)
    })
  })
}

async function spawnSeries(n, out) {
  for (let i = 0; i < n; i++) out.push(await spawnOnce())
}

async function roundTripSeries(n, out) {
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint()
    try {
      await sandbox.run(tool, { readOnly: 'relative/path' })
      throw new Error('expected a refusal')
    } catch (error) {
      if (error.code !== 'invalid_request') throw error
    }
    out.push(sinceUs(t0))
  }
}

function probeOnce(sleepUs) {
  return new Promise((resolve) => {
    const t0 = process.hrtime.bigint()
    native.probeHops(sleepUs, (kind, hopA, hopB, slept) => {
      resolve({ hopA, hopB, beyond: sinceUs(t0) - slept })
    })
  })
}

async function probeSeries(n, sleepUs, out) {
  const cpu0 = threadCpuUs()
  for (let i = 0; i < n; i++) {
    const { hopA, hopB, beyond } = await probeOnce(sleepUs)
    out.hopA.push(hopA)
    out.hopB.push(hopB)
    out.beyond.push(beyond)
  }
  if (cpu0 !== null) out.cpu.push((threadCpuUs() - cpu0) / n)
}

async function concurrent(n) {
  const t0 = process.hrtime.bigint()
  await Promise.all(Array.from({ length: n }, () => sandbox.run(tool)))
  return sinceUs(t0) / 1000
}

const hasProbe = typeof native.probeHops === 'function'
const strata = { wall: [], native: [], overhead: [], hopB: [], cpu: [] }
const spawned = []
const roundTrip = []
const hot = { hopA: [], hopB: [], beyond: [], cpu: [] }
const idle = { hopA: [], hopB: [], beyond: [], cpu: [] }
const loadBefore = os.loadavg()[0]

const warm = { wall: [], native: [], overhead: [], hopB: [], cpu: [] }
await strataSeries(warmup, warm)
await spawnSeries(warmup, [])
await roundTripSeries(warmup, [])
// The idle probe sleeps as long as a sandboxed run takes here.
const runUs = Math.round(stats(warm.native).p50 * 1000)
if (hasProbe) {
  await probeSeries(warmup, 0, { hopA: [], hopB: [], beyond: [], cpu: [] })
  await probeSeries(10, runUs, { hopA: [], hopB: [], beyond: [], cpu: [] })
}
for (let b = 0; b < blocks; b++) {
  await strataSeries(perBlock, strata)
  await spawnSeries(perBlock, spawned)
  await roundTripSeries(perBlock, roundTrip)
  if (hasProbe) {
    await probeSeries(perBlock, 0, hot)
    await probeSeries(perBlock, runUs, idle)
  }
}
const parallelMs = []
for (let i = 0; i < 3; i++) parallelMs.push(await concurrent(100))
const loadAfter = os.loadavg()[0]

const s = { wall: stats(strata.wall), native: stats(strata.native), overhead: stats(strata.overhead) }
const sp = stats(spawned)
const line = (label, text) => console.log(`  ${label.padEnd(24)}${text}`)
const rt = stats(roundTrip)
const par = stats(parallelMs)
const n = strata.wall.length
console.log(
  `strata-sandbox bench: ${n} sequential runs of ${tool.join(' ')} each way (${packageDir ?? 'strata-sandbox'}; ` +
    `node ${process.version}, ${os.cpus().length} cpus, load average ${loadBefore.toFixed(1)} -> ${loadAfter.toFixed(1)})`,
)
line('await sandbox.run()', fmt(s.wall, 'ms'))
line('Rust Sandbox::run_with', fmt(s.native, 'ms'))
line('binding overhead/call', `${fmt(s.overhead, 'us')}   (target <= 30 us)`)
line('round trip, no sandbox', `${fmt(rt, 'us')}   (refused inside Rust: all threads hot)`)
const mean = (a) => (a.length ? a.reduce((x, y) => x + y, 0) / a.length : NaN)
const cpuRun = mean(strata.cpu)
if (!Number.isNaN(cpuRun)) {
  const perBlockCpu = strata.cpu.map((v) => v.toFixed(0)).join(' ')
  line('JS-thread CPU per run', `${cpuRun.toFixed(1)} us   (mean; per block: ${perBlockCpu})`)
}
let floor = null
if (hasProbe) {
  const h = { hopA: stats(hot.hopA), hopB: stats(hot.hopB), beyond: stats(hot.beyond) }
  const i = { hopA: stats(idle.hopA), hopB: stats(idle.hopB), beyond: stats(idle.beyond) }
  const idleMs = `${(runUs / 1000).toFixed(1)} ms idle`
  line('hop 1 JS->pool, hot', fmt(h.hopA, 'us'))
  line('hop 2 pool->JS, hot', fmt(h.hopB, 'us'))
  line('probe overhead, hot', `${fmt(h.beyond, 'us')}   (both hops and both ends, nothing in between)`)
  line('hop 1 JS->pool, idle', `${fmt(i.hopA, 'us')}   (pool thread idle since the last probe)`)
  line('hop 2 pool->JS, idle', `${fmt(i.hopB, 'us')}   (after ${idleMs}: the floor of a one-hop design)`)
  line('probe overhead, idle', `${fmt(i.beyond, 'us')}   (after ${idleMs}: the floor of this two-hop design)`)
  const realHop = stats(strata.hopB)
  line('hop 2 pool->JS, runs', `${fmt(realHop, 'us')}   (the same hop at the end of the real runs above)`)
  line('JS-thread CPU, probes', `idle ${mean(idle.cpu).toFixed(1)} us, hot ${mean(hot.cpu).toFixed(1)} us per call (means)`)
  console.log(
    `  => a run's overhead beyond the idle probe, p50: ${(s.overhead.p50 - i.beyond.p50).toFixed(1)} us ` +
      `(hop 2 slowed by the sandbox's teardown: ${(realHop.p50 - i.hopB.p50).toFixed(1)} us; ` +
      `JS-thread CPU beyond the idle probe's: ${(cpuRun - mean(idle.cpu)).toFixed(1)} us)`,
  )
  floor = { hot: h, idle: i, realHop, idleCpu: mean(idle.cpu), hotCpu: mean(hot.cpu) }
}
line('child_process.spawn', `${fmt(sp, 'ms')}   (no isolation)`)
line('ratio sandbox/spawn p50', `${(s.wall.p50 / sp.p50).toFixed(2)}x`)
line('overhead share, p50', `${((s.overhead.p50 / 1000 / s.wall.p50) * 100).toFixed(3)}% of a run`)
const perSecond = ((100 / par.p50) * 1000).toFixed(0)
line(
  '100 concurrent runs',
  `${par.p50.toFixed(1)} ms wall, median of 3 (${perSecond} runs/s; ${parallelMs.map((v) => v.toFixed(0)).join(', ')} ms)`,
)
console.log(
  JSON.stringify({
    runs: n,
    load: [+loadBefore.toFixed(2), +loadAfter.toFixed(2)],
    overhead_us_p50: +s.overhead.p50.toFixed(1),
    overhead_us_p99: +s.overhead.p99.toFixed(1),
    overhead_us_mean: +s.overhead.mean.toFixed(1),
    round_trip_us_p50: +rt.p50.toFixed(1),
    js_cpu_per_run_us: +cpuRun.toFixed(1),
    ...(floor && {
      hop_one_hot_us_p50: +floor.hot.hopA.p50.toFixed(1),
      hop_two_hot_us_p50: +floor.hot.hopB.p50.toFixed(1),
      probe_hot_us_p50: +floor.hot.beyond.p50.toFixed(1),
      hop_one_idle_us_p50: +floor.idle.hopA.p50.toFixed(1),
      hop_two_idle_us_p50: +floor.idle.hopB.p50.toFixed(1),
      hop_two_idle_us_p99: +floor.idle.hopB.p99.toFixed(1),
      probe_idle_us_p50: +floor.idle.beyond.p50.toFixed(1),
      probe_idle_us_p99: +floor.idle.beyond.p99.toFixed(1),
      hop_two_runs_us_p50: +floor.realHop.p50.toFixed(1),
      js_cpu_idle_probe_us: +floor.idleCpu.toFixed(1),
      js_cpu_hot_probe_us: +floor.hotCpu.toFixed(1),
    }),
    sandbox_ms_p50: +s.wall.p50.toFixed(3),
    rust_ms_p50: +s.native.p50.toFixed(3),
    spawn_ms_p50: +sp.p50.toFixed(3),
    ratio_sandbox_over_spawn: +(s.wall.p50 / sp.p50).toFixed(2),
    concurrent_100_ms: +par.p50.toFixed(1),
  }),
)
