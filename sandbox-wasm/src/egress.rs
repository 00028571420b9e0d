//! Network allowlists for components ([`sandbox_core::Net::Allow`]): `wasi:sockets` checked
//! against the same [`EgressPolicy`] the egress proxy uses, host names included.
//!
//! wasmtime-wasi resolves names itself (`tokio::net::lookup_host` on whatever string the
//! guest passed, before any check) and lets an embedder check only socket addresses
//! ([`SocketAddrUse`]), so a name rule cannot be enforced through its configuration alone.
//! This module therefore replaces, by shadowing in the component linker, the pieces that
//! decide; a run without an allowlist is handed to wasmtime-wasi's own implementation
//! unchanged:
//!
//! 1. `wasi:sockets/ip-name-lookup`, the whole interface with its stream resource: the name
//!    goes through [`EgressPolicy::check_lookup`] first, and a name no rule matches is
//!    refused (`access-denied`, or `invalid-argument` for a name the strict parser refuses)
//!    without being resolved, so no DNS query leaves the host for it. An admitted name is
//!    resolved by [`sandbox_egress::resolve::resolve`] (the hosts file, then the absolute
//!    name, as the proxy does), and the run remembers which names gave which addresses.
//! 2. The socket address check: a TCP connection to `addr:port` is allowed only if
//!    [`EgressPolicy::check_addr`] allows it for a name this run resolved to `addr`, or for
//!    `addr` itself as an IP literal ([`EgressPolicy::check_name`]). Reserved ranges and the
//!    host's own addresses are open only through an explicit IP/CIDR rule, as everywhere.
//!    Binding (except the implicit wildcard bind every connect makes), listening and
//!    accepting are refused, and UDP sockets cannot be created at all: no rule names a
//!    datagram peer, and DNS over UDP is the exfiltration channel this closes.
//! 3. `tcp-socket.finish-connect`: the two streams of every allowed connection are metered
//!    against `limits.egress_bytes` (both directions, all connections together); past it
//!    they fail and no new connection is allowed. Connections (allowed or refused) count
//!    against `limits.egress_connections`, and so, separately, do the names the run has
//!    resolved.
//!
//! Each decision goes to the run's [`EgressLog`] (and to `tracing`, target
//! `strata::egress`), and from there into the receipt's `network` section and `denials`.
//!
//! Preview 1 modules have no socket functions, so all of this concerns components.

use sandbox_core::SetupStage;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use sandbox_core::egress::{Decision, DenyReason, EgressPolicy, Host};
use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{Error, Limits, Result};
use sandbox_egress::{BudgetLimit, EgressEvent, EgressLog, Outcome, Refusal};
use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::bindings::sockets::ip_name_lookup::{
    self, HostResolveAddressStream, ResolveAddressStream,
};
use wasmtime_wasi::p2::bindings::sockets::network::{ErrorCode, IpAddress, Network};
use wasmtime_wasi::p2::bindings::sockets::tcp::{HostTcpSocket, TcpSocket};
use wasmtime_wasi::p2::{
    DynInputStream, DynOutputStream, DynPollable, InputStream, OutputStream, Pollable, StreamError,
    StreamResult,
};
use wasmtime_wasi::runtime::AbortOnDropJoinHandle;
use wasmtime_wasi::sockets::{SocketAddrUse, WasiSocketsView};

use crate::plan::{NetPlan, Plan};
use crate::state::State;

/// The `wasi:sockets/ip-name-lookup` instance wasmtime-wasi defines (its bundled WIT
/// version; components built against an older 0.2 release link to it by semver).
const IP_NAME_LOOKUP: &str = "wasi:sockets/ip-name-lookup@0.2.12";
/// The `wasi:sockets/tcp` instance wasmtime-wasi defines.
const SOCKETS_TCP: &str = "wasi:sockets/tcp@0.2.12";
/// What the receipt names as the enforcer.
pub(crate) const ENFORCER: &str = "wasi:sockets";

