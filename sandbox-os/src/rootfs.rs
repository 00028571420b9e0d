//! Builds the sandbox's root filesystem inside the new mount namespace (helper side).
//!
//! Order matters and is the whole security argument:
//! 1. every host path the caps grant is opened with `RESOLVE_NO_SYMLINKS` and cloned as a
//!    detached mount tree whose flags (read-only, nosuid, nodev, noexec) are set
//!    *recursively* before it is attached anywhere;
//! 2. a fresh tmpfs becomes the new root; only the granted trees, a private `/dev` with
//!    five device nodes, a private `/proc` (sensitive files masked, `/proc/sys` read-only)
//!    and a size-capped scratch tmpfs (`/tmp`, workdir, `/dev/shm`) are attached to it;
//!    mount points are only ever created on Strata's own tmpfs, never on a host mount;
//! 3. the root tmpfs is made read-only, `pivot_root` switches to it and the old root is
//!    detached, so no path leads back to the host tree.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::fs_policy::DEVICES;
use crate::protocol::{ImageRootSpec, MountSpec, Spec};
use crate::sys;

/// A failed step, named for the error the caller sees.
#[derive(Debug)]
pub struct StepError {
    /// What was being done.
    pub stage: String,
    /// The OS error.
    pub source: io::Error,
}

