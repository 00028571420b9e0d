//! The host side of a session's files: a private directory that every call of the session
//! mounts read-write, and safe copies in and out of it.
//!
//! [`SessionFiles::create`] makes `PARENT/strata-session-XXXXXXXXXXXXXXXX` (mode 0700, with
//! an owner-only `owner` file naming the embedder process, for sweeping after a crash) and
//! in it the directory the runs see, `root`. The directory's name is random and unrelated
//! to the session's id (the handle a server gives out), so listing `PARENT` reveals no id. Everything the session's tools wrote is untrusted: the
//! copies in and out are a [`FileTree`]'s (see [`crate::file_tree`]): every path is opened
//! beneath `root` with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
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

use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use sandbox_core::{ByteSize, Error, Result};

pub use crate::file_tree::{DirEntry, FileKind, FileTree, Transfer, MAX_ENTRIES};
use crate::workspace::{clear_dir, open_private};

/// A session's private directory on the host. Dropping it removes the directory and
/// everything in it (errors ignored; [`SessionFiles::destroy`] reports them). Its files are
/// a [`FileTree`] (`write_file`, `read_file`, `list`, `remove`, `upload`, `download`, ...).
#[derive(Debug)]
pub struct SessionFiles {
    id: String,
    base: PathBuf,
    root_path: PathBuf,
    /// The directory's contents, with the safe copies in and out.
    tree: FileTree,
    /// The size of the tmpfs mounted on `root_path`, when one could be mounted.
    bounded: Option<u64>,
    removed: bool,
}

impl Deref for SessionFiles {
    type Target = FileTree;

    fn deref(&self) -> &FileTree {
        &self.tree
    }
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
                tree: FileTree::new(root, max_transfer.bytes()),
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

    /// How the directory's size is bounded.
    pub fn disk_bound(&self) -> DiskBound {
        self.bounded.map_or(DiskBound::Unbounded, DiskBound::Tmpfs)
    }

    /// Whether the directory is bounded and has no room left.
    pub fn is_full(&self) -> bool {
        self.bounded.is_some()
            && rustix::fs::fstatvfs(self.tree.root())
                .is_ok_and(|s| s.f_bavail == 0 || s.f_favail == 0)
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
            clear_dir(self.tree.root())
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

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{FileType, Mode};

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
