//! Network allowlists in the wasm backend: a Python component (the CPython interpreter
//! compiled to WASI preview 2) uses raw `wasi:sockets` (name lookup, TCP) against real
//! servers on this machine, and each test is named after the attack it stops.
//!
//! Servers: loopback listeners, which only an explicit `127.0.0.1/32:PORT` rule opens
//! (loopback is an always-denied range, and 127.0.0.1 one of the host's own addresses), and
//! the egress suites' upstream (`tests/egress_common`): an HTTP server in its own network
//! namespace at a public-looking address with a name in `/etc/hosts`, so that only the
//! allowlist decides. Root only (network namespaces, `/etc/hosts` edits); these tests fail,
//! never skip, without it, and without the interpreters
//! (`scripts/fetch-wasm-interpreters.sh`).

mod common;
#[path = "../../tests/egress_common/mod.rs"]
mod egress_common;

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use common::*;
use egress_common::{Upstream, HELLO, HTTP_PORT};
use sandbox_core::receipt::{EgressDecision, EgressRefusal, NetworkReceipt};
use sandbox_core::{
    ByteSize, Capability, Caps, LimitKind, Net, NetRule, RunOutput, ScriptLanguage, Tool,
};

/// Raw WASI preview 2 helpers for the guest (this CPython build has no `socket` module).
/// Every resource is kept alive to the end, so no parent is dropped before its pollable.
const PRELUDE: &str = r#"
from componentize_py_types import Err
from wit_world.imports import instance_network, ip_name_lookup, network, tcp_create_socket, udp_create_socket

NET = instance_network.instance_network()
KEEP = []

def err_name(e):
    v = e.value
    return getattr(v, "name", None) or type(v).__name__

def wait(call, pollable):
    while True:
        try:
            return call()
        except Err as e:
            if e.value != network.ErrorCode.WOULD_BLOCK:
                raise
            pollable.block()

def lookup(name):
    stream = ip_name_lookup.resolve_addresses(NET, name)
    ready = stream.subscribe()
    KEEP.extend([stream, ready])
    found = []
    while True:
        addr = wait(stream.resolve_next_address, ready)
        if addr is None:
            return found
        if isinstance(addr, network.IpAddress_Ipv4):
            found.append(addr.value)

def dotted(a):
    return ".".join(str(x) for x in a)

def connect(addr, port):
    sock = tcp_create_socket.create_tcp_socket(network.IpAddressFamily.IPV4)
    KEEP.append(sock)
    sock.start_connect(NET, network.IpSocketAddress_Ipv4(network.Ipv4SocketAddress(port=port, address=addr)))
    ready = sock.subscribe()
    KEEP.append(ready)
    rx, tx = wait(sock.finish_connect, ready)
    KEEP.extend([rx, tx])
    return rx, tx

def try_connect(addr, port, payload=b"hi"):
    try:
        rx, tx = connect(addr, port)
        tx.blocking_write_and_flush(payload)
        return "CONNECTED"
    except Err as e:
        return "REFUSED " + err_name(e)

def read_all(rx):
    data = b""
    while True:
        try:
            data += rx.blocking_read(65536)
        except Err as e:
            return data, err_name(e)

def get(addr, port, host, path):
    rx, tx = connect(addr, port)
    tx.blocking_write_and_flush(("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (path, host)).encode())
    return read_all(rx)
"#;

fn python(code: &str) -> Tool {
    Tool::script(ScriptLanguage::Python, format!("{PRELUDE}\n{code}"))
}

fn allow(rules: &[String]) -> Caps {
    let rules = rules
        .iter()
        .map(|r| r.parse::<NetRule>().expect("rule"))
        .collect();
    caps().net(Net::Allow(rules))
}

fn run_py(code: &str, caps: &Caps) -> (String, RunOutput) {
    require_interpreters();
    let out = run(&python(code), caps);
    let text = stdout(&out);
    assert!(
        out.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out)
}

fn network(out: &RunOutput) -> &NetworkReceipt {
    out.receipt
        .network
        .as_ref()
        .expect("a run under an allowlist has a network section")
}

fn decisions_for<'a>(out: &'a RunOutput, host: &str) -> Vec<&'a EgressDecision> {
    network(out)
        .decisions
        .iter()
        .filter(|d| d.host == host)
        .collect()
}

/// A loopback listener that records whether anything connected.
fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("listener");
    l.set_nonblocking(true).expect("nonblocking");
    let port = l.local_addr().expect("addr").port();
    (l, port)
}

