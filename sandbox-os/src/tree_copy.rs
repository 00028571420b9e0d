//! Copies a host directory a tool may be changing (a grant another run writes) into a
//! private tree no tool can reach, through descriptors only: every directory is opened
//! beneath the one before it with `O_NOFOLLOW`, every file is opened with `O_NOFOLLOW`
//! and its type checked on the open descriptor (`fstat`), and symbolic links are copied
//! as links (never followed). A tool that swaps a file or directory for a symbolic link
//! (to a root-only file, say) between the listing and the open gets that entry skipped,
//! never the link's target copied.
//!
//! What the copy keeps: regular files' bytes, permission bits without setuid, setgid and
//! sticky, modification times, hard links within the tree, and owners when the process
//! may set them (root). Devices, FIFOs and sockets are not copied (listed in
//! [`Copied::skipped`]).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Stat, Uid};
use rustix::io::Errno;

use crate::workspace::{list, lstat_at, times};

/// What [`copy_tree`] copied.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes of regular files copied.
    pub bytes: u64,
    /// Entries copied (files, directories, links), not counting the top directory.
    pub entries: u64,
    /// Entries left out, with why (relative paths).
    pub skipped: Vec<(PathBuf, String)>,
}

/// A directory copied whose bits and times are set once everything in it is written.
struct DoneDir {
    dst: OwnedFd,
    stat: Stat,
}

