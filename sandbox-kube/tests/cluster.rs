//! The cluster backend end to end: `ClusterBackend` connected through a kubeconfig to the
//! in-process fake API server, which validates every object against the pinned CRDs and
//! admission policy and runs pods as local processes with the real guest agent (`pod` as
//! the entrypoint, `serve` exec'd per run over the kube-rs exec websocket).
//!
//! Needs `strata-guest-agent` built next to this test binary (`cargo test --workspace`
//! builds it; alone: `cargo build -p sandbox-agent --bin strata-guest-agent` first).

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::{
    Access, Backend, BackendKind, ByteSize, Capability, Caps, Error, ExitStatus, LimitKind,
    Mechanism, Mount, Net, NetRule, RunContext, Strictness, Tool,
};
use sandbox_kube::backend::{apply, ClusterBackend, ClusterOptions};
use sandbox_kube::check::Pinned;
use sandbox_kube::client::Outcome;
use sandbox_kube::fake::{FakeApiServer, FakeOptions};
use sandbox_kube::render::AGENT_PATH;
use sandbox_kube::{render, Boundary, EgressProxy, RenderInput};
use sandbox_policy::Tier;

const NS: &str = "agents";
const HANG: Duration = Duration::from_secs(60);

/// The guest agent built with this workspace.
fn agent_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let agent = dir.join("strata-guest-agent");
    assert!(
        agent.is_file(),
        "{} is missing: build it first (cargo build -p sandbox-agent --bin strata-guest-agent, same profile)",
        agent.display()
    );
    agent
}

/// A fake cluster with the `low` tier's objects applied (through the kubeconfig, as
/// `strata kube apply` does), and a backend claiming from its pool.
struct Fixture {
    backend: ClusterBackend,
    _kubeconfig: tempfile::NamedTempFile,
    server: FakeApiServer,
}

fn fixture(boundary: Boundary) -> Fixture {
    fixture_with(boundary, None)
}

/// The `strata` CLI built with this workspace (what the pod's image would hold; the fake's
/// pods see this machine's file system).
fn strata_cli() -> String {
    let cli = agent_binary().with_file_name("strata");
    assert!(
        cli.is_file(),
        "{} is missing: build it first (cargo build -p sandbox-cli, same profile)",
        cli.display()
    );
    cli.display().to_string()
}

fn fixture_with(boundary: Boundary, inner_cli: Option<String>) -> Fixture {
    fixture_of(
        RenderInput::for_tier(&Tier::low(), "strata-tools:1", boundary),
        inner_cli,
    )
}

/// A fake cluster with `input`'s objects applied, and a backend claiming from its pool.
fn fixture_of(input: RenderInput, inner_cli: Option<String>) -> Fixture {
    let server = FakeApiServer::start(
        FakeOptions::new(Pinned::load(common::pinned_dir()).expect("the pinned data"))
            .command(AGENT_PATH, agent_binary()),
    )
    .expect("the fake API server starts");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("write the kubeconfig");
    let pool = format!("strata-{}", input.name);
    let rendered = render(&input.with_namespace(NS).with_warm_pool(1)).expect("render");
    let applied = apply(Some(kubeconfig.path()), NS, &rendered).expect("apply");
    assert_eq!(applied.template, Outcome::Created);
    let mut options = ClusterOptions::new(NS, pool);
    options.claim_timeout = Duration::from_secs(5);
    options.inner_cli = inner_cli;
    let backend = ClusterBackend::connect(Some(kubeconfig.path()), options).expect("connect");
    Fixture {
        backend,
        _kubeconfig: kubeconfig,
        server,
    }
}

fn sh(script: &str) -> Tool {
    Tool::command(["/bin/sh", "-c", script])
}

/// Claims made by runs: POSTs to the claims collection.
fn claims_posted(server: &FakeApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/sandboxclaims"))
        .count()
}

