//! The end of a process-backend run: the helper's events checked against the spec (a
//! guarantee the helper did not report withholds the result), then the run's output and a
//! receipt built from what the helper and the cgroup report.

use std::io;

use sandbox_core::{
    BackendKind, Capability, Error, ExitStatus, IdentityReceipt, IdentitySource, LimitKind,
    Mechanism, Receipt, ResourceUsage, Result, RunOutput, SetupStage, Stream, Strictness,
};

use crate::cgroup;
use crate::process::{allowlist_text, Preflight};
use crate::protocol::{
    Command, EndReason, Enforced, Event, LandlockStatus, MountRole, MountSpec, NetMode, Rlimit,
    Spec,
};
use crate::supervise::Outcome;

fn os_error(errno: i32, message: &str) -> io::Error {
    if errno > 0 {
        io::Error::from_raw_os_error(errno)
    } else {
        io::Error::other(message.to_string())
    }
}

/// The error a helper's report stands for: a setup failure (unenforceable when it says a
/// guarantee is missing) or a program that could not be executed; anything else reported
/// before the sandbox was ready is internal.
pub(crate) fn refusal(event: Event) -> Error {
    match event {
        Event::SetupFailed {
            stage,
            step,
            errno,
            message,
            unenforceable,
        } => match unenforceable {
            Some(guarantee) => {
                Error::unenforceable(guarantee, format!("{stage}: {step}: {message}"))
            }
            None => Error::setup(stage, step, os_error(errno, &message)),
        },
        Event::ExecFailed { program, errno } => Error::Exec {
            program,
            source: io::Error::from_raw_os_error(errno),
        },
        other => Error::Internal {
            message: format!("the helper reported {other:?} before the sandbox was ready"),
            source: None,
        },
    }
}

/// A live sandbox's receipt: what the helper reports it enforced (checked against the spec
/// like a run's) and the limits its cgroup holds, for every exec of the sandbox's life. The
/// wall-clock and output lines of a run are replaced by the supervisor's (its TTLs, its
/// output rings), which the caller adds.
pub(crate) fn live_receipt(
    enforced: &Enforced,
    spec: &Spec,
    command: &Command,
    pre: &Preflight,
    applied: cgroup::Applied,
    strictness: Strictness,
    identity: IdentitySource,
) -> Result<sandbox_core::Receipt> {
    check_enforced(enforced, spec)?;
    let mut receipt = receipt(spec, command, enforced, pre, applied, strictness);
    receipt.identity = identity_receipt(enforced, spec.run.agent.as_deref(), identity);
    receipt
        .enforced
        .retain(|e| !matches!(e.capability, Capability::Wall | Capability::Output));
    Ok(receipt)
}

