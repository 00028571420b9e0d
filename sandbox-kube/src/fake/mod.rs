//! An in-process fake Kubernetes API server (feature `fake`): a **test double** of the API
//! server, of agent-sandbox's controllers and of a kubelet, so that a real [`kube::Client`]
//! (and [`crate::client::Cluster`]) can be tested end to end in `cargo test`, over real
//! HTTP/1 on `127.0.0.1`, with real local processes standing for pods.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use sandbox_policy::Tier;
//! use sandbox_kube::check::Pinned;
//! use sandbox_kube::fake::{FakeApiServer, FakeOptions};
//! use sandbox_kube::{render, render::AGENT_PATH, Boundary, RenderInput};
//!
//! let pinned = Pinned::load("sandbox-kube/tests/data/agent-sandbox")?;
//! // Pods run `command[0]` mapped to a local executable (here, one that idles).
//! let server = FakeApiServer::start(FakeOptions::new(pinned).command(AGENT_PATH, "/path/to/agent"))?;
//! let cluster = server.cluster("default")?;
//! let tier = render(&RenderInput::for_tier(&Tier::low(), "img", Boundary::Gvisor).with_warm_pool(1))?;
//! cluster.apply_tier(&tier).await?;
//! let claim = cluster.claim(&tier.claim).await?;
//! let bound = cluster.wait_ready(&claim, std::time::Duration::from_secs(30)).await?;
//! assert!(server.pods().iter().any(|p| p.name == bound.sandbox && p.running));
//! cluster.release(&claim).await?; // the pod's process is gone when this returns
//! # Ok(())
//! # }
//! ```
//!
//! # What it serves
//!
//! | path | verbs |
//! |---|---|
//! | `/apis/{group}/v1beta1/namespaces/{ns}/{plural}` | `GET` list (`fieldSelector` on `metadata.name`/`metadata.namespace`, `labelSelector` of `k=v`, `k!=v`, `k`, `!k`), `GET ?watch=true`, `POST` |
//! | `/apis/{group}/v1beta1/namespaces/{ns}/{plural}/{name}` | `GET`, `PUT`, `DELETE` |
//! | `/api/v1/namespaces/{ns}/pods/{name}/exec` | websocket upgrade (`v5.channel.k8s.io`, else `v4.channel.k8s.io`) |
//!
//! for the four kinds of [`crate::Kind`], in any namespace (namespaces need not be
//! created). Anything else is `404` with a `metav1.Status` body. Every error is a real
//! `metav1.Status` (kind `Status`, `status: Failure`, `message`, `reason`, `code`,
//! `details`), so kube-rs maps it to [`kube::Error::Api`].
//!
//! Objects get `uid`, `creationTimestamp`, `generation` (grown when `spec` changes) and a
//! `resourceVersion` from one global counter. `generateName` gets 5 random characters.
//! A `PUT` must carry the stored `resourceVersion` (`409 Conflict` otherwise). Watches
//! replay the events after the given `resourceVersion` and then follow live ones, as
//! newline-delimited JSON on a chunked response, until `timeoutSeconds` (default
//! [`watch::DEFAULT_WATCH_SECONDS`]); with `allowWatchBookmarks=true` a `BOOKMARK` ends it.
//! The last [`FakeOptions::history`] events are kept (default 1000): a watch from an older
//! version gets an `ERROR` event with a `410 Gone` (`Expired`) status, as a real server's
//! watch cache answers, and must re-list.
//!
//! # What it validates
//!
//! Every `POST` and `PUT` body, and every `Sandbox` the controllers create (they would go
//! through the API server too), is checked with the pinned agent-sandbox data
//! ([`crate::check::Pinned`]): the CRD schema on create and replace, and the admission
//! policy where it matches (upstream's matches `CREATE` and `UPDATE` of `sandboxes`).
//! Violations are a `422 Invalid` whose `details.causes` list each one (`field`: the JSON
//! pointer, `message`). A `status` written with a create is dropped, and one written with a
//! replace is ignored (the kinds have a status subresource; there is no `/status` endpoint).
//!
//! # The controllers
//!
//! * A `SandboxWarmPool` keeps `spec.replicas` unclaimed `Sandbox`es made from its
//!   `sandboxTemplateRef`, named `{pool}-{5 random}`, labelled [`POOL_LABEL`]; its status
//!   reports `replicas`, `readyReplicas` and `selector`. The pool CRD has no status field
//!   for a reason, so a sandbox the policy refuses shows only as missing replicas, with the
//!   reason in [`FakeApiServer::controller_log`].
//! * A `SandboxClaim` adopts a warm sandbox of its `warmPoolRef` (labelled [`CLAIM_LABEL`],
//!   owner reference to the claim; the pool then refills) or, when none, gets a new one
//!   from the pool's template. Its status then has a `Ready` condition (`True`,
//!   `SandboxReady` once the sandbox is ready; `False` with `SandboxCreationFailed` and the
//!   policy's messages when the sandbox is refused, `WarmPoolNotFound`, `SandboxNotReady`)
//!   and `sandbox: {name, podIPs: ["127.0.0.1"]}`.
//! * A `Sandbox` gets a pod (below); its status gets `Ready` `True` (`DependenciesReady`)
//!   and `podIPs: ["127.0.0.1"]` as soon as the process is spawned, or `Ready` `False`
//!   (`PodStartFailed`, `ContainerExited`) with the reason.
//! * Deletion cascades at once, inside the `DELETE`: a claim takes its sandbox, a pool its
//!   unclaimed sandboxes, a sandbox its pod (process group killed and reaped, directory
//!   removed) before the answer is sent. (A real cluster does this in the background.)
//!
//! # Pods and exec
//!
//! A pod is a fresh private directory (mode 0700, under a temporary directory the server
//! owns) and the container's `command` (`spec.podTemplate.spec.containers[0].command`; the
//! image's entrypoint is never used) run as a local process: `command[0]` is looked up in
//! [`FakeOptions::commands`] (not found: the sandbox never becomes ready, its status says
//! why), the other words passed as given, the working directory the pod's directory, the
//! environment empty but `PATH=/usr/local/bin:/usr/bin:/bin`, stdin, stdout and stderr
//! `/dev/null`, in its own process group. The pod's name is the sandbox's. Stopping a pod
//! sends `SIGKILL` to its process group at once (no `SIGTERM` and grace period as a
//! kubelet gives). An exec runs its
//! command the same way (with the pipes it asks for) and ends with the kubelet's status on
//! channel 3 (`Success`, or `Failure`/`NonZeroExitCode` with the exit code in
//! `details.causes`). The client closing or dropping the connection kills the exec's
//! process group. The `container` parameter is ignored (one container per pod).
//!
//! # What it does not do
//!
//! With [`FakeOptions::tls`] it serves https with a CA made at start (its PEM in
//! [`FakeApiServer::ca_pem`] and in the kubeconfig), and with [`FakeOptions::token`] it
//! answers `401 Unauthorized` to any request without `Authorization: Bearer TOKEN`.
//!
//! No other authentication, no authorization (RBAC), no admission webhooks, no
//! `NetworkPolicy`, no `Service`, no `Pod` objects (only `pods/exec`), no `PATCH`, no
//! server-side apply, no `/status` subresource endpoint, no `tty` for exec, one container
//! per pod, and no isolation of pods at all: their processes run on the host as the test's
//! user. The warm pool's `updateStrategy` is not applied to a changed template. It is a
//! test double: nothing here is a sandbox.
//!
//! Dropping the [`FakeApiServer`] stops it, kills every process group it started, waits
//! for the processes and removes every directory it made. Should the test process die
//! before that (killed, `abort`), the processes it started get `SIGKILL` from the kernel
//! (parent-death signal; their own children are not covered), and the next server started
//! on the machine removes the directories left behind.

