//! The receipt of a wasm run: every mechanism in force, the gaps, and what was cut off.

use std::sync::{Mutex, MutexGuard};

use sandbox_core::{
    Access, Capability, Caps, ExitStatus, LimitKind, Mechanism, Receipt, Strictness,
};

use crate::exec::{End, Finished};
use crate::plan::{NetPlan, Plan};

/// The gap of a run that opted out of protecting host-executed paths. A layered run drops
/// it from the inner receipt: the outer sandbox reports (and enforces) that capability.
pub(crate) const HOST_EXECUTED_WRITABLE: &str = "host-executed paths in writable preopens (.git/hooks, .envrc, ...) are writable (protect_host_executed: false, by request)";

/// Engine facts that appear in the receipt.
pub(crate) struct EngineFacts {
    pub pooling: bool,
    pub fuel: Option<u64>,
}

/// Each preopen as `GUEST=RESOLVED_HOST_PATH`, noting followed symlinks.
fn list(plan: &Plan, access: Access) -> String {
    let items: Vec<String> = plan
        .preopens
        .iter()
        .filter(|p| p.access == access)
        .map(|p| match &p.followed_from {
            Some(from) => format!(
                "{}={} (symlinks followed from {})",
                p.guest,
                p.host.display(),
                from.display()
            ),
            None => format!("{}={}", p.guest, p.host.display()),
        })
        .collect();
    if items.is_empty() {
        "none".into()
    } else {
        items.join(",")
    }
}

/// Remembers the last pre-run receipt: agents repeat the same caps, and formatting two
/// dozen mechanisms costs more than the rest of a warm run.
#[derive(Default)]
pub(crate) struct ReceiptCache {
    last: Mutex<Option<Cached>>,
}

/// The last receipt and what it was built from: the caps (without stdin), the strictness,
/// and the host facts the plan found (resolved preopens, gaps).
type Cached = (Caps, Strictness, Plan, Receipt);

/// Whether two caps give the same receipt (everything but stdin).
fn same_shape(a: &Caps, b: &Caps) -> bool {
    a.mounts == b.mounts
        && a.protect_host_executed == b.protect_host_executed
        && a.env == b.env
        && a.net == b.net
        && a.limits == b.limits
        && a.workdir == b.workdir
        && a.system == b.system
}

impl ReceiptCache {
    fn lock(&self) -> MutexGuard<'_, Option<Cached>> {
        match self.last.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The pre-run receipt for `caps`, built by [`enforced`] unless just seen.
    pub(crate) fn get(
        &self,
        plan: &Plan,
        caps: &Caps,
        facts: &EngineFacts,
        strictness: Strictness,
    ) -> Receipt {
        if let Some((c, s, p, r)) = self.lock().as_ref() {
            if *s == strictness
                && same_shape(c, caps)
                && p.preopens == plan.preopens
                && p.gaps == plan.gaps
            {
                return r.clone();
            }
        }
        let receipt = enforced(plan, caps, facts, strictness);
        let key = Caps {
            stdin: Vec::new(),
            ..caps.clone()
        };
        *self.lock() = Some((key, strictness, plan.clone(), receipt.clone()));
        receipt
    }
}

