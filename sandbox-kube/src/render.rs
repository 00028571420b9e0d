//! From a tier or profile to the four agent-sandbox objects.
//!
//! [`render`] is a pure function: the same [`RenderInput`] always gives the same objects.
//! What it writes, and why:
//!
//! | where | what | why |
//! |---|---|---|
//! | pod | `runtimeClassName` from the [`Boundary`] | the isolation boundary is the runtime class (gVisor or Kata) |
//! | pod | `automountServiceAccountToken: false`, `enableServiceLinks: false` | no API credentials, no service addresses as env |
//! | pod | `hostNetwork`, `hostPID`, `hostIPC`: `false` | the node's namespaces stay the node's |
//! | pod and container | `runAsNonRoot`, uid and gid [`SANDBOX_UID`], `seccompProfile: RuntimeDefault` | non-root, with the runtime's syscall filter |
//! | container | `allowPrivilegeEscalation: false`, `privileged: false`, `capabilities.drop: [ALL]`, `readOnlyRootFilesystem: true` | nothing to escalate with, nothing of the image to change |
//! | container | requests = limits: `cpu`, `memory` from the caps' limits | the pod is Guaranteed and cannot starve its node |
//! | pod | one `emptyDir` (size limit = the caps' disk limit) mounted at [`WORKSPACE`] and `/tmp` | the caps' disk limit covers `/tmp` and the work directory together |
//! | pod | `dnsPolicy: None`, nameserver `127.0.0.1` | no cluster DNS: names are resolved by the egress proxy; lookups in the pod fail at once instead of timing out |
//! | container | `command`: [`AGENT_COMMAND`], `workingDir` [`WORKSPACE`], no `env`, no other volume | the guest agent is the entrypoint; each run is [`AGENT_SERVE`] exec'd in the claimed pod, its caps sent over that stream (Strata's agent channel), so every warm pod of a template is the same |
//! | template | `networkPolicy`: no ingress; egress only to the [`EgressProxy`] (none at all under [`Net::None`]) | the proxy enforces each run's allowlist |
//! | template | `envVarsInjectionPolicy`, `volumeClaimTemplatesPolicy`: `Disallowed` | a claim cannot add env or volumes |
//! | warm pool | `updateStrategy: Recreate` | a tightened template leaves no warm pod of the old one |
//! | claim | `lifecycle.shutdownPolicy: Delete`, no `env` | once a run gives its claim an expiry (`shutdownTime`), expiry deletes the pod too; no per-run data |
//!
//! No DNS egress is allowed: the egress proxy resolves names itself (HTTP `CONNECT`, plain
//! HTTP and SOCKS5h all carry the host name), and Strata gives the agent the proxy's IP
//! address, never a name. Ingress is denied entirely: Strata reaches the agent through the
//! API server (the pod's exec or attach stream, which the kubelet serves through the
//! container runtime), not through the pod's network.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, PodDNSConfig, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sandbox_core::{Caps, Net};
use sandbox_policy::{NetScope, Tier};
use serde::Serialize;

use crate::crd::{
    ClaimLifecycle, InjectionPolicy, Kind, NameRef, NetworkPolicyManagement, NetworkPolicySpec,
    Object, PodMetadata, PodTemplate, Sandbox, SandboxClaim, SandboxClaimSpec, SandboxSpec,
    SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec, ShutdownPolicy,
    UpdateStrategy, UpdateStrategyType,
};

