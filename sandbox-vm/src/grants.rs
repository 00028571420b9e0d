//! Host directories granted to a VM: each travels as an ext4 disk image built from a
//! private copy of the directory (made through descriptors opened without following
//! symbolic links, see [`build_image`]), attached as a virtio block device; run
//! directories, images and archives are the embedder's alone (0700/0600). A read-only grant's image is opened
//! `readonly=on` by the VMM, so nothing the guest does (root remounting it read-write
//! included) writes it, and the host directory is never touched. A read-write grant's image
//! is the run's private copy; after the tool ends the agent sends the tree back as a tar
//! stream and [`apply`] writes it into the host directory through a filter: every path is
//! resolved beneath the grant with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`; new or
//! changed symbolic links, devices, FIFOs and paths outside the grant are refused (listed in
//! the receipt); setuid, setgid and sticky bits are dropped; hard links are made only
//! between paths of the grant; what the guest deleted is deleted.
//!
//! Limits: directories only (a file grant is refused); at most [`MAX_GRANTS`] per run; an
//! image holds at most [`SLOT_CAPACITY`] bytes.

use sandbox_core::SetupStage;
use std::collections::BTreeSet;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use sandbox_core::{Access, BackendKind, Error, Mount, Result};

use crate::vmm::Disk;
use sandbox_agent::protocol::GuestMount;

/// Grant disks a VM can carry.
pub const MAX_GRANTS: usize = 6;

/// Placeholder slots of a snapshot: the grants and one input disk.
pub const SLOTS: usize = MAX_GRANTS + 1;

/// The size every grant slot has in a snapshot (a sparse placeholder); a grant's image is
/// at most this large: 64 GiB.
pub const SLOT_CAPACITY: u64 = 64 << 30;

/// The serial number of grant slot `i` (`strata-g0`, ...).
pub fn slot_serial(i: usize) -> String {
    format!("strata-g{i}")
}

/// A read-write grant waiting for its tree to come back.
#[derive(Debug)]
pub struct WritableGrant {
    /// The index of its mount in the run request.
    pub mount: u32,
    /// The host directory, as granted.
    pub host: PathBuf,
    /// The host directory, opened when the run started (never re-resolved).
    root: OwnedFd,
    /// The size of its image: the archive coming back cannot be larger.
    pub image_size: u64,
}

/// The disks and guest mounts of a run's grants.
#[derive(Debug, Default)]
pub struct Prepared {
    /// One disk per grant, in slot order.
    pub disks: Vec<Disk>,
    /// What the agent mounts, in slot order.
    pub mounts: Vec<GuestMount>,
    /// The read-write grants.
    pub writable: Vec<WritableGrant>,
    /// Bytes copied into images.
    pub copied: u64,
}

/// What [`apply`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Files, directories and links written.
    pub written: usize,
    /// Entries removed because the guest removed them.
    pub deleted: usize,
    /// Entries refused, with why (`"a -> /etc: a new symbolic link"`).
    pub refused: Vec<String>,
}

/// Builds an image per grant under `dir`. Read-write images get `disk_limit` bytes of free
/// space on top of what they hold.
///
/// # Errors
/// [`Error::Invalid`] for more than [`MAX_GRANTS`] grants, a file grant or a grant larger
/// than [`SLOT_CAPACITY`]; [`Error::Denied`]-like setup errors when the directory cannot be
/// opened without following a symbolic link; [`Error::Unavailable`] without `mke2fs`.
pub fn prepare(mounts: &[Mount], dir: &Path, disk_limit: u64) -> Result<Prepared> {
    if mounts.len() > MAX_GRANTS {
        return Err(Error::invalid(format!(
            "the microvm backend takes at most {MAX_GRANTS} grants per run ({} asked for)",
            mounts.len()
        )));
    }
    let mut prepared = Prepared::default();
    if mounts.is_empty() {
        return Ok(prepared);
    }
    for (i, mount) in mounts.iter().enumerate() {
        let root = open_grant(mount)?;
        let writable = mount.access == Access::ReadWrite;
        let image = dir.join(format!("grant{i}.ext4"));
        let headroom = if writable { disk_limit } else { 0 };
        let (bytes, size) = build_image(&root, &mount.host, &image, headroom)?;
        prepared.copied += bytes;
        prepared.disks.push(Disk {
            path: image,
            read_only: !writable,
            serial: slot_serial(i),
        });
        prepared.mounts.push(GuestMount {
            serial: slot_serial(i),
            target: mount.guest.to_string_lossy().into_owned(),
            writable,
        });
        if writable {
            prepared.writable.push(WritableGrant {
                mount: i as u32,
                host: mount.host.clone(),
                root,
                image_size: size,
            });
        }
    }
    Ok(prepared)
}

