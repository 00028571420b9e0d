//! Receipts: what a run actually enforced, and what it observed being denied.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::backend::{BackendKind, Strictness};
use crate::risk::Risk;

/// What was enforced for one run, per capability and mechanism. Agents and auditors read
/// it; tests assert on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The backend that ran the tool (the outermost layer).
    pub backend: BackendKind,
    /// Isolation layers from outermost to innermost (e.g. `["process", "wasm"]`).
    pub layers: Vec<BackendKind>,
    /// Strictness the run used.
    pub strictness: Strictness,
    /// Every guarantee in force, with its mechanism.
    pub enforced: Vec<Enforcement>,
    /// Guarantees the caps asked for that were *not* enforced (only with best-effort).
    pub gaps: Vec<Gap>,
    /// Denials and limit hits observed during the run.
    pub denials: Vec<Denial>,
    /// For container runs: the runtime that ran the tool and the image (with its digest).
    /// Absent for the other backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::container::ContainerReceipt>,
    /// The host identity the tool ran as, as the enforcing side mapped it. Absent for
    /// backends without host identities (wasm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityReceipt>,
    /// For runs under a network allowlist: every egress decision. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReceipt>,
    /// What the policy layer decided before the run: its tier, the router's choice and the
    /// elevations it used. Absent when no tier applied and no risk was routed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyReceipt>,
}

/// The policy layer's part of a receipt (see [`crate::policy`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PolicyReceipt {
    /// The tier the run was checked against, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// How the router chose the backend, when a risk was declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    /// Grants beyond the tier that this run used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elevations: Vec<Grant>,
    /// Grants that followed symlinks, resolved before the tier decided: the tier checked
    /// the resolved path and the run bound exactly that path (pinned, so the backend's own
    /// mount line names it without "symlinks followed from").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followed: Vec<FollowedGrant>,
}

/// A grant whose host path was reached through symlinks (see [`PolicyReceipt::followed`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FollowedGrant {
    /// The host path the caller gave.
    pub requested: std::path::PathBuf,
    /// The path it resolved to, which the tier checked and the run bound.
    pub resolved: std::path::PathBuf,
}

/// What the egress enforcement of a run under [`crate::Net::Allow`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NetworkReceipt {
    /// Where the tool reached the egress proxy, as the tool saw it (`127.0.0.1:3128`), or
    /// the enforcing layer when there is no proxy (`wasi:sockets`). Never a credential.
    pub enforcer: String,
    /// The allowlist, as written.
    pub rules: Vec<String>,
    /// Connection requests the run made (allowed or refused).
    pub connections: u64,
    /// Bytes moved through allowed connections, both directions.
    pub bytes: u64,
    /// Every decision, oldest first (at most 10 000; see `dropped`).
    pub decisions: Vec<EgressDecision>,
    /// Decisions past the cap, counted but not kept.
    pub dropped: u64,
}

/// One allow or deny decision of the egress enforcement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EgressDecision {
    /// The host as the tool asked for it (possibly invalid, hence refused).
    pub host: String,
    /// The port as the tool asked for it (0 if it was not a valid port).
    pub port: u16,
    /// The address the decision concerned (resolved and pinned for an allowed name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<std::net::IpAddr>,
    /// Whether the connection was allowed (a budget may still cut it later: then a second
    /// decision with `refusal: budget` follows).
    pub allowed: bool,
    /// The rule that allowed it, as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why it was refused, by family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<EgressRefusal>,
    /// For a budget refusal: which limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<crate::LimitKind>,
    /// Why it was refused, for people (names the rule, range or limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Secrets (by variable name, never value) whose values went into this request, which
    /// their bindings allow. Empty for every other decision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// The family of an egress refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EgressRefusal {
    /// No rule admits the host or port, or the address is in an always-denied range.
    Policy,
    /// The request was malformed (bad authority, a host the strict parser refuses).
    BadRequest,
    /// The name did not resolve.
    Unresolvable,
    /// No allowed address accepted the connection.
    ConnectFailed,
    /// A budget was exhausted (`limit` says which).
    Budget,
}

impl EgressRefusal {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            EgressRefusal::Policy => "policy",
            EgressRefusal::BadRequest => "bad_request",
            EgressRefusal::Unresolvable => "unresolvable",
            EgressRefusal::ConnectFailed => "connect_failed",
            EgressRefusal::Budget => "budget",
        }
    }
}

/// The host identity of a run's tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IdentityReceipt {
    /// The agent the run acted for, if one was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Where the host ids came from.
    pub source: IdentitySource,
    /// Host uid of the tool's processes (and owner of the files they create).
    pub host_uid: u32,
    /// Host gid of the tool's processes.
    pub host_gid: u32,
    /// Uid the tool sees for itself inside the sandbox.
    pub uid: u32,
    /// Gid the tool sees for itself inside the sandbox.
    pub gid: u32,
}