/// Where the guest agent is in the image.
pub const AGENT_PATH: &str = "/strata/strata-guest-agent";
/// The container's command: the guest agent's idle `pod` mode (PID 1: reaps orphans, exits on
/// `SIGTERM`). The same for every pod; what a run may do is told to the agent after the
/// claim binds.
pub const AGENT_COMMAND: [&str; 2] = [AGENT_PATH, "pod"];
/// What the cluster backend execs in a claimed pod for each run: the guest agent serving
/// one run on the exec stream's standard input and output (Strata's agent channel).
pub const AGENT_SERVE: [&str; 2] = [AGENT_PATH, "serve"];
/// The name of the pod's one container.
pub const CONTAINER_NAME: &str = "strata-agent";
/// The work directory inside the pod (a size-capped `emptyDir`).
pub const WORKSPACE: &str = "/workspace";
/// The uid and gid the pod runs as (the conventional unprivileged `nonroot` id).
pub const SANDBOX_UID: i64 = 65532;
/// The name of the pod's scratch volume (mounted at [`WORKSPACE`] and `/tmp`).
pub const SCRATCH_VOLUME: &str = "scratch";
/// Label on every object and pod: who manages it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "strata";
/// Label on every object and pod: the tier or profile name.
pub const TIER_LABEL: &str = "strata.dev/tier";
/// Label on every object and pod: the [`Boundary`].
pub const BOUNDARY_LABEL: &str = "strata.dev/boundary";
/// The longest tier or profile name: room for the `strata-` prefix and the suffixes the
/// controllers and `generateName` add within a 63-character name.
pub const MAX_NAME: usize = 40;
/// The node label and taint GKE Sandbox puts on its gVisor nodes ([`Placement::GkeSandbox`]).
pub const GKE_SANDBOX_KEY: &str = "sandbox.gke.io/runtime";

/// The isolation boundary of a cluster sandbox: the pod's runtime class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// gVisor (`runsc`): a user-space kernel between the tool and the node's kernel.
    Gvisor,
    /// Kata Containers on QEMU: a lightweight VM per pod.
    KataQemu,
    /// Kata Containers on Firecracker: a microVM per pod.
    KataFc,
}

impl Boundary {
    /// Every boundary.
    pub const ALL: [Boundary; 3] = [Boundary::Gvisor, Boundary::KataQemu, Boundary::KataFc];

    /// The `runtimeClassName` (the names gVisor's and kata-deploy's RuntimeClasses use).
    pub const fn runtime_class(self) -> &'static str {
        match self {
            Boundary::Gvisor => "gvisor",
            Boundary::KataQemu => "kata-qemu",
            Boundary::KataFc => "kata-fc",
        }
    }
}

impl fmt::Display for Boundary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.runtime_class())
    }
}

impl FromStr for Boundary {
    type Err = RenderError;

    /// `gvisor`, `kata-qemu` or `kata-fc`.
    fn from_str(s: &str) -> Result<Self, RenderError> {
        Boundary::ALL
            .into_iter()
            .find(|b| b.runtime_class() == s)
            .ok_or_else(|| RenderError::UnknownBoundary(s.to_owned()))
    }
}

/// How pods find nodes that have their runtime class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Nothing but `runtimeClassName`: the RuntimeClass's own `scheduling` (node selector
    /// and tolerations, as kata-deploy installs them) places the pod.
    RuntimeClassOnly,
    /// GKE Sandbox: node selector `sandbox.gke.io/runtime: gvisor` and a toleration of the
    /// `sandbox.gke.io/runtime=gvisor:NoSchedule` taint, as upstream's
    /// `secure-sandbox-policy` requires. gVisor only.
    GkeSandbox,
}

impl Placement {
    /// The placement [`RenderInput::new`] picks: [`Placement::GkeSandbox`] for gVisor (so
    /// the output passes upstream's admission policy as it is), else
    /// [`Placement::RuntimeClassOnly`].
    pub const fn default_for(boundary: Boundary) -> Placement {
        match boundary {
            Boundary::Gvisor => Placement::GkeSandbox,
            _ => Placement::RuntimeClassOnly,
        }
    }
}