fn find_mke2fs() -> Result<PathBuf> {
    mke2fs_path().map_err(|e| Error::unavailable(BackendKind::Microvm, e.to_string()))
}

/// Where e2fsprogs' `mke2fs` is.
///
/// # Errors
/// `NotFound` naming the package when it is not installed.
pub fn mke2fs_path() -> std::io::Result<PathBuf> {
    ["/usr/sbin/mke2fs", "/sbin/mke2fs", "/usr/bin/mke2fs"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "microvm disks need mke2fs (apt-get install e2fsprogs)",
            )
        })
}

/// Opens the grant's directory without following a symbolic link in any component (unless
/// the mount allows it).
fn open_grant(mount: &Mount) -> Result<OwnedFd> {
    let mut resolve = ResolveFlags::NO_MAGICLINKS;
    if !mount.follow_symlinks {
        resolve |= ResolveFlags::NO_SYMLINKS;
    }
    let fd = rustix::fs::openat2(
        rustix::fs::CWD,
        &mount.host,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    );
    match fd {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOTDIR) => Err(Error::invalid(format!(
            "microvm grants are directories; {} is not one",
            mount.host.display()
        ))),
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::XDEV) => Err(Error::invalid(format!(
            "grant {}: a component is a symbolic link (set follow_symlinks to allow it)",
            mount.host.display()
        ))),
        Err(e) => Err(Error::setup(
            SetupStage::Grants,
            format!("microvm: opening grant {}", mount.host.display()),
            e.into(),
        )),
    }
}