fn accepted(l: &TcpListener) -> Option<Vec<u8>> {
    let (mut conn, _) = l.accept().ok()?;
    conn.set_nonblocking(false).expect("blocking");
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = Vec::new();
    let _ = conn.read_to_end(&mut buf);
    Some(buf)
}

fn pid_name(label: &str) -> String {
    format!("{label}-{}.strata-test.example", std::process::id())
}

#[test]
fn allowed_name_is_reached_through_the_run_s_own_lookup_and_only_on_its_port() {
    let up = Upstream::start();
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    let code = format!(
        r#"
addrs = lookup("{name}")
print("RESOLVED", [dotted(a) for a in addrs])
body, end = get(addrs[0], {port}, "{name}", "/hello")
print("BODY", body.split(b"\r\n\r\n", 1)[-1].decode(), end)
print("OTHER PORT", try_connect(addrs[0], 8443))
"#,
        name = up.name,
        port = HTTP_PORT
    );
    let (text, out) = run_py(&code, &caps);
    assert!(text.contains(&format!("RESOLVED ['{}']", up.ip)), "{text}");
    assert!(text.contains(&format!("BODY {HELLO}")), "{text}");
    assert!(text.contains("OTHER PORT REFUSED"), "{text}");
    let ours = decisions_for(&out, &up.name);
    // The lookup, the allowed connection, the refused port.
    assert_eq!(ours.len(), 3, "{ours:#?}");
    assert!(ours[0].allowed && ours[0].port == 0);
    assert!(ours[1].allowed, "{ours:#?}");
    assert_eq!(ours[1].addr, Some(up.ip.into()));
    assert_eq!(
        ours[1].rule.as_deref(),
        Some(format!("{}:{HTTP_PORT}", up.name).as_str())
    );
    assert!(!ours[2].allowed);
    assert!(
        ours[2]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("port 8443"),
        "{ours:#?}"
    );
    let net = network(&out);
    assert_eq!(net.enforcer, "wasi:sockets");
    assert_eq!(net.connections, 2);
    assert!(net.bytes > HELLO.len() as u64, "{net:#?}");
    assert!(out
        .receipt
        .has(Capability::Net, "wasi:sockets egress policy"));
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::Net && d.detail.contains("8443")));
}

#[test]
fn unlisted_name_is_never_resolved_even_when_its_address_is_reachable() {
    let mut up = Upstream::start();
    let unlisted = pid_name("unlisted");
    up.alias(&unlisted, &up.ip.to_string());
    // The upstream's address is open through its listed name; the unlisted alias of the
    // same address must not even be resolved, and the bare address is not a rule.
    let caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    let code = format!(
        r#"
try:
    print("RESOLVED", lookup("{unlisted}"))
except Err as e:
    print("LOOKUP", err_name(e))
print("LITERAL", try_connect(({ip}), {port}))
"#,
        ip = up.ip.to_string().replace('.', ", "),
        port = HTTP_PORT
    );
    let (text, out) = run_py(&code, &caps);
    assert!(text.contains("LOOKUP ACCESS_DENIED"), "{text}");
    assert!(text.contains("LITERAL REFUSED"), "{text}");
    let lookup = decisions_for(&out, &unlisted);
    assert_eq!(lookup.len(), 1, "{:#?}", network(&out));
    assert_eq!(lookup[0].refusal, Some(EgressRefusal::Policy));
    assert!(
        lookup[0]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("no rule"),
        "{lookup:#?}"
    );
    assert!(
        lookup[0].addr.is_none(),
        "the name was resolved: {lookup:#?}"
    );
    let literal = decisions_for(&out, &up.ip.to_string());
    assert_eq!(literal.len(), 1, "{:#?}", network(&out));
    assert!(!literal[0].allowed);
}

#[test]
fn name_resolving_to_loopback_is_refused_without_a_cidr_opt_in() {
    let mut up = Upstream::start();
    let name = pid_name("rebind");
    up.alias(&name, "127.0.0.1");
    let (l, port) = listener();
    let code = format!(
        r#"
addrs = lookup("{name}")
print("RESOLVED", [dotted(a) for a in addrs])
print("CONNECT", try_connect(addrs[0], {port}))
"#
    );
    let (text, out) = run_py(&code, &allow(&[format!("{name}:{port}")]));
    assert!(text.contains("RESOLVED ['127.0.0.1']"), "{text}");
    assert!(text.contains("CONNECT REFUSED"), "{text}");
    assert!(accepted(&l).is_none(), "the loopback listener was reached");
    let ours = decisions_for(&out, &name);
    let refused = ours.last().expect("a connect decision");
    assert!(!refused.allowed);
    let reason = refused.reason.as_deref().unwrap_or("");
    assert!(
        reason.contains("host itself") || reason.contains("loopback"),
        "{reason}"
    );

    // The explicit opt-in: a rule naming exactly the address opens it for the name.
    let caps = allow(&[format!("{name}:{port}"), format!("127.0.0.1/32:{port}")]);
    let (text, out) = run_py(&code, &caps);
    assert!(text.contains("CONNECT CONNECTED"), "{text}");
    assert_eq!(accepted(&l).as_deref(), Some(&b"hi"[..]));
    let allowed = decisions_for(&out, &name)
        .into_iter()
        .find(|d| d.port == port)
        .expect("a connect decision")
        .clone();
    assert!(allowed.allowed);
    assert_eq!(
        allowed.rule.as_deref(),
        Some(format!("127.0.0.1/32:{port}").as_str())
    );
}

