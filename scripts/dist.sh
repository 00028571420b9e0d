#!/usr/bin/env bash
# Builds Strata's installable packages into dist/, from a fresh clone, with only crates.io,
# PyPI, npm and Debian packages; idempotent. What it writes:
#
#   strata_sandbox-V-cp39-abi3-manylinux_2_28_$arch.whl   one wheel for every CPython >= 3.9:
#       the native module plus bin strata-helper (process backend) and strata-live (live
#       sandboxes' supervisor), all stripped
#   strata_sandbox-V.tar.gz                                the sdist (builds from source)
#   strata-sandbox-V.tgz                                   npm main package (JS, .d.ts)
#   strata-sandbox-linux-CPU-gnu-V.tgz                     npm platform package: the addon,
#       strata-helper and strata-live, stripped
#   strata-V-debuginfo-ARCH-linux-gnu.tar.gz              the debuginfo of every shipped ELF
#       (objcopy --only-keep-debug copies plus rustc's .dwp files; each stripped binary
#       names its copy with a .gnu_debuglink)
#
# The binaries (x86_64 or aarch64, as the host) link against glibc 2.28's symbols at most
# (manylinux_2_28: RHEL 8, Debian 10, Ubuntu 18.10 and later) whatever the build host has:
# zig (PyPI's `ziglang`) links them through maturin's --zig, and the script checks every
# ELF's symbol versions and libraries before it writes anything. The microVM guest (a Debian
# kernel and root image, scripts/build-vm-guest.sh) and the wasm backend's interpreters
# (scripts/fetch-wasm-interpreters.sh) are not bundled: the first is ~90 MB and
# host-specific, the second is fetched where it is used.
#
# One compilation, reused: maturin builds the Python module first, and the script records
# the environment maturin gives cargo (zig's compiler and linker wrappers). The addon and the
# binaries are then built by plain cargo with that same environment, so the crates both
# builds share compile once: the linker's path is part of every crate's build hash, and a
# second zig driver (cargo-zigbuild) would have its own wrappers and rebuild them all. The
# tools live outside the clone (~/.cache/strata/dist-venv) so their paths, and so the
# hashes, are the same in every clone. Compilation goes to $STRATA_DIST_TARGET_DIR (default
# ~/.cache/strata/target-dist), which the test build never uses: neither invalidates the
# other.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
started=$SECONDS
step() { printf '\n--- dist: %s (%d s)\n' "$*" $((SECONDS - started)); }

glibc_max="2.28"
arch="$(uname -m)"
case "$arch" in
  x86_64) node_cpu=x64 ;;
  aarch64) node_cpu=arm64 ;;
  *) echo "dist: no package layout for $arch (x86_64 and aarch64 Linux are built)" >&2; exit 1 ;;
esac
rust_target="$arch-unknown-linux-gnu"
platform="linux-$node_cpu-gnu"
# The platform packages the main npm package names as optional dependencies: this host's,
# or (the release workflow, which builds each on its own runner) every one released.
platforms="${STRATA_DIST_PLATFORMS:-$platform}"
maturin_version="1.16.0"
out="$root/dist"

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || { echo "dist: no [workspace.package] version in Cargo.toml" >&2; exit 1; }

