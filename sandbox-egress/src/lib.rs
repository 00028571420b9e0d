//! Strata's host-side egress proxy: the enforcing half of network allowlists
//! ([`sandbox_core::Net::Allow`]), on top of the pure policy in [`sandbox_core::egress`].
//!
//! One [`EgressProxy`] per embedding process listens on a loopback TCP port chosen by the OS
//! and/or a Unix socket. Each run registers with [`EgressProxy::register`] and gets a
//! [`RunGrant`]: a random per-run credential, the run's [`EgressPolicy`], its [`Budget`] and
//! its decision log. A connection is tied to its run by the credential
//! (`Proxy-Authorization: Basic base64(TOKEN:)`); without the right one it is refused with
//! `407` before anything else happens.
//!
//! Served today, on the same listeners (told apart by the first byte): HTTP
//! `CONNECT host:port` and SOCKS5 `CONNECT` with names resolved by the proxy (`socks5h`),
//! both as byte tunnels, and plain-HTTP proxying of absolute `http://` URIs (one request
//! per connection, see `serve_plain_http`). The SOCKS5 credential is the username/password method (RFC 1929) with the token
//! as username; a client offering no such method is refused. Per connection the proxy
//!
//! 1. reads the request head under strict limits ([`MAX_HEAD_BYTES`], [`MAX_HEADERS`],
//!    [`HEAD_TIMEOUT`]); CR or LF anywhere but at a line end, NUL in a header, obsolete line
//!    folding and duplicate credentials are refused;
//! 2. splits the authority (`host:port` or `[v6]:port`, decimal port 1-65535) and parses the
//!    host with [`Host::parse`], the same strict parser the rules went through: anything it
//!    refuses is refused (`403`) without any resolution;
//! 3. asks [`EgressPolicy::check_name`]; a name no rule admits is never resolved;
//! 4. resolves the name once ([`resolve::resolve`]: the hosts file, then the absolute name,
//!    so no search domain is appended), checks every address with [`EgressPolicy::check_addr`] and connects only to
//!    an allowed one, which stays pinned for the connection (no second resolution, so no
//!    DNS rebinding);
//! 5. splices bytes both ways, counting them against the run's byte budget.
//!
//! Every decision lands in the run's log ([`RunGrant::drain_log`]) and in `tracing` (target
//! `strata::egress`).
#![deny(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine as _;
use sandbox_core::egress::{Decision, DenyReason, EgressPolicy, Host};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::first_bytes::FirstBytes;

mod decision;
pub mod first_bytes;
pub mod host;
mod intercept;
pub mod resolve;
pub mod secrets;

pub use decision::denials;

/// Longest request head (request line and headers, with the final blank line), in bytes.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Most header lines in a request head.
pub const MAX_HEADERS: usize = 64;
/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy waits for the upstream TCP connection (per address).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most entries a run's log keeps between drains; later ones are counted, not kept, so a
/// flood of refused requests cannot grow the host's memory without bound.
pub const MAX_LOG_ENTRIES: usize = 10_000;
/// Most client connections served at once by one proxy (all runs together, tunnels
/// included); past it new connections are closed at once, so unauthenticated clients
/// cannot exhaust the host's file descriptors.
pub const MAX_CLIENTS: usize = 4096;
/// Size of the splice buffer per direction.
const SPLICE_BUF: usize = 16 * 1024;
/// The realm of the `407` challenge.
const REALM: &str = "strata-egress";

/// Where the proxy listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `127.0.0.1` on a port the OS chooses ([`EgressProxy::tcp_addr`]).
    TcpLoopback,
    /// A Unix socket at this path (it must not exist; it is removed when the proxy drops).
    Unix(PathBuf),
}

/// Per-run egress limits. Exceeding one closes the connection at hand and is logged with a
/// [`BudgetLimit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Most connection requests (every authenticated request counts, allowed or not, so a
    /// flood of refused requests is cut too). `None`: unlimited.
    pub max_connections: Option<u64>,
    /// Most tunnelled bytes, both directions together, over all the run's connections.
    /// `None`: unlimited.
    pub max_bytes: Option<u64>,
}

impl Budget {
    /// No limits.
    pub const UNLIMITED: Budget = Budget {
        max_connections: None,
        max_bytes: None,
    };
}

/// Which budget was exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BudgetLimit {
    /// [`Budget::max_connections`].
    Connections {
        /// The limit.
        max: u64,
    },
    /// [`Budget::max_bytes`].
    Bytes {
        /// The limit.
        max: u64,
    },
}

impl fmt::Display for BudgetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetLimit::Connections { max } => write!(f, "connection budget of {max} exceeded"),
            BudgetLimit::Bytes { max } => write!(f, "byte budget of {max} exceeded"),
        }
    }
}

/// Why the proxy refused or cut a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The policy refused the host, the port or the resolved address.
    Policy(DenyReason),
    /// The request was malformed (not `CONNECT`, bad authority or port, a `Host` header
    /// that differs from the authority, ...).
    BadRequest(String),
    /// The name did not resolve (or resolved to nothing).
    Unresolvable(String),
    /// No allowed address accepted the connection.
    ConnectFailed(String),
    /// A budget was exceeded.
    Budget(BudgetLimit),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Policy(reason) => write!(f, "{reason}"),
            Refusal::BadRequest(why) => write!(f, "bad request: {why}"),
            Refusal::Unresolvable(why) => write!(f, "cannot resolve: {why}"),
            Refusal::ConnectFailed(why) => write!(f, "cannot connect: {why}"),
            Refusal::Budget(limit) => write!(f, "{limit}"),
        }
    }
}

/// The outcome of one decision.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Allowed (and connected) by this rule, as written.
    Allowed {
        /// The rule.
        rule: String,
    },
    /// The values of these secrets (by variable name) went into a request to this host,
    /// which their bindings allow.
    SecretsSent {
        /// The variables.
        env: Vec<String>,
    },
    /// Refused, or cut after being allowed (a budget).
    Refused(Refusal),
}

/// One entry of a run's egress log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressEvent {
    /// The host as the client sent it (possibly invalid, hence refused).
    pub host: String,
    /// The port as the client sent it (0 if it was not a valid port).
    pub port: u16,
    /// The address the decision is about, if it concerned one (a resolved or pinned one).
    pub addr: Option<IpAddr>,
    /// What happened.
    pub outcome: Outcome,
}