#[test]
fn cidr_opt_in_opens_loopback_on_its_port_only() {
    let (l, port) = listener();
    let (other, other_port) = listener();
    let caps = allow(&[format!("127.0.0.1/32:{port}")]);
    let code = format!(
        r#"
print("OPEN", try_connect((127, 0, 0, 1), {port}))
print("OTHER", try_connect((127, 0, 0, 1), {other_port}))
print("NEIGHBOUR", try_connect((127, 0, 0, 2), {port}))
"#
    );
    let (text, out) = run_py(&code, &caps);
    assert!(text.contains("OPEN CONNECTED"), "{text}");
    assert!(text.contains("OTHER REFUSED"), "{text}");
    assert!(text.contains("NEIGHBOUR REFUSED"), "{text}");
    assert_eq!(accepted(&l).as_deref(), Some(&b"hi"[..]));
    assert!(accepted(&other).is_none(), "the unlisted port was reached");
    assert_eq!(network(&out).connections, 3);
    assert_eq!(
        out.receipt
            .denials
            .iter()
            .filter(|d| d.capability == Capability::Net)
            .count(),
        2
    );
}

#[test]
fn loopback_without_an_exact_rule_stays_closed() {
    // 127.0.0.0/8 lies inside the loopback range, but 127.0.0.1 is also one of the host's
    // own addresses, which only a rule naming exactly that address opens.
    let (l, port) = listener();
    let caps = allow(&[format!("127.0.0.0/8:{port}")]);
    let (text, _) = run_py(
        &format!(r#"print("CONNECT", try_connect((127, 0, 0, 1), {port}))"#),
        &caps,
    );
    assert!(text.contains("CONNECT REFUSED"), "{text}");
    assert!(accepted(&l).is_none());
}

#[test]
fn binding_listening_and_udp_are_refused() {
    let (_l, port) = listener();
    let caps = allow(&[format!("127.0.0.1/32:{port}")]);
    let code = format!(
        r#"
def bind_listen(addr, port, listen):
    sock = tcp_create_socket.create_tcp_socket(network.IpAddressFamily.IPV4)
    KEEP.append(sock)
    try:
        sock.start_bind(NET, network.IpSocketAddress_Ipv4(network.Ipv4SocketAddress(port=port, address=addr)))
        sock.finish_bind()
        if listen:
            sock.start_listen()
            sock.finish_listen()
        return "OK"
    except Err as e:
        return "REFUSED " + err_name(e)
print("BIND", bind_listen((127, 0, 0, 1), {port}, False))
print("LISTEN", bind_listen((0, 0, 0, 0), 0, True))
try:
    udp_create_socket.create_udp_socket(network.IpAddressFamily.IPV4)
    print("UDP OK")
except Err as e:
    print("UDP REFUSED", err_name(e))
"#
    );
    let (text, out) = run_py(&code, &caps);
    assert!(text.contains("BIND REFUSED"), "{text}");
    assert!(text.contains("LISTEN REFUSED"), "{text}");
    assert!(text.contains("UDP REFUSED"), "{text}");
    let details: Vec<&str> = out
        .receipt
        .denials
        .iter()
        .map(|d| d.detail.as_str())
        .collect();
    assert!(
        details.iter().any(|d| d.contains("binding to 127.0.0.1")),
        "{details:?}"
    );
    assert!(
        details.iter().any(|d| d.contains("listening on")),
        "{details:?}"
    );
    assert!(out
        .receipt
        .enforced
        .iter()
        .any(|e| e.capability == Capability::Net
            && e.mechanism == "wasi:sockets egress policy"
            && e.detail.contains("no UDP")));
}

#[test]
fn connection_budget_cuts_a_flood() {
    let (_l, port) = listener();
    let mut caps = allow(&[format!("127.0.0.1/32:{port}")]);
    caps.limits.egress_connections = 3;
    let code = format!(
        r#"
for i in range(6):
    print(try_connect((127, 0, 0, 1), {port}))
"#
    );
    let (text, out) = run_py(&code, &caps);
    assert_eq!(text.matches("CONNECTED").count(), 3, "{text}");
    assert_eq!(text.matches("REFUSED").count(), 3, "{text}");
    let net = network(&out);
    assert_eq!(net.connections, 6);
    let cut: Vec<_> = net
        .decisions
        .iter()
        .filter(|d| d.refusal == Some(EgressRefusal::Budget))
        .collect();
    assert_eq!(cut.len(), 3, "{net:#?}");
    assert!(cut
        .iter()
        .all(|d| d.limit == Some(LimitKind::EgressConnections)));
}

#[test]
fn byte_budget_cuts_a_large_download() {
    let up = Upstream::start();
    let mut caps = allow(&[format!("{}:{HTTP_PORT}", up.name)]);
    caps.limits.egress_bytes = ByteSize(4096);
    let code = format!(
        r#"
addrs = lookup("{name}")
body, end = get(addrs[0], {port}, "{name}", "/big")
print("READ", len(body), end)
print("AFTER", try_connect(addrs[0], {port}))
"#,
        name = up.name,
        port = HTTP_PORT
    );
    let (text, out) = run_py(&code, &caps);
    let read: usize = text
        .split("READ ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no READ line: {text}"));
    assert!(read > 0 && read < 4096, "{text}");
    assert!(text.contains("LastOperationFailed"), "{text}");
    assert!(text.contains("AFTER REFUSED"), "{text}");
    let net = network(&out);
    assert!(net.bytes <= 4096, "{net:#?}");
    assert!(
        net.decisions
            .iter()
            .any(|d| d.limit == Some(LimitKind::EgressBytes) && d.host == up.name),
        "{net:#?}"
    );
}