/// Where the pods' only allowed egress goes: Strata's egress proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EgressProxy {
    /// A proxy at a fixed IP address outside the pod network (a node or VM address),
    /// reached over TCP. Not a Service's ClusterIP: network policies see the backend pod
    /// after the Service's address translation, so an in-cluster proxy is
    /// [`EgressProxy::Pods`].
    Address(SocketAddr),
    /// Proxy pods in the cluster, chosen by namespace and labels, on a TCP port.
    Pods {
        /// The namespace of the proxy pods (matched by its `kubernetes.io/metadata.name`).
        namespace: String,
        /// Labels the proxy pods carry (at least one).
        labels: BTreeMap<String, String>,
        /// The TCP port the proxy listens on in its pods.
        port: u16,
    },
}

impl FromStr for EgressProxy {
    type Err = RenderError;

    /// `IP:PORT` (`[IPv6]:PORT`), or `pods:NAMESPACE/LABEL=VALUE[,LABEL=VALUE...]:PORT`.
    /// Host names are refused: a network policy takes addresses, not names.
    fn from_str(s: &str) -> Result<Self, RenderError> {
        let bad = |why: &str| RenderError::InvalidEgressProxy {
            value: s.to_owned(),
            reason: why.to_owned(),
        };
        if let Some(rest) = s.strip_prefix("pods:") {
            let (selector, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| bad("no :PORT after the pod selector"))?;
            let port: u16 = port.parse().map_err(|_| bad("the port is not 1-65535"))?;
            let (namespace, labels) = selector
                .split_once('/')
                .ok_or_else(|| bad("expected NAMESPACE/LABEL=VALUE,..."))?;
            let mut map = BTreeMap::new();
            for pair in labels.split(',') {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| bad("a label is not LABEL=VALUE"))?;
                map.insert(k.to_owned(), v.to_owned());
            }
            let proxy = EgressProxy::Pods {
                namespace: namespace.to_owned(),
                labels: map,
                port,
            };
            proxy.validate()?;
            return Ok(proxy);
        }
        let addr: SocketAddr = s
            .parse()
            .map_err(|_| bad("expected IP:PORT or pods:NAMESPACE/LABEL=VALUE:PORT (a network policy takes addresses, not host names)"))?;
        let proxy = EgressProxy::Address(addr);
        proxy.validate()?;
        Ok(proxy)
    }
}

impl EgressProxy {
    fn validate(&self) -> Result<(), RenderError> {
        let bad = |why: String| RenderError::InvalidEgressProxy {
            value: format!("{self:?}"),
            reason: why,
        };
        match self {
            EgressProxy::Address(addr) => {
                if addr.port() == 0 {
                    return Err(bad("port 0".into()));
                }
                if addr.ip().is_unspecified() {
                    return Err(bad("an unspecified address would allow every host".into()));
                }
            }
            EgressProxy::Pods {
                namespace,
                labels,
                port,
            } => {
                if *port == 0 {
                    return Err(bad("port 0".into()));
                }
                check_dns_label(namespace).map_err(|why| bad(format!("namespace: {why}")))?;
                if labels.is_empty() {
                    return Err(bad(
                        "no labels: an empty selector would match every pod of the namespace"
                            .into(),
                    ));
                }
                for (k, v) in labels {
                    check_label(k, v).map_err(bad)?;
                }
            }
        }
        Ok(())
    }