pub(crate) fn finish(
    outcome: Outcome,
    spec: &Spec,
    command: &Command,
    pre: &Preflight,
    stats: Option<cgroup::Stats>,
    strictness: Strictness,
    identity: IdentitySource,
) -> Result<RunOutput> {
    let mut enforced: Option<Enforced> = None;
    let mut started = false;
    let mut exited = None;
    for event in outcome.events {
        match event {
            refused @ (Event::SetupFailed { .. } | Event::ExecFailed { .. }) => {
                return Err(refusal(refused))
            }
            Event::Ready { enforced: e } => enforced = Some(*e),
            Event::Started => started = true,
            exit @ Event::Exited { .. } => exited = Some(exit),
        }
    }
    if outcome.cancelled {
        return Err(Error::Cancelled);
    }
    let killed_reason = match &exited {
        Some(Event::Exited { killed, .. }) => *killed,
        _ => None,
    };
    // The tool ran if it was executed, or if it produced the output that got it killed.
    let ran = started || killed_reason == Some(EndReason::Output);
    let Some(enforced) = enforced.filter(|_| ran) else {
        return Err(match killed_reason {
            Some(EndReason::SetupTimeout) => Error::setup(
                SetupStage::Processes,
                "build sandbox",
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "building the sandbox took too long",
                ),
            ),
            Some(reason) => Error::Internal {
                message: format!("the sandbox was killed before the tool started ({reason})"),
                source: None,
            },
            None => Error::Internal {
                message: "the helper ended before starting the tool".into(),
                source: None,
            },
        });
    };
    check_enforced(&enforced, spec)?;
    let stats = stats.unwrap_or_default();
    let (wait_status, killed, user_us, system_us, max_rss, scratch_full) = match exited {
        Some(Event::Exited {
            wait_status,
            killed,
            user_cpu_us,
            system_cpu_us,
            max_rss_bytes,
            scratch_full,
        }) => (
            wait_status,
            killed,
            user_cpu_us,
            system_cpu_us,
            max_rss_bytes,
            scratch_full,
        ),
        _ if outcome.backstop_killed => (None, Some(EndReason::Wall), 0, 0, 0, false),
        // The helper itself was killed: at the memory limit (kernel buffers are charged to
        // the run too), that is the limit, not an internal failure.
        _ if stats.oom_kills > 0 => (None, Some(EndReason::Memory), 0, 0, 0, false),
        _ => {
            return Err(Error::Internal {
                message: "the helper ended without reporting how the tool exited".into(),
                source: None,
            })
        }
    };
    let (code, signal) = match wait_status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        _ => (None, Some(libc::SIGKILL)),
    };
    let limits = &spec.run.limits;
    let cpu_used_us = stats.cpu_us.unwrap_or(user_us + system_us);
    let cpu_limit_us = u64::try_from(limits.cpu_time.as_micros()).unwrap_or(u64::MAX);
    let failed = code != Some(0);
    let limit = match killed {
        None | Some(EndReason::Cancelled) => None,
        Some(EndReason::InitDied) if stats.oom_kills > 0 => Some(LimitKind::Memory),
        Some(reason) => match reason.limit() {
            Some(limit) => Some(limit),
            None => {
                return Err(Error::Internal {
                    message: format!("the sandbox was killed unexpectedly ({reason})"),
                    source: None,
                })
            }
        },
    }
    .or_else(|| {
        if stats.oom_kills > 0 {
            Some(LimitKind::Memory)
        } else if signal == Some(libc::SIGXCPU)
            || (signal == Some(libc::SIGKILL) && cpu_used_us >= cpu_limit_us)
        {
            Some(LimitKind::Cpu)
        } else if signal == Some(libc::SIGXFSZ) {
            Some(LimitKind::FileSize)
        } else if failed && stats.pids_refused > 0 {
            Some(LimitKind::Pids)
        } else if failed && scratch_full {
            Some(LimitKind::Disk)
        } else {
            None
        }
    });
    let status = match (limit, code, signal) {
        (Some(limit), _, signal) => ExitStatus::Limit { limit, signal },
        (None, Some(code), _) => ExitStatus::Exited { code },
        (None, None, Some(signal)) => ExitStatus::Signaled { signal },
        (None, None, None) => ExitStatus::Signaled {
            signal: libc::SIGKILL,
        },
    };

    let applied = stats.applied;
    let mut receipt = receipt(spec, command, &enforced, pre, applied, strictness);
    receipt.identity = identity_receipt(&enforced, spec.run.agent.as_deref(), identity);
    if stats.cpu_us.is_some() {
        receipt.enforce(
            Capability::Cpu,
            Mechanism::Cgroup,
            "cgroup cpu accounting",
            format!(
                "{:?} for the whole sandbox, checked every 100 ms",
                limits.cpu_time
            ),
        );
    }
    if outcome.stdout_truncated {
        receipt.record_output_cut(Stream::Stdout, limits);
    }
    if outcome.stderr_truncated {
        receipt.record_output_cut(Stream::Stderr, limits);
    }
    if outcome.memory_watched {
        receipt.enforce(
            Capability::Memory,
            Mechanism::Cgroup,
            "cgroup v2 memory pressure watch",
            format!(
                "a run whose every task stalls on memory for {:?} within {:?} (thrashing at the limit) ends as the memory limit",
                cgroup::THRASH_STALL,
                cgroup::THRASH_WINDOW
            ),
        );
    }
    if outcome.thrashed {
        receipt.deny(
            Capability::Memory,
            format!(
                "thrashing at the {} memory limit: every task stalled on memory; the run was ended",
                sandbox_core::ByteSize(applied.memory_bytes)
            ),
        );
    }
    if stats.oom_kills > 0 {
        receipt.deny(
            Capability::Memory,
            format!(
                "{} process(es) killed at the {} memory limit",
                stats.oom_kills,
                sandbox_core::ByteSize(applied.memory_bytes)
            ),
        );
    }
    if stats.pids_refused > 0 {
        receipt.deny(
            Capability::Pids,
            format!(
                "{} fork(s) refused at the {} process limit",
                stats.pids_refused, applied.pids
            ),
        );
    }
    if scratch_full {
        receipt.deny(
            Capability::Disk,
            format!(
                "scratch space full at {}",
                sandbox_core::ByteSize(enforced.scratch_bytes)
            ),
        );
    }
    match limit {
        Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => receipt.record_end(kind, limits),
        Some(LimitKind::FileSize) => receipt.deny(
            Capability::FileSize,
            format!("a file reached {}", limits.file_size),
        ),
        _ => {}
    }

    let (stdout, stderr) = (outcome.stdout, outcome.stderr);
    Ok(RunOutput {
        status,
        stdout,
        stderr,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        duration: outcome.duration,
        usage: ResourceUsage {
            user_cpu_us: user_us,
            system_cpu_us: system_us,
            peak_memory_bytes: if stats.peak_memory > 0 {
                stats.peak_memory
            } else {
                max_rss
            },
        },
        receipt,
    })
}

