//! Safe extraction of image layers (tar streams) into one directory tree.
//!
//! A layer is hostile input. Every entry is created relative to the tree's root directory
//! fd; nothing is ever opened by a host path string:
//! - entry names that are absolute or contain `..` are refused (the whole image is refused);
//! - parent directories are resolved with `openat2(RESOLVE_IN_ROOT)`, so a symlink planted
//!   by an earlier entry (even an absolute one, `etc -> /etc`) resolves *inside* the tree,
//!   never on the host; the final component is never followed (an existing entry is
//!   removed and the new one created with `O_EXCL | O_NOFOLLOW`);
//! - symlinks are kept verbatim: inside the sandbox they resolve in the image's root;
//! - hard links may only name an entry of the tree (no absolute or `..` names), resolved
//!   the same way, and never a directory;
//! - device nodes and FIFOs are skipped (the sandbox's `/dev` is Strata's own), counted in
//!   the [`Report`];
//! - setuid, setgid and sticky bits are dropped from files, ownership is not restored
//!   (everything belongs to the unpacking user), extended attributes (file capabilities)
//!   are ignored;
//! - OCI whiteouts (`.wh.NAME`) remove `NAME` from the layers below, opaque markers
//!   (`.wh..wh..opq`) empty the directory of what the layers below put there;
//! - total bytes and entries are capped ([`Limits`]) against decompression bombs.

use std::collections::HashSet;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps};

/// Caps on what one image may unpack to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Bytes of file data across all layers. Default: 16 GiB.
    pub max_bytes: u64,
    /// Entries across all layers. Default: 2 million.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 16 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// What unpacking did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Entries created (files, directories, links).
    pub entries: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// Device nodes skipped.
    pub skipped_devices: u64,
    /// FIFOs and other special entries skipped.
    pub skipped_other: u64,
    /// Whiteouts and opaque markers applied.
    pub whiteouts: u64,
}

/// Why a layer was refused.
#[derive(Debug)]
pub struct UnpackError {
    /// The entry's name in the layer (empty when the layer itself is unreadable).
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for UnpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.entry.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "entry {:?}: {}", self.entry, self.reason)
        }
    }
}

impl std::error::Error for UnpackError {}

fn refuse(entry: &str, reason: impl Into<String>) -> UnpackError {
    UnpackError {
        entry: entry.to_string(),
        reason: reason.into(),
    }
}

/// Normalizes an entry name: strips `./`, refuses absolute names and `..`.
pub fn clean_name(name: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::new();
    for component in name.components() {
        match component {
            Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::Prefix(_) => {
                return Err("absolute names are refused".into())
            }
            Component::ParentDir => return Err("names containing '..' are refused".into()),
        }
    }
    Ok(out)
}

const IN_ROOT: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// Opens directory `rel` of the tree, resolving symlinks inside the tree only.
fn open_dir(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        IN_ROOT,
    )?)
}

/// Opens directory `rel`, creating missing components (mode 0755) inside the tree.
fn ensure_dir(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    match open_dir(root, rel) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => return other,
    }
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return open_dir(root, rel);
    };
    let parent_fd = ensure_dir(root, parent)?;
    match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(rustix::fs::openat2(
        &parent_fd,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )?)
}

/// Removes `name` in `dir` (recursively for a directory), never following symlinks.
pub fn remove_at(dir: &OwnedFd, name: &Path) -> io::Result<()> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory {
        let child = rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
        )?;
        // The owner may have dropped its own write bit; it is ours to remove.
        let _ = rustix::fs::fchmod(&child, Mode::from_raw_mode(0o700));
        empty_dir(&child, &|_| false)?;
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    }
    Ok(())
}

/// Removes every child of `dir` for which `keep` is false.
fn empty_dir(dir: &OwnedFd, keep: &dyn Fn(&Path) -> bool) -> io::Result<()> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(PathBuf::from(std::ffi::OsStr::from_bytes(name)));
    }
    for name in names {
        if !keep(&name) {
            remove_at(dir, &name)?;
        }
    }
    Ok(())
}

/// Applies an opaque marker in `dir` (at `rel`): removes what lower layers put there,
/// keeping what this layer already created.
fn opaque(dir: &OwnedFd, rel: &Path, created: &HashSet<PathBuf>) -> io::Result<()> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(PathBuf::from(std::ffi::OsStr::from_bytes(name)));
    }
    for name in names {
        let path = rel.join(&name);
        if !created.contains(&path) {
            remove_at(dir, &name)?;
            continue;
        }
        let stat = rustix::fs::statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory {
            let child = rustix::fs::openat2(
                dir,
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
            )?;
            opaque(&child, &path, created)?;
        }
    }
    Ok(())
}

