//! What a warm pool's template makes the cluster enforce, read from the cluster, for the
//! checks before a claim and for the receipt.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use sandbox_core::SetupStage;
use sandbox_core::{Capability, Caps, Error, Mechanism, Receipt, Result, Strictness};

use crate::client::Cluster;
use crate::render::{EgressProxy, WORKSPACE};

/// The template of a warm pool, as far as the receipt needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateSeen {
    /// The `SandboxTemplate`'s name.
    pub template: String,
    /// The pod's `runtimeClassName` (`None`: the node's default runtime, no boundary of
    /// its own).
    pub runtime_class: Option<String>,
    /// The container's memory limit in bytes, if it has one.
    pub memory: Option<u64>,
    /// The container's CPU limit in millicores, if it has one.
    pub cpu_millis: Option<u64>,
    /// The smallest `emptyDir` size limit among the pod's volumes, in bytes.
    pub disk: Option<u64>,
    /// The security context's hardening, each as the template states it.
    pub hardening: Vec<&'static str>,
    /// The NetworkPolicy's egress, summarised (`None`: no egress at all).
    pub egress: Option<String>,
    /// The egress proxy that egress goes to, when it has the shape Strata renders.
    pub proxy: Option<EgressProxy>,
    /// The number of ingress rules (Strata renders none).
    pub ingress_rules: usize,
}

/// Reads the pool `pool` and its template.
pub(crate) async fn read(cluster: &Cluster, pool: &str) -> Result<TemplateSeen> {
    let setup = |what: String, e: crate::client::ClusterError| {
        Error::setup(
            SetupStage::Cluster,
            what,
            std::io::Error::other(crate::client::error_chain(&e)),
        )
    };
    let warm = cluster
        .get_warm_pool(pool)
        .await
        .map_err(|e| setup(format!("cluster: warm pool {pool}"), e))?;
    let name = warm.spec.sandbox_template_ref.name;
    let template = cluster
        .get_template(&name)
        .await
        .map_err(|e| setup(format!("cluster: template {name} of pool {pool}"), e))?;
    let pod = &template.spec.pod_template.spec;
    let container = pod.containers.first();
    let policy = &template.spec.network_policy;
    Ok(TemplateSeen {
        template: name,
        runtime_class: pod.runtime_class_name.clone(),
        memory: container.and_then(|c| limit(c, "memory")).and_then(bytes),
        cpu_millis: container.and_then(|c| limit(c, "cpu")).and_then(millicores),
        disk: pod
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.empty_dir.as_ref()?.size_limit.as_ref())
            .filter_map(|q| bytes(&q.0))
            .min(),
        hardening: hardening(pod, container),
        egress: (!policy.egress.is_empty()).then(|| {
            serde_json::to_string(&policy.egress).unwrap_or_else(|_| "(unreadable)".into())
        }),
        proxy: EgressProxy::of_policy(&policy.egress),
        ingress_rules: policy.ingress.len(),
    })
}

fn limit<'a>(container: &'a Container, resource: &str) -> Option<&'a str> {
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    limits.get(resource).map(|q| q.0.as_str())
}

/// The security settings the template states (the admission policy requires them of every
/// sandbox; listed as found, so a hand-edited template shows what it lacks).
fn hardening(pod: &PodSpec, container: Option<&Container>) -> Vec<&'static str> {
    let mut found = Vec::new();
    let sc = container.and_then(|c| c.security_context.as_ref());
    let pod_sc = pod.security_context.as_ref();
    if sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root))
        == Some(true)
    {
        found.push("runAsNonRoot");
    }
    if sc
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"))
    {
        found.push("capabilities drop ALL");
    }
    if sc.and_then(|s| s.allow_privilege_escalation) == Some(false) {
        found.push("allowPrivilegeEscalation false");
    }
    if sc.and_then(|s| s.read_only_root_filesystem) == Some(true) {
        found.push("readOnlyRootFilesystem");
    }
    if pod.automount_service_account_token == Some(false) {
        found.push("no service-account token");
    }
    if !pod.host_network.unwrap_or(false)
        && !pod.host_pid.unwrap_or(false)
        && !pod.host_ipc.unwrap_or(false)
    {
        found.push("no host network, PID or IPC namespace");
    }
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(pod_sc.and_then(|s| s.seccomp_profile.as_ref()));
    if seccomp.is_some_and(|p| p.type_ == "RuntimeDefault") {
        found.push("seccomp RuntimeDefault");
    }
    found
}

/// A Kubernetes quantity in bytes (`512Mi`, `1G`, `1048576`); `None` for what it cannot read.
pub(crate) fn bytes(quantity: &str) -> Option<u64> {
    let suffixes: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().ok()?.checked_mul(factor);
        }
    }
    quantity.parse().ok()
}