/// Waits until no pod but the pool's one warm pod is running (the claimed one was
/// deleted with its claim).
fn until_released(server: &FakeApiServer) {
    let start = Instant::now();
    while server.pods().iter().filter(|p| p.running).count() > 1 {
        assert!(start.elapsed() < HANG, "a claimed pod outlived its run");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_claims_a_pod_runs_through_the_agent_and_releases_it() {
    let f = fixture(Boundary::Gvisor);
    let mut caps = Caps {
        stdin: b"from the host".to_vec(),
        ..Caps::default()
    };
    caps.env.insert("GREETING".into(), "hello".into());
    let out = f
        .backend
        .run_caps(
            &sh("cat; echo \" $GREETING\"; pwd >&2; exit 7"),
            &caps,
            &RunContext::default(),
        )
        .expect("the run");
    assert_eq!(out.status, ExitStatus::Exited { code: 7 });
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from the host hello\n"
    );
    let pod_dir = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    assert!(
        !pod_dir.is_empty()
            && f.server
                .dir()
                .is_some_and(|d| pod_dir.starts_with(&*d.to_string_lossy())),
        "the tool ran in its pod's directory, got {pod_dir:?}"
    );
    let receipt = &out.receipt;
    assert_eq!(receipt.backend, BackendKind::Cluster);
    assert!(receipt.has(Capability::Syscalls, "runtime class gvisor"));
    assert!(receipt.has_kind(Capability::Net, Mechanism::Cluster));
    assert!(receipt.has_kind(Capability::Privileges, Mechanism::Cluster));
    assert!(receipt
        .gaps
        .iter()
        .any(|g| g.capability == Capability::Syscalls && g.reason.contains("landlock")));
    until_released(&f.server);
    assert_eq!(claims_posted(&f.server), 1);
}

#[test]
fn wall_clock_and_output_limits_hold_in_the_pod() {
    let f = fixture(Boundary::Gvisor);
    let mut caps = Caps::default();
    caps.limits.timeout = Duration::from_millis(500);
    let out = f
        .backend
        .run_caps(
            &sh("echo $$ > pid; exec sleep 1000"),
            &caps,
            &RunContext::default(),
        )
        .expect("the run");
    assert!(matches!(
        out.status,
        ExitStatus::Limit {
            limit: LimitKind::Wall,
            ..
        }
    ));
    let mut caps = Caps::default();
    caps.limits.output = ByteSize::kib(4);
    let out = f
        .backend
        .run_caps(&sh("yes"), &caps, &RunContext::default())
        .expect("the run");
    assert!(matches!(
        out.status,
        ExitStatus::Limit {
            limit: LimitKind::Output,
            ..
        }
    ));
    assert!(out.stdout.len() <= 4096 && out.stdout_truncated);
    until_released(&f.server);
}

#[test]
fn what_a_pod_cannot_honour_is_refused_before_anything_is_claimed() {
    let f = fixture(Boundary::Gvisor);
    let dir = tempfile::tempdir().expect("a dir");
    let mut caps = Caps::default();
    caps.mounts.push(Mount::new(
        dir.path().to_path_buf(),
        "/data".into(),
        Access::ReadOnly,
    ));
    let err = f
        .backend
        .run_caps(&sh("true"), &caps, &RunContext::default())
        .expect_err("a host directory cannot reach a pod");
    assert!(matches!(err, Error::InvalidRequest { .. }), "{err}");
    let caps = Caps {
        net: sandbox_core::Net::Host,
        ..Caps::default()
    };
    assert!(matches!(
        f.backend
            .run_caps(&sh("true"), &caps, &RunContext::default()),
        Err(Error::Unenforceable { .. })
    ));
    // Tighter than the pod's memory limit: strict refuses, best-effort runs and says so.
    let mut caps = Caps::default();
    caps.limits.memory = ByteSize::mib(64);
    assert!(matches!(
        f.backend
            .run_caps(&sh("true"), &caps, &RunContext::default()),
        Err(Error::Unenforceable { .. })
    ));
    assert_eq!(claims_posted(&f.server), 0, "nothing was claimed");
    let ctx = RunContext {
        strictness: Strictness::BestEffort,
        ..RunContext::default()
    };
    let out = f
        .backend
        .run_caps(&sh("true"), &caps, &ctx)
        .expect("best effort");
    assert!(out
        .receipt
        .gaps
        .iter()
        .any(|g| g.capability == Capability::Memory));
}

#[test]
fn a_sandbox_the_admission_policy_refuses_never_runs_and_its_claim_is_released() {
    // Upstream's policy admits only gVisor: a Kata pool's sandboxes are refused.
    let f = fixture(Boundary::KataQemu);
    let err = f
        .backend
        .run_caps(&sh("touch ran"), &Caps::default(), &RunContext::default())
        .expect_err("no sandbox can be made");
    assert!(
        matches!(&err, Error::Setup { stage, .. } if stage.contains("claim")),
        "{err}"
    );
    assert!(f.server.pods().iter().all(|p| !p.dir.join("ran").exists()));
    let deleted = f
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("/sandboxclaims/"))
        .count();
    assert_eq!(deleted, 1, "the claim was released");
}

