//! Strata's Linux backends.
//!
//! The container backend ([`ContainerBackend`]) runs tools in OCI images, on the same
//! sandbox with the image as its root, or on a Docker/Podman engine.
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
pub mod cgroup_cleanup;
pub mod container;
pub mod fs_policy;
pub mod helper;
pub mod identity;
pub mod plan;
pub mod pool;
pub mod probe;
pub mod process;
pub mod protocol;
pub mod rootfs;
pub mod seccomp;
pub mod seccomp_oci;
pub mod seccomp_table;
pub mod supervise;
mod sys;

pub use container::ContainerBackend;
pub use pool::{PoolSize, PoolStats};
pub use process::{find_helper, ProcessBackend, HELPER_NAME};
