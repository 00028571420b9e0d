'use strict'
// Signed messages, transactional workspaces and tool-call caps from Node, on real runs.

const { test } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const {
  Sandbox,
  AgentDirectory,
  Workspace,
  DeniedError,
  InvalidRequestError,
  LimitExceededError,
  generateAgentKey,
  agentPublicKey,
  capsForCall,
  verifyAudit,
} = require('..')
const { tempDir } = require('./helpers.js')

function agents() {
  const directory = new AgentDirectory()
  directory.add('planner', 'medium', { key: generateAgentKey() })
  directory.add('coder', 'low', { key: generateAgentKey() })
  directory.add('reviewer', 'low', { key: generateAgentKey() })
  return directory
}

for (const scheme of ['ed25519', 'hmac-sha256']) {
  test(`a signed delegation (${scheme}) is accepted once and audited`, (t) => {
    const log = path.join(tempDir(t), 'audit.jsonl')
    const sandbox = new Sandbox({ backend: 'process', audit: log })
    const directory = agents()
    const verifier = directory.verifier('coder', { audit: sandbox })
    const signed = directory.sign('planner', 'coder', 'delegate', { task: 'run tests' }, { tier: 'low', scheme })
    const message = verifier.verify(signed)
    assert.equal(message.scheme, scheme)
    assert.deepEqual(JSON.parse(message.body), { task: 'run tests' })
    assert.equal(message.delegation.tier, 'low')
    assert.throws(() => verifier.verify(signed), (e) => e instanceof DeniedError && /replayed/.test(e.message))
    assert.equal(verifyAudit(log).records, 2)
  })
}

test('tampered, cross-agent, stale and upward messages are refused', async () => {
  const directory = agents()
  const signed = JSON.parse(directory.sign('planner', 'coder', 'task', 'ls'))
  const forged = structuredClone(signed)
  forged.message.body = 'rm -rf /'
  assert.throws(() => directory.verifier('coder').verify(forged), /signature/)
  assert.throws(() => directory.verifier('reviewer').verify(signed), /not to this agent/)
  const slow = directory.verifier('coder', { windowMs: 50 })
  const late = directory.sign('planner', 'coder', 'task', 'ls')
  await new Promise((resolve) => setTimeout(resolve, 200))
  assert.throws(() => slow.verify(late), /stale/)
  const up = directory.sign('coder', 'planner', 'delegate', 'deploy', { tier: 'low' })
  assert.throws(() => directory.verifier('planner').verify(up), (e) => e instanceof DeniedError && /not permitted/.test(e.message))
  const raised = directory.sign('planner', 'coder', 'delegate', 'deploy', { tier: 'medium' })
  assert.throws(() => directory.verifier('coder').verify(raised), /not permitted/)
  assert.equal(agentPublicKey(generateAgentKey()).length, 64)
  assert.throws(() => directory.add('x', 'root'), InvalidRequestError)
})

test('a planted git hook in a workspace is refused by commit; the rest commits', async (t) => {
  const root = path.join(tempDir(t), 'repo')
  fs.mkdirSync(path.join(root, '.git'), { recursive: true })
  fs.writeFileSync(path.join(root, 'main.py'), "print('v1')\n")
  const log = path.join(tempDir(t), 'audit.jsonl')
  const sandbox = new Sandbox({ backend: 'process', tier: 'low', audit: log })
  const ws = new Workspace(root)
  const script = `cd ${root} && echo "print('v2')" > main.py && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit`
  const result = await sandbox.runInWorkspace(ws, ['/bin/sh', '-c', script])
  assert.equal(result.exitCode, 0)
  assert.equal(fs.readFileSync(path.join(root, 'main.py'), 'utf8'), "print('v1')\n")
  const hook = ws.diff().changes.find((c) => c.path === '.git/hooks/pre-commit')
  assert.equal(hook.kind, 'added')
  const report = ws.commit({ sandbox })
  assert.ok(report.refused.some((r) => r.path === '.git/hooks/pre-commit'), JSON.stringify(report))
  assert.equal(fs.existsSync(path.join(root, '.git/hooks/pre-commit')), false)
  assert.equal(fs.readFileSync(path.join(root, 'main.py'), 'utf8'), "print('v2')\n")
  const staging = ws.path
  ws.discard()
  assert.equal(fs.existsSync(staging), false)
  assert.throws(() => ws.diff(), /discarded/)
})

test('an over-limit diff cannot be committed', async (t) => {
  const root = tempDir(t)
  const ws = new Workspace(root, { limit: 1000 })
  const sandbox = new Sandbox({ backend: 'process' })
  await sandbox.runInWorkspace(ws, ['/bin/sh', '-c', `head -c 5000 /dev/zero > ${root}/big`])
  assert.equal(ws.diff().over_limit, true)
  assert.throws(() => ws.commit(), LimitExceededError)
  assert.equal(fs.existsSync(path.join(root, 'big')), false)
  ws.discard()
})

test('tool-call arguments become exactly their mounts; beyond the tier is refused', async (t) => {
  const dir = tempDir(t)
  const notes = path.join(dir, 'notes.txt')
  fs.writeFileSync(notes, 'hello\n')
  const schema = {
    type: 'object',
    properties: { path: { type: 'string', 'x-strata': 'read-path' }, pattern: { type: 'string' } },
    required: ['path'],
  }
  const { caps, arguments: used } = capsForCall(schema, { path: notes, pattern: '/etc' }, { timeoutMs: 5000 })
  assert.equal(used[0].capability, `read:${notes}`)
  const sandbox = new Sandbox({ backend: 'process' })
  assert.equal((await sandbox.run(['cat', notes], caps)).stdout, 'hello\n')
  assert.notEqual((await sandbox.run(['cat', '/etc/hostname'], caps)).exitCode, 0)
  assert.throws(() => capsForCall(schema, { path: '/tmp/../etc/shadow' }, null, { tier: 'low' }), DeniedError)
})
