#!/usr/bin/env bash
# Installs what Strata's build, demo and tests need, idempotently (Debian/Ubuntu, as root
# or with sudo). Usage: scripts/deps.sh [demo|test]
set -euo pipefail
mode="${1:-test}"

demo_pkgs=(ca-certificates gcc python3)
test_pkgs=(bubblewrap hyperfine clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32
           busybox-static debootstrap docker.io runsc python3-venv nodejs npm util-linux iproute2
           uidmap python-is-python3 binutils)

pkgs=("${demo_pkgs[@]}")
if [ "$mode" = test ]; then pkgs+=("${test_pkgs[@]}"); fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node may come from another source than Debian's nodejs package; accept any node >= 18.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<< "${missing[*]:-}"
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${missing[*]}"
  echo "  apt-get update"
  $SUDO apt-get update -qq
  echo "  apt-get install (${#missing[@]} packages and their dependencies)"
  # One line per package as it is unpacked and set up, instead of silence.
  # (A process substitution, so a failing apt-get still fails this script.)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" \
    > >(grep --line-buffered -E '^(Unpacking|Setting up) ' || true)
else
  echo "all ${#pkgs[@]} packages present"
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs)" >&2; exit 1; }
