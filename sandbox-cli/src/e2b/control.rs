//! E2B's control-plane REST API (`../shared/e2b/openapi.yml`): create, list, get, kill,
//! timeout, refresh, pause, resume/connect and metrics of sandboxes. Every call carries an
//! API key (`X-API-KEY`, or `Authorization: Bearer`), compared in constant time; a key sees
//! only the sandboxes it made.
//!
//! Snapshots and fork are in [`super::snapshots`]. Not served (answered 501 naming what is
//! missing): template builds, volumes, logs, secrets, teams and admin calls.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use strata::{BackendKind, Error, ErrorKind, Net, NetRule};

use super::http::{self, Body};
use super::registry::{self, Entry, DEFAULT_TIMEOUT_S, ENVD_VERSION, MAX_TIMEOUT_S};
use super::{snapshots, Server, MAX_BODY};

/// The template every sandbox is made from (the host userland on the configured backend).
pub const BASE_TEMPLATE: &str = "base";

/// A request body of `POST /sandboxes` (the spec's `NewSandbox`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    /// Accepted either way: every sandbox here is secure (envd calls always need its
    /// access token, and file URLs need a signature).
    #[serde(rename = "secure")]
    _secure: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkConfig>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    mcp: Option<Value>,
    iam: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
    auto_resume: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkConfig {
    allow_public_traffic: Option<bool>,
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    egress_proxy: Option<Value>,
    mask_request_host: Option<String>,
    rules: Option<Value>,
}

#[derive(Deserialize, Default)]
struct Timeout {
    timeout: Option<i64>,
}

#[derive(Deserialize, Default)]
struct Refresh {
    duration: Option<i64>,
}

/// Serves one control call.
pub async fn handle(server: Arc<Server>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().trim_end_matches('/').to_string();
    if method == Method::GET && path == "/health" {
        return http::empty(StatusCode::OK);
    }
    let Some(key) = api_key(request.headers()).and_then(|k| server.registry.key_index(k)) else {
        return http::rest_error(
            StatusCode::UNAUTHORIZED,
            "a missing or unknown API key (send X-API-KEY: the key this server was started with)",
        );
    };
    let query = http::query(request.uri());
    let headers = request.headers().clone();
    let body = match http::read_body(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(e) => return e.response(),
    };
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let result = match (method.clone(), parts.as_slice()) {
        (Method::POST, ["sandboxes"]) | (Method::POST, ["v2", "sandboxes"]) => {
            create(&server, key, &headers, &body).await
        }
        (Method::GET, ["sandboxes"]) => Ok(list(&server, key, &query, false)),
        (Method::GET, ["v2", "sandboxes"]) => Ok(list(&server, key, &query, true)),
        (Method::GET, ["sandboxes", id]) => found(&server, key, id).map(|e| detail(&server, &e)),
        (Method::DELETE, ["sandboxes", id]) => kill(&server, key, id).await,
        (Method::POST, ["sandboxes", id, "timeout"]) => set_timeout(&server, key, id, &body),
        (Method::POST, ["sandboxes", id, "refreshes"]) => refresh(&server, key, id, &body),
        (Method::POST, ["sandboxes", id, "pause"]) => pause(&server, key, id).await,
        (Method::POST, ["sandboxes", id, "resume"]) => resume(&server, key, id, &body, false).await,
        (Method::POST, ["sandboxes", id, "connect"])
        | (Method::POST, ["v2", "sandboxes", id, "connect"]) => {
            resume(&server, key, id, &body, true).await
        }
        (Method::GET, ["sandboxes", id, "metrics"]) => metrics(&server, key, id).await,
        (Method::POST, ["sandboxes", id, "snapshots"]) => {
            snapshots::create(&server, key, id, &body).await
        }
        (Method::GET, ["snapshots"]) => snapshots::list(&server, key, &query).await,
        (Method::DELETE, ["templates", template]) => {
            snapshots::delete(&server, key, &http::decode(template)).await
        }
        (Method::POST, ["sandboxes", id, "fork"]) => snapshots::fork(&server, key, id, &body).await,
        (_, ["sandboxes", _, "logs" | "network"])
        | (_, ["v2", "sandboxes", _, "logs"])
        | (_, ["snapshots" | "templates" | "volumes" | "secrets" | "teams" | "v2" | "v3", ..]) => {
            Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                format!(
                    "{method} {path}: not served by strata serve --e2b (template builds, \
                     volumes, logs, secrets and teams are E2B cloud features; see \
                     docs/frameworks/e2b.md)"
                ),
            ))
        }
        _ => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("{method} {path}: no such endpoint"),
        )),
    };
    match result {
        Ok(response) => response,
        Err(refusal) => http::rest_error(refusal.status, refusal.message),
    }
}

