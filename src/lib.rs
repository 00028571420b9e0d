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
//! Backends (cargo features): `process` (default; Linux namespaces, landlock, seccomp,
//! cgroups; also the `container` backend, which runs tools in OCI images natively or on a
//! Docker/Podman engine, see [`ContainerSpec`]), `wasm` (default; wasmtime). The microVM
//! backend is reported as unavailable until it is built.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod sandbox;

pub use sandbox::{doctor, BackendChoice, Sandbox, SandboxBuilder};
#[cfg(unix)]
pub use sandbox_core::StdinSource;
pub use sandbox_core::{
    backend, caps, error, grant, output, receipt, size, tool, Access, Backend, BackendKind,
    BackendReport, ByteSize, CancelToken, Capability, Caps, Check, ContainerReceipt,
    ContainerRuntime, ContainerSpec, Denial, DoctorReport, Enforcement, Error, ErrorKind,
    ExitStatus, Gap, IdentityReceipt, IdentitySource, LimitKind, Limits, Mount, Net, NetRule,
    OutputSink, Receipt, ResourceUsage, Result, RunContext, RunOutput, ScriptLanguage, Stream,
    Strictness, SystemDirs, Tool, TrapKind, STDIN_BUFFER,
};
/// The names of every caps field in each dialect, and the generated JSON Schemas.
pub use sandbox_core::{names, schema};

/// The process backend crate, for embedders that need its lower-level API.
#[cfg(feature = "process")]
pub use sandbox_os;
/// The wasm backend crate (its configuration, layering, interpreter locations).
#[cfg(feature = "wasm")]
pub use sandbox_wasm;
