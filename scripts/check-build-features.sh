#!/usr/bin/env bash
# Checks that building only a binding (`-p strata-python`, what maturin does; `-p strata-node
# -p strata`, what the npm install script does) resolves every shared crate -- each version,
# for the target and for build scripts/proc-macros alike -- with exactly the features of the
# workspace build CI runs first. Features are part of each crate's build hash, so any
# difference makes the binding's build compile that crate and everything above it (all of
# wasmtime) a second time. Prints the differing lines and exits 1 if there are any.
#
# Usage: scripts/check-build-features.sh -p PACKAGE [-p PACKAGE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
resolved() {
  cargo tree -e normal,build --prefix none -f '{p} [{f}]' "$@" 2>/dev/null \
    | sed 's/ (\*)//; s/ (proc-macro)//' | sort -u
}
ws="$(mktemp)"; sel="$(mktemp)"
trap 'rm -f "$ws" "$sel"' EXIT
resolved --workspace > "$ws"
resolved "$@" > "$sel"
[ -s "$sel" ] || { echo "cannot resolve the dependency tree of: $*"; exit 1; }
# Lines only in the selection: a crate built with a feature set the workspace build lacks.
extra="$(comm -13 "$ws" "$sel")"
if [ -n "$extra" ]; then
  echo "building $* alone resolves these crates differently from the workspace build:"
  printf '  %s\n' "$extra" | sed 's/^  //; s/^/  /'
  echo "add the missing features to that package's feature-unification block"
  exit 1
fi
echo "$*: every shared crate has the workspace's features (nothing is built twice)"
