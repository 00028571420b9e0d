//! Host-side places Strata makes for itself while runs go (VM run directories, grant
//! images, write-back archives, session and workspace directories, snapshots, sockets):
//! private to the embedder. Directories are made with mode 0700 and files with 0600 from
//! the start (never made wider and narrowed later), whatever the process umask; an
//! existing directory is reused only when it is a real directory (not a symbolic link)
//! owned by the embedder, and its mode is then narrowed to 0700.
//!
//! Names of temporary directories carry 64 random bits from the OS, and never an id a
//! caller uses as a handle, so listing `$TMPDIR` reveals no handle.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every directory Strata makes for itself.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file Strata makes for itself.
pub const FILE_MODE: u32 = 0o600;

/// A private directory (mode 0700) with a random name, removed with everything in it when
/// dropped (unless [`PrivateDir::keep`] was called).
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    remove: bool,
}

impl PrivateDir {
    /// Makes `$TMPDIR/PREFIXXXXXXXXXXXXXXXXX` (16 random hex digits).
    ///
    /// # Errors
    /// When no directory can be made (a full disk, `$TMPDIR` not writable).
    pub fn new(prefix: &str) -> io::Result<PrivateDir> {
        Self::new_in(&std::env::temp_dir(), prefix)
    }

    /// Makes `parent/PREFIXXXXXXXXXXXXXXXXX` with mode 0700. `mkdir` never follows or
    /// reuses an existing entry, so a name someone else took is skipped.
    ///
    /// # Errors
    /// When no directory can be made in `parent`.
    pub fn new_in(parent: &Path, prefix: &str) -> io::Result<PrivateDir> {
        let mut last = io::Error::other("no free name");
        for _ in 0..16 {
            let path = parent.join(format!("{prefix}{}", random_hex(8)?));
            match std::fs::DirBuilder::new().mode(DIR_MODE).create(&path) {
                Ok(()) => {
                    // The umask can only narrow 0700; a parent's default ACL could widen it.
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(DIR_MODE))?;
                    return Ok(PrivateDir { path, remove: true });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves the directory in place when dropped; returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.remove = false;
        std::mem::take(&mut self.path)
    }

    /// Removes the directory and everything in it now.
    ///
    /// # Errors
    /// When something in it cannot be removed.
    pub fn close(mut self) -> io::Result<()> {
        self.remove = false;
        std::fs::remove_dir_all(&self.path)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Makes `path` and any missing parents with mode 0700. The last component, when it
/// already exists, must be a directory (not a symbolic link) owned by this process's
/// effective uid; its mode is narrowed to 0700. Parents that already exist are left as
/// they are (they are the embedder's, e.g. `$HOME/.cache`).
///
/// # Errors
/// `PermissionDenied` when `path` exists but belongs to another user or is a symbolic
/// link; the OS error when it cannot be made.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new()
        .mode(DIR_MODE)
        .recursive(true)
        .create(path)
    {
        Ok(()) => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of its own", path.display()),
        ));
    }
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this user: refusing to keep private files there",
                path.display(),
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o777 != DIR_MODE {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Creates (or truncates) the file `path` with mode 0600, never following a symbolic link
/// at its last component.
///
/// # Errors
/// The OS error (`ELOOP` for a symbolic link).
pub fn create(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    // An existing file keeps its mode through O_CREAT: narrow it.
    file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Writes `data` to the file `path` made as [`create`] makes it.
///
/// # Errors
/// As [`create`], and write errors.
pub fn write(path: &Path, data: impl AsRef<[u8]>) -> io::Result<()> {
    use std::io::Write;
    create(path)?.write_all(data.as_ref())
}

/// Narrows what another program made in a private directory (an image `mke2fs` wrote, a
/// socket QEMU bound) to 0600 (0700 for a directory), without following a symbolic link.
///
/// # Errors
/// The OS error.
pub fn restrict(path: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = if meta.is_dir() { DIR_MODE } else { FILE_MODE };
    if meta.mode() & 0o777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// `2 * bytes` hex digits from the OS's random source.
///
/// # Errors
/// When the OS has no randomness to give.
pub fn random_hex(bytes: usize) -> io::Result<String> {
    use std::fmt::Write;
    let mut raw = vec![0u8; bytes];
    getrandom::fill(&mut raw).map_err(|e| io::Error::other(format!("OS randomness: {e}")))?;
    Ok(raw.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// The entries of `dir` whose modes are wider than private (any group or other bit), as
/// `(path, mode)`; for tests and `strata doctor`.
///
/// # Errors
/// When `dir` cannot be read.
pub fn wider_than_private(dir: &Path) -> io::Result<Vec<(PathBuf, u32)>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let meta = std::fs::symlink_metadata(&d)?;
        if meta.mode() & 0o077 != 0 {
            out.push((d.clone(), meta.mode() & 0o7777));
        }
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                pending.push(entry.path());
            } else if meta.mode() & 0o077 != 0 {
                out.push((entry.path(), meta.mode() & 0o7777));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_and_files_are_owner_only() {
        let dir = PrivateDir::new("strata-private-test-").expect("dir");
        let file = dir.path().join("f");
        write(&file, b"x").expect("write");
        let sub = dir.path().join("a/b");
        create_dir_all(&sub).expect("mkdir -p");
        assert_eq!(wider_than_private(dir.path()).expect("walk"), vec![]);
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn an_existing_file_is_narrowed_and_a_symlink_is_not_followed() {
        let dir = PrivateDir::new("strata-private-test-").expect("dir");
        let wide = dir.path().join("wide");
        std::fs::write(&wide, b"x").expect("write");
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        create(&wide).expect("create");
        assert_eq!(
            std::fs::metadata(&wide).expect("meta").mode() & 0o777,
            FILE_MODE
        );
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(create(&link).is_err());
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        assert!(create_dir_all(&link).is_err());
    }
}
