//! Strata's host-side egress proxy: the enforcing half of network allowlists
//! ([`sandbox_core::Net::Allow`]), on top of the pure policy in [`sandbox_core::egress`].
//!
//! One [`EgressProxy`] per embedding process serves listeners of two kinds: a run's own
//! ([`EgressProxy::attach`], [`EgressProxy::attach_unix`],
//! [`EgressProxy::attach_transparent`]: a listener only that run's sandbox can reach), and
//! shared ones ([`EgressProxy::bind`]'s loopback TCP port or Unix socket,
//! [`EgressProxy::serve_shared`]). Each run registers with [`EgressProxy::register`] and
//! gets a [`RunGrant`]: a random per-run credential, the run's [`EgressPolicy`], its
//! [`Budget`] and its decision log. A connection is tied to its run by the credential
//! (`Proxy-Authorization: Basic base64(TOKEN:)`); without the right one it is refused with
//! `407` before anything else happens (a run's own listener takes only its run's
//! credential).
//!
//! Backends do not drive the proxy directly: [`host::EgressHost`] is a backend's proxy on
//! its own runtime thread, and [`host::RunEgress`] one run's registration (policy with the
//! host's own addresses refused, budget, secrets, the tool's proxy variables and trust
//! files, and the receipt at the end).
//!
//! Served today, on the same listeners (told apart by the first byte): HTTP
//! `CONNECT host:port` and SOCKS5 `CONNECT` with names resolved by the proxy (`socks5h`),
//! both as byte tunnels, and plain-HTTP proxying of absolute `http://` (and `https://`)
//! URIs, one request per connection. The SOCKS5 credential is the username/password
//! method (RFC 1929) with the token as username; a client offering no such method is
//! refused. Per connection the proxy
//!
//! 1. admits it under [`ClientLimits`] (see below) and reads the request head under strict
//!    limits ([`MAX_HEAD_BYTES`], [`MAX_HEADERS`], [`ClientLimits::auth_timeout`]); CR or
//!    LF anywhere but at a line end, NUL in a header, obsolete line folding and duplicate
//!    credentials are refused;
//! 2. splits the authority (`host:port` or `[v6]:port`, decimal port 1-65535) and parses the
//!    host with [`Host::parse`], the same strict parser the rules went through: anything it
//!    refuses is refused (`403`) without any resolution;
//! 3. asks [`EgressPolicy::check_name`]; a name no rule admits is never resolved;
//! 4. resolves the name once ([`resolve::resolve`]: the hosts file, then the absolute
//!    name, so no search domain is appended), checks every address with
//!    [`EgressPolicy::check_addr`] and connects only to an allowed one, which stays pinned
//!    for the connection (no second resolution, so no DNS rebinding);
//! 5. in a tunnel, reads the client's first bytes before any reach the upstream
//!    ([`first_bytes`]): a TLS server name or HTTP `Host` naming another host ends it, and
//!    an HTTP request is carried alone: checked and rebuilt like a plain-HTTP one (its
//!    body framed by one `Content-Length`, `Transfer-Encoding` refused, `connection:
//!    close` sent on), with nothing the client sends after its body forwarded;
//! 6. splices bytes both ways, counting them against the run's byte budget.
//!
//! # One destination per connection
//!
//! A connection reaches one host, named once. The proxy sees every plain-HTTP request it
//! carries, and carries one per connection (plain-HTTP proxying, and HTTP inside `CONNECT`,
//! SOCKS5 and transparent tunnels), so a pipelined or kept-alive second request for
//! another `Host` never reaches the pinned address; clients open a new connection per
//! request. Upgrades (`ws://` WebSockets, `h2c`) and chunked request bodies are not
//! carried over plain HTTP (use TLS).
//!
//! Inside TLS the proxy sees only the ClientHello: the server name must be the allowed
//! host (or absent), once per connection. What the client sends after the handshake is
//! encrypted, so requests inside it are not seen: an HTTP/2 client may reuse ("coalesce")
//! the connection for another name the server's certificate covers and that resolved to
//! the same address, and a server that routes by the inner `Host` or `:authority` rather
//! than the server name can be asked for another of its hosts. The allowlist therefore
//! bounds the addresses and the server names reached, not which of a shared front end's
//! hosts answers inside TLS; secrets ([`EgressProxy::register_with_secrets`]) are the
//! exception, as those tunnels are terminated and read (one request per connection).
//!
//! # No run starves another
//!
//! Every connection holds one of the proxy's slots ([`ClientLimits::max_clients`]). On a
//! run's own listener each accepted connection counts against that run at once, before it
//! sent anything: against its connection budget ([`Budget::max_connections`]) and its
//! share of the slots ([`ClientLimits::max_clients_per_run`]); past either it is closed
//! (past the budget, after a `429` or SOCKS5 refusal where it sends a request). On shared
//! listeners a connection counts against its run once its credential is checked; before
//! that it holds one of a bounded number of unauthenticated places, in all and per peer
//! address ([`ClientLimits::max_unauthenticated`],
//! [`ClientLimits::max_unauthenticated_per_peer`]). A client that has not presented its
//! credential within [`ClientLimits::auth_timeout`] is closed. Tunnels, once admitted,
//! have no idle timeout: they hold their run's slots until either side closes.
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
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::admission::{accept_error, accept_run, accept_shared, AcceptOne, Gate};
use crate::tunnel::splice;

