//! The fake API server (`sandbox_kube::fake`, feature `fake`) through the real clients:
//! `client::Cluster` and kube-rs over HTTP on 127.0.0.1, with real local processes as pods.
//!
//! Waits poll the server's own state with a generous deadline (a hang fails the test, a
//! slow machine does not); no assertion depends on how long something took.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, PostParams, WatchEvent, WatchParams};
use sandbox_kube::check::Pinned;
use sandbox_kube::client::{Bound, Cluster, ClusterError, Outcome, Released};
use sandbox_kube::fake::{FakeApiServer, FakeOptions, FakePod};
use sandbox_kube::render::AGENT_PATH;
use sandbox_kube::{render, Boundary, RenderInput, Rendered, SandboxClaim, SandboxTemplate};
use sandbox_policy::Tier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "strata-test";
/// Far longer than anything here takes; only a hang reaches it.
const DEADLINE: Duration = Duration::from_secs(60);

/// A long-running stand-in for the guest agent's idle pod entrypoint.
struct Agent {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn agent() -> Agent {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("agent.sh");
    std::fs::write(&path, "#!/bin/sh\nexec sleep 1000000\n").expect("write the agent script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Agent { _dir: dir, path }
}

fn pinned() -> Pinned {
    Pinned::load(common::pinned_dir()).expect("the pinned agent-sandbox data")
}

fn options(agent: &Agent) -> FakeOptions {
    FakeOptions::new(pinned())
        .command(AGENT_PATH, &agent.path)
        .command("/bin/cat", "/bin/cat")
        .command("/bin/sh", "/bin/sh")
}

fn rendered(boundary: Boundary, pool: u32) -> Rendered {
    render(&RenderInput::for_tier(&Tier::low(), "img", boundary).with_warm_pool(pool))
        .expect("render")
}

fn cluster(server: &FakeApiServer) -> Cluster {
    server.cluster(NS).expect("a client")
}

fn alive(pid: u32) -> bool {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::test_kill_process(pid).is_ok()
}

/// Polls `check` until it gives `Some`; panics after [`DEADLINE`].
async fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = check() {
            return t;
        }
        assert!(start.elapsed() < DEADLINE, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn bound_claim(server: &FakeApiServer, cluster: &Cluster) -> (Bound, FakePod) {
    cluster
        .apply_tier(&rendered(Boundary::Gvisor, 1))
        .await
        .expect("apply");
    let claim = cluster
        .claim(&rendered(Boundary::Gvisor, 1).claim)
        .await
        .expect("claim");
    let bound = cluster.wait_ready(&claim, DEADLINE).await.expect("ready");
    let pod = server
        .pods()
        .into_iter()
        .find(|p| p.name == bound.sandbox)
        .expect("the bound sandbox's pod");
    (bound, pod)
}

#[tokio::test]
async fn apply_tier_creates_then_finds_unchanged_then_replaces() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let first = cluster
        .apply_tier(&rendered(Boundary::Gvisor, 1))
        .await
        .expect("apply");
    assert_eq!(
        (first.template, first.warm_pool),
        (Outcome::Created, Outcome::Created)
    );
    let again = cluster
        .apply_tier(&rendered(Boundary::Gvisor, 1))
        .await
        .expect("apply");
    assert_eq!(
        (again.template, again.warm_pool),
        (Outcome::Unchanged, Outcome::Unchanged)
    );
    let bigger = cluster
        .apply_tier(&rendered(Boundary::Gvisor, 2))
        .await
        .expect("apply");
    assert_eq!(
        (bigger.template, bigger.warm_pool),
        (Outcome::Unchanged, Outcome::Replaced)
    );
    // One replace took effect. The fake's controller writes the pool's status meanwhile,
    // so a PUT may meet a newer resourceVersion first (409) and be retried, as intended.
    let puts: Vec<u16> = server
        .requests()
        .iter()
        .filter(|r| r.method == "PUT")
        .map(|r| r.status)
        .collect();
    assert_eq!(
        puts.iter().filter(|s| **s == 200).count(),
        1,
        "PUTs: {puts:?}"
    );
    assert!(
        puts.iter().all(|s| *s == 200 || *s == 409),
        "PUTs: {puts:?}"
    );
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_is_a_conflict() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let api: Api<SandboxTemplate> = Api::namespaced(server.client(NS).expect("client"), NS);
    let template = rendered(Boundary::Gvisor, 1).template;
    let created = api
        .create(&PostParams::default(), &template)
        .await
        .expect("create");
    let name = created.metadata.name.clone().expect("name");
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    api.replace(&name, &PostParams::default(), &created)
        .await
        .expect("replace");
    match api.replace(&name, &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn schema_violation_is_422_invalid_naming_the_field() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let mut bad = rendered(Boundary::Gvisor, 1);
    bad.warm_pool.spec.replicas = -1;
    match cluster(&server).apply_tier(&bad).await {
        Err(ClusterError::Invalid { message, .. }) => {
            assert!(message.contains("/spec/replicas"), "{message}")
        }
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
    let api: Api<sandbox_kube::SandboxWarmPool> =
        Api::namespaced(server.client(NS).expect("client"), NS);
    match api.create(&PostParams::default(), &bad.warm_pool).await {
        Err(kube::Error::Api(s)) => {
            let causes = s.details.expect("details").causes;
            assert!(
                causes.iter().any(|c| c.field == "/spec/replicas"),
                "{causes:?}"
            );
        }
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn claim_binds_to_a_running_pod_in_a_private_dir() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, pod) = bound_claim(&server, &cluster).await;
    assert_eq!(bound.pod_ips, vec!["127.0.0.1".to_owned()]);
    assert!(pod.running && alive(pod.pid.expect("pid")));
    let mode = std::fs::metadata(&pod.dir)
        .expect("pod dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    // The pool refills: a second warm pod besides the claimed one.
    until("the pool to refill", || {
        (server.pods().len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn release_kills_the_pod_and_removes_its_dir() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, pod) = bound_claim(&server, &cluster).await;
    assert_eq!(
        cluster.release(&bound.claim).await.expect("release"),
        Released::Deleted
    );
    assert!(
        !alive(pod.pid.expect("pid")),
        "the pod's process survived its release"
    );
    assert!(
        !pod.dir.exists(),
        "the pod's directory survived its release"
    );
    assert!(server.pods().iter().all(|p| p.name != pod.name));
    assert_eq!(
        cluster.release(&bound.claim).await.expect("release"),
        Released::AlreadyGone
    );
}

#[tokio::test]
async fn kata_claim_is_refused_by_the_admission_policy() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let kata = rendered(Boundary::KataQemu, 1);
    cluster
        .apply_tier(&kata)
        .await
        .expect("template and pool are not the policy's");
    let name = cluster.claim(&kata.claim).await.expect("claim");
    let claim = loop {
        let claim: SandboxClaim = cluster.get_claim(&name).await.expect("get");
        if claim
            .status
            .as_ref()
            .and_then(|s| s.condition("Ready"))
            .is_some()
        {
            break claim;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = claim.status.expect("status");
    let ready = status.condition("Ready").expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "SandboxCreationFailed")
    );
    assert!(
        ready.message.contains("runtimeClassName: gvisor"),
        "{}",
        ready.message
    );
    match cluster.wait_ready(&name, Duration::from_millis(500)).await {
        Err(ClusterError::Timeout {
            last_ready: Some(last),
            ..
        }) => {
            assert!(last.contains("SandboxCreationFailed"), "{last}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(server.pods().is_empty(), "a refused sandbox got a pod");
    assert!(server.controller_log().iter().any(|l| l.contains("gvisor")));
}

#[tokio::test]
async fn watch_from_before_the_kept_history_is_410_gone() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent).history(3)).expect("server");
    let api: Api<SandboxTemplate> = Api::namespaced(server.client(NS).expect("client"), NS);
    let mut template = rendered(Boundary::Gvisor, 1).template;
    for i in 0..5 {
        template.metadata.name = Some(format!("t{i}"));
        api.create(&PostParams::default(), &template)
            .await
            .expect("create");
    }
    let mut events = Box::pin(
        api.watch(&WatchParams::default(), "1")
            .await
            .expect("watch"),
    );
    use futures_util::StreamExt;
    match events.next().await {
        Some(Ok(WatchEvent::Error(s))) => assert_eq!(s.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn wait_ready_relists_after_its_watch_version_expires() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent).history(3)).expect("server");
    let cluster = cluster(&server);
    let tier = rendered(Boundary::Gvisor, 1);
    // A claim on a pool that does not exist yet: not ready.
    let name = cluster.claim(&tier.claim).await.expect("claim");
    loop {
        let claim = cluster.get_claim(&name).await.expect("get");
        if claim
            .status
            .as_ref()
            .and_then(|s| s.condition("Ready"))
            .is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiter = {
        let cluster = cluster.clone();
        let name = name.clone();
        tokio::spawn(async move { cluster.wait_ready(&name, DEADLINE).await })
    };
    let claims_path =
        format!("/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{NS}/sandboxclaims");
    let count = |server: &FakeApiServer, watch: bool| {
        server
            .requests()
            .iter()
            .filter(|r| {
                r.path == claims_path
                    && r.method == "GET"
                    && r.query.contains("watch=true") == watch
            })
            .count()
    };
    until("the client's first watch", || {
        (count(&server, true) == 1).then_some(())
    })
    .await;
    // More unrelated events than the server keeps, then the watch ends (no bookmark).
    let api: Api<SandboxTemplate> = Api::namespaced(server.client(NS).expect("client"), NS);
    let mut other = tier.template.clone();
    for i in 0..4 {
        other.metadata.name = Some(format!("other-{i}"));
        api.create(&PostParams::default(), &other)
            .await
            .expect("create");
    }
    server.close_watches();
    until("the client to re-list", || {
        (count(&server, false) >= 2).then_some(())
    })
    .await;
    cluster.apply_tier(&tier).await.expect("apply");
    let bound = waiter.await.expect("join").expect("ready after re-listing");
    assert_eq!(bound.claim, name);
}

async fn read_all(mut r: impl tokio::io::AsyncRead + Unpin) -> String {
    let mut out = String::new();
    r.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test]
async fn exec_round_trips_stdin_through_cat() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, _) = bound_claim(&server, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), NS);
    let mut attached = pods
        .exec(
            &bound.sandbox,
            ["/bin/cat"],
            &AttachParams::default().stdin(true),
        )
        .await
        .expect("exec");
    let mut stdin = attached.stdin().expect("stdin");
    let stdout = attached.stdout().expect("stdout");
    let status = attached.take_status().expect("status");
    stdin
        .write_all(b"hello through the fake kubelet\n")
        .await
        .expect("write");
    // End of stdin: kube-rs sends the v5 close signal for channel 0.
    stdin.shutdown().await.expect("close stdin");
    assert_eq!(read_all(stdout).await, "hello through the fake kubelet\n");
    let status = status.await.expect("a status");
    assert_eq!(status.status.as_deref(), Some("Success"));
}

#[tokio::test]
async fn exec_reports_the_exit_code_and_runs_in_the_pod_dir() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, pod) = bound_claim(&server, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), NS);
    let mut attached = pods
        .exec(
            &bound.sandbox,
            ["/bin/sh", "-c", "pwd; env; exit 3"],
            &AttachParams::default(),
        )
        .await
        .expect("exec");
    let stdout = attached.stdout().expect("stdout");
    let status = attached.take_status().expect("status");
    let out = read_all(stdout).await;
    let status = status.await.expect("a status");
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.and_then(|d| d.causes).expect("causes");
    assert_eq!(causes[0].message.as_deref(), Some("3"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        PathBuf::from(lines[0]),
        pod.dir.canonicalize().expect("canonical")
    );
    let env: Vec<&str> = lines[1..]
        .iter()
        .copied()
        .filter(|l| {
            !["PWD=", "OLDPWD=", "SHLVL=", "_="]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .collect();
    assert_eq!(env, vec!["PATH=/usr/local/bin:/usr/bin:/bin"]);
}

#[tokio::test]
async fn exec_into_a_missing_pod_is_404_and_unknown_paths_are_404() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let client = server.client(NS).expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    match pods
        .exec("nope", ["/bin/cat"], &AttachParams::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        Err(other) => panic!("expected 404, got {other:?}"),
        Ok(_) => panic!("expected 404, got a session"),
    }
    let request = http::Request::get("/apis/nothing.example/v1/things")
        .body(Vec::new())
        .expect("request");
    match client.request_text(request).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (404, "NotFound")),
        other => panic!("expected 404, got {other:?}"),
    }
}

#[tokio::test]
async fn kubeconfig_is_accepted_by_kube() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig(NS)).expect("parse");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    assert_eq!(config.default_namespace, NS);
    let client = kube::Client::try_from(config).expect("client");
    let applied = Cluster::new(client, NS)
        .apply_tier(&rendered(Boundary::Gvisor, 0))
        .await
        .expect("apply");
    assert_eq!(applied.template, Outcome::Created);
}

