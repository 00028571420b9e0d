//! The shared vocabulary of what an enforcing side reports: how a run ended, how far setup
//! got, and what state a mechanism is in.
//!
//! Backends (and the processes they talk to: the process backend's helper, later the
//! microVM's guest agent and the cluster driver) report in these types, and receipts and
//! errors are built by matching on them, never on strings.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::output::LimitKind;

/// Why the enforcing side ended a run before the tool's main process exited on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EndReason {
    /// The wall-clock timeout passed.
    Wall,
    /// A stream passed the output cap.
    Output,
    /// The CPU-time budget of the whole run was used up.
    Cpu,
    /// The run's memory limit was hit (the OOM killer took a process that cannot die alone).
    Memory,
    /// The caller cancelled.
    Cancelled,
    /// Building the sandbox took longer than the setup deadline; the tool never ran.
    SetupTimeout,
    /// The embedder went away (its end of the control channel closed).
    HostGone,
    /// The sandbox's init process died without reporting how the tool exited.
    InitDied,
    /// The enforcing side failed internally (for example, `poll` failed).
    Internal,
}

impl EndReason {
    /// The limit this ending means, if it is one.
    pub fn limit(self) -> Option<LimitKind> {
        match self {
            EndReason::Wall => Some(LimitKind::Wall),
            EndReason::Output => Some(LimitKind::Output),
            EndReason::Cpu => Some(LimitKind::Cpu),
            EndReason::Memory => Some(LimitKind::Memory),
            _ => None,
        }
    }

    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Wall => "wall",
            EndReason::Output => "output",
            EndReason::Cpu => "cpu",
            EndReason::Memory => "memory",
            EndReason::Cancelled => "cancelled",
            EndReason::SetupTimeout => "setup_timeout",
            EndReason::HostGone => "host_gone",
            EndReason::InitDied => "init_died",
            EndReason::Internal => "internal",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A step of building a sandbox, as named in a setup failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SetupStage {
    /// Reading or checking the run spec (for example, a version mismatch).
    Spec,
    /// The sandbox's own processes: pipes, forks, parent-death signal, dumpability.
    Processes,
    /// Joining the run's cgroup.
    Cgroup,
    /// Creating the namespaces (and setting the hostname).
    Namespaces,
    /// Writing the user namespace's uid and gid maps.
    IdMaps,
    /// The network namespace (loopback, or the egress path).
    Network,
    /// Building the root file system (mounts, `/dev`, `/proc`, scratch, `pivot_root`).
    RootFs,
    /// Taking the tool's identity (uid, gid, supplementary groups).
    Identity,
    /// Dropping capabilities.
    Capabilities,
    /// Setting `no_new_privs`.
    NoNewPrivs,
    /// Installing landlock rules.
    Landlock,
    /// Building or installing the seccomp filter.
    Seccomp,
    /// Host-side preparation: private directories and files, threads, runtimes, identities.
    Host,
    /// Fetching, unpacking or opening a container image.
    Image,
    /// Preparing granted files: private copies and disk images for a guest, WASI preopens.
    Grants,
    /// The egress proxy, its listeners and the run's registration with it.
    Egress,
    /// Starting the VMM, or the VMM exiting before the guest was reachable.
    Vmm,
    /// Restoring a VM snapshot.
    Restore,
    /// Making or saving a VM snapshot.
    Snapshot,
    /// The byte channel to the guest or pod agent.
    AgentChannel,
    /// The agent's greeting: not ready in time, or speaking another protocol version.
    AgentReady,
    /// The agent refused the run request.
    AgentRun,
    /// A cluster API step (claiming a sandbox, the template, exec into the pod).
    Cluster,
}

impl SetupStage {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            SetupStage::Spec => "spec",
            SetupStage::Processes => "processes",
            SetupStage::Cgroup => "cgroup",
            SetupStage::Namespaces => "namespaces",
            SetupStage::IdMaps => "id_maps",
            SetupStage::Network => "network",
            SetupStage::RootFs => "root_fs",
            SetupStage::Identity => "identity",
            SetupStage::Capabilities => "capabilities",
            SetupStage::NoNewPrivs => "no_new_privs",
            SetupStage::Landlock => "landlock",
            SetupStage::Seccomp => "seccomp",
            SetupStage::Host => "host",
            SetupStage::Image => "image",
            SetupStage::Grants => "grants",
            SetupStage::Egress => "egress",
            SetupStage::Vmm => "vmm",
            SetupStage::Restore => "restore",
            SetupStage::Snapshot => "snapshot",
            SetupStage::AgentChannel => "agent_channel",
            SetupStage::AgentReady => "agent_ready",
            SetupStage::AgentRun => "agent_run",
            SetupStage::Cluster => "cluster",
        }
    }
}

impl fmt::Display for SetupStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much of the requested landlock policy the kernel enforces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LandlockStatus {
    /// Every requested right is enforced.
    FullyEnforced,
    /// The kernel's ABI covers only part of the requested rights.
    PartiallyEnforced,
    /// Nothing is enforced (no landlock, or not asked for).
    #[default]
    NotEnforced,
}

impl LandlockStatus {
    /// Whether any rule is in force.
    pub fn is_enforced(self) -> bool {
        self != LandlockStatus::NotEnforced
    }

    /// Words for a receipt ("fully enforced").
    pub fn describe(self) -> &'static str {
        match self {
            LandlockStatus::FullyEnforced => "fully enforced",
            LandlockStatus::PartiallyEnforced => "partially enforced",
            LandlockStatus::NotEnforced => "not enforced",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_their_json() {
        for reason in [
            EndReason::Wall,
            EndReason::Output,
            EndReason::Cpu,
            EndReason::Memory,
            EndReason::Cancelled,
            EndReason::SetupTimeout,
            EndReason::HostGone,
            EndReason::InitDied,
            EndReason::Internal,
        ] {
            let json = serde_json::to_string(&reason).expect("json");
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
        }
        let stage = serde_json::to_string(&SetupStage::IdMaps).expect("json");
        assert_eq!(stage, "\"id_maps\"");
    }

    #[test]
    fn only_limit_endings_map_to_limit_kinds() {
        assert_eq!(EndReason::Wall.limit(), Some(LimitKind::Wall));
        assert_eq!(EndReason::Memory.limit(), Some(LimitKind::Memory));
        assert_eq!(EndReason::Cancelled.limit(), None);
        assert_eq!(EndReason::HostGone.limit(), None);
    }
}
