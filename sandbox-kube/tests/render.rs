//! What `render` writes: the hardened pod, the network policy, names and labels, and the
//! inputs it refuses. Schema and admission checks are in `schema.rs` and `admission.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sandbox_core::{ByteSize, Caps, Net};
use sandbox_kube::render::{
    AGENT_COMMAND, BOUNDARY_LABEL, MANAGED_BY_LABEL, SANDBOX_UID, TIER_LABEL, WORKSPACE,
};
use sandbox_kube::{
    render, to_yaml, Boundary, EgressProxy, Kind, Placement, RenderError, RenderInput, Rendered,
};
use sandbox_policy::Tier;

const IMAGE: &str = "registry.example/strata/tools:1";

fn proxy() -> EgressProxy {
    "10.20.0.7:3128".parse().expect("proxy address")
}

fn tiers() -> Vec<Tier> {
    Tier::PRESETS
        .iter()
        .map(|name| Tier::preset(name, "/home/agent".as_ref()).expect("preset"))
        .collect()
}

fn every_tier_and_boundary() -> Vec<(RenderInput, Rendered)> {
    let mut out = Vec::new();
    for tier in tiers() {
        for boundary in Boundary::ALL {
            let input = RenderInput::for_tier(&tier, IMAGE, boundary).with_egress_proxy(proxy());
            let rendered = render(&input).expect("render");
            out.push((input, rendered));
        }
    }
    out
}

fn pod(rendered: &Rendered) -> &PodSpec {
    &rendered.template.spec.pod_template.spec
}

fn container(rendered: &Rendered) -> &Container {
    &pod(rendered).containers[0]
}

#[test]
fn pod_is_hardened_for_every_tier_and_boundary() {
    for (input, r) in every_tier_and_boundary() {
        let what = format!("{} on {}", input.name, input.boundary);
        let p = pod(&r);
        // The sandbox the controller makes carries the template's pod unchanged.
        assert_eq!(
            r.sandbox.spec.pod_template, r.template.spec.pod_template,
            "{what}"
        );
        let psc = p.security_context.as_ref().expect("pod securityContext");
        let c = container(&r);
        let sc = c
            .security_context
            .as_ref()
            .expect("container securityContext");
        let checks: &[(&str, bool)] = &[
            (
                "runtimeClassName",
                p.runtime_class_name.as_deref() == Some(input.boundary.runtime_class()),
            ),
            (
                "automountServiceAccountToken false",
                p.automount_service_account_token == Some(false),
            ),
            (
                "enableServiceLinks false",
                p.enable_service_links == Some(false),
            ),
            ("hostNetwork false", p.host_network == Some(false)),
            ("hostPID false", p.host_pid == Some(false)),
            ("hostIPC false", p.host_ipc == Some(false)),
            ("no service account name", p.service_account_name.is_none()),
            ("pod runAsNonRoot", psc.run_as_non_root == Some(true)),
            ("pod runAsUser", psc.run_as_user == Some(SANDBOX_UID)),
            ("pod runAsGroup", psc.run_as_group == Some(SANDBOX_UID)),
            (
                "pod seccomp RuntimeDefault",
                psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) == Some("RuntimeDefault"),
            ),
            ("no sysctls", psc.sysctls.is_none()),
            ("one container", p.containers.len() == 1),
            ("no init containers", p.init_containers.is_none()),
            ("no ephemeral containers", p.ephemeral_containers.is_none()),
            ("container runAsNonRoot", sc.run_as_non_root == Some(true)),
            ("container runAsUser", sc.run_as_user == Some(SANDBOX_UID)),
            ("container runAsGroup", sc.run_as_group == Some(SANDBOX_UID)),
            (
                "allowPrivilegeEscalation false",
                sc.allow_privilege_escalation == Some(false),
            ),
            ("privileged false", sc.privileged == Some(false)),
            (
                "readOnlyRootFilesystem",
                sc.read_only_root_filesystem == Some(true),
            ),
            (
                "capabilities drop ALL, add none",
                sc.capabilities.as_ref().is_some_and(|caps| {
                    caps.drop.as_deref() == Some(&["ALL".to_owned()][..]) && caps.add.is_none()
                }),
            ),
            (
                "container seccomp RuntimeDefault",
                sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) == Some("RuntimeDefault"),
            ),
            ("no procMount", sc.proc_mount.is_none()),
            (
                "command is the guest agent",
                c.command.as_deref() == Some(&AGENT_COMMAND.map(str::to_owned)[..]),
            ),
            ("no args", c.args.is_none()),
            ("no env", c.env.is_none() && c.env_from.is_none()),
            ("no ports", c.ports.is_none()),
            ("workingDir", c.working_dir.as_deref() == Some(WORKSPACE)),
            ("dnsPolicy None", p.dns_policy.as_deref() == Some("None")),
        ];
        for (name, ok) in checks {
            assert!(ok, "{what}: {name}");
        }
    }
}

