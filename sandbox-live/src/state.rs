//! Where live sandboxes are found: one state directory per user, mode 0700, holding one
//! directory per sandbox (mode 0700) with its control socket and its `info.json`.
//!
//! The state directory is `$STRATA_STATE_DIR` when set, else `$XDG_RUNTIME_DIR/strata`,
//! else `/run/strata` for root and `/tmp/strata-UID` for everyone else. An existing one must
//! be a real directory (not a symlink) owned by the caller with no access for others, or
//! it is refused: another user cannot plant sockets where ours are looked for. The control
//! socket checks each client's credentials too (see [`peer_allowed`]).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sandbox_core::{Error, Result};

/// The control socket's file name in a sandbox's directory.
pub const SOCKET: &str = "control.sock";
/// The sandbox's description (id, name, backend, supervisor pid) in its directory.
pub const INFO: &str = "info.json";
/// What the sandbox was started with ([`SandboxSpec`]), for snapshots and fork.
pub const SPEC: &str = "spec.json";

/// What a live sandbox was started with, kept (0600) beside its `info.json` so a snapshot
/// or fork of it starts the same sandbox again. Not in `info.json` (which `ls` shows): the
/// caps may carry secrets in their environment.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// The caps, as started.
    pub caps: sandbox_core::Caps,
    /// Strict or best-effort.
    pub strictness: sandbox_core::Strictness,
    /// The backend holding it.
    pub backend: sandbox_core::BackendKind,
    /// The tier, approver and audit log its execs go through.
    pub policy: crate::policy::LivePolicy,
    /// The `strata-helper` it was started with, if one was named.
    pub helper: Option<PathBuf>,
    /// The supervisor binary holding it (a fork's children are held by the same).
    #[serde(default)]
    pub supervisor: Option<PathBuf>,
    /// Its default working directory inside.
    pub workdir: PathBuf,
}

impl SandboxSpec {
    /// Writes the spec to `dir` (mode 0600, never over an existing file).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(SPEC);
        let text = serde_json::to_vec(self)
            .map_err(|e| Error::internal("encode the sandbox's spec", io::Error::other(e)))?;
        write_new_private(&path, &text)
    }

    /// Reads the spec of the sandbox whose directory is `dir`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when it is missing or unreadable (a sandbox started by an
    /// older supervisor has none).
    pub fn read(dir: &Path) -> Result<SandboxSpec> {
        let path = dir.join(SPEC);
        let text = fs::read(&path).map_err(|e| {
            Error::invalid(format!(
                "{}: {e} (a sandbox started by an older strata cannot be snapshot)",
                path.display()
            ))
        })?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::invalid(format!("{}: not a sandbox spec: {e}", path.display())))
    }
}

/// Writes `data` to the new file `path`, mode 0600 (an existing file is an error).
///
/// # Errors
/// The OS error, naming the file.
pub fn write_new_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::internal(format!("write {}", path.display()), e))?;
    file.write_all(data)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::internal(format!("write {}", path.display()), e))
}

/// The caller's effective uid.
pub fn uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The state directory for this user (see the module docs), created 0700 when missing.
///
/// # Errors
/// [`Error::InvalidRequest`] when it exists but is not a private directory of this user.
pub fn state_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("STRATA_STATE_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
            Some(run) => Path::new(&run).join("strata"),
            None if uid() == 0 => PathBuf::from("/run/strata"),
            None => PathBuf::from(format!("/tmp/strata-{}", uid())),
        },
    };
    private_dir(&dir)?;
    Ok(dir)
}

/// Creates `dir` 0700 (parents as needed), or checks that the existing one is a directory
/// of this user that nobody else can enter.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the directory and what is wrong with it.
pub fn private_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(|e| state_error(parent, e))?;
            }
            match fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(state_error(dir, e)),
            }
        }
        Err(e) => return Err(state_error(dir, e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(|e| state_error(dir, e))?;
    if !meta.file_type().is_dir() {
        return Err(Error::invalid(format!(
            "state directory {} is not a directory (a symlink or file is refused)",
            dir.display()
        )));
    }
    if meta.uid() != uid() {
        return Err(Error::invalid(format!(
            "state directory {} belongs to uid {}, not to this user ({})",
            dir.display(),
            meta.uid(),
            uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Error::invalid(format!(
            "state directory {} is open to other users (mode {:o}); it must be 0700",
            dir.display(),
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

fn state_error(dir: &Path, e: io::Error) -> Error {
    Error::invalid(format!("state directory {}: {e}", dir.display()))
}

/// A new sandbox id: `sb-` and 16 hex digits from the OS's random source.
///
/// # Errors
/// The OS has no randomness to give.
pub fn new_id() -> Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::internal("make a sandbox id", io::Error::other(e)))?;
    Ok(format!(
        "sb-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// Whether `text` could be an id or name of a sandbox: 1-64 of `[A-Za-z0-9_.-]`, not
/// starting with a dot (so it is one plain directory entry).
pub fn valid_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && !text.starts_with('.')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The directory of sandbox `id` in `state`.
///
/// # Errors
/// [`Error::InvalidRequest`] when `id` is not a valid id or name.
pub fn sandbox_dir(state: &Path, id: &str) -> Result<PathBuf> {
    if !valid_name(id) {
        return Err(Error::invalid(format!(
            "{id:?} is not a sandbox id or name (1-64 of A-Z a-z 0-9 _ . -)"
        )));
    }
    Ok(state.join(id))
}

/// Whether the client on `stream` may drive sandboxes of `owner`: the same uid, or root.
pub fn peer_allowed(stream: &UnixStream, owner: u32) -> bool {
    match rustix::net::sockopt::socket_peercred(stream) {
        Ok(cred) => {
            let uid = cred.uid.as_raw();
            uid == owner || uid == 0
        }
        Err(_) => false,
    }
}

/// Sets `path` to `mode` (for the files the supervisor makes: 0600).
///
/// # Errors
/// The OS error.
pub fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_open_to_others_is_refused() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("state");
        private_dir(&dir).expect("created");
        assert_eq!(fs::metadata(&dir).expect("meta").mode() & 0o777, 0o700);
        set_mode(&dir, 0o755).expect("chmod");
        let err = private_dir(&dir).expect_err("open directory");
        assert!(err.to_string().contains("0700"), "{err}");
    }

    #[test]
    fn a_symlinked_state_directory_is_refused() {
        let base = tempfile::tempdir().expect("tempdir");
        let real = base.path().join("real");
        private_dir(&real).expect("real");
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let err = private_dir(&link).expect_err("symlink");
        assert!(err.to_string().contains("symlink"), "{err}");
    }

    #[test]
    fn ids_and_names_are_single_plain_entries() {
        let id = new_id().expect("id");
        assert!(valid_name(&id), "{id}");
        for bad in ["", "..", ".hidden", "a/b", "x y", &"n".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(sandbox_dir(Path::new("/s"), "../etc").is_err());
    }
}
