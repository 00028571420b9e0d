//! `strata kube render`: its YAML for every built-in tier and boundary validates against the
//! pinned agent-sandbox CRD schemas, and every Sandbox in it passes upstream's admission
//! policy (gVisor; Kata fails only the policy's gVisor-only rules, see sandbox-kube).

use std::path::PathBuf;
use std::process::Command;

use sandbox_kube::check::Pinned;
use sandbox_kube::Kind;
use serde::Deserialize;

/// The pinned data: `$STRATA_AGENT_SANDBOX_DIR`, else sandbox-kube's unchanged copy.
fn pinned() -> Pinned {
    let dir = std::env::var_os("STRATA_AGENT_SANDBOX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(
                std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
            )
            .join("../sandbox-kube/tests/data/agent-sandbox")
        });
    Pinned::load(&dir).unwrap_or_else(|e| panic!("pinned data in {}: {e}", dir.display()))
}

fn render(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["kube", "render"])
        .args(args)
        .output()
        .expect("run strata kube render")
}

/// The documents of a YAML stream, with their kinds.
fn documents(yaml: &str) -> Vec<(Kind, serde_json::Value)> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| {
            let value = serde_json::Value::deserialize(doc).expect("a YAML document");
            let name = value["kind"].as_str().expect("kind").to_string();
            let kind = Kind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(|| panic!("unexpected kind {name}"));
            (kind, value)
        })
        .collect()
}

#[test]
fn rendered_yaml_of_every_builtin_tier_passes_the_crd_schemas_and_the_admission_policy() {
    let pinned = pinned();
    for tier in ["low", "medium", "high"] {
        for boundary in ["gvisor", "kata-qemu", "kata-fc"] {
            let out = render(&[
                "--tier",
                tier,
                "--image",
                "registry.example/strata-agent:1",
                "--boundary",
                boundary,
                "--egress-proxy",
                "10.0.0.5:3128",
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{tier}/{boundary}: {stderr}");
            let docs = documents(&String::from_utf8_lossy(&out.stdout));
            let kinds: Vec<Kind> = docs.iter().map(|(k, _)| *k).collect();
            assert_eq!(kinds.len(), 4, "{tier}/{boundary}: {kinds:?}");
            for (kind, object) in &docs {
                let violations = pinned.check_object(*kind, object);
                if boundary == "gvisor" {
                    assert!(
                        violations.is_empty(),
                        "{tier}/{boundary} {kind:?}: {violations:?}"
                    );
                } else {
                    for v in &violations {
                        // Kata: only upstream's gVisor-only rules (runtime class, GKE
                        // placement) may object.
                        assert!(
                            *kind == Kind::Sandbox
                                && v.to_string().to_lowercase().contains("gvisor"),
                            "{tier}/{boundary} {kind:?}: {v}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_profile_renders_with_its_limits_and_bad_input_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = dir.path().join("builders.toml");
    std::fs::write(
        &profile,
        "[caps]\nlimits = { memory = \"1G\", cpus = 2.0, disk = \"2G\" }\n",
    )
    .expect("profile");
    let out = render(&[
        "--profile",
        profile.to_str().expect("utf-8"),
        "--image",
        "img:1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(yaml.contains("strata-builders"), "{yaml}");
    assert!(
        yaml.contains("memory: 1Gi")
            || yaml.contains("memory: '1073741824'")
            || yaml.contains("1073741824"),
        "{yaml}"
    );
    let pinned = pinned();
    for (kind, object) in documents(&yaml) {
        let violations = pinned.check_object(kind, &object);
        assert!(violations.is_empty(), "{kind:?}: {violations:?}");
    }
    for bad in [
        vec!["--tier", "root", "--image", "x"],
        vec!["--tier", "low", "--image", "x", "--boundary", "docker"],
        vec![
            "--tier",
            "high",
            "--image",
            "x",
            "--egress-proxy",
            "proxy.example:3128",
        ],
    ] {
        let out = render(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty(), "{bad:?} printed objects");
        assert!(!out.stderr.is_empty());
    }
}
