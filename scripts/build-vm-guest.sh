#!/usr/bin/env bash
# Builds the microVM backend's guest artifacts from Debian packages, idempotently, under
# .ci/cache/vm/ (gitignored; STRATA_VM_GUEST_DIR overrides):
#
#   vmlinuz           Debian's cloud kernel (linux-image-cloud-amd64's versioned package)
#   initramfs.cpio.gz busybox-static as /bin/sh, the virtio modules the guest needs
#                     (virtio_mmio, virtio_console, virtio_blk and their dependencies), the
#                     host's glibc loader and libraries the guest agent links against, and
#                     /init, which mounts proc/sys/devtmpfs, loads the modules in dependency
#                     order and execs /strata-guest-agent
#   kernel-version    the kernel release (goes into receipts)
#
# The guest agent binary itself is not in this archive: the host prepends it as a small
# uncompressed cpio segment when it boots a VM (sandbox-vm's `initramfs` module), so
# rebuilding the agent never needs this script. Installs qemu-system-x86 with apt when
# qemu-system-x86_64 is missing (root only). A stamp file records the inputs; a warm run only
# checks it. Serialized with flock, so concurrent test binaries can call it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="${STRATA_VM_GUEST_DIR:-$root/.ci/cache/vm}"
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

version=1 # bump when the recipe changes
meta=linux-image-cloud-amd64
modules=(virtio_mmio virtio_console virtio_blk)

if ! command -v qemu-system-x86_64 >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "qemu-system-x86_64 is missing: run 'apt-get install -y --no-install-recommends qemu-system-x86' as root" >&2
    exit 1
  fi
  echo "installing qemu-system-x86 (apt)"
  if ! apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
  fi
fi

busybox=/bin/busybox
if ! "$busybox" --list 2>/dev/null | grep -qx insmod || ! file -L "$busybox" 2>/dev/null | grep -q static; then
  # Debian's busybox-static installs /bin/busybox; without it, fetch the package.
  busybox=""
fi

# The versioned kernel package the metapackage depends on.
resolve_kernel_pkg() {
  apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}'
}
kpkg="$(resolve_kernel_pkg)"
if [ -z "$kpkg" ]; then
  apt-get update -qq
  kpkg="$(resolve_kernel_pkg)"
fi
[ -n "$kpkg" ] || { echo "cannot resolve $meta to a kernel package" >&2; exit 1; }
kver_pkg="$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')"

libs=(/lib64/ld-linux-x86-64.so.2 /lib/x86_64-linux-gnu/libc.so.6 /lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libm.so.6)
stamp="$out/stamp"
want="v$version $kpkg=$kver_pkg ${modules[*]} $(sha256sum "$0" | cut -c1-16) $(sha256sum "${libs[@]}" | sha256sum | cut -c1-16)"

decompress_ko() {
  case "$1" in
    *.ko.xz) xz -dc "$1" ;;
    *.ko.zst) zstd -qdc "$1" ;;
    *) cat "$1" ;;
  esac
}

work=""
build() {
  local t0=$SECONDS
  local debs="$out/debs"
  mkdir -p "$debs"
  (
    cd "$debs"
    local pkgs=("$kpkg")
    [ -n "$busybox" ] || pkgs+=(busybox-static)
    if ! ls "${kpkg}"_*.deb >/dev/null 2>&1 || [ -z "$busybox" ]; then
      if ! apt-get download -qq "${pkgs[@]}" 2>/dev/null; then
        apt-get update -qq
        apt-get download -qq "${pkgs[@]}"
      fi
    fi
  )
  work="$(mktemp -d "$out/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  local kdir="$work/kernel"
  mkdir -p "$kdir"
  dpkg-deb -x "$(ls "$debs/${kpkg}"_*.deb | head -1)" "$kdir"
  local vmlinuz kver
  vmlinuz="$(ls "$kdir"/boot/vmlinuz-* | head -1)"
  kver="${vmlinuz##*/vmlinuz-}"
  local mdir="$kdir/lib/modules/$kver"
  [ -d "$mdir" ] || { echo "no modules for $kver in $kpkg" >&2; exit 1; }
  if [ -z "$busybox" ]; then
    dpkg-deb -x "$(ls "$debs"/busybox-static_*.deb | head -1)" "$work/bb"
    busybox="$work/bb/bin/busybox"
  fi

  # Modules in dependency order (dependencies first), from the package's modules.dep.
  local order=() seen=" "
  add_module() {
    local name="$1" path deps dep
    path="$(find "$mdir/kernel" -name "$name.ko*" -print -quit)"
    if [ -z "$path" ]; then
      # Built into the kernel: nothing to load.
      grep -q "/$name.ko" "$mdir/modules.builtin" 2>/dev/null && return 0
      echo "module $name not found in $kpkg" >&2
      exit 1
    fi
    case "$seen" in *" $name "*) return 0 ;; esac
    # The `depends=` field of the module's .modinfo section (no modinfo/modules.dep here:
    # the package ships neither modules.dep nor needs kmod on the host).
    deps="$(decompress_ko "$path" | tr '\0' '\n' | sed -n 's/^depends=//p' | head -1 | tr ',' ' ')"
    for dep in $deps; do add_module "$dep"; done
    seen="$seen$name "
    order+=("$path")
  }
  for m in "${modules[@]}"; do add_module "$m"; done

  local rd="$work/initramfs"
  mkdir -p "$rd"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,lib/modules,lib64,lib/x86_64-linux-gnu}
  chmod 1777 "$rd/tmp"
  cp "$busybox" "$rd/bin/busybox"
  for applet in $("$rd/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rd/bin/$applet"
  done
  local i=0 loadlist=""
  for path in "${order[@]}"; do
    local base="${path##*/}"
    base="${base%.xz}"
    base="${base%.zst}"
    decompress_ko "$path" > "$rd/lib/modules/$(printf '%02d' $i)-$base"
    i=$((i + 1))
  done
  for lib in "${libs[@]}"; do cp -L "$lib" "$rd$lib"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$rd/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$rd/etc/group"
  echo strata-vm > "$rd/etc/hostname"
  cat > "$rd/init" <<'EOF'
#!/bin/sh
# Strata guest init: mount the kernel file systems, load the virtio modules (named in
# dependency order), hand over to the guest agent. No network is configured.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs -o mode=1777,nosuid,nodev tmp /tmp
hostname strata-vm
for m in /lib/modules/*.ko; do
  insmod "$m" || echo "strata-init: insmod $m failed" >&2
done
[ -x /strata-guest-agent ] || { echo "strata-init: /strata-guest-agent missing" >&2; exec sh; }
exec /strata-guest-agent
EOF
  chmod 0755 "$rd/init"

  (cd "$rd" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) \
    | gzip -6 -n > "$work/initramfs.cpio.gz"
  cp "$vmlinuz" "$work/vmlinuz"
  echo "$kver" > "$work/kernel-version"
  mv -f "$work/vmlinuz" "$out/vmlinuz"
  mv -f "$work/initramfs.cpio.gz" "$out/initramfs.cpio.gz"
  mv -f "$work/kernel-version" "$out/kernel-version"
  echo "$want" > "$stamp"
  echo "vm guest built in $((SECONDS - t0)) s under $out (kernel $kver; modules: ${order[*]##*/})"
}

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -f "$out/vmlinuz" ] \
   || [ ! -f "$out/initramfs.cpio.gz" ] || [ ! -f "$out/kernel-version" ]; then
  build
else
  echo "vm guest: up to date under $out (kernel $(cat "$out/kernel-version"))"
fi
