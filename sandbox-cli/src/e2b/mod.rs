//! `strata serve --e2b ADDR`: an E2B-compatible server. The official E2B SDKs (`pip
//! install e2b`, `npm install e2b`) drive Strata's live sandboxes through it with
//! `E2B_API_URL=http://ADDR E2B_SANDBOX_URL=http://ADDR E2B_API_KEY=KEY` and no other change.
//!
//! One address serves both of E2B's APIs: the control plane's REST API
//! (`../shared/e2b/openapi.yml`: [`control`]) and each sandbox's daemon, envd (the
//! Connect-RPC process and filesystem services, [`process`] and [`filesystem`], and the
//! HTTP `/files`, `/health` and `/init` endpoints, [`files`]). The SDKs send envd calls with
//! an `E2b-Sandbox-Id` header when `E2B_SANDBOX_URL` is set; that header routes them (a
//! signed file URL, fetched without it, is routed by its signature).
//!
//! Every E2B sandbox is a Strata live sandbox with the server's profile's caps (a client can
//! only narrow its network), owned by this process: they all end when it does.
//!
//! Limits: at most `--max-sandboxes` per API key (default 16), request bodies of at most
//! [`MAX_BODY`] (uploads [`files::MAX_UPLOAD`]), [`registry::MAX_STREAMS`] open streams per
//! sandbox. Every control call and every envd call that changes something is recorded in
//! the profile's audit log (when it has one).

mod connect;
mod control;
mod files;
mod filesystem;
mod http;
mod ports;
mod process;
mod registry;
mod snapshots;

use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use strata::audit::AuditEvent;
use strata::{BackendChoice, BackendKind, Error, Profile, Sandbox};

use crate::args::ServeArgs;
use connect::{Code, RpcError};
use http::Body;
use registry::{Entry, Registry, Settings, Template};

/// The largest request body of a control or RPC call.
pub const MAX_BODY: usize = 4 << 20;

/// How often the reaper looks for sandboxes past their end time.
const REAP_EVERY: Duration = Duration::from_millis(500);

/// The server: its sandboxes.
pub struct Server {
    pub registry: Registry,
    /// The domain sandboxes report (`get_host(port)` is `PORT-ID.DOMAIN`).
    pub domain: String,
}

impl Server {
    /// Records `decision` about `subject` (`e2b.create`, `e2b.process.start`, ...) in the
    /// profile's audit log, before the call takes effect.
    pub fn audit(&self, subject: &str, decision: &str, detail: String) -> Result<(), Error> {
        self.registry
            .settings
            .base()
            .sandbox
            .audit(AuditEvent::Policy {
                subject: subject.into(),
                decision: decision.into(),
                detail,
            })
    }
}

/// `strata serve`: serves until SIGINT or SIGTERM, then stops every sandbox. Exit 0 then;
/// 2 for a bad profile, key or address, 125 when the server cannot start.
pub fn main(args: ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-serve")
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("strata serve: cannot start the async runtime: {e}");
            return ExitCode::from(125);
        }
    };
    let result = runtime.block_on(serve(args));
    runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata serve: {e}");
            crate::error_code(&e)
        }
    }
}

fn settings(args: &ServeArgs) -> Result<Settings, Error> {
    let backend = match args.backend.as_str() {
        "process" => BackendKind::Process,
        "container" => BackendKind::Container,
        "microvm" => BackendKind::Microvm,
        other => {
            return Err(Error::invalid(format!(
                "--backend {other}: the E2B server runs live sandboxes on process, container \
                 or microvm"
            )))
        }
    };
    let mut templates = std::collections::BTreeMap::new();
    let base = match &args.profile {
        Some(path) => Profile::load(path)?,
        None => Profile::default(),
    };
    let base = template(control::BASE_TEMPLATE, &base, backend, false)?;
    for spec in &args.templates {
        let (name, path) = spec.split_once('=').ok_or_else(|| {
            Error::invalid(format!(
                "--template {spec:?}: NAME=PROFILE (e.g. py=py.toml)"
            ))
        })?;
        if !valid_template_name(name) {
            return Err(Error::invalid(format!(
                "--template {name:?}: a name of 1-64 of a-z 0-9 - _ (not starting with -)"
            )));
        }
        if name == control::BASE_TEMPLATE || templates.contains_key(name) {
            return Err(Error::invalid(format!(
                "--template {name:?}: given twice (\"base\" is --profile's)"
            )));
        }
        let profile = Profile::load(std::path::Path::new(path))?;
        templates.insert(name.to_string(), template(name, &profile, backend, true)?);
    }
    let keys = api_keys(args)?;
    let snapshot_dir = match &args.snapshot_dir {
        Some(dir) => dir.clone(),
        None => strata::live::SnapshotStore::open_default()?
            .dir()
            .join("e2b"),
    };
    Ok(Settings {
        base,
        templates,
        keys,
        max_per_key: args.max_sandboxes as usize,
        snapshot_dir,
    })
}

