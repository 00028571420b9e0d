#!/usr/bin/env bash
# Builds the microVM backend's guest artifacts from Debian packages, idempotently, under
# .ci/cache/vm/ (gitignored; STRATA_VM_GUEST_DIR overrides):
#
#   vmlinuz           Debian's cloud kernel (linux-image-cloud-amd64's versioned package)
#   initramfs.cpio.gz busybox-static as /bin/sh, the virtio modules the guest needs
#                     (virtio_mmio, virtio_console, virtio_blk and their dependencies), and
#                     /init, which mounts proc/sys/devtmpfs, loads the modules in dependency
#                     order, mounts the root disk and switches to it with the guest agent
#   kernel-version    the kernel release (goes into receipts)
#   rootfs.ext4       the guest's read-only root file system: Debian's python3 and bash (and the
#                     libraries it needs) and busybox-static, extracted from their packages
#                     with dpkg-deb (no maintainer scripts run), as an ext4 image without a
#                     journal. /init mounts it read-only (QEMU opens it readonly=on) under an
#                     overlay whose upper layer is tmpfs, and switches to it; tmpfs covers
#                     /tmp and /run
#   rootfs-version    what is in it (package=version lines; goes into receipts)
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

version=7 # bump when the recipe changes
meta=linux-image-cloud-amd64
modules=(virtio_mmio virtio_console virtio_blk overlay virtio_net)

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

# The root file system: python3 and everything it depends on, minus what only package
# management or perl needs (mime-support pulls perl in; nothing in the guest runs dpkg).
root_pkgs=(python3 busybox-static bash)
root_skip='^(perl|perl-base|perl-modules-.*|libperl.*|dpkg|install-info|mailcap|mime-support|tar|libgdbm-compat4|debconf|debianutils)$'
resolve_root_pkgs() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances "${root_pkgs[@]}" 2>/dev/null \
    | grep -v '^ ' | grep -v '^<' | grep -Ev "$root_skip" | sort -u
}
mapfile -t rootfs_pkgs < <(resolve_root_pkgs)
rootfs_versions="$(apt-cache policy "${rootfs_pkgs[@]}" | awk '/^[^ ]/ {sub(":$", "", $1); p=$1} /Candidate:/ {print p "=" $2}')"
stamp="$out/stamp"
want="v$version $kpkg=$kver_pkg ${modules[*]} $(sha256sum "$0" | cut -c1-16) $(echo "$rootfs_versions" | sha256sum | cut -c1-16)"

decompress_ko() {
  case "$1" in
    *.ko.xz) xz -dc "$1" ;;
    *.ko.zst) zstd -qdc "$1" ;;
    *) cat "$1" ;;
  esac
}