/// A refused control call: its status and a message naming the problem.
pub(super) struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }

    pub(super) fn bad(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<Error> for Refusal {
    fn from(error: Error) -> Refusal {
        let status = match error.kind() {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Denied => StatusCode::FORBIDDEN,
            ErrorKind::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable | ErrorKind::Unenforceable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Refusal::new(status, error.to_string())
    }
}

pub(super) type Answer = Result<Response<Body>, Refusal>;

fn api_key(headers: &hyper::HeaderMap) -> Option<&str> {
    http::header(headers, "x-api-key").or_else(|| {
        http::header(headers, "authorization").and_then(|value| value.strip_prefix("Bearer "))
    })
}

pub(super) fn found(server: &Server, key: usize, id: &str) -> Result<Arc<Entry>, Refusal> {
    server.registry.get(key, id).ok_or_else(|| {
        Refusal::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} not found (killed, timed out, or made with another key)"),
        )
    })
}

pub(super) fn parse<T: for<'de> Deserialize<'de> + Default>(body: &[u8]) -> Result<T, Refusal> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| Refusal::bad(format!("the request body: {e}")))
}

/// A timeout in seconds from a request: 0 to [`MAX_TIMEOUT_S`].
pub(super) fn seconds(field: &str, value: Option<i64>, default: u64) -> Result<Duration, Refusal> {
    match value {
        None => Ok(Duration::from_secs(default)),
        Some(s) if (0..=MAX_TIMEOUT_S as i64).contains(&s) => {
            Ok(Duration::from_secs(s.unsigned_abs()))
        }
        Some(s) => Err(Refusal::bad(format!(
            "{field} {s}: seconds from 0 to {MAX_TIMEOUT_S}"
        ))),
    }
}

/// The network a sandbox gets: the profile's, narrowed as the request asks. A request can
/// only narrow: to nothing (`allow_internet_access: false`, or `denyOut: ["0.0.0.0/0"]`),
/// or to an allowlist within the profile's network.
fn network(profile: &Net, request: &NewSandbox) -> Result<Option<Net>, Refusal> {
    let config = request.network.as_ref();
    if let Some(config) = config {
        for (name, set) in [
            ("egressProxy", config.egress_proxy.is_some()),
            ("maskRequestHost", config.mask_request_host.is_some()),
            ("rules", config.rules.is_some()),
        ] {
            if set {
                return Err(Refusal::bad(format!(
                    "network.{name}: not supported by strata serve (egress is the profile's \
                     network, narrowed by allowOut and denyOut)"
                )));
            }
        }
    }
    let deny_all = request.allow_internet_access == Some(false)
        || config
            .and_then(|c| c.deny_out.as_ref())
            .is_some_and(|deny| deny.iter().any(|d| d == "0.0.0.0/0" || d == "::/0"));
    let allow: Vec<String> = config.and_then(|c| c.allow_out.clone()).unwrap_or_default();
    if let Some(deny) = config.and_then(|c| c.deny_out.as_ref()) {
        if let Some(other) = deny.iter().find(|d| *d != "0.0.0.0/0" && *d != "::/0") {
            return Err(Refusal::bad(format!(
                "network.denyOut {other:?}: only 0.0.0.0/0 (deny everything not in allowOut) \
                 is supported; Strata's network is an allowlist"
            )));
        }
    }
    if allow.is_empty() {
        return Ok(deny_all.then_some(Net::None));
    }
    let rules = allow
        .iter()
        .map(|text| text.parse::<NetRule>())
        .collect::<Result<Vec<NetRule>, Error>>()?;
    let within = match profile {
        Net::Host => true,
        Net::Allow(allowed) => rules.iter().all(|rule| allowed.contains(rule)),
        _ => false,
    };
    if !within {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!(
                "network.allowOut {allow:?}: beyond the server's profile network ({profile}); a \
                 client can only narrow it"
            ),
        ));
    }
    Ok(Some(Net::Allow(rules)))
}

