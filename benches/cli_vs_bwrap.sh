#!/usr/bin/env bash
# Cold run of /bin/true through the `strata` CLI vs `bwrap --unshare-all` doing the same,
# in the same hyperfine run (issue: foundation). Prints hyperfine's table and the ratio.
# Usage: benches/cli_vs_bwrap.sh   (builds the release binaries first)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { echo "hyperfine missing: apt install hyperfine" >&2; exit 1; }
command -v bwrap >/dev/null || { echo "bwrap missing: apt install bubblewrap" >&2; exit 1; }
cargo build --release --bins --quiet
links=()
for l in bin sbin lib lib64; do
  if t=$(readlink "/$l"); then links+=(--symlink "$t" "/$l"); fi
done
bwrap_cmd="bwrap --unshare-all --die-with-parent --ro-bind /usr /usr ${links[*]} --proc /proc --dev /dev --tmpfs /tmp /bin/true"
hyperfine -N --warmup 20 --runs "${RUNS:-300}" --export-json target/cli_vs_bwrap.json \
  "target/release/strata run --backend process -- /bin/true" \
  "$bwrap_cmd" \
  "/bin/true"
python3 - <<'PY'
import json
r = json.load(open("target/cli_vs_bwrap.json"))["results"]
strata, bwrap, bare = (x["median"] * 1000 for x in r)
print(f"median: strata CLI {strata:.2f} ms, bwrap {bwrap:.2f} ms, bare /bin/true {bare:.2f} ms")
print(f"strata CLI is {bwrap / strata:.2f}x faster than bwrap --unshare-all (target >= 4x)")
PY
