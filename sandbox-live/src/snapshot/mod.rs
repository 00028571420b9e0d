//! Snapshots of live sandboxes: named, owner-only copies of what a sandbox carries, to
//! start new sandboxes from ([`LiveSandbox::start_from`](crate::LiveSandbox::start_from))
//! or to fork one ([`LiveSandbox::fork`](crate::LiveSandbox::fork)).
//!
//! On the process and container backends a snapshot carries the sandbox's own files (its
//! scratch `/tmp` and a private working directory, never a granted host path: grants are
//! the host's and are granted again when a sandbox starts from the snapshot), its caps and
//! its policy; no process, no memory. [`SnapshotInfo::carries`] and
//! [`SnapshotInfo::not_carried`] say exactly what.
//!
//! The store is one directory per user ([`SnapshotStore::open_default`]), mode 0700, with
//! a 32-byte key (`.key`, 0600) and one 0700 directory per snapshot: `snapshot.json` (what
//! it is, the caps, and a manifest of every file with its SHA-256), `seal` (HMAC-SHA256 of
//! `snapshot.json` under the key) and `files/`, owner-only. Before a snapshot is used the
//! seal and every file are checked: a snapshot edited on disk, one whose files belong to
//! another user, or a store another user owns is refused ([`sandbox_core::Error::Denied`]).
//! A snapshot is published by renaming a finished directory, so a half-written one is never
//! seen; removing one removes its directory and nothing else.

mod manifest;
mod take;

pub use manifest::Entry;
pub use take::{Forked, MAX_FORK};

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use sandbox_core::{BackendKind, Caps, Error, Result, Strictness};

use crate::policy::LivePolicy;
use crate::state;

/// The format of `snapshot.json` this build writes and reads.
pub const FORMAT: u32 = 1;

const KEY: &str = ".key";
const BODY: &str = "snapshot.json";
const SEAL: &str = "seal";
const FILES: &str = "files";

/// What a snapshot is, for listings and the CLI's `--json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    /// Its id: `snap-` and 16 hex digits.
    pub id: String,
    /// Its name (the id unless one was given); unique in the store.
    pub name: String,
    /// The backend it was taken on, and that a sandbox started from it runs on.
    pub backend: BackendKind,
    /// The id of the sandbox it was taken of.
    pub source: String,
    /// Seconds since the Unix epoch when it was taken.
    pub created_at: u64,
    /// What it carries, e.g. `files:/tmp`, `caps`, `policy`.
    pub carries: Vec<String>,
    /// What it does not carry, in words.
    pub not_carried: Vec<String>,
    /// Regular files it holds.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
}

/// A tree of the sandbox's files in a snapshot.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Tree {
    /// Where it is in the sandbox.
    pub(crate) inside: PathBuf,
    /// Its directory under `files/`.
    pub(crate) stored: String,
}

/// `snapshot.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Body {
    pub(crate) format: u32,
    pub(crate) owner_uid: u32,
    pub(crate) info: SnapshotInfo,
    pub(crate) caps: Caps,
    pub(crate) strictness: Strictness,
    pub(crate) policy: LivePolicy,
    pub(crate) trees: Vec<Tree>,
    pub(crate) manifest: Vec<Entry>,
}

/// A snapshot that was checked (seal, owner, every file) and can be started from.
#[derive(Debug)]
pub struct Verified {
    pub(crate) dir: PathBuf,
    pub(crate) body: Body,
}

impl Verified {
    /// What it is.
    pub fn info(&self) -> &SnapshotInfo {
        &self.body.info
    }

    /// The caps a sandbox started from it gets.
    pub fn caps(&self) -> &Caps {
        &self.body.caps
    }

    /// The policy (tier, approver, audit log) the snapshot's sandbox ran under.
    pub fn policy(&self) -> &LivePolicy {
        &self.body.policy
    }
}

/// A user's snapshots. See the module docs.
#[derive(Debug)]
pub struct SnapshotStore {
    dir: PathBuf,
    key: [u8; 32],
}

impl SnapshotStore {
    /// The store at `$STRATA_SNAPSHOT_DIR` when set, else `$XDG_DATA_HOME/strata/snapshots`,
    /// else `$HOME/.local/share/strata/snapshots`, else `/var/lib/strata/snapshots` for root
    /// and `/tmp/strata-snapshots-UID` for everyone else; created 0700 when missing.
    ///
    /// # Errors
    /// As [`SnapshotStore::open`].
    pub fn open_default() -> Result<SnapshotStore> {
        let nonempty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let dir = if let Some(dir) = nonempty("STRATA_SNAPSHOT_DIR") {
            PathBuf::from(dir)
        } else if let Some(data) = nonempty("XDG_DATA_HOME") {
            Path::new(&data).join("strata/snapshots")
        } else if let Some(home) = nonempty("HOME").filter(|_| state::uid() != 0) {
            Path::new(&home).join(".local/share/strata/snapshots")
        } else if state::uid() == 0 {
            PathBuf::from("/var/lib/strata/snapshots")
        } else {
            PathBuf::from(format!("/tmp/strata-snapshots-{}", state::uid()))
        };
        Self::open(&dir)
    }

