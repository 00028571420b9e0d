//! Safe file operations in a directory tree whose contents are untrusted (a sandbox wrote
//! them): a session's directory ([`crate::session_files`]) or a live sandbox's root file
//! system, seen from the host through a descriptor of its root.
//!
//! Every path is opened beneath the tree's root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so a symlink a tool planted is never
//! followed and nothing outside the root is reached (mount points inside it are crossed:
//! they are the sandbox's own). Copies out ([`FileTree::read_file`], [`FileTree::download`])
//! take regular files and directories only: a symlink, device, FIFO, socket or hard-linked
//! file (a link count above one) refuses the copy, checked on the open descriptor. Copies in
//! write each file under a temporary name and rename it into place, so an existing file
//! (perhaps a hard link the tool made) is replaced, never written through. Every copy is
//! bounded by the tree's transfer limit and by [`MAX_ENTRIES`]; contents are copied byte for
//! byte; setuid and setgid bits never cross. Entries made in a tree with an owner
//! ([`FileTree::with_owner`]) are given to it, so the sandbox's user can change them.
//!
//! Paths are relative to the root, made only of normal components (`.` is skipped; `..`, a
//! root or an empty name are refused); the embedder's own paths (the upload source, the
//! download destination) are its own business and may be anywhere.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;
use sandbox_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::workspace::{
    bits, clear_dir, list, lstat_at, open_beneath, open_dir, open_file_at, random_hex, replace,
    size, split,
};

/// The most entries (files and directories) one upload or download copies.
pub const MAX_ENTRIES: usize = 100_000;

/// What one copy moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Regular files copied.
    pub files: u64,
    /// Directories created (the top one included).
    pub dirs: u64,
    /// Bytes of file contents copied.
    pub bytes: u64,
}

/// The kind of a directory entry, as `lstat` sees it (symlinks are not followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by session copies).
    Symlink,
    /// A device, FIFO or socket.
    Other,
}

/// One entry of [`FileTree::list`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name (non-UTF-8 bytes replaced by U+FFFD).
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Its size in bytes (`st_size`).
    pub size: u64,
    /// Its permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

/// A directory tree with untrusted contents, and the transfer limit of one copy. See the
/// module docs.
#[derive(Debug)]
pub struct FileTree {
    root: OwnedFd,
    max_transfer: u64,
    owner: Option<(u32, u32)>,
}

/// A relative path of normal components; `.` components are dropped.
fn clean(rel: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for part in rel.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            _ => {
                return Err(Error::invalid(format!(
                    "invalid path {}: only names below the session's directory (no '..', no root)",
                    rel.display()
                )))
            }
        }
    }
    Ok(out)
}

/// The error for an I/O failure on the session path `rel`: the common cases named.
fn file_error(rel: &Path, e: io::Error) -> Error {
    let shown = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOENT) => Error::invalid(format!("not found: {}", shown.display())),
        Some(Errno::LOOP) | Some(Errno::XDEV) => Error::invalid(format!(
            "not a regular file: {} (a symlink on the way: session copies never follow symlinks)",
            shown.display()
        )),
        Some(Errno::ISDIR) => Error::invalid(format!("is a directory: {}", shown.display())),
        Some(Errno::NOTDIR) => {
            Error::invalid(format!("not a directory on the way to {}", shown.display()))
        }
        // The session directory's size limit (a full tmpfs): typed, not an internal failure.
        Some(Errno::NOSPC) | Some(Errno::DQUOT) => Error::LimitExceeded {
            limit: sandbox_core::LimitKind::Disk,
        },
        _ => Error::internal(format!("session file {}", shown.display()), e),
    }
}

fn kind_of(stat: &Stat) -> FileKind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Dir,
        FileType::Symlink => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// Why a copy out refuses an entry of this kind, if it does.
fn refused_out(stat: &Stat) -> Option<&'static str> {
    match kind_of(stat) {
        FileKind::File if stat.st_nlink > 1 => {
            Some("a hard-linked file (session copies take files with one link only)")
        }
        FileKind::File | FileKind::Dir => None,
        FileKind::Symlink => Some("a symlink (session copies never follow symlinks)"),
        FileKind::Other => Some("a device, FIFO or socket"),
    }
}