/// Whether `name` can be a template's name (as E2B's aliases: lowercase, digits, - and _).
fn valid_template_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The template `name` of `profile`: on the container backend when the profile names an
/// image and `image_picks_backend` (a `--template`), else on `backend`.
fn template(
    name: &str,
    profile: &Profile,
    backend: BackendKind,
    image_picks_backend: bool,
) -> Result<Template, Error> {
    profile.caps.validate()?;
    let backend = if profile.caps.container.is_some() && image_picks_backend {
        BackendKind::Container
    } else {
        backend
    };
    if profile.caps.container.is_some() && backend != BackendKind::Container {
        return Err(Error::invalid(format!(
            "template {name:?}: the profile names an image, which only the container backend \
             runs: pass --backend container (the {backend} backend's base template is the host \
             userland)"
        )));
    }
    if profile.caps.container.is_none() && backend == BackendKind::Container {
        return Err(Error::invalid(format!(
            "template {name:?}: --backend container needs an image: name one in the profile \
             ([caps.container] image = \"...\")"
        )));
    }
    let sandbox = profile
        .apply(Sandbox::builder())
        .backend(BackendChoice::Only(backend))
        .build()?;
    Ok(Template {
        sandbox,
        caps: profile.caps.clone(),
        backend,
        strictness: profile.strictness,
    })
}

/// The API keys: `--api-key`, or each non-empty line of `--api-key-file`, else
/// `$E2B_API_KEY`. At least 16 characters each.
fn api_keys(args: &ServeArgs) -> Result<Vec<[u8; 32]>, Error> {
    let mut keys: Vec<String> = Vec::new();
    if let Some(key) = &args.api_key {
        keys.push(key.clone());
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid(format!("--api-key-file {}: {e}", path.display())))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(String::from),
        );
    }
    if keys.is_empty() {
        if let Ok(key) = std::env::var("E2B_API_KEY") {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        return Err(Error::invalid(
            "no API key: give --api-key KEY, --api-key-file FILE or $E2B_API_KEY (every \
             control call must carry one)",
        ));
    }
    if let Some(short) = keys.iter().find(|key| key.len() < 16) {
        return Err(Error::invalid(format!(
            "an API key of {} characters: use at least 16 (e.g. `openssl rand -hex 20`)",
            short.len()
        )));
    }
    Ok(keys.iter().map(|key| registry::digest(key)).collect())
}

async fn serve(args: ServeArgs) -> Result<(), Error> {
    let settings = settings(&args)?;
    let addr = args.e2b.as_str();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::invalid(format!("--e2b {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::invalid(format!("--e2b {addr}: {e}")))?;
    if !local.ip().is_loopback() && !args.insecure_public {
        return Err(Error::invalid(format!(
            "--e2b {addr}: {} is not a loopback address and this server speaks plain HTTP \
             (API keys and access tokens would cross the network in the clear). Put a TLS \
             proxy in front and pass --insecure-public to serve it anyway",
            local.ip()
        )));
    }
    let domain = args
        .domain
        .clone()
        .unwrap_or_else(|| format!("localhost:{}", local.port()));
    let server = Arc::new(Server {
        registry: Registry::new(settings),
        domain,
    });
    // The address on stdout (a test or a supervisor reads it, e.g. after port 0).
    println!("http://{local}");
    eprintln!("strata serve: E2B API and envd at http://{local}");
    let reaper = tokio::spawn(reap(server.clone()));
    let stopped = tokio_util::sync::CancellationToken::new();
    let serving = server.clone();
    crate::shutdown::serve_http1(listener, "strata serve", stopped, move || {
        let server = serving.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(handle(server, request).await) }
        })
    })
    .await;
    reaper.abort();
    let entries = server.registry.drain();
    eprintln!("strata serve: stopping {} sandboxes", entries.len());
    let _ = tokio::task::spawn_blocking(move || {
        for entry in entries {
            stop_entry(&entry);
        }
    })
    .await;
    Ok(())
}