#[test]
fn cancelling_a_run_kills_it_and_releases_the_claim() {
    let f = fixture(Boundary::Gvisor);
    let ctx = RunContext::default();
    let cancel = ctx.cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cancel.cancel();
    });
    let mut caps = Caps::default();
    caps.limits.timeout = HANG;
    let err = f
        .backend
        .run_caps(&sh("exec sleep 1000"), &caps, &ctx)
        .expect_err("cancelled");
    canceller.join().expect("joins");
    assert!(matches!(err, Error::Cancelled), "{err}");
    until_released(&f.server);
}

#[test]
fn a_kubeconfig_that_cannot_be_used_is_a_typed_error() {
    let missing = ClusterBackend::connect(
        Some(std::path::Path::new("/nonexistent/kubeconfig")),
        ClusterOptions::new(NS, "strata-low"),
    );
    assert!(matches!(missing, Err(Error::InvalidRequest { .. })));
    let garbled = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(garbled.path(), "clusters: [not, a, kubeconfig").expect("write");
    assert!(matches!(
        ClusterBackend::connect(Some(garbled.path()), ClusterOptions::new(NS, "p")),
        Err(Error::InvalidRequest { .. })
    ));
}

/// A fake cluster serving https with its own CA and requiring a bearer token, with the
/// `low` tier applied through `kubeconfig`.
fn tls_server(token: &str) -> FakeApiServer {
    let server = FakeApiServer::start(
        FakeOptions::new(Pinned::load(common::pinned_dir()).expect("the pinned data"))
            .command(AGENT_PATH, agent_binary())
            .tls(true)
            .token(token),
    )
    .expect("the fake API server starts");
    assert!(server.url().starts_with("https://"), "{}", server.url());
    server
}

#[test]
fn the_api_server_is_reached_over_tls_verified_against_the_kubeconfigs_ca() {
    let server = tls_server("s3cret-token");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("write the kubeconfig");
    let rendered = render(
        &RenderInput::for_tier(&Tier::low(), "strata-tools:1", Boundary::Gvisor)
            .with_namespace(NS)
            .with_warm_pool(1),
    )
    .expect("render");
    apply(Some(kubeconfig.path()), NS, &rendered).expect("apply over https");
    let mut options = ClusterOptions::new(NS, "strata-low");
    options.claim_timeout = Duration::from_secs(5);
    let backend = ClusterBackend::connect(Some(kubeconfig.path()), options).expect("connect");
    let out = backend
        .run_caps(
            &sh("echo over tls"),
            &Caps::default(),
            &RunContext::default(),
        )
        .expect("a run, its exec stream over TLS too");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "over tls\n");
    until_released(&server);
    assert!(
        server.requests().iter().all(|r| r.status != 401),
        "every request carried the token"
    );
}

#[test]
fn a_server_the_kubeconfig_does_not_vouch_for_is_never_sent_a_request() {
    let server = tls_server("s3cret-token");
    // The right token, but no certificate authority: the server's certificate is checked
    // against the system's roots, which do not hold the fake's CA.
    let untrusted = server
        .kubeconfig(NS)
        .lines()
        .filter(|l| !l.contains("certificate-authority-data"))
        .collect::<Vec<_>>()
        .join("\n");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), untrusted).expect("write the kubeconfig");
    let backend = ClusterBackend::connect(
        Some(kubeconfig.path()),
        ClusterOptions::new(NS, "strata-low"),
    )
    .expect("nothing is sent on connect");
    let err = backend
        .run_caps(&sh("true"), &Caps::default(), &RunContext::default())
        .expect_err("the certificate is not trusted");
    assert!(matches!(err, Error::Setup { .. }), "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(
        server.requests().is_empty(),
        "the handshake failed before any request (and so before the token was sent)"
    );
}

#[test]
fn a_wrong_token_is_refused_by_the_api_server() {
    let server = tls_server("s3cret-token");
    let wrong = server.kubeconfig(NS).replace("s3cret-token", "guessed");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), wrong).expect("write the kubeconfig");
    let backend = ClusterBackend::connect(
        Some(kubeconfig.path()),
        ClusterOptions::new(NS, "strata-low"),
    )
    .expect("connect");
    let err = backend
        .run_caps(&sh("true"), &Caps::default(), &RunContext::default())
        .expect_err("unauthorized");
    assert!(matches!(err, Error::Setup { .. }), "{err}");
    assert!(err.to_string().contains("Unauthorized"), "{err}");
    assert_eq!(claims_posted(&server), 0);
}

