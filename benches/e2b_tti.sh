#!/usr/bin/env bash
# Time to interactive (Sandbox.create() to the first command's result) and a command's
# round trip: the official E2B SDK against `strata serve --e2b` vs Strata's own Python API,
# in one run on one machine, as ratios. Third parties publish the same measure for hosted
# peers (medians: Daytona 0.11 s, E2B 0.44 s, Modal 2.66 s).
#
# Needs the release build and the venvs tests/e2b/test.sh and bindings/python/test.sh make.
# Env: RUNS (default 20 creates), CALLS (default 50 round trips).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
. scripts/cargo-env.sh
strata="$CARGO_TARGET_DIR/release/strata"
e2b_py="$root/tests/e2b/.venv/bin/python"
strata_py="$root/bindings/python/.venv/bin/python"
for need in "$strata" "$e2b_py" "$strata_py"; do
  [ -x "$need" ] || { echo "missing $need (run .ci/run, or the suites' test.sh, first)" >&2; exit 1; }
done
key="bench-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
out="$(mktemp)"
"$strata" serve --e2b 127.0.0.1:0 --api-key "$key" > "$out" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 50); do [ -s "$out" ] && break; sleep 0.1; done
url="$(head -n1 "$out")"
e2b_json="$(E2B_API_URL="$url" E2B_SANDBOX_URL="$url" E2B_API_KEY="$key" \
  "$e2b_py" benches/e2b_tti.py e2b --runs "${RUNS:-20}" --calls "${CALLS:-50}")"
strata_json="$("$strata_py" benches/e2b_tti.py strata --runs "${RUNS:-20}" --calls "${CALLS:-50}")"
echo "$e2b_json"
echo "$strata_json"
"$strata_py" - "$e2b_json" "$strata_json" <<'PY'
import json, sys
e2b, own = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in ("create_to_first_result", "command_round_trip"):
    a, b = e2b[name]["median_ms"], own[name]["median_ms"]
    print(f"{name:24} E2B SDK via strata serve {a:8.2f} ms   strata Python {b:8.2f} ms   ratio {a / b:5.2f}x")
PY
