//! Every rendered `Sandbox` against the CEL validations of upstream's
//! `secure-sandbox-policy` (a ValidatingAdmissionPolicy), and the attacks each rule stops.

mod common;

use sandbox_kube::check::Denial;
use sandbox_kube::{render, Boundary, Kind, Placement, RenderInput};
use sandbox_policy::Tier;
use serde_json::{json, Value};

const IMAGE: &str = "registry.example/strata/tools:1";

fn input(tier: &Tier, boundary: Boundary) -> RenderInput {
    RenderInput::for_tier(tier, IMAGE, boundary)
        .with_egress_proxy("10.20.0.7:3128".parse().expect("proxy"))
}

fn tiers() -> Vec<Tier> {
    Tier::PRESETS
        .iter()
        .map(|name| Tier::preset(name, "/home/agent".as_ref()).expect("preset"))
        .collect()
}

fn sandbox(input: &RenderInput) -> Value {
    serde_json::to_value(render(input).expect("render").sandbox).expect("json")
}

fn admit(object: &Value) -> Result<(), Vec<Denial>> {
    common::pinned().policy().admit(Kind::Sandbox, object)
}

/// The 1-based rule numbers (as the policy's comments number them) that deny `object`.
fn denied_rules(object: &Value) -> Vec<usize> {
    match admit(object) {
        Ok(()) => Vec::new(),
        Err(denials) => denials.iter().map(|d| d.rule + 1).collect(),
    }
}

#[test]
fn the_pinned_policy_is_the_one_these_tests_know() {
    let policy = common::pinned().policy();
    assert_eq!(policy.name(), "secure-sandbox-policy");
    assert_eq!(policy.validations().len(), 16);
    assert!(policy.matches(Kind::Sandbox, "CREATE"));
    assert!(policy.matches(Kind::Sandbox, "UPDATE"));
    assert!(!policy.matches(Kind::Sandbox, "DELETE"));
    for kind in [
        Kind::SandboxTemplate,
        Kind::SandboxWarmPool,
        Kind::SandboxClaim,
    ] {
        assert!(!policy.matches(kind, "CREATE"), "{kind}");
    }
}

#[test]
fn the_policy_uses_only_what_the_cel_crate_evaluates() {
    // `has`, `all` and `exists` are macros (expanded at parse time: a field test and
    // comprehensions, the latter using @not_strictly_false); the rest are operators and the
    // `size` function. No custom function was needed.
    let known = [
        "!_",
        "@in",
        "@not_strictly_false",
        "_&&_",
        "_==_",
        "_?_:_",
        "_[_]",
        "_||_",
        "_+_",
        "size",
    ];
    let mut used: Vec<String> = common::pinned()
        .policy()
        .validations()
        .iter()
        .flat_map(|v| v.functions())
        .collect();
    used.sort();
    used.dedup();
    for f in &used {
        assert!(
            known.contains(&f.as_str()),
            "the policy uses {f}, which these tests have not seen evaluated"
        );
    }
}

#[test]
fn every_gvisor_sandbox_passes_every_rule() {
    for tier in tiers() {
        let object = sandbox(&input(&tier, Boundary::Gvisor));
        assert_eq!(admit(&object), Ok(()), "tier {}", tier.name);
    }
}

#[test]
fn kata_sandboxes_fail_only_the_gvisor_only_rules() {
    // Upstream's policy admits gVisor on GKE Sandbox nodes only (rules 1, 15, 16). Every
    // other rule (the hardening) holds for Kata too; a Kata cluster needs the policy with
    // those three rules changed.
    for tier in tiers() {
        for boundary in [Boundary::KataQemu, Boundary::KataFc] {
            let object = sandbox(&input(&tier, boundary));
            let denials = admit(&object).expect_err("kata is denied");
            let got: Vec<(usize, &str)> = denials
                .iter()
                .map(|d| (d.rule + 1, d.message.split(':').next().unwrap_or_default()))
                .collect();
            assert_eq!(
                got,
                [
                    (1, "Security Violation"),
                    (15, "Scheduling Violation"),
                    (16, "Scheduling Violation")
                ],
                "{} on {boundary}",
                tier.name
            );
            assert!(denials.iter().all(|d| d.error.is_none()), "{denials:#?}");
            assert!(denials[0].message.contains("runtimeClassName: gvisor"));
        }
    }
}