/// The state of one registered run.
#[derive(Debug)]
struct RunState {
    policy: EgressPolicy,
    budget: Budget,
    /// Secrets bound to hosts, substituted in request headers to those hosts.
    secrets: Vec<secrets::BoundSecret>,
    /// The run's certificate authority, when it has secrets (for HTTPS interception).
    ca: Option<intercept::RunCa>,
    connections: AtomicU64,
    bytes: AtomicU64,
    log: EgressLog,
}

/// A run's decision log, shared by every enforcer (this proxy, the wasm backend's
/// `wasi:sockets` checks): each event goes to `tracing` (target `strata::egress`, allowed at
/// `info`, refused at `warn`) and is kept, up to [`MAX_LOG_ENTRIES`] between drains; later
/// ones are counted.
#[derive(Debug, Default)]
pub struct EgressLog {
    inner: Mutex<RunLog>,
}

#[derive(Debug, Default)]
struct RunLog {
    events: Vec<EgressEvent>,
    dropped: u64,
}

impl EgressLog {
    /// An empty log.
    pub fn new() -> EgressLog {
        EgressLog::default()
    }

    /// Traces and keeps `event`.
    pub fn record(&self, event: EgressEvent) {
        match &event.outcome {
            Outcome::SecretsSent { env } => tracing::info!(
                target: "strata::egress",
                host = ?event.host, port = event.port, addr = ?event.addr, secrets = ?env,
                "secrets sent to their bound host"
            ),
            Outcome::Allowed { rule } => tracing::info!(
                target: "strata::egress",
                host = ?event.host, port = event.port, addr = ?event.addr, rule = %rule,
                "egress allowed"
            ),
            Outcome::Refused(refusal) => tracing::warn!(
                target: "strata::egress",
                host = ?event.host, port = event.port, addr = ?event.addr, reason = %refusal,
                "egress refused"
            ),
        }
        let mut log = lock(&self.inner);
        if log.events.len() < MAX_LOG_ENTRIES {
            log.events.push(event);
        } else {
            log.dropped += 1;
        }
    }

    /// Takes the events kept so far, and how many were dropped past [`MAX_LOG_ENTRIES`].
    pub fn drain(&self) -> (Vec<EgressEvent>, u64) {
        let mut log = lock(&self.inner);
        let dropped = std::mem::take(&mut log.dropped);
        (std::mem::take(&mut log.events), dropped)
    }
}

impl RunState {
    fn record(&self, event: EgressEvent) {
        self.log.record(event);
    }

    /// Reserves `n` bytes of the byte budget; `Err` if that would exceed it.
    fn take_bytes(&self, n: u64) -> Result<(), BudgetLimit> {
        let before = self.bytes.fetch_add(n, Ordering::Relaxed);
        match self.budget.max_bytes {
            Some(max) if before.saturating_add(n) > max => Err(BudgetLimit::Bytes { max }),
            _ => Ok(()),
        }
    }
}

type Runs = Mutex<HashMap<String, Arc<RunState>>>;

/// The host-side egress proxy. Dropping it stops its listeners (tunnels already open keep
/// running until either side closes or their run's budget is exhausted).
///
/// Must be created inside a tokio runtime (it spawns its accept loops there).
#[derive(Debug)]
pub struct EgressProxy {
    runs: Arc<Runs>,
    clients: Arc<Semaphore>,
    runtime: tokio::runtime::Handle,
    tcp_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    tasks: Vec<JoinHandle<()>>,
}

impl EgressProxy {
    /// Starts listening on every listener given. With none, the proxy serves only the
    /// per-run listeners handed to [`EgressProxy::attach`].
    pub async fn bind(listen: &[Listen]) -> io::Result<EgressProxy> {
        let runs: Arc<Runs> = Arc::default();
        let clients = Arc::new(Semaphore::new(MAX_CLIENTS));
        let mut proxy = EgressProxy {
            runs: runs.clone(),
            clients: clients.clone(),
            runtime: tokio::runtime::Handle::current(),
            tcp_addr: None,
            unix_path: None,
            tasks: Vec::new(),
        };
        for listener in listen {
            match listener {
                Listen::TcpLoopback => {
                    let tcp = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
                    proxy.tcp_addr = Some(tcp.local_addr()?);
                    let runs = Arc::downgrade(&runs);
                    let clients = clients.clone();
                    proxy.tasks.push(tokio::spawn(async move {
                        loop {
                            match tcp.accept().await {
                                Ok((stream, peer)) => {
                                    tracing::debug!(target: "strata::egress", %peer, "accepted");
                                    spawn_client(stream, runs.clone(), &clients);
                                }
                                Err(err) => accept_error(err).await,
                            }
                        }
                    }));
                }
                Listen::Unix(path) => {
                    let unix = UnixListener::bind(path)?;
                    proxy.unix_path = Some(path.clone());
                    let runs = Arc::downgrade(&runs);
                    let clients = clients.clone();
                    proxy.tasks.push(tokio::spawn(async move {
                        loop {
                            match unix.accept().await {
                                Ok((stream, _)) => {
                                    spawn_client(stream, runs.clone(), &clients);
                                }
                                Err(err) => accept_error(err).await,
                            }
                        }
                    }));
                }
            }
        }
        Ok(proxy)
    }

    /// The loopback TCP address, if listening on one.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The Unix socket path, if listening on one.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// Registers a run: its policy, its budget, and a fresh random credential. The run's
    /// connections are accepted until the returned grant drops.
    pub fn register(&self, policy: EgressPolicy, budget: Budget) -> io::Result<RunGrant> {
        self.register_with_secrets(policy, budget, Vec::new())
    }

    /// Like [`EgressProxy::register`], with secrets bound to hosts: requests to a secret's
    /// hosts get its value in place of its placeholder, in headers. With secrets, the run
    /// gets its own certificate authority ([`RunGrant::ca_pem`]): HTTPS tunnels to a
    /// secret's hosts are terminated with a certificate it issues (name-constrained to the
    /// secrets' hosts), and re-encrypted to the upstream, verified against the system's
    /// roots (`SSL_CERT_FILE` is honoured).
    pub fn register_with_secrets(
        &self,
        policy: EgressPolicy,
        budget: Budget,
        secrets: Vec<secrets::BoundSecret>,
    ) -> io::Result<RunGrant> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|err| io::Error::other(err.to_string()))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let ca = match secrets.is_empty() {
            true => None,
            false => Some(intercept::RunCa::new(&secrets)?),
        };
        let state = Arc::new(RunState {
            policy,
            budget,
            secrets,
            ca,
            connections: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            log: EgressLog::new(),
        });
        lock(&self.runs).insert(token.clone(), state.clone());
        Ok(RunGrant {
            token,
            state,
            runs: Arc::downgrade(&self.runs),
        })
    }
}

