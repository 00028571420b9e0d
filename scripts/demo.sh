#!/usr/bin/env bash
# Builds Strata and runs its main job: model-written Python in a sandbox on the default
# backend, reading a granted file and refused a host secret, with the receipt printed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh demo
# The whole workspace, as scripts/test.sh builds it: the same features for every crate,
# so the test suite afterwards reuses these artifacts instead of compiling wasmtime again.
cargo build --release --workspace --bins --examples --quiet
target/release/examples/quickstart
echo
echo "The same from the CLI:"
echo "+ strata run --ro /etc/hostname -- cat /etc/hostname"
target/release/strata run --ro /etc/hostname -- cat /etc/hostname
echo "+ strata run -- cat /etc/shadow"
target/release/strata run -- cat /etc/shadow || echo "(exit $?: /etc/shadow does not exist inside the sandbox)"