#[test]
fn with_the_cli_in_the_image_the_tool_runs_under_stratas_sandbox_inside_the_pod() {
    let f = fixture_with(Boundary::Gvisor, Some(strata_cli()));
    let caps = Caps {
        stdin: b"through two layers".to_vec(),
        ..Caps::default()
    };
    let out = f
        .backend
        .run_caps(
            &sh("cat; echo; grep '^Seccomp:' /proc/self/status; exit 5"),
            &caps,
            &RunContext::default(),
        )
        .expect("the layered run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status, ExitStatus::Exited { code: 5 }, "{stdout}");
    assert!(stdout.starts_with("through two layers\n"), "{stdout}");
    // The agent alone leaves the tool unfiltered here (the fake's pods are plain
    // processes); under the inner layer the tool runs behind Strata's seccomp filter.
    assert!(stdout.contains("Seccomp:\t2"), "{stdout}");
    let receipt = &out.receipt;
    assert_eq!(
        receipt.layers,
        vec![BackendKind::Cluster, BackendKind::Process]
    );
    assert!(
        receipt.has(Capability::Syscalls, "in the pod: "),
        "{receipt:?}"
    );
    assert!(receipt.has_kind(Capability::Syscalls, Mechanism::Seccomp));
    assert!(
        !receipt
            .gaps
            .iter()
            .any(|g| g.reason.contains("no seccomp filter")),
        "the layer closes that gap"
    );
    until_released(&f.server);
}

#[test]
fn a_session_holds_one_pod_across_calls_and_releases_it_on_close() {
    let f = fixture(Boundary::Gvisor);
    let session = f
        .backend
        .session(&RunContext::default())
        .expect("a session");
    session
        .write_file("notes/first.txt", b"written from the host\n")
        .expect("write");
    let out = session
        .run(
            &sh("cat notes/first.txt; echo 'added by call 1' >> notes/first.txt"),
            &Caps::default(),
            &RunContext::default(),
        )
        .expect("call 1");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "written from the host\n"
    );
    assert!(out.receipt.has(Capability::Lifetime, "claimed pod"));
    let out = session
        .run(
            &sh("wc -l < notes/first.txt"),
            &Caps::default(),
            &RunContext::default(),
        )
        .expect("call 2 sees call 1's file");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    assert_eq!(
        session.read_file("notes/first.txt").expect("read"),
        b"written from the host\nadded by call 1\n"
    );
    for bad in ["/etc/passwd", "../escape", "notes/../../x", ""] {
        assert!(
            matches!(session.read_file(bad), Err(Error::InvalidRequest { .. })),
            "{bad:?} refused"
        );
        assert!(matches!(
            session.write_file(bad, b"x"),
            Err(Error::InvalidRequest { .. })
        ));
    }
    let missing = session.read_file("nope.txt").expect_err("missing");
    assert!(missing.to_string().contains("not found"), "{missing}");
    assert_eq!(
        claims_posted(&f.server),
        1,
        "one claim for the whole session"
    );
    let pod = session.pod().to_owned();
    session.close();
    assert!(matches!(
        session.run(&sh("true"), &Caps::default(), &RunContext::default()),
        Err(Error::InvalidRequest { .. })
    ));
    assert!(
        f.server.pods().iter().all(|p| p.name != pod || !p.running),
        "the session's pod is gone"
    );
}

/// A loopback HTTP server answering every request with [`UPSTREAM_BODY`]; its port and the
/// number of connections it accepted.
fn upstream() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
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
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{UPSTREAM_BODY}",
                UPSTREAM_BODY.len()
            );
        }
    });
    (port, accepted)
}

const UPSTREAM_BODY: &str = "hello from upstream";

/// A free loopback port (for the template's egress proxy address).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A pool whose template sends egress only to an egress proxy on this machine's loopback
/// (the fake's pods are local processes, so they reach it there).
fn egress_fixture(inner_cli: Option<String>) -> (Fixture, std::net::SocketAddr) {
    let proxy = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let caps = Caps {
        net: Net::Allow(Vec::new()),
        ..Caps::default()
    };
    let input = RenderInput::new("net", "strata-tools:1", Boundary::Gvisor, caps)
        .with_egress_proxy(EgressProxy::Address(proxy));
    (fixture_of(input, inner_cli), proxy)
}