step "tools: maturin $maturin_version, ziglang, auditwheel, wheel (PyPI)"
for tool in objcopy readelf npm /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "dist: $tool is missing (scripts/deps.sh installs it)" >&2; exit 1; }
done
venv="${STRATA_DIST_VENV:-$HOME/.cache/strata/dist-venv}"
if ! { [ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" 2>/dev/null && /usr/bin/python3 -m venv "$venv"; }; }; then
  venv="$root/.ci/cache/dist-venv"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  "maturin==$maturin_version" "ziglang==0.13.0" "auditwheel==6.8.2" "wheel==0.45.1"
export PATH="$venv/bin:$PATH"

target="${STRATA_DIST_TARGET_DIR:-$HOME/.cache/strata/target-dist}"
if ! mkdir -p "$target" 2>/dev/null || [ ! -w "$target" ]; then
  target="$root/target/dist"
  mkdir -p "$target"
fi
export CARGO_TARGET_DIR="$target"
# Not the test build's clippy wrapper: this build has its own target dir, and lints ran there.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
built="$target/$rust_target/dist"
stage="$target/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/debug"

step "python module: maturin build --zig (abi3, manylinux_${glibc_max/./_})"
# maturin runs cargo from PATH: a shim first on it records the environment of the build
# (`cargo rustc`) and hands over to the real cargo.
real_cargo="$(command -v cargo)"
shim="$target/cargo-shim"
rm -rf "$shim"
mkdir -p "$shim"
cat >"$shim/cargo" <<SHIM
#!/bin/sh
if [ "\$1" = rustc ]; then env -0 >"$shim/rustc.env"; fi
exec "$real_cargo" "\$@"
SHIM
chmod 0700 "$shim/cargo"
wheels="$target/wheels"
rm -rf "$wheels"
(cd bindings/python && PATH="$shim:$PATH" maturin build --profile dist --zig --target "$rust_target" \
  --compatibility "manylinux_${glibc_max/./_}" --interpreter /usr/bin/python3 --out "$wheels")
[ -s "$shim/rustc.env" ] || { echo "dist: maturin ran no \`cargo rustc\` through $shim (how it calls cargo changed)" >&2; exit 1; }
built_wheel="$(ls "$wheels"/strata_sandbox-"$version"-cp39-abi3-manylinux_2_28_$arch*.whl)"

step "cargo build --profile dist with maturin's zig: Node addon, strata-helper, strata-live"
# What maturin set for its build (zig's CC/CXX/AR/RANLIB wrappers, the target's linker, the
# cmake toolchain, PyO3's settings), applied to this one: every other variable as it is here.
zig_env=()
while IFS= read -r -d '' assignment; do zig_env+=("$assignment"); done < <(
  python3 - "$shim/rustc.env" <<'PY'
import os, sys
skip = {"PATH", "PWD", "OLDPWD", "SHLVL", "_"}
with open(sys.argv[1], "rb") as f:
    for item in f.read().split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode()
        if not sep or name in skip or os.environb.get(key) == value:
            continue
        sys.stdout.buffer.write(item + b"\0")
PY
)
linker_var="CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$rust_target")_LINKER"
printf '%s\n' "${zig_env[@]}" | grep -q "^$linker_var=" \
  || { echo "dist: maturin set no $linker_var (its environment is in $shim/rustc.env)" >&2; exit 1; }
env "${zig_env[@]}" cargo build --profile dist --target "$rust_target" \
  -p strata-node -p strata -p sandbox-live --lib --bin strata-helper --bin strata-live

# Strips `from` into `to`; its debuginfo goes to debug/NAME.debug (plus rustc's .dwp), NAME
# being the third argument or the name of `to`.
strip_into() {
  local from="$1" to="$2" name="${3:-$(basename "$2")}"
  objcopy --only-keep-debug "$from" "$stage/debug/$name.debug"
  objcopy --strip-all --add-gnu-debuglink="$stage/debug/$name.debug" "$from" "$to"
  chmod 0755 "$to"
  if [ -f "$from.dwp" ]; then cp "$from.dwp" "$stage/debug/$name.dwp"; fi
}
strip_into "$built/strata-helper" "$stage/bin/strata-helper"
strip_into "$built/strata-live" "$stage/bin/strata-live"
strip_into "$built/libstrata_node.so" "$stage/strata.$platform.node"

# Every ELF we ship: symbol versions at most GLIBC_$glibc_max, and only the libraries
# manylinux allows (the C runtime, no libstdc++ or anything else of the build host's).
check_elf() {
  local file="$1" newest libs bad
  newest="$(readelf --dyn-syms -W "$file" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)"
  if [ -n "$newest" ] && [ "$(printf '%s\n%s\n' "$newest" "$glibc_max" | sort -V | tail -1)" != "$glibc_max" ]; then
    echo "dist: $file needs GLIBC_$newest, above manylinux_${glibc_max/./_}:" >&2
    readelf --dyn-syms -W "$file" | grep -E "GLIBC_$newest( |$)" | awk '{print "  " $8}' >&2
    exit 1
  fi
  libs="$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  bad="$(printf '%s\n' $libs | grep -Ev '^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64|ld-linux-aarch64)\.so\.[0-9]+$' || true)"
  if [ -n "$bad" ]; then
    echo "dist: $file links libraries outside manylinux's set: $bad" >&2
    exit 1
  fi
  printf '  %-34s GLIBC <= %-5s needs: %s\n' "$(basename "$file")" "${newest:-none}" "$libs"
}

step "python wheel: the module stripped, strata-helper and strata-live in strata/_bin"
# maturin strips nothing here (the module's debuginfo is kept apart like the binaries'), and
# its wheel holds whatever a developer's source build left in python/strata/_bin: unpack,
# put this build's binaries there, strip the module, pack again (`wheel pack` writes the
# RECORD anew).
python -m wheel unpack --dest "$wheels/unpacked" "$built_wheel" >/dev/null
unpacked="$wheels/unpacked/strata_sandbox-$version"
rm -rf "$unpacked/strata/_bin"
mkdir -p "$unpacked/strata/_bin"
cp "$stage/bin/strata-helper" "$stage/bin/strata-live" "$unpacked/strata/_bin/"
module="$unpacked/strata/_strata.abi3.so"
[ -f "$module" ] || { echo "dist: the wheel has no strata/_strata.abi3.so" >&2; exit 1; }
strip_into "$module" "$module.stripped" "_strata.abi3.so"
mv "$module.stripped" "$module"
chmod 0755 "$module"

step "glibc symbol versions (at most $glibc_max) and libraries"
for elf in "$stage/bin/strata-helper" "$stage/bin/strata-live" "$stage/strata.$platform.node" "$module"; do
  check_elf "$elf"
done
mkdir -p "$out"
rm -f "$out"/strata_sandbox-*.whl "$out"/strata_sandbox-*.tar.gz "$out"/strata-sandbox-*.tgz "$out"/strata-*-debuginfo-*.tar.gz
python -m wheel pack --dest-dir "$out" "$unpacked" >/dev/null
wheel_file="$(ls "$out"/strata_sandbox-"$version"-cp39-abi3-manylinux_2_28_$arch*.whl)"
echo "auditwheel show:"
auditwheel show "$wheel_file" | sed 's/^/  /'
auditwheel show "$wheel_file" | tr '\n' ' ' | grep -q "consistent with the following platform tag: \"manylinux_2_28_$arch\"" \
  || { echo "dist: auditwheel does not find the wheel consistent with manylinux_2_28_$arch" >&2; exit 1; }

step "python sdist: maturin sdist"
(cd bindings/python && maturin sdist --out "$out" >/dev/null)

step "npm packages: strata-sandbox and strata-sandbox-$platform (napi-rs layout)"
node_src="$root/bindings/node"
npm_stage="$target/npm"
rm -rf "$npm_stage"
main_dir="$npm_stage/strata-sandbox"
plat_dir="$npm_stage/strata-sandbox-$platform"
mkdir -p "$main_dir/scripts" "$plat_dir/bin"
# The main package: what package.json's `files` names, never a locally built addon.
cp "$node_src"/{index.js,index.d.ts,adapters.js,vercel.js,vercel.d.ts,platform.js,README.md} "$main_dir/"
cp "$node_src/scripts/build.js" "$main_dir/scripts/"
cp "$stage/strata.$platform.node" "$plat_dir/"
cp "$stage/bin/strata-helper" "$stage/bin/strata-live" "$plat_dir/bin/"
node - "$node_src/package.json" "$main_dir" "$plat_dir" "$platform" "$node_cpu" "$platforms" <<'JS'
const fs = require('node:fs')
const path = require('node:path')
const [source, mainDir, platDir, platform, cpu, platforms] = process.argv.slice(2)
const pkg = JSON.parse(fs.readFileSync(source, 'utf8'))
const platName = `${pkg.name}-${platform}`
// As napi-rs's prepublish: the main package names each platform package as an optional
// dependency, so npm installs only the one whose os/cpu/libc match the host.
const optional = Object.fromEntries(platforms.split(/\s+/).filter(Boolean).map((p) => [`${pkg.name}-${p}`, pkg.version]))
const main = { ...pkg, optionalDependencies: optional }
delete main.devDependencies
main.scripts = { install: pkg.scripts.install }
fs.writeFileSync(path.join(mainDir, 'package.json'), JSON.stringify(main, null, 2) + '\n')
const plat = {
  name: platName,
  version: pkg.version,
  description: `The prebuilt native part of ${pkg.name} for ${platform}: the Node-API addon, strata-helper and strata-live.`,
  license: pkg.license,
  repository: pkg.repository,
  os: ['linux'],
  cpu: [cpu],
  libc: ['glibc'],
  main: `strata.${platform}.node`,
  files: [`strata.${platform}.node`, 'bin/'],
  engines: pkg.engines,
}
fs.writeFileSync(path.join(platDir, 'package.json'), JSON.stringify(plat, null, 2) + '\n')
fs.writeFileSync(
  path.join(platDir, 'README.md'),
  `# ${platName}\n\nThe prebuilt native part of [\`${pkg.name}\`](https://www.npmjs.com/package/${pkg.name}) for ` +
    `${platform} (glibc 2.28 or later). Install \`${pkg.name}\`, not this package: npm picks it for you.\n`,
)
JS
(cd "$main_dir" && npm pack --silent --pack-destination "$out" >/dev/null)
(cd "$plat_dir" && npm pack --silent --pack-destination "$out" >/dev/null)

step "debuginfo archive"
tar -C "$stage/debug" -czf "$out/strata-$version-debuginfo-$arch-linux-gnu.tar.gz" .

step "sizes"
(cd "$out" && for f in strata_sandbox-"$version"*.whl strata_sandbox-"$version".tar.gz strata-sandbox-*"$version".tgz strata-"$version"-debuginfo-*.tar.gz; do
  printf '  %-62s %6.1f MiB\n' "$f" "$(stat -c %s "$f" | awk '{print $1 / 1048576}')"
done)
for f in "$stage/bin/strata-helper" "$stage/bin/strata-live" "$stage/strata.$platform.node" "$module"; do
  printf '  %-62s %6.1f MiB (stripped)\n' "$(basename "$f")" "$(stat -c %s "$f" | awk '{print $1 / 1048576}')"
done
echo "dist: wrote $out in $((SECONDS - started)) s"
