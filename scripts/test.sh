#!/usr/bin/env bash
# Runs Strata's whole test suite: Rust (cargo test), Python (pytest), Node (node --test), the
# prebuilt packages installed without Rust (tests/dist) and the official E2B SDKs.
# Installs what it needs and starts the services its tests use (dockerd). Idempotent.
#
# Compilation is reused, never sources: cargo's target directory lives outside the clone
# ($STRATA_TARGET_DIR, default ~/.cache/strata/target), so a run after a developer's own
# build (or an earlier run, in another clone) recompiles only what changed: a new clone's
# files that match the last recorded build count as built (scripts/source-stamps.sh; the
# record is void once anything else builds into the target dir). Everything that
# is not compilation (apt packages, venvs, npm installs, the microVM guest, dockerd) is set
# up here every time, idempotently. Everything is built once, with the release profile and
# one feature set, shared by the tests, the Python wheel and the Node addon.
#
# Prints the time of each section and the total at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
started=$SECONDS

# The shared target dir and clippy as the workspace's compiler (scripts/cargo-env.sh).
# shellcheck source=scripts/cargo-env.sh
. "$root/scripts/cargo-env.sh"
# This clone's microVM guest, named at run time: a test binary reused from a build in
# another clone must not fall back to that clone's guest (compile-time paths).
export STRATA_VM_GUEST_DIR="${STRATA_VM_GUEST_DIR:-$root/.ci/cache/vm}"
mkdir -p "$root/target"

times=()
current=""
current_start=$SECONDS
end_section() {
  if [ -n "$current" ]; then
    times+=("$(printf '%-28s %5d s' "$current" $((SECONDS - current_start)))")
  fi
}
section() {
  end_section
  current="$*"
  current_start=$SECONDS
  printf '\n==== %s ====\n' "$*"
}
summary() {
  end_section
  current=""
  printf '\n==== times ====\n'
  printf '%s\n' "${times[@]}"
  printf '%-28s %5d s\n' "total" $((SECONDS - started))
}
finish() {
  local status=$? failed="${current:-setup}"
  # What was built here was built from the sources hashed at the start (if nothing was
  # edited meanwhile): the next clone reuses it, pass or fail.
  scripts/source-stamps.sh commit || true
  if [ $status -ne 0 ]; then
    summary
    echo "FAILED in section: $failed (exit $status)"
  fi
}
trap finish EXIT

section "setup: packages and services"
echo "cargo target dir: $CARGO_TARGET_DIR"
scripts/deps.sh test
scripts/source-stamps.sh restore  # files unchanged since the last recorded build count as built
scripts/source-stamps.sh record
if [ -x scripts/start-dockerd.sh ]; then
  scripts/start-dockerd.sh
fi

section "rust: format"
cargo fmt --all -- --check
# Tests find the repository at run time (cargo sets CARGO_MANIFEST_DIR when it runs them):
# a test binary reused from a build in another clone must not read that clone's files.
if git grep -n 'env!("CARGO_MANIFEST_DIR")' -- 'tests/*' '*/tests/*' 'benches/*' '*/benches/*'; then
  echo 'tests and benches must use std::env::var("CARGO_MANIFEST_DIR"), not env!' >&2
  exit 1
fi

section "rust: build (with clippy)"
# Everything once: the binaries (strata, strata-helper, strata-guest-agent, which the Python
# and Node suites use too), every test binary, the examples and the benches, with the one
# feature set the workspace manifests unify (tokio's test features are on for every build,
# so `cargo test` and the bindings' builds reuse these artifacts:
# scripts/check-build-features.sh). Clippy lints the workspace's crates while they compile
# (RUSTC_WORKSPACE_WRAPPER, set above), so no separate check pass compiles them again.
cargo test --release --workspace --all-targets --no-run --quiet
scripts/build-vm-guest.sh  # microVM guest: Debian cloud kernel + initramfs (and qemu-system-x86), cached under .ci/cache/vm
scripts/fetch-wasm-interpreters.sh  # WASI Python/JS interpreters (PyPI) for the wasm backend's tests

section "rust: cargo test"
cargo_status=0
cargo test --release --workspace --no-fail-fast 2>&1 | tee "$root/target/cargo-test.log" || cargo_status=$?
grep -E "^test result:" "$root/target/cargo-test.log" | awk '{p+=$4; f+=$6; i+=$8} END {printf "cargo test total: %d passed, %d failed, %d ignored\n", p, f, i}'
[ "$cargo_status" -eq 0 ] || exit "$cargo_status"

if [ -f bindings/python/pyproject.toml ] && [ -x bindings/python/test.sh ]; then
  section "python: pytest"
  bindings/python/test.sh
fi

if [ -f bindings/node/package.json ] && [ -x bindings/node/test.sh ]; then
  section "node: node --test"
  bindings/node/test.sh
fi

if [ -x tests/dist/test.sh ]; then
  section "dist: wheel and npm packages"
  tests/dist/test.sh
fi

if [ -x tests/e2b/test.sh ]; then
  section "e2b: official SDKs"
  tests/e2b/test.sh
fi

summary
echo "all suites passed"