# The read-only root file system image, from the packages' contents alone.
build_rootfs() {
  local debs="$1" work="$2" fs="$2/rootfs"
  (
    cd "$debs"
    local missing=()
    for p in "${rootfs_pkgs[@]}"; do
      ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
      if ! apt-get download -qq "${missing[@]}" 2>/dev/null; then
        apt-get update -qq
        apt-get download -qq "${missing[@]}"
      fi
    fi
  )
  mkdir -p "$fs"
  for p in "${rootfs_pkgs[@]}"; do
    dpkg-deb -x "$(ls "$debs/${p}"_*.deb | sort -V | tail -1)" "$fs"
  done
  mkdir -p "$fs"/{bin,dev,proc,sys,tmp,run,root,etc,work}
  chmod 1777 "$fs/tmp"
  for applet in $("$fs/bin/busybox" --list); do
    [ -e "$fs/bin/$applet" ] || [ -e "$fs/usr/bin/$applet" ] || [ -e "$fs/sbin/$applet" ] \
      || [ -e "$fs/usr/sbin/$applet" ] || ln -s busybox "$fs/bin/$applet"
  done
  [ -e "$fs/usr/bin/python3" ] || { echo "rootfs: python3 missing after extraction" >&2; exit 1; }
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$fs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$fs/etc/group"
  echo strata-vm > "$fs/etc/hostname"
  printf '127.0.0.1 localhost strata-vm\n::1 localhost\n' > "$fs/etc/hosts"
  printf 'passwd: files\ngroup: files\nhosts: files\n' > "$fs/etc/nsswitch.conf"
  rm -rf "$fs/usr/share/doc" "$fs/usr/share/man" "$fs/usr/share/info" "$fs/usr/share/locale"
  local mib
  mib=$(( $(du -sm "$fs" | cut -f1) * 13 / 10 + 16 ))
  mke2fs -q -t ext4 -O ^has_journal,^resize_inode -m 0 -L strata-root -E root_owner=0:0 \
    -d "$fs" "$work/rootfs.ext4" "${mib}M" >/dev/null
  echo "$rootfs_versions" > "$work/rootfs-version"
  rm -rf "$fs"
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
  mkdir -p "$rd"/{bin,sbin,dev,proc,sys,tmp,run,root,etc,lib/modules,newroot}
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
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$rd/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$rd/etc/group"
  echo strata-vm > "$rd/etc/hostname"
  cat > "$rd/init" <<'EOF'
#!/bin/sh
# Strata guest init: mount the kernel file systems, load the virtio modules (named in
# dependency order), mount the read-only root disk (serial strata-root) under a tmpfs
# overlay, put tmpfs on /tmp and /run, and switch to it with the guest agent. No network is
# configured.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in /lib/modules/*.ko; do
  insmod "$m" || echo "strata-init: insmod $m failed" >&2
done
disk() { # the /dev node of the virtio disk whose serial is $1
  for d in /sys/block/vd*; do
    [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/${d##*/}"; return; }
  done
}
root="$(disk strata-root)"
tools="$(disk strata-tools)"
[ -n "$root" ] && [ -n "$tools" ] || { echo "strata-init: root or tools disk missing" >&2; exec sh; }
mkdir -p /lower /rw
mount -t ext4 -o ro,nodev,noload "$root" /lower || { echo "strata-init: mount $root failed" >&2; exec sh; }
# The root: the read-only disk under a tmpfs upper layer (writes stay in guest RAM).
mount -t tmpfs -o mode=0755 rw /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work root /newroot \
  || { echo "strata-init: overlay root failed" >&2; exec sh; }
mount -t tmpfs -o mode=1777,nosuid,nodev tmp /newroot/tmp
mount -t tmpfs -o mode=0755,nosuid,nodev run /newroot/run
mkdir -p /newroot/run/strata/tools
mount -t ext4 -o ro,nodev,noload "$tools" /newroot/run/strata/tools \
  || { echo "strata-init: mount $tools failed" >&2; exec sh; }
for fs in dev proc sys; do mount --move /$fs /newroot/$fs; done
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup || echo "strata-init: no cgroup2" >&2
# Delegate the controllers the process backend inside the guest limits runs with.
echo "+memory +pids +cpu" > /newroot/sys/fs/cgroup/cgroup.subtree_control \
  || echo "strata-init: cannot enable cgroup controllers" >&2
exec switch_root /newroot /run/strata/tools/strata-guest-agent
EOF
  chmod 0755 "$rd/init"

  (cd "$rd" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) \
    | gzip -6 -n > "$work/initramfs.cpio.gz"
  build_rootfs "$debs" "$work"
  cp "$vmlinuz" "$work/vmlinuz"
  echo "$kver" > "$work/kernel-version"
  mv -f "$work/vmlinuz" "$out/vmlinuz"
  mv -f "$work/initramfs.cpio.gz" "$out/initramfs.cpio.gz"
  mv -f "$work/kernel-version" "$out/kernel-version"
  mv -f "$work/rootfs.ext4" "$out/rootfs.ext4"
  mv -f "$work/rootfs-version" "$out/rootfs-version"
  echo "$want" > "$stamp"
  echo "vm guest built in $((SECONDS - t0)) s under $out (kernel $kver; modules: ${order[*]##*/})"
}

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -f "$out/vmlinuz" ] \
   || [ ! -f "$out/initramfs.cpio.gz" ] || [ ! -f "$out/kernel-version" ] \
   || [ ! -f "$out/rootfs.ext4" ]; then
  build
else
  echo "vm guest: up to date under $out (kernel $(cat "$out/kernel-version"))"
fi
