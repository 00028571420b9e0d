//! The kube-rs client layer (`sandbox_kube::client`, feature `client`) against a scripted
//! API server: a `tower-test` mock service behind a real `kube::Client`. Each test plays
//! the server's side request by request, asserting method, path, query and body (POSTed
//! and PUT objects must pass the pinned CRD schemas and admission policy), and ends by
//! checking the client made no further request.

mod common;

use std::future::Future;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use sandbox_kube::client::{
    Applied, Bound, Cluster, ClusterError, Outcome, Released, Verb, APPLY_ATTEMPTS,
};
use sandbox_kube::{render, Boundary, Kind, RenderInput, Rendered};
use sandbox_policy::Tier;
use serde_json::{json, Value};
use tower_test::mock::{self, SendResponse};

type Handle = mock::Handle<Request<Body>, Response<Body>>;

const CLAIMS: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims";
const TEMPLATES: &str =
    "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates";
const POOLS: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxwarmpools";

/// A cluster on namespace `default` whose API server is the returned handle.
fn mock_cluster() -> (Cluster, Handle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    (Cluster::new(client, "default"), handle)
}

/// Runs the client side (which drops its cluster when done, closing the mock) against the
/// scripted server side, which must then see no further request.
async fn run<T>(client: impl Future<Output = T>, server: impl Future<Output = Handle>) -> T {
    let server = async {
        let mut handle = server.await;
        if let Some((request, _)) = handle.next_request().await {
            panic!(
                "unexpected extra request: {} {}",
                request.method(),
                request.uri()
            );
        }
    };
    let (out, ()) = tokio::join!(client, server);
    out
}

/// One request as the server sees it.
struct Seen {
    method: Method,
    path: String,
    query: String,
    body: Value,
}

async fn next(handle: &mut Handle) -> (Seen, SendResponse<Response<Body>>) {
    let (request, send) = handle
        .next_request()
        .await
        .expect("the client made no further request");
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let bytes = request
        .into_body()
        .collect_bytes()
        .await
        .expect("request body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("the request body is JSON")
    };
    (
        Seen {
            method,
            path,
            query,
            body,
        },
        send,
    )
}

fn reply(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
    reply_raw(
        send,
        code,
        serde_json::to_vec(body).expect("encode the reply"),
    );
}

fn reply_raw(send: SendResponse<Response<Body>>, code: u16, body: Vec<u8>) {
    let response = Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("build the reply");
    send.send_response(response);
}

/// A `meta/v1` `Status` as the API server writes one for a failure.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

/// Watch events, one JSON object per line, as a watch response streams them.
fn events(events: &[(&str, Value)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, object) in events {
        let line = json!({"type": kind, "object": object});
        out.extend(serde_json::to_vec(&line).expect("encode an event"));
        out.push(b'\n');
    }
    out
}

fn rendered() -> Rendered {
    let input = RenderInput::for_tier(&Tier::low(), "ghcr.io/example/tools:1", Boundary::Gvisor);
    render(&input).expect("render tier low")
}

/// Asserts the object passes the pinned schema (and, for a Sandbox, the policy).
fn assert_valid(kind: Kind, object: &Value) {
    let violations = common::pinned().check_object(kind, object);
    assert!(
        violations.is_empty(),
        "{kind} fails the pinned checks: {violations:?}\n{object:#}"
    );
}

/// The object as the server stores it: the POSTed body plus server-set metadata.
fn stored(mut object: Value, version: &str) -> Value {
    object["metadata"]["resourceVersion"] = json!(version);
    object["metadata"]["uid"] = json!("0b6f3c52-1c1e-4d0e-9a3e-5f2d7f4a9e11");
    object["metadata"]["generation"] = json!(1);
    object
}