/// Runs `work` (live sandbox calls block) off the async threads.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RpcError> + Send + 'static,
) -> Result<T, RpcError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RpcError::new(Code::Internal, format!("a worker thread: {e}")))?
}

/// Ends `entry`'s live sandbox (its processes, namespaces, cgroup and files).
pub fn stop_entry(entry: &Entry) {
    if let Err(e) = entry.live.stop_shared() {
        eprintln!("strata serve: stopping sandbox {}: {e}", entry.id);
    }
}

/// Stops every sandbox past its end time (a paused one waits for its resume).
async fn reap(server: Arc<Server>) {
    let mut tick = tokio::time::interval(REAP_EVERY);
    loop {
        tick.tick().await;
        let (to_pause, to_stop) = server.registry.expired();
        if to_pause.is_empty() && to_stop.is_empty() {
            continue;
        }
        let audited = server.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for entry in to_stop {
                let _ = audited.audit("e2b.timeout", "stopped", entry.id.clone());
                stop_entry(&entry);
            }
            for entry in to_pause {
                let _ = audited.audit("e2b.timeout", "paused", entry.id.clone());
                match entry.live.pause() {
                    Ok(_) => entry
                        .paused
                        .store(true, std::sync::atomic::Ordering::SeqCst),
                    Err(e) => {
                        // It cannot be kept paused: end it, as a sandbox without autoPause.
                        eprintln!(
                            "strata serve: pausing sandbox {}: {e}; stopping it",
                            entry.id
                        );
                        audited.registry.remove(&entry.id);
                        stop_entry(&entry);
                    }
                }
            }
        })
        .await;
    }
}

/// Whether a request is for a sandbox's envd (rather than the control plane).
fn is_envd(request: &Request<Incoming>) -> bool {
    let path = request.uri().path();
    path.starts_with("/process.Process/")
        || path.starts_with("/filesystem.Filesystem/")
        || path == "/files"
        || request.headers().contains_key("e2b-sandbox-id")
}

async fn handle(server: Arc<Server>, request: Request<Incoming>) -> Response<Body> {
    let host = request
        .headers()
        .get(hyper::header::HOST)
        .and_then(|value| value.to_str().ok())
        .map(String::from);
    if let Some((port, id)) = host.as_deref().and_then(ports::target) {
        return ports::forward(server, request, port, id).await;
    }
    if is_envd(&request) {
        envd(server, request).await
    } else {
        control::handle(server, request).await
    }
}