async fn create(
    server: &Arc<Server>,
    key: usize,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Answer {
    let request: NewSandbox = parse(body)?;
    let template = request
        .template_id
        .clone()
        .unwrap_or_else(|| BASE_TEMPLATE.into());
    for (name, set) in [
        ("mcp", request.mcp.as_ref().is_some_and(|v| !v.is_null())),
        ("iam", request.iam.as_ref().is_some_and(|v| !v.is_null())),
        (
            "volumeMounts",
            request
                .volume_mounts
                .as_ref()
                .is_some_and(|v| !v.is_empty()),
        ),
        ("autoPauseMemory", request.auto_pause_memory == Some(true)),
        (
            "autoResume",
            request.auto_resume.as_ref().is_some_and(|v| !v.is_null()),
        ),
    ] {
        if set {
            return Err(Refusal::bad(format!(
                "{name}: not supported by strata serve --e2b (see docs/frameworks/e2b.md)"
            )));
        }
    }
    let timeout = seconds("timeout", request.timeout, DEFAULT_TIMEOUT_S)?;
    let settings = &server.registry.settings;
    let profile_net = settings
        .template(&template)
        .map_or(&settings.base().caps.net, |t| &t.caps.net);
    let net = network(profile_net, &request)?;
    let env = request.env_vars.clone().unwrap_or_default();
    let metadata = request.metadata.clone().unwrap_or_default();
    if metadata.len() > 64
        || metadata
            .iter()
            .any(|(k, v)| k.len() > 256 || v.len() > 4096)
    {
        return Err(Refusal::bad(
            "metadata: at most 64 entries, keys of at most 256 and values of 4096 bytes",
        ));
    }
    let origin = if let Some(chosen) = settings.template(&template) {
        Origin::Base(Box::new(server.registry.template_caps(chosen, &env, net)?))
    } else {
        if !env.is_empty() || net.is_some() {
            return Err(Refusal::bad(format!(
                "template {template:?} is a snapshot: a sandbox started from it has the \
                 snapshot's caps (its environment and network); drop envVars and network"
            )));
        }
        Origin::Snapshot(snapshots::find(server, key, &template).await?)
    };
    let internet = match &origin {
        Origin::Base(caps) => !matches!(caps.net, Net::None),
        Origin::Snapshot(found) => found.internet,
    };
    let idempotency = http::header(headers, "idempotency-key").map(String::from);
    if let Some(token) = &idempotency {
        if let Some(existing) = server
            .registry
            .of_key(key)
            .into_iter()
            .find(|e| e.idempotency.as_deref() == Some(token.as_str()))
        {
            return Ok(http::json(StatusCode::CREATED, &created(server, &existing)));
        }
    }
    let reservation = server
        .registry
        .reserve(key)
        .map_err(|message| Refusal::new(StatusCode::TOO_MANY_REQUESTS, message))?;
    let id = new_id()?;
    server.audit(
        "e2b.create",
        "granted",
        format!(
            "sandbox {id} key {key} template {template} {}",
            origin.describe()
        ),
    )?;
    let starting = server.clone();
    let template_name = template.clone();
    let live = tokio::task::spawn_blocking(move || {
        let registry = &starting.registry;
        // A snapshot is admitted under the base template's tier, on its own backend.
        let chosen = registry
            .settings
            .template(&template_name)
            .unwrap_or_else(|| registry.settings.base());
        let options = registry.start_options(chosen);
        let live = match origin {
            Origin::Base(caps) => chosen.sandbox.start(&caps, options)?,
            Origin::Snapshot(found) => {
                chosen
                    .sandbox
                    .start_from(&found.store, &found.name, options)?
            }
        };
        if live.info().backend == BackendKind::Microvm {
            // The guest's root is its image: the base template's home is made in it (the
            // process and container backends make the working directory themselves).
            if let Err(error) = live.mkdir(registry::HOME, true) {
                let _ = live.stop_shared();
                return Err(error);
            }
        }
        Ok(live)
    })
    .await
    .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("start: {e}")))??;
    let entry = server.registry.insert(new_entry(NewEntry {
        id,
        key,
        template,
        metadata,
        idempotency,
        internet,
        auto_pause: request.auto_pause.unwrap_or(false),
        public: public_traffic(&request),
        timeout,
        live,
    })?);
    drop(reservation);
    Ok(http::json(StatusCode::CREATED, &created(server, &entry)))
}

