//! `strata kube apply` and `strata run --backend cluster` against the in-process fake API
//! server (sandbox-kube's `fake`): the objects are checked against the pinned CRDs and
//! admission policy on the way in, and the run happens in a pod (a local process with the
//! real guest agent) reached over the exec stream.

use std::path::PathBuf;
use std::process::{Command, Output};

use sandbox_kube::check::Pinned;
use sandbox_kube::fake::{FakeApiServer, FakeOptions};
use sandbox_kube::render::AGENT_PATH;

const NS: &str = "agents";

fn pinned() -> Pinned {
    let dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../sandbox-kube/tests/data/agent-sandbox");
    Pinned::load(&dir).unwrap_or_else(|e| panic!("pinned data in {}: {e}", dir.display()))
}

/// The guest agent, built next to the strata binary (`cargo build --workspace --bins`).
fn agent() -> PathBuf {
    let strata = PathBuf::from(env!("CARGO_BIN_EXE_strata"));
    let agent = strata.with_file_name("strata-guest-agent");
    assert!(
        agent.is_file(),
        "{} is missing: build it first (cargo build -p sandbox-agent --bin strata-guest-agent, same profile)",
        agent.display()
    );
    agent
}

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .output()
        .expect("strata runs")
}

#[test]
fn kube_apply_then_run_on_the_cluster_backend() {
    let server = FakeApiServer::start(FakeOptions::new(pinned()).command(AGENT_PATH, agent()))
        .expect("the fake API server starts");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("write the kubeconfig");
    let config = kubeconfig.path().to_str().expect("utf-8 path");
    let apply = |expect: &str| {
        let out = strata(&[
            "kube",
            "apply",
            "--tier",
            "low",
            "--image",
            "strata-tools:1",
            "--namespace",
            NS,
            "--kubeconfig",
            config,
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains(&format!("SandboxTemplate {NS}/strata-low: {expect}")),
            "{text}"
        );
        assert!(
            text.contains(&format!("SandboxWarmPool {NS}/strata-low: {expect}")),
            "{text}"
        );
    };
    apply("Created");
    apply("Unchanged");
    let run_json = |extra: &[&str], script: &str| -> serde_json::Value {
        let mut args = vec![
            "run",
            "--backend",
            "cluster",
            "--tier",
            "low",
            "--namespace",
            NS,
            "--kubeconfig",
            config,
            "--json",
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "sh", "-c", script]);
        let out = strata(&args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "JSON result ({e}): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    let result = run_json(&[], "echo hi from the pod; exit 4");
    assert_eq!(result["stdout"], "hi from the pod\n", "{result}");
    assert_eq!(result["exit_code"], 4, "{result}");
    assert_eq!(result["receipt"]["backend"], "cluster", "{result}");
    assert_eq!(result["receipt"]["policy"]["tier"], "low", "{result}");
    let enforced = result["receipt"]["enforced"].to_string();
    assert!(enforced.contains("runtime class gvisor"), "{enforced}");
    assert!(enforced.contains("NetworkPolicy"), "{enforced}");
    // With the CLI in the image (the fake's pods see this machine: this very binary), the
    // tool runs under the process backend inside the pod too.
    let result = run_json(
        &["--inner-cli", env!("CARGO_BIN_EXE_strata")],
        "echo layered",
    );
    assert_eq!(result["stdout"], "layered\n", "{result}");
    assert_eq!(
        result["receipt"]["layers"],
        serde_json::json!(["cluster", "process"]),
        "{result}"
    );
}

#[test]
fn cluster_flags_need_the_cluster_backend_and_a_pool() {
    let out = strata(&["run", "--backend", "cluster", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--warm-pool"));
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--warm-pool",
        "p",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--backend cluster"));
    let out = strata(&["run", "--inner-cli", "/strata/strata", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A loopback HTTP server answering one request with `body`; its port.
fn upstream(body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn an_allowlist_run_on_the_cluster_goes_through_the_egress_proxy_the_template_names() {
    let server = FakeApiServer::start(FakeOptions::new(pinned()).command(AGENT_PATH, agent()))
        .expect("the fake API server starts");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("write the kubeconfig");
    let config = kubeconfig.path().to_str().expect("utf-8 path");
    let proxy_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let proxy = format!("127.0.0.1:{proxy_port}");
    let out = strata(&[
        "kube",
        "apply",
        "--tier",
        "high",
        "--image",
        "strata-tools:1",
        "--egress-proxy",
        &proxy,
        "--namespace",
        NS,
        "--kubeconfig",
        config,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = upstream("through the proxy");
    // The pods reach the proxy at the template's address; this process listens on every
    // address of the machine (as it would behind NAT).
    let listen = format!("0.0.0.0:{proxy_port}");
    let net = format!("allow:127.0.0.1:{port}");
    let script = format!(
        "curl -sS -m 20 http://127.0.0.1:{port}/; echo; curl -sS -m 20 -o /dev/null -w '%{{http_code}}' http://example.com/"
    );
    let out = strata(&[
        "run",
        "--backend",
        "cluster",
        "--tier",
        "high",
        "--namespace",
        NS,
        "--kubeconfig",
        config,
        "--egress-listen",
        &listen,
        "--net",
        &net,
        "--json",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "JSON result ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(result["stdout"], "through the proxy\n403", "{result}");
    let network = &result["receipt"]["network"];
    assert!(
        network["enforcer"]
            .as_str()
            .is_some_and(|e| e.starts_with(&proxy) && e.ends_with(&listen)),
        "{network}"
    );
    assert_eq!(
        network["decisions"].as_array().map(Vec::len),
        Some(2),
        "{network}"
    );
}