#[test]
fn the_workspace_and_tmp_share_one_size_capped_scratch_volume() {
    let (_, r) = &every_tier_and_boundary()[0];
    let volumes = pod(r).volumes.as_ref().expect("volumes");
    assert_eq!(volumes.len(), 1, "only the scratch volume");
    let scratch = &volumes[0];
    let empty_dir = scratch.empty_dir.as_ref().expect("an emptyDir");
    assert_eq!(empty_dir.medium, None, "on the node's disk, not in memory");
    assert_eq!(
        empty_dir.size_limit.as_ref().map(|q| q.0.as_str()),
        Some("64Mi")
    );
    assert!(scratch.host_path.is_none() && scratch.projected.is_none() && scratch.secret.is_none());
    let mounts: Vec<(&str, Option<&str>, &str)> = container(r)
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            (
                m.mount_path.as_str(),
                m.sub_path.as_deref(),
                m.name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (WORKSPACE, Some("workspace"), scratch.name.as_str()),
            ("/tmp", Some("tmp"), scratch.name.as_str())
        ]
    );
}

#[test]
fn resources_come_from_the_caps_limits() {
    let mut caps = Caps::new();
    caps.limits.memory = ByteSize::gib(1);
    caps.limits.cpus = 0.5;
    caps.limits.disk = ByteSize::mib(256);
    let r = render(&RenderInput::new("sized", IMAGE, Boundary::KataFc, caps)).expect("render");
    let resources = container(&r).resources.as_ref().expect("resources");
    let want = BTreeMap::from([
        ("cpu".to_owned(), "500m".to_owned()),
        ("memory".to_owned(), "1Gi".to_owned()),
    ]);
    let as_strings =
        |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect::<BTreeMap<_, _>>()
        };
    assert_eq!(as_strings(&resources.limits), want, "limits");
    assert_eq!(
        as_strings(&resources.requests),
        want,
        "requests equal limits: a Guaranteed pod"
    );
    let size = pod(&r)
        .volumes
        .as_ref()
        .and_then(|v| v[0].empty_dir.as_ref())
        .and_then(|e| e.size_limit.clone());
    assert_eq!(size.map(|q| q.0), Some("256Mi".to_owned()));
}

#[test]
fn odd_limits_become_exact_quantities() {
    for (cpus, memory, want_cpu, want_memory) in [
        (0.0001, 1000, "1m", "1000"),
        (1.2345, 3 * 1024, "1235m", "3Ki"),
        (2.0, 5 << 40, "2000m", "5Ti"),
    ] {
        let mut caps = Caps::new();
        caps.limits.cpus = cpus;
        caps.limits.memory = ByteSize(memory);
        let r = render(&RenderInput::new("odd", IMAGE, Boundary::KataQemu, caps)).expect("render");
        let limits = container(&r)
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits["cpu"].0, want_cpu, "cpus {cpus}");
        assert_eq!(limits["memory"].0, want_memory, "memory {memory}");
    }
}

