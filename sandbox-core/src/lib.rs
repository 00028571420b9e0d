//! The platform-independent heart of Strata.
//!
//! This crate defines *what* a sandboxed run is, independent of *how* it is isolated:
//!
//! - [`Tool`]: what to run (an argv, a script, a WebAssembly module).
//! - [`Caps`]: what it may touch. Deny by default; every grant is explicit.
//! - [`RunOutput`]: what happened, including a [`Receipt`] of what was enforced.
//! - [`Error`]: why a run was refused or failed, split into kinds callers act on.
//! - [`RunSpec`]: a run planned for one backend kind, validated once; what [`Backend::run`]
//!   receives.
//! - [`Backend`]: the trait every isolation backend implements.
//!
//! It contains no OS code beyond reading the file system (grant resolution,
//! [`grant::RealHost`]; finding Strata's binaries, [`binary`]) and no `unsafe`; the
//! backends live in their own crates, the policy layer in `sandbox-policy`.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod audit;
pub mod backend;
pub mod binary;
pub mod caps;
pub mod container;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod grant;
pub mod names;
pub mod output;
pub mod receipt;
pub mod report;
pub mod risk;
pub mod schema;
pub mod size;
pub mod spec;
pub mod token;
pub mod tool;
mod validate;

#[cfg(unix)]
pub use backend::StdinSource;
pub use backend::{
    Backend, BackendKind, CancelToken, OutputSink, RunContext, Stream, Strictness, STDIN_BUFFER,
};
pub use caps::{Access, Caps, Limits, Mount, Net, NetRule, Secret, SystemDirs};
pub use container::{ContainerReceipt, ContainerRuntime, ContainerSpec};
pub use doctor::{BackendReport, Check, DoctorReport};
pub use egress::{Decision, DenyReason, EgressPolicy, Host, IpNet, ReservedRange};
pub use error::{Error, ErrorKind, Result};
pub use grant::{
    EntryKind, HostExecuted, HostExecutedPlan, HostLookup, ResolvedGrant, HOST_EXECUTED,
};
pub use output::{ExitStatus, LimitKind, ResourceUsage, RunOutput, TrapKind};
pub use receipt::{
    Capability, Denial, EgressDecision, EgressRefusal, Enforcement, FollowedGrant, Gap,
    IdentityReceipt, IdentitySource, Mechanism, NetworkReceipt, PolicyReceipt, Receipt,
};
pub use report::{EndReason, LandlockStatus, SetupStage};
pub use size::ByteSize;
pub use spec::{MountRole, MountSpec, RunSpec, RUN_SPEC_VERSION};
pub use tool::{ScriptLanguage, Tool};