/// A claim as the server returns it: not ready (`Some(false)`), ready (`Some(true)`), or
/// with no status yet (`None`).
fn claim(name: &str, version: &str, ready: Option<bool>) -> Value {
    let mut claim = json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": version},
        "spec": {"warmPoolRef": {"name": "low"}, "lifecycle": {"shutdownPolicy": "Delete"}},
    });
    match ready {
        None => {}
        Some(false) => {
            claim["status"] = json!({"conditions": [{
                "type": "Ready", "status": "False", "reason": "SandboxNotReady",
                "message": "pod is pending", "lastTransitionTime": "2026-11-27T05:00:00Z",
            }]});
        }
        Some(true) => {
            claim["status"] = json!({
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "SandboxReady",
                    "message": "sandbox is ready", "lastTransitionTime": "2026-11-27T05:00:01Z",
                }],
                "sandbox": {"name": format!("{name}-sbx"), "podIPs": ["10.0.0.7"]},
            });
        }
    }
    assert_valid(Kind::SandboxClaim, &claim);
    claim
}

fn claim_list(version: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaimList",
        "metadata": {"resourceVersion": version},
        "items": items,
    })
}

/// Asserts a list of claim `name` by field selector (not a watch).
fn assert_list(seen: &Seen, name: &str) {
    assert_eq!(seen.method, Method::GET);
    assert_eq!(seen.path, CLAIMS);
    assert!(
        seen.query
            .contains(&format!("fieldSelector=metadata.name%3D{name}")),
        "{}",
        seen.query
    );
    assert!(!seen.query.contains("watch=true"), "{}", seen.query);
}

/// Asserts a watch of claim `name` from `version`.
fn assert_watch(seen: &Seen, name: &str, version: &str) {
    assert_eq!(seen.method, Method::GET);
    assert_eq!(seen.path, CLAIMS);
    assert!(seen.query.contains("watch=true"), "{}", seen.query);
    assert!(
        seen.query
            .contains(&format!("fieldSelector=metadata.name%3D{name}")),
        "{}",
        seen.query
    );
    assert!(
        seen.query.contains(&format!("resourceVersion={version}&"))
            || seen.query.ends_with(&format!("resourceVersion={version}")),
        "watch from {version}: {}",
        seen.query
    );
}

#[tokio::test]
async fn apply_tier_creates_template_then_warm_pool() {
    let rendered = rendered();
    let template_name = rendered.template.metadata.name.clone().expect("name");
    let pool_name = rendered.warm_pool.metadata.name.clone().expect("name");
    let (cluster, mut handle) = mock_cluster();
    let applied = run(
        async move { cluster.apply_tier(&rendered).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            assert_eq!(
                (&seen.method, seen.path.as_str()),
                (&Method::POST, TEMPLATES)
            );
            assert_eq!(seen.body["kind"], "SandboxTemplate");
            assert_eq!(seen.body["metadata"]["name"], template_name.as_str());
            assert_eq!(seen.body["metadata"]["namespace"], "default");
            assert_valid(Kind::SandboxTemplate, &seen.body);
            reply(send, 201, &stored(seen.body, "10"));

            let (seen, send) = next(&mut handle).await;
            assert_eq!((&seen.method, seen.path.as_str()), (&Method::POST, POOLS));
            assert_eq!(seen.body["kind"], "SandboxWarmPool");
            assert_eq!(seen.body["metadata"]["name"], pool_name.as_str());
            assert_eq!(
                seen.body["spec"]["sandboxTemplateRef"]["name"],
                template_name.as_str()
            );
            assert_valid(Kind::SandboxWarmPool, &seen.body);
            reply(send, 201, &stored(seen.body, "11"));
            handle
        },
    )
    .await
    .expect("apply");
    assert_eq!(
        applied,
        Applied {
            template: Outcome::Created,
            warm_pool: Outcome::Created
        }
    );
}