/// Budget of one copy: bytes and entries left.
struct Budget {
    bytes: u64,
    entries: usize,
    limit: u64,
}

impl Budget {
    fn new(limit: u64) -> Self {
        Budget {
            bytes: limit,
            entries: MAX_ENTRIES,
            limit,
        }
    }

    fn entry(&mut self, path: &Path) -> Result<()> {
        self.entries = self.entries.checked_sub(1).ok_or_else(|| {
            Error::invalid(format!(
                "too many entries at {}: a copy takes at most {MAX_ENTRIES}",
                path.display()
            ))
        })?;
        Ok(())
    }

    fn take(&mut self, path: &Path, len: u64) -> Result<()> {
        self.bytes = self.bytes.checked_sub(len).ok_or_else(|| {
            Error::invalid(format!(
                "too large: {} (this copy moves at most {} bytes)",
                path.display(),
                self.limit
            ))
        })?;
        Ok(())
    }
}

/// One entry of a source tree, found before anything is written.
struct Planned {
    rel: PathBuf,
    dir: bool,
    len: u64,
    mode: u32,
}
impl FileTree {
    /// The tree under the directory `root` (a descriptor opened without following a
    /// symlink), each copy bounded by `max_transfer` bytes.
    pub fn new(root: OwnedFd, max_transfer: u64) -> FileTree {
        FileTree {
            root,
            max_transfer,
            owner: None,
        }
    }

    /// Gives every file and directory this tree makes to `uid`/`gid` (when this process
    /// may: as root). Default: whoever this process is.
    #[must_use]
    pub fn with_owner(mut self, uid: u32, gid: u32) -> FileTree {
        self.owner = Some((uid, gid));
        self
    }

    /// The root's descriptor.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// The most bytes one copy moves.
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// Opens the directory `rel` (never following a symlink on the way), e.g. to watch it.
    ///
    /// # Errors
    /// Not found, not a directory, or a symlink on the way.
    pub fn open_dir(&self, rel: &Path) -> Result<OwnedFd> {
        let rel = clean(rel)?;
        open_dir(&self.root, &rel).map_err(|e| file_error(&rel, e))
    }