#[test]
fn per_run_caps_never_reach_the_objects_as_env_or_volumes() {
    let mut caps = Caps::new()
        .read_write("/home/agent/project-secret-name")
        .read_only("/etc/ssl");
    caps.env
        .insert("API_TOKEN".into(), "tok-canary-6f1d".into());
    caps.net = Net::Allow(vec!["api.example.com:443".parse().expect("rule")]);
    let r = render(
        &RenderInput::new("medium", IMAGE, Boundary::Gvisor, caps).with_egress_proxy(proxy()),
    )
    .expect("render");
    let yaml = to_yaml(&r).expect("yaml");
    for canary in [
        "API_TOKEN",
        "tok-canary-6f1d",
        "project-secret-name",
        "/etc/ssl",
        "api.example.com",
    ] {
        assert!(
            !yaml.contains(canary),
            "{canary} leaked into the objects:\n{yaml}"
        );
    }
    assert!(
        r.claim.metadata.annotations.is_none(),
        "nothing per-run on the claim"
    );
}

#[test]
fn ingress_is_always_denied() {
    for (input, r) in every_tier_and_boundary() {
        assert!(
            r.template.spec.network_policy.ingress.is_empty(),
            "{}",
            input.name
        );
    }
}

#[test]
fn tier_without_network_has_no_egress_at_all() {
    let r = render(&RenderInput::for_tier(
        &Tier::low(),
        IMAGE,
        Boundary::Gvisor,
    ))
    .expect("render");
    assert!(r.template.spec.network_policy.egress.is_empty());
    assert_eq!(
        EgressProxy::of_policy(&r.template.spec.network_policy.egress),
        None
    );
    // An empty list is written out: the controller applies upstream's default (public
    // internet) only when the whole `networkPolicy` is absent.
    let json = serde_json::to_value(&r.template).expect("json");
    assert_eq!(
        json["spec"]["networkPolicy"],
        serde_json::json!({ "ingress": [], "egress": [] })
    );
    assert_eq!(json["spec"]["networkPolicyManagement"], "Managed");
}

#[test]
fn allowlist_egress_goes_only_to_the_proxy_and_never_to_dns() {
    let cases = [
        (
            "10.20.0.7:3128",
            serde_json::json!([{ "ipBlock": { "cidr": "10.20.0.7/32" } }]),
            3128,
        ),
        (
            "[fd00::7]:8080",
            serde_json::json!([{ "ipBlock": { "cidr": "fd00::7/128" } }]),
            8080,
        ),
        (
            "pods:strata-system/app=strata-egress:3128",
            serde_json::json!([{
                "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "strata-system" } },
                "podSelector": { "matchLabels": { "app": "strata-egress" } },
            }]),
            3128,
        ),
    ];
    for (text, to, port) in cases {
        let proxy: EgressProxy = text.parse().expect(text);
        for tier in [Tier::medium("/home/agent"), Tier::high()] {
            let r = render(
                &RenderInput::for_tier(&tier, IMAGE, Boundary::Gvisor)
                    .with_egress_proxy(proxy.clone()),
            )
            .expect("render");
            let egress = &r.template.spec.network_policy.egress;
            assert_eq!(egress.len(), 1, "{text}: one rule");
            assert_eq!(
                EgressProxy::of_policy(egress),
                Some(proxy.clone()),
                "{text}: the cluster backend reads the proxy back from the template"
            );
            let json = serde_json::to_value(&egress[0]).expect("json");
            assert_eq!(json["to"], to, "{text}");
            assert_eq!(
                json["ports"],
                serde_json::json!([{ "protocol": "TCP", "port": port }]),
                "{text}"
            );
            for rule in egress {
                for p in rule.ports.iter().flatten() {
                    assert_ne!(p.port, Some(IntOrString::Int(53)), "no DNS egress");
                }
            }
        }
    }
}

#[test]
fn host_network_is_refused() {
    let mut caps = Caps::new();
    caps.net = Net::Host;
    let err =
        render(&RenderInput::new("high", IMAGE, Boundary::Gvisor, caps).with_egress_proxy(proxy()))
            .expect_err("host network");
    assert!(matches!(err, RenderError::HostNetwork), "{err}");
}

#[test]
fn allowlist_without_a_proxy_is_refused() {
    let err = render(&RenderInput::for_tier(
        &Tier::high(),
        IMAGE,
        Boundary::Gvisor,
    ))
    .expect_err("no proxy");
    assert!(matches!(err, RenderError::NoEgressProxy), "{err}");
}

