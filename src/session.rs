//! Sessions: a sandbox whose files live across calls, on any backend.
//!
//! ```no_run
//! use strata::{Caps, Sandbox, Tool};
//!
//! let sandbox = Sandbox::builder().build()?;
//! let session = sandbox.session(&Caps::new())?;
//! session.write_file("main.py", b"print(open('data.txt').read())")?;
//! session.write_file("data.txt", b"hello")?;
//! let out = session.run(&Tool::command(["python3", "main.py"]))?;
//! assert_eq!(out.stdout, b"hello\n");
//! session.close()?;
//! # Ok::<(), strata::Error>(())
//! ```
//!
//! A session is a private host directory (mode 0700 under `$TMPDIR`, see
//! [`sandbox_os::session_files`]) mounted read-write at the session's workdir (default
//! `/workspace`, also the working directory) into every call. Each call is one sandbox run
//! with the session's caps: processes a call starts end with it (nothing runs between
//! calls), while files persist. Sessions are isolated from each other (each call sees its
//! own session's directory only), and [`Session::close`] — or dropping the last handle —
//! removes the directory; a crashed embedder's directories are removed by the next
//! process's first session.
//!
//! The calls of a session run under one host identity (the caps' agent, else the shared
//! agent [`SESSION_AGENT`]) so files one call writes are the next call's to change; a call
//! started while another runs sees what the other has written so far.
//!
//! File methods take guest paths: relative to the workdir, or absolute inside it. Copies
//! never follow symlinks, refuse devices, FIFOs, sockets and hard-linked files on the way
//! out, never leave the session's directory, are byte-exact, and are bounded by
//! [`SessionOptions::max_transfer`].

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sandbox_core::{
    Access, ByteSize, CancelToken, Caps, Error, Mount, Result, RunContext, RunOutput, Tool,
};
use sandbox_os::session_files::SessionFiles;
pub use sandbox_os::session_files::{DirEntry, FileKind, Transfer, MAX_ENTRIES};
use serde::Serialize;

use crate::sandbox::Sandbox;

/// The agent whose host identity a session's calls run under when the caps name none.
pub const SESSION_AGENT: &str = "strata-session";

/// What a per-call timeout of zero becomes: no timeout a tool could reach (a year; the
/// backends need a deadline). The caps' CPU-time limit still applies.
pub const NO_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// How a session is set up. Defaults: workdir `/workspace`, 256 MiB per copy, the
/// directory under `$TMPDIR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// The absolute guest path of the session's directory and the calls' working
    /// directory (unless the caps name another). Not `/`; no mount of the caps may overlap
    /// it.
    pub workdir: PathBuf,
    /// The most bytes one file operation (write, read, upload, download) moves.
    pub max_transfer: ByteSize,
    /// Where the session's private directory is made. Default: `$TMPDIR`.
    pub parent: Option<PathBuf>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            workdir: PathBuf::from("/workspace"),
            max_transfer: ByteSize::mib(256),
            parent: None,
        }
    }
}

/// Options of one [`Session::run_with`] call.
#[derive(Clone, Debug, Default)]
pub struct Call {
    /// Wall-clock timeout of this call. `None` (default): the caps' timeout; zero: none
    /// ([`NO_TIMEOUT`]).
    pub timeout: Option<Duration>,
    /// Cancellation, streaming, stdin, tier and risk, as for [`Sandbox::run_with`].
    pub ctx: RunContext,
}

/// One entry of [`Session::list_files`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    /// Its guest path (absolute, inside the workdir).
    pub path: String,
    /// Its name.
    pub name: String,
    /// What it is (symlinks are listed, never followed).
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
}

