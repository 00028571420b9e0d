//! The receipt of an engine run: what the engine's own mechanisms enforced, stated from the
//! container's inspected configuration.

use bollard::models::HostConfig;
use sandbox_core::{
    BackendKind, Capability, Caps, ContainerReceipt, ContainerRuntime, ContainerSpec, Mechanism,
    Receipt, RunContext,
};
use sandbox_os::backend_api::egress;
use sandbox_os::backend_api::protocol::{MountRole, MountSpec};

use super::engine::SETID_GAP;

#[allow(clippy::too_many_arguments)]
pub(crate) fn receipt(
    container: &ContainerSpec,
    caps: &Caps,
    ctx: &RunContext,
    image_id: &str,
    user: &str,
    host: &HostConfig,
    binds: &[MountSpec],
    workdir: &str,
) -> Receipt {
    let runtime = container.runtime;
    let engine = if runtime == ContainerRuntime::Podman {
        "podman"
    } else {
        "docker"
    };
    let mut r = Receipt::new(BackendKind::Container, ctx.strictness);
    if runtime == ContainerRuntime::Runsc
        && binds
            .iter()
            .any(|m| m.role == MountRole::Grant && m.writable)
    {
        r.gap(Capability::Privileges, SETID_GAP);
    }
    if let Some(agent) = &caps.agent {
        r.gap(
            Capability::Privileges,
            format!("agent {agent} does not get its own host uid on the engine runtime"),
        );
    }
    r.container = Some(ContainerReceipt {
        runtime: runtime.as_str().to_string(),
        image: container.image.clone(),
        digest: image_id.to_string(),
    });
    let limits = &caps.limits;
    let mounts: Vec<String> = binds
        .iter()
        .filter(|m| m.role == MountRole::Grant)
        .map(|m| {
            let access = if m.writable { "rw" } else { "ro" };
            match &m.followed_from {
                Some(from) => format!(
                    "{}={} ({access}, symlinks followed from {})",
                    m.target.display(),
                    m.source.display(),
                    from.display()
                ),
                None => format!("{}={} ({access})", m.target.display(), m.source.display()),
            }
        })
        .collect();
    r.enforce(
        Capability::Fs,
        Mechanism::Mounts,
        format!("{engine} --read-only root + bind mounts"),
        format!(
            "image {image_id}; mounts: {}; workdir {}",
            if mounts.is_empty() {
                "none".to_string()
            } else {
                mounts.join(",")
            },
            workdir
        ),
    );
    sandbox_os::backend_api::host_executed_receipt(&mut r, binds, caps.protect_host_executed);
    r.enforce(
        Capability::Disk,
        Mechanism::Tmpfs,
        format!("{engine} --tmpfs /tmp"),
        format!("{} noexec,nosuid,nodev", limits.disk),
    );
    match host.network_mode.as_deref() {
        Some("host") => r.gap_by_request(
            Capability::Net,
            "host network shared (net: host, unrestricted by request)",
        ),
        Some(mode) if mode.starts_with("container:") => {
            r.enforce(
                Capability::Net,
                Mechanism::Namespace,
                format!("{engine} --network container:HOLDER"),
                "the namespace of a holder container started with --network none: loopback only, no route, no resolver",
            );
            r.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "egress proxy",
                format!(
                    "the only way out is the host's proxy at {} inside the namespace, with the run's own credential; allowlist: {}",
                    egress::proxy_addr(),
                    caps.net
                ),
            );
        }
        _ => r.enforce(
            Capability::Net,
            Mechanism::Namespace,
            format!("{engine} --network none"),
            "loopback only",
        ),
    }
    r.enforce(
        Capability::Env,
        Mechanism::Environment,
        "explicit environment",
        "host environment not inherited; the image's Env plus the caps' env",
    );
    r.enforce(
        Capability::Privileges,
        Mechanism::Privileges,
        format!("{engine} --cap-drop ALL + no-new-privileges"),
        format!("user {user} (never root)"),
    );
    if runtime == ContainerRuntime::Runsc {
        r.enforce(
            Capability::Syscalls,
            Mechanism::Runtime,
            "gVisor runsc",
            "system calls served by gVisor's user-space kernel",
        );
    } else {
        r.enforce(
            Capability::Syscalls, Mechanism::Seccomp,
            format!("{engine} with Strata's seccomp profile"),
            "the process sandbox's allowlist: dangerous syscalls EPERM, unknown ones ENOSYS; set-id modes, device nodes and nested namespaces refused",
        );
    }
    r.enforce(
        Capability::Processes,
        Mechanism::Namespace,
        format!("{engine} pid namespace"),
        "host processes invisible",
    );
    r.enforce(
        Capability::Ipc,
        Mechanism::Namespace,
        format!("{engine} --ipc private"),
        "private SysV IPC",
    );
    r.enforce(
        Capability::Memory,
        Mechanism::Cgroup,
        format!("{engine} --memory (no swap)"),
        limits.memory.to_string(),
    );
    r.enforce(
        Capability::Pids,
        Mechanism::Cgroup,
        format!("{engine} --pids-limit"),
        limits.processes.to_string(),
    );
    r.enforce(
        Capability::Cpu,
        Mechanism::Cgroup,
        format!("{engine} --cpus + RLIMIT_CPU ulimit"),
        format!("{} core(s); {:?} per process", limits.cpus, limits.cpu_time),
    );
    r.enforce(
        Capability::Wall,
        Mechanism::Supervisor,
        "host-side deadline + docker kill",
        format!("{:?}", limits.timeout),
    );
    r.enforce(
        Capability::Output,
        Mechanism::Host,
        "host-side cap on the attach stream",
        format!(
            "{} per stream; the container is killed past it",
            limits.output
        ),
    );
    r.enforce(
        Capability::FileSize,
        Mechanism::Rlimit,
        "RLIMIT_FSIZE ulimit",
        limits.file_size.to_string(),
    );
    r.enforce(
        Capability::OpenFiles,
        Mechanism::Rlimit,
        "RLIMIT_NOFILE ulimit",
        limits.open_files.to_string(),
    );
    r.enforce(
        Capability::Lifetime,
        Mechanism::Supervisor,
        format!("{engine} rm --force"),
        "the container is removed after the run, on error and on cancellation",
    );
    r
}