/// Where a run's host identity came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum IdentitySource {
    /// The agent's own id, from the range Strata owns (stable across runs).
    Agent,
    /// A fresh id from the range Strata owns, used by this run alone.
    Fresh,
    /// The embedder's own uid: an unprivileged embedder without subordinate ids cannot
    /// give the tool another one.
    Embedder,
}

impl IdentitySource {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::Agent => "agent",
            IdentitySource::Fresh => "fresh",
            IdentitySource::Embedder => "embedder",
        }
    }
}

impl Receipt {
    /// An empty receipt for `backend`.
    pub fn new(backend: BackendKind, strictness: Strictness) -> Self {
        Receipt {
            backend,
            layers: vec![backend],
            strictness,
            enforced: Vec::new(),
            gaps: Vec::new(),
            denials: Vec::new(),
            container: None,
            identity: None,
            network: None,
            policy: None,
        }
    }

    /// Records an enforced guarantee: what it protects, the family of mechanism (for
    /// programs), the mechanism as people read it (e.g. `"landlock ABI 7"`) and its
    /// parameters.
    pub fn enforce(
        &mut self,
        capability: Capability,
        kind: Mechanism,
        mechanism: impl Into<String>,
        detail: impl Into<String>,
    ) {
        self.enforced.push(Enforcement {
            capability,
            kind,
            mechanism: mechanism.into(),
            detail: detail.into(),
        });
    }

    /// Records a gap (a guarantee that was asked for but not enforced).
    pub fn gap(&mut self, capability: Capability, reason: impl Into<String>) {
        self.gaps.push(Gap {
            capability,
            reason: reason.into(),
            by_request: false,
        });
    }

    /// Records a gap the caller asked for (a relaxation such as `net: host`): stated like
    /// any gap, and not a reason for a strict run to fail.
    pub fn gap_by_request(&mut self, capability: Capability, reason: impl Into<String>) {
        self.gaps.push(Gap {
            capability,
            reason: reason.into(),
            by_request: true,
        });
    }

    /// Records an observed denial.
    pub fn deny(&mut self, capability: Capability, detail: impl Into<String>) {
        self.denials.push(Denial {
            capability,
            detail: detail.into(),
        });
    }

    /// Records the denial of the clock limit that ended the run, worded once for every
    /// backend: `Wall` (the wall-clock timeout) and `Cpu` (the CPU-time budget), each with
    /// the limit's value. Other limits carry what the enforcing side measured (OOM kills,
    /// the memory applied, which stream was cut), so each backend words those; for them
    /// this records nothing.
    pub fn record_end(&mut self, limit: crate::LimitKind, limits: &crate::Limits) {
        match limit {
            crate::LimitKind::Wall => self.deny(
                Capability::Wall,
                format!(
                    "wall-clock timeout {:?} reached; the run was killed",
                    limits.timeout
                ),
            ),
            crate::LimitKind::Cpu => self.deny(
                Capability::Cpu,
                format!("CPU time {:?} used up; the run was killed", limits.cpu_time),
            ),
            _ => {}
        }
    }

    /// Records that `stream` was cut at the output cap of `limits`, worded once for every
    /// backend.
    pub fn record_output_cut(&mut self, stream: crate::Stream, limits: &crate::Limits) {
        let name = match stream {
            crate::Stream::Stdout => "stdout",
            crate::Stream::Stderr => "stderr",
        };
        self.deny(
            Capability::Output,
            format!("{name} cut at {}", limits.output),
        );
    }

    /// The enforcements for one capability.
    pub fn enforced_for(&self, capability: Capability) -> impl Iterator<Item = &Enforcement> {
        self.enforced
            .iter()
            .filter(move |e| e.capability == capability)
    }

    /// Whether `capability` is enforced by a mechanism whose name contains `mechanism`.
    pub fn has(&self, capability: Capability, mechanism: &str) -> bool {
        self.enforced_for(capability)
            .any(|e| e.mechanism.contains(mechanism))
    }