#[tokio::test]
async fn apply_tier_on_conflict_keeps_the_same_and_replaces_the_changed() {
    let rendered = rendered();
    let template_name = rendered.template.metadata.name.clone().expect("name");
    let pool_name = rendered.warm_pool.metadata.name.clone().expect("name");
    let (cluster, mut handle) = mock_cluster();
    let applied = run(
        async move { cluster.apply_tier(&rendered).await },
        async move {
            // The template exists with the same spec (plus a server default): unchanged.
            let (seen, send) = next(&mut handle).await;
            assert_eq!(
                (&seen.method, seen.path.as_str()),
                (&Method::POST, TEMPLATES)
            );
            let mut same = stored(seen.body, "20");
            same["spec"]["podTemplate"]["spec"]["schedulerName"] = json!("default-scheduler");
            reply(
                send,
                409,
                &status(
                    409,
                    "AlreadyExists",
                    &format!("sandboxtemplates \"{template_name}\" already exists"),
                ),
            );
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::GET);
            assert_eq!(seen.path, format!("{TEMPLATES}/{template_name}"));
            reply(send, 200, &same);

            // The pool exists with other replicas: replaced, from the stored version.
            let (seen, send) = next(&mut handle).await;
            assert_eq!((&seen.method, seen.path.as_str()), (&Method::POST, POOLS));
            let desired_replicas = seen.body["spec"]["replicas"].clone();
            let mut other = stored(seen.body, "21");
            other["spec"]["replicas"] = json!(desired_replicas.as_i64().expect("replicas") + 5);
            reply(
                send,
                409,
                &status(409, "AlreadyExists", "sandboxwarmpools already exists"),
            );
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::GET);
            assert_eq!(seen.path, format!("{POOLS}/{pool_name}"));
            reply(send, 200, &other);

            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::PUT);
            assert_eq!(seen.path, format!("{POOLS}/{pool_name}"));
            assert_eq!(seen.body["metadata"]["resourceVersion"], "21");
            assert_eq!(seen.body["spec"]["replicas"], desired_replicas);
            assert_valid(Kind::SandboxWarmPool, &seen.body);
            reply(send, 200, &stored(seen.body, "22"));
            handle
        },
    )
    .await
    .expect("apply");
    assert_eq!(
        applied,
        Applied {
            template: Outcome::Unchanged,
            warm_pool: Outcome::Replaced
        }
    );
}

#[tokio::test]
async fn apply_tier_rereads_an_object_a_controller_changed_under_it() {
    let rendered = rendered();
    let (cluster, mut handle) = mock_cluster();
    let applied = run(
        async move { cluster.apply_tier(&rendered).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            let mut other = stored(seen.body, "30");
            other["metadata"]["labels"] = json!({"someone": "else"});
            reply(send, 409, &status(409, "AlreadyExists", "exists"));
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &other);
            let (_, send) = next(&mut handle).await;
            reply(
                send,
                409,
                &status(409, "Conflict", "the object has been modified"),
            );
            other["metadata"]["resourceVersion"] = json!("31");
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::GET);
            reply(send, 200, &other);
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::PUT);
            assert_eq!(seen.body["metadata"]["resourceVersion"], "31");
            let body = seen.body.clone();
            reply(send, 200, &body);
            // The warm pool: created.
            let (seen, send) = next(&mut handle).await;
            let body = seen.body.clone();
            reply(send, 201, &body);
            handle
        },
    )
    .await
    .expect("applied on the second read");
    assert_eq!(applied.template, Outcome::Replaced);
    assert_eq!(applied.warm_pool, Outcome::Created);
}

#[tokio::test]
async fn apply_tier_replace_conflict_is_a_typed_conflict() {
    let rendered = rendered();
    let template_name = rendered.template.metadata.name.clone().expect("name");
    let (cluster, mut handle) = mock_cluster();
    let err = run(
        async move { cluster.apply_tier(&rendered).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            let mut other = stored(seen.body, "30");
            other["metadata"]["labels"] = json!({"someone": "else"});
            reply(send, 409, &status(409, "AlreadyExists", "exists"));
            // Each conflict is read again, until the attempts are spent.
            for attempt in 0..APPLY_ATTEMPTS {
                let version = (30 + attempt).to_string();
                other["metadata"]["resourceVersion"] = json!(version);
                let (seen, send) = next(&mut handle).await;
                assert_eq!(seen.method, Method::GET);
                reply(send, 200, &other);
                let (seen, send) = next(&mut handle).await;
                assert_eq!(seen.method, Method::PUT);
                assert_eq!(seen.body["metadata"]["resourceVersion"], json!(version));
                reply(
                    send,
                    409,
                    &status(409, "Conflict", "the object has been modified"),
                );
            }
            // No warm pool request after a failed template.
            handle
        },
    )
    .await
    .expect_err("a conflict on replace");
    match &err {
        ClusterError::Conflict {
            kind: Kind::SandboxTemplate,
            name,
            verb: Verb::Replace,
            reason,
            ..
        } => {
            assert_eq!(name, &template_name);
            assert_eq!(reason, "Conflict");
        }
        other => panic!("not a typed conflict: {other:?}"),
    }
    assert_eq!(err.code(), Some(409));
    assert!(err.to_string().contains(&template_name), "{err}");
}