/// Copies the tree open as `src` into the existing, empty, private directory `dst`. Stops
/// with `FileTooLarge`-like `Other` error once more than `max_bytes` bytes were copied.
///
/// # Errors
/// When `dst` cannot be written, a directory of the source cannot be read, or the size
/// limit is passed. Entries that vanish or change kind while copying are skipped, not
/// errors.
pub fn copy_tree(src: &OwnedFd, dst: &Path, max_bytes: u64) -> io::Result<Copied> {
    let dst_root = rustix::fs::open(
        dst,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut copier = Copier {
        copied: Copied::default(),
        max_bytes,
        links: HashMap::new(),
        owners: rustix::process::geteuid().is_root(),
        done: Vec::new(),
    };
    let top = rustix::fs::fstat(src)?;
    let mut pending = vec![(PathBuf::new(), dup(src)?, dup(&dst_root)?)];
    while let Some((rel, from, to)) = pending.pop() {
        for name in list(&from).map_err(|e| at(&rel, e))? {
            let path = rel.join(&name);
            if let Some(sub) = copier.entry(&from, &to, &dst_root, &name, &path)? {
                pending.push((path, sub.0, sub.1));
            }
        }
    }
    // Bits and times of directories last (children first), so writing into them worked.
    for dir in copier.done.iter().rev() {
        copier.finish(&dir.dst, &dir.stat)?;
    }
    copier.finish(&dst_root, &top)?;
    Ok(copier.copied)
}

struct Copier {
    copied: Copied,
    max_bytes: u64,
    /// Files with more than one link already copied: (device, inode) to their path.
    links: HashMap<(u64, u64), PathBuf>,
    /// Whether owners are copied (only root may give files away).
    owners: bool,
    done: Vec<DoneDir>,
}

impl Copier {
    /// Copies `name` of `from` into `to`; a directory is returned (source, copy) for the
    /// walk to descend into.
    fn entry(
        &mut self,
        from: &OwnedFd,
        to: &OwnedFd,
        dst_root: &OwnedFd,
        name: &OsStr,
        path: &Path,
    ) -> io::Result<Option<(OwnedFd, OwnedFd)>> {
        let Some(stat) = lstat_at(from, name).map_err(|e| at(path, e))? else {
            return Ok(None);
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let sub = match rustix::fs::openat(
                    from,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => {
                        self.skip(path, "changed while copying (not copied)");
                        return Ok(None);
                    }
                    Err(e) => return Err(at(path, e.into())),
                };
                let stat = rustix::fs::fstat(&sub)?;
                rustix::fs::mkdirat(to, name, Mode::from_raw_mode(0o700))?;
                let made = rustix::fs::openat(
                    to,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                self.copied.entries += 1;
                self.done.push(DoneDir {
                    dst: dup(&made)?,
                    stat,
                });
                Ok(Some((sub, made)))
            }
            FileType::RegularFile => {
                self.file(from, to, dst_root, name, path)?;
                Ok(None)
            }
            FileType::Symlink => {
                let target = match rustix::fs::readlinkat(from, name, Vec::new()) {
                    Ok(target) => target,
                    Err(Errno::INVAL | Errno::NOENT) => {
                        self.skip(path, "changed while copying (not copied)");
                        return Ok(None);
                    }
                    Err(e) => return Err(at(path, e.into())),
                };
                let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                rustix::fs::symlinkat(target, to, name)?;
                if self.owners {
                    let _ = rustix::fs::chownat(
                        to,
                        name,
                        Some(Uid::from_raw(stat.st_uid)),
                        Some(Gid::from_raw(stat.st_gid)),
                        AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
                let _ = rustix::fs::utimensat(to, name, &times(&stat), AtFlags::SYMLINK_NOFOLLOW);
                self.copied.entries += 1;
                Ok(None)
            }
            _ => {
                self.skip(path, "a device, FIFO or socket (not copied)");
                Ok(None)
            }
        }
    }

    fn file(
        &mut self,
        from: &OwnedFd,
        to: &OwnedFd,
        dst_root: &OwnedFd,
        name: &OsStr,
        path: &Path,
    ) -> io::Result<()> {
        let input = match rustix::fs::openat(
            from,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::LOOP | Errno::NOENT | Errno::NXIO) => {
                self.skip(path, "changed while copying (not copied)");
                return Ok(());
            }
            Err(e) => return Err(at(path, e.into())),
        };
        // The type on the descriptor, not the name: a swap after the listing shows here.
        let stat = rustix::fs::fstat(&input)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            self.skip(path, "changed while copying (not copied)");
            return Ok(());
        }
        let key = (stat.st_dev, stat.st_ino);
        if stat.st_nlink > 1 {
            if let Some(first) = self.links.get(&key) {
                rustix::fs::linkat(dst_root, first.as_path(), to, name, AtFlags::empty())?;
                self.copied.entries += 1;
                return Ok(());
            }
        }
        let output = rustix::fs::openat(
            to,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let budget = self.max_bytes.saturating_sub(self.copied.bytes);
        let mut reader = io::Read::take(std::fs::File::from(input), budget.saturating_add(1));
        let mut writer = std::fs::File::from(output);
        let count = io::copy(&mut reader, &mut writer).map_err(|e| at(path, e))?;
        if count > budget {
            return Err(io::Error::other(format!(
                "the tree holds more than {} bytes",
                self.max_bytes
            )));
        }
        self.copied.bytes += count;
        self.copied.entries += 1;
        let out: OwnedFd = writer.into();
        self.finish(&out, &stat)?;
        if stat.st_nlink > 1 {
            self.links.insert(key, path.to_path_buf());
        }
        Ok(())
    }

    /// Sets the copy's owner (as root), permission bits (without setuid, setgid and
    /// sticky) and times from the source's `stat`.
    fn finish(&self, fd: &OwnedFd, stat: &Stat) -> io::Result<()> {
        if self.owners {
            rustix::fs::fchown(
                fd,
                Some(Uid::from_raw(stat.st_uid)),
                Some(Gid::from_raw(stat.st_gid)),
            )?;
        }
        rustix::fs::fchmod(fd, Mode::from_raw_mode(stat.st_mode & 0o777))?;
        rustix::fs::futimens(fd, &times(stat))?;
        Ok(())
    }

    fn skip(&mut self, path: &Path, why: &str) {
        self.copied
            .skipped
            .push((path.to_path_buf(), why.to_string()));
    }
}

fn dup(fd: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(fd, 0)?)
}

fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn open(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open")
    }

    #[test]
    fn files_links_and_bits_are_copied_and_links_are_not_followed() {
        let src = tempfile::tempdir().expect("tempdir");
        let secret = tempfile::tempdir().expect("tempdir");
        std::fs::write(secret.path().join("shadow"), b"secret").expect("write");
        std::fs::create_dir(src.path().join("d")).expect("mkdir");
        std::fs::write(src.path().join("d/f"), b"hello").expect("write");
        std::fs::set_permissions(
            src.path().join("d/f"),
            std::fs::Permissions::from_mode(0o4755),
        )
        .expect("chmod");
        std::fs::hard_link(src.path().join("d/f"), src.path().join("h")).expect("link");
        std::os::unix::fs::symlink(secret.path().join("shadow"), src.path().join("l"))
            .expect("symlink");
        std::os::unix::fs::symlink(secret.path(), src.path().join("ldir")).expect("symlink");
        let dst = tempfile::tempdir().expect("tempdir");
        let copied = copy_tree(&open(src.path()), dst.path(), 1 << 20).expect("copy");
        assert_eq!(copied.bytes, 5);
        assert_eq!(copied.entries, 5);
        assert!(copied.skipped.is_empty());
        let f = std::fs::metadata(dst.path().join("d/f")).expect("meta");
        assert_eq!(f.mode() & 0o7777, 0o755);
        assert_eq!(
            f.ino(),
            std::fs::metadata(dst.path().join("h")).expect("meta").ino()
        );
        assert_eq!(
            std::fs::read_link(dst.path().join("l")).expect("readlink"),
            secret.path().join("shadow")
        );
        assert!(std::fs::symlink_metadata(dst.path().join("ldir"))
            .expect("meta")
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_tree_over_the_limit_is_refused() {
        let src = tempfile::tempdir().expect("tempdir");
        std::fs::write(src.path().join("big"), vec![0u8; 4096]).expect("write");
        let dst = tempfile::tempdir().expect("tempdir");
        assert!(copy_tree(&open(src.path()), dst.path(), 1000).is_err());
    }

    /// The round-3 attack: a concurrent writer of the grant swaps a file (and a directory)
    /// for a symbolic link to a secret between the copier's listing and its open. The
    /// secret's bytes never reach the copy, however the race falls.
    #[test]
    fn a_file_or_directory_swapped_for_a_link_to_a_secret_never_copies_the_secret() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let secret_dir = tempfile::tempdir().expect("tempdir");
        let secret = secret_dir.path().join("shadow");
        std::fs::write(&secret, b"TOP-SECRET-CANARY").expect("write");
        let src = tempfile::tempdir().expect("tempdir");
        let root = src.path().to_path_buf();
        std::fs::write(root.join("f"), b"plain").expect("write");
        std::fs::create_dir(root.join("d")).expect("mkdir");
        std::fs::write(root.join("d/inner"), b"plain").expect("write");
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, root, secret, secret_dir) = (
                stop.clone(),
                root.clone(),
                secret.clone(),
                secret_dir.path().to_path_buf(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::remove_file(root.join("f"));
                    let _ = std::os::unix::fs::symlink(&secret, root.join("f"));
                    let _ = std::fs::rename(root.join("d"), root.join("d.away"));
                    let _ = std::os::unix::fs::symlink(&secret_dir, root.join("d"));
                    std::thread::yield_now();
                    let _ = std::fs::remove_file(root.join("f"));
                    let _ = std::fs::write(root.join("f"), b"plain");
                    let _ = std::fs::remove_file(root.join("d"));
                    let _ = std::fs::rename(root.join("d.away"), root.join("d"));
                }
            })
        };
        for _ in 0..300 {
            let dst = tempfile::tempdir().expect("tempdir");
            if copy_tree(&open(&root), dst.path(), 1 << 20).is_err() {
                continue;
            }
            let mut pending = vec![dst.path().to_path_buf()];
            while let Some(dir) = pending.pop() {
                for entry in std::fs::read_dir(&dir).expect("read_dir") {
                    let entry = entry.expect("entry");
                    let kind = entry.file_type().expect("type");
                    if kind.is_dir() {
                        pending.push(entry.path());
                    } else if kind.is_file() {
                        let bytes = std::fs::read(entry.path()).expect("read");
                        assert_ne!(bytes, b"TOP-SECRET-CANARY", "{}", entry.path().display());
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().expect("swapper");
    }
}