#[test]
fn gvisor_without_gke_placement_fails_only_the_scheduling_rules() {
    let object =
        sandbox(&input(&Tier::low(), Boundary::Gvisor).with_placement(Placement::RuntimeClassOnly));
    assert_eq!(denied_rules(&object), [15, 16]);
}

/// A hardened gVisor sandbox, changed by `attack`, must be denied by exactly `rule` (1-based),
/// with that rule's message.
fn assert_attack_denied(attack: impl FnOnce(&mut Value), rule: usize, message_part: &str) {
    let mut object = sandbox(&input(&Tier::high(), Boundary::Gvisor));
    let pod = &mut object["spec"]["podTemplate"]["spec"];
    attack(pod);
    let denials = admit(&object).expect_err("the attack must be denied");
    let rules: Vec<usize> = denials.iter().map(|d| d.rule + 1).collect();
    assert_eq!(rules, [rule], "{denials:#?}");
    assert!(
        denials[0].error.is_none(),
        "denied by the rule, not an evaluation error: {denials:#?}"
    );
    assert!(
        denials[0].message.contains(message_part),
        "{}",
        denials[0].message
    );
}

fn first_container(pod: &mut Value) -> &mut Value {
    &mut pod["containers"][0]
}

#[test]
fn runc_runtime_class_is_denied() {
    assert_attack_denied(
        |pod| pod["runtimeClassName"] = json!("runc"),
        1,
        "runtimeClassName: gvisor",
    );
}

#[test]
fn missing_runtime_class_is_denied() {
    assert_attack_denied(
        |pod| {
            pod.as_object_mut().expect("pod").remove("runtimeClassName");
        },
        1,
        "runtimeClassName: gvisor",
    );
}

#[test]
fn host_network_is_denied() {
    assert_attack_denied(
        |pod| pod["hostNetwork"] = json!(true),
        2,
        "hostNetwork: true",
    );
}

#[test]
fn service_account_token_automount_is_denied() {
    assert_attack_denied(
        |pod| pod["automountServiceAccountToken"] = json!(true),
        3,
        "automountServiceAccountToken",
    );
}

#[test]
fn unset_service_account_token_automount_is_denied() {
    // Kubernetes mounts the token by default: the policy wants an explicit false.
    assert_attack_denied(
        |pod| {
            pod.as_object_mut()
                .expect("pod")
                .remove("automountServiceAccountToken");
        },
        3,
        "explicitly set to 'false'",
    );
}

#[test]
fn privileged_container_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["securityContext"]["privileged"] = json!(true),
        4,
        "Privileged",
    );
}

#[test]
fn privileged_init_container_is_denied() {
    // Through the policy's `allContainers` variable.
    assert_attack_denied(
        |pod| {
            let mut init = pod["containers"][0].clone();
            init["name"] = json!("setup");
            init["securityContext"]["privileged"] = json!(true);
            pod["initContainers"] = json!([init]);
        },
        4,
        "initContainers",
    );
}

#[test]
fn privileged_ephemeral_container_is_denied() {
    assert_attack_denied(
        |pod| {
            let mut debug = pod["containers"][0].clone();
            debug["name"] = json!("debugger");
            debug["securityContext"]["privileged"] = json!(true);
            pod["ephemeralContainers"] = json!([debug]);
        },
        4,
        "ephemeralContainers",
    );
}

#[test]
fn keeping_capabilities_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["securityContext"]["capabilities"]["drop"] = json!(["NET_RAW"]),
        5,
        "drop 'ALL'",
    );
}

#[test]
fn adding_a_capability_back_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["securityContext"]["capabilities"]["add"] = json!(["SYS_ADMIN"]),
        10,
        "Capabilities.add must be empty",
    );
}

#[test]
fn unlimited_memory_is_denied() {
    assert_attack_denied(
        |pod| {
            first_container(pod)["resources"]["limits"]
                .as_object_mut()
                .expect("limits")
                .remove("memory");
        },
        6,
        "resource limits",
    );
}

#[test]
fn unlimited_cpu_is_denied() {
    assert_attack_denied(
        |pod| {
            first_container(pod)["resources"]
                .as_object_mut()
                .expect("resources")
                .remove("limits");
        },
        6,
        "resource limits",
    );
}