#[tokio::test]
async fn claim_posts_generate_name_and_returns_the_servers_name() {
    let claim_obj = rendered().claim;
    let (cluster, mut handle) = mock_cluster();
    let name = run(async move { cluster.claim(&claim_obj).await }, async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!((&seen.method, seen.path.as_str()), (&Method::POST, CLAIMS));
        assert_eq!(seen.body["kind"], "SandboxClaim");
        assert!(seen.body["metadata"].get("name").is_none(), "{}", seen.body);
        let prefix = seen.body["metadata"]["generateName"]
            .as_str()
            .expect("generateName");
        assert!(prefix.ends_with('-'), "{prefix}");
        assert!(seen.body.get("status").is_none(), "{}", seen.body);
        assert_valid(Kind::SandboxClaim, &seen.body);
        let mut created = stored(seen.body.clone(), "40");
        created["metadata"]["name"] = json!(format!("{prefix}x7k2p"));
        reply(send, 201, &created);
        handle
    })
    .await
    .expect("claim");
    assert!(name.ends_with("-x7k2p"), "{name}");
}

#[tokio::test]
async fn claim_forbidden_is_typed() {
    let claim_obj = rendered().claim;
    let (cluster, mut handle) = mock_cluster();
    let err = run(async move { cluster.claim(&claim_obj).await }, async move {
        let (_, send) = next(&mut handle).await;
        reply(
            send,
            403,
            &status(
                403,
                "Forbidden",
                "sandboxclaims is forbidden: User \"x\" cannot create",
            ),
        );
        handle
    })
    .await
    .expect_err("forbidden");
    assert!(
        matches!(
            err,
            ClusterError::Forbidden {
                kind: Kind::SandboxClaim,
                verb: Verb::Create,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn get_claim_not_found_is_typed() {
    let (cluster, mut handle) = mock_cluster();
    let err = run(async move { cluster.get_claim("nope").await }, async move {
        let (seen, send) = next(&mut handle).await;
        assert_eq!(seen.method, Method::GET);
        assert_eq!(seen.path, format!("{CLAIMS}/nope"));
        reply(
            send,
            404,
            &status(404, "NotFound", "sandboxclaims \"nope\" not found"),
        );
        handle
    })
    .await
    .expect_err("not found");
    match err {
        ClusterError::NotFound {
            kind: Kind::SandboxClaim,
            ref namespace,
            ref name,
            verb: Verb::Get,
            ..
        } => {
            assert_eq!((namespace.as_str(), name.as_str()), ("default", "nope"));
        }
        other => panic!("not a typed NotFound: {other:?}"),
    }
}

#[tokio::test]
async fn wait_ready_lists_then_watches_until_ready() {
    let (cluster, mut handle) = mock_cluster();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            assert_list(&seen, "c1");
            reply(send, 200, &claim_list("100", vec![claim("c1", "99", None)]));

            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            reply_raw(
                send,
                200,
                events(&[
                    ("ADDED", claim("c1", "101", Some(false))),
                    ("MODIFIED", claim("c1", "102", Some(true))),
                ]),
            );
            handle
        },
    )
    .await
    .expect("ready");
    assert_eq!(
        bound,
        Bound {
            claim: "c1".into(),
            sandbox: "c1-sbx".into(),
            pod_ips: vec!["10.0.0.7".into()],
        }
    );
}

#[tokio::test]
async fn wait_ready_resumes_an_ended_watch_from_the_last_version_or_bookmark() {
    let (cluster, mut handle) = mock_cluster();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &claim_list("100", vec![claim("c1", "99", None)]));

            // The server ends this watch after one event: resume from its version.
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            assert!(
                seen.query.contains("allowWatchBookmarks=true"),
                "{}",
                seen.query
            );
            reply_raw(
                send,
                200,
                events(&[("ADDED", claim("c1", "101", Some(false)))]),
            );

            // And this one after a bookmark: resume from the bookmark, no re-list.
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "101");
            let bookmark = json!({
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxClaim",
                "metadata": {"resourceVersion": "150"},
            });
            reply_raw(send, 200, events(&[("BOOKMARK", bookmark)]));

            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "150");
            reply_raw(
                send,
                200,
                events(&[("MODIFIED", claim("c1", "151", Some(true)))]),
            );
            handle
        },
    )
    .await
    .expect("ready");
    assert_eq!(bound.sandbox, "c1-sbx");
}

