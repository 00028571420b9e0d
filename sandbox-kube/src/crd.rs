//! The four agent-sandbox kinds Strata writes, typed after the pinned v1beta1 CRDs.
//!
//! Each struct holds only the fields Strata sets (plus `metadata`), named exactly as the
//! CRD's `openAPIV3Schema` names them; the pod spec and the network policy rules are the
//! Kubernetes API's own types from `k8s-openapi`. The structs do not deny unknown fields:
//! an object read back from the API server carries `status` and server-set metadata.
//!
//! | kind | group | what Strata uses it for |
//! |---|---|---|
//! | [`SandboxTemplate`] | `extensions.agents.x-k8s.io` | one per tier or profile: the hardened pod and its network policy |
//! | [`SandboxWarmPool`] | `extensions.agents.x-k8s.io` | one per tier or profile: pre-started pods of the template |
//! | [`SandboxClaim`] | `extensions.agents.x-k8s.io` | one per run or session: takes a pod from the pool |
//! | [`Sandbox`] | `agents.x-k8s.io` | made by the claim controller from the template; what the admission policy checks |

use std::fmt;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::{NetworkPolicyEgressRule, NetworkPolicyIngressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

/// The API version of every kind here.
pub const VERSION: &str = "v1beta1";

/// One of the four agent-sandbox kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `agents.x-k8s.io/v1beta1` `Sandbox`.
    Sandbox,
    /// `extensions.agents.x-k8s.io/v1beta1` `SandboxTemplate`.
    SandboxTemplate,
    /// `extensions.agents.x-k8s.io/v1beta1` `SandboxWarmPool`.
    SandboxWarmPool,
    /// `extensions.agents.x-k8s.io/v1beta1` `SandboxClaim`.
    SandboxClaim,
}

impl Kind {
    /// All four, in the order [`crate::to_yaml`] writes them.
    pub const ALL: [Kind; 4] = [
        Kind::SandboxTemplate,
        Kind::SandboxWarmPool,
        Kind::SandboxClaim,
        Kind::Sandbox,
    ];

    /// The API group.
    pub const fn group(self) -> &'static str {
        match self {
            Kind::Sandbox => "agents.x-k8s.io",
            _ => "extensions.agents.x-k8s.io",
        }
    }

    /// The kind's name, as in `kind:`.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Sandbox => "Sandbox",
            Kind::SandboxTemplate => "SandboxTemplate",
            Kind::SandboxWarmPool => "SandboxWarmPool",
            Kind::SandboxClaim => "SandboxClaim",
        }
    }

    /// The plural resource name (the URL path segment and what admission rules match).
    pub const fn plural(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandboxes",
            Kind::SandboxTemplate => "sandboxtemplates",
            Kind::SandboxWarmPool => "sandboxwarmpools",
            Kind::SandboxClaim => "sandboxclaims",
        }
    }

    /// `group/version`, as in `apiVersion:`.
    pub fn api_version(self) -> String {
        format!("{}/{VERSION}", self.group())
    }

    /// The file name of the kind's CRD in upstream's `config/crd` (and in the pinned copy).
    pub fn crd_file(self) -> String {
        format!("{}_{}.yaml", self.group(), self.plural())
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A typed agent-sandbox object: its [`Kind`] is known from its type.
pub trait Object: Serialize {
    /// The kind of this type.
    const KIND: Kind;
}

/// The pod template embedded in a `Sandbox` and a `SandboxTemplate` (`spec.podTemplate`).
/// The CRD allows only labels and annotations as its metadata.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations of the pod.
    #[serde(default)]
    pub metadata: PodMetadata,
    /// The pod spec (the Kubernetes API's own type).
    pub spec: PodSpec,
}

/// `spec.podTemplate.metadata`: the only two fields the CRD allows there.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodMetadata {
    /// Labels of the pod.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations of the pod.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// `agents.x-k8s.io/v1beta1` `Sandbox`: one pod with a stable identity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// `agents.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// `Sandbox`.
    pub kind: String,
    /// Name, namespace, labels.
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: SandboxSpec,
}