/// A sandbox whose files live across calls; see the [module docs](self). Cheap to clone:
/// clones share the session. `Send + Sync`: calls may run concurrently.
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    id: String,
    sandbox: Sandbox,
    /// The caps as given (what a tier sees: the session directory is Strata's own).
    given: Caps,
    /// The caps of every call: `given` plus the session directory.
    caps: Caps,
    workdir: PathBuf,
    files: RwLock<Option<SessionFiles>>,
    calls: Mutex<Vec<(u64, CancelToken)>>,
    next_call: AtomicU64,
    closed: AtomicBool,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.inner.id)
            .field("workdir", &self.inner.workdir)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Sandbox {
    /// Opens a session with `caps` and the default [`SessionOptions`].
    pub fn session(&self, caps: &Caps) -> Result<Session> {
        self.session_with(caps, SessionOptions::default())
    }

    /// Opens a session. Refused ([`Error::InvalidRequest`]) when the caps are invalid, the
    /// workdir is not an absolute path below `/`, or a mount of the caps overlaps it.
    pub fn session_with(&self, caps: &Caps, options: SessionOptions) -> Result<Session> {
        caps.validate()?;
        let workdir = check_workdir(&options.workdir)?;
        if let Some(mount) = caps
            .mounts
            .iter()
            .find(|m| m.guest.starts_with(&workdir) || workdir.starts_with(&m.guest))
        {
            return Err(Error::invalid(format!(
                "the mount at {} overlaps the session's workdir {}",
                mount.guest.display(),
                workdir.display()
            )));
        }
        let parent = options.parent.clone().unwrap_or_else(std::env::temp_dir);
        sweep_once(&parent);
        let files = SessionFiles::create_bounded(
            &parent,
            &sandbox_vm::leftovers::this_process(),
            options.max_transfer,
            Some(caps.limits.disk),
        )?;
        let mut run_caps = caps.clone();
        // The session directory is Strata's own, run by nothing on the host: its `.git` is
        // the tool's to change from call to call. Other writable grants keep the caps'
        // protection.
        if !caps.mounts.iter().any(|m| m.access == Access::ReadWrite) {
            run_caps.protect_host_executed = false;
        }
        run_caps.mounts.push(Mount::new(
            files.path().to_path_buf(),
            workdir.clone(),
            Access::ReadWrite,
        ));
        if run_caps.workdir.is_none() {
            run_caps.workdir = Some(workdir.clone());
        }
        if run_caps.agent.is_none() {
            run_caps.agent = Some(SESSION_AGENT.to_string());
        }
        let id = format!("s-{}", files.id());
        tracing::info!(session = %id, workdir = %workdir.display(), "session opened");
        Ok(Session {
            inner: Arc::new(Inner {
                id,
                sandbox: self.clone(),
                given: caps.clone(),
                caps: run_caps,
                workdir,
                files: RwLock::new(Some(files)),
                calls: Mutex::new(Vec::new()),
                next_call: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
        })
    }
}

/// The workdir, checked: absolute, below `/`, normal components only.
fn check_workdir(workdir: &Path) -> Result<PathBuf> {
    let mut parts = workdir.components();
    let rooted = parts.next() == Some(Component::RootDir);
    let normal = parts.clone().all(|c| matches!(c, Component::Normal(_)));
    if !rooted || !normal || parts.next().is_none() {
        return Err(Error::invalid(format!(
            "session workdir {} must be an absolute path below / without '.' or '..'",
            workdir.display()
        )));
    }
    Ok(workdir.to_path_buf())
}

/// Removes the session directories of dead embedders under `parent`, once per process and
/// parent.
/// States in a call's receipt how the session directory's size is bounded, and a denial
/// when the call filled it.
fn disk_receipt(files: &SessionFiles, receipt: &mut sandbox_core::Receipt) {
    use sandbox_core::{Capability, Mechanism};
    use sandbox_os::session_files::DiskBound;
    match files.disk_bound() {
        DiskBound::Tmpfs(bytes) => {
            receipt.enforce(
                Capability::Disk,
                Mechanism::Tmpfs,
                "session directory on a size-limited tmpfs",
                format!(
                    "{} for everything the session keeps (limits.disk), host-side writes included",
                    ByteSize(bytes)
                ),
            );
            if files.is_full() {
                receipt.deny(
                    Capability::Disk,
                    format!("the session directory is full at {}", ByteSize(bytes)),
                );
            }
        }
        DiskBound::Unbounded => receipt.gap(
            Capability::Disk,
            "the session directory is on the host's file system: an unprivileged embedder cannot mount a size-limited one, so limits.disk does not bound what calls keep there",
        ),
    }
}

fn sweep_once(parent: &Path) {
    static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut swept = match SWEPT.lock() {
        Ok(s) => s,
        Err(poisoned) => poisoned.into_inner(),
    };
    if !swept.iter().any(|p| p == parent) {
        let removed = sandbox_vm::leftovers::sweep_prefix(parent, "strata-session-");
        if removed > 0 {
            tracing::info!(removed, parent = %parent.display(), "removed sessions of dead processes");
        }
        swept.push(parent.to_path_buf());
    }
}

impl Session {
    /// The session's id (`s-` and 32 hex digits: 128 random bits).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The guest path of the session's directory.
    pub fn workdir(&self) -> &Path {
        &self.inner.workdir
    }

    /// The caps every call runs with (the given caps plus the session directory, workdir
    /// and identity).
    pub fn caps(&self) -> &Caps {
        &self.inner.caps
    }

    /// Whether [`Session::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    /// Runs `tool` in the session with the caps' timeout.
    pub fn run(&self, tool: &Tool) -> Result<RunOutput> {
        self.run_with(tool, &Call::default())
    }

    /// Runs `tool` in the session: one sandbox run with the session's caps (and `call`'s
    /// timeout), through the sandbox's tier, routing and audit log. Closing the session
    /// cancels the calls in flight.
    pub fn run_with(&self, tool: &Tool, call: &Call) -> Result<RunOutput> {
        let files = self.read_files()?;
        if files.is_none() {
            return Err(self.closed_error());
        }
        let mut caps = self.inner.caps.clone();
        match call.timeout {
            Some(t) if t.is_zero() => caps.limits.timeout = NO_TIMEOUT,
            Some(t) => caps.limits.timeout = t,
            None => {}
        }
        let number = self.inner.next_call.fetch_add(1, Ordering::SeqCst);
        self.calls().push((number, call.ctx.cancel.clone()));
        // A close() that ran between the check above and the push did not see this call's
        // token: it set `closed` before cancelling the registered ones, so this sees it.
        if self.is_closed() {
            call.ctx.cancel.cancel();
        }
        let result = self
            .inner
            .sandbox
            .run_audited(tool, &self.inner.given, &caps, &call.ctx);
        self.calls().retain(|(n, _)| *n != number);
        let result = result.map(|mut out| {
            if let Some(files) = files.as_ref() {
                disk_receipt(files, &mut out.receipt);
            }
            out
        });
        drop(files);
        result
    }

    /// Writes `data` to the file at `path` (replacing a file there, never writing through
    /// it; parent directories are created). Mode 0644.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.write_file(&rel, data))
    }

    /// Reads the regular file at `path`.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.read_file(&rel))
    }

    /// Reads the file at `path` when it holds at most `max` bytes (and at most the
    /// session's `max_transfer`); a larger file is refused ([`Error::InvalidRequest`])
    /// before any of it is read, so a server can bound what one call costs it.
    pub fn read_file_at_most(&self, path: &str, max: u64) -> Result<Vec<u8>> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.read_file_at_most(&rel, max))
    }

    /// Copies the embedder's file or directory `host` to `path` (see
    /// [`SessionFiles::upload`]: checked first, merged into an existing directory).
    pub fn upload(&self, host: &Path, path: &str) -> Result<Transfer> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.upload(host, &rel))
    }

    /// Copies the file or directory at `path` to the embedder's path `host`, which must
    /// not exist (see [`SessionFiles::download`]).
    pub fn download(&self, path: &str, host: &Path) -> Result<Transfer> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.download(&rel, host))
    }

    /// The entries of the directory at `path` (one level, sorted by name).
    pub fn list_files(&self, path: &str) -> Result<Vec<FileEntry>> {
        let rel = self.relative(path)?;
        let entries = self.with_files(|f| f.list(&rel))?;
        let dir = self.inner.workdir.join(&rel);
        Ok(entries
            .into_iter()
            .map(|e| FileEntry {
                path: dir.join(&e.name).to_string_lossy().into_owned(),
                name: e.name,
                kind: e.kind,
                size: e.size,
                mode: e.mode,
            })
            .collect())
    }

    /// Removes the file, symlink or directory tree at `path`.
    pub fn remove(&self, path: &str) -> Result<()> {
        let rel = self.relative(path)?;
        self.with_files(|f| f.remove(&rel))
    }

    /// Closes the session: cancels its calls in flight, waits for them to end, and removes
    /// its directory. Idempotent; later calls fail with [`Error::InvalidRequest`].
    pub fn close(&self) -> Result<()> {
        self.inner.closed.store(true, Ordering::SeqCst);
        for (_, token) in self.calls().iter() {
            token.cancel();
        }
        let files = {
            let mut slot = match self.inner.files.write() {
                Ok(slot) => slot,
                Err(poisoned) => poisoned.into_inner(),
            };
            slot.take()
        };
        match files {
            Some(files) => {
                tracing::info!(session = %self.inner.id, "session closed");
                files.destroy()
            }
            None => Ok(()),
        }
    }

    fn calls(&self) -> std::sync::MutexGuard<'_, Vec<(u64, CancelToken)>> {
        match self.inner.calls.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn read_files(&self) -> Result<std::sync::RwLockReadGuard<'_, Option<SessionFiles>>> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        Ok(match self.inner.files.read() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        })
    }

    fn with_files<T>(&self, op: impl FnOnce(&SessionFiles) -> Result<T>) -> Result<T> {
        let files = self.read_files()?;
        match files.as_ref() {
            Some(files) => op(files),
            None => Err(self.closed_error()),
        }
    }

    fn closed_error(&self) -> Error {
        Error::invalid(format!("session {} is closed", self.inner.id))
    }

    /// `path` relative to the workdir: relative paths as they are, absolute ones only
    /// inside the workdir.
    fn relative(&self, path: &str) -> Result<PathBuf> {
        let p = Path::new(path);
        // `.` components dropped, so listings name `/workspace/x`, not `/workspace/./x`;
        // `..` stays for the file layer to refuse.
        let tidy =
            |p: &Path| -> PathBuf { p.components().filter(|c| *c != Component::CurDir).collect() };
        if !p.is_absolute() {
            return Ok(tidy(p));
        }
        p.strip_prefix(&self.inner.workdir).map(tidy).map_err(|_| {
            Error::invalid(format!(
                "invalid path {path}: outside the session's workdir {}",
                self.inner.workdir.display()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workdir_must_be_absolute_and_below_root() {
        for bad in ["", "/", "workspace", "/a/../b"] {
            assert!(check_workdir(Path::new(bad)).is_err(), "{bad:?}");
        }
        assert!(check_workdir(Path::new("/workspace/project")).is_ok());
    }
}
