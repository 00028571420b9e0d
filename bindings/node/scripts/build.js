#!/usr/bin/env node
'use strict'
// The package's `install` script: builds the native addon (crate `strata-node`), the
// `strata-helper` binary and the live sandboxes' supervisor `strata-live` with cargo, from
// the Strata workspace this package sits in, and copies them into the package
// (strata.<platform>.node, bin/strata-helper, bin/strata-live), where index.js finds them. Nothing is downloaded but crates from crates.io.
//
// Environment:
//   CARGO                 cargo to run (default: `cargo` on PATH)
//   CARGO_TARGET_DIR      cargo's target dir (default: the workspace's target/, so a
//                         workspace build already done is reused, not redone)
//   STRATA_NODE_PROFILE   cargo profile: `release` (default) or `dev`
//   STRATA_NODE_SKIP_BUILD=1  do nothing (the addon and helper are already in place)
//
// Outside a Strata checkout (installed from a registry or a tarball), nothing is built: the
// prebuilt platform package (`strata-sandbox-linux-x64-gnu`, an optional dependency) is
// used; without one the install fails with a message saying how to build from source.

const { spawnSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')
const { localDir, nativePaths, platformPackage, platformPackageDir, triple } = require('../platform.js')

// Where a source build installs (platform.js prefers these to the platform package's).
const { addonPath, helperPath, supervisorPath } = nativePaths(localDir)

const pkgDir = path.resolve(__dirname, '..')
const workspace = path.resolve(pkgDir, '..', '..')

function fail(message) {
  console.error(`strata-sandbox: ${message}`)
  process.exit(1)
}

function isStrataWorkspace(dir) {
  try {
    const manifest = fs.readFileSync(path.join(dir, 'Cargo.toml'), 'utf8')
    return manifest.includes('"bindings/node"') && fs.existsSync(path.join(pkgDir, 'Cargo.toml'))
  } catch {
    return false
  }
}

/** Copies `from` to `to` through a temporary file and a rename, so a process that has the
 * old file open or mapped (a loaded addon, a running helper) keeps its copy intact. */
function install(from, to, mode) {
  if (!fs.existsSync(from)) fail(`cargo finished but ${from} is missing`)
  fs.mkdirSync(path.dirname(to), { recursive: true })
  const tmp = `${to}.tmp-${process.pid}`
  fs.copyFileSync(from, tmp)
  fs.chmodSync(tmp, mode)
  fs.renameSync(tmp, to)
}

function main() {
  if (process.env.STRATA_NODE_SKIP_BUILD === '1') return
  const inWorkspace = isStrataWorkspace(workspace)
  // An installed package (from a registry or a tarball) uses its platform package as it is:
  // nothing is compiled at install time. A checkout builds from source, as its tests need.
  if (!inWorkspace && platformPackageDir()) return
  if (!inWorkspace) {
    if (fs.existsSync(addonPath) && fs.existsSync(helperPath) && fs.existsSync(supervisorPath)) return
    fail(
      `no prebuilt native part for ${triple}: the optional dependency ${platformPackage} is not installed ` +
        '(npm installs it when your platform is one strata-sandbox is built for: linux-x64-gnu), ' +
        `and there is no Strata workspace at ${workspace} to build one from source. ` +
        'To build from source: git clone the Strata repository and npm install ./bindings/node (needs Rust\'s cargo)',
    )
  }
  console.error(`strata-sandbox: building from source in the Strata checkout at ${workspace} (no prebuilt package is used here)`)
  const cargo = process.env.CARGO || 'cargo'
  const profile = process.env.STRATA_NODE_PROFILE || 'release'
  if (profile !== 'release' && profile !== 'dev') fail(`STRATA_NODE_PROFILE must be release or dev, not ${profile}`)
  const targetDir = process.env.CARGO_TARGET_DIR
    ? path.resolve(process.env.CARGO_TARGET_DIR)
    : path.join(workspace, 'target')
  const args = [
    'build', '--profile', profile, '-p', 'strata-node', '-p', 'strata', '-p', 'sandbox-live',
    '--lib', '--bin', 'strata-helper', '--bin', 'strata-live',
  ]
  console.error(`strata-sandbox: building the native addon, strata-helper and strata-live for ${triple}: ${cargo} ${args.join(' ')}`)
  const built = spawnSync(cargo, args, {
    cwd: workspace,
    stdio: 'inherit',
    env: { ...process.env, CARGO_TARGET_DIR: targetDir },
  })
  if (built.error && built.error.code === 'ENOENT') {
    fail(`${cargo} not found: building strata-sandbox needs Rust's cargo (https://rustup.rs)`)
  }
  if (built.error) fail(`cannot run ${cargo}: ${built.error.message}`)
  if (built.status !== 0) fail(`cargo build failed (exit ${built.status ?? built.signal})`)

  const out = path.join(targetDir, profile === 'dev' ? 'debug' : profile)
  const lib = {
    linux: 'libstrata_node.so',
    darwin: 'libstrata_node.dylib',
    win32: 'strata_node.dll',
  }[process.platform] ?? 'libstrata_node.so'
  install(path.join(out, lib), addonPath, 0o755)
  install(path.join(out, path.basename(helperPath)), helperPath, 0o755)
  install(path.join(out, path.basename(supervisorPath)), supervisorPath, 0o755)
  console.error(
    `strata-sandbox: installed ${path.relative(pkgDir, addonPath)}, ${path.relative(pkgDir, helperPath)} and ${path.relative(pkgDir, supervisorPath)}`,
  )
}

main()
