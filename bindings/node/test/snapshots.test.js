'use strict'
// Snapshots and fork of live sandboxes from Node: a snapshot carries the sandbox's own files
// and says what it carries, startFrom restores them, fork children are independent, an
// altered snapshot rejects with DeniedError, a fork storm is refused, and removing a
// snapshot leaves nothing.

const { test, describe } = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const path = require('node:path')

const { Sandbox, snapshots, removeSnapshot, DeniedError, InvalidRequestError } = require('..')
const { tempDir, rejection } = require('./helpers.js')

const sandbox = new Sandbox({ backend: 'process' })

async function sh(live, script) {
  const result = await live.exec(['sh', '-c', script])
  assert.equal(result.exitCode, 0, result.stderr.toString())
  return result.stdout.toString()
}

describe('snapshots', () => {
  test('snapshot and startFrom carry the files and say what they carry', async (t) => {
    const snapshotDir = path.join(tempDir(t), 'store')
    const live = await sandbox.start()
    try {
      await sh(live, 'mkdir -p /tmp/d && echo kept > /tmp/d/note')
      const info = await live.snapshot({ name: 'node-base', snapshotDir })
      assert.equal(info.name, 'node-base')
      assert.match(info.id, /^snap-/)
      assert.ok(info.carries.includes('files:/tmp'), info.carries)
      assert.ok(info.notCarried.some((line) => line.includes('processes')))
      assert.equal(info.source, live.id)
    } finally {
      await live.stop()
    }
    assert.deepEqual((await snapshots({ snapshotDir })).map((s) => s.name), ['node-base'])
    const copy = await sandbox.startFrom('node-base', { snapshotDir })
    try {
      assert.equal(await sh(copy, 'cat /tmp/d/note'), 'kept\n')
      assert.match(JSON.stringify((await copy.info()).receipt), /started from snapshot node-base/)
    } finally {
      await copy.stop()
    }
    await removeSnapshot('node-base', { snapshotDir })
    assert.deepEqual(fs.readdirSync(snapshotDir), ['.key'])
  })

  test('fork children do not see each other’s writes; a fork storm is refused', async (t) => {
    const snapshotDir = path.join(tempDir(t), 'store')
    const parent = await sandbox.start()
    try {
      await sh(parent, 'echo before > /tmp/f')
      const children = await parent.fork(2, { snapshotDir })
      try {
        assert.equal(new Set([parent.id, ...children.map((c) => c.id)]).size, 3)
        await sh(children[0], 'echo mine > /tmp/f')
        await sh(parent, 'echo parent > /tmp/f')
        assert.equal(await sh(children[1], 'cat /tmp/f'), 'before\n')
      } finally {
        for (const child of children) await child.stop()
      }
      const refused = await rejection(parent.fork(101, { snapshotDir }))
      assert.ok(refused instanceof InvalidRequestError, refused)
    } finally {
      await parent.stop()
    }
    assert.deepEqual(fs.readdirSync(snapshotDir), ['.key'])
  })

  test('an altered snapshot rejects with DeniedError and nothing starts', async (t) => {
    const snapshotDir = path.join(tempDir(t), 'store')
    const live = await sandbox.start()
    try {
      await sh(live, 'echo original > /tmp/a')
      await live.snapshot({ name: 'edited', snapshotDir })
    } finally {
      await live.stop()
    }
    fs.writeFileSync(path.join(snapshotDir, 'edited', 'files', 't0', 'a'), 'tampered')
    const denied = await rejection(sandbox.startFrom('edited', { snapshotDir }))
    assert.ok(denied instanceof DeniedError, denied)
    assert.match(denied.message, /altered/)
    const missing = await rejection(sandbox.startFrom('missing', { snapshotDir }))
    assert.ok(missing instanceof InvalidRequestError, missing)
  })
})
