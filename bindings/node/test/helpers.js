'use strict'
// Shared by the tests: real sandboxes, temporary host directories, and a host-side view of
// which processes carry a marker in their environment (to prove nothing outlives a run).

const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const crypto = require('node:crypto')

/** A fresh temporary directory, removed when the test ends. */
function tempDir(t, prefix = 'strata-node-') {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  return dir
}

/** A unique marker for env vars and file names. */
function marker() {
  return `strata_${crypto.randomBytes(8).toString('hex')}`
}

/** PIDs of host processes whose environment contains `needle` (read from /proc as root). */
function processesWith(needle) {
  const found = []
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    let environ
    try {
      environ = fs.readFileSync(`/proc/${entry}/environ`, 'latin1')
    } catch {
      continue // gone, or a kernel thread
    }
    if (environ.includes(needle)) found.push(Number(entry))
  }
  return found
}

/** Resolves with the rejection of `promise`, failing when it resolves. */
async function rejection(promise) {
  try {
    await promise
  } catch (error) {
    return error
  }
  throw new Error('expected the promise to reject, but it resolved')
}

module.exports = { tempDir, marker, processesWith, rejection }
