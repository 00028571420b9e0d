//! Admission of client connections, so that no run and no unauthenticated client can take
//! the proxy from the others:
//!
//! - every connection holds one of the proxy's slots ([`ClientLimits::max_clients`]);
//! - a connection tied to a run also holds one of that run's slots
//!   ([`ClientLimits::max_clients_per_run`]) and counts against its connection budget
//!   ([`crate::Budget::max_connections`]); on a run's own listener (`attach`, `attach_unix`,
//!   `attach_transparent`) both happen at accept, before the client has sent anything,
//!   and a connection past either is closed at once (past the budget it is refused after
//!   its request head, with `429`, where the protocol has a way to say so);
//! - on a shared listener (`bind`, `serve_shared`) the run is known only from the
//!   credential, so until then a connection holds a place among the unauthenticated ones
//!   ([`ClientLimits::max_unauthenticated`] in all, [`ClientLimits::max_unauthenticated_per_peer`]
//!   per peer address); then it is admitted to its run like the others;
//! - a client has [`ClientLimits::auth_timeout`] from accept to present its credential
//!   (the whole first request head, or the SOCKS5 handshake), and is closed after it.
//!
//! Refusals at accept on a run's own listener go to the run's log with an empty host
//! (nothing was asked for yet).

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http1::serve;
use crate::{find_run, lock, refuse, BudgetLimit, Fail, Refusal, RunState, Runs};

/// Default most client connections served at once by one proxy (all runs and listeners
/// together, tunnels included); past it new connections are closed at once, so clients
/// cannot exhaust the host's file descriptors (the proxy holds up to two per client: the
/// client's and the upstream's).
pub const MAX_CLIENTS: usize = 4096;
/// Default most client connections one run holds at once (its own listeners and, once
/// authenticated, the shared ones together): one run can hold at most this many of the
/// proxy's [`MAX_CLIENTS`] slots.
pub const MAX_CLIENTS_PER_RUN: usize = 128;
/// Default most connections on shared listeners that have not presented a credential yet,
/// all peers together.
pub const MAX_UNAUTHENTICATED: usize = 1024;
/// Default most connections from one peer address on shared listeners that have not
/// presented a credential yet (a Unix socket's peers share [`MAX_UNAUTHENTICATED`] only).
pub const MAX_UNAUTHENTICATED_PER_PEER: usize = 64;
/// Default time a new client has, from accept, to present its credential: the whole first
/// request head for HTTP, the greeting, credential and request for SOCKS5. Separate from
/// [`crate::HEAD_TIMEOUT`], which bounds the heads and first bytes read once the client
/// is admitted.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Limits on the proxy's client connections. [`ClientLimits::default`] is the constants
/// of this module: [`MAX_CLIENTS`], [`MAX_CLIENTS_PER_RUN`], [`MAX_UNAUTHENTICATED`],
/// [`MAX_UNAUTHENTICATED_PER_PEER`] and [`AUTH_TIMEOUT`]. Counts past
/// [`Semaphore::MAX_PERMITS`] are taken as that; a count of 0 refuses every connection of
/// its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Most client connections served at once, all runs and listeners together.
    pub max_clients: usize,
    /// Most client connections one run holds at once.
    pub max_clients_per_run: usize,
    /// Most connections not authenticated yet on shared listeners, all peers together.
    pub max_unauthenticated: usize,
    /// Most connections not authenticated yet on shared listeners from one peer address.
    pub max_unauthenticated_per_peer: usize,
    /// Time a new client has, from accept, to present its credential.
    pub auth_timeout: Duration,
}

impl Default for ClientLimits {
    fn default() -> ClientLimits {
        ClientLimits {
            max_clients: MAX_CLIENTS,
            max_clients_per_run: MAX_CLIENTS_PER_RUN,
            max_unauthenticated: MAX_UNAUTHENTICATED,
            max_unauthenticated_per_peer: MAX_UNAUTHENTICATED_PER_PEER,
            auth_timeout: AUTH_TIMEOUT,
        }
    }
}

/// A semaphore of `n` permits (at most [`Semaphore::MAX_PERMITS`]).
fn permits(n: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))
}

/// Unauthenticated connections per peer address.
type Peers = Mutex<HashMap<IpAddr, usize>>;

