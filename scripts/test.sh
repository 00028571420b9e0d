#!/usr/bin/env bash
# Runs Strata's whole test suite: Rust (cargo test), Python (pytest) and Node (node --test).
# Installs what it needs and starts the services its tests use (dockerd). Idempotent.
# Everything is built once, with the release profile, in the workspace's target/ dir.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
scripts/deps.sh test
export CARGO_TERM_COLOR=never

section() { printf '\n==== %s ====\n' "$*"; }

if [ -x scripts/start-dockerd.sh ]; then
  section "services"
  scripts/start-dockerd.sh
fi

section "rust: format and lints"
cargo fmt --all -- --check
# sandbox-kube's features (client, backend, fake) are on in this pass: the CLI depends on
# backend, and its tests on fake.
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

section "rust: build"
# The bins alone: the feature set the Python and Node bindings' builds are unified with
# (scripts/check-build-features.sh), so neither compiles wasmtime again. `cargo test` below
# adds the dev-dependencies' features (tokio's among them) and recompiles the crates those
# change; building the tests here instead would only move that work to the wheel build.
cargo build --release --workspace --bins --quiet

scripts/build-vm-guest.sh  # microVM guest: Debian cloud kernel + initramfs (and qemu-system-x86), cached under .ci/cache/vm
scripts/fetch-wasm-interpreters.sh  # WASI Python/JS interpreters (PyPI) for the wasm backend's tests
section "rust: tests"
cargo test --release --workspace 2>&1 | tee target/cargo-test.log
grep -E "^test result:" target/cargo-test.log | awk '{p+=$4; f+=$6; i+=$8} END {printf "cargo test total: %d passed, %d failed, %d ignored\n", p, f, i}'

if [ -f bindings/python/pyproject.toml ] && [ -x bindings/python/test.sh ]; then
  section "python: pytest"
  bindings/python/test.sh
fi

if [ -f bindings/node/package.json ] && [ -x bindings/node/test.sh ]; then
  section "node: node --test"
  bindings/node/test.sh
fi

section "done"
echo "all suites passed"