#[test]
fn empty_allowlist_denies_lookups_and_connections() {
    let (l, port) = listener();
    let code = format!(
        r#"
try:
    print("RESOLVED", lookup("localhost"))
except Err as e:
    print("LOOKUP", err_name(e))
print("CONNECT", try_connect((127, 0, 0, 1), {port}))
"#
    );
    let (text, out) = run_py(&code, &allow(&[]));
    assert!(text.contains("LOOKUP ACCESS_DENIED"), "{text}");
    assert!(text.contains("CONNECT REFUSED"), "{text}");
    assert!(accepted(&l).is_none());
    assert!(network(&out).decisions.iter().all(|d| !d.allowed));
}

#[test]
fn names_the_strict_parser_refuses_are_not_resolved() {
    let code = r#"
for name in ["0x7f.0.0.1", "2130706433", "api.example.com\x00.evil", "a@b.example.com", "::ffff:127.0.0.1"]:
    try:
        print("RESOLVED", repr(name), lookup(name))
    except Err as e:
        print("REFUSED", err_name(e))
"#;
    let (text, out) = run_py(code, &allow(&["*.example.com:443".to_string()]));
    assert_eq!(text.matches("REFUSED").count(), 5, "{text}");
    assert!(!text.contains("RESOLVED"), "{text}");
    assert!(network(&out).decisions.iter().all(|d| !d.allowed));
}

#[test]
fn without_an_allowlist_lookups_and_connects_are_wasmtime_wasi_s_own() {
    // The shims defer to wasmtime-wasi when a run has no allowlist: `net: host` resolves
    // and connects as before (a gap in the receipt, no network section), `net: none`
    // resolves nothing.
    let (l, port) = listener();
    let code = format!(
        r#"
try:
    addrs = lookup("localhost")
    print("RESOLVED", [dotted(a) for a in addrs])
except Err as e:
    print("LOOKUP", err_name(e))
print("CONNECT", try_connect((127, 0, 0, 1), {port}))
"#
    );
    let (text, out) = run_py(&code, &caps().net(Net::Host));
    assert!(text.contains("RESOLVED ['127.0.0.1'"), "{text}");
    assert!(text.contains("CONNECT CONNECTED"), "{text}");
    assert_eq!(accepted(&l).as_deref(), Some(&b"hi"[..]));
    assert!(out.receipt.network.is_none());
    assert!(out
        .receipt
        .gaps
        .iter()
        .any(|g| g.capability == Capability::Net));

    let (text, out) = run_py(&code, &caps());
    assert!(text.contains("LOOKUP"), "{text}");
    assert!(!text.contains("RESOLVED"), "{text}");
    assert!(text.contains("CONNECT REFUSED"), "{text}");
    assert!(accepted(&l).is_none());
    assert!(out.receipt.network.is_none());
}