/// Builds an ext4 image at `image` of the directory open as `root` (named `host` in
/// errors), with `headroom` free bytes; returns the bytes copied and the image size.
///
/// The tree is first copied through descriptors into a private directory beside the image
/// ([`sandbox_os::tree_copy`]: nothing is opened by path, no link is followed, an entry
/// swapped for a link while copying is skipped), and `mke2fs -d` reads only that copy,
/// which no tool can reach; the copy is removed once the image is built. `mke2fs` walking
/// the grant itself would open by path what a concurrent run of the same folder had just
/// swapped for a link to a root-only host file.
fn build_image(root: &OwnedFd, host: &Path, image: &Path, headroom: u64) -> Result<(u64, u64)> {
    let mke2fs = find_mke2fs()?;
    let parent = image.parent().unwrap_or(Path::new("."));
    let tree = sandbox_os::private::PrivateDir::new_in(parent, "tree-")
        .map_err(|e| Error::setup(SetupStage::Grants, "microvm: a private copy of a grant", e))?;
    let copied =
        sandbox_os::tree_copy::copy_tree(root, tree.path(), SLOT_CAPACITY).map_err(|e| {
            Error::setup(
                SetupStage::Grants,
                format!("microvm: copying {}", host.display()),
                e,
            )
        })?;
    // Devices, FIFOs, sockets and entries that changed while copying are left out.
    let (bytes, entries) = (copied.bytes, copied.entries);
    let size = (bytes + bytes / 4 + entries * 4096 + (8 << 20) + headroom)
        .min(SLOT_CAPACITY)
        .next_multiple_of(1 << 20);
    if bytes + bytes / 8 > size {
        return Err(Error::invalid(format!(
            "{} holds {bytes} bytes; a microvm disk holds at most {SLOT_CAPACITY}",
            host.display()
        )));
    }
    let inodes = entries + entries / 4 + 256 + if headroom > 0 { 65536 } else { 0 };
    // The image exists (0600) before mke2fs writes it, so it is never readable by others.
    sandbox_os::private::create(image).map_err(|e| {
        Error::setup(
            SetupStage::Grants,
            format!("microvm: creating {}", image.display()),
            e,
        )
    })?;
    let out = Command::new(&mke2fs)
        .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal,^resize_inode"])
        .args(["-m", "0", "-E", "root_owner=0:0,lazy_itable_init=1"])
        .args(["-N", &inodes.to_string(), "-d"])
        .arg(tree.path())
        .arg(image)
        .arg(format!("{}k", size / 1024))
        .env_clear()
        .output()
        .map_err(|e| Error::setup(SetupStage::Grants, "microvm: running mke2fs", e))?;
    if !out.status.success() {
        return Err(Error::setup(
            SetupStage::Grants,
            format!("microvm: building the image of {}", host.display()),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    drop(tree);
    Ok((bytes, size))
}

/// The serial of the input slot (an image or a wasm module for the layers inside the
/// guest): the last slot.
pub fn input_serial() -> String {
    slot_serial(MAX_GRANTS)
}

/// The input disk: an image of the directory `host` under `dir` (read-only).
///
/// # Errors
/// As [`prepare`].
pub fn input_disk(host: &Path, dir: &Path) -> Result<Disk> {
    let mount =
        Mount::new(host.to_path_buf(), host.to_path_buf(), Access::ReadOnly).follow_symlinks();
    let root = open_grant(&mount)?;
    let image = dir.join("input.ext4");
    build_image(&root, host, &image, 0)?;
    Ok(Disk {
        path: image,
        read_only: true,
        serial: input_serial(),
    })
}

/// Writes the guest's tree (a tar stream in `archive`) into the grant's host directory
/// through the filter described in the module docs.
///
/// # Errors
/// When the archive is malformed; entries written before the error stay written, nothing
/// is deleted.
pub fn apply(grant: &WritableGrant, archive: &Path) -> std::io::Result<Applied> {
    let file = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(file);
    let mut applied = Applied::default();
    let mut present = BTreeSet::<PathBuf>::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let Some(path) = clean(&raw) else {
            applied
                .refused
                .push(format!("{}: a path outside the grant", raw.display()));
            continue;
        };
        if path.as_os_str().is_empty() {
            continue;
        }
        for ancestor in path.ancestors().skip(1) {
            present.insert(ancestor.to_path_buf());
        }
        present.insert(path.clone());
        if let Err(why) = apply_entry(grant, &mut entry, &path, &mut applied) {
            applied.refused.push(format!("{}: {why}", path.display()));
        }
    }
    delete_missing(&grant.root, Path::new(""), &present, &mut applied)?;
    Ok(applied)
}

/// `path` as plain components beneath the grant, or `None` when it would leave it.
fn clean(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// The directory holding `path` (opened beneath the grant) and `path`'s last component.
fn parent_of<'p>(
    root: &OwnedFd,
    path: &'p Path,
) -> std::io::Result<(OwnedFd, &'p std::ffi::OsStr)> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let parent = path.parent().unwrap_or(Path::new(""));
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let fd = rustix::fs::openat2(
        root,
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )?;
    Ok((fd, name))
}

fn existing(dir: &OwnedFd, name: &std::ffi::OsStr) -> Option<rustix::fs::Stat> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()
}

fn apply_entry(
    grant: &WritableGrant,
    entry: &mut tar::Entry<'_, std::fs::File>,
    path: &Path,
    applied: &mut Applied,
) -> std::result::Result<(), String> {
    use rustix::fs::FileType;
    let header = entry.header();
    let kind = header.entry_type();
    let mode = header.mode().map_err(|e| e.to_string())?;
    let (dir, name) = parent_of(&grant.root, path).map_err(|e| format!("its directory: {e}"))?;
    let before = existing(&dir, name);
    let before_kind = before.as_ref().map(|s| FileType::from_raw_mode(s.st_mode));
    match kind {
        tar::EntryType::Directory => {
            if before_kind == Some(FileType::Directory) {
                return Ok(());
            }
            if before.is_some() {
                remove(&dir, name, applied).map_err(|e| e.to_string())?;
            }
            rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode & 0o777))
                .map_err(|e| format!("mkdir: {e}"))?;
            applied.written += 1;
        }
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            let size = entry.size();
            let mtime = header.mtime().unwrap_or(0);
            if let Some(stat) = &before {
                if before_kind == Some(FileType::RegularFile)
                    && stat.st_size as u64 == size
                    && stat.st_mtime as u64 == mtime
                    && stat.st_mode & 0o777 == mode & 0o777
                {
                    return Ok(());
                }
            }
            if mode & 0o7000 != 0 {
                applied.refused.push(format!(
                    "{}: setuid/setgid/sticky bits dropped",
                    path.display()
                ));
            }
            write_file(&dir, name, entry, mode & 0o777, mtime)
                .map_err(|e| format!("write: {e}"))?;
            if before_kind == Some(FileType::Directory) {
                remove(&dir, name, applied).map_err(|e| e.to_string())?;
            }
            rustix::fs::renameat(&dir, TEMP_NAME, &dir, name)
                .map_err(|e| format!("rename: {e}"))?;
            applied.written += 1;
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name()
                .map_err(|e| e.to_string())?
                .map(|t| t.into_owned())
                .unwrap_or_default();
            let same = before_kind == Some(FileType::Symlink)
                && rustix::fs::readlinkat(&dir, name, Vec::new())
                    .is_ok_and(|t| t.as_bytes() == target.as_os_str().as_encoded_bytes());
            if !same {
                return Err(format!(
                    "-> {}: a new or changed symbolic link (refused)",
                    target.display()
                ));
            }
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name()
                .map_err(|e| e.to_string())?
                .map(|t| t.into_owned())
                .unwrap_or_default();
            let Some(target) = clean(&target) else {
                return Err("a hard link to a path outside the grant".into());
            };
            let (tdir, tname) =
                parent_of(&grant.root, &target).map_err(|e| format!("link target: {e}"))?;
            let tkind = existing(&tdir, tname).map(|s| FileType::from_raw_mode(s.st_mode));
            if tkind != Some(FileType::RegularFile) {
                return Err("a hard link to something not a file of the grant".into());
            }
            if before.is_some() {
                remove(&dir, name, applied).map_err(|e| e.to_string())?;
            }
            rustix::fs::linkat(&tdir, tname, &dir, name, AtFlags::empty())
                .map_err(|e| format!("link: {e}"))?;
            applied.written += 1;
        }
        other => {
            if before.is_some()
                && before_kind != Some(FileType::RegularFile)
                && before_kind != Some(FileType::Directory)
                && before_kind != Some(FileType::Symlink)
            {
                // The host already had this special file: left alone.
                return Ok(());
            }
            return Err(format!(
                "a {other:?} entry (devices, FIFOs and sockets are refused)"
            ));
        }
    }
    Ok(())
}

