//! A live microVM sandbox's files, for the supervisor: each operation is one request to the
//! guest agent ([`GuestFileOp`]), large files go in chunks, and trees are copied one entry
//! at a time. The rules of the process backend's file trees hold where they matter to the
//! host: the guest's symlinks are never followed (the agent uses `lstat` and `O_NOFOLLOW`,
//! and a tree copy skips links), only regular files and directories are copied out, a
//! download's host path must not exist and everything it makes there is new
//! (`create_new`, owner-only until the copy is done), and every copy is bounded.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sandbox_agent::protocol::{GuestEntry, GuestFileOp, GuestFileResult, HostMsg, CHUNK};
use sandbox_core::{Error, Result};
use sandbox_os::file_tree::{DirEntry, FileKind, Transfer, MAX_ENTRIES};

/// How long one file operation may take in the guest.
const OP_TIMEOUT: Duration = Duration::from_secs(120);

/// Bytes per read or write request.
const PIECE: u64 = CHUNK as u64;

/// Answers of file operations not yet taken, by id.
#[derive(Default)]
pub(crate) struct Answers {
    done: Mutex<HashMap<u64, Option<GuestFileResult>>>,
    changed: Condvar,
}

impl Answers {
    /// Records the agent's answer to operation `id` (if someone waits for it).
    pub(crate) fn answer(&self, id: u64, result: GuestFileResult) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = done.get_mut(&id) {
            *slot = Some(result);
        }
        drop(done);
        self.changed.notify_all();
    }

    /// Wakes every waiter (the agent is gone).
    pub(crate) fn wake(&self) {
        self.changed.notify_all();
    }
}

/// A handle on a live VM's files that can leave the supervisor's lock on the sandbox.
#[derive(Clone)]
pub struct VmFiles {
    pub(crate) writer: Arc<Mutex<UnixStream>>,
    pub(crate) answers: Arc<Answers>,
    pub(crate) next: Arc<AtomicU64>,
    /// Whether the agent is gone.
    pub(crate) gone: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for VmFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmFiles").finish_non_exhaustive()
    }
}