    /// Whether `capability` is enforced by a mechanism of the family `kind`.
    pub fn has_kind(&self, capability: Capability, kind: Mechanism) -> bool {
        self.enforced_for(capability).any(|e| e.kind == kind)
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layers: Vec<&str> = self.layers.iter().map(|l| l.as_str()).collect();
        writeln!(
            f,
            "backend: {} (layers: {}; {})",
            self.backend,
            layers.join(" > "),
            self.strictness
        )?;
        if let Some(c) = &self.container {
            writeln!(
                f,
                "  container: {} runtime, image {} ({})",
                c.runtime, c.image, c.digest
            )?;
        }
        if let Some(id) = &self.identity {
            let agent = id
                .agent
                .as_deref()
                .map(|a| format!("agent {a}, "))
                .unwrap_or_default();
            writeln!(
                f,
                "  identity: {agent}{} host uid {} gid {} (uid {} gid {} inside)",
                id.source.as_str(),
                id.host_uid,
                id.host_gid,
                id.uid,
                id.gid
            )?;
        }
        for e in &self.enforced {
            writeln!(f, "  {}: {} ({})", e.capability, e.mechanism, e.detail)?;
        }
        if let Some(n) = &self.network {
            let allowed = n.decisions.iter().filter(|d| d.allowed).count();
            writeln!(
                f,
                "  egress via {}: {allowed} allowed, {} refused, {} connections, {} bytes{}",
                n.enforcer,
                n.decisions.len() - allowed,
                n.connections,
                n.bytes,
                match n.dropped {
                    0 => String::new(),
                    dropped => format!(" ({dropped} more decisions not kept)"),
                }
            )?;
            for d in n.decisions.iter().filter(|d| d.allowed) {
                let addr = d.addr.map(|a| format!(" ({a})")).unwrap_or_default();
                let rule = d.rule.as_deref().unwrap_or_default();
                writeln!(f, "    allowed {}:{}{addr} by {rule}", d.host, d.port)?;
            }
        }
        if let Some(p) = &self.policy {
            if let Some(tier) = &p.tier {
                writeln!(f, "  tier: {tier}")?;
            }
            if let Some(r) = &p.route {
                writeln!(
                    f,
                    "  route: risk {} -> {} ({})",
                    r.risk, r.backend, r.reason
                )?;
            }
            for g in &p.followed {
                writeln!(
                    f,
                    "  grant {} resolved through symlinks to {} (checked by the tier there)",
                    g.requested.display(),
                    g.resolved.display()
                )?;
            }
            for g in &p.elevations {
                writeln!(
                    f,
                    "  elevation: grant {} ({}), {} run(s) left before this one ended",
                    g.id,
                    g.capabilities.join(", "),
                    g.runs_left.saturating_sub(1)
                )?;
            }
        }
        for g in &self.gaps {
            writeln!(f, "  GAP {}: {}", g.capability, g.reason)?;
        }
        for d in &self.denials {
            writeln!(f, "  denied {}: {}", d.capability, d.detail)?;
        }
        Ok(())
    }
}

/// One guarantee in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Enforcement {
    /// What it protects.
    pub capability: Capability,
    /// The family of mechanism, for programs that check a receipt.
    pub kind: Mechanism,
    /// How (e.g. `"landlock ABI 7"`, `"empty netns"`, `"cgroup v1 memory"`).
    pub mechanism: String,
    /// Parameters (paths, values).
    pub detail: String,
}

/// The family of mechanism behind an [`Enforcement`]; [`Enforcement::mechanism`] names
/// the exact one for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mechanism {
    /// A Linux namespace (user, mount with `pivot_root`, pid, network, IPC, UTS, cgroup).
    Namespace,
    /// Landlock rules or scopes.
    Landlock,
    /// A seccomp filter (Strata's own, or its profile handed to a container engine).
    Seccomp,
    /// Bind mounts and their flags (read-only, nosuid, nodev), or a read-only root.
    Mounts,
    /// A kernel setting of the sandbox (`vm.memfd_noexec`).
    Sysctl,
    /// Capabilities dropped, `no_new_privs`, the tool's identity.
    Privileges,
    /// An explicit environment: nothing inherited from the host.
    Environment,
    /// File descriptors closed before the tool runs.
    Descriptors,
    /// A supervising process: deadlines, killing every process of the run at its end.
    Supervisor,
    /// A cgroup limit or counter.
    Cgroup,
    /// A per-process resource limit (`setrlimit`, ulimits).
    Rlimit,
    /// Enforced on the host side of the run (output caps, metered writes).
    Host,
    /// A size-capped tmpfs.
    Tmpfs,
    /// An OCI image as the root file system, and its user.
    Image,
    /// A container runtime with its own kernel (gVisor `runsc`).
    Runtime,
    /// The WebAssembly runtime: wasmtime's limits, fuel, epochs and WASI's capabilities.
    Wasm,
    /// Strata's host-side egress proxy: allowlist, address pinning, budgets.
    Proxy,
    /// A virtual machine: the tool runs on its own guest kernel (QEMU microvm), with guest
    /// RAM and vCPUs as limits and no device the VM was not given.
    Vm,
    /// The Kubernetes cluster: the pod's runtime class, security context, resource limits
    /// and NetworkPolicy, as the claimed pod's template states them.
    Cluster,
}

