#!/usr/bin/env bash
# The Node package's test run (scripts/test.sh calls it after the Rust suite; it also works
# alone from a fresh clone):
#   1. `npm install` here: the install script builds the addon and strata-helper with cargo
#      in the workspace target dir (already built by the Rust suite, so nothing heavy is
#      compiled again), and npm installs the dev dependencies (typescript, ai, @types/*) from
#      the registry as pinned by package-lock.json;
#   2. `tsc --noEmit` over test/types.ts, test/vercel-types.ts and the examples against
#      index.d.ts and vercel.d.ts;
#   3. the package installed into another project, as an application does, and the example
#      run from there;
#   4. `node --test`, whose summary closes the output.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"
step() { printf '\n--- node: %s\n' "$*"; }

step "npm install (builds the native addon and strata-helper with cargo)"
# Not fatal: a mismatch only costs build time (see the script).
"$root/scripts/check-build-features.sh" -p strata-node -p strata \
  || echo "warning: the addon build will recompile crates CI already built"
npm install --no-audit --no-fund --foreground-scripts

step "tsc --noEmit (index.d.ts and vercel.d.ts against test/types.ts, test/vercel-types.ts and the examples)"
npx --no-install tsc -p tsconfig.json
echo "tsc: no errors"

step "install into an application, require it, run the example"
app="$(mktemp -d)"
trap 'rm -rf "$app"' EXIT
ai_version="$(node -p "require('./node_modules/ai/package.json').version")"
(
  cd "$app"
  npm init -y >/dev/null
  npm install --no-audit --no-fund --foreground-scripts "$here" "ai@$ai_version"
  node -e "const s = require('strata-sandbox'); new s.Sandbox(); console.log('require(\"strata-sandbox\") ok, version', s.version)"
  cp "$root/examples/node/agent.mjs" "$root/examples/node/two_agents.mjs" .
  node agent.mjs
  node two_agents.mjs | tee two_agents.out
  for expected in "to run under tier low" "a replay of it was refused" "the fix ran on process" \
    "approved run: would pip install here (grant 1)" "a second network run was refused" \
    "commit refused .git/hooks/post-checkout" "calc.py now: return a + b" "hook on the host: false" \
    'planner got: {"fixed":"add"}' "audit log intact:"; do
    grep -qF "$expected" two_agents.out || { echo "two_agents.mjs: missing: $expected" >&2; exit 1; }
  done
  cp "$root/examples/node/sessions.mjs" "$root/examples/node/vercel.mjs" .
  node sessions.mjs | tee sessions.out
  for expected in "call 1: rows 3" "call 2 reads call 1's file: 345" "call 3 timed out: true" \
    "streamed: streamed" "downloaded total: 345" "closed: true"; do
    grep -qF "$expected" sessions.out || { echo "sessions.mjs: missing: $expected" >&2; exit 1; }
  done
  node vercel.mjs | tee vercel.out
  for expected in "runCommand: 0 42" "detached stdout: started" "session.run: 0 42" \
    "readTextFile: 42" "missing file: null"; do
    grep -qF "$expected" vercel.out || { echo "vercel.mjs: missing: $expected" >&2; exit 1; }
  done
)

step "node --test"
node --test --test-reporter=spec test/