/// The temporary name a file is written under before it replaces its destination.
const TEMP_NAME: &str = ".strata-grant-write.tmp";

fn write_file(
    dir: &OwnedFd,
    _name: &std::ffi::OsStr,
    data: &mut impl Read,
    mode: u32,
    mtime: u64,
) -> std::io::Result<()> {
    let _ = rustix::fs::unlinkat(dir, TEMP_NAME, AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        TEMP_NAME,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    let mut file = std::fs::File::from(fd);
    std::io::copy(data, &mut file)?;
    rustix::fs::fchmod(file.as_fd(), Mode::from_raw_mode(mode))?;
    let time = rustix::fs::Timespec {
        tv_sec: mtime as i64,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: time,
        last_modification: time,
    };
    rustix::fs::futimens(file.as_fd(), &times)?;
    Ok(())
}

/// Removes `name` in `dir`, a directory with everything beneath it.
fn remove(dir: &OwnedFd, name: &std::ffi::OsStr, applied: &mut Applied) -> std::io::Result<()> {
    let kind = existing(dir, name).map(|s| rustix::fs::FileType::from_raw_mode(s.st_mode));
    if kind == Some(rustix::fs::FileType::Directory) {
        let sub = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let names: Vec<std::ffi::OsString> = rustix::fs::Dir::read_from(&sub)?
            .filter_map(|e| e.ok())
            .map(|e| {
                use std::os::unix::ffi::OsStrExt;
                std::ffi::OsStr::from_bytes(e.file_name().to_bytes()).to_os_string()
            })
            .filter(|n| n != "." && n != "..")
            .collect();
        for child in names {
            remove(&sub, &child, applied)?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    applied.deleted += 1;
    Ok(())
}

/// Deletes what the host has beneath `rel` and the guest's tree no longer holds.
fn delete_missing(
    root: &OwnedFd,
    rel: &Path,
    present: &BTreeSet<PathBuf>,
    applied: &mut Applied,
) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let dir = rustix::fs::openat2(
        root,
        if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        },
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )?;
    let names: Vec<std::ffi::OsString> = rustix::fs::Dir::read_from(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| std::ffi::OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != ".." && n != TEMP_NAME)
        .collect();
    for name in names {
        let path = rel.join(&name);
        if !present.contains(&path) {
            remove(&dir, &name, applied)?;
            continue;
        }
        let kind = existing(&dir, &name).map(|s| rustix::fs::FileType::from_raw_mode(s.st_mode));
        if kind == Some(rustix::fs::FileType::Directory) {
            delete_missing(root, &path, present, applied)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_leaving_the_grant_are_not_cleaned_into_it() {
        assert_eq!(clean(Path::new("a/./b")), Some(PathBuf::from("a/b")));
        assert_eq!(clean(Path::new("../etc/passwd")), None);
        assert_eq!(clean(Path::new("a/../../x")), None);
        assert_eq!(clean(Path::new("/etc/passwd")), None);
    }
}