/// What a new sandbox starts from.
enum Origin {
    /// The base template, with these caps.
    Base(Box<strata::Caps>),
    /// A snapshot of this key.
    Snapshot(snapshots::Found),
}

impl Origin {
    fn describe(&self) -> String {
        match self {
            Origin::Base(caps) => format!("net {}", caps.net),
            Origin::Snapshot(found) => format!("from snapshot {}", found.name),
        }
    }
}

/// A new sandbox id: `i` and 20 hex digits (a DNS label, as `get_host` needs).
pub(super) fn new_id() -> Result<String, Error> {
    Ok(format!("i{}", registry::random_hex(10)?))
}

/// What [`new_entry`] needs besides the fresh tokens.
pub(super) struct NewEntry {
    pub id: String,
    pub key: usize,
    pub template: String,
    pub metadata: BTreeMap<String, String>,
    pub idempotency: Option<String>,
    pub internet: bool,
    pub auto_pause: bool,
    /// Its ports answer without a traffic token (`allowPublicTraffic`, default true).
    pub public: bool,
    pub timeout: Duration,
    pub live: strata::live::LiveSandbox,
}

/// The registry entry of a started sandbox, with its access token (and traffic token when
/// its ports are not public) made now.
pub(super) fn new_entry(new: NewEntry) -> Result<Entry, Error> {
    let now = SystemTime::now();
    Ok(Entry {
        id: new.id,
        key: new.key,
        template: new.template,
        metadata: new.metadata,
        access_token: registry::random_hex(24)?,
        idempotency: new.idempotency,
        internet: new.internet,
        auto_pause: new.auto_pause,
        started_at: now,
        end_at: std::sync::Mutex::new(now + new.timeout),
        paused: std::sync::atomic::AtomicBool::new(false),
        live: new.live,
        processes: Default::default(),
        watchers: Default::default(),
        streams: Arc::new(tokio::sync::Semaphore::new(registry::MAX_STREAMS)),
        ports: Default::default(),
        traffic_token: if new.public {
            None
        } else {
            Some(registry::random_hex(24)?)
        },
    })
}

/// `network.allowPublicTraffic` (default true, as E2B's): whether the sandbox's ports
/// answer whoever reaches this server, or only requests with its traffic access token.
fn public_traffic(request: &NewSandbox) -> bool {
    request
        .network
        .as_ref()
        .and_then(|n| n.allow_public_traffic)
        .unwrap_or(true)
}

/// The spec's `Sandbox`: what a create, resume or connect answers.
pub(super) fn created(server: &Server, entry: &Entry) -> Value {
    let domain = &server.domain;
    json!({
        "templateID": entry.template,
        "sandboxID": entry.id,
        "clientID": "strata",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": entry.access_token,
        "trafficAccessToken": entry.traffic_token,
        "domain": domain,
        "alias": entry.template,
    })
}

