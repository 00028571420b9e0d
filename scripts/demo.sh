#!/usr/bin/env bash
# Builds Strata and runs its main job: model-written Python in a sandbox on the default
# backend, reading a granted file and refused a host secret, with the receipt printed.
# On a fresh machine the build takes minutes: every step says what it does, and cargo
# shows each crate as it compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { printf '\n==> %s\n' "$*"; }

step "system packages (scripts/deps.sh demo): only what is missing is installed"
scripts/deps.sh demo
# The whole workspace, as scripts/test.sh builds it: the same features for every crate,
# so the test suite afterwards reuses these artifacts instead of compiling wasmtime again.
step "building strata, strata-helper and the examples (cargo build --release; a first build compiles ~400 crates, wasmtime among them: several minutes on 2 cores)"
cargo build --release --workspace --bins --examples
step "built in $((SECONDS - started)) s; running examples/quickstart.rs"
target/release/examples/quickstart
echo
echo "The same from the CLI:"
echo "+ strata run --ro /etc/hostname -- cat /etc/hostname"
target/release/strata run --ro /etc/hostname -- cat /etc/hostname
echo "+ strata run -- cat /etc/shadow"
target/release/strata run -- cat /etc/shadow || echo "(exit $?: /etc/shadow does not exist inside the sandbox)"