#[test]
fn container_running_as_root_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["securityContext"]["runAsNonRoot"] = json!(false),
        7,
        "runAsNonRoot: true",
    );
}

#[test]
fn pod_running_as_root_is_denied() {
    assert_attack_denied(
        |pod| {
            first_container(pod)["securityContext"]
                .as_object_mut()
                .expect("sc")
                .remove("runAsNonRoot");
            pod["securityContext"]["runAsNonRoot"] = json!(false);
        },
        7,
        "runAsNonRoot: true",
    );
}

#[test]
fn projected_service_account_token_is_denied() {
    assert_attack_denied(
        |pod| {
            pod["volumes"].as_array_mut().expect("volumes").push(json!({
                "name": "token",
                "projected": { "sources": [ { "serviceAccountToken": { "path": "token" } } ] }
            }));
        },
        8,
        "Projected Service Account Tokens",
    );
}

#[test]
fn host_path_volume_is_denied() {
    assert_attack_denied(
        |pod| {
            pod["volumes"]
                .as_array_mut()
                .expect("volumes")
                .push(json!({ "name": "root", "hostPath": { "path": "/" } }));
        },
        9,
        "HostPath",
    );
}

#[test]
fn host_pid_is_denied() {
    assert_attack_denied(|pod| pod["hostPID"] = json!(true), 11, "hostPID");
}

#[test]
fn host_ipc_is_denied() {
    assert_attack_denied(|pod| pod["hostIPC"] = json!(true), 11, "hostIPC");
}

#[test]
fn host_port_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["ports"] = json!([{ "containerPort": 8080, "hostPort": 8080 }]),
        12,
        "hostPort",
    );
}

#[test]
fn sysctls_are_denied() {
    assert_attack_denied(
        |pod| {
            pod["securityContext"]["sysctls"] =
                json!([{ "name": "net.ipv4.ip_forward", "value": "1" }])
        },
        13,
        "sysctls",
    );
}

#[test]
fn unmasked_proc_is_denied() {
    assert_attack_denied(
        |pod| first_container(pod)["securityContext"]["procMount"] = json!("Unmasked"),
        14,
        "procMount",
    );
}

#[test]
fn leaving_the_gvisor_nodes_is_denied() {
    assert_attack_denied(
        |pod| {
            pod.as_object_mut().expect("pod").remove("nodeSelector");
        },
        15,
        "nodeSelector",
    );
    assert_attack_denied(
        |pod| pod["tolerations"][0]["effect"] = json!("NoExecute"),
        16,
        "tolerate the gVisor taint",
    );
}

#[test]
fn the_policy_fails_closed_when_an_expression_cannot_be_evaluated() {
    // No `containers`: the `allContainers` variable cannot be computed, so every rule using
    // it is an error, and under `failurePolicy: Fail` an error denies.
    let mut object = sandbox(&input(&Tier::low(), Boundary::Gvisor));
    object["spec"]["podTemplate"]["spec"]
        .as_object_mut()
        .expect("pod")
        .remove("containers");
    let denials = admit(&object).expect_err("denied");
    let errored: Vec<usize> = denials
        .iter()
        .filter(|d| d.error.is_some())
        .map(|d| d.rule + 1)
        .collect();
    assert_eq!(errored, [4, 5, 6, 7, 10, 12, 14], "{denials:#?}");
    assert!(
        denials.iter().all(|d| d.error.is_some()),
        "nothing else fails"
    );
}

#[test]
fn pinned_check_reports_admission_denials_with_their_rule() {
    let pinned = common::pinned();
    let mut object = sandbox(&input(&Tier::low(), Boundary::Gvisor));
    object["spec"]["podTemplate"]["spec"]["hostNetwork"] = json!(true);
    let violations = pinned.check_object(Kind::Sandbox, &object);
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert!(
        violations[0].to_string().contains("admission rule 2"),
        "{}",
        violations[0]
    );
    // The other kinds are not matched by the policy.
    let rendered = render(&input(&Tier::low(), Boundary::KataFc)).expect("render");
    let kinds: Vec<Kind> = pinned
        .check(&rendered)
        .expect("check")
        .iter()
        .map(|v| v.kind)
        .collect();
    assert_eq!(kinds, [Kind::Sandbox; 3]);
}