#[tokio::test]
async fn dropping_the_server_leaves_no_process_and_no_directory() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, _) = bound_claim(&server, &cluster).await;
    // An exec still running when the server goes: it prints its pid and waits.
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), NS);
    let mut attached = pods
        .exec(
            &bound.sandbox,
            ["/bin/sh", "-c", "echo $$; exec sleep 1000000"],
            &AttachParams::default(),
        )
        .await
        .expect("exec");
    let mut stdout = attached.stdout().expect("stdout");
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            stdout.read(&mut byte).await.expect("read"),
            1,
            "exec ended early"
        );
        line.push(byte[0]);
    }
    let exec_pid: u32 = String::from_utf8_lossy(&line)
        .trim()
        .parse()
        .expect("a pid");
    let pods = server.pods();
    assert_eq!(pods.len(), 2, "claimed and refilled");
    let root = server.dir().expect("dir").to_path_buf();
    drop(server);
    assert!(!alive(exec_pid), "the exec's process survived the server");
    for pod in pods {
        assert!(
            !alive(pod.pid.expect("pid")),
            "pod {} survived the server",
            pod.name
        );
    }
    assert!(!root.exists(), "{} survived the server", root.display());
}

#[tokio::test]
async fn without_warm_start_only_claimed_sandboxes_get_a_process() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent).warm_start(false)).expect("server");
    let cluster = cluster(&server);
    let (bound, pod) = bound_claim(&server, &cluster).await;
    assert_eq!(pod.name, bound.sandbox);
    let sandboxes: Api<sandbox_kube::Sandbox> = Api::namespaced(cluster.client().clone(), NS);
    // The pool refills with a sandbox object that has no process.
    let refilled = loop {
        let list = sandboxes.list(&Default::default()).await.expect("list");
        if list.items.len() == 2 {
            break list.items;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(refilled
        .iter()
        .any(|s| s.metadata.name.as_deref() != Some(&bound.sandbox)));
    let names: Vec<String> = server.pods().into_iter().map(|p| p.name).collect();
    assert_eq!(names, vec![bound.sandbox]);
}

#[tokio::test]
async fn exec_of_an_unmapped_command_fails_on_the_status_channel() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, _) = bound_claim(&server, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), NS);
    let mut attached = pods
        .exec(
            &bound.sandbox,
            ["/usr/bin/python3"],
            &AttachParams::default(),
        )
        .await
        .expect("exec");
    let status = attached
        .take_status()
        .expect("status")
        .await
        .expect("a status");
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert!(status
        .message
        .unwrap_or_default()
        .contains("/usr/bin/python3"));
}