/// The namespaces every process sandbox has (plus `net` unless the host network is shared).
const NAMESPACES: [&str; 6] = ["user", "mount", "pid", "ipc", "uts", "cgroup"];

/// Refuses a run whose helper reports less than the spec demands (fail closed: the receipt
/// is built from this report, so it must cover everything).
fn check_enforced(enforced: &Enforced, spec: &Spec) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::unenforceable(
            "helper report",
            format!("the helper reports {what}; the run's result is withheld"),
        ))
    };
    if enforced.net != spec.net() {
        return refuse(format!(
            "network mode {:?} where the spec asks for {:?}",
            enforced.net,
            spec.net()
        ));
    }
    let net = spec.net() != NetMode::Host;
    let wanted = NAMESPACES.iter().copied().chain(net.then_some("net"));
    for ns in wanted {
        if !enforced.namespaces.iter().any(|n| n == ns) {
            return refuse(format!("no {ns} namespace"));
        }
    }
    if enforced.net != spec.net() {
        return refuse(format!("network {:?}, not {:?}", enforced.net, spec.net()));
    }
    if !enforced.no_new_privs {
        return refuse("no_new_privs unset".into());
    }
    if !enforced.fds_closed {
        return refuse("inherited fds left open".into());
    }
    if enforced.seccomp_allowed == 0 {
        return refuse("no seccomp filter".into());
    }
    if enforced.uid_map.is_empty() || enforced.gid_map.is_empty() {
        return refuse("no uid or gid map".into());
    }
    let planned: Vec<&MountSpec> = spec.mounts();
    let made: Vec<&MountSpec> = enforced.mounts.iter().collect();
    if planned != made {
        return refuse(format!(
            "{} mounts where {} were planned",
            made.len(),
            planned.len()
        ));
    }
    if enforced.rlimits != spec.rlimits() {
        return refuse("other rlimits than planned".into());
    }
    Ok(())
}

/// The identity the helper mapped (its first map lines are the tool's ids).
fn identity_receipt(
    enforced: &Enforced,
    agent: Option<&str>,
    source: IdentitySource,
) -> Option<IdentityReceipt> {
    let (uid, host_uid, _) = *enforced.uid_map.first()?;
    let (gid, host_gid, _) = *enforced.gid_map.first()?;
    Some(IdentityReceipt {
        agent: agent.map(str::to_string),
        source,
        host_uid,
        host_gid,
        uid,
        gid,
    })
}

/// What the receipt says about host-executed paths inside writable grants.
pub fn host_executed_receipt(r: &mut Receipt, mounts: &[MountSpec], protect: bool) {
    let writable_dirs = mounts
        .iter()
        .any(|m| m.role == MountRole::Grant && m.writable && m.is_dir);
    if !writable_dirs {
        return;
    }
    if !protect {
        r.gap_by_request(
            Capability::Fs,
            "host-executed paths in writable grants (.git/hooks, .envrc, ...) are writable (protect_host_executed: false, by request)",
        );
        return;
    }
    let protected: Vec<String> = mounts
        .iter()
        .filter(|m| m.role == MountRole::HostExecuted)
        .map(|m| m.target.display().to_string())
        .collect();
    r.enforce(
        Capability::Fs, Mechanism::Mounts,
        "read-only binds over writable grants",
        if protected.is_empty() {
            "host-executed paths read-only: none present; a tool can still create one where none existed".to_string()
        } else {
            format!(
                "host-executed paths read-only: {}; their parent directories pinned (cannot be renamed or removed); a tool can still create one where none existed",
                protected.join(", ")
            )
        },
    );
}

