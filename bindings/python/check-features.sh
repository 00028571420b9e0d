#!/usr/bin/env bash
# Checks that building only the Python module (`-p strata-python`, what maturin does)
# activates the same features on shared crates as the workspace build CI does first. A
# difference changes those crates' build hashes, so the wheel build would compile them (and
# everything above them, e.g. all of wasmtime) a second time. Prints the features to add
# to bindings/python/Cargo.toml (the "feature unification" block) and exits 1 if any.
set -euo pipefail
cd "$(dirname "$0")/../.."
tree() {
  cargo tree -e normal,build,features --prefix none "$@" 2>/dev/null \
    | sed 's/ (\*)//; s/ (command-line)//' | sort -u
}
ws="$(mktemp)"; py="$(mktemp)"
trap 'rm -f "$ws" "$py"' EXIT
tree --workspace | grep '"' > "$ws"
tree -p strata-python > "$py"
if ! grep -q '^strata-python ' "$py"; then
  echo "cannot resolve the dependency tree of strata-python"; exit 1
fi
# Feature lines the workspace has and this package lacks, for crates in this package's tree.
missing="$(comm -23 "$ws" <(grep '"' "$py") | while read -r crate rest; do
  if grep -q "^$crate v" "$py"; then echo "  $crate $rest"; fi
done)"
if [ -n "$missing" ]; then
  echo "strata-python resolves fewer features than the workspace on shared crates:"
  echo "$missing"
  exit 1
fi
echo "strata-python: shared crates have the workspace's features (nothing is built twice)"