fn step<T>(stage: impl FnOnce() -> String, result: io::Result<T>) -> Result<T, StepError> {
    result.map_err(|source| StepError {
        stage: stage(),
        source,
    })
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// Files in /proc that leak host state or act on the host; covered with /dev/null.
const PROC_MASKED_FILES: [&str; 7] = [
    "kcore",
    "keys",
    "sysrq-trigger",
    "timer_list",
    "latency_stats",
    "sched_debug",
    "kallsyms",
];
/// Directories in /proc made read-only.
const PROC_READ_ONLY_DIRS: [&str; 4] = ["sys", "bus", "fs", "irq"];

/// Result of building the root: facts for the receipt.
#[derive(Debug, Default)]
pub struct Built {
    /// `vm.memfd_noexec=2` was set in the sandbox's pid namespace.
    pub memfd_noexec: bool,
    /// Scratch tmpfs, kept open to check whether it filled up.
    pub scratch: Option<OwnedFd>,
}

/// Builds the root described by `spec` and pivots into it. Runs in the sandbox's init
/// process, inside new user, mount and pid namespaces, before any tool code.
pub fn build(spec: &Spec) -> Result<Built, StepError> {
    step(
        || "make host mounts private".into(),
        sys::mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;

    // 1. Clone every granted tree while the host tree is still reachable.
    let mounts = spec.mounts();
    let mut trees = Vec::with_capacity(mounts.len());
    for mount in &mounts {
        trees.push(clone_tree(mount)?);
    }
    let mut devices = Vec::with_capacity(DEVICES.len());
    for dev in DEVICES {
        let path = Path::new("/dev").join(dev);
        let fd = step(
            || format!("open {}", path.display()),
            sys::openat2(
                libc::AT_FDCWD,
                &path,
                (libc::O_PATH | libc::O_CLOEXEC) as u64,
                RESOLVE_NO_SYMLINKS,
            ),
        )?;
        let tree = step(
            || format!("clone {}", path.display()),
            sys::open_tree(
                fd.as_raw_fd(),
                c"",
                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
            ),
        )?;
        step(
            || format!("restrict {}", path.display()),
            sys::mount_setattr(
                tree.as_raw_fd(),
                false,
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                0,
            ),
        )?;
        devices.push((dev, tree));
    }
    let scratch = scratch_tmpfs(spec)?;

    // 2. The new root: a small tmpfs on a staging directory of this (private) namespace, or
    //    for a container run the image under a private writable layer.
    let staging = staging_dir();
    match &spec.image {
        None => step(
            || format!("mount root tmpfs on {}", staging.display()),
            sys::mount(
                Some("strata-root"),
                &staging,
                Some("tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some("size=1m,nr_inodes=4096,mode=0755"),
            ),
        )?,
        Some(image) => mount_image_root(image, &scratch, &staging)?,
    }
    let root = step(
        || "open new root".into(),
        sys::openat2(
            libc::AT_FDCWD,
            &staging,
            (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            RESOLVE_NO_SYMLINKS,
        ),
    )?;
    // Mount points may be created on Strata's own file systems (the root and the scratch
    // tmpfs), never on a host mount.
    let own_devs = [dev_of(root.as_raw_fd())?, dev_of(scratch.as_raw_fd())?];
    let ours = |fd: RawFd| dev_of(fd).map(|d| own_devs.contains(&d));
    let is_image = spec.image.is_some();
    if is_image {
        // The image's own /dev, /proc and /tmp may be anything (a symlink to a host-looking
        // path, a file): replace whatever is not a directory, then cover them with mounts.
        for name in ["dev", "proc", "tmp"] {
            reserve_dir(root.as_raw_fd(), name)?;
        }
    }

    for link in &spec.links {
        let rel = relative(&link.path)?;
        if let Some(parent) = rel.parent() {
            mkdir_all(root.as_raw_fd(), parent, &ours)?;
        }
        step(
            || format!("symlink {}", link.path.display()),
            sys::symlinkat(&link.target, root.as_raw_fd(), rel),
        )?;
    }
    for file in &spec.files {
        let rel = relative(&file.path)?;
        if let Some(parent) = rel.parent() {
            mkdir_all(root.as_raw_fd(), parent, &ours)?;
        }
        step(
            || format!("write {}", file.path.display()),
            write_new_file(root.as_raw_fd(), rel, &file.contents),
        )?;
    }

    // /dev: its own tiny tmpfs, the device nodes as bind mounts, and standard links.
    if !is_image {
        step(
            || "create /dev".into(),
            sys::mkdirat(root.as_raw_fd(), Path::new("dev"), 0o755),
        )?;
    }
    let dev_dir = staging.join("dev");
    step(
        || "mount /dev tmpfs".into(),
        sys::mount(
            Some("strata-dev"),
            &dev_dir,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("size=64k,nr_inodes=64,mode=0755"),
        ),
    )?;
    let dev = open_dir(root.as_raw_fd(), Path::new("dev"))?;
    for (name, tree) in devices {
        step(
            || format!("create /dev/{name}"),
            sys::touch_at(dev.as_raw_fd(), Path::new(name), 0o666),
        )?;
        let target = open_path(dev.as_raw_fd(), Path::new(name), false)?;
        step(
            || format!("attach /dev/{name}"),
            sys::move_mount_fd(tree.as_raw_fd(), target.as_raw_fd()),
        )?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        step(
            || format!("link /dev/{link}"),
            sys::symlinkat(Path::new(target), dev.as_raw_fd(), Path::new(link)),
        )?;
    }
    step(
        || "create /dev/shm".into(),
        sys::mkdirat(dev.as_raw_fd(), Path::new("shm"), 0o755),
    )?;

    // Scratch space: /tmp, /dev/shm and (when private) the workdir share one capped tmpfs.
    if !is_image {
        step(
            || "create /tmp".into(),
            sys::mkdirat(root.as_raw_fd(), Path::new("tmp"), 0o755),
        )?;
    }
    attach_scratch_dir(&scratch, "tmp", root.as_raw_fd(), Path::new("tmp"))?;
    attach_scratch_dir(&scratch, "shm", root.as_raw_fd(), Path::new("dev/shm"))?;
    step(
        || "make /dev read-only".into(),
        sys::mount_setattr(dev.as_raw_fd(), false, MOUNT_ATTR_RDONLY, 0),
    )?;

    // 3. Granted host trees, parents before children: a writable grant first, then the
    //    self-binds pinning its host-executed paths' parents, then those paths read-only.
    for (mount, tree) in mounts.iter().zip(trees) {
        let rel = relative(&mount.target)?;
        let target = mount_point(root.as_raw_fd(), rel, mount.is_dir, &ours)?;
        step(
            || {
                format!(
                    "attach {} at {}",
                    mount.source.display(),
                    mount.target.display()
                )
            },
            sys::move_mount_fd(tree.as_raw_fd(), target.as_raw_fd()),
        )?;
    }
    if spec.workdir_is_scratch {
        let rel = relative(spec.workdir())?;
        mount_point(root.as_raw_fd(), rel, true, &ours)?;
        attach_scratch_dir(&scratch, "work", root.as_raw_fd(), rel)?;
    }

    // /proc for the new pid namespace, mounted while the host's /proc is still visible
    // (the kernel refuses a new procfs in a user namespace otherwise).
    if !is_image {
        step(
            || "create /proc".into(),
            sys::mkdirat(root.as_raw_fd(), Path::new("proc"), 0o555),
        )?;
    }
    let proc_dir = staging.join("proc");
    step(
        || "mount /proc".into(),
        sys::mount(
            Some("proc"),
            &proc_dir,
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ),
    )?;
    let memfd_noexec = std::fs::write(proc_dir.join("sys/vm/memfd_noexec"), "2").is_ok();
    let dev_null = staging.join("dev/null");
    for name in PROC_MASKED_FILES {
        let path = proc_dir.join(name);
        if path.exists() {
            step(
                || format!("mask /proc/{name}"),
                sys::mount(dev_null.to_str(), &path, None, libc::MS_BIND, None),
            )?;
        }
    }
    for name in PROC_READ_ONLY_DIRS {
        let path = proc_dir.join(name);
        if path.is_dir() {
            step(
                || format!("bind /proc/{name}"),
                sys::mount(
                    path.to_str(),
                    &path,
                    None,
                    libc::MS_BIND | libc::MS_REC,
                    None,
                ),
            )?;
            step(
                || format!("make /proc/{name} read-only"),
                sys::mount(
                    None,
                    &path,
                    None,
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    None,
                ),
            )?;
        }
    }

    // Seal the root and switch to it. An image root stays writable: its writes land in
    // the run's private upper layer.
    if !is_image {
        step(
            || "make root read-only".into(),
            sys::mount_setattr(root.as_raw_fd(), false, MOUNT_ATTR_RDONLY, 0),
        )?;
    }
    drop(root);
    step(
        || "enter new root".into(),
        std::env::set_current_dir(&staging),
    )?;
    step(
        || "pivot_root".into(),
        sys::pivot_root(Path::new("."), Path::new(".")),
    )?;
    step(
        || "detach host root".into(),
        sys::umount(Path::new("."), libc::MNT_DETACH),
    )?;
    step(|| "chdir /".into(), std::env::set_current_dir("/"))?;

    Ok(Built {
        memfd_noexec,
        scratch: Some(scratch),
    })
}

/// Mounts the image as an overlay on `staging`: the unpacked image as the read-only lower
/// layer (opened without following symlinks and passed by fd), and a writable upper layer
/// on the run's scratch tmpfs (so it shares the disk limit and dies with the run) or in a
/// kept workspace directory.
fn mount_image_root(
    image: &ImageRootSpec,
    scratch: &OwnedFd,
    staging: &Path,
) -> Result<(), StepError> {
    let open_dir_nofollow = |path: &Path, what: &str| {
        step(
            || {
                format!(
                    "open {what} {} (it must exist and contain no symlinks)",
                    path.display()
                )
            },
            sys::openat2(
                libc::AT_FDCWD,
                path,
                (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
                RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
            ),
        )
    };
    let lower = open_dir_nofollow(&image.lower, "image")?;
    let layer_dir = match &image.workspace {
        Some(workspace) => open_dir_nofollow(workspace, "workspace")?,
        None => step(
            || "open scratch".into(),
            sys::openat2(
                scratch.as_raw_fd(),
                Path::new("."),
                (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
                0,
            ),
        )?,
    };
    // In the scratch tmpfs, "work" is the private workdir: the overlay's are prefixed.
    let (upper, work) = match image.workspace {
        Some(_) => ("upper", "work"),
        None => ("overlay-upper", "overlay-work"),
    };
    for dir in [upper, work] {
        step(
            || format!("create overlay {dir} directory"),
            sys::mkdirat(layer_dir.as_raw_fd(), Path::new(dir), 0o755),
        )?;
        // Refuse a symlink planted in a kept workspace.
        open_path(layer_dir.as_raw_fd(), Path::new(dir), true)?;
    }
    let options = format!(
        "lowerdir=/proc/self/fd/{lower},upperdir=/proc/self/fd/{layers}/{upper},workdir=/proc/self/fd/{layers}/{work},userxattr",
        lower = lower.as_raw_fd(),
        layers = layer_dir.as_raw_fd(),
    );
    step(
        || "mount the image (overlay)".into(),
        sys::mount(
            Some("strata-image"),
            staging,
            Some("overlay"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&options),
        ),
    )
}

/// Makes `/name` in an image root a real directory: a symlink, file or device the image
/// put there is removed (only in the run's upper layer), never followed.
fn reserve_dir(root: RawFd, name: &str) -> Result<(), StepError> {
    let path = Path::new(name);
    match open_path(root, path, true) {
        Ok(_) => return Ok(()),
        Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => {}
        Err(_) => step(
            || format!("replace the image's /{name}"),
            sys::unlinkat(root, path, 0),
        )?,
    }
    step(
        || format!("create /{name} in the image root"),
        sys::mkdirat(root, path, 0o755),
    )
}

fn staging_dir() -> PathBuf {
    for candidate in ["/tmp", "/run", "/mnt", "/var/tmp"] {
        if Path::new(candidate).is_dir() {
            return candidate.into();
        }
    }
    "/tmp".into()
}

fn clone_tree(mount: &MountSpec) -> Result<OwnedFd, StepError> {
    let mut flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    if mount.is_dir {
        flags |= libc::O_DIRECTORY as u64;
    }
    let fd = step(
        || {
            format!(
                "open mount source {} (it must exist and contain no symlinks; was it replaced?)",
                mount.source.display()
            )
        },
        sys::openat2(
            libc::AT_FDCWD,
            &mount.source,
            flags,
            RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        ),
    )?;
    let tree = step(
        || format!("clone mount {}", mount.source.display()),
        sys::open_tree(
            fd.as_raw_fd(),
            c"",
            OPEN_TREE_CLONE
                | OPEN_TREE_CLOEXEC
                | libc::AT_EMPTY_PATH as libc::c_uint
                | libc::AT_RECURSIVE as libc::c_uint,
        ),
    )?;
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if !mount.writable {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    if !mount.exec {
        attrs |= MOUNT_ATTR_NOEXEC;
    }
    step(
        || format!("restrict mount {}", mount.source.display()),
        sys::mount_setattr(tree.as_raw_fd(), true, attrs, 0),
    )?;
    Ok(tree)
}

fn scratch_tmpfs(spec: &Spec) -> Result<OwnedFd, StepError> {
    let size = spec.scratch_bytes().to_string();
    let inodes = spec.scratch_inodes().to_string();
    let scratch = step(
        || "create scratch tmpfs".into(),
        sys::detached_tmpfs(
            &[("size", &size), ("nr_inodes", &inodes), ("mode", "0755")],
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        ),
    )?;
    for (dir, mode) in [("tmp", 0o1777), ("shm", 0o1777), ("work", 0o755)] {
        step(
            || format!("create scratch {dir}"),
            sys::mkdirat(scratch.as_raw_fd(), Path::new(dir), mode),
        )?;
    }
    attach_for_old_kernels(scratch)
}

/// Kernels before 6.15 refuse to clone (`open_tree(OPEN_TREE_CLONE)`) a directory of a
/// mount that is not attached to a mount namespace (EINVAL). There the scratch tmpfs is
/// first attached on a spare directory of this private namespace (never on a host file
/// system: over an existing directory, like the staging root; it goes away with the old
/// root after `pivot_root`), and the returned descriptor is its attached root.
fn attach_for_old_kernels(scratch: OwnedFd) -> Result<OwnedFd, StepError> {
    match sys::open_tree(
        scratch.as_raw_fd(),
        c"tmp",
        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
    ) {
        Ok(_) => return Ok(scratch),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => {
            return Err(StepError {
                stage: "clone scratch tmp".into(),
                source: e,
            })
        }
    }
    let staging = staging_dir();
    let spare = ["/tmp", "/run", "/mnt", "/var/tmp"]
        .iter()
        .map(Path::new)
        .find(|p| *p != staging && p.is_dir())
        .ok_or_else(|| StepError {
            stage: "attach scratch tmpfs: no spare directory (/run, /mnt, /var/tmp)".into(),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        })?;
    let target = step(
        || format!("open {}", spare.display()),
        sys::openat2(
            libc::AT_FDCWD,
            spare,
            (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            RESOLVE_NO_SYMLINKS,
        ),
    )?;
    step(
        || format!("attach scratch tmpfs on {}", spare.display()),
        sys::move_mount_fd(scratch.as_raw_fd(), target.as_raw_fd()),
    )?;
    step(
        || format!("open scratch tmpfs on {}", spare.display()),
        sys::openat2(
            libc::AT_FDCWD,
            spare,
            (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
            RESOLVE_NO_SYMLINKS,
        ),
    )
}

fn attach_scratch_dir(
    scratch: &OwnedFd,
    dir: &str,
    root: RawFd,
    target: &Path,
) -> Result<(), StepError> {
    let cdir = step(|| format!("scratch {dir}"), sys::cstring(Path::new(dir)))?;
    let tree = step(
        || format!("clone scratch {dir}"),
        sys::open_tree(
            scratch.as_raw_fd(),
            &cdir,
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
        ),
    )?;
    let target_fd = open_path(root, target, true)?;
    step(
        || format!("attach scratch at /{}", target.display()),
        sys::move_mount_fd(tree.as_raw_fd(), target_fd.as_raw_fd()),
    )
}

fn relative(path: &Path) -> Result<&Path, StepError> {
    let rel = path.strip_prefix("/").map_err(|_| StepError {
        stage: format!("path {} is not absolute", path.display()),
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(StepError {
            stage: format!("path {} is not normalized", path.display()),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    Ok(rel)
}

fn dev_of(fd: RawFd) -> Result<u64, StepError> {
    let file = step(
        || "stat".into(),
        sys::openat2(
            fd,
            Path::new("."),
            (libc::O_PATH | libc::O_CLOEXEC) as u64,
            0,
        ),
    )?;
    let meta = step(
        || "stat".into(),
        std::fs::metadata(format!("/proc/self/fd/{}", file.as_raw_fd())),
    )?;
    Ok(meta.dev())
}

fn open_path(dir: RawFd, rel: &Path, is_dir: bool) -> Result<OwnedFd, StepError> {
    let mut flags = (libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64;
    if is_dir {
        flags |= libc::O_DIRECTORY as u64;
    }
    step(
        || format!("open /{} in the new root", rel.display()),
        sys::openat2(dir, rel, flags, RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH),
    )
}

fn open_dir(dir: RawFd, rel: &Path) -> Result<OwnedFd, StepError> {
    open_path(dir, rel, true)
}

/// Creates the directories of `rel` under `root`, refusing to create anything on a
/// filesystem that is not Strata's own root tmpfs (so a host mount is never modified).
fn mkdir_all(
    root: RawFd,
    rel: &Path,
    ours: &dyn Fn(RawFd) -> Result<bool, StepError>,
) -> Result<OwnedFd, StepError> {
    let mut current = open_dir(root, Path::new("."))?;
    for part in rel.components() {
        let Component::Normal(name) = part else {
            continue;
        };
        let name = Path::new(name);
        let next = match sys::openat2(
            current.as_raw_fd(),
            name,
            (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
            RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
        ) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                refuse_unless_ours(current.as_raw_fd(), rel, ours)?;
                step(
                    || format!("create /{}", rel.display()),
                    sys::mkdirat(current.as_raw_fd(), name, 0o755),
                )?;
                open_dir(current.as_raw_fd(), name)?
            }
            Err(source) => {
                return Err(StepError {
                    stage: format!(
                        "open /{} in the new root (symlinks are not followed)",
                        rel.display()
                    ),
                    source,
                })
            }
        };
        current = next;
    }
    Ok(current)
}

fn refuse_unless_ours(
    dir: RawFd,
    rel: &Path,
    ours: &dyn Fn(RawFd) -> Result<bool, StepError>,
) -> Result<(), StepError> {
    if ours(dir)? {
        Ok(())
    } else {
        Err(StepError {
            stage: format!(
                "create mount point /{}: its parent is a host mount; create it on the host first",
                rel.display()
            ),
            source: io::Error::from_raw_os_error(libc::ENOENT),
        })
    }
}

/// Opens (creating on Strata's tmpfs if needed) the mount point `rel`.
fn mount_point(
    root: RawFd,
    rel: &Path,
    is_dir: bool,
    ours: &dyn Fn(RawFd) -> Result<bool, StepError>,
) -> Result<OwnedFd, StepError> {
    let parent = match rel.parent() {
        Some(p) if !p.as_os_str().is_empty() => mkdir_all(root, p, ours)?,
        _ => open_dir(root, Path::new("."))?,
    };
    let Some(name) = rel.file_name() else {
        return Err(StepError {
            stage: "mount point has no name".into(),
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    };
    let name = Path::new(name);
    match open_path(parent.as_raw_fd(), name, is_dir) {
        Ok(fd) => Ok(fd),
        Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => {
            refuse_unless_ours(parent.as_raw_fd(), rel, ours)?;
            if is_dir {
                step(
                    || format!("create /{}", rel.display()),
                    sys::mkdirat(parent.as_raw_fd(), name, 0o755),
                )?;
            } else {
                step(
                    || format!("create /{}", rel.display()),
                    sys::touch_at(parent.as_raw_fd(), name, 0o644),
                )?;
            }
            open_path(parent.as_raw_fd(), name, is_dir)
        }
        Err(e) => Err(e),
    }
}

fn write_new_file(dir: RawFd, rel: &Path, contents: &str) -> io::Result<()> {
    use std::io::Write;
    let path = format!("/proc/self/fd/{}/{}", dir, rel.display());
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(contents.as_bytes())
}
