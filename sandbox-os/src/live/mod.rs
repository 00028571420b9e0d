//! A live process sandbox: built once like a run's sandbox (same plan, helper, namespaces,
//! landlock, seccomp, cgroup, egress), but its init stays up and starts one exec after
//! another (see [`init`]) until the host stops it.
//!
//! This is the host's low-level handle: it sends exec and signal requests over the
//! sandbox's channel and hands back init's events; the live supervisor (`sandbox-live`)
//! keeps the process table, output buffers and clocks. Dropping a [`LiveProcess`] ends the
//! sandbox: the helper is killed, which kills init and with it every process of the
//! sandbox's pid namespace (also those that left their session with `setsid`), and the
//! cgroup is removed once they are gone.

pub(crate) mod init;
pub mod wire;

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{
    Capability, Error, Mechanism, Receipt, Result, RunContext, RunSpec, SetupStage,
};
use sandbox_egress::host::RunEgress;

use crate::cgroup::RunCgroup;
use crate::file_tree::FileTree;
use crate::protocol::{Command, Enforced, Event, FrameBuffer};
use crate::supervise::Prepared;
use crate::sys;
use crate::ProcessBackend;

pub use crate::protocol::Command as LiveCommand;
pub use wire::{LiveEvent, LiveRequest};

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (call it before starting any
/// thread: they inherit the mask) and returns a descriptor that is readable once one of
/// them arrived, so a supervisor stops its sandbox cleanly instead of dying with it.
///
/// # Errors
/// The OS refused the signalfd.
pub fn stop_signals() -> std::io::Result<OwnedFd> {
    sys::signal_fd(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
}

/// Waits (at most 10 s) until every cgroup of ended sandboxes is removed: call it before a
/// process that held live sandboxes exits.
pub fn flush_cleanup() {
    crate::cgroup_cleanup::flush(Duration::from_secs(10));
}

/// How long starting a live sandbox may take before it is refused (building one takes
/// milliseconds; this bounds a wedged helper).
pub const START_DEADLINE: Duration = Duration::from_secs(30);

/// A live sandbox on the process backend. See the module docs.
pub struct LiveProcess {
    helper: Prepared,
    channel: OwnedFd,
    cgroup: Option<RunCgroup>,
    egress: Option<RunEgress>,
    receipt: Receipt,
    env: Vec<String>,
    workdir: PathBuf,
    control: FrameBuffer,
    paused: Option<PauseMethod>,
    /// The sandbox's root directory (`O_PATH`), from init.
    root: OwnedFd,
}

/// How a live sandbox is paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMethod {
    /// Its cgroup is frozen: no process runs or notices (cgroup v2 `cgroup.freeze`, or
    /// the v1 freezer).
    Freezer,
    /// Without a cgroup freezer: every process but init gets `SIGSTOP`, and `SIGCONT` on
    /// resume. No process runs, but a process can notice (its parent sees it stopped, a
    /// `SIGCONT` handler runs), and one stopped before the pause is continued too.
    Signals,
    /// A microVM's vCPUs are stopped by its VMM (QMP `stop`): nothing in the guest runs,
    /// and its clock stands still (it is set again on resume).
    Vm,
}

impl PauseMethod {
    /// In words, for receipts and listings.
    pub fn describe(self) -> &'static str {
        match self {
            PauseMethod::Freezer => "cgroup freezer: every process of the sandbox is frozen; none runs or can tell",
            PauseMethod::Signals => "SIGSTOP to every process of the sandbox, SIGCONT on resume (no cgroup freezer here): none runs, but a process can tell it was stopped",
            PauseMethod::Vm => "the VM's vCPUs are stopped by its VMM (QMP stop): nothing in the guest runs or can tell, except by its clock, which is set again on resume",
        }
    }
}

impl std::fmt::Debug for LiveProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveProcess")
            .field("helper", &self.helper)
            .finish_non_exhaustive()
    }
}

/// Builds a live sandbox's receipt from what its helper reports it enforced and its cgroup.
pub(crate) type ReceiptFromReport =
    Box<dyn FnOnce(Enforced, Option<&RunCgroup>) -> Result<Receipt>>;

/// What [`ProcessBackend::start_live`] assembles before the sandbox reports ready.
pub(crate) struct LiveParts {
    pub(crate) helper: Prepared,
    pub(crate) cgroup: Option<RunCgroup>,
    pub(crate) egress: Option<RunEgress>,
    pub(crate) command: Command,
    pub(crate) workdir: PathBuf,
    /// Builds the receipt from what the helper reports it enforced.
    pub(crate) receipt: ReceiptFromReport,
}