/// The egress state of one run under an allowlist: the policy, the budgets, which names
/// resolved to which addresses, and the decision log.
#[derive(Debug)]
pub(crate) struct EgressGuard {
    policy: EgressPolicy,
    rules: Vec<String>,
    max_connections: u64,
    max_bytes: u64,
    /// Connection requests so far (allowed or refused).
    connections: AtomicU64,
    /// Names sent to the resolver so far.
    lookups: AtomicU64,
    /// Bytes through allowed connections so far, both directions.
    bytes: AtomicU64,
    names: Mutex<Names>,
    log: EgressLog,
}

#[derive(Debug, Default)]
struct Names {
    /// For each address a lookup of this run returned, the names that gave it, oldest
    /// first.
    resolved: HashMap<IpAddr, Vec<String>>,
    /// For each allowed connection, the host it was allowed for (for the byte budget's
    /// log entry).
    connected: HashMap<SocketAddr, String>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The guard of a run whose plan has an allowlist; `None` otherwise. The host's own
/// addresses are listed now, so an interface that came up since the last run counts.
pub(crate) fn guard(plan: &Plan, limits: &Limits) -> Result<Option<Arc<EgressGuard>>> {
    let NetPlan::Allow { policy, rules } = &plan.net else {
        return Ok(None);
    };
    let own = sandbox_egress::host::host_addresses().map_err(|e| {
        Error::setup(
            SetupStage::Egress,
            "list the host's addresses for the egress policy",
            e,
        )
    })?;
    Ok(Some(Arc::new(EgressGuard {
        policy: policy.clone().with_host_addrs(own),
        rules: rules.clone(),
        max_connections: u64::from(limits.egress_connections),
        max_bytes: limits.egress_bytes.bytes(),
        connections: AtomicU64::new(0),
        lookups: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        names: Mutex::default(),
        log: EgressLog::new(),
    })))
}

impl EgressGuard {
    fn allow(&self, host: &str, port: u16, addr: Option<IpAddr>, rule: String) {
        self.log.record(EgressEvent {
            host: host.to_string(),
            port,
            addr,
            outcome: Outcome::Allowed { rule },
        });
    }

    fn refuse(&self, host: &str, port: u16, addr: Option<IpAddr>, refusal: Refusal) {
        self.log.record(EgressEvent {
            host: host.to_string(),
            port,
            addr,
            outcome: Outcome::Refused(refusal),
        });
    }

    /// The socket address check wasmtime-wasi calls before every bind, listen, accept and
    /// connect (UDP never gets that far: its sockets cannot be created).
    pub(crate) fn check_socket(&self, addr: SocketAddr, usage: SocketAddrUse) -> bool {
        let what = match usage {
            SocketAddrUse::TcpConnect => return self.check_connect(addr),
            // wasmtime-wasi checks the implicit bind of a connect as a bind to the wildcard
            // address and port 0. A guest's own bind there gets an ephemeral port it can
            // only connect from, since listening is refused.
            SocketAddrUse::TcpBind if addr.ip().is_unspecified() && addr.port() == 0 => {
                return true
            }
            SocketAddrUse::TcpBind => format!("binding to {addr}"),
            SocketAddrUse::TcpListen => format!("listening on {addr}"),
            SocketAddrUse::TcpAccept => format!("accepting a connection from {addr}"),
            _ => format!("UDP with {addr}"),
        };
        self.refuse(
            &addr.ip().to_string(),
            addr.port(),
            Some(addr.ip()),
            Refusal::Policy(DenyReason::Inbound { what }),
        );
        false
    }

