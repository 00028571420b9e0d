//! A [`LiveSandbox`]'s files, for its clients (served by [`crate::files`] and
//! [`crate::watch`]): paths in the sandbox are absolute or relative to its working
//! directory; host paths are made absolute here.

use std::path::{Path, PathBuf};

use sandbox_core::{Error, Result};
use sandbox_os::file_tree::{DirEntry, Transfer};

use crate::client::{unexpected, LiveSandbox};
use crate::files::FileRequest;
use crate::protocol::{decode, encode, Reply, Request};
use crate::watch::FileChange;

impl LiveSandbox {
    fn file(&self, request: FileRequest) -> Result<Reply> {
        self.request(&Request::Files(request))
    }

    /// A regular file's contents (at most [`crate::files::MAX_INLINE`]; a symlink, device
    /// or hard-linked file is refused).
    ///
    /// # Errors
    /// Not found, not a regular file, too large, or the sandbox is gone.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        match self.file(FileRequest::Read { path: path.into() })? {
            Reply::FileData { data } => decode(&data),
            other => Err(unexpected(other)),
        }
    }

    /// Replaces (or creates) the file `path` with `data` (mode 0644), making missing parent
    /// directories; an existing file is replaced, never written through.
    ///
    /// # Errors
    /// A directory there, a read-only mount, a symlink on the way, or the sandbox is gone.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        match self.file(FileRequest::Write {
            path: path.into(),
            data: encode(data),
        })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// A directory's entries, sorted by name.
    ///
    /// # Errors
    /// Not found, not a directory, or the sandbox is gone.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        match self.file(FileRequest::List { path: path.into() })? {
            Reply::Entries { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// One entry (a symlink is described, not followed).
    ///
    /// # Errors
    /// Not found, or the sandbox is gone.
    pub fn stat(&self, path: &str) -> Result<DirEntry> {
        match self.file(FileRequest::Stat { path: path.into() })? {
            Reply::Entry { entry } => Ok(entry),
            other => Err(unexpected(other)),
        }
    }

    /// Makes a directory; with `parents`, missing parents too (and an existing directory
    /// is no error).
    ///
    /// # Errors
    /// It exists, a parent is missing, or the sandbox is gone.
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        match self.file(FileRequest::Mkdir {
            path: path.into(),
            parents,
        })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Renames an entry (nothing is followed; a file at `to` is replaced).
    ///
    /// # Errors
    /// Not found, a non-empty directory at `to`, or the sandbox is gone.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        match self.file(FileRequest::Rename {
            from: from.into(),
            to: to.into(),
        })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Removes a file, symlink or directory tree (never following a symlink).
    ///
    /// # Errors
    /// Not found, a read-only mount, or the sandbox is gone.
    pub fn remove(&self, path: &str) -> Result<()> {
        match self.file(FileRequest::Remove { path: path.into() })? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Copies the host's file or directory `host` to `path` in the sandbox (a directory is
    /// merged into a directory there; regular files and directories only, at most
    /// [`crate::files::MAX_TRANSFER`] bytes, checked before anything is written).
    ///
    /// # Errors
    /// A bad source, a bad destination, too large, or the sandbox is gone.
    pub fn upload(&self, host: &Path, path: &str) -> Result<Transfer> {
        match self.file(FileRequest::Upload {
            host: absolute(host)?,
            path: path.into(),
        })? {
            Reply::Transferred { transfer } => Ok(transfer),
            other => Err(unexpected(other)),
        }
    }

    /// Copies `path` out of the sandbox to the host path `host`, which must not exist
    /// (regular files and directories only: a symlink, device or hard-linked file refuses
    /// the copy before anything is written).
    ///
    /// # Errors
    /// A bad source, `host` exists, too large, or the sandbox is gone.
    pub fn download(&self, path: &str, host: &Path) -> Result<Transfer> {
        match self.file(FileRequest::Download {
            path: path.into(),
            host: absolute(host)?,
        })? {
            Reply::Transferred { transfer } => Ok(transfer),
            other => Err(unexpected(other)),
        }
    }

    /// Watches the directory `path` (with `recursive`, everything below it): `on_change`
    /// gets each change until it returns `false`, or the sandbox stops. Returns once the
    /// watch ended.
    ///
    /// # Errors
    /// Not a directory, too many directories, or the sandbox is gone.
    pub fn watch(
        &self,
        path: &str,
        recursive: bool,
        mut on_change: impl FnMut(&FileChange) -> bool,
    ) -> Result<()> {
        let mut conn = self.connect()?;
        conn.send(&Request::Files(FileRequest::Watch {
            path: path.into(),
            recursive,
        }))?;
        match conn.reply()? {
            Reply::Ok => {}
            other => return Err(unexpected(other)),
        }
        loop {
            match conn.reply() {
                Ok(Reply::FileEvent { change }) => {
                    if !on_change(&change) {
                        return Ok(());
                    }
                }
                Ok(other) => return Err(unexpected(other)),
                // The sandbox stopped: the watch is over.
                Err(_) => return Ok(()),
            }
        }
    }
}

fn absolute(host: &Path) -> Result<PathBuf> {
    std::path::absolute(host)
        .map_err(|e| Error::invalid(format!("host path {}: {e}", host.display())))
}