impl VmFiles {
    fn call(&self, op: GuestFileOp, path: &str) -> Result<GuestFileResult> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.answers
            .done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, None);
        let sent = crate::live::send_frame(&self.writer, &HostMsg::File { id, op });
        let deadline = Instant::now() + OP_TIMEOUT;
        let mut done = self.answers.done.lock().unwrap_or_else(|e| e.into_inner());
        let answer = loop {
            if sent.is_err() || (self.gone)() || Instant::now() >= deadline {
                break None;
            }
            if let Some(Some(answer)) = done.get_mut(&id).map(Option::take) {
                break Some(answer);
            }
            done = self
                .answers
                .changed
                .wait_timeout(done, Duration::from_millis(200))
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        };
        done.remove(&id);
        drop(done);
        match answer {
            Some(GuestFileResult::Failed { errno, message }) => Err(failed(path, errno, &message)),
            Some(result) => Ok(result),
            None => Err(Error::internal(
                format!("the guest did not answer a file operation on {path}"),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            )),
        }
    }

    /// A regular file's contents, at most `max` bytes (more is refused).
    ///
    /// # Errors
    /// Not found, not a regular file, larger than `max`, or the VM is gone.
    pub fn read_file(&self, path: &str, max: u64) -> Result<Vec<u8>> {
        let entry = self.stat(path)?;
        if entry.kind != FileKind::File {
            return Err(Error::invalid(format!("not a regular file: {path}")));
        }
        if entry.size > max {
            return Err(Error::invalid(format!(
                "{path} is {} bytes, more than the {max} one read carries (download it)",
                entry.size
            )));
        }
        let mut data = Vec::with_capacity(entry.size as usize);
        loop {
            let op = GuestFileOp::Read {
                path: path.into(),
                offset: data.len() as u64,
                len: PIECE,
            };
            match self.call(op, path)? {
                GuestFileResult::Data { data: piece } if piece.is_empty() => break,
                GuestFileResult::Data { data: piece } => {
                    data.extend_from_slice(&piece);
                    if data.len() as u64 > max {
                        return Err(Error::invalid(format!("{path} grew past {max} bytes")));
                    }
                }
                other => return Err(unexpected(path, &other)),
            }
        }
        Ok(data)
    }

    /// Replaces (or creates) a file with `data`, written under a temporary name and renamed
    /// into place; missing parents are made.
    ///
    /// # Errors
    /// As the guest's `open`, `write` and `rename`.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.write_mode(path, data, 0o644)
    }

    fn write_mode(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        let temp = format!("{path}.strata-{}", self.next.fetch_add(1, Ordering::SeqCst));
        let mut offset = 0usize;
        loop {
            let end = (offset + PIECE as usize).min(data.len());
            let op = GuestFileOp::Write {
                path: temp.clone(),
                offset: offset as u64,
                data: data[offset..end].to_vec(),
                mode,
            };
            self.call(op, path)?;
            offset = end;
            if offset >= data.len() {
                break;
            }
        }
        let renamed = self.call(
            GuestFileOp::Rename {
                from: temp.clone(),
                to: path.into(),
            },
            path,
        );
        if renamed.is_err() {
            let _ = self.call(GuestFileOp::Remove { path: temp }, path);
        }
        renamed.map(drop)
    }

    /// A directory's entries, by name.
    ///
    /// # Errors
    /// Not found, not a directory, or the VM is gone.
    pub fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        match self.call(GuestFileOp::List { path: path.into() }, path)? {
            GuestFileResult::Entries { entries } => Ok(entries.into_iter().map(entry).collect()),
            other => Err(unexpected(path, &other)),
        }
    }

    /// One entry (a symlink is described, not followed).
    ///
    /// # Errors
    /// Not found, or the VM is gone.
    pub fn stat(&self, path: &str) -> Result<DirEntry> {
        match self.call(GuestFileOp::Stat { path: path.into() }, path)? {
            GuestFileResult::Entry { entry: e } => Ok(entry(e)),
            other => Err(unexpected(path, &other)),
        }
    }

    /// Makes a directory (`parents`: and missing parents; an existing one is fine then).
    ///
    /// # Errors
    /// It exists (without `parents`), a parent is missing, or the VM is gone.
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        let op = GuestFileOp::Mkdir {
            path: path.into(),
            parents,
            mode: 0,
        };
        self.call(op, path).map(drop)
    }

    /// Renames an entry.
    ///
    /// # Errors
    /// As the guest's `rename`.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let op = GuestFileOp::Rename {
            from: from.into(),
            to: to.into(),
        };
        self.call(op, from).map(drop)
    }

    /// Removes a file, symlink or directory tree.
    ///
    /// # Errors
    /// Not found, or the VM is gone.
    pub fn remove(&self, path: &str) -> Result<()> {
        self.call(GuestFileOp::Remove { path: path.into() }, path)
            .map(drop)
    }

    /// Copies the host's file or directory `host` to `path` in the guest: regular files and
    /// directories only (symlinks and devices on the host are skipped, never followed), at
    /// most `max` bytes and [`MAX_ENTRIES`] entries.
    ///
    /// # Errors
    /// The host path cannot be read, a limit is passed, or a guest operation fails.
    pub fn upload(&self, host: &Path, path: &str, max: u64) -> Result<Transfer> {
        let mut transfer = Transfer::default();
        self.upload_entry(host, path, max, &mut transfer)?;
        Ok(transfer)
    }

    fn upload_entry(&self, host: &Path, path: &str, max: u64, t: &mut Transfer) -> Result<()> {
        let meta = std::fs::symlink_metadata(host)
            .map_err(|e| Error::invalid(format!("upload: {}: {e}", host.display())))?;
        if t.files + t.dirs >= MAX_ENTRIES as u64 {
            return Err(Error::invalid(format!(
                "upload: more than {MAX_ENTRIES} entries"
            )));
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if meta.is_dir() {
            let op = GuestFileOp::Mkdir {
                path: path.into(),
                parents: true,
                mode,
            };
            self.call(op, path)?;
            t.dirs += 1;
            let mut names: Vec<_> = std::fs::read_dir(host)
                .map_err(|e| Error::invalid(format!("upload: {}: {e}", host.display())))?
                .flatten()
                .map(|e| e.file_name())
                .collect();
            names.sort();
            for name in names {
                let child = format!("{}/{}", path.trim_end_matches('/'), name.to_string_lossy());
                self.upload_entry(&host.join(&name), &child, max, t)?;
            }
        } else if meta.is_file() {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(host)
                .map_err(|e| Error::invalid(format!("upload: {}: {e}", host.display())))?;
            if t.bytes + meta.len() > max {
                return Err(Error::invalid(format!("upload: more than {max} bytes")));
            }
            // Piece by piece under a temporary name, renamed into place.
            let temp = format!("{path}.strata-{}", self.next.fetch_add(1, Ordering::SeqCst));
            let mut offset = 0u64;
            let mut piece = vec![0u8; PIECE as usize];
            let copied = loop {
                let n = match file.read(&mut piece) {
                    Ok(n) => n,
                    Err(e) => {
                        break Err(Error::invalid(format!("upload: {}: {e}", host.display())))
                    }
                };
                if offset + n as u64 > max - t.bytes {
                    break Err(Error::invalid(format!("upload: more than {max} bytes")));
                }
                if n == 0 && offset > 0 {
                    break Ok(());
                }
                let op = GuestFileOp::Write {
                    path: temp.clone(),
                    offset,
                    data: piece[..n].to_vec(),
                    mode,
                };
                if let Err(e) = self.call(op, path) {
                    break Err(e);
                }
                offset += n as u64;
                if n == 0 {
                    break Ok(());
                }
            };
            let placed = copied.and_then(|()| self.rename(&temp, path));
            if placed.is_err() {
                let _ = self.call(GuestFileOp::Remove { path: temp }, path);
            }
            placed?;
            t.files += 1;
            t.bytes += offset;
        }
        Ok(())
    }

    /// Copies `path` out of the guest to the host path `host`, which must not exist:
    /// regular files and directories only (symlinks and devices are skipped), at most
    /// `max` bytes and [`MAX_ENTRIES`] entries; what it makes is owner-only.
    ///
    /// # Errors
    /// `host` exists, a limit is passed, or a guest or host operation fails.
    pub fn download(&self, path: &str, host: &Path, max: u64) -> Result<Transfer> {
        if std::fs::symlink_metadata(host).is_ok() {
            return Err(Error::invalid(format!(
                "download: {} exists (the destination must be new)",
                host.display()
            )));
        }
        let mut transfer = Transfer::default();
        let top = self.stat(path)?;
        self.download_entry(path, &top, host, max, &mut transfer)?;
        Ok(transfer)
    }

    fn download_entry(
        &self,
        path: &str,
        entry: &DirEntry,
        host: &Path,
        max: u64,
        t: &mut Transfer,
    ) -> Result<()> {
        if t.files + t.dirs >= MAX_ENTRIES as u64 {
            return Err(Error::invalid(format!(
                "download: more than {MAX_ENTRIES} entries"
            )));
        }
        let host_failed =
            |e: std::io::Error| Error::internal(format!("download: write {}", host.display()), e);
        match entry.kind {
            FileKind::Dir => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(host)
                    .map_err(host_failed)?;
                t.dirs += 1;
                for child in self.list(path)? {
                    let inner = format!("{}/{}", path.trim_end_matches('/'), child.name);
                    self.download_entry(&inner, &child, &host.join(&child.name), max, t)?;
                }
            }
            FileKind::File => {
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(host)
                    .map_err(host_failed)?;
                t.files += 1;
                let mut offset = 0u64;
                loop {
                    let op = GuestFileOp::Read {
                        path: path.into(),
                        offset,
                        len: PIECE,
                    };
                    let data = match self.call(op, path)? {
                        GuestFileResult::Data { data } => data,
                        other => return Err(unexpected(path, &other)),
                    };
                    if data.is_empty() {
                        break;
                    }
                    t.bytes += data.len() as u64;
                    if t.bytes > max {
                        return Err(Error::invalid(format!("download: more than {max} bytes")));
                    }
                    file.write_all(&data).map_err(host_failed)?;
                    offset += data.len() as u64;
                }
            }
            FileKind::Symlink | FileKind::Other => {}
        }
        Ok(())
    }
}

