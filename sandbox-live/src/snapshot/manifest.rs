//! The manifest of a snapshot's files: every directory and regular file under its `files`
//! directory with its permission bits, size and SHA-256, so any change made on disk after
//! the snapshot was taken is found before the snapshot is used.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use sandbox_core::{Error, Result};

/// One entry of a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Its path under `files`, `/`-separated.
    pub path: String,
    /// A directory (else a regular file).
    pub dir: bool,
    /// Its permission bits as stored (owner bits only).
    pub mode: u32,
    /// A file's size in bytes (0 for a directory).
    pub size: u64,
    /// A file's SHA-256, hex (empty for a directory).
    pub sha256: String,
}

/// Makes everything under `root` owner-only (a file keeps its owner bits, a directory is
/// 0700), as every file Strata keeps on the host is, and lists it.
///
/// # Errors
/// [`Error::InvalidRequest`] for an entry that is neither a directory nor a regular file,
/// or whose name is not UTF-8; the OS error otherwise.
pub fn seal_tree(root: &Path) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    walk(root, "", &mut |path, rel, meta| {
        let mode = if meta.is_dir() {
            0o700
        } else {
            meta.mode() & 0o700 | 0o600
        };
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| io_error(path, e))?;
        entries.push(describe(path, rel, meta.is_dir(), mode, meta.len())?);
        Ok(())
    })?;
    Ok(entries)
}

/// Checks that `root` holds exactly `manifest`: no entry missing, added or changed (kind,
/// permission bits, size, contents), and every entry owned by `uid`.
///
/// # Errors
/// [`Error::Denied`] naming the first difference.
pub fn verify_tree(root: &Path, manifest: &[Entry], uid: u32, name: &str) -> Result<()> {
    let mut expected: BTreeMap<&str, &Entry> =
        manifest.iter().map(|e| (e.path.as_str(), e)).collect();
    let altered = |what: String| Error::Denied {
        reason: format!("snapshot {name:?} was altered after it was made ({what}); it is not used"),
    };
    walk(root, "", &mut |path, rel, meta| {
        let Some(want) = expected.remove(rel) else {
            return Err(altered(format!("{rel} was added")));
        };
        if meta.uid() != uid {
            return Err(Error::Denied {
                reason: format!(
                    "snapshot {name:?}: {rel} belongs to uid {}, not to this user ({uid})",
                    meta.uid()
                ),
            });
        }
        if want.dir != meta.is_dir() || want.mode != meta.mode() & 0o7777 {
            return Err(altered(format!("{rel} changed kind or mode")));
        }
        if !want.dir {
            if want.size != meta.len() {
                return Err(altered(format!("{rel} changed size")));
            }
            if describe(path, rel, false, want.mode, meta.len())?.sha256 != want.sha256 {
                return Err(altered(format!("{rel} changed contents")));
            }
        }
        Ok(())
    })?;
    match expected.keys().next() {
        Some(missing) => Err(altered(format!("{missing} was removed"))),
        None => Ok(()),
    }
}

/// Calls `visit(path, rel, metadata)` for every entry below `root` (not `root` itself),
/// parents before children, never following a symlink.
fn walk(
    root: &Path,
    prefix: &str,
    visit: &mut dyn FnMut(&Path, &str, &fs::Metadata) -> Result<()>,
) -> Result<()> {
    let mut names = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| io_error(root, e))? {
        let entry = entry.map_err(|e| io_error(root, e))?;
        let name = entry.file_name().into_string().map_err(|name| {
            Error::invalid(format!(
                "{}: the file name {name:?} is not UTF-8 (a snapshot carries UTF-8 names only)",
                root.display()
            ))
        })?;
        names.push(name);
    }
    names.sort();
    for name in names {
        let path = root.join(&name);
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let meta = fs::symlink_metadata(&path).map_err(|e| io_error(&path, e))?;
        if !meta.is_dir() && !meta.is_file() {
            return Err(Error::Denied {
                reason: format!(
                    "{}: neither a directory nor a regular file (a symlink, device, FIFO or socket has no place in a snapshot)",
                    path.display()
                ),
            });
        }
        visit(&path, &rel, &meta)?;
        if meta.is_dir() {
            walk(&path, &rel, visit)?;
        }
    }
    Ok(())
}

fn describe(path: &Path, rel: &str, dir: bool, mode: u32, size: u64) -> Result<Entry> {
    let sha256 = if dir {
        String::new()
    } else {
        let mut file = open_no_follow(path)?;
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(|e| io_error(path, e))?;
        hex(&hasher.finalize())
    };
    Ok(Entry {
        path: rel.to_string(),
        dir,
        mode,
        size,
        sha256,
    })
}

/// Opens `path` for reading, refusing a symlink in its last component.
pub(crate) fn open_no_follow(path: &Path) -> Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_error(path, e))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn io_error(path: &Path, e: io::Error) -> Error {
    Error::internal(format!("snapshot file {}", path.display()), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("t0/sub")).expect("mkdir");
        fs::write(dir.path().join("t0/a.txt"), b"alpha").expect("write");
        fs::write(dir.path().join("t0/sub/b.bin"), [0u8; 300]).expect("write");
        fs::set_permissions(
            dir.path().join("t0/a.txt"),
            fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        dir
    }

    #[test]
    fn sealed_files_are_owner_only_and_verify() {
        let dir = tree();
        let manifest = seal_tree(dir.path()).expect("seal");
        assert_eq!(manifest.len(), 4, "{manifest:?}");
        let a = manifest.iter().find(|e| e.path == "t0/a.txt").expect("a");
        assert_eq!(a.mode, 0o700);
        let meta = fs::metadata(dir.path().join("t0/sub")).expect("meta");
        assert_eq!(meta.mode() & 0o777, 0o700);
        verify_tree(
            dir.path(),
            &manifest,
            rustix::process::geteuid().as_raw(),
            "s",
        )
        .expect("verifies");
    }

    #[test]
    fn an_edited_added_or_removed_file_is_found() {
        let uid = rustix::process::geteuid().as_raw();
        let dir = tree();
        let manifest = seal_tree(dir.path()).expect("seal");
        // Same size, other contents.
        fs::write(dir.path().join("t0/a.txt"), b"ALPHA").expect("edit");
        let err = verify_tree(dir.path(), &manifest, uid, "s").expect_err("edited");
        assert!(
            err.to_string().contains("t0/a.txt changed contents"),
            "{err}"
        );
        fs::write(dir.path().join("t0/a.txt"), b"alpha").expect("restore");
        verify_tree(dir.path(), &manifest, uid, "s").expect("restored");
        fs::write(dir.path().join("t0/extra"), b"x").expect("add");
        let err = verify_tree(dir.path(), &manifest, uid, "s").expect_err("added");
        assert!(err.to_string().contains("t0/extra was added"), "{err}");
        fs::remove_file(dir.path().join("t0/extra")).expect("rm");
        fs::remove_file(dir.path().join("t0/sub/b.bin")).expect("rm");
        let err = verify_tree(dir.path(), &manifest, uid, "s").expect_err("removed");
        assert!(err.to_string().contains("was removed"), "{err}");
    }

    #[test]
    fn a_symlink_planted_in_a_snapshot_is_refused() {
        let uid = rustix::process::geteuid().as_raw();
        let dir = tree();
        let manifest = seal_tree(dir.path()).expect("seal");
        fs::remove_file(dir.path().join("t0/a.txt")).expect("rm");
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join("t0/a.txt")).expect("link");
        let err = verify_tree(dir.path(), &manifest, uid, "s").expect_err("symlink");
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
