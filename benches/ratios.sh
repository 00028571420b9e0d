#!/usr/bin/env bash
# The default-configuration steady-state run against what each kind of user would reach for
# otherwise, in one run on one machine, as ratios (issue 11's table in the README):
#
#   Rust    cargo bench --bench process_compare   default Sandbox vs bwrap --unshare-all
#                                                 and a bare posix_spawn
#   CLI     benches/cli_vs_bwrap.sh               `strata run` (cold) vs bwrap, `strata
#                                                 --version` vs /bin/true, binary size
#   Python  bindings/python/bench/overhead.py     default Sandbox().run vs subprocess.run
#   Node    bindings/node/bench/overhead.mjs      default sandbox.run vs child_process.spawn
#   E2B     benches/e2b_tti.sh                    the official E2B SDK via `strata serve
#                                                 --e2b` vs Strata's Python API: create to
#                                                 first result, a command's round trip
#
# Needs the release build, the Python venv (bindings/python/test.sh makes it) and the Node
# addon (bindings/node/test.sh builds it). Env: RUNS (default 300 per series).
# Builds into the shared target dir (CARGO_TARGET_DIR, else $STRATA_TARGET_DIR, else
# ~/.cache/strata/target, as scripts/test.sh). Writes every tool's own output to
# target/ratios/*.txt and prints one summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
runs="${RUNS:-300}"
out="$root/target/ratios"
mkdir -p "$out"
# The build scripts/test.sh makes (shared target dir, clippy as the workspace's compiler),
# so this reuses its artifacts.
root="$(pwd)"
. scripts/cargo-env.sh
cargo build --release --workspace --bins --quiet
export STRATA_HELPER="$CARGO_TARGET_DIR/release/strata-helper"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
STRATA_BENCH_RUNS="$runs" STRATA_BENCH_LOAD="${LOAD:-2000}" \
  cargo bench --quiet --bench process_compare 2>/dev/null | tee "$out/rust.txt"
RUNS="$runs" benches/cli_vs_bwrap.sh | tee "$out/cli.txt"
py="$root/bindings/python/.venv/bin/python"
if [ -x "$py" ]; then
  "$py" bindings/python/bench/overhead.py --runs "$runs" --calls 20000 | tee "$out/python.txt"
else
  echo "python: no venv (run bindings/python/test.sh first)" | tee "$out/python.txt"
fi
if [ -d bindings/node/node_modules ]; then
  (cd bindings/node && node bench/overhead.mjs "$runs") | tee "$out/node.txt"
else
  echo "node: addon not built (run bindings/node/test.sh first)" | tee "$out/node.txt"
fi
if [ -x tests/e2b/.venv/bin/python ] && [ -x "$py" ]; then
  benches/e2b_tti.sh | tee "$out/e2b.txt"
else
  echo "e2b: no SDK venv (run tests/e2b/test.sh and bindings/python/test.sh first)" | tee "$out/e2b.txt"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" <<'PY'
import re, sys, pathlib
out = pathlib.Path(sys.argv[1])
text = {n: (out / f"{n}.txt").read_text() for n in ("rust", "cli", "python", "node", "e2b")}
def grab(name, pattern, group=1):
    m = re.search(pattern, text[name], re.M)
    return m.group(group) if m else "n/a"
rows = [
    ("Rust, default config, steady state vs bwrap --unshare-all",
     grab("rust", r"default config, steady state: ([\d.]+)x bwrap") + "x", "<= 0.33x"),
    ("Rust, default config, steady state vs posix_spawn",
     grab("rust", r"steady state vs posix_spawn: ([\d.]+)x") + "x", "-"),
    ("Rust, warm pool vs bwrap (bwrap / strata)",
     grab("rust", r"warm vs bwrap: strata is ([\d.]+)x faster") + "x faster", "-"),
    ("CLI, `strata run` cold vs bwrap --unshare-all",
     grab("cli", r"strata run / bwrap --unshare-all: ([\d.]+)x") + "x", "<= 1.0x"),
    ("CLI, `strata --version` vs /bin/true",
     grab("cli", r"strata --version / /bin/true: ([\d.]+)x") + "x", "<= 2x"),
    ("CLI, size of the `strata` binary",
     grab("cli", r"strata binary: ([\d.]+) MB") + " MB", "<= 60 MB"),
    ("Python, default Sandbox().run vs subprocess.run",
     grab("python", r"sandboxed run / subprocess.run\s+([\d.]+) x") + "x", "<= 2.5x"),
    ("Node, sandbox.run vs child_process.spawn",
     grab("node", r"ratio sandbox/spawn p50\s+([\d.]+)x") + "x", "-"),
    ("Node, per-call overhead beyond the run (p50)",
     grab("node", r"binding overhead/call\s+p50 ([\d.]+) us") + " us", "<= 30 us"),
    ("E2B SDK via strata serve vs Strata Python, create to first result",
     grab("e2b", r"create_to_first_result .* ratio\s+([\d.]+)x") + "x", "-"),
    ("E2B SDK via strata serve vs Strata Python, command round trip",
     grab("e2b", r"command_round_trip .* ratio\s+([\d.]+)x") + "x", "-"),
]
print("\n| comparison (same run) | result | target |")
print("|---|---|---|")
for name, value, target in rows:
    print(f"| {name} | {value} | {target} |")
PY