/// An envd call: find its sandbox (by header, or a signed URL's signature), check its access
/// token, and hand it to its service.
async fn envd(server: Arc<Server>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let rpc = path.starts_with("/process.Process/") || path.starts_with("/filesystem.Filesystem/");
    let Some(id) = http::header(request.headers(), "e2b-sandbox-id").map(String::from) else {
        if path == "/files" {
            return files::signed(server, request).await;
        }
        return envd_refusal(
            rpc,
            RpcError::new(
                Code::InvalidArgument,
                "no E2b-Sandbox-Id header: set E2B_SANDBOX_URL to this server so the SDK names \
                 the sandbox",
            ),
        );
    };
    let Some(entry) = server.registry.get_any(&id) else {
        // What E2B's proxy answers for a sandbox that is gone: the SDKs read 502 as "not
        // running" (health) and name the sandbox in the error.
        return gone(rpc, &id, "was not found (killed, timed out, or never made)");
    };
    let token = http::header(request.headers(), "x-access-token").unwrap_or("");
    if !entry.token_matches(token) {
        return envd_refusal(
            rpc,
            RpcError::new(
                Code::Unauthenticated,
                format!("sandbox {id}: a missing or wrong X-Access-Token"),
            ),
        );
    }
    if entry.paused.load(std::sync::atomic::Ordering::SeqCst) {
        return gone(rpc, &id, "is paused (resume it with Sandbox.connect)");
    }
    if let Err(error) = user_of(request.headers()) {
        return envd_refusal(rpc, error);
    }
    match path.as_str() {
        "/health" => http::empty(StatusCode::NO_CONTENT),
        "/init" => http::empty(StatusCode::NO_CONTENT),
        "/files" => files::handle(server, entry, request).await,
        p if p.starts_with("/process.Process/") => {
            process::handle(server, entry, request).await
        }
        p if p.starts_with("/filesystem.Filesystem/") => {
            filesystem::handle(server, entry, request).await
        }
        other => http::rest_error(
            StatusCode::NOT_FOUND,
            format!("envd has no {other} (this server implements /process.Process, /filesystem.Filesystem, /files, /health and /init)"),
        ),
    }
}

/// An answer for a sandbox that is gone or paused: 502, as E2B's proxy answers.
fn gone(rpc: bool, id: &str, why: &str) -> Response<Body> {
    let message = format!("The sandbox {id} {why}");
    if rpc {
        let error = RpcError::new(Code::Unavailable, message);
        http::json(StatusCode::BAD_GATEWAY, &error.json())
    } else {
        http::rest_error(StatusCode::BAD_GATEWAY, message)
    }
}

/// A refused envd call: Connect's JSON error for an RPC, E2B's REST error otherwise.
pub fn envd_refusal(rpc: bool, error: RpcError) -> Response<Body> {
    if rpc {
        http::json(error.code.status(), &error.json())
    } else {
        http::rest_error(error.code.status(), error.message)
    }
}

/// A Connect stream (`application/connect+json`) of the enveloped messages `rx` receives.
pub fn stream_response(rx: tokio::sync::mpsc::Receiver<bytes::Bytes>) -> Response<Body> {
    http::respond(
        StatusCode::OK,
        "application/connect+json",
        http::streamed(rx),
    )
}

/// A Connect stream that ends at once with `error` (streams answer 200 and carry it).
pub fn stream_failure(error: &RpcError) -> Response<Body> {
    http::respond(
        StatusCode::OK,
        "application/connect+json",
        http::full(connect::end_of_stream(Some(error))),
    )
}

/// A unary Connect answer: `value` as JSON, or the error's status and `{code, message}`.
pub fn unary_response(result: Result<serde_json::Value, RpcError>) -> Response<Body> {
    match result {
        Ok(value) => http::respond(
            StatusCode::OK,
            "application/json",
            http::full(connect::unary_json(&value)),
        ),
        Err(error) => http::json(error.code.status(), &error.json()),
    }
}

/// The user an envd call acts as: `Authorization: Basic base64("NAME:")`, default `user`.
/// A live sandbox has one identity (uid 0 inside its own user namespace, an unprivileged
/// uid on the host): `user` and `root` both name it.
pub fn user_of(headers: &hyper::HeaderMap) -> Result<String, RpcError> {
    use base64::Engine as _;
    let Some(value) = http::header(headers, "authorization") else {
        return Ok(registry::USER.into());
    };
    let Some(encoded) = value.strip_prefix("Basic ") else {
        return Err(RpcError::new(
            Code::Unauthenticated,
            "Authorization: only Basic base64(\"USER:\") names a user here",
        ));
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            RpcError::new(Code::Unauthenticated, "Authorization: not base64 of USER:")
        })?;
    let name = decoded.split(':').next().unwrap_or("").to_string();
    check_user(&name)?;
    Ok(if name.is_empty() {
        registry::USER.into()
    } else {
        name
    })
}

/// Checks a user named in a request (a header, or a `/files` query).
pub fn check_user(name: &str) -> Result<(), RpcError> {
    match name {
        "" | registry::USER | "root" => Ok(()),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!("user {other:?}: the base template has the users `user` and `root`"),
        )),
    }
}