impl ProcessBackend {
    /// Starts a live sandbox for `spec` (planned for [`sandbox_core::BackendKind::Process`],
    /// or the container backend's native runtime through its hook). Returns once the
    /// sandbox is built and its init waits for execs; its receipt is built from what the
    /// helper reports it enforced, like a run's.
    ///
    /// # Errors
    /// As [`sandbox_core::Backend::run`] before anything runs: invalid or unenforceable
    /// requests, setup failures with their stage.
    pub fn start_live(&self, spec: &RunSpec, ctx: &RunContext) -> Result<LiveProcess> {
        let parts = self.build_live(spec, ctx, &|_, _| Ok(()))?;
        LiveProcess::ready(parts)
    }
}

impl LiveProcess {
    /// Waits for the helper's `Ready` and takes the sandbox's channel.
    pub(crate) fn ready(parts: LiveParts) -> Result<LiveProcess> {
        let LiveParts {
            mut helper,
            cgroup,
            egress,
            command,
            workdir,
            receipt,
        } = parts;
        let channel = helper.take_live().ok_or_else(|| {
            Error::internal(
                "start a live sandbox",
                std::io::Error::other("the helper has no live channel"),
            )
        })?;
        let mut control = FrameBuffer::default();
        let enforced = wait_ready(&helper, &mut control)?;
        let mut receipt = receipt(enforced, cgroup.as_ref())?;
        let (mechanism, method) = if cgroup.as_ref().is_some_and(RunCgroup::freezable) {
            (Mechanism::Cgroup, PauseMethod::Freezer)
        } else {
            (Mechanism::Supervisor, PauseMethod::Signals)
        };
        receipt.enforce(Capability::Lifetime, mechanism, "pause", method.describe());
        let root = take_root(&channel)?;
        Ok(LiveProcess {
            helper,
            channel,
            cgroup,
            egress,
            receipt,
            env: command.env,
            workdir,
            control,
            paused: None,
            root,
        })
    }

    /// The sandbox's files, seen from the host through its root directory: every path
    /// beneath it, never following a symlink (see [`FileTree`]); each copy bounded by
    /// `max_transfer` bytes. What the host makes is given to the sandbox's user.
    ///
    /// # Errors
    /// The root descriptor cannot be copied (out of descriptors).
    pub fn files(&self, max_transfer: u64) -> Result<FileTree> {
        let root = self
            .root
            .try_clone()
            .map_err(|e| Error::internal("copy the live sandbox's root descriptor", e))?;
        let owner = rustix::fs::fstat(&root)
            .map_err(|e| Error::internal("read the live sandbox's root", e.into()))?;
        let tree = FileTree::new(root, max_transfer);
        Ok(if rustix::process::geteuid().is_root() {
            tree.with_owner(owner.st_uid, owner.st_gid)
        } else {
            tree
        })
    }

    /// How [`LiveProcess::pause`] pauses this sandbox.
    pub fn pause_method(&self) -> PauseMethod {
        if self.cgroup.as_ref().is_some_and(RunCgroup::freezable) {
            PauseMethod::Freezer
        } else {
            PauseMethod::Signals
        }
    }

    /// Whether the sandbox is paused, and how.
    pub fn paused(&self) -> Option<PauseMethod> {
        self.paused
    }

    /// Pauses every process of the sandbox (see [`PauseMethod`]); pausing a paused sandbox
    /// does nothing. Output already written stays readable; nothing runs until
    /// [`LiveProcess::resume`].
    ///
    /// # Errors
    /// The cgroup did not freeze (the sandbox keeps running), or the sandbox is gone.
    pub fn pause(&mut self) -> Result<PauseMethod> {
        if let Some(method) = self.paused {
            return Ok(method);
        }
        let method = self.pause_method();
        match (method, &self.cgroup) {
            (PauseMethod::Freezer, Some(cgroup)) => {
                cgroup.freeze(true).map_err(|e| {
                    Error::setup(SetupStage::Cgroup, "freeze the live sandbox's cgroup", e)
                })?;
            }
            _ => wire::send(self.channel.as_fd(), &LiveRequest::StopAll, &[])
                .map_err(|e| Error::internal("pause the live sandbox", e))?,
        }
        self.paused = Some(method);
        Ok(method)
    }