#[test]
fn gke_placement_is_refused_for_kata() {
    let input = RenderInput::for_tier(&Tier::low(), IMAGE, Boundary::KataQemu)
        .with_placement(Placement::GkeSandbox);
    let err = render(&input).expect_err("GKE Sandbox is gVisor");
    assert!(matches!(err, RenderError::Placement { .. }), "{err}");
}

#[test]
fn placement_defaults_follow_the_boundary() {
    let gvisor = render(&RenderInput::for_tier(
        &Tier::low(),
        IMAGE,
        Boundary::Gvisor,
    ))
    .expect("render");
    let p = pod(&gvisor);
    assert_eq!(
        p.node_selector,
        Some(BTreeMap::from([(
            "sandbox.gke.io/runtime".to_owned(),
            "gvisor".to_owned()
        )]))
    );
    assert_eq!(p.tolerations.as_ref().map(Vec::len), Some(1));
    let plain = render(
        &RenderInput::for_tier(&Tier::low(), IMAGE, Boundary::Gvisor)
            .with_placement(Placement::RuntimeClassOnly),
    )
    .expect("render");
    assert!(pod(&plain).node_selector.is_none() && pod(&plain).tolerations.is_none());
    for boundary in [Boundary::KataQemu, Boundary::KataFc] {
        let r = render(&RenderInput::for_tier(&Tier::low(), IMAGE, boundary)).expect("render");
        assert!(
            pod(&r).node_selector.is_none() && pod(&r).tolerations.is_none(),
            "{boundary}"
        );
    }
}

#[test]
fn bad_inputs_are_refused() {
    let base = || RenderInput::for_tier(&Tier::low(), IMAGE, Boundary::Gvisor);
    let cases: Vec<(&str, RenderInput)> = vec![
        (
            "upper case name",
            RenderInput {
                name: "Low".into(),
                ..base()
            },
        ),
        (
            "name with a dot",
            RenderInput {
                name: "low.tier".into(),
                ..base()
            },
        ),
        (
            "empty name",
            RenderInput {
                name: String::new(),
                ..base()
            },
        ),
        (
            "name too long",
            RenderInput {
                name: "a".repeat(41),
                ..base()
            },
        ),
        (
            "name ending in a dash",
            RenderInput {
                name: "low-".into(),
                ..base()
            },
        ),
        ("bad namespace", base().with_namespace("Team_A")),
        ("bad claim name", base().with_claim_name("run/1")),
        (
            "empty image",
            RenderInput {
                image: String::new(),
                ..base()
            },
        ),
        (
            "image with a space",
            RenderInput {
                image: "a b".into(),
                ..base()
            },
        ),
        ("warm pool past int32", base().with_warm_pool(u32::MAX)),
    ];
    for (what, input) in cases {
        assert!(render(&input).is_err(), "{what} was accepted");
    }
    for (what, set) in [
        ("zero cpus", (0.0, 1, 1)),
        ("NaN cpus", (f64::NAN, 1, 1)),
        ("negative cpus", (-1.0, 1, 1)),
        ("zero memory", (1.0, 0, 1)),
        ("zero disk", (1.0, 1, 0)),
    ] {
        let mut input = base();
        input.caps.limits.cpus = set.0;
        input.caps.limits.memory = ByteSize(set.1 << 20);
        input.caps.limits.disk = ByteSize(set.2 << 20);
        let err = render(&input).expect_err(what);
        assert!(
            matches!(err, RenderError::InvalidLimit { .. }),
            "{what}: {err}"
        );
    }
}