/// `curl` through the proxy variables the run got: the allowlisted upstream's body, then
/// the HTTP status for an unlisted host, then the proxy URL (credential included).
fn curl_script(port: u16) -> Tool {
    sh(&format!(
        "curl -sS -m 20 http://127.0.0.1:{port}/; echo; \
         curl -sS -m 20 -o /dev/null -w '%{{http_code}}\\n' http://example.com/; \
         echo \"$http_proxy\""
    ))
}

#[test]
fn an_allowlist_run_reaches_only_its_hosts_through_the_egress_proxy() {
    for inner in [None, Some(strata_cli())] {
        let layered = inner.is_some();
        let (f, proxy) = egress_fixture(inner);
        let (port, accepted) = upstream();
        let rule: NetRule = format!("127.0.0.1:{port}").parse().expect("rule");
        let caps = Caps {
            net: Net::Allow(vec![rule]),
            ..Caps::default()
        };
        let out = f
            .backend
            .run_caps(&curl_script(port), &caps, &RunContext::default())
            .expect("the run");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(
            lines.get(..2),
            Some(&[UPSTREAM_BODY, "403"][..]),
            "layered {layered}: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            out.receipt
        );
        assert!(
            lines[2].ends_with(&format!("@{proxy}")),
            "the proxy URL names the template's address: {}",
            lines[2]
        );
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one upstream connection"
        );
        let receipt = &out.receipt;
        assert!(
            receipt.has_kind(Capability::Net, Mechanism::Proxy),
            "{receipt}"
        );
        let net = receipt.network.as_ref().expect("network receipt");
        assert!(
            net.enforcer.contains(&proxy.to_string()),
            "{}",
            net.enforcer
        );
        let allowed: Vec<_> = net.decisions.iter().filter(|d| d.allowed).collect();
        let refused: Vec<_> = net.decisions.iter().filter(|d| !d.allowed).collect();
        assert_eq!(allowed.len(), 1, "{net:?}");
        assert_eq!(allowed[0].port, port);
        assert_eq!(refused.len(), 1, "{net:?}");
        assert_eq!(refused[0].host, "example.com");
        assert!(
            !receipt.gaps.iter().any(|g| g.capability == Capability::Net),
            "{receipt}"
        );
        if layered {
            assert_eq!(
                receipt.layers,
                vec![BackendKind::Cluster, BackendKind::Process]
            );
            assert!(
                receipt.has(Capability::Net, "in the pod: the outer network"),
                "the inner sandbox shares the pod's network, whose only peer is the proxy: {receipt}"
            );
        }
        until_released(&f.server);
    }
}

#[test]
fn a_leaked_proxy_credential_dies_with_its_run() {
    let (f, proxy) = egress_fixture(None);
    let (port, accepted) = upstream();
    let caps = Caps {
        net: Net::Allow(vec![format!("127.0.0.1:{port}").parse().expect("rule")]),
        ..Caps::default()
    };
    let out = f
        .backend
        .run_caps(&sh("echo \"$http_proxy\""), &caps, &RunContext::default())
        .expect("the run");
    let leaked = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(leaked.contains('@'), "the tool saw a proxy URL: {leaked}");
    // Used after the run (by the tool's accomplice, or a later run handed the URL): the
    // proxy no longer knows the credential.
    let status = std::process::Command::new("curl")
        .args(["-sS", "-m", "20", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["--proxy", &leaked])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "407", "{proxy}");
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "nothing reached upstream"
    );
}

#[test]
fn an_allowlist_on_a_pool_without_egress_is_refused_before_anything_is_claimed() {
    let f = fixture(Boundary::Gvisor);
    let caps = Caps {
        net: Net::Allow(vec!["example.com:443".parse().expect("rule")]),
        ..Caps::default()
    };
    for strictness in [Strictness::Strict, Strictness::BestEffort] {
        let ctx = RunContext {
            strictness,
            ..RunContext::default()
        };
        let err = f
            .backend
            .run_caps(&sh("true"), &caps, &ctx)
            .expect_err("the template lets pods reach nothing");
        assert!(
            matches!(err, Error::InvalidRequest { .. }) && err.to_string().contains("egress"),
            "{err}"
        );
    }
    assert_eq!(claims_posted(&f.server), 0, "nothing was claimed");
}
