//! The host side of a session's files: a private directory that every call of the session
//! mounts read-write, and safe copies in and out of it.
//!
//! [`SessionFiles::create`] makes `PARENT/strata-session-XXXXXXXXXXXXXXXX` (mode 0700, with
//! an owner-only `owner` file naming the embedder process, for sweeping after a crash) and
//! in it the directory the runs see, `root`. The directory's name is random and unrelated
//! to the session's id (the handle a server gives out), so listing `PARENT` reveals no id. Everything the session's tools wrote is untrusted: every
//! path is opened beneath `root` with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, so a symlink the tool planted is never followed and nothing
//! outside `root` is reached. Copies out ([`SessionFiles::read_file`],
//! [`SessionFiles::download`]) take regular files and directories only: a symlink, device,
//! FIFO, socket or hard-linked file (a link count above one) refuses the copy, checked on the
//! open descriptor. Copies in write each file under a temporary name and rename it into
//! place, so an existing file (perhaps a hard link the tool made) is replaced, never written
//! through. Every copy is bounded by the session's transfer limit and by [`MAX_ENTRIES`];
//! contents are copied byte for byte; setuid and setgid bits never cross.
//!
//! Paths are relative to `root`, made only of normal components (`.` is skipped; `..`, a
//! root or an empty name are refused); the embedder's own paths (the upload source, the
//! download destination) are its own business and may be anywhere.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;
use sandbox_core::{ByteSize, Error, Result};
use serde::Serialize;

use crate::workspace::{
    bits, clear_dir, list, lstat_at, open_beneath, open_dir, open_file_at, open_private,
    random_hex, replace, size, split,
};

/// The most entries (files and directories) one upload or download copies.
pub const MAX_ENTRIES: usize = 100_000;

/// What one copy moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// Regular files copied.
    pub files: u64,
    /// Directories created (the top one included).
    pub dirs: u64,
    /// Bytes of file contents copied.
    pub bytes: u64,
}

/// The kind of a directory entry, as `lstat` sees it (symlinks are not followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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

/// One entry of [`SessionFiles::list`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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

/// A session's private directory on the host. Dropping it removes the directory and
/// everything in it (errors ignored; [`SessionFiles::destroy`] reports them).
#[derive(Debug)]
pub struct SessionFiles {
    id: String,
    base: PathBuf,
    root_path: PathBuf,
    root: OwnedFd,
    max_transfer: u64,
    /// The size of the tmpfs mounted on `root_path`, when one could be mounted.
    bounded: Option<u64>,
    removed: bool,
}

/// How a session directory's size is bounded ([`SessionFiles::disk_bound`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskBound {
    /// A tmpfs of this many bytes is mounted on the directory: every write into it, by a
    /// tool or by the host side, stops at its size (`ENOSPC`).
    Tmpfs(u64),
    /// The directory is on the host's file system: the embedder could not mount a
    /// size-limited one (only root can mount in the host's mount namespace).
    Unbounded,
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

impl SessionFiles {
    /// Creates the session directory under `parent` (`$TMPDIR` for most callers), writing
    /// `owner` (the embedder's `pid starttime`) to its `owner` file. `max_transfer` bounds
    /// each copy in or out. Without a size bound (see [`SessionFiles::create_bounded`]).
    pub fn create(parent: &Path, owner: &str, max_transfer: ByteSize) -> Result<SessionFiles> {
        Self::create_bounded(parent, owner, max_transfer, None)
    }

