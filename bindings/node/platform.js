'use strict'
// Where this package finds its native parts (the Node-API addon, the `strata-helper` binary
// the process backend starts, the live supervisor `strata-live`): built from source in this
// package, else the prebuilt platform package `strata-sandbox-<platform>`. Shared by
// index.js and scripts/build.js.

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

/** The prebuilt platform package for this host (napi-rs layout; the main package names it
 * as an optional dependency, so npm installs only the matching one). */
const platformPackage = `strata-sandbox-${triple}`

/** The directory of the installed platform package, or null when there is none. */
function platformPackageDir() {
  try {
    return path.dirname(require.resolve(`${platformPackage}/package.json`, { paths: [__dirname] }))
  } catch {
    return null
  }
}

const localAddon = path.join(__dirname, `strata.${triple}.node`)
// Native parts built from source in this package (a checkout: scripts/build.js) come first,
// as napi-rs's loaders do, then the platform package's prebuilt ones.
const nativeDir = fs.existsSync(localAddon) ? __dirname : (platformPackageDir() ?? __dirname)
const exe = process.platform === 'win32' ? '.exe' : ''

/** The native parts' paths inside `dir` (a package directory). */
function nativePaths(dir) {
  return {
    /** The Node-API addon. */
    addonPath: path.join(dir, `strata.${triple}.node`),
    /** The sandbox helper binary the process backend starts. */
    helperPath: path.join(dir, 'bin', `strata-helper${exe}`),
    /** The live sandboxes' supervisor binary. */
    supervisorPath: path.join(dir, 'bin', `strata-live${exe}`),
  }
}

module.exports = {
  triple,
  platformPackage,
  platformPackageDir,
  nativePaths,
  /** The native parts in use: built by scripts/build.js in this package, or the platform package's. */
  ...nativePaths(nativeDir),
  /** Where scripts/build.js installs what it builds from source. */
  localDir: __dirname,
}