#[tokio::test]
async fn wait_ready_pauses_then_rewatches_after_an_empty_watch() {
    let (cluster, mut handle) = mock_cluster();
    let started = std::time::Instant::now();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &claim_list("100", vec![claim("c1", "99", None)]));
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            reply_raw(send, 200, Vec::new());
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            reply_raw(
                send,
                200,
                events(&[("MODIFIED", claim("c1", "101", Some(true)))]),
            );
            handle
        },
    )
    .await
    .expect("ready");
    assert_eq!(bound.sandbox, "c1-sbx");
    assert!(started.elapsed() >= sandbox_kube::client::EMPTY_WATCH_PAUSE);
}

#[tokio::test]
async fn wait_ready_already_ready_needs_no_watch() {
    let (cluster, mut handle) = mock_cluster();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            assert_list(&seen, "c1");
            reply(
                send,
                200,
                &claim_list("100", vec![claim("c1", "99", Some(true))]),
            );
            handle
        },
    )
    .await
    .expect("ready");
    assert_eq!(bound.sandbox, "c1-sbx");
}

#[tokio::test]
async fn wait_ready_relists_after_watch_expiry() {
    let (cluster, mut handle) = mock_cluster();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (seen, send) = next(&mut handle).await;
            assert_list(&seen, "c1");
            reply(
                send,
                200,
                &claim_list("100", vec![claim("c1", "99", Some(false))]),
            );

            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            reply_raw(
                send,
                200,
                events(&[(
                    "ERROR",
                    status(410, "Expired", "too old resource version: 100 (200)"),
                )]),
            );

            // Re-list, then watch from the new list's version.
            let (seen, send) = next(&mut handle).await;
            assert_list(&seen, "c1");
            reply(
                send,
                200,
                &claim_list("200", vec![claim("c1", "199", Some(false))]),
            );
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "200");
            reply_raw(
                send,
                200,
                events(&[("MODIFIED", claim("c1", "201", Some(true)))]),
            );
            handle
        },
    )
    .await
    .expect("ready after re-list");
    assert_eq!(bound.sandbox, "c1-sbx");
}

#[tokio::test]
async fn wait_ready_relists_when_the_watch_request_is_gone() {
    let (cluster, mut handle) = mock_cluster();
    let bound = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &claim_list("100", vec![claim("c1", "99", None)]));
            let (seen, send) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            reply(send, 410, &status(410, "Gone", "too old resource version"));
            let (seen, send) = next(&mut handle).await;
            assert_list(&seen, "c1");
            reply(
                send,
                200,
                &claim_list("300", vec![claim("c1", "300", Some(true))]),
            );
            handle
        },
    )
    .await
    .expect("ready after re-list");
    assert_eq!(bound.claim, "c1");
}

#[tokio::test]
async fn wait_ready_gives_up_after_repeated_expiry() {
    let (cluster, mut handle) = mock_cluster();
    let err = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            for i in 0..sandbox_kube::client::MAX_EXPIRED_WATCHES {
                let version = format!("{}", 100 + i);
                let (seen, send) = next(&mut handle).await;
                assert_list(&seen, "c1");
                reply(
                    send,
                    200,
                    &claim_list(&version, vec![claim("c1", "1", None)]),
                );
                let (seen, send) = next(&mut handle).await;
                assert_watch(&seen, "c1", &version);
                reply_raw(
                    send,
                    200,
                    events(&[("ERROR", status(410, "Expired", "too old resource version"))]),
                );
            }
            handle
        },
    )
    .await
    .expect_err("expired");
    assert!(
        matches!(err, ClusterError::WatchExpired { times, .. } if times == sandbox_kube::client::MAX_EXPIRED_WATCHES),
        "{err:?}"
    );
}