#[tokio::test]
async fn deleting_a_warm_pool_stops_its_unclaimed_pods_only() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, claimed) = bound_claim(&server, &cluster).await;
    let warm = until("the pool to refill", || {
        server.pods().into_iter().find(|p| p.name != bound.sandbox)
    })
    .await;
    let pools: Api<sandbox_kube::SandboxWarmPool> = Api::namespaced(cluster.client().clone(), NS);
    let pool = rendered(Boundary::Gvisor, 1)
        .warm_pool
        .metadata
        .name
        .expect("pool name");
    pools
        .delete(&pool, &Default::default())
        .await
        .expect("delete the pool");
    assert!(
        !alive(warm.pid.expect("pid")),
        "the warm pod survived its pool"
    );
    assert!(!warm.dir.exists());
    assert!(
        alive(claimed.pid.expect("pid")),
        "the claimed pod went with the pool"
    );
}

#[tokio::test]
async fn a_client_dropping_its_exec_kills_the_process() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let cluster = cluster(&server);
    let (bound, pod) = bound_claim(&server, &cluster).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client().clone(), NS);
    let mut attached = pods
        .exec(
            &bound.sandbox,
            ["/bin/sh", "-c", "echo $$; exec sleep 1000000"],
            &AttachParams::default(),
        )
        .await
        .expect("exec");
    let mut stdout = attached.stdout().expect("stdout");
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            stdout.read(&mut byte).await.expect("read"),
            1,
            "exec ended early"
        );
        line.push(byte[0]);
    }
    let pid: u32 = String::from_utf8_lossy(&line)
        .trim()
        .parse()
        .expect("a pid");
    assert!(alive(pid));
    drop(stdout);
    drop(attached);
    until("the exec's process to be killed", || {
        (!alive(pid)).then_some(())
    })
    .await;
    assert!(alive(pod.pid.expect("pid")), "the pod went with the exec");
}