/// What is enforced before the run starts.
pub(crate) fn enforced(
    plan: &Plan,
    caps: &Caps,
    facts: &EngineFacts,
    strictness: Strictness,
) -> Receipt {
    let mut r = Receipt::new(sandbox_core::BackendKind::Wasm, strictness);
    let limits = &caps.limits;
    r.enforce(
        Capability::Fs, Mechanism::Wasm,
        "WASI preopens",
        format!(
            "ro: {}; rw: {}; nothing else of the host is reachable; paths resolve beneath each preopen (no `..`, absolute or symlink escapes)",
            list(plan, Access::ReadOnly),
            list(plan, Access::ReadWrite)
        ),
    );
    r.enforce(
        Capability::Fs, Mechanism::Wasm,
        "wasmtime-wasi read-only permissions",
        "read-only preopens refuse write, truncate, create, rename, link, unlink and set-times; preopens resolved without following symlinks (unless a mount asked) and opened with RESOLVE_NO_SYMLINKS",
    );
    let writable = plan.preopens.iter().any(|p| p.access == Access::ReadWrite);
    if writable && !caps.protect_host_executed {
        r.gap_by_request(Capability::Fs, HOST_EXECUTED_WRITABLE);
    } else if writable && !plan.gaps.iter().any(|(c, _)| *c == Capability::Fs) {
        r.enforce(
            Capability::Fs, Mechanism::Wasm,
            "planning check",
            "host-executed paths (.git/hooks, .envrc, ...): none present in the writable preopens; a tool can still create one where none existed",
        );
    }
    match &plan.net {
        NetPlan::None => r.enforce(
            Capability::Net, Mechanism::Wasm,
            "no sockets (WASI sockets disabled)",
            "preview 1 has no socket creation; preview 2 TCP, UDP and name lookup are refused",
        ),
        NetPlan::Allow { rules, .. } => {
            r.enforce(
                Capability::Net, Mechanism::Wasm,
                "wasi:sockets egress policy",
                format!(
                    "allowlist: {}; a name is resolved by the host (hosts file, then DNS with the absolute name) only if a rule matches it, otherwise never; TCP connect only to an address a rule admits for that port, through a name this run resolved to it or as an IP literal; reserved ranges and the host's own addresses only by an explicit IP/CIDR rule; no bind but the implicit one of a connect, no listen or accept; no UDP sockets",
                    if rules.is_empty() {
                        "empty (denies everything)".to_string()
                    } else {
                        rules.join(",")
                    }
                ),
            );
            r.enforce(
                Capability::Net, Mechanism::Wasm,
                "egress budget",
                format!(
                    "{} connection requests (allowed or refused) and as many resolved names; {} through metered TCP streams, both directions",
                    limits.egress_connections, limits.egress_bytes
                ),
            );
        }
        NetPlan::Host => r.gap_by_request(
            Capability::Net,
            "host network shared (net: host, unrestricted by request): WASI TCP, UDP and name lookup allowed",
        ),
    }
    let keys: Vec<&str> = plan.env.iter().map(|(k, _)| k.as_str()).collect();
    r.enforce(
        Capability::Env,
        Mechanism::Environment,
        "explicit WASI environment",
        format!(
            "host environment not inherited; set: {}",
            if keys.is_empty() {
                "nothing".to_string()
            } else {
                keys.join(",")
            }
        ),
    );
    r.enforce(
        Capability::Processes,
        Mechanism::Wasm,
        "single wasm instance",
        "WASI has no fork, exec, signals or ptrace; host processes are unreachable",
    );
    r.enforce(
        Capability::Pids,
        Mechanism::Wasm,
        "single wasm instance",
        format!(
            "no process or thread creation (wasm threads disabled); limit {} trivially held",
            limits.processes
        ),
    );
    r.enforce(
        Capability::Ipc,
        Mechanism::Wasm,
        "no shared memory",
        "shared memories and wasm threads disabled; no host IPC objects",
    );
    r.enforce(
        Capability::Syscalls,
        Mechanism::Wasm,
        "WASI imports only",
        "no system calls: the module reaches the host only through the WASI functions linked in",
    );
    r.enforce(
        Capability::Fds,
        Mechanism::Wasm,
        "WASI descriptor table",
        "only stdin, stdout, stderr and the preopens",
    );
    r.enforce(
        Capability::Memory,
        Mechanism::Wasm,
        "wasmtime ResourceLimiter",
        format!(
            "{} across linear memories and tables; bounds-checked accesses with guard pages",
            sandbox_core::ByteSize(plan.memory)
        ),
    );
    if facts.pooling {
        r.enforce(
            Capability::Memory,
            Mechanism::Wasm,
            "pooling allocator",
            "memory and tables reset between runs; no instance sees another's memory",
        );
    }
    r.enforce(
        Capability::Cpu,
        Mechanism::Wasm,
        "epoch interruption + thread CPU clock",
        format!("{:?}", limits.cpu_time),
    );
    if let Some(fuel) = facts.fuel {
        r.enforce(
            Capability::Cpu,
            Mechanism::Wasm,
            "fuel",
            format!("{fuel} units (deterministic instruction budget)"),
        );
    }
    r.enforce(
        Capability::Wall,
        Mechanism::Wasm,
        "epoch deadline + async timeout",
        format!(
            "{:?}; interrupts running code and blocking WASI calls",
            limits.timeout
        ),
    );
    r.enforce(
        Capability::Output,
        Mechanism::Host,
        "host-side capture",
        format!("{} per stream; the run is ended past it", limits.output),
    );
    r.enforce(
        Capability::Disk,
        Mechanism::Host,
        "metered WASI writes",
        format!("{} written into read-write preopens", limits.disk),
    );
    r.enforce(
        Capability::FileSize,
        Mechanism::Host,
        "metered WASI writes",
        limits.file_size.to_string(),
    );
    r.enforce(
        Capability::OpenFiles,
        Mechanism::Wasm,
        "wasmtime ResourceTable capacity",
        format!("{} descriptors, streams and pollables", limits.open_files),
    );
    r.enforce(
        Capability::Lifetime,
        Mechanism::Wasm,
        "store dropped at the end of the run",
        "nothing the module started outlives the run",
    );
    for (capability, reason) in &plan.gaps {
        r.gap(*capability, reason.clone());
    }
    r
}