/// The value of one rlimit the helper set, if it set it.
fn rlimit(enforced: &Enforced, resource: Rlimit) -> Option<u64> {
    enforced
        .rlimits
        .iter()
        .find(|r| r.resource == resource)
        .map(|r| r.soft)
}

/// The receipt, from what the helper reports it enforced and what the cgroup holds; the
/// request only for what the host enforces itself (the output cap).
fn receipt(
    spec: &Spec,
    command: &Command,
    enforced: &Enforced,
    pre: &Preflight,
    applied: cgroup::Applied,
    strictness: Strictness,
) -> Receipt {
    let mut r = Receipt::new(BackendKind::Process, strictness);
    // System directories by their path; every grant as GUEST=RESOLVED_HOST_PATH.
    let list = |writable: bool| {
        enforced
            .mounts
            .iter()
            .filter(|m| m.writable == writable)
            .filter_map(|m| match (m.role, &m.followed_from) {
                (MountRole::System, _) if m.source == m.target => {
                    Some(m.target.display().to_string())
                }
                (MountRole::System | MountRole::Grant, Some(from)) => Some(format!(
                    "{}={} (symlinks followed from {})",
                    m.target.display(),
                    m.source.display(),
                    from.display()
                )),
                (MountRole::System | MountRole::Grant, None) => {
                    Some(format!("{}={}", m.target.display(), m.source.display()))
                }
                (MountRole::HostExecuted | MountRole::Pin, _) => None,
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let ro = list(false);
    let rw = list(true);
    r.enforce(
        Capability::Fs,
        Mechanism::Namespace,
        "mount namespace + pivot_root",
        format!(
            "ro: {}; rw: {}; private /tmp, /dev (null, zero, full, random, urandom), /proc",
            if ro.is_empty() { "none" } else { &ro },
            if rw.is_empty() { "none" } else { &rw }
        ),
    );
    match enforced.landlock_status {
        LandlockStatus::NotEnforced => r.gap(
            Capability::Fs,
            "landlock not enforced: only the mount namespace restricts files",
        ),
        status => {
            // Landlock is the second wall: the rights an older ABI lacks (refer: 2, truncate:
            // 3, device ioctls: 5) each guard something the mount layer or the seccomp filter
            // already holds, so a partial ruleset is stated, not a missing guarantee (and a
            // strict run is neither refused for it nor carries a gap).
            let detail = if status == LandlockStatus::PartiallyEnforced {
                format!(
                    "partially enforced: this kernel's ABI {} lacks some of the rights of ABI {} (renames across directories, truncate, device ioctls); read-only bind mounts (no write, truncate or rename) and the seccomp filter (ioctls) hold those",
                    enforced.landlock_abi,
                    crate::fs_policy::TARGET_ABI as i32
                )
            } else {
                status.describe().to_string()
            };
            r.enforce(
                Capability::Fs,
                Mechanism::Landlock,
                format!("landlock ABI {}", enforced.landlock_abi),
                detail,
            );
        }
    }
    r.enforce(
        Capability::Fs, Mechanism::Mounts,
        "recursive read-only, nosuid, nodev bind mounts",
        "read-only grants cannot be written, truncated, chmodded, renamed or linked; grants resolved on the host without following symlinks (unless a grant asked) and opened with RESOLVE_NO_SYMLINKS",
    );
    host_executed_receipt(&mut r, &enforced.mounts, spec.run.protect_host_executed);
    if enforced.memfd_noexec {
        r.enforce(
            Capability::Fs,
            Mechanism::Sysctl,
            "vm.memfd_noexec=2",
            "fileless exec from memfd refused",
        );
    }
    match enforced.net {
        NetMode::Isolated => r.enforce(
            Capability::Net,
            Mechanism::Namespace,
            "empty network namespace",
            "loopback only",
        ),
        NetMode::Host => r.gap_by_request(
            Capability::Net,
            "host network shared (net: host, unrestricted by request)",
        ),
        NetMode::Egress => {
            r.enforce(
                Capability::Net,
                Mechanism::Namespace,
                "empty network namespace",
                "loopback only: no other interface, no route, no resolver",
            );
            r.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "egress proxy",
                format!(
                    "the only way out is the host's proxy at {} inside the sandbox (HTTP CONNECT, plain HTTP, SOCKS5h), with the run's own credential; names resolved by the host and pinned per connection; always-denied ranges refused; allowlist: {}",
                    crate::egress_link::proxy_addr(),
                    allowlist_text(&spec.run.net),
                ),
            );
        }
    }
    let keys: Vec<&str> = command
        .env
        .iter()
        .filter_map(|e| e.split('=').next())
        .collect();
    r.enforce(
        Capability::Env,
        Mechanism::Environment,
        "explicit environment",
        format!("host environment not inherited; set: {}", keys.join(",")),
    );
    let mut processes = "pid namespace".to_string();
    if enforced.landlock_scoped {
        processes.push_str(" + landlock signal scope");
    }
    r.enforce(
        Capability::Processes,
        Mechanism::Namespace,
        processes,
        "host processes invisible and unsignalable; ptrace denied",
    );
    r.enforce(
        Capability::Ipc,
        Mechanism::Namespace,
        "ipc namespace",
        "private SysV IPC and POSIX queues",
    );
    if enforced.landlock_scoped {
        r.enforce(
            Capability::Ipc,
            Mechanism::Landlock,
            "landlock abstract-socket scope",
            "host abstract unix sockets unreachable",
        );
    }
    r.enforce(
        Capability::Uts,
        Mechanism::Namespace,
        "uts namespace",
        "hostname strata",
    );
    r.enforce(
        Capability::Syscalls,
        Mechanism::Seccomp,
        "seccomp-bpf",
        format!(
            "x86_64 only (other ABIs killed); {} allowed, {} denied with EPERM, others ENOSYS",
            enforced.seccomp_allowed, enforced.seccomp_denied
        ),
    );
    let first = |map: &[(u32, u32, u32)]| map.first().copied().unwrap_or_default();
    let ((uid, host_uid, _), (gid, host_gid, _)) =
        (first(&enforced.uid_map), first(&enforced.gid_map));
    let caps_state = if enforced.caps_dropped {
        "all capabilities dropped".to_string()
    } else {
        format!(
            "only {} kept, in its own user namespace (over files of its own and the embedder's ids)",
            enforced.caps_kept.join(" and ")
        )
    };
    r.enforce(
        Capability::Privileges, Mechanism::Namespace,
        "user namespace",
        format!(
            "uid {uid} gid {gid} inside = host uid {host_uid} gid {host_gid}; {caps_state}; no_new_privs; securebits locked"
        ),
    );
    r.enforce(
        Capability::Privileges,
        Mechanism::Seccomp,
        "seccomp mode rules + nosuid mounts",
        "no setuid/setgid files, device nodes or file capabilities can be created",
    );
    r.enforce(
        Capability::Fds,
        Mechanism::Descriptors,
        "close_range",
        "only stdin, stdout, stderr inherited",
    );
    r.enforce(
        Capability::Lifetime,
        Mechanism::Supervisor,
        "pid namespace init + parent-death signal",
        "every process ends with the run, or when the embedding process dies",
    );
    if spec.cgroup_limits {
        let name = pre.cgroup_name;
        r.enforce(
            Capability::Memory,
            Mechanism::Cgroup,
            format!("{name} memory"),
            sandbox_core::ByteSize(applied.memory_bytes).to_string(),
        );
        r.enforce(
            Capability::Pids,
            Mechanism::Cgroup,
            format!("{name} pids"),
            applied.pids.to_string(),
        );
        if let Some(cpus) = applied.cpus() {
            r.enforce(
                Capability::Cpu,
                Mechanism::Cgroup,
                "cgroup cpu quota",
                format!("{cpus} core(s) of bandwidth"),
            );
        }
    } else {
        // Not the run's limits (the gaps say so): what each process is held to.
        if let Some(bytes) = rlimit(enforced, Rlimit::As) {
            r.enforce(
                Capability::Memory,
                Mechanism::Rlimit,
                "RLIMIT_AS (no writable cgroup)",
                format!(
                    "{} per process, not for the run",
                    sandbox_core::ByteSize(bytes)
                ),
            );
        }
        if let Some(n) = rlimit(enforced, Rlimit::Nproc) {
            r.enforce(
                Capability::Pids,
                Mechanism::Rlimit,
                "RLIMIT_NPROC (no writable cgroup)",
                format!("{n} processes of the tool's host uid, not for the run"),
            );
        }
    }
    if let (true, Some(bytes)) = (spec.cgroup_limits, rlimit(enforced, Rlimit::As)) {
        r.enforce(
            Capability::Memory,
            Mechanism::Rlimit,
            "RLIMIT_AS",
            sandbox_core::ByteSize(bytes).to_string(),
        );
    }
    if let Some(secs) = rlimit(enforced, Rlimit::Cpu) {
        r.enforce(
            Capability::Cpu,
            Mechanism::Rlimit,
            "RLIMIT_CPU",
            format!("{secs}s per process"),
        );
    }
    r.enforce(
        Capability::Wall,
        Mechanism::Supervisor,
        "helper deadline",
        format!(
            "{:?}; kills the whole pid namespace",
            std::time::Duration::from_millis(enforced.timeout_ms)
        ),
    );
    r.enforce(
        Capability::Output,
        Mechanism::Host,
        "host-side cap",
        format!(
            "{} per stream; the run is killed past it",
            spec.run.limits.output
        ),
    );
    let host_writable: Vec<String> = enforced
        .mounts
        .iter()
        .filter(|m| m.writable && m.role == MountRole::Grant)
        .map(|m| m.target.display().to_string())
        .collect();
    r.enforce(
        Capability::Disk,
        Mechanism::Tmpfs,
        "tmpfs size",
        if host_writable.is_empty() {
            format!(
                "{} shared by /tmp, /dev/shm and the workdir",
                sandbox_core::ByteSize(enforced.scratch_bytes)
            )
        } else {
            format!(
                "{} shared by /tmp, /dev/shm and the workdir; the read-write grants ({}) are the host's own directories, written in place and bounded by the host's file system (and each file by the file-size limit), not by this size",
                sandbox_core::ByteSize(enforced.scratch_bytes),
                host_writable.join(", ")
            )
        },
    );
    if let Some(bytes) = rlimit(enforced, Rlimit::Fsize) {
        r.enforce(
            Capability::FileSize,
            Mechanism::Rlimit,
            "RLIMIT_FSIZE",
            sandbox_core::ByteSize(bytes).to_string(),
        );
    }
    if let Some(n) = rlimit(enforced, Rlimit::Nofile) {
        r.enforce(
            Capability::OpenFiles,
            Mechanism::Rlimit,
            "RLIMIT_NOFILE",
            n.to_string(),
        );
    }
    for (capability, reason) in &pre.gaps {
        r.gap(*capability, reason.clone());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tests::sample_spec;

    /// What an honest helper reports for `spec`.
    fn honest(spec: &Spec) -> Enforced {
        Enforced {
            namespaces: NAMESPACES
                .iter()
                .chain(&["net"])
                .map(|s| s.to_string())
                .collect(),
            landlock_abi: 7,
            landlock_status: LandlockStatus::FullyEnforced,
            seccomp_allowed: 300,
            no_new_privs: true,
            uid_map: vec![(1000, 1000, 1)],
            gid_map: vec![(1000, 1000, 1)],
            fds_closed: true,
            mounts: spec.mounts().into_iter().cloned().collect(),
            net: spec.net(),
            rlimits: spec.rlimits(),
            ..Enforced::default()
        }
    }

    #[test]
    fn a_helper_report_missing_a_guarantee_withholds_the_result() {
        let mut spec = sample_spec();
        spec.run.mounts.push(MountSpec {
            source: "/data".into(),
            target: "/data".into(),
            writable: false,
            is_dir: true,
            exec: true,
            role: MountRole::Grant,
            followed_from: None,
        });
        assert!(check_enforced(&honest(&spec), &spec).is_ok());
        type Tamper = fn(&mut Enforced);
        let tampered: [(&str, Tamper); 7] = [
            ("no pid namespace", |e| e.namespaces.retain(|n| n != "pid")),
            ("no net namespace", |e| e.namespaces.retain(|n| n != "net")),
            ("host network", |e| e.net = NetMode::Host),
            ("no no_new_privs", |e| e.no_new_privs = false),
            ("fds open", |e| e.fds_closed = false),
            ("a mount missing", |e| {
                e.mounts.pop();
            }),
            ("other rlimits", |e| e.rlimits.clear()),
        ];
        for (what, tamper) in tampered {
            let mut report = honest(&spec);
            tamper(&mut report);
            let err = check_enforced(&report, &spec).expect_err(what);
            assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable, "{what}");
        }
    }
}