mod admission;
mod decision;
pub mod first_bytes;
pub mod host;
mod http1;
mod intercept;
pub mod resolve;
pub mod secrets;
mod socks;
mod tunnel;

pub use admission::{
    ClientLimits, AUTH_TIMEOUT, MAX_CLIENTS, MAX_CLIENTS_PER_RUN, MAX_UNAUTHENTICATED,
    MAX_UNAUTHENTICATED_PER_PEER,
};
pub use decision::denials;

/// Longest request head (request line and headers, with the final blank line), in bytes.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Most header lines in a request head.
pub const MAX_HEADERS: usize = 64;
/// How long a client may take, once admitted, to send a head or a tunnel's first bytes: an
/// intercepted request's head, the TLS handshake of an intercepted tunnel, a tunnel's
/// first bytes once they started. The first head, which carries the credential, is bound
/// by [`ClientLimits::auth_timeout`] ([`AUTH_TIMEOUT`]) instead.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the proxy waits for the upstream TCP connection (per address).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most entries a run's log keeps between drains; later ones are counted, not kept, so a
/// flood of refused requests cannot grow the host's memory without bound.
pub const MAX_LOG_ENTRIES: usize = 10_000;
/// Size of the splice buffer per direction.
pub(crate) const SPLICE_BUF: usize = 16 * 1024;

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
    /// Most connections. On the run's own listeners every accepted connection counts, at
    /// accept, before it sent anything (so idle or unauthenticated ones count too); on
    /// shared listeners every authenticated request counts. Refused ones count as well, so
    /// a flood of refused requests is cut too. `None`: unlimited.
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
    /// [`ClientLimits::max_clients_per_run`]: the run's connections open at once.
    Concurrent {
        /// The limit.
        max: u64,
    },
}

impl fmt::Display for BudgetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetLimit::Connections { max } => write!(f, "connection budget of {max} exceeded"),
            BudgetLimit::Bytes { max } => write!(f, "byte budget of {max} exceeded"),
            BudgetLimit::Concurrent { max } => {
                write!(f, "more than {max} connections of the run at once")
            }
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
pub(crate) struct RunState {
    policy: EgressPolicy,
    budget: Budget,
    /// Secrets bound to hosts, substituted in request headers to those hosts.
    secrets: Vec<secrets::BoundSecret>,
    /// The run's certificate authority, when it has secrets (for HTTPS interception).
    ca: Option<intercept::RunCa>,
    connections: AtomicU64,
    bytes: AtomicU64,
    log: EgressLog,
    /// The run's share of the proxy's client slots ([`ClientLimits::max_clients_per_run`]).
    slots: Arc<Semaphore>,
    max_slots: usize,
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
    pub(crate) fn record(&self, event: EgressEvent) {
        self.log.record(event);
    }

    /// Reserves `n` bytes of the byte budget; `Err` if that would exceed it.
    pub(crate) fn take_bytes(&self, n: u64) -> Result<(), BudgetLimit> {
        let before = self.bytes.fetch_add(n, Ordering::Relaxed);
        match self.budget.max_bytes {
            Some(max) if before.saturating_add(n) > max => Err(BudgetLimit::Bytes { max }),
            _ => Ok(()),
        }
    }
}

