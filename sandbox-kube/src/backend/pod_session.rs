//! A session on the cluster: one claimed pod held across calls, its `/workspace` kept
//! between them (the pod is the session's state; nothing of it is on this machine).
//!
//! Each call execs the agent's `serve` in the pod again and drives one run, checked like a
//! run of [`ClusterBackend`] (the caps of each call; no inner layer: the inner sandbox would
//! not see the workspace). Files go in and out over the same channel: a write is carried in
//! the run request (at most [`MAX_WRITE`] bytes), a read comes back as the request's report
//! (at most [`MAX_READ`] bytes). Paths are relative to the workspace, without `..`. Closing
//! (or dropping) the session deletes its claim, its sandbox and its pod.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use sandbox_agent::driver::Ending;
use sandbox_agent::protocol::{GuestExit, GuestFile, RunRequest, MAX_REPORT};
use sandbox_core::grant::RealHost;
use sandbox_core::{BackendKind, Caps, Error, Result, RunContext, RunOutput, RunSpec, Tool};

use super::{claim_on, cluster_error, ClusterBackend};

/// The largest file [`ClusterSession::write_file`] writes: 512 KiB (it travels in one frame
/// of the agent protocol, base64-encoded).
pub const MAX_WRITE: usize = 512 * 1024;

/// The largest file [`ClusterSession::read_file`] reads: the agent's report limit, 256 KiB.
pub const MAX_READ: usize = MAX_REPORT;

/// One pod held for a sequence of calls. Released on [`ClusterSession::close`] or drop.
#[derive(Debug)]
pub struct ClusterSession<'a> {
    backend: &'a ClusterBackend,
    claim: String,
    pod: String,
    closed: AtomicBool,
}

impl ClusterBackend {
    /// Claims a pod from the warm pool and holds it for a session.
    ///
    /// # Errors
    /// As a run's claim: [`Error::Setup`] when the claim cannot be made or does not bind
    /// within the claim timeout (the claim is deleted then); [`Error::Cancelled`].
    pub fn session(&self, ctx: &RunContext) -> Result<ClusterSession<'_>> {
        self.template()?;
        let cluster = self.cluster.clone();
        let claim = claim_on(&self.options.warm_pool);
        let name = self
            .block(async move { cluster.claim(&claim).await }, ctx)?
            .map_err(|e| cluster_error("claim", e))?;
        match self.bind(&name, ctx) {
            Ok(bound) => Ok(ClusterSession {
                backend: self,
                claim: name,
                pod: bound.sandbox,
                closed: AtomicBool::new(false),
            }),
            Err(e) => {
                self.release(&name);
                Err(e)
            }
        }
    }
}

impl ClusterSession<'_> {
    /// The session's claim.
    pub fn claim(&self) -> &str {
        &self.claim
    }

    /// The pod (and sandbox) the session holds.
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// Runs `tool` with `caps` in the session's pod, in its workspace.
    ///
    /// # Errors
    /// As [`ClusterBackend`]'s runs; [`Error::InvalidRequest`] once the session is closed.
    pub fn run(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        self.open()?;
        let started = Instant::now();
        let spec = RunSpec::plan(BackendKind::Cluster, tool, caps, &RealHost)?;
        let prepared = self.backend.prepare(tool, &spec, ctx, false)?;
        let vm = self
            .backend
            .drive(&self.pod, prepared.request.clone(), caps, ctx)?;
        let lifetime = format!(
            "the pod of session claim {}, kept until the session closes (then deleted with its sandbox)",
            self.claim
        );
        self.backend
            .finish(tool, caps, ctx, prepared, vm, started, lifetime)
    }

    /// Writes `data` to `path` (relative to the workspace; parents created).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad path, more than [`MAX_WRITE`] bytes, or a closed
    /// session; [`Error::Setup`] when the agent cannot write it.
    pub fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.open()?;
        let path = relative(path)?;
        if data.len() > MAX_WRITE {
            return Err(Error::invalid(format!(
                "cluster session: {} bytes for {path}; at most {MAX_WRITE} per write",
                data.len()
            )));
        }
        let mut request = file_request(&["/bin/sh", "-c", ":"]);
        request.files = vec![GuestFile {
            path: path.to_owned(),
            data: data.to_vec(),
        }];
        let vm = self
            .backend
            .drive(&self.pod, request, &Caps::default(), &RunContext::default())
            .map_err(|e| file_error("write", path, e))?;
        match vm.ending {
            Ending::Agent(GuestExit::Exited { code: 0 }) => Ok(()),
            other => Err(file_error(
                "write",
                path,
                Error::invalid(format!("the agent ended with {other:?}")),
            )),
        }
    }

    /// Reads the regular file at `path` (relative to the workspace).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad path, a missing file, one larger than
    /// [`MAX_READ`], or a closed session.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.open()?;
        let path = relative(path)?;
        let limit = MAX_READ.to_string();
        // Exit 3: missing or not a regular file; 4: too large for one report.
        let check = "test -f \"$1\" || exit 3; [ $(wc -c < \"$1\") -le \"$2\" ] || exit 4";
        let mut request = file_request(&["/bin/sh", "-c", check, "sh", path, &limit]);
        request.report = Some(path.to_owned());
        let vm = self
            .backend
            .drive(&self.pod, request, &Caps::default(), &RunContext::default())
            .map_err(|e| file_error("read", path, e))?;
        match vm.ending {
            Ending::Agent(GuestExit::Exited { code: 0 }) => Ok(vm.report.unwrap_or_default()),
            Ending::Agent(GuestExit::Exited { code: 3 }) => Err(Error::invalid(format!(
                "cluster session: not found or not a regular file: {path}"
            ))),
            Ending::Agent(GuestExit::Exited { code: 4 }) => Err(Error::invalid(format!(
                "cluster session: {path} is larger than {MAX_READ} bytes"
            ))),
            other => Err(file_error(
                "read",
                path,
                Error::invalid(format!("the agent ended with {other:?}")),
            )),
        }
    }

    /// Releases the pod: deletes the claim (its sandbox and pod follow). Idempotent.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.backend.release(&self.claim);
        }
    }

    fn open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::invalid(format!(
                "cluster session {} is closed",
                self.claim
            )));
        }
        Ok(())
    }
}

impl Drop for ClusterSession<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// A request that runs `argv` with the pod's environment, no limits beyond the defaults.
fn file_request(argv: &[&str]) -> RunRequest {
    let mut request = sandbox_agent::request::plain(
        argv.iter().map(|a| (*a).to_owned()).collect(),
        &Caps::default(),
        &super::POD,
        &[],
        false,
    );
    request.entropy = Vec::new();
    request
}

/// `path` if it is relative and stays beneath the workspace (no `..`, no empty name).
fn relative(path: &str) -> Result<&str> {
    let ok = !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if ok {
        Ok(path)
    } else {
        Err(Error::invalid(format!(
            "cluster session: {path:?} must be a relative path beneath the workspace, without '.' or '..'"
        )))
    }
}

fn file_error(verb: &str, path: &str, e: Error) -> Error {
    match e {
        Error::InvalidRequest { reason } => {
            Error::invalid(format!("cluster session: {verb} {path}: {reason}"))
        }
        other => other,
    }
}