fn state(entry: &Entry) -> &'static str {
    if entry.paused.load(Ordering::SeqCst) {
        "paused"
    } else {
        "running"
    }
}

/// The spec's `ListedSandbox` (and, with more fields, `SandboxDetail`).
fn listed(entry: &Entry) -> Value {
    json!({
        "templateID": entry.template,
        "alias": entry.template,
        "sandboxID": entry.id,
        "clientID": "strata",
        "startedAt": registry::rfc3339(entry.started_at),
        "endAt": registry::rfc3339(entry.end_at()),
        "cpuCount": 1,
        "memoryMB": 0,
        "diskSizeMB": 0,
        "metadata": entry.metadata,
        "state": state(entry),
        "envdVersion": ENVD_VERSION,
    })
}

fn detail(server: &Server, entry: &Entry) -> Response<Body> {
    let mut value = listed(entry);
    if let Value::Object(map) = &mut value {
        map.insert("envdAccessToken".into(), json!(entry.access_token));
        map.insert("domain".into(), json!(server.domain));
        map.insert("allowInternetAccess".into(), json!(entry.internet));
        map.insert(
            "lifecycle".into(),
            json!({ "autoResume": false, "onTimeout": if entry.auto_pause { "pause" } else { "kill" } }),
        );
    }
    http::json(StatusCode::OK, &value)
}

/// `GET /sandboxes` and `/v2/sandboxes`: this key's sandboxes, filtered by `metadata`
/// (URL-encoded `k=v&k2=v2`, all must match) and, on v2, `state`, in pages of `limit`
/// (default 100) after `nextToken` (the last id of the previous page).
fn list(server: &Server, key: usize, query: &BTreeMap<String, String>, v2: bool) -> Response<Body> {
    let wanted: Vec<(String, String)> = query
        .get("metadata")
        .map(|text| http::pairs(text))
        .unwrap_or_default();
    let states: Vec<String> = match (v2, query.get("state")) {
        (true, Some(text)) => text.split(',').map(String::from).collect(),
        _ => vec!["running".into(), "paused".into()],
    };
    let mut entries: Vec<Arc<Entry>> = server
        .registry
        .of_key(key)
        .into_iter()
        .filter(|e| {
            wanted
                .iter()
                .all(|(k, v)| e.metadata.get(k).is_some_and(|have| have == v))
        })
        .filter(|e| states.iter().any(|s| s == state(e)))
        .collect();
    entries.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
    if !v2 {
        let all: Vec<Value> = entries.iter().map(|e| listed(e)).collect();
        return http::json(StatusCode::OK, &Value::Array(all));
    }
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let after = query.get("nextToken").cloned();
    let start = match &after {
        Some(token) => entries
            .iter()
            .position(|e| &e.id == token)
            .map_or(entries.len(), |i| i + 1),
        None => 0,
    };
    let page: Vec<&Arc<Entry>> = entries.iter().skip(start).take(limit).collect();
    let more = start + page.len() < entries.len();
    let values: Vec<Value> = page.iter().map(|e| listed(e)).collect();
    let mut response = http::json(StatusCode::OK, &Value::Array(values));
    if more {
        if let Some(Ok(value)) = page.last().map(|e| e.id.parse()) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    response
}

async fn kill(server: &Arc<Server>, key: usize, id: &str) -> Answer {
    found(server, key, id)?;
    server.audit("e2b.kill", "granted", format!("sandbox {id}"))?;
    let Some(entry) = server.registry.remove(id) else {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {id} not found"),
        ));
    };
    let _ = tokio::task::spawn_blocking(move || super::stop_entry(&entry)).await;
    Ok(http::empty(StatusCode::NO_CONTENT))
}