pub(crate) type Runs = Mutex<HashMap<String, Arc<RunState>>>;

/// The host-side egress proxy. Dropping it stops its listeners (tunnels already open keep
/// running until either side closes or their run's budget is exhausted).
///
/// Must be created inside a tokio runtime (it spawns its accept loops there).
#[derive(Debug)]
pub struct EgressProxy {
    runs: Arc<Runs>,
    gate: Arc<Gate>,
    runtime: tokio::runtime::Handle,
    tcp_addr: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
    tasks: Vec<JoinHandle<()>>,
}

impl EgressProxy {
    /// Starts listening on every listener given, with the default [`ClientLimits`]. With
    /// none, the proxy serves only the per-run listeners handed to [`EgressProxy::attach`].
    /// These listeners serve every registered run, told apart by credential (like
    /// [`EgressProxy::serve_shared`]).
    pub async fn bind(listen: &[Listen]) -> io::Result<EgressProxy> {
        EgressProxy::bind_with_limits(listen, ClientLimits::default()).await
    }

    /// Like [`EgressProxy::bind`], with these limits on its clients.
    pub async fn bind_with_limits(
        listen: &[Listen],
        limits: ClientLimits,
    ) -> io::Result<EgressProxy> {
        let mut proxy =
            EgressProxy::attach_only_with_limits(tokio::runtime::Handle::current(), limits);
        for listener in listen {
            let runs = Arc::downgrade(&proxy.runs);
            let gate = proxy.gate.clone();
            let task = match listener {
                Listen::TcpLoopback => {
                    let tcp = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
                    proxy.tcp_addr = Some(tcp.local_addr()?);
                    tokio::spawn(accept_shared(tcp, runs, gate))
                }
                Listen::Unix(path) => {
                    let unix = UnixListener::bind(path)?;
                    proxy.unix_path = Some(path.clone());
                    tokio::spawn(accept_shared(unix, runs, gate))
                }
            };
            proxy.tasks.push(task);
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
            slots: self.gate.run_slots(),
            max_slots: self.gate.limits.max_clients_per_run,
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
    /// [`EgressProxy::attach`] (and shared ones, [`EgressProxy::serve_shared`]), on
    /// `runtime`, with the default [`ClientLimits`]. Callable from any thread, inside a
    /// runtime or not.
    pub fn attach_only(runtime: tokio::runtime::Handle) -> EgressProxy {
        EgressProxy::attach_only_with_limits(runtime, ClientLimits::default())
    }

    /// Like [`EgressProxy::attach_only`], with these limits on its clients.
    pub fn attach_only_with_limits(
        runtime: tokio::runtime::Handle,
        limits: ClientLimits,
    ) -> EgressProxy {
        EgressProxy {
            runs: Arc::default(),
            gate: Arc::new(Gate::new(limits)),
            runtime,
            tcp_addr: None,
            unix_path: None,
            tasks: Vec::new(),
        }
    }

    /// The limits on this proxy's clients.
    pub fn limits(&self) -> ClientLimits {
        self.gate.limits
    }

    /// Serves `listener` for the run of `grant` only: a listener bound inside one
    /// sandbox's network namespace and passed out, so the sandbox's only way out is this
    /// proxy. Clients on it still need the run's credential, and no other run's credential
    /// works on it. Each accepted connection counts against the run at once (its
    /// connection budget and [`ClientLimits::max_clients_per_run`]), and must present the
    /// credential within [`ClientLimits::auth_timeout`]. Callable from any thread (the
    /// proxy keeps its runtime's handle). Serving stops when the returned [`Attached`]
    /// drops.
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
        let accept = accept_run(listener, weak, grant.token.clone(), self.gate.clone());
        let task = self.runtime.spawn(accept);
        Attached { task, runs }
    }
}

impl EgressProxy {
    /// Serves every run registered with this proxy on `listener`, each client tied to its
    /// run by the credential it presents (without a registered one: `407`). For sandboxes
    /// that reach the proxy over a network rather than through a listener of their own (a
    /// cluster's pods, whose NetworkPolicy lets them reach only this address). Until its
    /// credential is checked a connection holds one of the unauthenticated places
    /// ([`ClientLimits::max_unauthenticated`], and
    /// [`ClientLimits::max_unauthenticated_per_peer`] per peer address) for at most
    /// [`ClientLimits::auth_timeout`]; then it counts against its run. Callable from any
    /// thread. Serving stops when the returned [`SharedListener`] drops; the runs stay
    /// registered.
    pub fn serve_shared(&self, listener: std::net::TcpListener) -> io::Result<SharedListener> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let _entered = self.runtime.enter();
        let tcp = TcpListener::from_std(listener)?;
        let accept = accept_shared(tcp, Arc::downgrade(&self.runs), self.gate.clone());
        let task = self.runtime.spawn(accept);
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
    /// server name or HTTP `Host` must be that name; an HTTP request is carried alone),
    /// budgets, secrets. Each accepted connection counts against the run at once, as on
    /// [`EgressProxy::attach`]. A connection to an address no name maps to is refused.
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
        let gate = self.gate.clone();
        let names = Arc::new(names);
        let task = self.runtime.spawn(async move {
            loop {
                match tcp.accept().await {
                    Ok((stream, _)) => {
                        let Some(run) = find_run(&weak, &token) else {
                            continue;
                        };
                        // The destination is the address the tool connected to.
                        let Ok(local) = stream.local_addr() else {
                            continue;
                        };
                        let host = names.get(&local.ip()).cloned();
                        let shown = host.clone().unwrap_or_else(|| local.ip().to_string());
                        let Some(mut ticket) = gate.admit_run(&run, &shown, local.port()) else {
                            continue;
                        };
                        if ticket.admit(&run, &shown, local.port()).is_err() {
                            continue;
                        }
                        tokio::spawn(async move {
                            serve_transparent(stream, &run, host, local).await;
                            drop(ticket);
                        });
                    }
                    Err(err) => accept_error(err).await,
                }
            }
        });
        Ok(Attached { task, runs })
    }
}