impl EgressProxy {
    /// A proxy without listeners of its own, serving only the per-run listeners handed to
    /// [`EgressProxy::attach`], on `runtime`. Callable from any thread, inside a runtime
    /// or not.
    pub fn attach_only(runtime: tokio::runtime::Handle) -> EgressProxy {
        EgressProxy {
            runs: Arc::default(),
            clients: Arc::new(Semaphore::new(MAX_CLIENTS)),
            runtime,
            tcp_addr: None,
            unix_path: None,
            tasks: Vec::new(),
        }
    }

    /// Serves `listener` for the run of `grant` only: a listener bound inside one
    /// sandbox's network namespace and passed out, so the sandbox's only way out is this
    /// proxy. Clients on it still need the run's credential, and no other run's credential
    /// works on it. Callable from any thread (the proxy keeps its runtime's handle).
    /// Serving stops when the returned [`Attached`] drops.
    pub fn attach(
        &self,
        listener: std::net::TcpListener,
        grant: &RunGrant,
    ) -> io::Result<Attached> {
        listener.set_nonblocking(true)?;
        let _entered = self.runtime.enter();
        let tcp = TcpListener::from_std(listener)?;
        Ok(self.serve_run(tcp, grant))
    }

    /// Accepts clients on `listener` for the run of `grant` only, until the returned
    /// [`Attached`] drops.
    fn serve_run<L: AcceptOne>(&self, listener: L, grant: &RunGrant) -> Attached {
        let (runs, weak) = only_run(grant);
        let task = self
            .runtime
            .spawn(accept_loop(listener, weak, self.clients.clone()));
        Attached { task, runs }
    }
}

/// Accepts clients on `listener` for the runs of `runs`, until the task is aborted.
async fn accept_loop<L: AcceptOne>(listener: L, runs: Weak<Runs>, clients: Arc<Semaphore>) {
    loop {
        match listener.accept_one().await {
            Ok(stream) => spawn_client(stream, runs.clone(), &clients),
            Err(err) => accept_error(err).await,
        }
    }
}

/// A listener whose connections a run's proxy serves.
trait AcceptOne: Send + Sync + 'static {
    /// The connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept_one(&self) -> impl std::future::Future<Output = io::Result<Self::Stream>> + Send;
}

impl AcceptOne for TcpListener {
    type Stream = TcpStream;
    async fn accept_one(&self) -> io::Result<TcpStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl AcceptOne for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> io::Result<tokio::net::UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl EgressProxy {
    /// Serves every run registered with this proxy on `listener`, each client tied to its
    /// run by the credential it presents (without a registered one: `407`). For sandboxes
    /// that reach the proxy over a network rather than through a listener of their own (a
    /// cluster's pods, whose NetworkPolicy lets them reach only this address). Callable
    /// from any thread. Serving stops when the returned [`SharedListener`] drops; the
    /// runs stay registered.
    pub fn serve_shared(&self, listener: std::net::TcpListener) -> io::Result<SharedListener> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let _entered = self.runtime.enter();
        let tcp = TcpListener::from_std(listener)?;
        let task = self.runtime.spawn(accept_loop(
            tcp,
            Arc::downgrade(&self.runs),
            self.clients.clone(),
        ));
        Ok(SharedListener { task, addr })
    }
}

/// A listener serving every run of a proxy ([`EgressProxy::serve_shared`]). Dropping it
/// closes the listener; tunnels already open run on.
#[derive(Debug)]
pub struct SharedListener {
    task: JoinHandle<()>,
    addr: SocketAddr,
}

impl SharedListener {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for SharedListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A runs table holding only `grant`'s run, and a weak handle on it for the accept loop.
fn only_run(grant: &RunGrant) -> (Arc<Runs>, Weak<Runs>) {
    let runs: Arc<Runs> = Arc::default();
    lock(&runs).insert(grant.token.clone(), grant.state.clone());
    let weak = Arc::downgrade(&runs);
    (runs, weak)
}

impl EgressProxy {
    /// Like [`EgressProxy::attach`], for a Unix socket listener: a VM's user-mode network
    /// relays each guest connection to the proxy's address onto this socket (in the run's
    /// private directory), so the run's credential and policy apply to it alone.
    pub fn attach_unix(
        &self,
        listener: std::os::unix::net::UnixListener,
        grant: &RunGrant,
    ) -> io::Result<Attached> {
        listener.set_nonblocking(true)?;
        let _entered = self.runtime.enter();
        let unix = UnixListener::from_std(listener)?;
        Ok(self.serve_run(unix, grant))
    }
}

impl EgressProxy {
    /// Serves a transparent listener of the run of `grant`: a listener on `0.0.0.0:PORT`
    /// inside the sandbox, where connections arrive addressed to synthetic addresses that
    /// `names` maps back to host names (the sandbox's `/etc/hosts` gave the tool those
    /// addresses). Each connection is handled like `CONNECT name:PORT` with the run's
    /// credential: policy, resolution on the host, pinning, the first-bytes check (the TLS
    /// server name or HTTP `Host` must be that name), budgets, secrets. A connection to an
    /// address no name maps to is refused.
    pub fn attach_transparent(
        &self,
        listener: std::net::TcpListener,
        grant: &RunGrant,
        names: HashMap<IpAddr, String>,
    ) -> io::Result<Attached> {
        listener.set_nonblocking(true)?;
        let _entered = self.runtime.enter();
        let tcp = TcpListener::from_std(listener)?;
        let (runs, weak) = only_run(grant);
        let token = grant.token.clone();
        let clients = self.clients.clone();
        let names = Arc::new(names);
        let task = self.runtime.spawn(async move {
            loop {
                match tcp.accept().await {
                    Ok((stream, _)) => {
                        let Ok(permit) = clients.clone().try_acquire_owned() else {
                            continue;
                        };
                        let (weak, token, names) = (weak.clone(), token.clone(), names.clone());
                        tokio::spawn(async move {
                            if let Some(run) = find_run(&weak, &token) {
                                serve_transparent(stream, &run, &names).await;
                            }
                            drop(permit);
                        });
                    }
                    Err(err) => accept_error(err).await,
                }
            }
        });
        Ok(Attached { task, runs })
    }
}

/// One transparent connection: its local address names the host, its local port the port.
async fn serve_transparent(client: TcpStream, run: &RunState, names: &HashMap<IpAddr, String>) {
    let Ok(local) = client.local_addr() else {
        return;
    };
    let port = local.port();
    let Some(host) = names.get(&local.ip()) else {
        refuse(
            run,
            &local.ip().to_string(),
            port,
            None,
            Refusal::BadRequest(format!(
                "{local} is no allowlisted name's address (tools reach addresses through the proxy variables)"
            )),
        );
        return;
    };
    if count_connection(run, host, port).is_err() {
        return;
    }
    let Ok((addr, upstream)) = open_upstream(run, host, port).await else {
        return;
    };
    if intercept::intercepts(run, host) {
        intercept::serve_intercepted(client, upstream, Vec::new(), run, host, port, addr).await;
        return;
    }
    splice(client, upstream, Vec::new(), run, host, |why| {
        refuse(run, host, port, Some(addr), why);
    })
    .await;
}

/// A run's own listener being served (see [`EgressProxy::attach`]). Dropping it closes the
/// listener and refuses new connections on it; tunnels already open run on until either
/// side closes or the run's budget is spent.
#[derive(Debug)]
pub struct Attached {
    task: JoinHandle<()>,
    runs: Arc<Runs>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.task.abort();
        lock(&self.runs).clear();
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A run's registration with the proxy. Dropping it revokes the credential: new connections
/// of the run are refused (`407`).
#[derive(Debug)]
pub struct RunGrant {
    token: String,
    state: Arc<RunState>,
    runs: Weak<Runs>,
}

impl RunGrant {
    /// The run's credential: 32 hex digits from the OS's random source.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The `Proxy-Authorization` header value the run's clients must send
    /// (`Basic base64(TOKEN:)`).
    pub fn proxy_authorization(&self) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{}:", self.token))
        )
    }

