#!/usr/bin/env bash
# Drives `strata serve --e2b` with the official E2B Python SDK (pinned) in a venv:
# sandboxes, commands, files, PTY, lifecycle and the server's security checks; then the
# official JS SDK (pinned in node/package.json) with node --test.
# Called by scripts/test.sh after the Rust suite (which built target/release/strata).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
python="${STRATA_TEST_PYTHON:-/usr/bin/python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "e2b==2.63.0" "pytest==9.2.0"
cd "$here"
"$venv/bin/python" -m pytest -v -p no:cacheprovider .

cd "$here/node"
npm install --silent --no-audit --no-fund
node --test sdk.test.mjs