/// A CPU quantity in millicores (`500m`, `2`).
pub(crate) fn millicores(quantity: &str) -> Option<u64> {
    match quantity.strip_suffix('m') {
        Some(millis) => millis.parse().ok(),
        None => quantity
            .parse::<f64>()
            .ok()
            .map(|c| (c * 1000.0).round() as u64),
    }
}

/// Refuses (strict) or lists as gaps (best-effort) per-run limits tighter than the pod's:
/// the pod's are the ones the cluster enforces.
pub(crate) fn check_limits(
    seen: &TemplateSeen,
    caps: &Caps,
    strictness: Strictness,
) -> Result<Vec<(Capability, String)>> {
    let limits = &caps.limits;
    let asked_cpu = (limits.cpus * 1000.0).round() as u64;
    let tighter = [
        (
            Capability::Memory,
            "memory",
            seen.memory.filter(|&m| limits.memory.bytes() < m).map(|m| {
                format!(
                    "limits.memory {} is below the pod's memory limit ({m} bytes), which is the one enforced",
                    limits.memory
                )
            }),
        ),
        (
            Capability::Cpu,
            "cpu",
            seen.cpu_millis.filter(|&c| asked_cpu < c).map(|c| {
                format!(
                    "limits.cpus {} is below the pod's CPU limit ({c}m), which is the one enforced",
                    limits.cpus
                )
            }),
        ),
        (
            Capability::Disk,
            "disk",
            seen.disk.filter(|&d| limits.disk.bytes() < d).map(|d| {
                format!(
                    "limits.disk {} is below the pod's scratch volume limit ({d} bytes), which is the one enforced",
                    limits.disk
                )
            }),
        ),
    ];
    let mut gaps = Vec::new();
    for (capability, what, reason) in tighter {
        let Some(reason) = reason else { continue };
        match strictness {
            Strictness::Strict => {
                return Err(Error::unenforceable_strict(
                    format!("{what}: cluster pod limit"),
                    format!("{reason}; apply a template rendered from these limits (strata kube apply) or run best-effort"),
                ))
            }
            Strictness::BestEffort => gaps.push((capability, reason)),
        }
    }
    Ok(gaps)
}

/// What the cluster and the pod's agent enforced, from the template and the caps.
/// `layered`: the tool ran under Strata's process backend inside the pod, whose own receipt
/// (merged after this) states the per-process limits, the filter and the rules.
/// `applied` is what the pod's agent read back once the tool started: the memory and pids
/// lines say what the pod's own cgroup reports, not only what the template asks.
pub(crate) fn fill_receipt(
    receipt: &mut Receipt,
    seen: &TemplateSeen,
    caps: &Caps,
    layered: bool,
    applied: Option<&sandbox_agent::protocol::Applied>,
) {
    let read_back = |value: Option<u64>, file: &str, unit: &str| match value {
        Some(v) => format!("; the pod's cgroup reads {file} {v}{unit}"),
        None => format!("; {file} was not read back (no cgroup v2 limit visible to the agent)"),
    };
    let memory_max = applied.and_then(|a| a.cgroup_memory_max);
    let pids_max = applied.and_then(|a| a.cgroup_pids_max);
    let template = &seen.template;
    match seen.runtime_class.as_deref() {
        Some(class) => receipt.enforce(
            Capability::Syscalls,
            Mechanism::Runtime,
            format!("runtime class {class}"),
            format!("{}; template {template}", boundary(class)),
        ),
        None => receipt.gap(
            Capability::Syscalls,
            format!("template {template} names no runtime class: the pod shares its node's kernel"),
        ),
    }
    if !layered {
        receipt.gap(
            Capability::Syscalls,
            "no seccomp filter or landlock rules of Strata's inside the pod (gVisor implements no landlock): the runtime class and the runtime's default seccomp profile are the boundary",
        );
    }
    receipt.enforce(
        Capability::Privileges,
        Mechanism::Cluster,
        "pod security context",
        seen.hardening.join(", "),
    );
    receipt.enforce(
        Capability::Fs,
        Mechanism::Cluster,
        "the image's root, read-only; a scratch volume",
        format!(
            "nothing of this machine is visible; writable: {WORKSPACE} and /tmp (an emptyDir{})",
            seen.disk
                .map(|d| format!(" of {d} bytes"))
                .unwrap_or_default()
        ),
    );
    receipt.enforce(
        Capability::Net,
        Mechanism::Cluster,
        "NetworkPolicy",
        format!(
            "ingress: {}; egress: {}; no cluster DNS",
            if seen.ingress_rules == 0 {
                "none".to_owned()
            } else {
                format!("{} rule(s)", seen.ingress_rules)
            },
            seen.egress.as_deref().unwrap_or("none")
        ),
    );
    if let Some(memory) = seen.memory {
        receipt.enforce(
            Capability::Memory,
            Mechanism::Cluster,
            "pod memory limit",
            format!(
                "{memory} bytes for the pod{}",
                read_back(memory_max, "memory.max", " bytes")
            ),
        );
    }
    if let Some(cpu) = seen.cpu_millis {
        receipt.enforce(
            Capability::Cpu,
            Mechanism::Cluster,
            "pod CPU limit",
            format!("{cpu}m for the pod"),
        );
    }
    if let Some(disk) = seen.disk {
        receipt.enforce(
            Capability::Disk,
            Mechanism::Cluster,
            "emptyDir size limit",
            format!("{disk} bytes for {WORKSPACE} and /tmp together"),
        );
    }
    let limits = &caps.limits;
    receipt.enforce(
        Capability::Wall,
        Mechanism::Supervisor,
        "the pod's agent",
        if layered {
            format!(
                "timeout {} ms plus {} ms for the inner sandbox to start and report, as a backstop; the inner sandbox enforces the timeout itself",
                limits.timeout.as_millis(),
                sandbox_agent::inner::INNER_SLACK_MS
            )
        } else {
            format!(
                "timeout {} ms: the tool's process group is killed",
                limits.timeout.as_millis()
            )
        },
    );
    receipt.enforce(
        Capability::Output,
        Mechanism::Supervisor,
        "the pod's agent",
        format!("{} per stream", limits.output),
    );
    if layered {
        return;
    }
    receipt.enforce(
        Capability::Cpu,
        Mechanism::Rlimit,
        "RLIMIT_CPU",
        format!("{} s", limits.cpu_time.as_secs().max(1)),
    );
    receipt.enforce(
        Capability::FileSize,
        Mechanism::Rlimit,
        "RLIMIT_FSIZE",
        limits.file_size.to_string(),
    );
    receipt.enforce(
        Capability::OpenFiles,
        Mechanism::Rlimit,
        "RLIMIT_NOFILE",
        limits.open_files.to_string(),
    );
    receipt.enforce(
        Capability::Env,
        Mechanism::Environment,
        "explicit environment",
        "the caps' env over PATH, HOME and LANG; the pod's template carries none",
    );
    receipt.gap(
        Capability::Pids,
        format!(
            "limits.processes ({}) is not applied in the pod; the node's pod PID limit applies{}",
            limits.processes,
            read_back(pids_max, "pids.max", "")
        ),
    );
}

