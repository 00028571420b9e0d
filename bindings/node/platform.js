'use strict'
// Where this package keeps its native parts: the Node-API addon and the `strata-helper`
// binary the process backend starts. Shared by index.js and scripts/build.js.

const fs = require('node:fs')
const path = require('node:path')

function libcSuffix() {
  if (process.platform !== 'linux') return ''
  try {
    return fs.readFileSync('/usr/bin/ldd', 'latin1').includes('musl') ? '-musl' : '-gnu'
  } catch {
    return '-gnu'
  }
}

/** `linux-x64-gnu`, `darwin-arm64`, ...: the napi-rs platform name of this host. */
const triple = `${process.platform}-${process.arch}${libcSuffix()}`

module.exports = {
  triple,
  /** The native addon, built by scripts/build.js. */
  addonPath: path.join(__dirname, `strata.${triple}.node`),
  /** The sandbox helper binary, built by scripts/build.js. */
  helperPath: path.join(__dirname, 'bin', process.platform === 'win32' ? 'strata-helper.exe' : 'strata-helper'),
  /** The live sandboxes' supervisor binary, built by scripts/build.js. */
  supervisorPath: path.join(__dirname, 'bin', 'strata-live'),
}