    /// The proxy a NetworkPolicy's egress rules send pods to, when they are exactly one
    /// rule of the shape [`render`] writes (one peer: a single address, or namespace and
    /// pod labels; one TCP port). `None` for anything else (no egress, or rules written by
    /// hand).
    pub fn of_policy(egress: &[NetworkPolicyEgressRule]) -> Option<EgressProxy> {
        let [rule] = egress else { return None };
        let [peer] = rule.to.as_deref()? else {
            return None;
        };
        let [port] = rule.ports.as_deref()? else {
            return None;
        };
        if port.protocol.as_deref().unwrap_or("TCP") != "TCP" || port.end_port.is_some() {
            return None;
        }
        let port = match port.port.as_ref()? {
            IntOrString::Int(n) => u16::try_from(*n).ok().filter(|p| *p != 0)?,
            IntOrString::String(_) => return None,
        };
        let proxy = match (&peer.ip_block, &peer.namespace_selector, &peer.pod_selector) {
            (Some(block), None, None) => {
                if block.except.as_ref().is_some_and(|e| !e.is_empty()) {
                    return None;
                }
                let (ip, bits) = block.cidr.split_once('/')?;
                let ip: std::net::IpAddr = ip.parse().ok()?;
                let host_bits = if ip.is_ipv4() { "32" } else { "128" };
                if bits != host_bits {
                    return None;
                }
                EgressProxy::Address(SocketAddr::new(ip, port))
            }
            (None, Some(ns), Some(pods)) => {
                if ns.match_expressions.is_some() || pods.match_expressions.is_some() {
                    return None;
                }
                let ns = ns.match_labels.as_ref()?;
                let [(key, namespace)] = ns.iter().collect::<Vec<_>>()[..] else {
                    return None;
                };
                if key != "kubernetes.io/metadata.name" {
                    return None;
                }
                EgressProxy::Pods {
                    namespace: namespace.clone(),
                    labels: pods.match_labels.clone()?,
                    port,
                }
            }
            _ => return None,
        };
        proxy.validate().ok()?;
        Some(proxy)
    }

    fn rule(&self) -> NetworkPolicyEgressRule {
        let (peer, port) = match self {
            EgressProxy::Address(addr) => {
                let bits = if addr.is_ipv4() { 32 } else { 128 };
                (
                    NetworkPolicyPeer {
                        ip_block: Some(IPBlock {
                            cidr: format!("{}/{bits}", addr.ip()),
                            except: None,
                        }),
                        ..Default::default()
                    },
                    addr.port(),
                )
            }
            EgressProxy::Pods {
                namespace,
                labels,
                port,
            } => (
                NetworkPolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_owned(),
                            namespace.clone(),
                        )])),
                        match_expressions: None,
                    }),
                    pod_selector: Some(LabelSelector {
                        match_labels: Some(labels.clone()),
                        match_expressions: None,
                    }),
                    ip_block: None,
                },
                *port,
            ),
        };
        NetworkPolicyEgressRule {
            to: Some(vec![peer]),
            ports: Some(vec![NetworkPolicyPort {
                protocol: Some("TCP".into()),
                port: Some(IntOrString::Int(i32::from(port))),
                end_port: None,
            }]),
        }
    }
}

/// What [`render`] needs: a tier or profile's name and caps, and where and how it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderInput {
    /// The tier or profile name: a DNS label of at most [`MAX_NAME`] characters. Objects
    /// are named `strata-NAME`.
    pub name: String,
    /// The namespace of every object. Default: none (the client's current namespace).
    pub namespace: Option<String>,
    /// The container image. It must hold the guest agent at [`AGENT_PATH`].
    pub image: String,
    /// The runtime class.
    pub boundary: Boundary,
    /// How pods reach nodes with the runtime class.
    /// Default: [`Placement::default_for`] the boundary.
    pub placement: Placement,
    /// The caps: `limits.memory`, `limits.cpus` and `limits.disk` size the pod, and `net`
    /// decides its egress ([`Net::None`]: none; [`Net::Allow`]: the egress proxy only;
    /// [`Net::Host`] is refused). Nothing else of them goes into the objects: per-run caps
    /// travel over the agent channel.
    pub caps: Caps,
    /// Pods the warm pool keeps started. Default: 1.
    pub warm_pool: u32,
    /// The egress proxy; required when `caps.net` is an allowlist. Default: none.
    pub egress_proxy: Option<EgressProxy>,
    /// The claim's name. Default: none, and the claim has `generateName: strata-NAME-` (so
    /// `kubectl create`, not `apply`, takes it).
    pub claim_name: Option<String>,
}