    /// Resumes a paused sandbox; resuming a running one does nothing.
    ///
    /// # Errors
    /// The cgroup did not thaw, or the sandbox is gone.
    pub fn resume(&mut self) -> Result<()> {
        match (self.paused, &self.cgroup) {
            (None, _) => return Ok(()),
            (Some(PauseMethod::Freezer), Some(cgroup)) => {
                cgroup.freeze(false).map_err(|e| {
                    Error::setup(SetupStage::Cgroup, "thaw the live sandbox's cgroup", e)
                })?;
            }
            _ => wire::send(self.channel.as_fd(), &LiveRequest::ContinueAll, &[])
                .map_err(|e| Error::internal("resume the live sandbox", e))?,
        }
        self.paused = None;
        Ok(())
    }

    /// Asks init to open a TCP connection to `127.0.0.1:port` inside the sandbox; the
    /// answer is a [`LiveEvent::Connecting`] (with the socket) or
    /// [`LiveEvent::ConnectFailed`] with `id`.
    ///
    /// # Errors
    /// The sandbox is gone.
    pub fn connect(&self, id: u64, port: u16) -> Result<()> {
        wire::send(
            self.channel.as_fd(),
            &LiveRequest::Connect { id, port },
            &[],
        )
        .map_err(|e| Error::internal("connect into the live sandbox", e))
    }

    /// The sandbox's receipt: what was enforced when it started, for all its execs.
    pub fn receipt(&self) -> &Receipt {
        &self.receipt
    }

    /// The receipt, for a backend built on this one to add what it set up itself (the
    /// container backend's image root and user).
    pub fn receipt_mut(&mut self) -> &mut Receipt {
        &mut self.receipt
    }

    /// The environment every exec starts from (`KEY=VALUE`: the caps' env, PATH, HOME,
    /// LANG and the proxy variables).
    pub fn base_env(&self) -> &[String] {
        &self.env
    }

    /// The default working directory of an exec.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Asks init to start `command` in `workdir` with `stdio` (stdin, stdout, stderr); the
    /// answer is a [`LiveEvent::Started`] or [`LiveEvent::ExecFailed`] with `id`. With
    /// `tty`, stdin is a terminal (a pty's slave) that becomes the exec's controlling
    /// terminal.
    ///
    /// # Errors
    /// The sandbox is gone, or the request is too large for one message.
    pub fn exec(
        &self,
        id: u64,
        command: Command,
        workdir: PathBuf,
        stdio: [BorrowedFd<'_>; 3],
        tty: bool,
    ) -> Result<()> {
        let request = LiveRequest::Exec {
            id,
            command,
            workdir,
            tty,
        };
        wire::send(self.channel.as_fd(), &request, &stdio)
            .map_err(|e| Error::setup(SetupStage::Processes, "send an exec to the live sandbox", e))
    }

    /// Sends `signal` to exec `pid`'s process group.
    ///
    /// # Errors
    /// The sandbox is gone.
    pub fn signal(&self, pid: i32, signal: i32) -> Result<()> {
        wire::send(
            self.channel.as_fd(),
            &LiveRequest::Signal { pid, signal },
            &[],
        )
        .map_err(|e| Error::internal("signal a live sandbox's process", e))
    }

    /// The descriptor that is readable when init has an event ([`LiveProcess::next_event`]).
    pub fn events(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// The next event from init with the descriptor it carries (a
    /// [`LiveEvent::Connecting`]'s socket); `Ok(None)` when init is gone (the sandbox ended).
    ///
    /// # Errors
    /// A malformed message.
    pub fn next_event(&self) -> Result<Option<(LiveEvent, Option<OwnedFd>)>> {
        match wire::receive::<LiveEvent>(self.channel.as_fd()) {
            Ok(event) => Ok(event.map(|(event, fds)| (event, fds.into_iter().next()))),
            Err(e) => Err(Error::internal("read the live sandbox's events", e)),
        }
    }

    /// The helper's control socket: readable when the helper reports (the sandbox ended on
    /// its own, e.g. init was killed at the memory limit).
    pub fn helper_events(&self) -> BorrowedFd<'_> {
        self.helper.control_fd()
    }

    /// Whether the sandbox has ended (the helper reported that every process is gone).
    pub fn ended(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        match sys::read(self.helper.control_fd().as_raw_fd(), &mut buf) {
            Ok(0) | Err(_) => true,
            Ok(n) => {
                self.control.push(&buf[..n]);
                let mut ended = false;
                while let Ok(Some(event)) = self.control.next_frame::<Event>() {
                    ended |= matches!(event, Event::Exited { .. });
                }
                ended
            }
        }
    }

    /// CPU time used by every process of the sandbox so far, when its cgroup counts it.
    pub fn cpu_usage_us(&self) -> Option<u64> {
        self.cgroup.as_ref().and_then(RunCgroup::cpu_usage_us)
    }

    /// Ends the sandbox now (every process, the namespaces, the cgroup) and returns the
    /// egress decisions of its life, when it had an allowlist.
    pub fn stop(self) -> Option<(NetworkReceipt, Vec<Denial>)> {
        let LiveProcess {
            helper,
            channel,
            cgroup,
            egress,
            paused,
            ..
        } = self;
        // A frozen sandbox cannot act on the closed channel: kill its processes first (the
        // cgroup thaws them once signalled, so they die without running).
        if paused == Some(PauseMethod::Freezer) {
            if let Some(cgroup) = &cgroup {
                cgroup.kill_all();
            }
        }
        // Closing the channel makes init kill and reap every process of the sandbox and exit;
        // the helper reports that and exits once init is gone, which the kernel allows only
        // after the whole pid namespace is. Wait for it (bounded), so that "stopped" means
        // gone also without a cgroup to kill through.
        drop(channel);
        wait_closed(helper.control_fd().as_raw_fd(), STOP_WAIT);
        // Then (or if it hung) the helper is killed and reaped, init dies by its
        // parent-death signal, and the cgroup kills whatever is left before it is removed.
        drop(helper);
        drop(cgroup);
        egress.map(RunEgress::finish)
    }
}

/// How long [`LiveProcess::stop`] waits for the sandbox's processes to be gone before it
/// kills the helper: 10 s.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// Reads (and drops) what `fd` delivers until it is closed or `timeout` passed.
fn wait_closed(fd: std::os::fd::RawFd, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let mut fds = [sys::pollfd_in(fd)];
        let wait = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        match sys::poll(&mut fds, wait) {
            Ok(0) => return,
            Ok(_) => match sys::read(fd, &mut buf) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            },
            Err(_) => {}
        }
    }
}