#[tokio::test]
async fn a_status_written_on_create_is_dropped() {
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let api: Api<SandboxClaim> = Api::namespaced(server.client(NS).expect("client"), NS);
    let mut claim = rendered(Boundary::Gvisor, 1).claim;
    claim.status = Some(sandbox_kube::crd::SandboxClaimStatus {
        conditions: vec![sandbox_kube::crd::Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Forged".into(),
            message: "forged by the client".into(),
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            observed_generation: None,
        }],
        sandbox: Some(sandbox_kube::crd::ClaimedSandbox {
            name: "forged".into(),
            pod_ips: vec![],
        }),
    });
    let created = api
        .create(&PostParams::default(), &claim)
        .await
        .expect("create");
    assert_eq!(created.status, None);
    let meta = created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    assert_eq!(meta.namespace.as_deref(), Some(NS));
}

#[tokio::test]
async fn a_watch_replays_from_its_version_and_ends_with_a_bookmark_at_its_timeout() {
    use futures_util::StreamExt;
    let agent = agent();
    let server = FakeApiServer::start(options(&agent)).expect("server");
    let api: Api<SandboxTemplate> = Api::namespaced(server.client(NS).expect("client"), NS);
    let mut template = rendered(Boundary::Gvisor, 1).template;
    template.metadata.name = Some("first".into());
    let first = api
        .create(&PostParams::default(), &template)
        .await
        .expect("create");
    template.metadata.name = Some("second".into());
    api.create(&PostParams::default(), &template)
        .await
        .expect("create");
    let since = first.metadata.resource_version.expect("version");
    let params = WatchParams::default()
        .timeout(1)
        .fields("metadata.name=second");
    let events: Vec<_> = api
        .watch(&params, &since)
        .await
        .expect("watch")
        .collect()
        .await;
    let names: Vec<String> = events
        .iter()
        .map(|e| match e {
            Ok(WatchEvent::Added(t)) => {
                format!("ADDED {}", t.metadata.name.as_deref().unwrap_or(""))
            }
            Ok(WatchEvent::Bookmark(_)) => "BOOKMARK".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, vec!["ADDED second", "BOOKMARK"]);
}