impl RenderInput {
    /// An input with the defaults listed on each field.
    pub fn new(
        name: impl Into<String>,
        image: impl Into<String>,
        boundary: Boundary,
        caps: Caps,
    ) -> RenderInput {
        RenderInput {
            name: name.into(),
            namespace: None,
            image: image.into(),
            boundary,
            placement: Placement::default_for(boundary),
            caps,
            warm_pool: 1,
            egress_proxy: None,
            claim_name: None,
        }
    }

    /// The input for a trust tier: [`Caps::new`]'s limits, and a network by the tier's
    /// scope: [`NetScope::None`] gives [`Net::None`] (no egress at all); an allowlist or
    /// any network gives an empty [`Net::Allow`] (egress to the proxy only, which enforces
    /// each run's allowlist). A cluster sandbox never gets the host network, whatever
    /// its tier.
    pub fn for_tier(tier: &Tier, image: impl Into<String>, boundary: Boundary) -> RenderInput {
        let mut caps = Caps::new();
        caps.net = match tier.network {
            NetScope::None => Net::None,
            NetScope::Allowlist | NetScope::Any => Net::Allow(Vec::new()),
        };
        RenderInput::new(tier.name.clone(), image, boundary, caps)
    }

    /// Sets the namespace.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> RenderInput {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets the warm pool's size.
    pub fn with_warm_pool(mut self, replicas: u32) -> RenderInput {
        self.warm_pool = replicas;
        self
    }

    /// Sets the egress proxy.
    pub fn with_egress_proxy(mut self, proxy: EgressProxy) -> RenderInput {
        self.egress_proxy = Some(proxy);
        self
    }

    /// Sets the placement.
    pub fn with_placement(mut self, placement: Placement) -> RenderInput {
        self.placement = placement;
        self
    }

    /// Sets the claim's name.
    pub fn with_claim_name(mut self, name: impl Into<String>) -> RenderInput {
        self.claim_name = Some(name.into());
        self
    }
}

/// The four objects of a tier or profile.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// The template: hardened pod and network policy.
    pub template: SandboxTemplate,
    /// The warm pool of the template.
    pub warm_pool: SandboxWarmPool,
    /// A claim on the pool, as one run or session makes it.
    pub claim: SandboxClaim,
    /// The sandbox the claim controller makes from the template: what the admission
    /// policy sees. Strata does not create it itself.
    pub sandbox: Sandbox,
}

impl Rendered {
    /// The four objects as JSON, in [`Kind::ALL`]'s order.
    pub fn to_json(&self) -> Result<Vec<(Kind, serde_json::Value)>, RenderError> {
        Ok(vec![
            json(&self.template)?,
            json(&self.warm_pool)?,
            json(&self.claim)?,
            json(&self.sandbox)?,
        ])
    }
}

fn json<T: Object>(object: &T) -> Result<(Kind, serde_json::Value), RenderError> {
    serde_json::to_value(object)
        .map(|v| (T::KIND, v))
        .map_err(|e| RenderError::Serialize {
            kind: T::KIND,
            message: e.to_string(),
        })
}

