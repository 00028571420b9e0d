//! The sandbox a supervisor holds: the process backend's [`LiveProcess`] (the container
//! backend's native runtime is one too) or the microVM backend's [`LiveVm`]. Both take execs
//! with the supervisor's stdio descriptors and report init-style events; what only one of
//! them can do yet (watching files on the microVM) is refused with a typed error naming the
//! backend.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{BackendKind, Error, Receipt, Result};
use sandbox_os::file_tree::FileTree;
use sandbox_os::live::{LiveCommand, LiveEvent, LiveProcess, PauseMethod};
use sandbox_vm::LiveVm;

/// A held live sandbox.
#[derive(Debug)]
pub(crate) enum Held {
    /// On the process backend (or the container backend's native runtime).
    Process(Box<LiveProcess>),
    /// On the microVM backend.
    Vm(Box<LiveVm>),
}

impl Held {
    /// The sandbox's receipt.
    pub(crate) fn receipt(&self) -> &Receipt {
        match self {
            Held::Process(p) => p.receipt(),
            Held::Vm(v) => v.receipt(),
        }
    }

    /// The environment every exec starts from.
    pub(crate) fn base_env(&self) -> &[String] {
        match self {
            Held::Process(p) => p.base_env(),
            Held::Vm(v) => v.base_env(),
        }
    }

    /// The default working directory of an exec.
    pub(crate) fn workdir(&self) -> &Path {
        match self {
            Held::Process(p) => p.workdir(),
            Held::Vm(v) => v.workdir(),
        }
    }

    /// Starts an exec (see [`LiveProcess::exec`]).
    pub(crate) fn exec(
        &self,
        id: u64,
        command: LiveCommand,
        workdir: PathBuf,
        stdio: [BorrowedFd<'_>; 3],
        tty: bool,
    ) -> Result<()> {
        match self {
            Held::Process(p) => p.exec(id, command, workdir, stdio, tty),
            Held::Vm(v) => v.exec(id, command, workdir, stdio, tty),
        }
    }

    /// Signals exec `pid`'s process group.
    pub(crate) fn signal(&self, pid: i32, signal: i32) -> Result<()> {
        match self {
            Held::Process(p) => p.signal(pid, signal),
            Held::Vm(v) => v.signal(pid, signal),
        }
    }

    /// Readable when an event waits.
    pub(crate) fn events(&self) -> BorrowedFd<'_> {
        match self {
            Held::Process(p) => p.events(),
            Held::Vm(v) => v.events(),
        }
    }

    /// The next event; `Ok(None)` once the sandbox ended.
    pub(crate) fn next_event(&self) -> Result<Option<(LiveEvent, Option<OwnedFd>)>> {
        match self {
            Held::Process(p) => p.next_event(),
            Held::Vm(v) => v.next_event(),
        }
    }

    /// Readable when the sandbox may have ended by itself ([`Held::ended`] says).
    pub(crate) fn end_events(&self) -> BorrowedFd<'_> {
        match self {
            Held::Process(p) => p.helper_events(),
            Held::Vm(v) => v.gone_events(),
        }
    }

    /// Whether the sandbox ended by itself.
    pub(crate) fn ended(&mut self) -> bool {
        match self {
            Held::Process(p) => p.ended(),
            Held::Vm(v) => v.ended(),
        }
    }

    /// Pauses every process of the sandbox.
    pub(crate) fn pause(&mut self) -> Result<PauseMethod> {
        match self {
            Held::Process(p) => p.pause(),
            Held::Vm(v) => v.pause(),
        }
    }

    /// Resumes a paused sandbox.
    pub(crate) fn resume(&mut self) -> Result<()> {
        match self {
            Held::Process(p) => p.resume(),
            Held::Vm(v) => v.resume(),
        }
    }

    /// CPU time the sandbox used so far, where it is counted.
    pub(crate) fn cpu_usage_us(&self) -> Option<u64> {
        match self {
            Held::Process(p) => p.cpu_usage_us(),
            Held::Vm(v) => v.cpu_usage_us(),
        }
    }

    /// The sandbox's files, seen from the host (a microVM's go through its agent: see
    /// [`Held::vm_files`]).
    ///
    /// # Errors
    /// On the microVM backend for what only a host view serves (watches), or as
    /// [`LiveProcess::files`].
    pub(crate) fn files(&self, max_transfer: u64) -> Result<FileTree> {
        match self {
            Held::Process(p) => p.files(max_transfer),
            Held::Vm(_) => Err(Error::unavailable(
                BackendKind::Microvm,
                "watching files in live microVM sandboxes is not built yet; poll with list or stat, or use the process or container backend",
            )),
        }
    }

    /// A microVM's file handle (`None` on the other backends).
    pub(crate) fn vm_files(&self) -> Option<sandbox_vm::VmFiles> {
        match self {
            Held::Process(_) => None,
            Held::Vm(v) => Some(v.files()),
        }
    }

    /// Asks for a connection to `127.0.0.1:port` inside (see [`LiveProcess::connect`]).
    pub(crate) fn connect(&self, id: u64, port: u16) -> Result<()> {
        match self {
            Held::Process(p) => p.connect(id, port),
            Held::Vm(v) => v.connect(id, port),
        }
    }

    /// Tells the sandbox a tty exec's terminal was resized (the supervisor resized its
    /// own; a microVM's guest terminal follows).
    pub(crate) fn resized(&self, pid: i32, rows: u16, cols: u16) -> Result<()> {
        match self {
            Held::Process(_) => Ok(()),
            Held::Vm(v) => v.resized(pid, rows, cols),
        }
    }

    /// Before the sandbox ends: brings back what must come back (a microVM's read-write
    /// grants); one line per grant saying what came of it. Every process is gone after.
    pub(crate) fn finish(&mut self) -> Vec<String> {
        match self {
            Held::Process(_) => Vec::new(),
            Held::Vm(v) => v.write_back(),
        }
    }

    /// Ends the sandbox now; the egress decisions of its life, when it had an allowlist.
    pub(crate) fn stop(self) -> Option<(NetworkReceipt, Vec<Denial>)> {
        match self {
            Held::Process(p) => p.stop(),
            Held::Vm(v) => v.stop(),
        }
    }
}
