#!/usr/bin/env bash
# Builds the container backend's test images from Debian packages (never from a registry),
# idempotently, under .ci/cache/images/ (gitignored; STRATA_TEST_IMAGES overrides):
#
#   busybox-rootfs/        root file system directory: busybox-static, /etc/passwd
#   busybox-oci/           the same as a one-layer OCI image layout
#   busybox.docker.tar     the same in `docker save` format        (strata-test/busybox:1)
#   python-rootfs/         Debian bookworm's python3.11-minimal and bash (+ busybox for /bin/sh)
#   python-oci/            the same as a three-layer OCI layout: base, python, and a layer
#                          whose whiteout deletes /usr/share/doc
#   python.docker.tar      the same in `docker save` format        (strata-test/python:1)
#
# With --docker, also loads both archives into the running Docker engine (`docker load`).
# A stamp file records the inputs; a warm run only checks it. Uses apt-get download +
# dpkg-deb -x (seconds) rather than debootstrap (minutes). Serialized with flock, so
# concurrent test binaries can call it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="${STRATA_TEST_IMAGES:-$root/.ci/cache/images}"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

load_docker=false
[ "${1:-}" = "--docker" ] && load_docker=true

version=4 # bump when the recipe changes
base_pkgs=(libc6 libgcc-s1 busybox-static)
py_pkgs=(libssl3 zlib1g libexpat1 libpython3.11-minimal python3.11-minimal python3-minimal libtinfo6 bash)
stamp="$out/stamp"
want="v$version ${base_pkgs[*]} ${py_pkgs[*]}"

build() {
  local t0=$SECONDS
  local debs="$out/debs"
  mkdir -p "$debs"
  (
    cd "$debs"
    # shellcheck disable=SC2086
    if ! apt-get download -qq "${base_pkgs[@]}" "${py_pkgs[@]}" 2>/dev/null; then
      apt-get update -qq
      apt-get download -qq "${base_pkgs[@]}" "${py_pkgs[@]}"
    fi
  )
  work=""
  work="$(mktemp -d "$out/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  # Layer 1: the base (libc, busybox as /bin/sh and coreutils, users).
  local base="$work/base"
  mkdir -p "$base"
  for p in "${base_pkgs[@]}"; do dpkg-deb -x "$debs/${p}"_*.deb "$base"; done
  mkdir -p "$base/bin" "$base/usr/bin" "$base/etc" "$base/tmp" "$base/proc" "$base/dev" \
           "$base/root" "$base/home/app" "$base/sys"
  chmod 1777 "$base/tmp"
  for applet in $("$base/bin/busybox" --list); do
    case "$applet" in busybox) continue ;; esac
    [ -e "$base/bin/$applet" ] || [ -L "$base/bin/$applet" ] || ln -s busybox "$base/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$base/etc/passwd"
  printf 'root:x:0:\napp:x:1000:\nnogroup:x:65534:\n' > "$base/etc/group"
  echo "strata-test" > "$base/etc/hostname"
  rm -rf "$base/usr/share/man" "$base/usr/share/lintian"

  # Layer 2: python3 (Debian's python3.11-minimal, with compiled bytecode).
  local py="$work/python"
  mkdir -p "$py"
  for p in "${py_pkgs[@]}"; do dpkg-deb -x "$debs/${p}"_*.deb "$py"; done
  rm -rf "$py/usr/share/man" "$py/usr/share/lintian"
  # Bytecode, so runs do not recompile the standard library into their scratch layer.
  # Compiled by the image's own interpreter, in a throwaway merged tree.
  local merged="$work/merged"
  mkdir -p "$merged"
  cp -a "$base/." "$merged/"
  cp -a "$py/." "$merged/"
  if command -v unshare >/dev/null && unshare -r true 2>/dev/null; then
    unshare -r chroot "$merged" /usr/bin/python3 -m compileall -q /usr/lib/python3.11 >/dev/null
    (cd "$merged" && find usr/lib/python3.11 -name '__pycache__' -type d) | while read -r d; do
      mkdir -p "$py/$d" && cp -a "$merged/$d/." "$py/$d/"
    done
  fi

  rm -rf "$out/busybox-rootfs" "$out/python-rootfs"
  cp -a "$base" "$out/busybox-rootfs"
  cp -a "$merged" "$out/python-rootfs"
  rm -rf "$out/python-rootfs/usr/share/doc"

  python3 "$root/scripts/oci_pack.py" --name strata-test/busybox --tag 1 \
    --out-oci "$out/busybox-oci" --out-docker "$out/busybox.docker.tar" \
    --cmd '["/bin/sh"]' "$base"
  python3 "$root/scripts/oci_pack.py" --name strata-test/python --tag 1 \
    --out-oci "$out/python-oci" --out-docker "$out/python.docker.tar" \
    --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --env "LANG=C.UTF-8" --cmd '["python3"]' --whiteout /usr/share/doc "$base" "$py"
  echo "$want" > "$stamp"
  echo "test images built in $((SECONDS - t0)) s under $out"
}

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] \
   || [ ! -f "$out/python.docker.tar" ] || [ ! -d "$out/python-oci" ] \
   || [ ! -d "$out/busybox-rootfs" ] || [ ! -f "$out/busybox.docker.tar" ]; then
  build
else
  echo "test images: up to date under $out"
fi

if $load_docker; then
  docker_cli() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else docker "$@"; fi; }
  # The image id the engine should have for a tag: the archive's config digest. Another
  # checkout sharing this engine may have tagged a different build of the image.
  archive_id() { tar -xOf "$1" manifest.json | python3 -c 'import json,sys; print("sha256:" + json.load(sys.stdin)[0]["Config"].split("/")[-1].removesuffix(".json"))'; }
  engine_id() { docker_cli image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
  for name in busybox python; do
    if [ "$(engine_id "strata-test/$name:1")" != "$(archive_id "$out/$name.docker.tar")" ]; then
      docker_cli load -q -i "$out/$name.docker.tar"
    fi
  done
fi