    /// Hands a new entry `name` in `dir` to the tree's owner, if it has one.
    fn own(&self, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
        if let Some((uid, gid)) = self.owner {
            rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }

    /// Opens the parent directory of `rel` (creating missing directories, mode 0755, when
    /// `create`) and returns it with the last name.
    fn parent_of<'a>(&self, rel: &'a Path, create: bool) -> Result<(OwnedFd, &'a OsStr)> {
        let (parent, name) = split(rel).map_err(|_| {
            Error::invalid("invalid path: it names the session's directory itself".to_string())
        })?;
        if create {
            let mut at = PathBuf::new();
            for part in parent.components() {
                at.push(part);
                let dir = open_dir(&self.root, at.parent().unwrap_or(Path::new("")))
                    .map_err(|e| file_error(&at, e))?;
                match rustix::fs::mkdirat(&dir, part.as_os_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) => self
                        .own(&dir, part.as_os_str())
                        .map_err(|e| file_error(&at, e))?,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(file_error(&at, e.into())),
                }
            }
        }
        let dir = open_dir(&self.root, parent).map_err(|e| file_error(parent, e))?;
        Ok((dir, name))
    }

    /// Writes `data` to the file `rel` (replacing a file there, never writing through it),
    /// creating missing parent directories. Mode 0644.
    pub fn write_file(&self, rel: &Path, data: &[u8]) -> Result<()> {
        let rel = clean(rel)?;
        Budget::new(self.max_transfer).take(&rel, data.len() as u64)?;
        let (dir, name) = self.parent_of(&rel, true)?;
        if let Some(stat) = lstat_at(&dir, name).map_err(|e| file_error(&rel, e))? {
            if kind_of(&stat) == FileKind::Dir {
                return Err(Error::invalid(format!("is a directory: {}", rel.display())));
            }
        }
        put_file(&dir, name, 0o644, self.owner, |out| out.write_all(data))
            .map_err(|e| file_error(&rel, e))
    }

    /// Reads the regular file `rel` (at most the transfer limit; more is an error).
    pub fn read_file(&self, rel: &Path) -> Result<Vec<u8>> {
        self.read_file_at_most(rel, self.max_transfer)
    }

    /// Reads the regular file `rel` when it holds at most `max` bytes (and at most the
    /// transfer limit). The size is checked on the open descriptor before anything is
    /// read, so a larger file costs no memory; a file that grows past the cap while read
    /// is refused too.
    pub fn read_file_at_most(&self, rel: &Path, max: u64) -> Result<Vec<u8>> {
        let rel = clean(rel)?;
        let max = max.min(self.max_transfer);
        let file = open_beneath(&self.root, &rel).map_err(|e| file_error(&rel, e))?;
        let stat = rustix::fs::fstat(&file).map_err(|e| file_error(&rel, e.into()))?;
        if kind_of(&stat) == FileKind::Dir {
            return Err(Error::invalid(format!("is a directory: {}", rel.display())));
        }
        if let Some(why) = refused_out(&stat) {
            return Err(Error::invalid(format!(
                "not a regular file: {} is {why}",
                rel.display()
            )));
        }
        let mut budget = Budget::new(max);
        budget.take(&rel, size(&stat))?;
        let mut data = Vec::with_capacity(usize::try_from(size(&stat)).unwrap_or(0));
        std::fs::File::from(file)
            .take(max.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| file_error(&rel, e))?;
        if data.len() as u64 > max {
            return Err(Error::invalid(format!(
                "too large: {} grew past {max} bytes while read",
                rel.display(),
            )));
        }
        Ok(data)
    }

    /// The entries of the directory `rel` (`""` for the top), sorted by name.
    pub fn list(&self, rel: &Path) -> Result<Vec<DirEntry>> {
        let rel = clean(rel)?;
        let dir = open_dir(&self.root, &rel).map_err(|e| file_error(&rel, e))?;
        let mut out = Vec::new();
        for name in list(&dir).map_err(|e| file_error(&rel, e))? {
            let Some(stat) = lstat_at(&dir, &name).map_err(|e| file_error(&rel, e))? else {
                continue;
            };
            if out.len() >= MAX_ENTRIES {
                return Err(Error::invalid(format!(
                    "too many entries in {}: a listing holds at most {MAX_ENTRIES}",
                    rel.display()
                )));
            }
            out.push(DirEntry {
                name: name.to_string_lossy().into_owned(),
                kind: kind_of(&stat),
                size: size(&stat),
                mode: bits(&stat),
            });
        }
        Ok(out)
    }

    /// The entry `rel` itself (a symlink is described, not followed; `""` is the root).
    pub fn stat(&self, rel: &Path) -> Result<DirEntry> {
        let rel = clean(rel)?;
        let stat = if rel.as_os_str().is_empty() {
            rustix::fs::fstat(&self.root).map_err(|e| file_error(&rel, e.into()))?
        } else {
            let (dir, name) = self.parent_of(&rel, false)?;
            lstat_at(&dir, name)
                .map_err(|e| file_error(&rel, e))?
                .ok_or_else(|| Error::invalid(format!("not found: {}", rel.display())))?
        };
        Ok(DirEntry {
            name: rel
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind: kind_of(&stat),
            size: size(&stat),
            mode: bits(&stat),
        })
    }

    /// Makes the directory `rel` (mode 0755); with `parents`, also the missing ones above
    /// it, and an existing directory is no error.
    pub fn mkdir(&self, rel: &Path, parents: bool) -> Result<()> {
        let rel = clean(rel)?;
        let (dir, name) = self.parent_of(&rel, parents)?;
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => self.own(&dir, name).map_err(|e| file_error(&rel, e)),
            Err(Errno::EXIST) if parents => match lstat_at(&dir, name) {
                Ok(Some(stat)) if kind_of(&stat) == FileKind::Dir => Ok(()),
                _ => Err(Error::invalid(format!("exists: {}", rel.display()))),
            },
            Err(Errno::EXIST) => Err(Error::invalid(format!("exists: {}", rel.display()))),
            Err(e) => Err(file_error(&rel, e.into())),
        }
    }

    /// Renames `from` to `to` (a file, symlink or directory; the names are moved, nothing
    /// is followed). An existing file at `to` is replaced; a directory only by a directory
    /// and only when empty.
    pub fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let (from, to) = (clean(from)?, clean(to)?);
        let (from_dir, from_name) = self.parent_of(&from, false)?;
        let (to_dir, to_name) = self.parent_of(&to, false)?;
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(|e| match e {
            Errno::NOTEMPTY | Errno::EXIST => Error::invalid(format!(
                "cannot rename {} to {}: a directory that is not empty is there",
                from.display(),
                to.display()
            )),
            e => file_error(&from, e.into()),
        })
    }

    /// Removes the file, symlink or directory tree `rel` (never following a symlink).
    pub fn remove(&self, rel: &Path) -> Result<()> {
        let rel = clean(rel)?;
        let (dir, name) = self.parent_of(&rel, false)?;
        let Some(stat) = lstat_at(&dir, name).map_err(|e| file_error(&rel, e))? else {
            return Err(Error::invalid(format!("not found: {}", rel.display())));
        };
        let removed = if kind_of(&stat) == FileKind::Dir {
            open_dir(&dir, Path::new(name))
                .and_then(|sub| clear_dir(&sub))
                .and_then(|()| Ok(rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)?))
        } else {
            rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(io::Error::from)
        };
        removed.map_err(|e| file_error(&rel, e))
    }

    /// Copies the embedder's file or directory `host` to `rel`. The whole source is
    /// checked first (regular files and directories only, within the limits), so a bad
    /// source writes nothing. A file replaces a file at `rel`; a directory is merged into a
    /// directory at `rel` (its files replacing those of the same name). Permission bits are
    /// kept without setuid, setgid and sticky.
    pub fn upload(&self, host: &Path, rel: &Path) -> Result<Transfer> {
        let rel = clean(rel)?;
        let source = open_host(host)?;
        let stat = rustix::fs::fstat(&source).map_err(|e| host_error(host, e.into()))?;
        let mut budget = Budget::new(self.max_transfer);
        let plan = plan_tree(&source, &stat, &mut budget, host)?;
        let top_is_dir = kind_of(&stat) == FileKind::Dir;
        if rel.as_os_str().is_empty() && !top_is_dir {
            return Err(Error::invalid(
                "invalid path: a file cannot replace the session's directory".to_string(),
            ));
        }
        let mut done = Transfer::default();
        let write = |p: &Planned, done: &mut Transfer| -> Result<()> {
            let dest = rel.join(&p.rel);
            if p.dir {
                if dest.as_os_str().is_empty() {
                    return Ok(());
                }
                let (dir, name) = self.parent_of(&dest, true)?;
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(p.mode & 0o777)) {
                    Ok(()) => {
                        self.own(&dir, name).map_err(|e| file_error(&dest, e))?;
                        done.dirs += 1;
                    }
                    Err(Errno::EXIST) => {
                        let stat = lstat_at(&dir, name).map_err(|e| file_error(&dest, e))?;
                        if stat.as_ref().map(kind_of) != Some(FileKind::Dir) {
                            return Err(Error::invalid(format!(
                                "not a directory: {} (an upload merges directories only into directories)",
                                dest.display()
                            )));
                        }
                    }
                    Err(e) => return Err(file_error(&dest, e.into())),
                }
                return Ok(());
            }
            let (dir, name) = self.parent_of(&dest, true)?;
            if let Some(stat) = lstat_at(&dir, name).map_err(|e| file_error(&dest, e))? {
                if kind_of(&stat) == FileKind::Dir {
                    return Err(Error::invalid(format!(
                        "is a directory: {}",
                        dest.display()
                    )));
                }
            }
            let from = host.join(&p.rel);
            let input = if p.rel.as_os_str().is_empty() {
                source.try_clone().map_err(|e| host_error(host, e))?
            } else {
                open_dir_beneath_file(&source, &p.rel).map_err(|e| host_error(&from, e))?
            };
            let len = p.len;
            put_file(&dir, name, p.mode & 0o777, self.owner, |out| {
                let copied = io::copy(&mut std::fs::File::from(input).take(len + 1), out)?;
                if copied != len {
                    return Err(io::Error::other("the source changed during the upload"));
                }
                Ok(())
            })
            .map_err(|e| file_error(&dest, e))?;
            done.files += 1;
            done.bytes += len;
            Ok(())
        };
        for p in &plan {
            write(p, &mut done)?;
        }
        Ok(done)
    }

    /// Copies the file or directory `rel` out to the embedder's path `host`, which must not
    /// exist yet (nothing of the embedder's is overwritten). The whole tree is checked
    /// first: a symlink, device, FIFO, socket or hard-linked file anywhere refuses the
    /// download before anything is written; files are checked again when opened. On error
    /// what was written is removed. Permission bits are kept without setuid, setgid and
    /// sticky.
    pub fn download(&self, rel: &Path, host: &Path) -> Result<Transfer> {
        let rel = clean(rel)?;
        let top = if rel.as_os_str().is_empty() {
            open_dir(&self.root, &rel)
        } else {
            open_beneath(&self.root, &rel)
        }
        .map_err(|e| file_error(&rel, e))?;
        let stat = rustix::fs::fstat(&top).map_err(|e| file_error(&rel, e.into()))?;
        let mut budget = Budget::new(self.max_transfer);
        let plan = plan_tree(&top, &stat, &mut budget, &rel)?;
        if std::fs::symlink_metadata(host).is_ok() {
            return Err(Error::invalid(format!(
                "download destination {} exists (a download never overwrites)",
                host.display()
            )));
        }
        let mut done = Transfer::default();
        let result = (|| -> Result<()> {
            for p in &plan {
                let dest = host.join(&p.rel);
                let dest = if p.rel.as_os_str().is_empty() {
                    host.to_path_buf()
                } else {
                    dest
                };
                if p.dir {
                    std::fs::create_dir(&dest).map_err(|e| host_error(&dest, e))?;
                    done.dirs += 1;
                    continue;
                }
                let input = if p.rel.as_os_str().is_empty() {
                    top.try_clone().map_err(|e| file_error(&rel, e))?
                } else {
                    open_dir_beneath_file(&top, &p.rel)
                        .map_err(|e| file_error(&rel.join(&p.rel), e))?
                };
                let stat = rustix::fs::fstat(&input).map_err(|e| file_error(&rel, e.into()))?;
                if let Some(why) = refused_out(&stat) {
                    return Err(Error::invalid(format!(
                        "not a regular file: {} is {why}",
                        rel.join(&p.rel).display()
                    )));
                }
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&dest)
                    .map_err(|e| host_error(&dest, e))?;
                let copied = io::copy(&mut std::fs::File::from(input).take(p.len), &mut out)
                    .map_err(|e| host_error(&dest, e))?;
                use std::os::unix::fs::PermissionsExt;
                out.set_permissions(std::fs::Permissions::from_mode(p.mode & 0o777))
                    .map_err(|e| host_error(&dest, e))?;
                done.files += 1;
                done.bytes += copied;
            }
            Ok(())
        })();
        if let Err(e) = result {
            let cleanup = if plan.first().is_some_and(|p| p.dir) {
                std::fs::remove_dir_all(host)
            } else {
                std::fs::remove_file(host)
            };
            if let Err(c) = cleanup {
                if c.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %host.display(), error = %c, "removing a failed download");
                }
            }
            return Err(e);
        }
        Ok(done)
    }
}