    /// A TCP connection to `addr`: allowed for a name this run resolved to it, or for the
    /// address as an IP literal; counted against the connection budget either way.
    fn check_connect(&self, addr: SocketAddr) -> bool {
        let (ip, port) = (addr.ip(), addr.port());
        let literal = ip.to_string();
        let names = lock(&self.names)
            .resolved
            .get(&ip)
            .cloned()
            .unwrap_or_default();
        let shown = names.first().unwrap_or(&literal).clone();
        let count = self.connections.fetch_add(1, Ordering::Relaxed) + 1;
        if count > self.max_connections {
            let limit = BudgetLimit::Connections {
                max: self.max_connections,
            };
            self.refuse(&shown, port, Some(ip), Refusal::Budget(limit));
            return false;
        }
        if self.bytes.load(Ordering::Relaxed) >= self.max_bytes {
            let limit = BudgetLimit::Bytes {
                max: self.max_bytes,
            };
            self.refuse(&shown, port, Some(ip), Refusal::Budget(limit));
            return false;
        }
        let mut first_refusal = None;
        for name in &names {
            match self.policy.check_addr(name, ip, port) {
                Decision::Allow { rule } => {
                    self.allow(name, port, Some(ip), rule);
                    lock(&self.names).connected.insert(addr, name.clone());
                    return true;
                }
                Decision::Deny { reason } => {
                    first_refusal.get_or_insert((name.clone(), reason));
                }
            }
        }
        match self.policy.check_name(&literal, port) {
            Decision::Allow { rule } => {
                self.allow(&literal, port, Some(ip), rule);
                lock(&self.names).connected.insert(addr, literal);
                true
            }
            Decision::Deny { reason } => {
                // A name's reason (say, the loopback range) says more than "no rule".
                let (host, reason) = first_refusal.unwrap_or((literal, reason));
                self.refuse(&host, port, Some(ip), Refusal::Policy(reason));
                false
            }
        }
    }

    /// Whether `name` may be looked up: the parsed host to resolve, or the error the guest
    /// gets. Only admitted names count against the lookup budget.
    fn start_lookup(&self, name: &str) -> std::result::Result<Host, ErrorCode> {
        let rule = match self.policy.check_lookup(name) {
            Decision::Allow { rule } => rule,
            Decision::Deny { reason } => {
                let code = match reason {
                    DenyReason::InvalidName { .. } => ErrorCode::InvalidArgument,
                    _ => ErrorCode::AccessDenied,
                };
                self.refuse(name, 0, None, Refusal::Policy(reason));
                return Err(code);
            }
        };
        let host = Host::parse(name).map_err(|reason| {
            self.refuse(
                name,
                0,
                None,
                Refusal::Policy(DenyReason::InvalidName { reason }),
            );
            ErrorCode::InvalidArgument
        })?;
        if let Host::Name(_) = host {
            let count = self.lookups.fetch_add(1, Ordering::Relaxed) + 1;
            if count > self.max_connections {
                let limit = BudgetLimit::Connections {
                    max: self.max_connections,
                };
                self.refuse(name, 0, None, Refusal::Budget(limit));
                return Err(ErrorCode::AccessDenied);
            }
        }
        self.allow(name, 0, None, rule);
        Ok(host)
    }

    /// Records what the resolver answered for `host` and remembers its addresses.
    fn finish_lookup(
        &self,
        host: &Host,
        answer: io::Result<Vec<IpAddr>>,
    ) -> std::result::Result<Vec<IpAddr>, ErrorCode> {
        let name = host.to_string();
        let why = match answer {
            Ok(addrs) if !addrs.is_empty() => {
                tracing::debug!(target: "strata::egress", host = %name, ?addrs, "resolved");
                let mut names = lock(&self.names);
                for addr in &addrs {
                    let known = names.resolved.entry(*addr).or_default();
                    if !known.contains(&name) {
                        known.push(name.clone());
                    }
                }
                return Ok(addrs);
            }
            Ok(_) => "no addresses".to_string(),
            Err(err) => err.to_string(),
        };
        self.refuse(&name, 0, None, Refusal::Unresolvable(why));
        Err(ErrorCode::NameUnresolvable)
    }

