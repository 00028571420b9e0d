//! Strata's Linux backends.
//!
//! The process backend ([`ProcessBackend`]) isolates host programs with user, mount, pid,
//! network, IPC and UTS namespaces, a fresh root filesystem, landlock, a seccomp allowlist,
//! dropped capabilities, cgroups and rlimits. The sandbox is built by the `strata-helper`
//! binary ([`helper::main`]), so the embedding process (often a multi-threaded Python or
//! Node runtime) is never forked.
//!
//! All raw syscalls live in the private `sys` module.

#![deny(missing_docs)]

pub mod cgroup;
pub mod fs_policy;
pub mod helper;
pub mod plan;
pub mod probe;
pub mod process;
pub mod protocol;
pub mod rootfs;
pub mod seccomp;
mod supervise;
mod sys;

pub use process::{find_helper, ProcessBackend, HELPER_NAME};