/// The proxy's admission state, shared by all its listeners.
#[derive(Debug)]
pub(crate) struct Gate {
    pub(crate) limits: ClientLimits,
    clients: Arc<Semaphore>,
    unauthenticated: Arc<Semaphore>,
    peers: Arc<Peers>,
}

impl Gate {
    pub(crate) fn new(limits: ClientLimits) -> Gate {
        Gate {
            limits,
            clients: permits(limits.max_clients),
            unauthenticated: permits(limits.max_unauthenticated),
            peers: Arc::default(),
        }
    }

    /// A new run's slots.
    pub(crate) fn run_slots(&self) -> Arc<Semaphore> {
        permits(self.limits.max_clients_per_run)
    }

    fn client_slot(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.clients.clone().try_acquire_owned().ok();
        if slot.is_none() {
            tracing::warn!(target: "strata::egress", max = self.limits.max_clients, "too many clients; closing");
        }
        slot
    }

    /// Admits a connection on a shared listener from `peer` (`None`: a Unix socket), until
    /// its credential says which run it is: `None` (close it) when the proxy's slots or
    /// the unauthenticated places (in all, or of this peer) are taken.
    pub(crate) fn admit_shared(&self, peer: Option<IpAddr>) -> Option<Ticket> {
        let client = self.client_slot()?;
        let Ok(overall) = self.unauthenticated.clone().try_acquire_owned() else {
            tracing::warn!(target: "strata::egress", max = self.limits.max_unauthenticated, "too many unauthenticated clients; closing");
            return None;
        };
        let mut place = Unauthenticated {
            _overall: overall,
            peer: None,
        };
        if let Some(ip) = peer.map(|ip| ip.to_canonical()) {
            let mut peers = lock(&self.peers);
            let count = peers.entry(ip).or_insert(0);
            if *count >= self.limits.max_unauthenticated_per_peer {
                if *count == 0 {
                    peers.remove(&ip);
                }
                tracing::warn!(target: "strata::egress", %ip, max = self.limits.max_unauthenticated_per_peer, "too many unauthenticated clients from one peer; closing");
                return None;
            }
            *count += 1;
            place.peer = Some((ip, self.peers.clone()));
        }
        Some(Ticket {
            _client: client,
            standing: Standing::Unauthenticated { _place: place },
        })
    }

    /// Admits a connection on `run`'s own listener, before it sent anything: it counts
    /// against the run's connection budget and takes one of the run's slots and one of
    /// the proxy's. `None` (close it) when a slot is missing; a connection past the budget
    /// is admitted to be refused after its head. `host` and `port` name the destination if
    /// the listener implies one (transparent), for the log.
    pub(crate) fn admit_run(&self, run: &RunState, host: &str, port: u16) -> Option<Ticket> {
        let over_budget = count_connection(run, host, port).is_err();
        let Ok(slot) = run.slots.clone().try_acquire_owned() else {
            if !over_budget {
                let max = self.limits.max_clients_per_run as u64;
                let limit = BudgetLimit::Concurrent { max };
                refuse(run, host, port, None, Refusal::Budget(limit));
            }
            return None;
        };
        let Some(client) = self.client_slot() else {
            if !over_budget {
                let why = format!(
                    "the proxy serves its maximum of {} clients",
                    self.limits.max_clients
                );
                refuse(run, host, port, None, Refusal::ConnectFailed(why));
            }
            return None;
        };
        Some(Ticket {
            _client: client,
            standing: Standing::Admitted {
                _slot: slot,
                over_budget,
            },
        })
    }
}

/// What one client connection holds while it is served: one of the proxy's slots, and
/// either a place among the unauthenticated connections or one of its run's slots.
/// Dropping it gives them back.
#[derive(Debug)]
pub(crate) struct Ticket {
    _client: OwnedSemaphorePermit,
    standing: Standing,
}

#[derive(Debug)]
enum Standing {
    /// On a shared listener, before the credential.
    Unauthenticated { _place: Unauthenticated },
    /// Tied to its run: counted against its connection budget (past it if `over_budget`),
    /// holding one of its slots.
    Admitted {
        _slot: OwnedSemaphorePermit,
        over_budget: bool,
    },
}