    /// Reserves up to `want` bytes of the byte budget; how many were granted.
    fn reserve_upto(&self, want: u64) -> u64 {
        let mut granted = 0;
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                granted = want.min(self.max_bytes.saturating_sub(used));
                Some(used + granted)
            });
        granted
    }

    /// Reserves exactly `len` bytes, or nothing if that would pass the budget.
    fn reserve_exact(&self, len: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(len)
                    .filter(|total| *total <= self.max_bytes)
            })
            .is_ok()
    }

    fn refund(&self, len: u64) {
        self.bytes.fetch_sub(len, Ordering::Relaxed);
    }

    fn remaining_bytes(&self) -> u64 {
        self.max_bytes
            .saturating_sub(self.bytes.load(Ordering::Relaxed))
    }

    /// The host an allowed connection to `peer` was allowed for.
    fn connected_host(&self, peer: SocketAddr) -> String {
        lock(&self.names)
            .connected
            .get(&peer)
            .cloned()
            .unwrap_or_else(|| peer.ip().to_string())
    }

    /// The receipt's `network` section, and a denial for each refusal.
    pub(crate) fn finish(&self) -> (NetworkReceipt, Vec<Denial>) {
        let (events, dropped) = self.log.drain();
        let receipt = NetworkReceipt {
            enforcer: ENFORCER.to_string(),
            rules: self.rules.clone(),
            connections: self.connections.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            decisions: events.iter().map(EgressEvent::to_decision).collect(),
            dropped,
        };
        let denials = sandbox_egress::denials(&receipt);
        (receipt, denials)
    }
}

// ---- the linker shims -------------------------------------------------------------------