impl Mechanism {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Namespace => "namespace",
            Mechanism::Landlock => "landlock",
            Mechanism::Seccomp => "seccomp",
            Mechanism::Mounts => "mounts",
            Mechanism::Sysctl => "sysctl",
            Mechanism::Privileges => "privileges",
            Mechanism::Environment => "environment",
            Mechanism::Descriptors => "descriptors",
            Mechanism::Supervisor => "supervisor",
            Mechanism::Cgroup => "cgroup",
            Mechanism::Rlimit => "rlimit",
            Mechanism::Host => "host",
            Mechanism::Tmpfs => "tmpfs",
            Mechanism::Image => "image",
            Mechanism::Runtime => "runtime",
            Mechanism::Wasm => "wasm",
            Mechanism::Proxy => "proxy",
            Mechanism::Vm => "vm",
            Mechanism::Cluster => "cluster",
        }
    }
}

/// A guarantee that was not enforced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Gap {
    /// What is unprotected.
    pub capability: Capability,
    /// Why.
    pub reason: String,
    /// The caller asked for it (a relaxation such as `net: host` or
    /// `protect_host_executed: false`) rather than the sandbox lacking the means. A strict
    /// run refuses only the other kind. Default `false`; left out of JSON when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_request: bool,
}

/// Something the sandbox refused or cut off during the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Denial {
    /// What was denied.
    pub capability: Capability,
    /// Details (limit value, destination, path).
    pub detail: String,
}

/// The capabilities a receipt speaks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Capability {
    /// File-system visibility and access.
    Fs,
    /// Network access.
    Net,
    /// Environment variables.
    Env,
    /// Process visibility, signals, ptrace.
    Processes,
    /// SysV IPC, POSIX message queues.
    Ipc,
    /// Hostname.
    Uts,
    /// System calls.
    Syscalls,
    /// Privileges (capabilities, no_new_privs, uid).
    Privileges,
    /// Open file descriptors inherited from the host.
    Fds,
    /// Memory.
    Memory,
    /// CPU time.
    Cpu,
    /// Wall-clock time.
    Wall,
    /// Process and thread count.
    Pids,
    /// Output bytes.
    Output,
    /// Scratch disk.
    Disk,
    /// Size of a single file.
    FileSize,
    /// Open files.
    OpenFiles,
    /// Lifetime of processes the tool starts.
    Lifetime,
}

impl Capability {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Fs => "fs",
            Capability::Net => "net",
            Capability::Env => "env",
            Capability::Processes => "processes",
            Capability::Ipc => "ipc",
            Capability::Uts => "uts",
            Capability::Syscalls => "syscalls",
            Capability::Privileges => "privileges",
            Capability::Fds => "fds",
            Capability::Memory => "memory",
            Capability::Cpu => "cpu",
            Capability::Wall => "wall",
            Capability::Pids => "pids",
            Capability::Output => "output",
            Capability::Disk => "disk",
            Capability::FileSize => "file_size",
            Capability::OpenFiles => "open_files",
            Capability::Lifetime => "lifetime",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The router's decision, kept in the receipt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Route {
    /// The risk the decision used (declared or derived).
    pub risk: Risk,
    /// Whether the caller declared the risk (`false`: derived from the tool).
    pub declared: bool,
    /// The backend chosen.
    pub backend: BackendKind,
    /// Why: the preference, and every backend skipped on the way with its reason.
    pub reason: String,
}

/// Identifies a grant within one `GrantBook` (the policy crate).
pub type GrantId = u64;

/// A live elevation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Grant {
    /// Its number in the book.
    pub id: GrantId,
    /// The agent it was granted to (`None`: runs without an agent).
    pub agent: Option<String>,
    /// The capabilities it covers (see [`covers`]).
    pub capabilities: Vec<String>,
    /// When it stops covering anything, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// Runs it still covers.
    pub runs_left: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LimitKind, Limits, Stream};

    /// Issue 28: the wall-time denial had four wordings across backends. Every backend now
    /// records a clock ending through `record_end`, with the limit's value.
    #[test]
    fn a_clock_ending_is_worded_once_with_the_limits_value() {
        let limits = Limits::default();
        let mut r = Receipt::new(BackendKind::Process, Strictness::Strict);
        r.record_end(LimitKind::Wall, &limits);
        r.record_end(LimitKind::Cpu, &limits);
        r.record_end(LimitKind::Memory, &limits);
        r.record_output_cut(Stream::Stderr, &limits);
        let lines: Vec<(Capability, &str)> = r
            .denials
            .iter()
            .map(|d| (d.capability, d.detail.as_str()))
            .collect();
        assert_eq!(
            lines,
            [
                (
                    Capability::Wall,
                    "wall-clock timeout 30s reached; the run was killed"
                ),
                (Capability::Cpu, "CPU time 30s used up; the run was killed"),
                (
                    Capability::Output,
                    &*format!("stderr cut at {}", limits.output)
                ),
            ],
            "memory endings carry measured facts and are the backend's to word"
        );
    }
}