mod controller;
mod exec;
mod http;
mod objects;
mod pods;
mod process;
mod random;
mod store;
mod tls;
pub mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch as signal};

use crate::check::Pinned;
pub use process::PATH_ENV;

/// Label on a warm pool's unclaimed sandboxes: the pool's name.
pub const POOL_LABEL: &str = "agents.x-k8s.io/warm-pool";
/// Label on a claimed sandbox: the claim's name.
pub const CLAIM_LABEL: &str = "agents.x-k8s.io/claim";
/// How many events [`FakeOptions::new`] keeps for watches.
pub const DEFAULT_HISTORY: usize = 1000;

/// How to run a [`FakeApiServer`].
#[non_exhaustive]
pub struct FakeOptions {
    /// The pinned agent-sandbox data every object is checked against.
    pub pinned: Pinned,
    /// Container paths (`command[0]` of a pod or an exec, e.g.
    /// [`crate::render::AGENT_PATH`]) to local executables. Default: empty (no pod starts,
    /// every exec fails).
    pub commands: BTreeMap<String, PathBuf>,
    /// Whether a warm pool's sandboxes get their pods at once (`true`, the default), or
    /// only when claimed (`false`: warm sandboxes are objects without a process until then).
    pub warm_start: bool,
    /// How many events are kept for watches to replay (default [`DEFAULT_HISTORY`], at
    /// least 1); a watch from before them gets `410 Gone`.
    pub history: usize,
    /// Serve https (a CA and server certificate made at start) instead of http. Default:
    /// `false`.
    pub tls: bool,
    /// The bearer token every request must carry. Default: none (no authentication).
    pub token: Option<String>,
}