#[test]
fn egress_proxy_addresses_parse_or_are_refused() {
    for good in [
        "192.0.2.1:3128",
        "[2001:db8::1]:1080",
        "pods:egress/app=proxy,tier=edge:3128",
    ] {
        good.parse::<EgressProxy>()
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in [
        "proxy.example.com:3128",      // a name: policies take addresses
        "192.0.2.1",                   // no port
        "192.0.2.1:0",                 // port 0
        "0.0.0.0:3128",                // would allow every host
        "pods:egress/:3128",           // no label
        "pods:egress/app=proxy",       // no port
        "pods:Egress/app=proxy:3128",  // bad namespace
        "pods:egress/app=pro xy:3128", // bad label value
    ] {
        assert!(bad.parse::<EgressProxy>().is_err(), "{bad} was accepted");
    }
}

#[test]
fn names_labels_and_references_tie_the_objects_together() {
    let input = RenderInput::for_tier(&Tier::medium("/home/agent"), IMAGE, Boundary::KataQemu)
        .with_egress_proxy(proxy())
        .with_namespace("agents")
        .with_warm_pool(4);
    let r = render(&input).expect("render");
    assert_eq!(r.template.metadata.name.as_deref(), Some("strata-medium"));
    assert_eq!(r.warm_pool.metadata.name.as_deref(), Some("strata-medium"));
    assert_eq!(r.warm_pool.spec.sandbox_template_ref.name, "strata-medium");
    assert_eq!(r.warm_pool.spec.replicas, 4);
    assert_eq!(r.claim.spec.warm_pool_ref.name, "strata-medium");
    assert_eq!(
        r.claim.metadata.generate_name.as_deref(),
        Some("strata-medium-")
    );
    assert_eq!(r.claim.metadata.name, None);
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), "strata".to_owned()),
        (TIER_LABEL.to_owned(), "medium".to_owned()),
        (BOUNDARY_LABEL.to_owned(), "kata-qemu".to_owned()),
    ]);
    for meta in [
        &r.template.metadata,
        &r.warm_pool.metadata,
        &r.claim.metadata,
        &r.sandbox.metadata,
    ] {
        assert_eq!(meta.labels.as_ref(), Some(&labels));
        assert_eq!(meta.namespace.as_deref(), Some("agents"));
    }
    assert_eq!(
        r.template.spec.pod_template.metadata.labels, labels,
        "pod labels"
    );
    let named = render(&input.clone().with_claim_name("run-42")).expect("render");
    assert_eq!(named.claim.metadata.name.as_deref(), Some("run-42"));
    assert_eq!(named.claim.metadata.generate_name, None);
}

#[test]
fn kinds_and_api_versions_are_upstreams() {
    let (_, r) = &every_tier_and_boundary()[0];
    let objects = r.to_json().expect("json");
    let got: Vec<(Kind, String, String)> = objects
        .iter()
        .map(|(k, v)| {
            (
                *k,
                v["apiVersion"].as_str().unwrap_or_default().to_owned(),
                v["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                Kind::SandboxTemplate,
                "extensions.agents.x-k8s.io/v1beta1".to_owned(),
                "SandboxTemplate".to_owned()
            ),
            (
                Kind::SandboxWarmPool,
                "extensions.agents.x-k8s.io/v1beta1".to_owned(),
                "SandboxWarmPool".to_owned()
            ),
            (
                Kind::SandboxClaim,
                "extensions.agents.x-k8s.io/v1beta1".to_owned(),
                "SandboxClaim".to_owned()
            ),
            (
                Kind::Sandbox,
                "agents.x-k8s.io/v1beta1".to_owned(),
                "Sandbox".to_owned()
            ),
        ]
    );
}

#[test]
fn yaml_stream_round_trips_to_the_same_objects() {
    use serde::Deserialize;
    for (input, r) in every_tier_and_boundary() {
        let yaml = to_yaml(&r).expect("yaml");
        let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&yaml)
            .map(|d| serde_json::Value::deserialize(d).expect("a YAML document"))
            .collect();
        let want: Vec<serde_json::Value> = r
            .to_json()
            .expect("json")
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        assert_eq!(docs, want, "{} on {}", input.name, input.boundary);
        // And back into the typed structs.
        let template: sandbox_kube::SandboxTemplate =
            serde_json::from_value(docs[0].clone()).expect("template");
        assert_eq!(template, r.template);
    }
}

#[test]
fn render_is_deterministic() {
    let input =
        RenderInput::for_tier(&Tier::high(), IMAGE, Boundary::KataFc).with_egress_proxy(proxy());
    let a = to_yaml(&render(&input).expect("render")).expect("yaml");
    let b = to_yaml(&render(&input).expect("render")).expect("yaml");
    assert_eq!(a, b);
}

#[test]
fn boundaries_parse_from_their_runtime_class() {
    for b in Boundary::ALL {
        assert_eq!(b.to_string().parse::<Boundary>().expect("parse"), b);
    }
    assert!("runc".parse::<Boundary>().is_err());
}