    /// The proxy URL for `HTTP(S)_PROXY` with the credential as user, for a proxy reachable
    /// at `addr` (`http://TOKEN:egress@127.0.0.1:PORT`). The password is ignored by the
    /// proxy but present, because some clients (Python's `urllib`) send credentials only
    /// when both parts are.
    pub fn proxy_url(&self, addr: SocketAddr) -> String {
        format!("http://{}:egress@{addr}", self.token)
    }

    /// Takes the decisions logged so far, and how many were dropped past
    /// [`MAX_LOG_ENTRIES`].
    pub fn drain_log(&self) -> (Vec<EgressEvent>, u64) {
        self.state.log.drain()
    }

    /// The run's certificate authority (PEM), when it has secrets: the sandbox must trust
    /// it for HTTPS to the secrets' hosts.
    pub fn ca_pem(&self) -> Option<&str> {
        self.state.ca.as_ref().map(intercept::RunCa::pem)
    }

    /// Connection requests counted against the budget so far.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Tunnelled bytes so far (both directions; may exceed the budget by the refused chunk).
    pub fn bytes(&self) -> u64 {
        self.state.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for RunGrant {
    fn drop(&mut self) {
        if let Some(runs) = self.runs.upgrade() {
            lock(&runs).remove(&self.token);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Serves a client on its own task if fewer than [`MAX_CLIENTS`] are being served;
/// otherwise closes it at once.
fn spawn_client<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    runs: Weak<Runs>,
    clients: &Arc<Semaphore>,
) {
    match clients.clone().try_acquire_owned() {
        Ok(permit) => {
            tokio::spawn(async move {
                serve(stream, runs).await;
                drop(permit);
            });
        }
        Err(_) => {
            tracing::warn!(target: "strata::egress", max = MAX_CLIENTS, "too many clients; closing");
        }
    }
}

/// Backs off after an accept error (file descriptor exhaustion must not spin).
async fn accept_error(err: io::Error) {
    tracing::warn!(target: "strata::egress", error = %err, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

/// Reads the request head, starting with the bytes in `buf` already read; returns it and
/// the bytes the client sent after it.
async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut chunk = [0u8; 1024];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|err| format!("read: {err}"))?;
        if n == 0 {
            return Err("the client closed before the end of the request head".into());
        }
        let scan_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf[scan_from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = scan_from + pos + 4;
            if end > MAX_HEAD_BYTES {
                return Err(format!("the request head exceeds {MAX_HEAD_BYTES} bytes"));
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(format!("the request head exceeds {MAX_HEAD_BYTES} bytes"));
        }
    }
}

/// Parses a head (ending in CRLF CRLF). Lines end in CRLF only; a CR or LF elsewhere in a
/// header line, a NUL or other control character in a header, obsolete line folding and
/// more than [`MAX_HEADERS`] headers are refused. The request line is split on single
/// spaces only; its target is checked later by the strict authority parser.
fn parse_head(raw: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "the request head is not UTF-8")?;
    let text = text
        .strip_suffix("\r\n\r\n")
        .ok_or("the request head does not end in CRLF CRLF")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().ok_or("no request line")?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the request line is not `METHOD TARGET VERSION`".into());
    };
    if method.is_empty() || method.len() > 20 || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!("invalid method {method:?}"));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(format!("unsupported version {version:?}"));
    }
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() >= MAX_HEADERS {
            return Err(format!("more than {MAX_HEADERS} headers"));
        }
        if line.starts_with([' ', '\t']) {
            return Err("obsolete header line folding".into());
        }
        if line.chars().any(|c| c.is_control() && c != '\t') {
            return Err("a control character (CR, LF, NUL, ...) in a header".into());
        }
        let (name, value) = line.split_once(':').ok_or("a header without `:`")?;
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err(format!("invalid header name {name:?}"));
        }
        headers.push((
            name.to_ascii_lowercase(),
            value.trim_matches([' ', '\t']).to_string(),
        ));
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        headers,
    })
}

/// The token in a `Proxy-Authorization: Basic base64(TOKEN:PASSWORD)` value (the password
/// is ignored).
fn basic_user(value: &str) -> Option<String> {
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let user = decoded.split_once(':').map_or(decoded.as_str(), |(u, _)| u);
    Some(user.to_string())
}

/// Splits a CONNECT authority into host text and port: `host:port` or `[v6]:port`, the
/// port 1-5 decimal digits in 1-65535. The host text is not interpreted here.
fn split_authority(authority: &str) -> Result<(&str, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an unterminated `[` in the authority")?;
        let port = after
            .strip_prefix(':')
            .ok_or("no port after the bracketed address")?;
        (host, port)
    } else {
        let (host, port) = authority
            .rsplit_once(':')
            .ok_or("the authority has no port")?;
        if host.contains(':') {
            return Err("an IPv6 address must be bracketed".into());
        }
        (host, port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid port {port:?}"));
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok((host, port)),
        _ => Err(format!("invalid port {port:?}")),
    }
}