    /// The store in `dir`, created 0700 (with its key) when missing.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `dir` is not a private directory of this user (another
    /// user's store is refused); [`Error::Denied`] when its key is not this user's alone.
    pub fn open(dir: &Path) -> Result<SnapshotStore> {
        state::private_dir(dir)?;
        let key = read_or_make_key(&dir.join(KEY))?;
        Ok(SnapshotStore {
            dir: dir.to_path_buf(),
            key,
        })
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every snapshot in the store whose seal and owner check out, oldest first (its files
    /// are checked when it is used, by [`SnapshotStore::load`]). One that does not is left
    /// out (and stays on disk for `remove`).
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn list(&self) -> Result<Vec<SnapshotInfo>> {
        let mut found = Vec::new();
        let entries = fs::read_dir(&self.dir)
            .map_err(|e| Error::invalid(format!("snapshot store {}: {e}", self.dir.display())))?;
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !state::valid_name(&name) {
                continue;
            }
            if let Ok(body) = self.read_body(&self.dir.join(&name), &name) {
                found.push(body.info);
            }
        }
        found.sort_by(|a, b| (a.created_at, &a.name).cmp(&(b.created_at, &b.name)));
        Ok(found)
    }

    /// The snapshot `name`, checked completely (seal, owner, every file's contents).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when there is none; [`Error::Denied`] when it was altered
    /// or is another user's.
    pub fn load(&self, name: &str) -> Result<Verified> {
        let dir = self.snapshot_dir(name)?;
        self.load_dir(&dir, name)
    }

    pub(crate) fn load_dir(&self, dir: &Path, name: &str) -> Result<Verified> {
        let body = self.read_body(dir, name)?;
        manifest::verify_tree(&dir.join(FILES), &body.manifest, state::uid(), name)?;
        Ok(Verified {
            dir: dir.to_path_buf(),
            body,
        })
    }

    /// Removes the snapshot `name`: its directory and everything in it.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when there is none or it is not a directory of this user.
    pub fn remove(&self, name: &str) -> Result<()> {
        let dir = self.snapshot_dir(name)?;
        let meta = fs::symlink_metadata(&dir).map_err(|_| {
            Error::invalid(format!("no snapshot {name:?} in {}", self.dir.display()))
        })?;
        if !meta.is_dir() || meta.uid() != state::uid() {
            return Err(Error::invalid(format!(
                "{} is not a snapshot of this user",
                dir.display()
            )));
        }
        fs::remove_dir_all(&dir)
            .map_err(|e| Error::internal(format!("remove snapshot {}", dir.display()), e))
    }

    fn snapshot_dir(&self, name: &str) -> Result<PathBuf> {
        if !state::valid_name(name) {
            return Err(Error::invalid(format!(
                "{name:?} is not a snapshot name (1-64 of A-Z a-z 0-9 _ . -, not starting with a dot)"
            )));
        }
        Ok(self.dir.join(name))
    }

    /// Reads and checks `snapshot.json` of the snapshot in `dir`: the directory is this
    /// user's and private, the seal matches, the body was made by this user for `name`.
    fn read_body(&self, dir: &Path, name: &str) -> Result<Body> {
        let meta = fs::symlink_metadata(dir).map_err(|_| {
            Error::invalid(format!("no snapshot {name:?} in {}", self.dir.display()))
        })?;
        if !meta.is_dir() {
            return Err(Error::invalid(format!(
                "{} is not a snapshot (not a directory)",
                dir.display()
            )));
        }
        if meta.uid() != state::uid() {
            return Err(Error::Denied {
                reason: format!(
                    "snapshot {name:?} belongs to uid {}, not to this user ({}): another user's snapshot is never used",
                    meta.uid(),
                    state::uid()
                ),
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(Error::Denied {
                reason: format!(
                    "snapshot {name:?} is open to other users (mode {:o}); it is not used",
                    meta.mode() & 0o777
                ),
            });
        }
        let body = read_small(&dir.join(BODY))?;
        let seal = read_small(&dir.join(SEAL))?;
        let seal = String::from_utf8(seal).unwrap_or_default();
        let tag = unhex(seal.trim()).unwrap_or_default();
        let mut mac = self.mac()?;
        mac.update(&body);
        if mac.verify_slice(&tag).is_err() {
            return Err(Error::Denied {
                reason: format!(
                    "snapshot {name:?} was altered after it was made (its seal does not match snapshot.json), or it was sealed with another store's key; it is not used"
                ),
            });
        }
        let body: Body = serde_json::from_slice(&body)
            .map_err(|e| Error::invalid(format!("snapshot {name:?}: snapshot.json: {e}")))?;
        if body.format != FORMAT {
            return Err(Error::invalid(format!(
                "snapshot {name:?} has format {}, this strata reads format {FORMAT}",
                body.format
            )));
        }
        if body.owner_uid != state::uid() {
            return Err(Error::Denied {
                reason: format!(
                    "snapshot {name:?} was made by uid {}, not by this user",
                    body.owner_uid
                ),
            });
        }
        Ok(body)
    }

    fn mac(&self) -> Result<Hmac<Sha256>> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .map_err(|e| Error::internal("key the snapshot seal", std::io::Error::other(e)))
    }

    /// Writes `snapshot.json` and its seal into `dir`.
    pub(crate) fn write_body(&self, dir: &Path, body: &Body) -> Result<()> {
        let text = serde_json::to_vec_pretty(body)
            .map_err(|e| Error::internal("encode snapshot.json", std::io::Error::other(e)))?;
        let mut mac = self.mac()?;
        mac.update(&text);
        let seal = manifest::hex(&mac.finalize().into_bytes());
        state::write_new_private(&dir.join(BODY), &text)?;
        state::write_new_private(&dir.join(SEAL), seal.as_bytes())
    }

    /// The `files` directory of the snapshot in `dir`.
    pub(crate) fn files_of(dir: &Path) -> PathBuf {
        dir.join(FILES)
    }
}

/// Reads a snapshot's small file (at most 16 MiB), refusing a symlink.
fn read_small(path: &Path) -> Result<Vec<u8>> {
    let mut data = Vec::new();
    manifest::open_no_follow(path)
        .map_err(|_| Error::Denied {
            reason: format!(
                "{} is missing or not a regular file; the snapshot is not used",
                path.display()
            ),
        })?
        .take(16 << 20)
        .read_to_end(&mut data)
        .map_err(|e| manifest::io_error(path, e))?;
    Ok(data)
}

/// The store's key: read (it must be this user's, 0600, 32 bytes) or made.
fn read_or_make_key(path: &Path) -> Result<[u8; 32]> {
    let mut key = [0u8; 32];
    if fs::symlink_metadata(path).is_err() {
        getrandom::fill(&mut key)
            .map_err(|e| Error::internal("make a snapshot key", std::io::Error::other(e)))?;
        match state::write_new_private(path, &key) {
            Ok(()) => return Ok(key),
            // Made by a concurrent caller in between: read theirs.
            Err(_) if fs::symlink_metadata(path).is_ok() => {}
            Err(e) => return Err(e),
        }
    }
    let meta = fs::symlink_metadata(path).map_err(|e| manifest::io_error(path, e))?;
    if !meta.is_file() || meta.uid() != state::uid() || meta.mode() & 0o077 != 0 {
        return Err(Error::Denied {
            reason: format!(
                "the snapshot key {} is not a private file of this user (it must be 0600 and yours)",
                path.display()
            ),
        });
    }
    let data = read_small(path)?;
    if data.len() != key.len() {
        return Err(Error::Denied {
            reason: format!("the snapshot key {} is not 32 bytes", path.display()),
        });
    }
    key.copy_from_slice(&data);
    Ok(key)
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A new snapshot id: `snap-` and 16 hex digits.
pub(crate) fn new_id() -> Result<String> {
    state::new_id().map(|id| format!("snap-{}", id.trim_start_matches("sb-")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_open_to_others_or_with_a_shared_key_is_refused() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("store");
        let store = SnapshotStore::open(&dir).expect("store");
        assert_eq!(
            fs::metadata(dir.join(KEY)).expect("key").mode() & 0o777,
            0o600
        );
        let again = SnapshotStore::open(&dir).expect("again");
        assert_eq!(store.key, again.key, "the key is kept");
        state::set_mode(&dir.join(KEY), 0o644).expect("chmod");
        let err = SnapshotStore::open(&dir).expect_err("shared key");
        assert!(err.to_string().contains("0600"), "{err}");
        state::set_mode(&dir.join(KEY), 0o600).expect("chmod");
        state::set_mode(&dir, 0o755).expect("chmod");
        let err = SnapshotStore::open(&dir).expect_err("open store");
        assert!(err.to_string().contains("0700"), "{err}");
    }

    #[test]
    fn names_are_single_plain_entries() {
        let base = tempfile::tempdir().expect("tempdir");
        let store = SnapshotStore::open(&base.path().join("s")).expect("store");
        for bad in ["", "..", ".key", "a/b", "../x"] {
            assert!(store.load(bad).is_err(), "{bad:?}");
            assert!(store.remove(bad).is_err(), "{bad:?}");
        }
        let err = store.load("missing").expect_err("missing");
        assert!(err.to_string().contains("no snapshot"), "{err}");
        assert!(new_id().expect("id").starts_with("snap-"));
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex("0g"), None);
    }
}