/// Why an input cannot be rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// The name is not a DNS label of at most [`MAX_NAME`] characters.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The image reference is empty or holds whitespace.
    #[error("invalid image {0:?}: empty or holding whitespace")]
    InvalidImage(String),
    /// Not `gvisor`, `kata-qemu` or `kata-fc`.
    #[error("unknown boundary {0:?}: expected gvisor, kata-qemu or kata-fc")]
    UnknownBoundary(String),
    /// The caps ask for the host network.
    #[error("the caps ask for the host network, which a cluster sandbox never gets (hostNetwork is refused by the admission policy); use an allowlist through the egress proxy")]
    HostNetwork,
    /// A network mode this crate does not know how to express.
    #[error("the caps' network {0} has no cluster mapping")]
    UnsupportedNet(String),
    /// The caps allow network through the proxy, but no proxy is given.
    #[error("the caps allow network access through the egress proxy, but no egress proxy address was given")]
    NoEgressProxy,
    /// The egress proxy is not usable as a network policy peer.
    #[error("invalid egress proxy {value}: {reason}")]
    InvalidEgressProxy {
        /// The address or selector.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A limit cannot size a pod.
    #[error("invalid limit {what}: {value}")]
    InvalidLimit {
        /// Which limit.
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// The warm pool is larger than the CRD's `int32`.
    #[error("warm pool of {0} pods is more than the CRD's int32 allows")]
    WarmPoolTooLarge(u32),
    /// The placement does not fit the boundary.
    #[error("placement {placement:?} is for gVisor nodes, not for boundary {boundary}")]
    Placement {
        /// The placement.
        placement: Placement,
        /// The boundary.
        boundary: Boundary,
    },
    /// An object could not be serialized.
    #[error("cannot serialize the {kind}: {message}")]
    Serialize {
        /// Which object.
        kind: Kind,
        /// The serializer's message.
        message: String,
    },
}

/// Renders the template, warm pool, claim and sandbox of `input`. Fails closed: an input
/// the objects cannot express safely ([`Net::Host`], an allowlist without a proxy, a
/// placement for another runtime) is an error, never a wider pod.
pub fn render(input: &RenderInput) -> Result<Rendered, RenderError> {
    check_name(&input.name)?;
    if let Some(namespace) = &input.namespace {
        check_dns_label(namespace).map_err(|reason| RenderError::InvalidName {
            name: namespace.clone(),
            reason,
        })?;
    }
    if let Some(claim) = &input.claim_name {
        check_dns_label(claim).map_err(|reason| RenderError::InvalidName {
            name: claim.clone(),
            reason,
        })?;
    }
    if input.image.is_empty() || input.image.chars().any(char::is_whitespace) {
        return Err(RenderError::InvalidImage(input.image.clone()));
    }
    if input.placement == Placement::GkeSandbox && input.boundary != Boundary::Gvisor {
        return Err(RenderError::Placement {
            placement: input.placement,
            boundary: input.boundary,
        });
    }
    let replicas = i32::try_from(input.warm_pool)
        .map_err(|_| RenderError::WarmPoolTooLarge(input.warm_pool))?;
    let egress = match (&input.caps.net, &input.egress_proxy) {
        (Net::None, _) => Vec::new(),
        (Net::Host, _) => return Err(RenderError::HostNetwork),
        (Net::Allow(_), None) => return Err(RenderError::NoEgressProxy),
        (Net::Allow(_), Some(proxy)) => {
            proxy.validate()?;
            vec![proxy.rule()]
        }
        // A network mode added to the core later is refused until it is mapped here.
        (other, _) => return Err(RenderError::UnsupportedNet(other.to_string())),
    };

    let object_name = format!("strata-{}", input.name);
    let labels = labels(input);
    let meta = |name: Option<String>, generate: Option<String>| ObjectMeta {
        name,
        generate_name: generate,
        namespace: input.namespace.clone(),
        labels: Some(labels.clone()),
        ..Default::default()
    };
    let pod = pod_template(input, &labels)?;

    let template = SandboxTemplate {
        api_version: Kind::SandboxTemplate.api_version(),
        kind: Kind::SandboxTemplate.name().to_owned(),
        metadata: meta(Some(object_name.clone()), None),
        spec: SandboxTemplateSpec {
            pod_template: pod.clone(),
            network_policy: NetworkPolicySpec {
                ingress: Vec::new(),
                egress,
            },
            network_policy_management: NetworkPolicyManagement::Managed,
            env_vars_injection_policy: InjectionPolicy::Disallowed,
            volume_claim_templates_policy: InjectionPolicy::Disallowed,
        },
    };
    let warm_pool = SandboxWarmPool {
        api_version: Kind::SandboxWarmPool.api_version(),
        kind: Kind::SandboxWarmPool.name().to_owned(),
        metadata: meta(Some(object_name.clone()), None),
        spec: SandboxWarmPoolSpec {
            replicas,
            sandbox_template_ref: NameRef {
                name: object_name.clone(),
            },
            update_strategy: UpdateStrategy {
                kind: UpdateStrategyType::Recreate,
            },
        },
    };
    let generated = format!("{object_name}-");
    let claim = SandboxClaim {
        api_version: Kind::SandboxClaim.api_version(),
        kind: Kind::SandboxClaim.name().to_owned(),
        metadata: match &input.claim_name {
            Some(name) => meta(Some(name.clone()), None),
            None => meta(None, Some(generated.clone())),
        },
        spec: SandboxClaimSpec {
            warm_pool_ref: NameRef {
                name: object_name.clone(),
            },
            lifecycle: ClaimLifecycle {
                shutdown_policy: ShutdownPolicy::Delete,
            },
        },
        status: None,
    };
    let sandbox = Sandbox {
        api_version: Kind::Sandbox.api_version(),
        kind: Kind::Sandbox.name().to_owned(),
        metadata: meta(None, Some(generated)),
        spec: SandboxSpec { pod_template: pod },
    };
    Ok(Rendered {
        template,
        warm_pool,
        claim,
        sandbox,
    })
}

fn labels(input: &RenderInput) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (TIER_LABEL.to_owned(), input.name.clone()),
        (
            BOUNDARY_LABEL.to_owned(),
            input.boundary.runtime_class().to_owned(),
        ),
    ])
}