fn set_timeout(server: &Server, key: usize, id: &str, body: &[u8]) -> Answer {
    let entry = found(server, key, id)?;
    let asked: Timeout = parse(body)?;
    let Some(seconds_asked) = asked.timeout else {
        return Err(Refusal::bad("timeout: required (seconds)"));
    };
    let timeout = seconds("timeout", Some(seconds_asked), 0)?;
    server.audit(
        "e2b.timeout",
        "granted",
        format!("sandbox {id} {seconds_asked} s"),
    )?;
    entry.set_timeout(timeout);
    Ok(http::empty(StatusCode::NO_CONTENT))
}

fn refresh(server: &Server, key: usize, id: &str, body: &[u8]) -> Answer {
    let entry = found(server, key, id)?;
    let asked: Refresh = parse(body)?;
    let timeout = seconds("duration", asked.duration, DEFAULT_TIMEOUT_S)?;
    entry.extend(timeout);
    Ok(http::empty(StatusCode::NO_CONTENT))
}

async fn pause(server: &Arc<Server>, key: usize, id: &str) -> Answer {
    let entry = found(server, key, id)?;
    if entry.paused.load(Ordering::SeqCst) {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    server.audit("e2b.pause", "granted", format!("sandbox {id}"))?;
    let pausing = entry.clone();
    tokio::task::spawn_blocking(move || pausing.live.pause())
        .await
        .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("pause: {e}")))??;
    entry.paused.store(true, Ordering::SeqCst);
    Ok(http::empty(StatusCode::NO_CONTENT))
}

/// `resume` (409 when running) and `connect` (resumes a paused sandbox; 200 when it was
/// running, 201 when it was resumed): both move the end time to `timeout` from now if later.
async fn resume(server: &Arc<Server>, key: usize, id: &str, body: &[u8], connect: bool) -> Answer {
    let entry = found(server, key, id)?;
    let asked: Timeout = parse(body)?;
    let timeout = seconds("timeout", asked.timeout, DEFAULT_TIMEOUT_S)?;
    let was_paused = entry.paused.load(Ordering::SeqCst);
    if !was_paused && !connect {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is running, not paused"),
        ));
    }
    if was_paused {
        server.audit("e2b.resume", "granted", format!("sandbox {id}"))?;
        let resuming = entry.clone();
        tokio::task::spawn_blocking(move || resuming.live.resume())
            .await
            .map_err(|e| {
                Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("resume: {e}"))
            })??;
        entry.paused.store(false, Ordering::SeqCst);
    }
    entry.extend(timeout);
    let status = if was_paused || !connect {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(http::json(status, &created(server, &entry)))
}

/// `GET /sandboxes/{id}/metrics`: one sample now. CPU use is the sandbox's average since
/// it started, from its cgroup's CPU time (0 where the backend has no cgroup); memory and
/// disk use are not measured by live sandboxes yet and are reported as 0.
async fn metrics(server: &Arc<Server>, key: usize, id: &str) -> Answer {
    let entry = found(server, key, id)?;
    let asking = entry.clone();
    let info = tokio::task::spawn_blocking(move || asking.live.refresh())
        .await
        .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("metrics: {e}")))??;
    let now = SystemTime::now();
    let alive_us = now
        .duration_since(entry.started_at)
        .map_or(1, |d| d.as_micros().max(1)) as f64;
    let cpu_pct = info.cpu_us.map_or(0.0, |us| us as f64 / alive_us * 100.0);
    let settings = &server.registry.settings;
    let caps = &settings
        .template(&entry.template)
        .unwrap_or_else(|| settings.base())
        .caps;
    let sample = json!({
        "timestamp": registry::rfc3339(now),
        "timestampUnix": registry::unix_seconds(now),
        "cpuCount": caps.limits.cpus.ceil().max(1.0) as u64,
        "cpuUsedPct": (cpu_pct * 100.0).round() / 100.0,
        "memUsed": 0,
        "memTotal": caps.limits.memory.0,
        "memCache": 0,
        "diskUsed": 0,
        "diskTotal": caps.limits.disk.0,
    });
    Ok(http::json(StatusCode::OK, &json!([sample])))
}
