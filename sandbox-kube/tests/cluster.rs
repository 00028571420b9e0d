//! The cluster backend end to end: `ClusterBackend` connected through a kubeconfig to the
//! in-process fake API server, which validates every object against the pinned CRDs and
//! admission policy and runs pods as local processes with the real guest agent (`pod` as
//! the entrypoint, `serve` exec'd per run over the kube-rs exec websocket).
//!
//! Needs `strata-guest-agent` built next to this test binary (`cargo test --workspace`
//! builds it; alone: `cargo build -p sandbox-vm --bin strata-guest-agent` first).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_core::policy::Tier;
use sandbox_core::{
    Access, Backend, BackendKind, ByteSize, Capability, Caps, Error, ExitStatus, LimitKind,
    Mechanism, Mount, RunContext, Strictness, Tool,
};
use sandbox_kube::backend::{apply, ClusterBackend, ClusterOptions};
use sandbox_kube::check::Pinned;
use sandbox_kube::client::Outcome;
use sandbox_kube::fake::{FakeApiServer, FakeOptions};
use sandbox_kube::render::AGENT_PATH;
use sandbox_kube::{render, Boundary, RenderInput};

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
        "{} is missing: build it first (cargo build -p sandbox-vm --bin strata-guest-agent, same profile)",
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
    let server = FakeApiServer::start(
        FakeOptions::new(Pinned::load(common::pinned_dir()).expect("the pinned data"))
            .command(AGENT_PATH, agent_binary()),
    )
    .expect("the fake API server starts");
    let kubeconfig = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("write the kubeconfig");
    let rendered = render(
        &RenderInput::for_tier(&Tier::low(), "strata-tools:1", boundary)
            .with_namespace(NS)
            .with_warm_pool(1),
    )
    .expect("render");
    let applied = apply(Some(kubeconfig.path()), NS, &rendered).expect("apply");
    assert_eq!(applied.template, Outcome::Created);
    let mut options = ClusterOptions::new(NS, "strata-low");
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
        .run(
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
        .run(
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
        .run(&sh("yes"), &caps, &RunContext::default())
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
        .run(&sh("true"), &caps, &RunContext::default())
        .expect_err("a host directory cannot reach a pod");
    assert!(matches!(err, Error::InvalidRequest { .. }), "{err}");
    let caps = Caps {
        net: sandbox_core::Net::Host,
        ..Caps::default()
    };
    assert!(matches!(
        f.backend.run(&sh("true"), &caps, &RunContext::default()),
        Err(Error::Unenforceable { .. })
    ));
    // Tighter than the pod's memory limit: strict refuses, best-effort runs and says so.
    let mut caps = Caps::default();
    caps.limits.memory = ByteSize::mib(64);
    assert!(matches!(
        f.backend.run(&sh("true"), &caps, &RunContext::default()),
        Err(Error::Unenforceable { .. })
    ));
    assert_eq!(claims_posted(&f.server), 0, "nothing was claimed");
    let ctx = RunContext {
        strictness: Strictness::BestEffort,
        ..RunContext::default()
    };
    let out = f
        .backend
        .run(&sh("true"), &caps, &ctx)
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
        .run(&sh("touch ran"), &Caps::default(), &RunContext::default())
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
        .run(&sh("exec sleep 1000"), &caps, &ctx)
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
    let https = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(
        https.path(),
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\ncurrent-context: x\n",
    )
    .expect("write");
    let err = ClusterBackend::connect(Some(https.path()), ClusterOptions::new(NS, "p"))
        .expect_err("https needs TLS");
    assert!(err.to_string().contains("kubectl proxy"), "{err}");
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
        .run(
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
