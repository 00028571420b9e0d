'use strict'
// The policy layer from Node: tiers, an async approver, an elevation that expires between
// two runs, risk routing and the audit log, on real process-backend runs.

const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const { Sandbox, DeniedError, InvalidRequestError, UnenforceableError, verifyAudit, tierPreset } = require('..')
const { tempDir, rejection } = require('./helpers.js')

function decisions(log) {
  return fs
    .readFileSync(log, 'utf8')
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line).event)
    .filter((event) => event.kind === 'policy')
    .map((event) => `${event.subject}:${event.decision}`)
}

test('a low-tier write is denied naming tier and capability; nothing runs', async (t) => {
  const dir = tempDir(t)
  const ws = path.join(dir, 'ws')
  fs.mkdirSync(ws)
  const log = path.join(dir, 'audit.jsonl')
  const sandbox = new Sandbox({ backend: 'process', tier: 'low', audit: log })
  const error = await rejection(sandbox.run(['/bin/sh', '-c', `echo x > ${ws}/planted`], { readWrite: [ws] }))
  assert.ok(error instanceof DeniedError, String(error))
  assert.match(error.message, /tier low/)
  assert.match(error.message, /write:/)
  assert.equal(fs.existsSync(path.join(ws, 'planted')), false)
  const result = await sandbox.run(['/bin/ls', ws], { readOnly: [ws] })
  assert.equal(result.exitCode, 0)
  assert.deepEqual(result.receipt.policy, { tier: 'low' })
  assert.deepEqual(decisions(log), ['elevation:requested', 'elevation:refused'])
  assert.equal(verifyAudit(log).records, 4)
})

test('an async approver grants; the grant expires between two runs', async (t) => {
  const dir = tempDir(t)
  const ws = path.join(dir, 'ws')
  fs.mkdirSync(ws)
  const log = path.join(dir, 'audit.jsonl')
  const asked = []
  const sandbox = new Sandbox({
    backend: 'process',
    tier: 'low',
    audit: log,
    approver: async (request) => {
      asked.push(request)
      await new Promise((resolve) => setTimeout(resolve, 5))
      return asked.length === 1 ? { ttlMs: 300, runs: 10 } : { decision: 'deny', reason: 'the window is over' }
    },
  })
  const first = await sandbox.run(['/bin/sh', '-c', `echo 1 > ${ws}/first`], { readWrite: [ws] })
  assert.equal(first.exitCode, 0)
  assert.deepEqual(first.receipt.policy.elevations[0].capabilities, [`write:${ws}`])
  await new Promise((resolve) => setTimeout(resolve, 400))
  const error = await rejection(sandbox.run(['/bin/sh', '-c', `echo 2 > ${ws}/second`], { readWrite: [ws] }))
  assert.ok(error instanceof DeniedError)
  assert.match(error.message, /the window is over/)
  assert.equal(fs.existsSync(path.join(ws, 'second')), false)
  assert.equal(asked[0].tier, 'low')
  assert.deepEqual(decisions(log), [
    'elevation:requested',
    'elevation:granted',
    'elevation:used',
    'elevation:expired',
    'elevation:requested',
    'elevation:refused',
  ])
})

test('a throwing approver refuses', async () => {
  const sandbox = new Sandbox({
    backend: 'process',
    tier: 'low',
    approver: () => {
      throw new Error('approver crashed')
    },
  })
  const error = await rejection(sandbox.run(['/bin/true'], { net: 'host' }))
  assert.ok(error instanceof DeniedError)
  assert.match(error.message, /approver crashed/)
})

test('custom tiers, per-run tiers and bad tier input', async () => {
  const reviewers = { ...tierPreset('medium', '/nonexistent'), name: 'reviewers', programs: { only: ['uname'] } }
  const sandbox = new Sandbox({ backend: 'process', tiers: [reviewers], tier: 'reviewers' })
  assert.equal((await sandbox.run(['uname'])).exitCode, 0)
  assert.match((await rejection(sandbox.run(['/usr/bin/id']))).message, /program:id/)
  assert.match((await rejection(sandbox.run(['uname'], { net: 'host' }, { tier: 'low' }))).message, /net:host/)
  assert.ok((await rejection(sandbox.run(['uname'], null, { tier: 'root' }))) instanceof InvalidRequestError)
  assert.throws(() => new Sandbox({ tiers: [{ name: 'broken' }] }), InvalidRequestError)
  assert.throws(() => tierPreset('root'), InvalidRequestError)
})

test('an untrusted risk never falls to a weaker backend silently', async () => {
  const strict = new Sandbox({ routeBackends: ['process'] })
  const error = await rejection(strict.run(['/bin/true'], null, { risk: 'untrusted' }))
  assert.ok(error instanceof UnenforceableError, String(error))
  assert.match(error.message, /risk untrusted/)
  assert.ok((await rejection(strict.run(['/bin/true'], null, { risk: 'reckless' }))) instanceof InvalidRequestError)
  const lenient = new Sandbox({ routeBackends: ['process'], allowWeaker: true })
  const result = await lenient.run(['/bin/true'], null, { risk: 'untrusted' })
  assert.equal(result.receipt.policy.route.backend, 'process')
  assert.match(result.receipt.policy.route.reason, /allowed by the caller/)
})

test('a tampered audit log is named', async (t) => {
  const log = path.join(tempDir(t), 'audit.jsonl')
  const sandbox = new Sandbox({ backend: 'process', audit: log })
  await sandbox.run(['/bin/true'])
  await sandbox.run(['/bin/false'])
  assert.equal(verifyAudit(log).head.length, 64)
  fs.writeFileSync(log, fs.readFileSync(log, 'utf8').replace('/bin/false', '/bin/fals3'))
  assert.throws(() => verifyAudit(log), /line 2/)
  assert.throws(() => new Sandbox({ audit: log }), InvalidRequestError)
})

test('a profile gives backend, tier, caps and risk; a bad one is refused naming where', async (t) => {
  const dir = tempDir(t)
  const data = path.join(dir, 'data')
  fs.mkdirSync(data)
  fs.writeFileSync(path.join(data, 'x'), 'from the profile\n')
  const profile = path.join(dir, 'agent.toml')
  fs.writeFileSync(
    profile,
    `backend = "process"\ntier = "low"\nrisk = "files"\n[caps]\nmounts = [{ host = "${data}", guest = "${data}", access = "ro" }]\nlimits = { timeout_ms = 5000 }\n`,
  )
  const sandbox = new Sandbox({ profile })
  assert.equal(sandbox.backend, 'process')
  const result = await sandbox.run(['cat', path.join(data, 'x')])
  assert.equal(result.stdout, 'from the profile\n')
  assert.equal(result.receipt.policy.tier, 'low')
  assert.equal(result.receipt.policy.route.risk, 'files')
  assert.notEqual((await sandbox.run(['cat', path.join(data, 'x')], {})).exitCode, 0)
  fs.writeFileSync(profile, '[caps]\nlimits = { timeout_ms = "soon" }\n')
  assert.throws(() => new Sandbox({ profile }), (e) => e instanceof InvalidRequestError && /caps\/limits\/timeout_ms/.test(e.message))
})