/// `Sandbox.spec`, the fields Strata sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// The pod (required by the CRD).
    pub pod_template: PodTemplate,
}

impl Object for Sandbox {
    const KIND: Kind = Kind::Sandbox;
}

/// `extensions.agents.x-k8s.io/v1beta1` `SandboxTemplate`: the pod and network policy of a
/// class of sandboxes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplate {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// `SandboxTemplate`.
    pub kind: String,
    /// Name, namespace, labels.
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: SandboxTemplateSpec,
}

/// `SandboxTemplate.spec`, the fields Strata sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// The pod every sandbox of the template runs (required by the CRD).
    pub pod_template: PodTemplate,
    /// The template's network policy. Not optional here: upstream's controller applies its
    /// own default when the field is absent, and that default lets pods reach the whole
    /// public internet.
    pub network_policy: NetworkPolicySpec,
    /// Who manages the policy. Strata writes [`NetworkPolicyManagement::Managed`] so the
    /// controller creates it (with `policyTypes: [Ingress, Egress]`, default deny).
    pub network_policy_management: NetworkPolicyManagement,
    /// Whether a claim may add environment variables. Strata writes
    /// [`InjectionPolicy::Disallowed`]: per-run settings never travel as env.
    pub env_vars_injection_policy: InjectionPolicy,
    /// Whether a claim may add volume claim templates. Strata writes
    /// [`InjectionPolicy::Disallowed`]: per-run data never travels as volumes.
    pub volume_claim_templates_policy: InjectionPolicy,
}

impl Object for SandboxTemplate {
    const KIND: Kind = Kind::SandboxTemplate;
}

/// `SandboxTemplate.spec.networkPolicy`: the restricted subset of a Kubernetes
/// `NetworkPolicySpec` the CRD takes (the controller sets the pod selector and the policy
/// types). An empty list denies that direction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Allowed inbound traffic; empty denies all.
    #[serde(default)]
    pub ingress: Vec<NetworkPolicyIngressRule>,
    /// Allowed outbound traffic; empty denies all.
    #[serde(default)]
    pub egress: Vec<NetworkPolicyEgressRule>,
}

/// `SandboxTemplate.spec.networkPolicyManagement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetworkPolicyManagement {
    /// The controller creates and updates the template's NetworkPolicy.
    Managed,
    /// The controller creates none (another system manages networking).
    Unmanaged,
}

/// `SandboxTemplate.spec.envVarsInjectionPolicy` and `.volumeClaimTemplatesPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InjectionPolicy {
    /// A claim may add entries but not override the template's.
    Allowed,
    /// A claim may add and override entries.
    Overrides,
    /// A claim that sets any entry is rejected.
    Disallowed,
}

/// `extensions.agents.x-k8s.io/v1beta1` `SandboxWarmPool`: pre-started sandboxes of one
/// template.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPool {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// `SandboxWarmPool`.
    pub kind: String,
    /// Name, namespace, labels.
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: SandboxWarmPoolSpec,
}

/// `SandboxWarmPool.spec`, the fields Strata sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    /// Pods kept started (an `int32`, at least 0).
    pub replicas: i32,
    /// The template the pool's pods come from.
    pub sandbox_template_ref: NameRef,
    /// How warm pods follow a changed template.
    pub update_strategy: UpdateStrategy,
}

/// `SandboxWarmPool.spec.updateStrategy`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// The strategy.
    #[serde(rename = "type")]
    pub kind: UpdateStrategyType,
}

/// `SandboxWarmPool.spec.updateStrategy.type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateStrategyType {
    /// Warm pods of an older pod template are deleted at once. Strata's choice: a
    /// tightened template leaves no pod of the old one to be claimed.
    Recreate,
    /// Warm pods of an older template are replaced only when claimed or deleted.
    OnReplenish,
}

impl Object for SandboxWarmPool {
    const KIND: Kind = Kind::SandboxWarmPool;
}

/// A reference by name (`sandboxTemplateRef`, `warmPoolRef`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NameRef {
    /// The referenced object's name, in the same namespace.
    pub name: String,
}

