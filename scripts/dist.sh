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
# The binaries (x86_64 or aarch64, as the host) link against glibc 2.28's symbols at most (manylinux_2_28: RHEL 8, Debian
# 10, Ubuntu 18.10 and later) whatever the build host has: they are linked by zig (PyPI's
# `ziglang`) through cargo-zigbuild and maturin's --zig, and the script checks every ELF's
# symbol versions and libraries before it writes anything. The microVM guest (a Debian
# kernel and root image, scripts/build-vm-guest.sh) and the wasm backend's interpreters
# (scripts/fetch-wasm-interpreters.sh) are not bundled: the first is ~90 MB and
# host-specific, the second is fetched where it is used.
#
# Compilation goes to $STRATA_DIST_TARGET_DIR (default ~/.cache/strata/target-dist): a
# target (ARCH-unknown-linux-gnu with zig as the linker) the test build never uses, so
# neither invalidates the other. cargo-zigbuild is pinned to the version maturin embeds (the
# same zig handling for the binaries and the module). Their linker wrappers differ in path,
# which is part of every crate's build hash, so the two builds share no artifacts: each is
# compiled once per machine and then reused (only the workspace crates rebuild per clone).
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
zigbuild_version="0.24.0" # the cargo-zigbuild maturin $maturin_version is built on
out="$root/dist"

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[ -n "$version" ] || { echo "dist: no [workspace.package] version in Cargo.toml" >&2; exit 1; }

step "tools: maturin $maturin_version, ziglang, auditwheel, wheel (PyPI); cargo-zigbuild $zigbuild_version (crates.io)"
for tool in objcopy readelf npm /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "dist: $tool is missing (scripts/deps.sh installs it)" >&2; exit 1; }
done
venv="$root/.ci/cache/dist-venv"
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  "maturin==$maturin_version" "ziglang==0.13.0" "auditwheel==6.8.2" "wheel==0.45.1"
tools="$HOME/.cache/strata/tools"
if [ "$("$tools/bin/cargo-zigbuild" --version 2>/dev/null)" != "cargo-zigbuild $zigbuild_version" ]; then
  cargo install --quiet --locked --force --root "$tools" "cargo-zigbuild@$zigbuild_version"
fi
export PATH="$tools/bin:$venv/bin:$PATH"

target="${STRATA_DIST_TARGET_DIR:-$HOME/.cache/strata/target-dist}"
if ! mkdir -p "$target" 2>/dev/null || [ ! -w "$target" ]; then
  target="$root/target/dist"
  mkdir -p "$target"
fi
export CARGO_TARGET_DIR="$target"
# Not the test build's clippy wrapper: this build has its own target dir, and lints ran there.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
built="$target/$rust_target/dist"

step "cargo zigbuild --profile dist: Node addon, strata-helper, strata-live (glibc $glibc_max)"
cargo zigbuild --profile dist --target "$rust_target.$glibc_max" \
  -p strata-node -p strata -p sandbox-live --lib --bin strata-helper --bin strata-live

stage="$target/stage"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/debug"
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
  bad="$(printf '%s\n' $libs | grep -Ev '^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64)\.so\.[0-9]+$' || true)"
  if [ -n "$bad" ]; then
    echo "dist: $file links libraries outside manylinux's set: $bad" >&2
    exit 1
  fi
  printf '  %-34s GLIBC <= %-5s needs: %s\n' "$(basename "$file")" "${newest:-none}" "$libs"
}
step "glibc symbol versions (at most $glibc_max) and libraries"
for elf in "$stage/bin/strata-helper" "$stage/bin/strata-live" "$stage/strata.$platform.node"; do
  check_elf "$elf"
done

step "python wheel: maturin build --zig (abi3, manylinux_${glibc_max/./_})"
pkg_bin="$root/bindings/python/python/strata/_bin"
saved="$target/saved-python-bin"
rm -rf "$saved"
# The wheel takes its binaries from the package dir; a developer's own (source-built) copies
# there are put back afterwards.
if [ -d "$pkg_bin" ]; then mv "$pkg_bin" "$saved"; fi
restore_bin() {
  rm -rf "$pkg_bin"
  if [ -d "$saved" ]; then mv "$saved" "$pkg_bin"; fi
}
trap restore_bin EXIT
mkdir -p "$pkg_bin"
cp "$stage/bin/strata-helper" "$stage/bin/strata-live" "$pkg_bin/"
wheels="$target/wheels"
rm -rf "$wheels"
(cd bindings/python && maturin build --profile dist --zig --target "$rust_target" \
  --compatibility "manylinux_${glibc_max/./_}" --interpreter /usr/bin/python3 --out "$wheels")
restore_bin
trap - EXIT
built_wheel="$(ls "$wheels"/strata_sandbox-"$version"-cp39-abi3-manylinux_2_28_$arch*.whl)"

# maturin strips nothing here (the module's debuginfo is kept apart like the binaries'):
# unpack, strip the module, pack again (`wheel pack` writes the RECORD anew).
rm -rf "$wheels/unpacked"
python -m wheel unpack --dest "$wheels/unpacked" "$built_wheel" >/dev/null
module="$(ls "$wheels"/unpacked/strata_sandbox-"$version"/strata/_strata.abi3.so)"
strip_into "$module" "$module.stripped" "_strata.abi3.so"
mv "$module.stripped" "$module"
chmod 0755 "$module"
check_elf "$module"
mkdir -p "$out"
rm -f "$out"/strata_sandbox-*.whl "$out"/strata_sandbox-*.tar.gz "$out"/strata-sandbox-*.tgz "$out"/strata-*-debuginfo-*.tar.gz
python -m wheel pack --dest-dir "$out" "$wheels/unpacked/strata_sandbox-$version" >/dev/null
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
