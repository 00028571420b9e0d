//! # Strata
//!
//! Run AI-agent tools (model-written code and commands) inside sandboxes, with one
//! capability model and several isolation backends:
//!
//! ```no_run
//! use strata::{Caps, Sandbox, Tool};
//!
//! let sandbox = Sandbox::builder().build()?;
//! let caps = Caps::new().read_only("/etc/hostname");
//! let out = sandbox.run(&Tool::command(["cat", "/etc/hostname"]), &caps)?;
//! print!("{}", String::from_utf8_lossy(&out.stdout));
//! println!("{}", out.receipt);
//! # Ok::<(), strata::Error>(())
//! ```
//!
//! [`Caps::new`] denies everything but the read-only system directories a program needs to
//! start; every grant is explicit. A run whose caps cannot be enforced on this host is
//! refused before anything executes ([`Strictness::Strict`], the default); the
//! [`Receipt`] in every [`RunOutput`] lists what was enforced and by which mechanism.
//!
//! Backends (cargo features, all on by default): `process` (Linux namespaces, landlock,
//! seccomp, cgroups; crate `sandbox-os`), `container` (needs `process`; runs tools in OCI
//! images natively on the process sandbox or on a Docker/Podman engine, see
//! [`ContainerSpec`]; crate `sandbox-container`), `wasm` (wasmtime; crate `sandbox-wasm`).
//! A backend that is not compiled in is reported as [`Error::BackendUnavailable`]
//! naming its feature. The microVM backend (crate `sandbox-vm`, always built: it has no heavy
//! dependencies) boots a fresh QEMU `microvm` guest per run; see [`MicrovmBackend`].
//!
//! [`Sandbox`] is the entry point: it applies the policy layer ([`policy`], the
//! `sandbox-policy` crate), chooses the backend, plans the run's [`RunSpec`] once for it and
//! hands the backend that spec. [`ProcessBackend`] and [`ContainerBackend`] are re-exported
//! for embedders that drive a backend through the [`Backend`] trait directly
//! ([`Backend::run_caps`] plans the spec from caps).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod grants;
#[cfg(feature = "process")]
pub mod live;
pub mod profile;
mod sandbox;
#[cfg(feature = "process")]
pub mod session;

pub use profile::{Profile, SessionSettings};
pub use sandbox::{doctor, unix_time_ms, BackendChoice, Sandbox, SandboxBuilder};
#[cfg(unix)]
pub use sandbox_core::StdinSource;
/// The names of every caps field in each dialect, and the generated JSON Schemas.
pub use sandbox_core::{audit, names, schema, token};

/// The `strata-helper` a binding ships in `package_dir`, or `$STRATA_HELPER` when set
/// ([`sandbox_core::binary::packaged`]); `None` when neither is there.
pub fn packaged_helper(package_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    sandbox_core::binary::packaged("strata-helper", "STRATA_HELPER", package_dir)
}
pub use sandbox_core::{
    backend, caps, error, grant, output, receipt, report, size, spec, tool, Access, Backend,
    BackendKind, BackendReport, ByteSize, CancelToken, Capability, Caps, Check, ContainerReceipt,
    ContainerRuntime, ContainerSpec, Denial, DoctorReport, EgressDecision, EgressRefusal,
    EndReason, Enforcement, Error, ErrorKind, ExitStatus, FollowedGrant, Gap, IdentityReceipt,
    IdentitySource, LandlockStatus, LimitKind, Limits, Mechanism, Mount, MountRole, MountSpec, Net,
    NetRule, NetworkReceipt, OutputSink, Receipt, ResourceUsage, Result, RunContext, RunOutput,
    RunSpec, ScriptLanguage, Secret, SetupStage, Stream, Strictness, SystemDirs, Tool, TrapKind,
    RUN_SPEC_VERSION, STDIN_BUFFER,
};
pub use sandbox_policy as policy;
#[cfg(feature = "process")]
pub use session::{Call, FileEntry, FileKind, Session, SessionOptions, Transfer};

#[cfg(feature = "container")]
pub use sandbox_container::ContainerBackend;
#[cfg(feature = "process")]
pub use sandbox_os::{
    find_helper, IdRange, PoolSize, PoolStats, ProcessBackend, Workspace, HELPER_NAME,
};
pub use sandbox_vm::MicrovmBackend;
/// The wasm backend crate (its configuration, layering, interpreter locations).
#[cfg(feature = "wasm")]
pub use sandbox_wasm;