fn timestamps(mtime: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(0),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// Unpacks one layer (an uncompressed tar stream) on top of the tree at `root`.
pub fn unpack_layer(
    root: &OwnedFd,
    reader: impl Read,
    limits: Limits,
    report: &mut Report,
) -> Result<(), UnpackError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| refuse("", format!("not a tar stream: {e}")))?;
    let mut created: HashSet<PathBuf> = HashSet::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| refuse("", format!("corrupt layer: {e}")))?;
        let raw_name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let name = entry
            .path()
            .map_err(|e| refuse(&raw_name, format!("bad name: {e}")))?;
        let rel = clean_name(&name).map_err(|why| refuse(&raw_name, why))?;
        let (Some(parent), Some(file_name)) = (rel.parent(), rel.file_name()) else {
            continue; // the layer's root itself
        };
        let (parent, file_name) = (parent.to_path_buf(), PathBuf::from(file_name));
        report.entries += 1;
        if report.entries > limits.max_entries {
            return Err(refuse(
                &raw_name,
                format!("the image has more than {} entries", limits.max_entries),
            ));
        }
        let os_err = |what: &str, e: io::Error| refuse(&raw_name, format!("{what}: {e}"));

        // Whiteouts.
        let file_str = file_name.to_string_lossy();
        if let Some(hidden) = file_str.strip_prefix(".wh.") {
            report.whiteouts += 1;
            let dir = match open_dir(root, &parent) {
                Ok(dir) => dir,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(os_err("open whiteout's directory", e)),
            };
            if hidden == ".wh..opq" {
                opaque(&dir, &parent, &created).map_err(|e| os_err("opaque directory", e))?;
            } else if !hidden.is_empty() && !hidden.contains('/') {
                let target = parent.join(hidden);
                if !created.contains(&target) {
                    remove_at(&dir, Path::new(hidden)).map_err(|e| os_err("whiteout", e))?;
                }
            }
            continue;
        }

        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().unwrap_or(0o644);
        let mtime = header.mtime().unwrap_or(0);
        let dir = ensure_dir(root, &parent).map_err(|e| {
            os_err(
                "open parent directory (it must be a directory of the image)",
                e,
            )
        })?;
        match kind {
            tar::EntryType::Directory => {
                let exists = rustix::fs::statat(&dir, &file_name, AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .map(|s| rustix::fs::FileType::from_raw_mode(s.st_mode));
                if exists != Some(rustix::fs::FileType::Directory) {
                    remove_at(&dir, &file_name).map_err(|e| os_err("replace", e))?;
                    rustix::fs::mkdirat(&dir, &file_name, Mode::from_raw_mode(0o700))
                        .map_err(|e| os_err("mkdir", e.into()))?;
                }
                let perm = (mode & 0o1777) | 0o700;
                rustix::fs::chmodat(
                    &dir,
                    &file_name,
                    Mode::from_raw_mode(perm),
                    AtFlags::empty(),
                )
                .map_err(|e| os_err("chmod", e.into()))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                remove_at(&dir, &file_name).map_err(|e| os_err("replace", e))?;
                let file = rustix::fs::openat(
                    &dir,
                    &file_name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| os_err("create", e.into()))?;
                let mut out = std::fs::File::from(file);
                let room = limits.max_bytes.saturating_sub(report.bytes);
                let copied = io::copy(&mut (&mut entry).take(room.saturating_add(1)), &mut out)
                    .map_err(|e| os_err("write", e))?;
                report.bytes += copied;
                if copied > room {
                    return Err(refuse(
                        &raw_name,
                        format!("the image unpacks to more than {} bytes", limits.max_bytes),
                    ));
                }
                let perm = (mode & 0o777) | 0o400;
                rustix::fs::fchmod(out.as_fd(), Mode::from_raw_mode(perm))
                    .map_err(|e| os_err("chmod", e.into()))?;
                let _ = rustix::fs::futimens(out.as_fd(), &timestamps(mtime));
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| os_err("symlink target", e))?
                    .ok_or_else(|| refuse(&raw_name, "symlink without a target"))?
                    .into_owned();
                remove_at(&dir, &file_name).map_err(|e| os_err("replace", e))?;
                rustix::fs::symlinkat(&target, &dir, &file_name)
                    .map_err(|e| os_err("symlink", e.into()))?;
                let _ = rustix::fs::utimensat(
                    &dir,
                    &file_name,
                    &timestamps(mtime),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| os_err("hard link target", e))?
                    .ok_or_else(|| refuse(&raw_name, "hard link without a target"))?;
                let target = clean_name(&target)
                    .map_err(|why| refuse(&raw_name, format!("hard link target: {why}")))?;
                let (Some(t_parent), Some(t_name)) = (target.parent(), target.file_name()) else {
                    return Err(refuse(&raw_name, "hard link to the image root"));
                };
                let t_dir = open_dir(root, t_parent).map_err(|e| {
                    os_err("hard link target must be an earlier entry of the image", e)
                })?;
                let stat =
                    rustix::fs::statat(&t_dir, t_name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
                        os_err(
                            "hard link target must be an earlier entry of the image",
                            e.into(),
                        )
                    })?;
                if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                    == rustix::fs::FileType::Directory
                {
                    return Err(refuse(&raw_name, "hard link to a directory"));
                }
                if target == rel {
                    continue;
                }
                remove_at(&dir, &file_name).map_err(|e| os_err("replace", e))?;
                rustix::fs::linkat(&t_dir, t_name, &dir, &file_name, AtFlags::empty())
                    .map_err(|e| os_err("hard link", e.into()))?;
            }
            tar::EntryType::Char | tar::EntryType::Block => {
                report.skipped_devices += 1;
                continue;
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            _ => {
                report.skipped_other += 1;
                continue;
            }
        }
        created.insert(rel);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_dotdot_or_absolute_are_refused() {
        assert_eq!(
            clean_name(Path::new("./usr/bin/x")).expect("clean"),
            Path::new("usr/bin/x")
        );
        assert!(clean_name(Path::new("../escape")).is_err());
        assert!(clean_name(Path::new("usr/../../escape")).is_err());
        assert!(clean_name(Path::new("/abs")).is_err());
        assert_eq!(clean_name(Path::new("./")).expect("root"), Path::new(""));
    }
}