/// Opens the embedder's upload source (a file or a directory) without following a symlink
/// in its last component.
fn open_host(host: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        host,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| host_error(host, e.into()))
}

fn host_error(host: &Path, e: io::Error) -> Error {
    match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOENT) => Error::invalid(format!("not found: {}", host.display())),
        Some(Errno::LOOP) => Error::invalid(format!(
            "a symlink: {} (session copies never follow symlinks)",
            host.display()
        )),
        Some(Errno::ACCESS) | Some(Errno::PERM) | Some(Errno::ROFS) | Some(Errno::EXIST) => {
            Error::invalid(format!("host path {}: {e}", host.display()))
        }
        _ => Error::internal(format!("host path {}", host.display()), e),
    }
}

/// Opens the regular file `rel` beneath `root` for reading.
fn open_dir_beneath_file(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let (parent, name) = split(rel)?;
    let dir = open_dir(root, parent)?;
    open_file_at(&dir, name)
}

/// Every entry of the tree at `top` (`stat` its status; `shown` names it in errors),
/// parents first, checked against `budget`: regular files with one link and directories
/// only.
fn plan_tree(
    top: &OwnedFd,
    stat: &Stat,
    budget: &mut Budget,
    shown: &Path,
) -> Result<Vec<Planned>> {
    let refuse = |path: &Path, why: &str| {
        Error::invalid(format!("not a regular file: {} is {why}", path.display()))
    };
    if let Some(why) = refused_out(stat) {
        return Err(refuse(shown, why));
    }
    let mut out = Vec::new();
    budget.entry(shown)?;
    if kind_of(stat) == FileKind::File {
        budget.take(shown, size(stat))?;
        out.push(Planned {
            rel: PathBuf::new(),
            dir: false,
            len: size(stat),
            mode: bits(stat),
        });
        return Ok(out);
    }
    out.push(Planned {
        rel: PathBuf::new(),
        dir: true,
        len: 0,
        mode: bits(stat),
    });
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = open_dir(top, &rel).map_err(|e| file_error(&shown.join(&rel), e))?;
        for name in list(&dir).map_err(|e| file_error(&shown.join(&rel), e))? {
            let path = rel.join(&name);
            let Some(stat) =
                lstat_at(&dir, &name).map_err(|e| file_error(&shown.join(&path), e))?
            else {
                continue;
            };
            budget.entry(&shown.join(&path))?;
            if let Some(why) = refused_out(&stat) {
                return Err(refuse(&shown.join(&path), why));
            }
            let is_dir = kind_of(&stat) == FileKind::Dir;
            if is_dir {
                pending.push(path.clone());
            } else {
                budget.take(&shown.join(&path), size(&stat))?;
            }
            out.push(Planned {
                rel: path,
                dir: is_dir,
                len: size(&stat),
                mode: bits(&stat),
            });
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Writes a new file `name` in `dir` through `fill`, under a temporary name, synced, then
/// renamed over whatever is at `name` (replacing a file or symlink, never writing through
/// it). `mode` is applied without setuid, setgid and sticky bits; `owner` gets the file.
fn put_file(
    dir: &OwnedFd,
    name: &OsStr,
    mode: u32,
    owner: Option<(u32, u32)>,
    fill: impl FnOnce(&mut std::fs::File) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = format!(".strata-upload-{}.tmp", random_hex());
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut file = std::fs::File::from(fd);
    let owned = match owner {
        Some((uid, gid)) => rustix::fs::fchown(
            &file,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(io::Error::from),
        None => Ok(()),
    };
    let written = owned
        .and_then(|()| fill(&mut file))
        .and_then(|()| {
            Ok(rustix::fs::fchmod(
                &file,
                Mode::from_raw_mode(mode & 0o777),
            )?)
        })
        .and_then(|()| file.sync_all())
        .and_then(|()| {
            match rustix::fs::renameat_with(dir, tmp.as_str(), dir, name, RenameFlags::empty()) {
                Ok(()) => Ok(()),
                Err(_) => replace(dir, &tmp, name, false),
            }
        });
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    written
}