impl Ticket {
    /// Ties the connection to `run`, whose credential it presented (or whose own listener
    /// it came through), before anything is done for it: on a shared listener it is
    /// counted against the run's connection budget and takes one of the run's slots (its
    /// unauthenticated place is given back); on the run's own listener that happened at
    /// accept, and a connection that was past the budget is refused now. Refusals are
    /// logged with `host` and `port`.
    pub(crate) fn admit(&mut self, run: &RunState, host: &str, port: u16) -> Result<(), Fail> {
        match &self.standing {
            Standing::Admitted {
                over_budget: true, ..
            } => Err(Fail::Budget),
            Standing::Admitted { .. } => Ok(()),
            Standing::Unauthenticated { .. } => {
                count_connection(run, host, port)?;
                let Ok(slot) = run.slots.clone().try_acquire_owned() else {
                    let limit = BudgetLimit::Concurrent {
                        max: run.max_slots as u64,
                    };
                    refuse(run, host, port, None, Refusal::Budget(limit));
                    return Err(Fail::Budget);
                };
                self.standing = Standing::Admitted {
                    _slot: slot,
                    over_budget: false,
                };
                Ok(())
            }
        }
    }
}

/// A place among the unauthenticated connections of shared listeners: one of all of
/// them, and one of its peer's.
#[derive(Debug)]
struct Unauthenticated {
    _overall: OwnedSemaphorePermit,
    peer: Option<(IpAddr, Arc<Peers>)>,
}

impl Drop for Unauthenticated {
    fn drop(&mut self) {
        if let Some((ip, peers)) = &self.peer {
            let mut peers = lock(peers);
            if let Some(count) = peers.get_mut(ip) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    peers.remove(ip);
                }
            }
        }
    }
}

/// Counts a connection against the run's budget; past it, logs the refusal.
pub(crate) fn count_connection(run: &RunState, host: &str, port: u16) -> Result<(), Fail> {
    let count = run
        .connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    match run.budget.max_connections {
        Some(max) if count > max => {
            let limit = BudgetLimit::Connections { max };
            refuse(run, host, port, None, Refusal::Budget(limit));
            Err(Fail::Budget)
        }
        _ => Ok(()),
    }
}

/// A listener whose connections the proxy serves.
pub(crate) trait AcceptOne: Send + Sync + 'static {
    /// The connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection, and its peer's address if it has one.
    fn accept_one(
        &self,
    ) -> impl std::future::Future<Output = io::Result<(Self::Stream, Option<IpAddr>)>> + Send;
}

impl AcceptOne for TcpListener {
    type Stream = TcpStream;
    async fn accept_one(&self) -> io::Result<(TcpStream, Option<IpAddr>)> {
        self.accept()
            .await
            .map(|(stream, peer)| (stream, Some(peer.ip())))
    }
}

impl AcceptOne for UnixListener {
    type Stream = UnixStream;
    async fn accept_one(&self) -> io::Result<(UnixStream, Option<IpAddr>)> {
        self.accept().await.map(|(stream, _)| (stream, None))
    }
}

/// Serves `listener` for every run of `runs`, each client tied to its run by its
/// credential, until the task is aborted.
pub(crate) async fn accept_shared<L: AcceptOne>(listener: L, runs: Weak<Runs>, gate: Arc<Gate>) {
    loop {
        match listener.accept_one().await {
            Ok((stream, peer)) => {
                if let Some(ticket) = gate.admit_shared(peer) {
                    let auth_timeout = gate.limits.auth_timeout;
                    tokio::spawn(serve(stream, runs.clone(), ticket, auth_timeout));
                }
            }
            Err(err) => accept_error(err).await,
        }
    }
}

/// Serves `listener` for the run of `token` in `runs` only (a run's own listener), until
/// the task is aborted or the run is gone.
pub(crate) async fn accept_run<L: AcceptOne>(
    listener: L,
    runs: Weak<Runs>,
    token: String,
    gate: Arc<Gate>,
) {
    loop {
        match listener.accept_one().await {
            Ok((stream, _)) => {
                let Some(run) = find_run(&runs, &token) else {
                    continue;
                };
                if let Some(ticket) = gate.admit_run(&run, "", 0) {
                    let auth_timeout = gate.limits.auth_timeout;
                    tokio::spawn(serve(stream, runs.clone(), ticket, auth_timeout));
                }
            }
            Err(err) => accept_error(err).await,
        }
    }
}

/// Backs off after an accept error (file descriptor exhaustion must not spin).
pub(crate) async fn accept_error(err: io::Error) {
    tracing::warn!(target: "strata::egress", error = %err, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}