/// Replaces `wasi:sockets/ip-name-lookup` and `tcp-socket.finish-connect` in the preview 2
/// linker with versions that enforce a run's allowlist (and defer to wasmtime-wasi for runs
/// without one).
pub(crate) fn shim_p2(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    {
        let mut lookup = linker.instance(IP_NAME_LOOKUP)?;
        lookup.resource(
            "resolve-address-stream",
            ResourceType::host::<Lookup>(),
            |mut store: StoreContextMut<'_, State>, rep| drop_lookup(store.data_mut(), rep),
        )?;
        lookup.func_wrap(
            "resolve-addresses",
            |mut store: StoreContextMut<'_, State>,
             (network, name): (Resource<Network>, String)| {
                resolve_addresses(store.data_mut(), network, name).map(|r| (r,))
            },
        )?;
        lookup.func_wrap(
            "[method]resolve-address-stream.resolve-next-address",
            |mut store: StoreContextMut<'_, State>, (this,): (Resource<Lookup>,)| {
                next_address(store.data_mut(), this).map(|r| (r,))
            },
        )?;
        lookup.func_wrap(
            "[method]resolve-address-stream.subscribe",
            |mut store: StoreContextMut<'_, State>, (this,): (Resource<Lookup>,)| {
                subscribe_lookup(store.data_mut(), this).map(|r| (r,))
            },
        )?;
    }
    {
        let mut tcp = linker.instance(SOCKETS_TCP)?;
        tcp.func_wrap(
            "[method]tcp-socket.finish-connect",
            |mut store: StoreContextMut<'_, State>, (this,): (Resource<TcpSocket>,)| {
                finish_connect(store.data_mut(), this).map(|r| (r,))
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// What a guest's function returns: a WASI error code, or a trap.
type WasiResult<T> = wasmtime::Result<std::result::Result<T, ErrorCode>>;

/// The `resolve-address-stream` resource.
pub(crate) enum Lookup {
    /// Resolved (or being resolved) under the run's allowlist.
    Checked(Answer),
    /// wasmtime-wasi's own stream, kept in the table (runs without an allowlist).
    Native(Resource<ResolveAddressStream>),
}

/// The answer of a checked lookup.
pub(crate) enum Answer {
    Pending(AbortOnDropJoinHandle<std::result::Result<Vec<IpAddr>, ErrorCode>>),
    Ready(std::result::Result<std::vec::IntoIter<IpAddr>, ErrorCode>),
}

impl Answer {
    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<&mut std::result::Result<std::vec::IntoIter<IpAddr>, ErrorCode>> {
        if let Answer::Pending(task) = self {
            let polled = Pin::new(task).poll(cx);
            match polled {
                Poll::Ready(result) => *self = Answer::Ready(result.map(Vec::into_iter)),
                Poll::Pending => return Poll::Pending,
            }
        }
        match self {
            Answer::Ready(result) => Poll::Ready(result),
            Answer::Pending(_) => Poll::Pending,
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Lookup {
    async fn ready(&mut self) {
        if let Lookup::Checked(answer) = self {
            std::future::poll_fn(|cx| answer.poll_ready(cx).map(|_| ())).await;
        }
    }
}

fn resolve_addresses(
    state: &mut State,
    network: Resource<Network>,
    name: String,
) -> WasiResult<Resource<Lookup>> {
    let guard = state.egress.clone();
    let mut view = state.sockets();
    let Some(guard) = guard else {
        return Ok(
            match ip_name_lookup::Host::resolve_addresses(&mut view, network, name) {
                Ok(native) => Ok(view.table.push(Lookup::Native(native))?),
                Err(err) => Err(err.downcast()?),
            },
        );
    };
    // The network resource is the capability to look names up; it must be a real one.
    view.table.get(&network)?;
    let answer = match guard.start_lookup(&name) {
        Err(code) => return Ok(Err(code)),
        Ok(Host::Ip(ip)) => Answer::Ready(Ok(vec![ip].into_iter())),
        Ok(host) => Answer::Pending(wasmtime_wasi::runtime::spawn(async move {
            let answer = sandbox_egress::resolve::resolve(&host, 0).await;
            guard.finish_lookup(&host, answer)
        })),
    };
    Ok(Ok(view.table.push(Lookup::Checked(answer))?))
}

fn next_address(state: &mut State, this: Resource<Lookup>) -> WasiResult<Option<IpAddress>> {
    let mut view = state.sockets();
    let native = match view.table.get_mut(&this)? {
        Lookup::Native(inner) => inner.rep(),
        Lookup::Checked(answer) => {
            let mut cx = Context::from_waker(Waker::noop());
            return Ok(match answer.poll_ready(&mut cx) {
                Poll::Pending => Err(ErrorCode::WouldBlock),
                Poll::Ready(Ok(addrs)) => Ok(addrs.next().map(IpAddress::from)),
                Poll::Ready(Err(code)) => Err(*code),
            });
        }
    };
    Ok(
        match HostResolveAddressStream::resolve_next_address(
            &mut view,
            Resource::new_borrow(native),
        ) {
            Ok(addr) => Ok(addr),
            Err(err) => Err(err.downcast()?),
        },
    )
}

fn subscribe_lookup(
    state: &mut State,
    this: Resource<Lookup>,
) -> wasmtime::Result<Resource<DynPollable>> {
    let mut view = state.sockets();
    match view.table.get(&this)? {
        Lookup::Native(inner) => {
            let inner = Resource::new_borrow(inner.rep());
            HostResolveAddressStream::subscribe(&mut view, inner)
        }
        Lookup::Checked(_) => wasmtime_wasi::p2::subscribe(view.table, this),
    }
}

fn drop_lookup(state: &mut State, rep: u32) -> wasmtime::Result<()> {
    let mut view = state.sockets();
    if let Lookup::Native(inner) = view.table.delete(Resource::<Lookup>::new_own(rep))? {
        HostResolveAddressStream::drop(&mut view, inner)?;
    }
    Ok(())
}

/// wasmtime-wasi's `finish-connect`, with the streams metered under an allowlist.
fn finish_connect(
    state: &mut State,
    this: Resource<TcpSocket>,
) -> WasiResult<(Resource<DynInputStream>, Resource<DynOutputStream>)> {
    let guard = state.egress.clone();
    let socket = this.rep();
    let mut view = state.sockets();
    let (input, output) = match HostTcpSocket::finish_connect(&mut view, this) {
        Ok(streams) => streams,
        Err(err) => return Ok(Err(err.downcast()?)),
    };
    let Some(guard) = guard else {
        return Ok(Ok((input, output)));
    };
    let peer = HostTcpSocket::remote_address(&mut view, Resource::new_borrow(socket))
        .ok()
        .map(SocketAddr::from);
    let conn = Arc::new(Connection {
        host: peer.map_or_else(|| "unknown peer".to_string(), |p| guard.connected_host(p)),
        port: peer.map_or(0, |p| p.port()),
        addr: peer.map(|p| p.ip()),
        cut: AtomicBool::new(false),
        guard,
    });
    let parent = Resource::<TcpSocket>::new_borrow(socket);
    let input: DynInputStream = Box::new(MeteredInput {
        inner: view.table.delete(input)?,
        conn: Arc::clone(&conn),
    });
    let output: DynOutputStream = Box::new(MeteredOutput {
        inner: view.table.delete(output)?,
        conn,
    });
    let input = view.table.push_child(input, &parent)?;
    let output = view.table.push_child(output, &parent)?;
    Ok(Ok((input, output)))
}

// ---- metered streams --------------------------------------------------------------------

/// One allowed connection, for its streams' byte accounting.
struct Connection {
    guard: Arc<EgressGuard>,
    host: String,
    port: u16,
    addr: Option<IpAddr>,
    /// Whether the byte budget has cut this connection (logged once).
    cut: AtomicBool,
}

impl Connection {
    /// The error of a stream past the byte budget; the first one is logged.
    fn cut(&self) -> StreamError {
        let max = self.guard.max_bytes;
        if !self.cut.swap(true, Ordering::Relaxed) {
            self.guard.refuse(
                &self.host,
                self.port,
                self.addr,
                Refusal::Budget(BudgetLimit::Bytes { max }),
            );
        }
        StreamError::LastOperationFailed(wasmtime::format_err!(
            "egress byte budget of {max} exceeded"
        ))
    }
}

/// The receiving stream of a connection, counting bytes against the budget.
struct MeteredInput {
    inner: DynInputStream,
    conn: Arc<Connection>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for MeteredInput {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl InputStream for MeteredInput {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        if size == 0 {
            return self.inner.read(0);
        }
        let guard = &self.conn.guard;
        let granted = guard.reserve_upto(size as u64);
        if granted == 0 {
            return Err(self.conn.cut());
        }
        // `granted <= size`, so it fits a usize.
        match self.inner.read(usize::try_from(granted).unwrap_or(size)) {
            Ok(data) => {
                guard.refund(granted.saturating_sub(data.len() as u64));
                Ok(data)
            }
            Err(err) => {
                guard.refund(granted);
                Err(err)
            }
        }
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

/// The sending stream of a connection, counting bytes against the budget.
struct MeteredOutput {
    inner: DynOutputStream,
    conn: Arc<Connection>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for MeteredOutput {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for MeteredOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let len = bytes.len() as u64;
        if !self.conn.guard.reserve_exact(len) {
            return Err(self.conn.cut());
        }
        self.inner
            .write(bytes)
            .inspect_err(|_| self.conn.guard.refund(len))
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let permit = self.inner.check_write()?;
        match self.conn.guard.remaining_bytes() {
            0 => Err(self.conn.cut()),
            left => Ok(permit.min(usize::try_from(left).unwrap_or(usize::MAX))),
        }
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::receipt::EgressRefusal;
    use sandbox_core::{ByteSize, Caps, LimitKind, Net, Strictness};

    fn guard_for(rules: &str, limits: impl FnOnce(&mut Limits)) -> Arc<EgressGuard> {
        let net: Net = format!("allow:{rules}").parse().expect("rules");
        let mut caps = Caps::new().net(net);
        limits(&mut caps.limits);
        let plan = crate::plan::plan(&caps, Strictness::Strict).expect("plan");
        guard(&plan, &caps.limits)
            .expect("guard")
            .expect("an allowlist has a guard")
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("socket address")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn unlisted_names_are_refused_before_resolution_and_not_counted() {
        let g = guard_for("api.example.com:443", |_| {});
        assert_eq!(
            g.start_lookup("evil.example.net").expect_err("unlisted"),
            ErrorCode::AccessDenied
        );
        assert_eq!(
            g.start_lookup("api.example.com\0.evil").expect_err("nul"),
            ErrorCode::InvalidArgument
        );
        assert_eq!(g.lookups.load(Ordering::Relaxed), 0);
        assert_eq!(
            g.start_lookup("API.example.com").expect("listed"),
            Host::Name("api.example.com".into())
        );
        let (receipt, denials) = g.finish();
        assert_eq!(receipt.enforcer, ENFORCER);
        assert_eq!(receipt.decisions.len(), 3);
        assert!(!receipt.decisions[0].allowed);
        assert_eq!(receipt.decisions[0].refusal, Some(EgressRefusal::Policy));
        assert!(receipt.decisions[2].allowed);
        assert_eq!(denials.len(), 2);
        assert!(
            denials[0].detail.contains("evil.example.net"),
            "{denials:?}"
        );
    }

    #[test]
    fn connections_need_a_name_this_run_resolved_or_an_ip_rule() {
        let g = guard_for("api.example.com:443,198.51.100.0/24:8443", |_| {});
        let host = g.start_lookup("api.example.com").expect("listed");
        // A public address, so only the name rule matters.
        let public = ip("93.184.215.14");
        assert_eq!(
            g.finish_lookup(&host, Ok(vec![public])).expect("resolved"),
            vec![public]
        );
        assert!(g.check_socket(SocketAddr::new(public, 443), SocketAddrUse::TcpConnect));
        assert!(!g.check_socket(SocketAddr::new(public, 80), SocketAddrUse::TcpConnect));
        // Not resolved by this run: an IP literal with no rule.
        assert!(!g.check_socket(addr("93.184.215.15:443"), SocketAddrUse::TcpConnect));
        // The CIDR rule opens its documentation range, on its port only.
        assert!(g.check_socket(addr("198.51.100.7:8443"), SocketAddrUse::TcpConnect));
        assert!(!g.check_socket(addr("198.51.100.7:443"), SocketAddrUse::TcpConnect));
        let (receipt, _) = g.finish();
        assert_eq!(receipt.connections, 5);
        let connects: Vec<_> = receipt.decisions.iter().filter(|d| d.port != 0).collect();
        assert_eq!(connects[0].host, "api.example.com");
        assert_eq!(connects[0].rule.as_deref(), Some("api.example.com:443"));
        assert_eq!(connects[0].addr, Some(public));
        assert_eq!(connects[1].host, "api.example.com");
        assert!(connects[1]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("port 80"));
        assert_eq!(connects[2].host, "93.184.215.15");
        assert_eq!(connects[3].rule.as_deref(), Some("198.51.100.0/24:8443"));
    }

    #[test]
    fn a_name_resolving_to_loopback_is_refused_with_the_range() {
        let g = guard_for("evil.example.com:8080", |_| {});
        let host = g.start_lookup("evil.example.com").expect("listed");
        g.finish_lookup(&host, Ok(vec![ip("127.0.0.1")]))
            .expect("resolved");
        assert!(!g.check_socket(addr("127.0.0.1:8080"), SocketAddrUse::TcpConnect));
        let (receipt, _) = g.finish();
        let last = receipt.decisions.last().expect("decision");
        assert_eq!(last.host, "evil.example.com");
        let reason = last.reason.as_deref().unwrap_or("");
        assert!(
            reason.contains("loopback") || reason.contains("host itself"),
            "{reason}"
        );
    }

    #[test]
    fn binds_listens_and_accepts_are_refused_but_the_implicit_bind_is_not() {
        let g = guard_for("127.0.0.1/32:80", |_| {});
        assert!(g.check_socket(addr("0.0.0.0:0"), SocketAddrUse::TcpBind));
        assert!(g.check_socket(addr("[::]:0"), SocketAddrUse::TcpBind));
        for (a, usage) in [
            ("0.0.0.0:8080", SocketAddrUse::TcpBind),
            ("127.0.0.1:0", SocketAddrUse::TcpBind),
            ("0.0.0.0:40000", SocketAddrUse::TcpListen),
            ("127.0.0.1:80", SocketAddrUse::TcpAccept),
            ("127.0.0.1:80", SocketAddrUse::UdpSend),
        ] {
            assert!(!g.check_socket(addr(a), usage), "{a} {usage:?}");
        }
        let (receipt, denials) = g.finish();
        assert_eq!(receipt.decisions.len(), 5);
        assert_eq!(denials.len(), 5);
        assert!(denials[2].detail.contains("listening"), "{denials:?}");
    }

    #[test]
    fn the_connection_budget_refuses_past_its_limit() {
        let g = guard_for("192.0.2.0/24:443", |l| l.egress_connections = 2);
        assert!(g.check_socket(addr("192.0.2.1:443"), SocketAddrUse::TcpConnect));
        assert!(!g.check_socket(addr("192.0.2.1:22"), SocketAddrUse::TcpConnect));
        assert!(!g.check_socket(addr("192.0.2.1:443"), SocketAddrUse::TcpConnect));
        let (receipt, _) = g.finish();
        let last = receipt.decisions.last().expect("decision");
        assert_eq!(last.refusal, Some(EgressRefusal::Budget));
        assert_eq!(last.limit, Some(LimitKind::EgressConnections));
        assert_eq!(receipt.connections, 3);
    }

    #[test]
    fn the_byte_budget_is_never_passed() {
        let g = guard_for("192.0.2.0/24:443", |l| l.egress_bytes = ByteSize(10));
        assert_eq!(g.reserve_upto(4), 4);
        assert!(!g.reserve_exact(7));
        assert!(g.reserve_exact(6));
        assert_eq!(g.reserve_upto(1), 0);
        g.refund(2);
        assert_eq!(g.remaining_bytes(), 2);
        assert!(g.reserve_exact(2));
        // A spent budget refuses new connections too.
        assert!(!g.check_socket(addr("192.0.2.1:443"), SocketAddrUse::TcpConnect));
        let (receipt, _) = g.finish();
        assert_eq!(receipt.bytes, 10);
        let last = receipt.decisions.last().expect("decision");
        assert_eq!(last.limit, Some(LimitKind::EgressBytes));
    }

    #[test]
    fn resolved_names_count_against_the_connection_budget_but_literals_do_not() {
        let g = guard_for("*.example.com:443,192.0.2.0/24:443", |l| {
            l.egress_connections = 2
        });
        g.start_lookup("a.example.com").expect("first");
        g.start_lookup("192.0.2.9")
            .expect("a literal is not resolved");
        g.start_lookup("b.example.com").expect("second");
        assert_eq!(
            g.start_lookup("c.example.com").expect_err("third"),
            ErrorCode::AccessDenied
        );
        let (receipt, _) = g.finish();
        let last = receipt.decisions.last().expect("decision");
        assert_eq!(last.host, "c.example.com");
        assert_eq!(last.limit, Some(LimitKind::EgressConnections));
        // Lookups are not connections.
        assert_eq!(receipt.connections, 0);
    }

    #[test]
    fn unresolvable_names_are_recorded() {
        let g = guard_for("api.example.com", |_| {});
        let host = g.start_lookup("api.example.com").expect("listed");
        assert_eq!(
            g.finish_lookup(&host, Ok(vec![])).expect_err("empty"),
            ErrorCode::NameUnresolvable
        );
        let (receipt, _) = g.finish();
        let last = receipt.decisions.last().expect("decision");
        assert_eq!(last.refusal, Some(EgressRefusal::Unresolvable));
    }
}