/// `extensions.agents.x-k8s.io/v1beta1` `SandboxClaim`: takes a sandbox from a warm pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaim {
    /// `extensions.agents.x-k8s.io/v1beta1`.
    pub api_version: String,
    /// `SandboxClaim`.
    pub kind: String,
    /// Name (or `generateName`), namespace, labels.
    pub metadata: ObjectMeta,
    /// The desired state.
    pub spec: SandboxClaimSpec,
    /// What the claim controller reports; `None` in what Strata writes (the API server
    /// ignores a written status on create), set in what it reads back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SandboxClaimStatus>,
}

/// `SandboxClaim.status`, as the claim controller writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    /// The claim's conditions; `Ready` with status `True` once its sandbox is ready.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The sandbox bound to the claim, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<ClaimedSandbox>,
}

impl SandboxClaimStatus {
    /// The condition of type `kind`, if reported.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == kind)
    }

    /// The name of the bound sandbox when the claim is ready: a `Ready` condition with
    /// status `True` and a non-empty `sandbox.name`.
    pub fn ready_sandbox(&self) -> Option<&ClaimedSandbox> {
        let ready = self.condition(CONDITION_READY)?;
        if ready.status != "True" {
            return None;
        }
        self.sandbox.as_ref().filter(|s| !s.name.is_empty())
    }
}

/// The condition type the claim controller sets once the claim's sandbox is ready.
pub const CONDITION_READY: &str = "Ready";

/// One entry of `status.conditions` (the Kubernetes `metav1.Condition` shape).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A machine-readable reason (CamelCase).
    #[serde(default)]
    pub reason: String,
    /// A human-readable message.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339), as the server wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` the condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// `SandboxClaim.status.sandbox`: the sandbox bound to a claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedSandbox {
    /// The `Sandbox`'s name, in the claim's namespace.
    #[serde(default)]
    pub name: String,
    /// The pod's IP addresses.
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
}

/// `SandboxClaim.spec`, the fields Strata sets. No `env` and no volume claim templates:
/// both would force a cold start and carry per-run data the wrong way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// The pool to take a sandbox from (required by the CRD).
    pub warm_pool_ref: NameRef,
    /// What happens when the claim expires.
    pub lifecycle: ClaimLifecycle,
}

/// `SandboxClaim.spec.lifecycle`, the fields Strata sets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLifecycle {
    /// What expiry does to the claim and its sandbox.
    pub shutdown_policy: ShutdownPolicy,
}

/// `SandboxClaim.spec.lifecycle.shutdownPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShutdownPolicy {
    /// Delete the claim and, in cascade, its sandbox and pod. Strata's choice: a used pod
    /// is never handed to another run.
    Delete,
    /// Like `Delete`, the claim staying until the pod is gone.
    DeleteForeground,
    /// Delete the sandbox and pod, keep the claim (marked expired).
    Retain,
}

impl Object for SandboxClaim {
    const KIND: Kind = Kind::SandboxClaim;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_status_reads_ready_and_bound_sandbox() {
        let status = |ready: &str, sandbox: serde_json::Value| -> SandboxClaimStatus {
            let json = serde_json::json!({
                "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "m",
                                "lastTransitionTime": "2026-11-27T05:00:00Z"}],
                "sandbox": sandbox,
            });
            serde_json::from_value(json).expect("a claim status")
        };
        let bound = status(
            "True",
            serde_json::json!({"name": "s1", "podIPs": ["10.0.0.7"]}),
        );
        let sandbox = bound.ready_sandbox().expect("ready");
        assert_eq!((sandbox.name.as_str(), sandbox.pod_ips.len()), ("s1", 1));
        assert!(status("False", serde_json::json!({"name": "s1"}))
            .ready_sandbox()
            .is_none());
        assert!(status("True", serde_json::json!({"name": ""}))
            .ready_sandbox()
            .is_none());
        assert!(SandboxClaimStatus::default().ready_sandbox().is_none());
    }
}
