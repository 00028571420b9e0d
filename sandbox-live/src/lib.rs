//! Live sandboxes: one sandbox that stays up for a task, with processes that outlive a
//! call.
//!
//! A [`LiveSandbox`] is started with caps fixed for its life and held by a supervisor
//! process (`strata-live`, [`supervisor`]) that is not the caller, so the CLI can start one
//! and exec into it later. The supervisor holds the backend's live handle (on the process
//! backend, `sandbox_os::live::LiveProcess`: one set of namespaces and one cgroup whose init
//! starts every exec; on the container backend the same with an OCI image as the root; on
//! the microVM backend `sandbox_vm::LiveVm`, one VM whose agent starts every exec), serves
//! a control socket in a 0700 state directory ([`state`]) to
//! clients of the same user (or root, checked with `SO_PEERCRED`), keeps each process's
//! output in a bounded ring ([`ring`]) so another client can follow it, and ends the sandbox
//! at `stop`, its TTL or idle TTL, or its owner's death (owned sandboxes, the library's
//! default). It pauses and resumes the sandbox, and publishes ports ([`ports`]). The wire
//! protocol is [`protocol`]: JSON lines, typed errors.
//!
//! Why a crate: the supervisor, its protocol and the client are shared by the facade, the
//! CLI and the bindings, and need the process backend, the microVM backend (always built by
//! the facade) and, with the `container` feature, the container backend's native runtime
//! (a process sandbox in an image), but not the wasm or cluster backends.
//! Threads rather than an async runtime: a supervisor serves a handful of clients, and each
//! blocking piece (an output reader, a follower) is simplest as its own thread.

#![deny(missing_docs)]

pub mod approver;
pub mod client;
mod client_files;
mod exec;
pub mod files;
mod held;
pub mod policy;
pub mod ports;
pub mod protocol;
pub mod pty;
pub mod ring;
pub mod server;
pub mod snapshot;
pub mod state;
pub mod supervisor;
mod table;
pub mod watch;
mod workers;

pub use approver::ProgramApprover;
pub use client::{LiveSandbox, OutputSince, Pty, StartOptions, SUPERVISOR_NAME};
pub use policy::LivePolicy;
pub use protocol::{
    ExecRequest, ExitInfo, ProcessInfo, ProcessState, PublishRequest, PublishedPort, SandboxInfo,
    TtySize,
};
pub use ring::Stream;
pub use sandbox_os::live::PauseMethod;
pub use snapshot::{SnapshotInfo, SnapshotStore};