fn entry(e: GuestEntry) -> DirEntry {
    DirEntry {
        name: e.name,
        kind: match e.kind.as_str() {
            "file" => FileKind::File,
            "dir" => FileKind::Dir,
            "symlink" => FileKind::Symlink,
            _ => FileKind::Other,
        },
        size: e.size,
        mode: e.mode,
    }
}

/// The guest's error as the process backend's file trees word it.
fn failed(path: &str, errno: i32, message: &str) -> Error {
    match errno {
        libc::ENOENT => Error::invalid(format!("not found: {path}")),
        libc::EEXIST => Error::invalid(format!("exists: {path}")),
        libc::ENOTDIR => Error::invalid(format!("not a directory: {path}")),
        libc::EISDIR => Error::invalid(format!("is a directory: {path}")),
        libc::ELOOP => Error::invalid(format!("is a symlink (not followed): {path}")),
        libc::ENOTEMPTY => Error::invalid(format!("not empty: {path}")),
        libc::EROFS | libc::EACCES | libc::EPERM => {
            Error::invalid(format!("not writable: {path} ({message})"))
        }
        _ => Error::internal(
            format!("file operation on {path} in the guest"),
            std::io::Error::from_raw_os_error(errno),
        ),
    }
}

fn unexpected(path: &str, result: &GuestFileResult) -> Error {
    Error::internal(
        format!("the guest answered a file operation on {path} with {result:?}"),
        std::io::Error::other("unexpected answer"),
    )
}