async fn respond<S: AsyncWrite + Unpin>(client: &mut S, status: &str, extra: &str) {
    let response =
        format!("HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// Why [`open_upstream`] gave up (already logged); each protocol maps it to its reply.
enum Fail {
    /// The connection budget is spent.
    Budget,
    /// The policy refused the host, port or every address.
    Forbidden,
    /// The name did not resolve.
    Unresolvable,
    /// No allowed address accepted the connection.
    ConnectFailed,
}

impl Fail {
    fn http_status(&self) -> &'static str {
        match self {
            Fail::Budget => "429 Too Many Requests",
            Fail::Forbidden => "403 Forbidden",
            Fail::Unresolvable | Fail::ConnectFailed => "502 Bad Gateway",
        }
    }

    /// The SOCKS5 reply code (RFC 1928 section 6).
    fn socks_reply(&self) -> u8 {
        match self {
            Fail::Budget | Fail::Forbidden => 0x02,
            Fail::Unresolvable => 0x04,
            Fail::ConnectFailed => 0x05,
        }
    }
}

fn refuse(run: &RunState, host: &str, port: u16, addr: Option<IpAddr>, refusal: Refusal) {
    run.record(EgressEvent {
        host: host.to_string(),
        port,
        addr,
        outcome: Outcome::Refused(refusal),
    });
}

/// Counts a connection request against the run's budget.
fn count_connection(run: &RunState, host: &str, port: u16) -> Result<(), Fail> {
    let count = run.connections.fetch_add(1, Ordering::Relaxed) + 1;
    match run.budget.max_connections {
        Some(max) if count > max => {
            refuse(
                run,
                host,
                port,
                None,
                Refusal::Budget(BudgetLimit::Connections { max }),
            );
            Err(Fail::Budget)
        }
        _ => Ok(()),
    }
}

/// The decision pipeline shared by every protocol: parse the host with the one strict
/// parser, check the name, resolve once, check every address, connect to the first allowed
/// one (pinned: it is never resolved again). Every decision is logged.
async fn open_upstream(
    run: &RunState,
    host_text: &str,
    port: u16,
) -> Result<(IpAddr, TcpStream), Fail> {
    // One parser: the matcher and the resolver see the same `Host`.
    let host = match Host::parse(host_text) {
        Ok(host) => host,
        Err(reason) => {
            refuse(
                run,
                host_text,
                port,
                None,
                Refusal::Policy(DenyReason::InvalidName { reason }),
            );
            return Err(Fail::Forbidden);
        }
    };
    let matched = host.to_string();
    if let Decision::Deny { reason } = run.policy.check_name(&matched, port) {
        refuse(run, host_text, port, None, Refusal::Policy(reason));
        return Err(Fail::Forbidden);
    }
    // Resolve once: the hosts file, then the absolute name (see `resolve`).
    let candidates = match resolve::resolve(&host, port).await {
        Ok(ips) => ips,
        Err(err) => {
            refuse(
                run,
                host_text,
                port,
                None,
                Refusal::Unresolvable(err.to_string()),
            );
            return Err(Fail::Unresolvable);
        }
    };
    if candidates.is_empty() {
        refuse(
            run,
            host_text,
            port,
            None,
            Refusal::Unresolvable("no addresses".into()),
        );
        return Err(Fail::Unresolvable);
    }
    let mut last_error = None;
    for addr in candidates {
        match run.policy.check_addr(&matched, addr, port) {
            Decision::Deny { reason } => {
                refuse(run, host_text, port, Some(addr), Refusal::Policy(reason));
            }
            Decision::Allow { rule } => {
                match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((addr, port))).await
                {
                    Ok(Ok(upstream)) => {
                        run.record(EgressEvent {
                            host: host_text.to_string(),
                            port,
                            addr: Some(addr),
                            outcome: Outcome::Allowed { rule },
                        });
                        return Ok((addr, upstream));
                    }
                    Ok(Err(err)) => last_error = Some(format!("{addr}: {err}")),
                    Err(_) => last_error = Some(format!("{addr}: timed out")),
                }
            }
        }
    }
    match last_error {
        Some(why) => {
            refuse(run, host_text, port, None, Refusal::ConnectFailed(why));
            Err(Fail::ConnectFailed)
        }
        None => Err(Fail::Forbidden),
    }
}

fn find_run(runs: &Weak<Runs>, token: &str) -> Option<Arc<RunState>> {
    let runs = runs.upgrade()?;
    let run = lock(&runs).get(token).cloned();
    run
}

/// Serves one client connection: SOCKS5 if its first byte is 5, HTTP otherwise.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut client: S, runs: Weak<Runs>) {
    let mut first = [0u8; 1];
    match tokio::time::timeout(HEAD_TIMEOUT, client.read_exact(&mut first)).await {
        Ok(Ok(_)) => {}
        _ => return,
    }
    if first[0] == SOCKS_VERSION {
        serve_socks(client, runs).await;
    } else {
        serve_http(client, runs, first[0]).await;
    }
}