impl std::fmt::Debug for FakeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeOptions")
            .field("pinned", &self.pinned.dir())
            .field("commands", &self.commands)
            .field("warm_start", &self.warm_start)
            .field("history", &self.history)
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl FakeOptions {
    /// Options with the defaults: no command mapped, warm pools started at once,
    /// [`DEFAULT_HISTORY`] events kept.
    pub fn new(pinned: Pinned) -> FakeOptions {
        FakeOptions {
            pinned,
            commands: BTreeMap::new(),
            warm_start: true,
            history: DEFAULT_HISTORY,
            tls: false,
            token: None,
        }
    }

    /// Sets [`FakeOptions::tls`].
    pub fn tls(mut self, tls: bool) -> FakeOptions {
        self.tls = tls;
        self
    }

    /// Sets [`FakeOptions::token`].
    pub fn token(mut self, token: impl Into<String>) -> FakeOptions {
        self.token = Some(token.into());
        self
    }

    /// Runs `local` wherever a pod or exec asks for `container_path`.
    pub fn command(
        mut self,
        container_path: impl Into<String>,
        local: impl Into<PathBuf>,
    ) -> FakeOptions {
        self.commands.insert(container_path.into(), local.into());
        self
    }

    /// Sets [`FakeOptions::warm_start`].
    pub fn warm_start(mut self, warm_start: bool) -> FakeOptions {
        self.warm_start = warm_start;
        self
    }

    /// Sets [`FakeOptions::history`].
    pub fn history(mut self, events: usize) -> FakeOptions {
        self.history = events;
        self
    }
}

/// Why a [`FakeApiServer`] could not start, or a client not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FakeError {
    /// The temporary directory for pods could not be made.
    #[error("cannot make the fake API server's directory: {source}")]
    Dir {
        /// The OS error.
        source: std::io::Error,
    },
    /// No port on 127.0.0.1.
    #[error("cannot listen on 127.0.0.1: {source}")]
    Listen {
        /// The OS error.
        source: std::io::Error,
    },
    /// The tokio runtime or its thread could not be started.
    #[error("cannot start the fake API server's runtime: {source}")]
    Runtime {
        /// The OS error.
        source: std::io::Error,
    },
    /// The server's certificates could not be made.
    #[error("cannot make the fake API server's certificates: {message}")]
    Tls {
        /// What went wrong.
        message: String,
    },
    /// The kube-rs client could not be made.
    #[error("cannot make a kube client for {url}: {message}")]
    Client {
        /// The server's URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// A pod the server started, for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakePod {
    /// The namespace.
    pub namespace: String,
    /// The pod's (and its sandbox's) name.
    pub name: String,
    /// Its private directory (the process's working directory).
    pub dir: PathBuf,
    /// The process id (also its process group id).
    pub pid: Option<u32>,
    /// Whether the process still runs.
    pub running: bool,
}

