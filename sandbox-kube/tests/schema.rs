//! Every rendered object against its CRD's v1beta1 `openAPIV3Schema`, as pinned from
//! upstream, and broken objects the schema must refuse.

mod common;

use sandbox_kube::check::{Check, Violation};
use sandbox_kube::{render, to_yaml, Boundary, EgressProxy, Kind, Placement, RenderInput};
use sandbox_policy::Tier;
use serde::Deserialize;
use serde_json::{json, Value};

const IMAGE: &str = "registry.example/strata/tools:1";

fn proxies() -> Vec<EgressProxy> {
    [
        "10.20.0.7:3128",
        "[fd00::7]:3128",
        "pods:strata-system/app=strata-egress:3128",
    ]
    .iter()
    .map(|s| s.parse().expect("proxy"))
    .collect()
}

fn inputs() -> Vec<RenderInput> {
    let mut out = Vec::new();
    for name in Tier::PRESETS {
        let tier = Tier::preset(name, "/home/agent".as_ref()).expect("preset");
        for boundary in Boundary::ALL {
            for proxy in proxies() {
                let input = RenderInput::for_tier(&tier, IMAGE, boundary).with_egress_proxy(proxy);
                out.push(
                    input
                        .clone()
                        .with_namespace("agents")
                        .with_claim_name("run-1"),
                );
                out.push(input.with_placement(Placement::RuntimeClassOnly));
            }
        }
    }
    out
}

fn schema_violations(kind: Kind, object: &Value) -> Vec<Violation> {
    common::pinned()
        .schema(kind)
        .expect("schema")
        .validate(object)
}

fn sandbox_template() -> Value {
    let input = RenderInput::for_tier(&Tier::medium("/home/agent"), IMAGE, Boundary::Gvisor)
        .with_egress_proxy(proxies().remove(0));
    serde_json::to_value(render(&input).expect("render").template).expect("json")
}

fn object(kind: Kind) -> Value {
    let input = RenderInput::for_tier(&Tier::medium("/home/agent"), IMAGE, Boundary::Gvisor)
        .with_egress_proxy(proxies().remove(0));
    let rendered = render(&input).expect("render");
    rendered
        .to_json()
        .expect("json")
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v)
        .expect("kind")
}