/// One transparent connection, admitted to its run already: `local` (the address the tool
/// connected to) names the port, and the host if `host` is its name.
async fn serve_transparent(
    client: TcpStream,
    run: &RunState,
    host: Option<String>,
    local: SocketAddr,
) {
    let port = local.port();
    let Some(host) = host else {
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
    let host = host.as_str();
    let Ok((addr, upstream)) = open_upstream(run, host, port).await else {
        return;
    };
    if intercept::intercepts(run, host) {
        intercept::serve_intercepted(client, upstream, Vec::new(), run, host, port, addr).await;
        return;
    }
    splice(client, upstream, Vec::new(), run, host, port, addr).await;
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

    /// Connections counted against the budget so far (see [`Budget::max_connections`]).
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

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Why [`open_upstream`] gave up (already logged); each protocol maps it to its reply.
pub(crate) enum Fail {
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
    pub(crate) fn http_status(&self) -> &'static str {
        match self {
            Fail::Budget => "429 Too Many Requests",
            Fail::Forbidden => "403 Forbidden",
            Fail::Unresolvable | Fail::ConnectFailed => "502 Bad Gateway",
        }
    }

    /// The SOCKS5 reply code (RFC 1928 section 6).
    pub(crate) fn socks_reply(&self) -> u8 {
        match self {
            Fail::Budget | Fail::Forbidden => 0x02,
            Fail::Unresolvable => 0x04,
            Fail::ConnectFailed => 0x05,
        }
    }
}

pub(crate) fn refuse(
    run: &RunState,
    host: &str,
    port: u16,
    addr: Option<IpAddr>,
    refusal: Refusal,
) {
    run.record(EgressEvent {
        host: host.to_string(),
        port,
        addr,
        outcome: Outcome::Refused(refusal),
    });
}

/// The decision pipeline shared by every protocol: parse the host with the one strict
/// parser, check the name, resolve once, check every address, connect to the first allowed
/// one (pinned: it is never resolved again). Every decision is logged.
pub(crate) async fn open_upstream(
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

pub(crate) fn find_run(runs: &Weak<Runs>, token: &str) -> Option<Arc<RunState>> {
    let runs = runs.upgrade()?;
    let run = lock(&runs).get(token).cloned();
    run
}
