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
# Per crate (name and version): the feature sets it is built with (a crate can be built
# twice, for build scripts and for the target). Any difference between the workspace build
# and the selection can mean a rebuild: a set only the selection has is one for certain;
# a set only the workspace has may be the one the workspace's target build used (as when
# the CLI's rmcp turned on typenum's const-generics), which the selection then builds anew.
diff="$(python3 - "$ws" "$sel" <<'PY'
import collections, sys
def load(path):
    variants = collections.defaultdict(set)
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        name, _, rest = line.partition(" [")
        variants[name].add("[" + rest)
    return variants
ws, sel = load(sys.argv[1]), load(sys.argv[2])
for name in sorted(sel):
    if name.startswith(("strata", "sandbox-")) or name not in ws:
        continue
    if ws[name] != sel[name]:
        print(f"  {name}: workspace {sorted(ws[name])}, here {sorted(sel[name])}")
PY
)"
if [ -n "$diff" ]; then
  echo "building $* alone resolves these crates differently from the workspace build:"
  echo "$diff"
  echo "add the missing features to that package's feature-unification block"
  exit 1
fi
echo "$*: every shared crate has the workspace's features (nothing is built twice)"