/// Asks init for its root directory and waits (at most [`START_DEADLINE`]) for it; nothing
/// else is in flight on the channel yet.
fn take_root(channel: &OwnedFd) -> Result<OwnedFd> {
    let failed =
        |e: std::io::Error| Error::setup(SetupStage::Processes, "take the live sandbox's root", e);
    wire::send(channel.as_fd(), &LiveRequest::Root, &[]).map_err(failed)?;
    let mut fds = [sys::pollfd_in(channel.as_raw_fd())];
    let wait = i32::try_from(START_DEADLINE.as_millis()).unwrap_or(i32::MAX);
    if !matches!(sys::poll(&mut fds, wait), Ok(n) if n > 0) {
        return Err(failed(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "init did not answer",
        )));
    }
    match wire::receive::<LiveEvent>(channel.as_fd()).map_err(failed)? {
        Some((LiveEvent::Root, fds)) => fds
            .into_iter()
            .next()
            .ok_or_else(|| failed(std::io::Error::other("init sent no descriptor"))),
        Some((other, _)) => Err(failed(std::io::Error::other(format!(
            "init answered {other:?}"
        )))),
        None => Err(failed(std::io::Error::other("init is gone"))),
    }
}

/// Reads the helper's control socket until the sandbox is ready (or refused).
fn wait_ready(helper: &Prepared, frames: &mut FrameBuffer) -> Result<Enforced> {
    let deadline = Instant::now() + START_DEADLINE;
    let fd = helper.control_fd().as_raw_fd();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if let Some(event) = frames
            .next_frame::<Event>()
            .map_err(|e| Error::internal("read the helper's report", e))?
        {
            return match event {
                Event::Ready { enforced } => Ok(*enforced),
                other => Err(crate::outcome::refusal(other)),
            };
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::setup(
                SetupStage::Processes,
                "build the live sandbox",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "building the sandbox took too long",
                ),
            ));
        }
        let mut fds = [sys::pollfd_in(fd)];
        let wait = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
        if sys::poll(&mut fds, wait).is_err() {
            continue;
        }
        match sys::read(fd, &mut buf) {
            Ok(0) => {
                return Err(Error::Internal {
                    message: "the helper ended before the live sandbox was ready".into(),
                    source: None,
                })
            }
            Ok(n) => frames.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Error::internal("read the helper's report", e)),
        }
    }
}
