#!/usr/bin/env bash
# Benchmarks the wasm backend against the wasmtime CLI on the same module, in the same run,
# pinned to one core, and prints the ratios.
#
#   in-process (criterion, benches/wasm.rs): warm run, runs/s, cold run from the disk cache
#   CLIs (hyperfine): `wasmtime run` of the precompiled module, `wasmtime run` of the .wasm
#                     (wasmtime's own cache), and `strata run --backend wasm` of the .wasm
#
# Needs: hyperfine (scripts/deps.sh test), taskset, and the wasmtime CLI 48 from crates.io:
#   cargo install wasmtime-cli --version '^48' --root /work/tools
# Env: WASMTIME (default /work/tools/bin/wasmtime, else `wasmtime` on PATH), BENCH_CORE (1).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
core="${BENCH_CORE:-1}"
# The build scripts/test.sh makes (shared target dir, clippy as the workspace's compiler).
. scripts/cargo-env.sh
target="$CARGO_TARGET_DIR"
out="$target/bench-wasm"
mkdir -p "$out"

wasmtime="${WASMTIME:-/work/tools/bin/wasmtime}"
[ -x "$wasmtime" ] || wasmtime="$(command -v wasmtime || true)"
[ -n "$wasmtime" ] || { echo "wasmtime CLI not found: cargo install wasmtime-cli --version '^48' --root /work/tools" >&2; exit 1; }
command -v hyperfine >/dev/null || { echo "hyperfine not found (scripts/deps.sh test)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset not found (util-linux)" >&2; exit 1; }

# The module every contender runs: (module (memory (export "memory") 1) (func (export "_start")))
module="$out/trivial.wasm"
printf '\x00\x61\x73\x6d\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x03\x01\x00\x01\x07\x13\x02\x06\x6d\x65\x6d\x6f\x72\x79\x02\x00\x06\x5f\x73\x74\x61\x72\x74\x00\x00\x0a\x04\x01\x02\x00\x0b' > "$module"

echo "== building (release)"
cargo build --release --workspace --bins --quiet
"$wasmtime" --version
"$wasmtime" compile "$module" -o "$out/trivial.cwasm"

echo "== in-process: criterion (core $core)"
STRATA_BENCH_WASM="$module" taskset -c "$core" cargo bench --quiet --bench wasm -- --noplot 2>&1 \
  | grep -E "^wasm/|time:|thrpt:|skipped" || true

echo "== CLIs: hyperfine (core $core)"
# The strata CLI uses its default disk cache; one run first puts the module there.
"$target/release/strata" run --backend wasm -- "$module"
"$wasmtime" run "$module"
taskset -c "$core" hyperfine -N --warmup 30 --runs 300 --export-json "$out/cli.json" \
  "$wasmtime run --allow-precompiled $out/trivial.cwasm" \
  "$wasmtime run $module" \
  "$target/release/strata run --backend wasm -- $module" >/dev/null

python3 - "$target/criterion" "$out/cli.json" <<'EOF'
import json, os, sys
crit, cli = sys.argv[1], sys.argv[2]

def est(name):
    path = os.path.join(crit, "wasm", name, "new", "estimates.json")
    if not os.path.exists(path):
        return None
    e = json.load(open(path))
    return e["median"]["point_estimate"], e["mean"]["point_estimate"]

runs = json.load(open(cli))["results"]
pre, plain, strata_cli = runs[0], runs[1], runs[2]
warm = est("warm_run")
cold = est("cold_run_disk_cache")
rps = est("runs_per_second")
hello = est("warm_hello")
python = est("warm_python")

def us(ns): return f"{ns / 1000:9.1f} µs"
def sec_us(s): return f"{s * 1e6:9.1f} µs"

cli_median = pre["median"]
print()
print(f"{'measure':44} {'strata':>12} {'wasmtime CLI':>14} {'speedup':>9}")
if warm:
    print(f"{'warm run, p50 (in-process vs CLI .cwasm)':44} {us(warm[0]):>12} {sec_us(cli_median):>14} {cli_median * 1e9 / warm[0]:8.0f}x")
if cold:
    print(f"{'cold run, cached precompiled, p50':44} {us(cold[0]):>12} {sec_us(cli_median):>14} {cli_median * 1e9 / cold[0]:8.1f}x")
if rps:
    per_run_ns = rps[1] / 100
    ours = 1e9 / per_run_ns
    theirs = 1 / pre["mean"]
    print(f"{'runs per second, one core':44} {ours:12.0f} {theirs:14.0f} {ours / theirs:8.0f}x")
print(f"{'CLI process, p50 (strata run vs wasmtime run .cwasm)':44} {sec_us(strata_cli['median']):>12} {sec_us(cli_median):>14} {cli_median / strata_cli['median']:8.2f}x")
print(f"{'CLI process, p50 (strata run vs wasmtime run .wasm)':44} {sec_us(strata_cli['median']):>12} {sec_us(plain['median']):>14} {plain['median'] / strata_cli['median']:8.2f}x")
if hello:
    print(f"{'warm run writing stdout, p50':44} {us(hello[0]):>12}")
if python:
    print(f"{'warm python print(1), p50':44} {us(python[0]):>12}")
print()
print("targets: warm p50 <= 20 µs; >= 20000 runs/s on one core")
EOF
