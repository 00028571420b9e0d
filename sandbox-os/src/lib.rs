//! Strata's Linux process backend.
//!
//! [`ProcessBackend`] isolates host programs with user, mount, pid, network, IPC and UTS
//! namespaces, a fresh root filesystem, landlock, a seccomp allowlist, dropped
//! capabilities, cgroups and rlimits. The sandbox is built by the `strata-helper` binary
//! (whose entry point is [`helper_main`]), so the embedding process (often a
//! multi-threaded Python or Node runtime) is never forked. [`IdRange`] is the block of host
//! ids tools run as when the embedder is root. [`Workspace`] is the transactional
//! workspace: a staged copy of a read-write grant whose diff the caller commits or discards.
//!
//! The container backend (the `sandbox-container` crate) runs on this sandbox through
//! [`backend_api`], a hidden module that is not a stable API. Everything else is private;
//! all raw syscalls live in the private `sys` module.

#![deny(missing_docs)]

#[doc(hidden)]
pub mod backend_api;
mod cgroup;
mod cgroup_cleanup;
mod egress_link;
mod egress_transparent;
pub mod file_tree;
mod fs_policy;
mod helper;
mod identity;
pub mod live;
mod outcome;
mod plan;
mod pool;
pub mod private;
mod probe;
mod process;
mod protocol;
mod rootfs;
mod seccomp;
mod seccomp_table;
pub mod session_files;
mod supervise;
mod sys;
pub mod tree_copy;
mod userns;
pub mod workspace;

pub use helper::main as helper_main;
pub use identity::IdRange;
pub use pool::{PoolSize, PoolStats};
pub use process::{find_helper, ProcessBackend, HELPER_NAME};
pub use sandbox_egress::host::{EgressHost, RunEgress};
pub use sandbox_egress::SharedListener;
pub use workspace::Workspace;