    /// [`SessionFiles::create`], with the directory the runs see on a tmpfs of `disk`
    /// bytes (and `disk / 4096` inodes, at least 1024) when `disk` is given and this process
    /// may mount one (root); otherwise on the host's file system ([`DiskBound::Unbounded`]).
    /// The tmpfs is unmounted when the session is removed (or swept after a crash).
    pub fn create_bounded(
        parent: &Path,
        owner: &str,
        max_transfer: ByteSize,
        disk: Option<ByteSize>,
    ) -> Result<SessionFiles> {
        use std::os::unix::fs::DirBuilderExt;
        let id = session_token()?;
        let base = crate::private::PrivateDir::new_in(parent, "strata-session-")
            .map_err(|e| {
                Error::internal(
                    format!("creating a session directory in {}", parent.display()),
                    e,
                )
            })?
            .keep();
        let root_path = base.join("root");
        let mut bounded = None;
        let made = crate::private::write(&base.join("owner"), owner)
            .and_then(|()| std::fs::DirBuilder::new().mode(0o755).create(&root_path))
            .and_then(|()| {
                if let Some(disk) = disk {
                    bounded = mount_bound(&root_path, disk.bytes());
                }
                open_private(&root_path)
            });
        match made {
            Ok(root) => Ok(SessionFiles {
                id,
                base,
                root_path,
                root,
                max_transfer: max_transfer.bytes(),
                bounded,
                removed: false,
            }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&base);
                Err(Error::internal(
                    format!("creating the session directory {}", base.display()),
                    e,
                ))
            }
        }
    }

    /// 32 hex digits (128 random bits from the OS); unguessable and not the directory's
    /// name, so a server may hand it out as a handle (compare it with
    /// [`sandbox_core::token::same`]).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The directory the session's runs mount read-write.
    pub fn path(&self) -> &Path {
        &self.root_path
    }

    /// The most bytes one copy moves.
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    /// How the directory's size is bounded.
    pub fn disk_bound(&self) -> DiskBound {
        self.bounded.map_or(DiskBound::Unbounded, DiskBound::Tmpfs)
    }

    /// Whether the directory is bounded and has no room left.
    pub fn is_full(&self) -> bool {
        self.bounded.is_some()
            && rustix::fs::fstatvfs(&self.root).is_ok_and(|s| s.f_bavail == 0 || s.f_favail == 0)
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
                    Ok(()) | Err(Errno::EXIST) => {}
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
        put_file(&dir, name, 0o644, |out| out.write_all(data)).map_err(|e| file_error(&rel, e))
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
                    Ok(()) => done.dirs += 1,
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
            put_file(&dir, name, p.mode & 0o777, |out| {
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

    /// Removes the session directory and everything in it.
    pub fn destroy(mut self) -> Result<()> {
        self.remove_all()
    }

    fn remove_all(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        let cleared = if self.bounded.is_some() {
            // The tmpfs goes with its contents; nothing of it is left on the host's disk.
            rustix::mount::unmount(
                &self.root_path,
                rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
            )
            .map_err(io::Error::from)
        } else {
            clear_dir(&self.root)
        };
        cleared
            .and_then(|()| std::fs::remove_dir_all(&self.base))
            .map_err(|e| Error::internal(format!("removing {}", self.base.display()), e))
    }
}

impl Drop for SessionFiles {
    fn drop(&mut self) {
        if let Err(e) = self.remove_all() {
            tracing::warn!(error = %e, "session directory left behind");
        }
    }
}

/// Mounts a tmpfs of `bytes` on `dir` (not following a link there); its size when done,
/// `None` when this process may not mount (not root, or a container without the right).
fn mount_bound(dir: &Path, bytes: u64) -> Option<u64> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    let inodes = (bytes / 4096).max(1024);
    let Ok(data) = std::ffi::CString::new(format!("size={bytes},nr_inodes={inodes},mode=0755"))
    else {
        return None;
    };
    let flags = rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV;
    match rustix::mount::mount("strata-session", dir, "tmpfs", flags, data.as_c_str()) {
        Ok(()) => Some(bytes),
        Err(e) => {
            tracing::warn!(error = %e, dir = %dir.display(), "session directory not size-limited");
            None
        }
    }
}

/// 128 bits from the OS's random source, as 32 hex digits.
fn session_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::internal("reading the OS random source", io::Error::other(e)))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
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
/// it). `mode` is applied without setuid, setgid and sticky bits.
fn put_file(
    dir: &OwnedFd,
    name: &OsStr,
    mode: u32,
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
    let written = fill(&mut file)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn session(limit: &str) -> (tempfile::TempDir, SessionFiles) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let files =
            SessionFiles::create(tmp.path(), "1 1", limit.parse().expect("size")).expect("create");
        (tmp, files)
    }

    #[test]
    fn bytes_round_trip_exactly_including_nul_bytes() {
        let (_tmp, files) = session("1M");
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        files
            .write_file(Path::new("a/b/c.bin"), &data)
            .expect("write");
        assert_eq!(
            files.read_file(Path::new("./a/b/c.bin")).expect("read"),
            data
        );
        let names: Vec<String> = files
            .list(Path::new("a/b"))
            .expect("list")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["c.bin"]);
    }

    #[test]
    fn parent_dir_and_absolute_paths_are_refused() {
        let (_tmp, files) = session("1M");
        for bad in ["../x", "/etc/passwd", "a/../../x"] {
            let err = files.write_file(Path::new(bad), b"x").expect_err(bad);
            assert!(err.to_string().contains("invalid path"), "{bad}: {err}");
        }
    }

    #[test]
    fn planted_symlink_is_never_followed_by_read_write_or_download() {
        let (tmp, files) = session("1M");
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, "host secret").expect("secret");
        std::os::unix::fs::symlink(&secret, files.path().join("link")).expect("link");
        std::os::unix::fs::symlink(tmp.path(), files.path().join("dirlink")).expect("link");
        let err = files
            .read_file(Path::new("link"))
            .expect_err("read through link");
        assert!(err.to_string().contains("symlink"), "{err}");
        files
            .read_file(Path::new("dirlink/secret"))
            .expect_err("read through dir link");
        files
            .write_file(Path::new("dirlink/secret"), b"overwritten")
            .expect_err("write through dir link");
        files
            .write_file(Path::new("link"), b"replaced")
            .expect("write replaces the link");
        assert_eq!(
            std::fs::read_to_string(&secret).expect("secret"),
            "host secret"
        );
        assert!(files
            .path()
            .join("link")
            .symlink_metadata()
            .expect("meta")
            .is_file());
        let err = files
            .download(Path::new(""), &tmp.path().join("out"))
            .expect_err("download with link");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(!tmp.path().join("out").exists(), "nothing written");
    }

    #[test]
    fn hard_linked_file_and_fifo_are_refused_on_the_way_out() {
        let (tmp, files) = session("1M");
        files.write_file(Path::new("f"), b"x").expect("write");
        std::fs::hard_link(files.path().join("f"), files.path().join("g")).expect("link");
        let err = files.read_file(Path::new("g")).expect_err("hard link");
        assert!(err.to_string().contains("hard-linked"), "{err}");
        std::fs::remove_file(files.path().join("g")).expect("rm");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            files.path().join("p"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("fifo");
        let err = files.read_file(Path::new("p")).expect_err("fifo");
        assert!(err.to_string().contains("FIFO"), "{err}");
        files
            .download(Path::new(""), &tmp.path().join("out"))
            .expect_err("fifo in tree");
        assert!(!tmp.path().join("out").exists());
    }

    #[test]
    fn transfers_over_the_limit_are_refused_before_writing() {
        let (tmp, files) = session("1K");
        files
            .write_file(Path::new("big"), &[0u8; 2048])
            .expect_err("over");
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).expect("mkdir");
        std::fs::write(src.join("a"), [1u8; 600]).expect("a");
        std::fs::write(src.join("b"), [2u8; 600]).expect("b");
        let err = files.upload(&src, Path::new("up")).expect_err("over");
        assert!(err.to_string().contains("too large"), "{err}");
        assert!(
            files.list(Path::new("")).expect("list").is_empty(),
            "nothing written"
        );
    }

    #[test]
    fn directory_upload_and_download_round_trip_without_setuid() {
        use std::os::unix::fs::PermissionsExt;
        let (tmp, files) = session("1M");
        let src = tmp.path().join("src");
        std::fs::create_dir_all(src.join("sub/deeper")).expect("mkdir");
        std::fs::write(src.join("sub/deeper/x"), b"\0x\0").expect("x");
        std::fs::write(src.join("run"), b"#!/bin/sh\n").expect("run");
        std::fs::set_permissions(src.join("run"), std::fs::Permissions::from_mode(0o4755))
            .expect("chmod");
        let up = files.upload(&src, Path::new("in")).expect("upload");
        assert_eq!((up.files, up.bytes), (2, 13));
        let mode = files
            .path()
            .join("in/run")
            .metadata()
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        let down = files
            .download(Path::new("in"), &tmp.path().join("out"))
            .expect("download");
        assert_eq!(down.files, 2);
        assert_eq!(
            std::fs::read(tmp.path().join("out/sub/deeper/x")).expect("x"),
            b"\0x\0"
        );
        files
            .download(Path::new("in"), &tmp.path().join("out"))
            .expect_err("exists");
    }

    #[test]
    fn destroy_removes_everything_even_unwritable_directories() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let files = SessionFiles::create(tmp.path(), "1 1", ByteSize::mib(1)).expect("create");
        files.write_file(Path::new("d/f"), b"x").expect("write");
        std::fs::set_permissions(
            files.path().join("d"),
            std::fs::Permissions::from_mode(0o500),
        )
        .expect("chmod");
        files.destroy().expect("destroy");
        assert_eq!(std::fs::read_dir(tmp.path()).expect("ls").count(), 0);
    }
}
