//! The pinned agent-sandbox data: the in-repository copy is upstream's files unchanged, and
//! loading refuses data that is not what it claims to be.

mod common;

use std::path::Path;

use sandbox_kube::check::{AdmissionPolicy, CheckError, CrdSchema, Pinned, POLICY_FILE};
use sandbox_kube::Kind;

const FILES: [&str; 8] = [
    "LICENSE",
    "README.md",
    "agents.x-k8s.io_sandboxes.yaml",
    "extensions.agents.x-k8s.io_sandboxclaims.yaml",
    "extensions.agents.x-k8s.io_sandboxtemplates.yaml",
    "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
    "secure-sandbox-binding.yaml",
    "secure-sandbox-policy.yaml",
];

#[test]
fn the_copy_in_the_repository_is_the_pinned_data_unchanged() {
    let copy = common::copy_dir();
    for file in FILES {
        assert!(
            copy.join(file).is_file(),
            "{file} missing from {}",
            copy.display()
        );
    }
    let used = common::pinned_dir();
    let shared =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../../shared/k8s/agent-sandbox");
    let mut compared = false;
    for other in [used, shared] {
        if !other.is_dir() || other.canonicalize().ok() == copy.canonicalize().ok() {
            continue;
        }
        for file in FILES {
            let a = std::fs::read(copy.join(file)).expect("read the copy");
            let b = std::fs::read(other.join(file))
                .unwrap_or_else(|e| panic!("{}: {e}", other.join(file).display()));
            assert!(
                a == b,
                "{file} differs between {} and {}",
                copy.display(),
                other.display()
            );
        }
        compared = true;
    }
    if !compared {
        eprintln!("NOTE: no shared/k8s/agent-sandbox beside the workspace; only the in-repository copy was checked");
    }
}

#[test]
fn the_in_repository_copy_loads() {
    let pinned = Pinned::load(common::copy_dir()).expect("load the copy");
    for kind in Kind::ALL {
        assert_eq!(pinned.schema(kind).map(CrdSchema::kind), Some(kind));
    }
    assert_eq!(pinned.policy().validations().len(), 16);
}

#[test]
fn crd_files_are_named_as_upstream_names_them() {
    let names: Vec<String> = Kind::ALL.iter().map(|k| k.crd_file()).collect();
    for name in &names {
        assert!(FILES.contains(&name.as_str()), "{name}");
    }
    assert!(FILES.contains(&POLICY_FILE));
}

#[test]
fn a_crd_of_another_kind_is_refused() {
    let text = std::fs::read_to_string(common::pinned_dir().join(Kind::SandboxClaim.crd_file()))
        .expect("read");
    let crd: serde_json::Value = serde_norway::from_str(&text).expect("yaml");
    let err = CrdSchema::from_crd(Kind::SandboxWarmPool, &crd)
        .err()
        .expect("refused");
    assert!(
        matches!(
            err,
            CheckError::Crd {
                kind: Kind::SandboxWarmPool,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_missing_directory_is_an_error_naming_the_file() {
    let err = Pinned::load("/nonexistent/agent-sandbox")
        .err()
        .expect("refused");
    assert!(matches!(err, CheckError::Io { .. }), "{err}");
    assert!(
        err.to_string().contains("/nonexistent/agent-sandbox/"),
        "{err}"
    );
}

#[test]
fn policies_that_cannot_be_evaluated_faithfully_are_refused() {
    let binding = std::fs::read_to_string(common::pinned_dir().join("secure-sandbox-binding.yaml"))
        .expect("read");
    assert!(
        AdmissionPolicy::from_yaml(&binding).is_err(),
        "a binding is not a policy"
    );
    let with_params = "kind: ValidatingAdmissionPolicy\nspec:\n  paramKind: {kind: ConfigMap}\n  validations: [{expression: 'true'}]\n";
    assert!(
        AdmissionPolicy::from_yaml(with_params).is_err(),
        "paramKind"
    );
    let broken =
        "kind: ValidatingAdmissionPolicy\nspec:\n  validations: [{expression: 'object.spec.('}]\n";
    assert!(
        matches!(
            AdmissionPolicy::from_yaml(broken),
            Err(CheckError::Cel { .. })
        ),
        "CEL syntax error"
    );
}