#[test]
fn every_rendered_object_validates_against_its_crd() {
    let mut checked = 0;
    for input in inputs() {
        let rendered = render(&input).expect("render");
        for (kind, object) in rendered.to_json().expect("json") {
            let violations = schema_violations(kind, &object);
            assert!(
                violations.is_empty(),
                "{kind} of {} on {}: {violations:#?}",
                input.name,
                input.boundary
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3 * 3 * 3 * 2 * 4);
}

#[test]
fn the_yaml_stream_of_every_tier_passes_schema_and_policy() {
    // What `strata kube render` prints, read back as a cluster would read it.
    let pinned = common::pinned();
    for name in Tier::PRESETS {
        let tier = Tier::preset(name, "/home/agent".as_ref()).expect("preset");
        let input = RenderInput::for_tier(&tier, IMAGE, Boundary::Gvisor)
            .with_egress_proxy(proxies().remove(0));
        let yaml = to_yaml(&render(&input).expect("render")).expect("yaml");
        let docs: Vec<Value> = serde_norway::Deserializer::from_str(&yaml)
            .map(|d| Value::deserialize(d).expect("YAML document"))
            .collect();
        assert_eq!(docs.len(), 4);
        for (kind, doc) in Kind::ALL.into_iter().zip(&docs) {
            let violations = pinned.check_object(kind, doc);
            assert!(violations.is_empty(), "{name} {kind}: {violations:#?}");
        }
    }
}

/// Asserts that `object` of `kind` fails the schema with a violation at `path`.
fn assert_rejected_at(kind: Kind, object: &Value, path: &str) {
    let violations = schema_violations(kind, object);
    assert!(
        violations.iter().any(|v| v.path == path),
        "expected a violation at {path}, got {violations:#?}"
    );
}

#[test]
fn unknown_field_in_the_pod_spec_is_rejected() {
    // A typo of a security field must not be silently pruned.
    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["spec"]["automountServiceAcountToken"] = json!(false);
    assert_rejected_at(Kind::SandboxTemplate, &t, "/spec/podTemplate/spec");
}

#[test]
fn unknown_field_in_a_security_context_is_rejected() {
    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFs"] =
        json!(true);
    assert_rejected_at(
        Kind::SandboxTemplate,
        &t,
        "/spec/podTemplate/spec/containers/0/securityContext",
    );
}

#[test]
fn the_v1alpha1_template_layout_is_rejected() {
    // v1alpha1 nested the pod under `sandboxSpec`; v1beta1 has `podTemplate` in `spec`.
    let mut t = sandbox_template();
    let pod = t["spec"]["podTemplate"].take();
    t["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("podTemplate");
    t["spec"]["sandboxSpec"] = json!({ "podTemplate": pod });
    let violations = schema_violations(Kind::SandboxTemplate, &t);
    assert!(
        violations.iter().any(|v| v.path == "/spec"),
        "{violations:#?}"
    );
    assert!(
        violations.iter().any(|v| v.message.contains("podTemplate")),
        "{violations:#?}"
    );
}

#[test]
fn pod_template_metadata_takes_only_labels_and_annotations() {
    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["metadata"]["name"] = json!("fixed-pod-name");
    assert_rejected_at(Kind::SandboxTemplate, &t, "/spec/podTemplate/metadata");
}

#[test]
fn wrong_types_are_rejected() {
    let mut pool = object(Kind::SandboxWarmPool);
    pool["spec"]["replicas"] = json!("three");
    assert_rejected_at(Kind::SandboxWarmPool, &pool, "/spec/replicas");

    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["spec"]["hostNetwork"] = json!("false");
    assert_rejected_at(
        Kind::SandboxTemplate,
        &t,
        "/spec/podTemplate/spec/hostNetwork",
    );

    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["spec"]["containers"][0]["command"] =
        json!("/strata/strata-guest-agent serve");
    assert_rejected_at(
        Kind::SandboxTemplate,
        &t,
        "/spec/podTemplate/spec/containers/0/command",
    );
}

#[test]
fn integer_formats_and_minimums_are_enforced() {
    for (replicas, ok) in [
        (json!(0), true),
        (json!(-1), false),
        (json!(2_147_483_647_i64), true),
        (json!(2_147_483_648_i64), false),
        (json!(1.5), false),
    ] {
        let mut pool = object(Kind::SandboxWarmPool);
        pool["spec"]["replicas"] = replicas.clone();
        assert_eq!(
            schema_violations(Kind::SandboxWarmPool, &pool).is_empty(),
            ok,
            "replicas {replicas}"
        );
    }
    let mut t = sandbox_template();
    t["spec"]["podTemplate"]["spec"]["securityContext"]["runAsUser"] =
        json!(9_223_372_036_854_775_807_i64);
    assert!(
        schema_violations(Kind::SandboxTemplate, &t).is_empty(),
        "int64 max is an int64"
    );
}

#[test]
fn int_or_string_takes_both_and_nothing_else() {
    let path = "/spec/networkPolicy/egress/0/ports/0/port";
    for (port, ok) in [
        (json!(3128), true),
        (json!("proxy"), true),
        (json!(true), false),
        (json!([3128]), false),
    ] {
        let mut t = sandbox_template();
        t["spec"]["networkPolicy"]["egress"][0]["ports"][0]["port"] = port.clone();
        let violations = schema_violations(Kind::SandboxTemplate, &t);
        assert_eq!(violations.is_empty(), ok, "port {port}: {violations:#?}");
        if !ok {
            assert!(violations.iter().any(|v| v.path == path), "{violations:#?}");
        }
    }
}

#[test]
fn quantities_must_be_quantities() {
    for (memory, ok) in [
        (json!("512Mi"), true),
        (json!(536870912), true),
        (json!("1.5Gi"), true),
        (json!("lots"), false),
        (json!("512 Mi"), false),
    ] {
        let mut t = sandbox_template();
        t["spec"]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
            memory.clone();
        assert_eq!(
            schema_violations(Kind::SandboxTemplate, &t).is_empty(),
            ok,
            "memory {memory}"
        );
    }
}

#[test]
fn missing_required_fields_are_rejected() {
    let mut claim = object(Kind::SandboxClaim);
    claim["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("warmPoolRef");
    assert_rejected_at(Kind::SandboxClaim, &claim, "/spec");

    let mut pool = object(Kind::SandboxWarmPool);
    pool["spec"]["sandboxTemplateRef"]
        .as_object_mut()
        .expect("ref")
        .remove("name");
    assert_rejected_at(Kind::SandboxWarmPool, &pool, "/spec/sandboxTemplateRef");

    let mut sandbox = object(Kind::Sandbox);
    sandbox["spec"]["podTemplate"]["spec"]["containers"][0]
        .as_object_mut()
        .expect("container")
        .remove("name");
    assert_rejected_at(
        Kind::Sandbox,
        &sandbox,
        "/spec/podTemplate/spec/containers/0",
    );
}

#[test]
fn enums_are_enforced() {
    let mut claim = object(Kind::SandboxClaim);
    claim["spec"]["lifecycle"]["shutdownPolicy"] = json!("Never");
    assert_rejected_at(Kind::SandboxClaim, &claim, "/spec/lifecycle/shutdownPolicy");

    let mut t = sandbox_template();
    t["spec"]["envVarsInjectionPolicy"] = json!("Always");
    assert_rejected_at(Kind::SandboxTemplate, &t, "/spec/envVarsInjectionPolicy");

    let mut pool = object(Kind::SandboxWarmPool);
    pool["spec"]["updateStrategy"]["type"] = json!("RollingUpdate");
    assert_rejected_at(Kind::SandboxWarmPool, &pool, "/spec/updateStrategy/type");
}

#[test]
fn duplicate_list_map_keys_are_rejected() {
    // volumeMounts is a list-map keyed by mountPath: two mounts at /tmp are one too many.
    let mut t = sandbox_template();
    let mounts = &mut t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"];
    let first = mounts[1].clone();
    mounts.as_array_mut().expect("mounts").push(first);
    let violations = schema_violations(Kind::SandboxTemplate, &t);
    assert!(
        violations.iter().any(
            |v| v.path == "/spec/podTemplate/spec/containers/0/volumeMounts"
                && v.message.contains("duplicate")
        ),
        "{violations:#?}"
    );
}

#[test]
fn metadata_is_checked_as_the_api_server_checks_it() {
    type Mutation = fn(&mut Value);
    let cases: Vec<(&str, Mutation, bool)> = vec![
        (
            "name with upper case",
            |o: &mut Value| o["metadata"]["name"] = json!("Strata-Low"),
            false,
        ),
        (
            "name with underscore",
            |o: &mut Value| o["metadata"]["name"] = json!("strata_low"),
            false,
        ),
        (
            "dotted name",
            |o: &mut Value| o["metadata"]["name"] = json!("strata.low"),
            true,
        ),
        (
            "no name",
            |o: &mut Value| {
                o["metadata"].as_object_mut().expect("meta").remove("name");
            },
            false,
        ),
        (
            "bad namespace",
            |o: &mut Value| o["metadata"]["namespace"] = json!("team.a"),
            false,
        ),
        (
            "label value with a space",
            |o: &mut Value| o["metadata"]["labels"]["strata.dev/tier"] = json!("very low"),
            false,
        ),
        (
            "label value of 64",
            |o: &mut Value| o["metadata"]["labels"]["strata.dev/tier"] = json!("a".repeat(64)),
            false,
        ),
        (
            "label key with two slashes",
            |o: &mut Value| o["metadata"]["labels"]["a/b/c"] = json!("x"),
            false,
        ),
        (
            "empty label value",
            |o: &mut Value| o["metadata"]["labels"]["strata.dev/x"] = json!(""),
            true,
        ),
        (
            "bad pod label",
            |o: &mut Value| o["spec"]["podTemplate"]["metadata"]["labels"]["x"] = json!("-x-"),
            false,
        ),
    ];
    for (what, mutate, ok) in cases {
        let mut t = sandbox_template();
        mutate(&mut t);
        let violations = schema_violations(Kind::SandboxTemplate, &t);
        assert_eq!(violations.is_empty(), ok, "{what}: {violations:#?}");
    }
}

#[test]
fn kind_and_api_version_must_be_the_crds() {
    let mut t = sandbox_template();
    t["kind"] = json!("Sandbox");
    assert_rejected_at(Kind::SandboxTemplate, &t, "/kind");
    let mut t = sandbox_template();
    t["apiVersion"] = json!("extensions.agents.x-k8s.io/v1alpha1");
    assert_rejected_at(Kind::SandboxTemplate, &t, "/apiVersion");
}

#[test]
fn the_translated_schemas_keep_no_kubernetes_extension() {
    fn walk(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, sub) in m {
                    if k.starts_with("x-kubernetes-")
                        || (k == "format" && matches!(sub.as_str(), Some("int32" | "int64")))
                        || k == "nullable"
                    {
                        found.push(format!("{path}/{k}"));
                    }
                    walk(sub, &format!("{path}/{k}"), found);
                }
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .for_each(|(i, sub)| walk(sub, &format!("{path}/{i}"), found)),
            _ => {}
        }
    }
    for kind in Kind::ALL {
        let schema = common::pinned().schema(kind).expect("schema");
        let mut found = Vec::new();
        walk(schema.json_schema(), "", &mut found);
        assert!(found.is_empty(), "{kind}: {found:?}");
        // ...and the structural schema did have them (the translation did something).
        let text = schema.structural().to_string();
        assert!(
            kind == Kind::SandboxWarmPool || text.contains("x-kubernetes-"),
            "{kind}"
        );
    }
}

#[test]
fn crd_cel_rules_are_accounted_for() {
    // The pinned CRDs carry one x-kubernetes-validations rule: Sandbox's "volumeClaimTemplates
    // is immutable", which uses oldSelf and so applies to updates only. A new create-time
    // rule upstream shows up here, and is then evaluated by `CrdSchema::validate`.
    let pinned = common::pinned();
    let counts: Vec<(Kind, usize, usize)> = Kind::ALL
        .iter()
        .map(|k| {
            let s = pinned.schema(*k).expect("schema");
            (*k, s.create_rules(), s.transition_rules())
        })
        .collect();
    assert_eq!(
        counts,
        [
            (Kind::SandboxTemplate, 0, 0),
            (Kind::SandboxWarmPool, 0, 0),
            (Kind::SandboxClaim, 0, 0),
            (Kind::Sandbox, 0, 1),
        ]
    );
    assert!(Violation {
        kind: Kind::Sandbox,
        check: Check::CrdRule,
        path: String::new(),
        message: String::new()
    }
    .to_string()
    .contains("CRD rule"));
}
