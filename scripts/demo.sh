#!/usr/bin/env bash
# Builds Strata and runs its main job: model-written Python in a sandbox on the default
# backend (process), reading a granted file and refused a host secret, with the receipt
# printed.
#
# Builds only what the demo runs: the quickstart example, the `strata` CLI and
# `strata-helper`, with the process backend alone (no wasmtime, no Kubernetes client, no
# MCP server: the test suite builds those). On a fresh 2-core machine this takes a few
# minutes; cargo prints each crate as it compiles, and a line every 30 s says it is alive.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { printf '\n==> %s\n' "$*"; }

# The same target directory as the test suite (scripts/test.sh), when it can be made.
target="${STRATA_TARGET_DIR:-$HOME/.cache/strata/target}"
if mkdir -p "$target" 2>/dev/null && [ -w "$target" ]; then
  export CARGO_TARGET_DIR="$target"
else
  export CARGO_TARGET_DIR="$(pwd)/target"
fi

step "system packages (scripts/deps.sh demo): only what is missing is installed"
scripts/deps.sh demo

step "building strata, strata-helper and examples/quickstart.rs (release, process backend only; target: $CARGO_TARGET_DIR)"
cargo build --release -p strata -p sandbox-cli --no-default-features --features strata/process \
  --bin strata --bin strata-helper --example quickstart &
build=$!
while kill -0 "$build" 2>/dev/null; do
  for _ in $(seq 30); do
    kill -0 "$build" 2>/dev/null || break
    sleep 1
  done
  kill -0 "$build" 2>/dev/null && echo "    ... still building ($((SECONDS - started)) s so far)"
done
wait "$build"
bin="$CARGO_TARGET_DIR/release"

step "built in $((SECONDS - started)) s; running examples/quickstart.rs"
"$bin/examples/quickstart"
echo
echo "The same from the CLI:"
echo "+ strata run --ro /etc/hostname -- cat /etc/hostname"
"$bin/strata" run --ro /etc/hostname -- cat /etc/hostname
echo "+ strata run -- cat /etc/shadow"
"$bin/strata" run -- cat /etc/shadow || echo "(exit $?: /etc/shadow does not exist inside the sandbox)"
echo
echo "demo done in $((SECONDS - started)) s"