#[tokio::test]
async fn wait_ready_times_out_with_a_typed_error() {
    let (cluster, mut handle) = mock_cluster();
    let err = run(
        async move { cluster.wait_ready("c1", Duration::from_millis(300)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(
                send,
                200,
                &claim_list("100", vec![claim("c1", "99", Some(false))]),
            );
            // The watch never answers (its response is never sent nor dropped, which
            // would fail the request): the client gives up at its deadline.
            let (seen, pending) = next(&mut handle).await;
            assert_watch(&seen, "c1", "100");
            std::mem::forget(pending);
            handle
        },
    )
    .await
    .expect_err("timeout");
    match err {
        ClusterError::Timeout {
            ref name,
            after,
            ref last_ready,
            ..
        } => {
            assert_eq!(name, "c1");
            assert_eq!(after, Duration::from_millis(300));
            let last = last_ready.as_deref().expect("last Ready condition");
            assert!(last.contains("SandboxNotReady"), "{last}");
        }
        other => panic!("not a typed timeout: {other:?}"),
    }
}

#[tokio::test]
async fn wait_ready_missing_or_deleted_claim() {
    let (cluster, mut handle) = mock_cluster();
    let err = run(
        async move { cluster.wait_ready("gone", Duration::from_secs(30)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &claim_list("5", vec![]));
            handle
        },
    )
    .await
    .expect_err("missing");
    assert!(
        matches!(
            err,
            ClusterError::NotFound {
                kind: Kind::SandboxClaim,
                ..
            }
        ),
        "{err:?}"
    );

    let (cluster, mut handle) = mock_cluster();
    let err = run(
        async move { cluster.wait_ready("c1", Duration::from_secs(30)).await },
        async move {
            let (_, send) = next(&mut handle).await;
            reply(send, 200, &claim_list("5", vec![claim("c1", "5", None)]));
            let (_, send) = next(&mut handle).await;
            reply_raw(send, 200, events(&[("DELETED", claim("c1", "6", None))]));
            handle
        },
    )
    .await
    .expect_err("deleted");
    assert!(matches!(err, ClusterError::Deleted { .. }), "{err:?}");
}

#[tokio::test]
async fn release_twice_is_ok_both_times() {
    let (cluster, mut handle) = mock_cluster();
    let released = run(
        async move {
            let first = cluster.release("c1").await;
            let second = cluster.release("c1").await;
            (first, second)
        },
        async move {
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::DELETE);
            assert_eq!(seen.path, format!("{CLAIMS}/c1"));
            assert_eq!(seen.body["propagationPolicy"], "Background");
            reply(
                send,
                200,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Success", "details": {"name": "c1", "kind": "sandboxclaims"}}),
            );
            let (seen, send) = next(&mut handle).await;
            assert_eq!(seen.method, Method::DELETE);
            assert_eq!(seen.path, format!("{CLAIMS}/c1"));
            reply(
                send,
                404,
                &status(404, "NotFound", "sandboxclaims \"c1\" not found"),
            );
            handle
        },
    )
    .await;
    assert_eq!(released.0.expect("first delete"), Released::Deleted);
    assert_eq!(released.1.expect("second delete"), Released::AlreadyGone);
}

#[tokio::test]
async fn release_other_failures_are_errors() {
    let (cluster, mut handle) = mock_cluster();
    let err = run(async move { cluster.release("c1").await }, async move {
        let (_, send) = next(&mut handle).await;
        reply(send, 500, &status(500, "InternalError", "etcd unavailable"));
        handle
    })
    .await
    .expect_err("500");
    assert!(
        matches!(
            err,
            ClusterError::Api {
                code: 500,
                verb: Verb::Delete,
                ..
            }
        ),
        "{err:?}"
    );
}