/// The hardened pod of `input` (see the module docs for each field).
fn pod_template(
    input: &RenderInput,
    labels: &BTreeMap<String, String>,
) -> Result<PodTemplate, RenderError> {
    let limits = &input.caps.limits;
    let memory = limits.memory.bytes();
    if memory == 0 {
        return Err(RenderError::InvalidLimit {
            what: "memory",
            value: "0".into(),
        });
    }
    let disk = limits.disk.bytes();
    if disk == 0 {
        return Err(RenderError::InvalidLimit {
            what: "disk",
            value: "0".into(),
        });
    }
    let cpu = millicores(limits.cpus)?;
    let resources = BTreeMap::from([
        ("cpu".to_owned(), Quantity(format!("{cpu}m"))),
        ("memory".to_owned(), bytes_quantity(memory)),
    ]);
    let seccomp = SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    };
    let container = Container {
        name: CONTAINER_NAME.into(),
        image: Some(input.image.clone()),
        command: Some(AGENT_COMMAND.iter().map(|s| (*s).to_owned()).collect()),
        working_dir: Some(WORKSPACE.into()),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            claims: None,
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            seccomp_profile: Some(seccomp.clone()),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: SCRATCH_VOLUME.into(),
                mount_path: WORKSPACE.into(),
                sub_path: Some("workspace".into()),
                ..Default::default()
            },
            VolumeMount {
                name: SCRATCH_VOLUME.into(),
                mount_path: "/tmp".into(),
                sub_path: Some("tmp".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let (node_selector, tolerations) = match input.placement {
        Placement::RuntimeClassOnly => (None, None),
        Placement::GkeSandbox => (
            Some(BTreeMap::from([(
                GKE_SANDBOX_KEY.to_owned(),
                "gvisor".to_owned(),
            )])),
            Some(vec![Toleration {
                key: Some(GKE_SANDBOX_KEY.into()),
                operator: Some("Equal".into()),
                value: Some("gvisor".into()),
                effect: Some("NoSchedule".into()),
                toleration_seconds: None,
            }]),
        ),
    };
    let spec = PodSpec {
        runtime_class_name: Some(input.boundary.runtime_class().into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        dns_policy: Some("None".into()),
        dns_config: Some(PodDNSConfig {
            nameservers: Some(vec!["127.0.0.1".into()]),
            options: None,
            searches: None,
        }),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            fs_group: Some(SANDBOX_UID),
            seccomp_profile: Some(seccomp),
            ..Default::default()
        }),
        containers: vec![container],
        volumes: Some(vec![Volume {
            name: SCRATCH_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(bytes_quantity(disk)),
            }),
            ..Default::default()
        }]),
        node_selector,
        tolerations,
        ..Default::default()
    };
    Ok(PodTemplate {
        metadata: PodMetadata {
            labels: labels.clone(),
            annotations: BTreeMap::new(),
        },
        spec,
    })
}

