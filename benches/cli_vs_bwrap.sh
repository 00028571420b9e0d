#!/usr/bin/env bash
# How the `strata` CLI starts (issue 26), in one hyperfine run on one machine:
#   - a cold `strata run -- /bin/true` vs `bwrap --unshare-all` doing the same (target <= 1.0x),
#   - `strata --version` vs `/bin/true` (target <= 2x),
#   - the size of the binary `strata run` executes (target <= 60 MB).
# Usage: benches/cli_vs_bwrap.sh   (builds the release binaries first; RUNS, default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { echo "hyperfine missing: apt install hyperfine" >&2; exit 1; }
command -v bwrap >/dev/null || { echo "bwrap missing: apt install bubblewrap" >&2; exit 1; }
# The build scripts/test.sh makes (shared target dir, clippy as the workspace's compiler),
# so this reuses its artifacts.
root="$(pwd)"
. scripts/cargo-env.sh
cargo build --release --workspace --bins --quiet
strata="$CARGO_TARGET_DIR/release/strata"
out="$CARGO_TARGET_DIR/cli_vs_bwrap.json"
links=()
for l in bin sbin lib lib64; do
  if t=$(readlink "/$l"); then links+=(--symlink "$t" "/$l"); fi
done
bwrap_cmd="bwrap --unshare-all --die-with-parent --ro-bind /usr /usr ${links[*]} --proc /proc --dev /dev --tmpfs /tmp /bin/true"
hyperfine -N --warmup 20 --runs "${RUNS:-300}" --export-json "$out" \
  "$strata run --backend process -- /bin/true" \
  "$bwrap_cmd" \
  "$strata --version" \
  "/bin/true"
python3 - "$out" "$strata" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))["results"]
run, bwrap, version, bare = (x["median"] * 1000 for x in r)
size = os.path.getsize(sys.argv[2]) / 1e6
print(f"median: strata run {run:.2f} ms, bwrap {bwrap:.2f} ms, strata --version {version:.2f} ms, /bin/true {bare:.2f} ms")
print(f"strata run / bwrap --unshare-all: {run / bwrap:.2f}x (target <= 1.0x)")
print(f"strata --version / /bin/true: {version / bare:.2f}x (target <= 2x)")
print(f"strata binary: {size:.1f} MB (target <= 60 MB)")
PY
