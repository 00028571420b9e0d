//! The process backend's internals that other Strata crates build on: the container
//! backend (`sandbox-container`) runs its native runtime through [`run_adjusted`] and
//! shares planning, receipts and the seccomp table with its engine runtimes; Strata's
//! escape tests drive the planning and supervision stages directly.
//!
//! Not a stable API and not for embedders: it changes with the process backend.

use sandbox_core::{Result, RunContext, RunOutput, RunSpec, Tool};

use crate::live::LiveProcess;
use crate::ProcessBackend;

pub use crate::outcome::host_executed_receipt;
pub use crate::sys::NonBlocking;

/// Runs `tool` under `spec` (planned for the process backend) on `backend` like
/// [`sandbox_core::Backend::run`], letting `adjust` change
/// the planned sandbox and command before anything starts (the container backend's hook:
/// image root, user, environment). Image roots that keep a workspace never use the warm
/// pool.
pub fn run_adjusted(
    backend: &ProcessBackend,
    tool: &Tool,
    spec: &RunSpec,
    ctx: &RunContext,
    adjust: &dyn Fn(&mut protocol::Spec, &mut protocol::Command) -> Result<()>,
) -> Result<RunOutput> {
    backend.run_adjusted(tool, spec, ctx, adjust)
}

/// Starts a live sandbox for `spec` (planned for the process backend) on `backend` like
/// [`ProcessBackend::start_live`], letting `adjust` change the planned sandbox before it is
/// built (the container backend's native runtime: image root, user, environment). Amend its
/// receipt with [`LiveProcess::receipt_mut`].
pub fn start_live_adjusted(
    backend: &ProcessBackend,
    spec: &RunSpec,
    ctx: &RunContext,
    adjust: &dyn Fn(&mut protocol::Spec, &mut protocol::Command) -> Result<()>,
) -> Result<LiveProcess> {
    let parts = backend.build_live(spec, ctx, adjust)?;
    LiveProcess::ready(parts)
}

/// The egress proxy of `backend` (started on first use), for runtimes that bring their own
/// network namespace (the container engines). `Err` says why it could not start.
pub fn egress_host(backend: &ProcessBackend) -> std::result::Result<&egress::EgressHost, String> {
    backend.egress_host()
}

/// Network allowlists: the host's proxy, a run's registration with it, and the listener
/// inside a sandbox's network namespace that is the sandbox's only way out.
pub mod egress {
    pub use crate::egress_link::{listener_in_namespace_of, proxy_addr, EGRESS_PORT};
    pub use sandbox_egress::host::{EgressHost, RunEgress, TrustFile, PROXY_VARS};
}

/// What the host sends the helper ([`Spec`](protocol::Spec), [`Command`](protocol::Command))
/// and what it reports back ([`Event`](protocol::Event)).
pub mod protocol {
    pub use crate::protocol::{
        Command, EndReason, Enforced, Event, Fault, FileSpec, ImageRootSpec, LandlockStatus,
        MountRole, MountSpec, SetupStage, Spec,
    };
}

/// Planning: a [`RunSpec`](sandbox_core::RunSpec) + `Tool` into a
/// [`Spec`](crate::backend_api::protocol::Spec) and command, and the pieces the engine
/// runtimes reuse (the real host for grant resolution, script interpreters).
pub mod plan {
    pub use crate::plan::{plan, script_argv, Facts, HostView, RealHost};
}

/// The seccomp table (allowed, denied, denied-when-argument rules), compiled into the
/// process sandbox's filters and turned into the engines' OCI profile.
pub mod seccomp {
    pub use crate::seccomp::{
        build, Allowed, Cmp, Denied, DeniedWhen, ALLOWED, DENIED, DENIED_WHEN,
    };
}

/// The host side of a run: spawning the helper with a spec and supervising one command.
pub mod supervise {
    pub use crate::supervise::{prepare, run, Input, Outcome, Prepared, Watches};
}