/// Bytes as a quantity, in the largest binary unit that divides them (`512Mi`, `1Gi`).
fn bytes_quantity(bytes: u64) -> Quantity {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "Ti"),
        (1 << 30, "Gi"),
        (1 << 20, "Mi"),
        (1 << 10, "Ki"),
    ];
    for (size, suffix) in UNITS {
        if bytes.is_multiple_of(size) {
            return Quantity(format!("{}{suffix}", bytes / size));
        }
    }
    Quantity(bytes.to_string())
}

/// Cores as whole millicores, rounded up (0.5 -> 500; at least 1).
fn millicores(cpus: f64) -> Result<u64, RenderError> {
    if !cpus.is_finite() || cpus <= 0.0 || cpus > 1e6 {
        return Err(RenderError::InvalidLimit {
            what: "cpus",
            value: cpus.to_string(),
        });
    }
    // In range 0 < cpus <= 1e6, so the product is at most 1e9 and the cast is exact.
    Ok((cpus * 1000.0).ceil().max(1.0) as u64)
}

fn check_name(name: &str) -> Result<(), RenderError> {
    let bad = |reason: String| RenderError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.len() > MAX_NAME {
        return Err(bad(format!("longer than {MAX_NAME} characters")));
    }
    check_dns_label(name).map_err(bad)
}

/// An RFC 1123 label: 1 to 63 of `a-z`, `0-9` and `-`, starting and ending alphanumeric.
fn check_dns_label(s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err("not a DNS label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)".into())
    }
}

/// A Kubernetes label: an optional DNS-subdomain prefix and `/`, a name of 1-63 of
/// `[A-Za-z0-9_.-]` alphanumeric at both ends; a value of 0-63 of the same.
fn check_label(key: &str, value: &str) -> Result<(), String> {
    fn segment(s: &str, empty_ok: bool) -> bool {
        if s.is_empty() {
            return empty_ok;
        }
        s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    }
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            let prefix_ok = !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|l| check_dns_label(l).is_ok());
            if !prefix_ok {
                return Err(format!("label key {key:?}: bad prefix"));
            }
            name
        }
        None => key,
    };
    if !segment(name, false) {
        return Err(format!("label key {key:?}: bad name"));
    }
    if !segment(value, true) {
        return Err(format!(
            "label value {value:?} of {key:?}: not a label value"
        ));
    }
    Ok(())
}

/// The four objects as one YAML stream: template, warm pool, claim, then the sandbox the
/// claim controller would make (commented as such). The claim has `generateName` unless
/// [`RenderInput::claim_name`] was set, so apply the stream with `kubectl create -f`.
pub fn to_yaml(rendered: &Rendered) -> Result<String, RenderError> {
    let mut out = String::new();
    doc(&mut out, &rendered.template, None)?;
    doc(&mut out, &rendered.warm_pool, None)?;
    doc(&mut out, &rendered.claim, None)?;
    doc(
        &mut out,
        &rendered.sandbox,
        Some("The Sandbox the claim controller makes from the template (what the admission policy\n# checks). Strata does not create it; created directly, it runs one pod outside the pool."),
    )?;
    Ok(out)
}

fn doc<T: Object + Serialize>(
    out: &mut String,
    object: &T,
    comment: Option<&str>,
) -> Result<(), RenderError> {
    let text = serde_norway::to_string(object).map_err(|e| RenderError::Serialize {
        kind: T::KIND,
        message: e.to_string(),
    })?;
    out.push_str("---\n");
    if let Some(comment) = comment {
        out.push_str("# ");
        out.push_str(comment);
        out.push('\n');
    }
    out.push_str(&text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}