/// Serves an HTTP `CONNECT` whose first byte was already read.
async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(mut client: S, runs: Weak<Runs>, first: u8) {
    let read = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, vec![first])).await;
    let (raw, early) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(why)) => {
            tracing::warn!(target: "strata::egress", %why, "bad request head");
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
        Err(_) => {
            tracing::warn!(target: "strata::egress", "request head timed out");
            respond(&mut client, "408 Request Timeout", "").await;
            return;
        }
    };
    let head = match parse_head(&raw) {
        Ok(head) => head,
        Err(why) => {
            tracing::warn!(target: "strata::egress", %why, "bad request head");
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
    };
    // The credential first: an unauthenticated client learns nothing about the policy.
    let mut auth = head
        .headers
        .iter()
        .filter(|(name, _)| name == "proxy-authorization");
    let token = match (auth.next(), auth.next()) {
        (Some((_, value)), None) => basic_user(value),
        _ => None,
    };
    let Some(run) = token.and_then(|token| find_run(&runs, &token)) else {
        tracing::warn!(target: "strata::egress", request_target = ?head.target, "missing or wrong proxy credential");
        let challenge = format!("Proxy-Authenticate: Basic realm=\"{REALM}\"\r\n");
        respond(&mut client, "407 Proxy Authentication Required", &challenge).await;
        return;
    };
    if let Err(fail) = count_connection(&run, &head.target, 0) {
        respond(&mut client, fail.http_status(), "").await;
        return;
    }
    if head.method != "CONNECT" {
        serve_plain_http(client, &run, head, early).await;
        return;
    }
    let (host_text, port) = match split_authority(&head.target) {
        Ok(split) => split,
        Err(why) => {
            refuse(&run, &head.target, 0, None, Refusal::BadRequest(why));
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
    };
    // A `Host` header, if sent, must name the same authority.
    for (name, value) in &head.headers {
        if name == "host" && !value.eq_ignore_ascii_case(&head.target) {
            refuse(
                &run,
                host_text,
                port,
                None,
                Refusal::BadRequest(format!(
                    "the Host header {value:?} differs from the CONNECT authority"
                )),
            );
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
    }
    let (addr, upstream) = match open_upstream(&run, host_text, port).await {
        Ok(opened) => opened,
        Err(fail) => {
            respond(&mut client, fail.http_status(), "").await;
            return;
        }
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    if intercept::intercepts(&run, host_text) {
        intercept::serve_intercepted(client, upstream, early, &run, host_text, port, addr).await;
        return;
    }
    splice(client, upstream, early, &run, host_text, |why| {
        refuse(&run, host_text, port, Some(addr), why);
    })
    .await;
}

/// Splits an absolute `http://` URI into its authority and the origin-form target
/// (`/path?query`). Fragments, userinfo (refused later by [`Host::parse`]), other schemes,
/// and control characters or spaces in the path are refused.
fn split_absolute_uri(target: &str) -> Result<(bool, &str, String), String> {
    let (tls, rest) = if target.len() > 7 && target[..7].eq_ignore_ascii_case("http://") {
        (false, &target[7..])
    } else if target.len() > 8 && target[..8].eq_ignore_ascii_case("https://") {
        (true, &target[8..])
    } else {
        return Err("only absolute http:// and https:// URIs are proxied".into());
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if path.contains('#') {
        return Err("a fragment in the request target".into());
    }
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("a control character or space in the request target".into());
    }
    let path = if path.is_empty() {
        "/".to_string()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Ok((tls, authority, path))
}

/// Host text and port of an authority whose port may be omitted (then `default`).
fn split_authority_default(authority: &str, default: u16) -> Result<(&str, u16), String> {
    let bracketed_without_port = authority.starts_with('[') && authority.ends_with(']');
    if bracketed_without_port {
        return Ok((&authority[1..authority.len() - 1], default));
    }
    if !authority.starts_with('[') && !authority.contains(':') {
        return Ok((authority, default));
    }
    split_authority(authority)
}

/// Hop-by-hop and proxy headers that are not forwarded (`Connection: close` is added).
const DROPPED_HEADERS: [&str; 8] = [
    "proxy-authorization",
    "proxy-connection",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Plain-HTTP proxying of one absolute-URI request: exactly one request per connection.
/// The body must be framed by a single `Content-Length` (`Transfer-Encoding` is refused,
/// `501`), only that many bytes are forwarded, anything the client sends after them is
/// dropped (no second request reaches the pinned address under another `Host`), and the
/// upstream gets `Connection: close`.
async fn serve_plain_http<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    run: &RunState,
    head: Head,
    early: Vec<u8>,
) {
    let bad = |why: String| {
        refuse(run, &head.target, 0, None, Refusal::BadRequest(why));
    };
    let (tls, authority, path) = match split_absolute_uri(&head.target) {
        Ok(split) => split,
        Err(why) => {
            bad(why);
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
    };
    let default_port = if tls { 443 } else { 80 };
    let (host_text, port) = match split_authority_default(authority, default_port) {
        Ok(split) => split,
        Err(why) => {
            bad(why);
            respond(&mut client, "400 Bad Request", "").await;
            return;
        }
    };
    let body = match check_request_headers(&head, host_text, port, default_port) {
        Ok(body) => body,
        Err((status, why)) => {
            refuse(run, host_text, port, None, Refusal::BadRequest(why));
            respond(&mut client, status, "").await;
            return;
        }
    };
    let (addr, upstream) = match open_upstream(run, host_text, port).await {
        Ok(opened) => opened,
        Err(fail) => {
            respond(&mut client, fail.http_status(), "").await;
            return;
        }
    };
    let request = build_request(run, &head, &path, authority, host_text, port, addr);
    let on_stop = |why| refuse(run, host_text, port, Some(addr), why);
    if !tls {
        forward_request(client, upstream, run, request, early, body, on_stop).await;
        return;
    }
    // An absolute https:// URI (busybox wget, some HTTP libraries): the proxy speaks TLS to
    // the upstream itself, verified against the host's roots.
    match intercept::connect_tls(upstream, host_text).await {
        Ok(tls_upstream) => {
            forward_request(client, tls_upstream, run, request, early, body, on_stop).await
        }
        Err(why) => {
            refuse(
                run,
                host_text,
                port,
                Some(addr),
                Refusal::ConnectFailed(why),
            );
            respond(&mut client, "502 Bad Gateway", "").await;
        }
    }
}

/// Checks the headers of a request to `host_text:port` (`default_port` when the `Host`
/// header names none): one decimal `Content-Length` at most, no `Transfer-Encoding`, and a
/// `Host` naming the same authority. Returns the body length, or the status and reason of
/// a refusal.
fn check_request_headers(
    head: &Head,
    host_text: &str,
    port: u16,
    default_port: u16,
) -> Result<u64, (&'static str, String)> {
    let mut length: Option<u64> = None;
    for (name, value) in &head.headers {
        let problem = match name.as_str() {
            "transfer-encoding" => {
                return Err((
                    "501 Not Implemented",
                    "Transfer-Encoding is not proxied".to_string(),
                ))
            }
            "content-length" if length.is_some() => Some("two Content-Length headers".into()),
            "content-length" => match value.parse::<u64>() {
                Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => {
                    length = Some(n);
                    None
                }
                _ => Some(format!("invalid Content-Length {value:?}")),
            },
            "host" => match split_authority_default(value, default_port) {
                Ok((h, p))
                    if p == port
                        && Host::parse(h).is_ok()
                        && Host::parse(h) == Host::parse(host_text) =>
                {
                    None
                }
                _ => Some(format!(
                    "the Host header {value:?} differs from the request's destination"
                )),
            },
            _ => None,
        };
        if let Some(why) = problem {
            return Err(("400 Bad Request", why));
        }
    }
    Ok(length.unwrap_or(0))
}

/// The request forwarded upstream: origin-form, the client's headers but hop-by-hop and
/// proxy ones, `connection: close`, and the run's secrets bound to `host_text` in place of
/// their placeholders (logged as a decision naming the variables, never the values).
fn build_request(
    run: &RunState,
    head: &Head,
    path: &str,
    authority: &str,
    host_text: &str,
    port: u16,
    addr: IpAddr,
) -> String {
    let mut headers = head.headers.clone();
    let sent = secrets::substitute(&mut headers, &run.secrets, host_text);
    if !sent.is_empty() {
        run.record(EgressEvent {
            host: host_text.to_string(),
            port,
            addr: Some(addr),
            outcome: Outcome::SecretsSent { env: sent },
        });
    }
    let mut request = format!("{} {path} HTTP/1.1\r\nhost: {authority}\r\n", head.method);
    for (name, value) in &headers {
        if !DROPPED_HEADERS.contains(&name.as_str()) {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    request.push_str("connection: close\r\n\r\n");
    request
}

/// Sends `request` and `body` bytes of the client's body (starting with `early`) upstream,
/// and the whole response back, counting bytes against the run's budget. Nothing after
/// the body is forwarded (one request per connection). `on_stop` gets why it was cut.
async fn forward_request<C, U>(
    client: C,
    upstream: U,
    run: &RunState,
    request: String,
    early: Vec<u8>,
    body: u64,
    on_stop: impl FnOnce(Refusal),
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let up = async {
        run.take_bytes(request.len() as u64)
            .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
        up_write
            .write_all(request.as_bytes())
            .await
            .map_err(|_| Stop::Io)?;
        let early_body = early.len().min(usize::try_from(body).unwrap_or(usize::MAX));
        if early_body > 0 {
            run.take_bytes(early_body as u64)
                .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
            up_write
                .write_all(&early[..early_body])
                .await
                .map_err(|_| Stop::Io)?;
        }
        let mut left = body - early_body as u64;
        let mut buf = vec![0u8; SPLICE_BUF];
        while left > 0 {
            let want = usize::try_from(left).unwrap_or(SPLICE_BUF).min(SPLICE_BUF);
            let n = client_read
                .read(&mut buf[..want])
                .await
                .map_err(|_| Stop::Io)?;
            if n == 0 {
                return Err(Stop::Io);
            }
            run.take_bytes(n as u64)
                .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
            up_write.write_all(&buf[..n]).await.map_err(|_| Stop::Io)?;
            left -= n as u64;
        }
        up_write.flush().await.map_err(|_| Stop::Io)?;
        // Keep the upstream write side open (some servers treat a half-close as an
        // abort); nothing more from the client is forwarded.
        Ok::<_, Stop>(up_write)
    };
    let down = copy(&mut up_read, &mut client_write, run);
    if let Err(Stop::Refused(why)) = tokio::try_join!(up, down) {
        on_stop(why);
    }
}

/// The SOCKS protocol version served (SOCKS5, RFC 1928).
const SOCKS_VERSION: u8 = 0x05;
/// The username/password method (RFC 1929): the username is the run's token.
const SOCKS_USERPASS: u8 = 0x02;

/// A SOCKS5 reply without a bound address (`0.0.0.0:0`).
fn socks_reply(code: u8) -> [u8; 10] {
    [SOCKS_VERSION, code, 0, 0x01, 0, 0, 0, 0, 0, 0]
}

/// Serves SOCKS5 (`CONNECT` only; the `h` of `socks5h`: names are resolved here, never by
/// the client). The version byte was already read. Only the username/password method is
/// offered, with the run's token as username; the password is ignored.
async fn serve_socks<S: AsyncRead + AsyncWrite + Unpin>(mut client: S, runs: Weak<Runs>) {
    let handshake = tokio::time::timeout(HEAD_TIMEOUT, socks_handshake(&mut client, &runs)).await;
    let (run, host_text, port) = match handshake {
        Ok(Ok(Some(request))) => request,
        Ok(Ok(None)) => return,
        Ok(Err(why)) => {
            tracing::warn!(target: "strata::egress", %why, "bad SOCKS5 request");
            let _ = client.write_all(&socks_reply(0x01)).await;
            return;
        }
        Err(_) => return,
    };
    let opened = match count_connection(&run, &host_text, port) {
        Ok(()) => open_upstream(&run, &host_text, port).await,
        Err(fail) => Err(fail),
    };
    let (addr, upstream) = match opened {
        Ok(opened) => opened,
        Err(fail) => {
            let _ = client.write_all(&socks_reply(fail.socks_reply())).await;
            let _ = client.shutdown().await;
            return;
        }
    };
    if client.write_all(&socks_reply(0x00)).await.is_err() {
        return;
    }
    if intercept::intercepts(&run, &host_text) {
        intercept::serve_intercepted(client, upstream, Vec::new(), &run, &host_text, port, addr)
            .await;
        return;
    }
    splice(client, upstream, Vec::new(), &run, &host_text, |why| {
        refuse(&run, &host_text, port, Some(addr), why);
    })
    .await;
}

/// The SOCKS5 greeting, authentication and request. `Ok(None)`: refused and answered
/// already (no acceptable method, wrong credential, a command other than `CONNECT`).
async fn socks_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    runs: &Weak<Runs>,
) -> Result<Option<(Arc<RunState>, String, u16)>, String> {
    let io = |err: io::Error| format!("read: {err}");
    let nmethods = client.read_u8().await.map_err(io)?;
    let mut methods = vec![0u8; usize::from(nmethods)];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&SOCKS_USERPASS) {
        tracing::warn!(target: "strata::egress", "SOCKS5 client offers no username/password method");
        let _ = client.write_all(&[SOCKS_VERSION, 0xff]).await;
        return Ok(None);
    }
    client
        .write_all(&[SOCKS_VERSION, SOCKS_USERPASS])
        .await
        .map_err(io)?;
    if client.read_u8().await.map_err(io)? != 0x01 {
        return Err("bad username/password subnegotiation version".into());
    }
    let ulen = client.read_u8().await.map_err(io)?;
    let mut user = vec![0u8; usize::from(ulen)];
    client.read_exact(&mut user).await.map_err(io)?;
    let plen = client.read_u8().await.map_err(io)?;
    let mut password = vec![0u8; usize::from(plen)];
    client.read_exact(&mut password).await.map_err(io)?;
    let run = std::str::from_utf8(&user)
        .ok()
        .and_then(|token| find_run(runs, token));
    let Some(run) = run else {
        tracing::warn!(target: "strata::egress", "missing or wrong SOCKS5 credential");
        let _ = client.write_all(&[0x01, 0x01]).await;
        return Ok(None);
    };
    client.write_all(&[0x01, 0x00]).await.map_err(io)?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await.map_err(io)?;
    let [version, command, reserved, atyp] = request;
    if version != SOCKS_VERSION || reserved != 0 {
        return Err("bad SOCKS5 request header".into());
    }
    let host_text = match atyp {
        0x01 => {
            let mut octets = [0u8; 4];
            client.read_exact(&mut octets).await.map_err(io)?;
            std::net::Ipv4Addr::from(octets).to_string()
        }
        0x04 => {
            let mut octets = [0u8; 16];
            client.read_exact(&mut octets).await.map_err(io)?;
            // Displayed in the form `Host::parse` reads; an IPv4-mapped address displays
            // as `::ffff:a.b.c.d`, which it refuses.
            std::net::Ipv6Addr::from(octets).to_string()
        }
        0x03 => {
            let len = client.read_u8().await.map_err(io)?;
            let mut name = vec![0u8; usize::from(len)];
            client.read_exact(&mut name).await.map_err(io)?;
            // Not UTF-8: keep it visible in the log; `Host::parse` refuses it anyway.
            String::from_utf8_lossy(&name).into_owned()
        }
        other => return Err(format!("unknown SOCKS5 address type {other}")),
    };
    let port = client.read_u16().await.map_err(io)?;
    if command != 0x01 {
        refuse(
            &run,
            &host_text,
            port,
            None,
            Refusal::BadRequest(format!("SOCKS5 command {command} is not served")),
        );
        let _ = client.write_all(&socks_reply(0x07)).await;
        return Ok(None);
    }
    if port == 0 {
        refuse(
            &run,
            &host_text,
            port,
            None,
            Refusal::BadRequest("port 0".into()),
        );
        let _ = client.write_all(&socks_reply(0x02)).await;
        return Ok(None);
    }
    Ok(Some((run, host_text, port)))
}

/// Copies bytes both ways until both sides are done, counting them against the run's byte
/// budget. Exceeding it calls `on_budget` (which logs it) and then drops both sides, so the
/// log has the reason before the client sees the connection close.
/// Splices a tunnel both ways, counting bytes against the run's budget. The client's first
/// bytes are inspected before any reach the upstream: a TLS server name or HTTP `Host`
/// naming another host than `authority` (the host the policy allowed) ends the tunnel, as
/// do malformed ones (see [`first_bytes`]). Upstream bytes flow from the start, so
/// server-speaks-first protocols work. `on_stop` gets why a tunnel was cut.
async fn splice<S: AsyncRead + AsyncWrite + Unpin>(
    client: S,
    upstream: TcpStream,
    early: Vec<u8>,
    run: &RunState,
    authority: &str,
    on_stop: impl FnOnce(Refusal),
) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = upstream.into_split();
    let up = async {
        let mut early = early;
        inspect_first_bytes(&mut client_read, &mut early, authority)
            .await
            .map_err(Stop::Refused)?;
        if !early.is_empty() {
            run.take_bytes(early.len() as u64)
                .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
            up_write.write_all(&early).await.map_err(|_| Stop::Io)?;
        }
        copy(&mut client_read, &mut up_write, run).await
    };
    let down = copy(&mut up_read, &mut client_write, run);
    if let Err(Stop::Refused(why)) = tokio::try_join!(up, down) {
        on_stop(why);
    }
}

/// Reads the client's first bytes into `early` until [`first_bytes::classify`] can decide,
/// and refuses a destination other than `authority`. A client that sends nothing (or
/// closes) has nothing to check; once it started, it has [`HEAD_TIMEOUT`] to finish.
async fn inspect_first_bytes<R: AsyncRead + Unpin>(
    client: &mut R,
    early: &mut Vec<u8>,
    authority: &str,
) -> Result<(), Refusal> {
    let authority = authority
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let mismatch = |what: &str, name: &str| {
        Refusal::BadRequest(format!(
            "the tunnel's {what} {name:?} differs from the allowed host {authority:?}"
        ))
    };
    let mut chunk = [0u8; 4096];
    let mut deadline = None;
    loop {
        match first_bytes::classify(early) {
            FirstBytes::NeedMore => {}
            FirstBytes::Tls { sni: Some(name) } if name != authority => {
                return Err(mismatch("TLS server name", &name))
            }
            FirstBytes::Http { host: Some(host) } if host != authority => {
                return Err(mismatch("HTTP Host", &host))
            }
            FirstBytes::Malformed(why) => return Err(Refusal::BadRequest(why.to_string())),
            _ => return Ok(()),
        }
        let read = client.read(&mut chunk);
        let n = match deadline {
            None => read.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, read).await {
                Ok(read) => read,
                Err(_) => {
                    return Err(Refusal::BadRequest(
                        "the client's first bytes did not arrive in time".into(),
                    ))
                }
            },
        };
        match n {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => {
                early.extend_from_slice(&chunk[..n]);
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + HEAD_TIMEOUT);
            }
        }
    }
}

enum Stop {
    Io,
    Refused(Refusal),
}

async fn copy<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    from: &mut R,
    to: &mut W,
    run: &RunState,
) -> Result<(), Stop> {
    let mut buf = vec![0u8; SPLICE_BUF];
    loop {
        let n = from.read(&mut buf).await.map_err(|_| Stop::Io)?;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        run.take_bytes(n as u64)
            .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
        to.write_all(&buf[..n]).await.map_err(|_| Stop::Io)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authority_split_refuses_unbracketed_ipv6_and_bad_ports() {
        assert_eq!(split_authority("a.com:443"), Ok(("a.com", 443)));
        assert_eq!(
            split_authority("[2001:db8::1]:443"),
            Ok(("2001:db8::1", 443))
        );
        assert!(split_authority("2001:db8::1:443").is_err());
        assert!(split_authority("a.com").is_err());
        assert!(split_authority("a.com:0").is_err());
        assert!(split_authority("a.com:+443").is_err());
        assert!(split_authority("a.com:65536").is_err());
        assert!(split_authority("a.com:000443").is_err());
    }

    #[test]
    fn head_parser_refuses_smuggling_shapes() {
        assert!(parse_head(b"CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n").is_ok());
        assert!(parse_head(b"CONNECT a.com:443 HTTP/1.1\r\nX: a\nb\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT a.com:443 HTTP/1.1\r\nX: a\0b\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT a.com:443 HTTP/1.1\r\nX: a\r\n b\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT  a.com:443 HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_head(b"CONNECT a.com:443 HTTP/2\r\n\r\n").is_err());
        assert!(parse_head(b"GET\0 http://a.com/ HTTP/1.1\r\n\r\n").is_err());
    }

    #[test]
    fn basic_credential_takes_the_user_only() {
        assert_eq!(basic_user("Basic YWJjOg=="), Some("abc".into()));
        assert_eq!(basic_user("basic YWJjOnh5eg=="), Some("abc".into()));
        assert_eq!(basic_user("Bearer abc"), None);
        assert_eq!(basic_user("Basic !!!"), None);
    }
}