/// The exit status, attributing failures to the limits that caused them.
pub(crate) fn status(finished: &Finished) -> ExitStatus {
    let failed = !matches!(finished.end, End::Exit(0));
    let limit = match &finished.end {
        End::Limit(kind) => Some(*kind),
        _ if finished.stdout.1 || finished.stderr.1 => Some(LimitKind::Output),
        _ if failed && finished.memory_refused.is_some() => Some(LimitKind::Memory),
        _ if failed && finished.disk_refused.1 => Some(LimitKind::FileSize),
        _ if failed && finished.disk_refused.0 => Some(LimitKind::Disk),
        _ => None,
    };
    match (limit, &finished.end) {
        (Some(limit), _) => ExitStatus::Limit {
            limit,
            signal: None,
        },
        (None, End::Exit(code)) => ExitStatus::Exited { code: *code },
        (None, End::Trap(trap, _)) => ExitStatus::Trapped { trap: *trap },
        // Cancelled and refused runs become errors before this point.
        (None, _) => ExitStatus::Trapped {
            trap: sandbox_core::TrapKind::Other,
        },
    }
}

/// Records what was cut off or refused during the run.
pub(crate) fn denials(r: &mut Receipt, finished: &Finished, caps: &Caps, status: &ExitStatus) {
    let limits = &caps.limits;
    if finished.stdout.1 {
        r.record_output_cut(sandbox_core::Stream::Stdout, limits);
    }
    if finished.stderr.1 {
        r.record_output_cut(sandbox_core::Stream::Stderr, limits);
    }
    if let Some(asked) = finished.memory_refused {
        r.deny(
            Capability::Memory,
            format!(
                "growth to {} refused at the {} limit",
                sandbox_core::ByteSize(asked),
                limits.memory
            ),
        );
    }
    if finished.disk_refused.0 {
        r.deny(
            Capability::Disk,
            format!("write refused: {} already written", limits.disk),
        );
    }
    if finished.disk_refused.1 {
        r.deny(
            Capability::FileSize,
            format!("write refused: a file would pass {}", limits.file_size),
        );
    }
    match status {
        ExitStatus::Limit {
            limit: kind @ (LimitKind::Wall | LimitKind::Cpu),
            ..
        } => r.record_end(*kind, limits),
        ExitStatus::Limit {
            limit: LimitKind::Fuel,
            ..
        } => r.deny(Capability::Cpu, "fuel exhausted"),
        ExitStatus::Limit {
            limit: LimitKind::OpenFiles,
            ..
        } => r.deny(
            Capability::OpenFiles,
            format!("descriptor table full at {}", limits.open_files),
        ),
        _ => {}
    }
    if let End::Trap(kind, message) = &finished.end {
        use sandbox_core::TrapKind as T;
        // Memory-safety faults the engine caught; other traps are in the status alone.
        if matches!(
            kind,
            T::StackOverflow | T::MemoryOutOfBounds | T::TableOutOfBounds | T::BadIndirectCall
        ) {
            r.deny(Capability::Memory, format!("stopped at a fault: {message}"));
        }
    }
}
