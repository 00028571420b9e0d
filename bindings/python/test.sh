#!/usr/bin/env bash
# Builds and installs the Python package into a venv, then runs its checks: mypy.stubtest
# and pytest (API, bad input, concurrency, cancellation, logging, adapters, sessions, the
# Deep Agents backend and the Agents SDK sandbox client on sessions, example, and `strata
# mcp` against the official MCP client, which needs target/release/strata).
# Called by scripts/test.sh after the Rust suite; idempotent; works as root on a fresh clone.
#
# The wheel is built with the release profile in the workspace target dir, like the rest
# of CI, so the crates the Rust suite compiled are reused, not rebuilt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
# Debian's interpreter: the `python3` first on PATH may be a slow pyenv shim.
python="${STRATA_TEST_PYTHON:-/usr/bin/python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check \
  "maturin==1.16.0" "pytest==9.2.0" "pytest-asyncio==1.5.0" "mypy==2.4.1" \
  "langchain-core==1.8.3" "openai-agents==0.24.0" "mcp==2.3.0" "deepagents==0.7.32" \
  "langchain-tests==1.1.9"

# Not fatal: a mismatch only costs build time (see the script).
"$root/scripts/check-build-features.sh" -p strata-python || echo "warning: the wheel build will recompile crates CI already built"

echo "python: building and installing strata-sandbox (pip install ./bindings/python)"
# Without build isolation the pinned maturin above is used and nothing is downloaded.
(cd "$root" && PATH="$venv/bin:$PATH" "$py" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --force-reinstall --no-deps ./bindings/python)

cd "$here"
echo "python: mypy.stubtest strata"
"$py" -m mypy.stubtest strata --allowlist stubtest-allowlist.txt
echo "python: pytest"
"$py" -m pytest -v -p no:cacheprovider tests