/// A memory limit the pod's cgroup reads back looser than the template's: the receipt's
/// memory line would not hold, so it is missing (withheld under strict).
pub(crate) fn memory_not_applied(
    seen: &TemplateSeen,
    applied: Option<&sandbox_agent::protocol::Applied>,
) -> Option<(Capability, String)> {
    let asked = seen.memory?;
    let read = applied?.cgroup_memory_max?;
    (read > asked).then(|| {
        (
            Capability::Memory,
            format!("the template limits the pod to {asked} bytes, but its cgroup reads memory.max {read}"),
        )
    })
}

fn boundary(class: &str) -> String {
    match class {
        "gvisor" | "runsc" => {
            "gVisor: the tool's system calls are served by the Sentry, a user-space kernel".into()
        }
        c if c.starts_with("kata") => {
            format!("Kata Containers ({c}): the pod runs in a VM of its own, on its own kernel")
        }
        other => format!("the cluster's runtime class {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_the_api_server_writes_them() {
        assert_eq!(bytes("512Mi"), Some(512 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1048576"), Some(1 << 20));
        assert_eq!(bytes("lots"), None);
        assert_eq!(millicores("500m"), Some(500));
        assert_eq!(millicores("2"), Some(2000));
        assert_eq!(millicores("0.25"), Some(250));
    }

    #[test]
    fn a_pod_cgroup_looser_than_its_template_does_not_back_the_memory_line() {
        let seen = TemplateSeen {
            template: "t".into(),
            runtime_class: None,
            memory: Some(512 << 20),
            cpu_millis: None,
            disk: None,
            hardening: Vec::new(),
            egress: None,
            proxy: None,
            ingress_rules: 0,
        };
        let read = |max| sandbox_agent::protocol::Applied {
            cgroup_memory_max: max,
            ..Default::default()
        };
        assert_eq!(
            memory_not_applied(&seen, Some(&read(Some(512 << 20)))),
            None
        );
        assert_eq!(memory_not_applied(&seen, Some(&read(None))), None);
        let (cap, why) =
            memory_not_applied(&seen, Some(&read(Some(1 << 30)))).expect("looser limit found");
        assert_eq!(cap, Capability::Memory);
        assert!(why.contains("memory.max 1073741824"), "{why}");
    }
}