/// One request the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The URL path.
    pub path: String,
    /// The raw query string (without `?`).
    pub query: String,
    /// The HTTP status answered (`200` for a watch, whatever its events).
    pub status: u16,
}

/// State shared by the server's tasks.
pub(crate) struct Shared {
    store: store::Store,
    pinned: Pinned,
    commands: BTreeMap<String, PathBuf>,
    warm_start: bool,
    pods: pods::Pods,
    shutdown: signal::Receiver<bool>,
    close_watches: signal::Sender<u64>,
    alive: Mutex<Option<mpsc::Sender<()>>>,
    requests: Mutex<Vec<RequestRecord>>,
    notes: Mutex<Vec<String>>,
    /// `Bearer TOKEN` when requests must carry it.
    authorization: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn record(&self, request: RequestRecord) {
        lock(&self.requests).push(request);
    }

    /// Adds a line to the controller log (not twice in a row).
    fn note(&self, line: String) {
        let mut notes = lock(&self.notes);
        if notes.last() != Some(&line) {
            notes.push(line);
        }
    }

    /// A token a task holds while it has processes to reap; `None` once shutting down.
    fn alive(&self) -> Option<mpsc::Sender<()>> {
        lock(&self.alive).clone()
    }
}

/// The running fake API server. See the [module documentation](self).
pub struct FakeApiServer {
    url: String,
    ca_pem: Option<String>,
    token: Option<String>,
    shared: Arc<Shared>,
    shutdown: signal::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Starts the server on a free port of 127.0.0.1, on its own tokio runtime (two worker
    /// threads) on its own thread: it works from synchronous tests and from inside another
    /// runtime.
    pub fn start(options: FakeOptions) -> Result<FakeApiServer, FakeError> {
        sweep_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|source| FakeError::Dir { source })?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|source| FakeError::Listen { source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| FakeError::Listen { source })?;
        let port = listener
            .local_addr()
            .map_err(|source| FakeError::Listen { source })?
            .port();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-fake-api")
            .enable_all()
            .build()
            .map_err(|source| FakeError::Runtime { source })?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|source| FakeError::Listen { source })?
        };
        let tls = match options.tls {
            true => Some(tls::make()?),
            false => None,
        };
        let (shutdown_tx, shutdown_rx) = signal::channel(false);
        let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
        let (close_watches, _) = signal::channel(0u64);
        let shared = Arc::new(Shared {
            store: store::Store::new(options.history),
            pinned: options.pinned,
            commands: options.commands,
            warm_start: options.warm_start,
            pods: pods::Pods::new(dir.path().join("pods")),
            shutdown: shutdown_rx.clone(),
            close_watches,
            alive: Mutex::new(Some(alive_tx)),
            requests: Mutex::new(Vec::new()),
            notes: Mutex::new(Vec::new()),
            authorization: options.token.as_ref().map(|t| format!("Bearer {t}")),
        });
        let ca_pem = tls.as_ref().map(|t| t.ca_pem.clone());
        let acceptor = tls.map(|t| t.acceptor);
        let server = shared.clone();
        let thread = std::thread::Builder::new()
            .name("strata-fake-api".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let controller =
                        tokio::spawn(controller::run(server.clone(), shutdown_rx.clone()));
                    accept(&server, listener, acceptor, shutdown_rx).await;
                    // Stop: no new exec, the controller done with its pass, then every pod
                    // and exec process killed and reaped.
                    lock(&server.alive).take();
                    server.close_watches.send_modify(|n| *n += 1);
                    let _ = controller.await;
                    server.pods.stop_all().await;
                    let _ = alive_rx.recv().await;
                });
                // Dropping the runtime ends the connections still open.
                drop(runtime);
            })
            .map_err(|source| FakeError::Runtime { source })?;
        let scheme = if ca_pem.is_some() { "https" } else { "http" };
        Ok(FakeApiServer {
            url: format!("{scheme}://127.0.0.1:{port}"),
            ca_pem,
            token: options.token,
            shared,
            shutdown: shutdown_tx,
            thread: Some(thread),
            dir: Some(dir),
        })
    }

    /// `http://127.0.0.1:PORT` (`https` with [`FakeOptions::tls`]).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The CA certificate (PEM) of the server's https, with [`FakeOptions::tls`].
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kube-rs client of this server with `namespace` as its default namespace (no
    /// authentication). Call it inside a tokio runtime: kube's client starts a task there.
    pub fn client(&self, namespace: &str) -> Result<kube::Client, FakeError> {
        let error = |message: String| FakeError::Client {
            url: self.url.clone(),
            message,
        };
        let uri = self
            .url
            .parse::<::http::Uri>()
            .map_err(|e| error(e.to_string()))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = namespace.to_owned();
        if let Some(pem) = &self.ca_pem {
            let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
                .map(|c: rustls::pki_types::CertificateDer<'_>| c.to_vec())
                .map_err(|e| error(format!("the CA certificate: {e}")))?;
            config.root_cert = Some(vec![der]);
        }
        if let Some(token) = &self.token {
            config.auth_info.token = Some(token.clone().into());
        }
        kube::Client::try_from(config).map_err(|e| error(e.to_string()))
    }

    /// A [`crate::client::Cluster`] on `namespace` of this server (see
    /// [`FakeApiServer::client`]).
    pub fn cluster(&self, namespace: &str) -> Result<crate::client::Cluster, FakeError> {
        Ok(crate::client::Cluster::new(
            self.client(namespace)?,
            namespace,
        ))
    }

    /// A kubeconfig (YAML) for this server: one cluster (with its CA's
    /// `certificate-authority-data` under [`FakeOptions::tls`]), one context (current, with
    /// `namespace`), one user (with the [`FakeOptions::token`], if any).
    pub fn kubeconfig(&self, namespace: &str) -> String {
        use base64::Engine as _;
        let ca = self
            .ca_pem
            .as_ref()
            .map(|pem| {
                let data = base64::engine::general_purpose::STANDARD.encode(pem);
                format!("\n    certificate-authority-data: {data}")
            })
            .unwrap_or_default();
        let user = match &self.token {
            Some(token) => format!("{{token: {token:?}}}"),
            None => "{}".to_owned(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: strata-fake\n  cluster:\n    server: {url}{ca}\ncontexts:\n- name: strata-fake\n  context:\n    cluster: strata-fake\n    user: strata-fake\n    namespace: {namespace:?}\ncurrent-context: strata-fake\nusers:\n- name: strata-fake\n  user: {user}\npreferences: {{}}\n",
            url = self.url
        )
    }

    /// The pods started (not the ones whose start failed), running or exited.
    pub fn pods(&self) -> Vec<FakePod> {
        self.shared.pods.list()
    }

    /// The directory under which pod directories are made (removed on drop).
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// Every request answered so far, in order (all are kept: a test server is short-lived).
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// What the controllers could not do (e.g. a warm pool's sandbox refused by the
    /// admission policy), one line each, in order.
    pub fn controller_log(&self) -> Vec<String> {
        lock(&self.shared.notes).clone()
    }

    /// Ends every open watch at once, without a bookmark, as when an API server restarts;
    /// clients resume from the last version they saw.
    pub fn close_watches(&self) {
        self.shared.close_watches.send_modify(|n| *n += 1);
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// The prefix of the server's directory in the temporary directory, followed by the pid
/// of the process that made it.
const DIR_PREFIX: &str = "strata-fake-api-";

/// Removes the directories of fake API servers whose process is gone (killed before it
/// could clean up).
fn sweep_stale_dirs() {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        let gone = matches!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        );
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

async fn accept(
    shared: &Arc<Shared>,
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: signal::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = shutdown.wait_for(|down| *down) => return,
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                // A client that fails the handshake (e.g. does not trust the CA) is dropped.
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve_connection(shared, stream).await;
                    }
                }
                None => serve_connection(shared, stream).await,
            }
        });
    }
}

/// Serves HTTP/1 (with upgrades, for exec) on one connection.
async fn serve_connection<S>(shared: Arc<Shared>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| http::serve(shared.clone(), request));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}
