//! The egress proxy against real servers on this machine (no internet): a loopback echo
//! server, opened only by an explicit `127.0.0.1/32:PORT` rule, and the attacks the proxy
//! must stop, each test named after one.

#![allow(clippy::unwrap_used)] // Tests: a failed step is a failed test.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::caps::NetRule;
use sandbox_core::egress::{DenyReason, EgressPolicy, ReservedRange};
use sandbox_egress::{
    Attached, Budget, BudgetLimit, ClientLimits, EgressEvent, EgressProxy, Listen, Outcome,
    Refusal, RunGrant,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(10);

/// A loopback echo server; counts the connections it accepted.
async fn echo_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (port, accepted)
}

/// A loopback HTTP server answering `ok` to every request.
async fn http_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = stream.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    port
}

fn policy(rules: &[String]) -> EgressPolicy {
    let rules: Vec<NetRule> = rules
        .iter()
        .map(|r| NetRule::from_str(r).unwrap())
        .collect();
    EgressPolicy::new(&rules).unwrap()
}

async fn proxy_with(rules: &[String], budget: Budget) -> (EgressProxy, RunGrant, SocketAddr) {
    let proxy = EgressProxy::bind(&[Listen::TcpLoopback]).await.unwrap();
    let grant = proxy.register(policy(rules), budget).unwrap();
    let addr = proxy.tcp_addr().unwrap();
    (proxy, grant, addr)
}

/// Sends a raw request head and returns the status code and the stream.
async fn send_head<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, head: &[u8]) -> (u16, S) {
    stream.write_all(head).await.unwrap();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(WAIT, async {
        while !buf.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.unwrap();
            assert!(n > 0, "the proxy closed without a response: {buf:?}");
            buf.push(byte[0]);
        }
    })
    .await
    .unwrap();
    let text = String::from_utf8(buf).unwrap();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    (status, stream)
}

async fn connect_raw(proxy: SocketAddr, authority: &str, auth: Option<&str>) -> (u16, TcpStream) {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\n");
    if let Some(auth) = auth {
        head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    head.push_str("\r\n");
    send_head(stream, head.as_bytes()).await
}

async fn connect(proxy: SocketAddr, grant: &RunGrant, authority: &str) -> (u16, TcpStream) {
    connect_raw(proxy, authority, Some(&grant.proxy_authorization())).await
}

async fn echo_roundtrip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, data: &[u8]) {
    stream.write_all(data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, data);
}

fn refusals(events: &[EgressEvent]) -> Vec<Refusal> {
    events
        .iter()
        .filter_map(|e| match &e.outcome {
            Outcome::Refused(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_reaches_echo_server_opened_by_explicit_loopback_cidr() {
    let (port, accepted) = echo_server().await;
    let rule = format!("127.0.0.1/32:{port}");
    let (_proxy, grant, addr) = proxy_with(std::slice::from_ref(&rule), Budget::UNLIMITED).await;
    let (status, mut stream) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    echo_roundtrip(&mut stream, b"hello through the tunnel\r\n").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let (events, dropped) = grant.drain_log();
    assert_eq!(dropped, 0);
    assert_eq!(
        events,
        vec![EgressEvent {
            host: "127.0.0.1".into(),
            port,
            addr: Some("127.0.0.1".parse().unwrap()),
            outcome: Outcome::Allowed { rule },
        }]
    );
    assert_eq!(grant.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_listener_holds_each_run_to_its_own_policy_by_credential() {
    let (port, accepted) = echo_server().await;
    let proxy = EgressProxy::attach_only(tokio::runtime::Handle::current());
    let open = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), Budget::UNLIMITED)
        .unwrap();
    let closed = proxy.register(policy(&[]), Budget::UNLIMITED).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let shared = proxy.serve_shared(listener).unwrap();
    let addr = shared.addr();
    let target = format!("127.0.0.1:{port}");

    let (status, mut stream) = connect(addr, &open, &target).await;
    assert_eq!(status, 200, "the run whose allowlist names the server");
    echo_roundtrip(&mut stream, b"one listener, many runs\r\n").await;
    let (status, _) = connect(addr, &closed, &target).await;
    assert_eq!(
        status, 403,
        "another run's empty allowlist, on the same listener"
    );
    let (status, _) = connect_raw(addr, &target, None).await;
    assert_eq!(status, 407, "no credential");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    let revoked = open.proxy_authorization();
    drop(open);
    let (status, _) = connect_raw(addr, &target, Some(&revoked)).await;
    assert_eq!(status, 407, "a finished run's credential");

    drop(shared);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener closes with its handle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pipelined_after_the_connect_head_are_forwarded() {
    let (port, _) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: {}\r\n\r\nearly\r\n",
        grant.proxy_authorization()
    );
    let (status, mut stream) = send_head(stream, head.as_bytes()).await;
    assert_eq!(status, 200);
    let mut back = [0u8; 7];
    tokio::time::timeout(WAIT, stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"early\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_listener_tunnels_too() {
    let (port, _) = echo_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.sock");
    let proxy = EgressProxy::bind(&[Listen::Unix(path.clone())])
        .await
        .unwrap();
    let grant = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), Budget::UNLIMITED)
        .unwrap();
    let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    let head = format!(
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        grant.proxy_authorization()
    );
    let (status, mut stream) = send_head(stream, head.as_bytes()).await;
    assert_eq!(status, 200);
    echo_roundtrip(&mut stream, b"over a unix socket\r\n").await;
    drop(proxy);
    assert!(!path.exists(), "the socket file is removed with the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_the_proxy_reaches_only_the_allowed_server() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl is not installed; skipping");
        return;
    }
    let port = http_server().await;
    let other = http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let curl = |target: u16| {
        let proxy_url = grant.proxy_url(addr);
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "10",
                    "--noproxy",
                    "",
                    "--proxytunnel",
                    "-x",
                ])
                .arg(proxy_url)
                .arg(format!("http://127.0.0.1:{target}/"))
                .output()
                .unwrap()
        })
    };
    let ok = curl(port).await.unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(ok.stdout, b"ok");
    let refused = curl(other).await.unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("403"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlisted_host_is_refused_before_any_resolution() {
    let (_proxy, grant, addr) = proxy_with(&["example.com:443".into()], Budget::UNLIMITED).await;
    let (status, _) = connect(addr, &grant, "exfil.attacker.test:443").await;
    assert_eq!(status, 403);
    let (events, _) = grant.drain_log();
    // Refused by the name check: no address was ever looked up.
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].addr, None);
    assert_eq!(refusals(&events), vec![Refusal::Policy(DenyReason::NoRule)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_port_on_an_allowed_host_is_refused() {
    let (port, accepted) = echo_server().await;
    let (other_port, other_accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let (status, _) = connect(addr, &grant, &format!("127.0.0.1:{other_port}")).await;
    assert_eq!(status, 403);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert_eq!(other_accepted.load(Ordering::SeqCst), 0);
    assert_eq!(
        refusals(&grant.drain_log().0),
        vec![Refusal::Policy(DenyReason::PortNotAllowed {
            port: other_port
        })]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_refused_without_a_cidr_rule_naming_it() {
    let (port, accepted) = echo_server().await;
    // "Everything" does not open loopback: only a rule inside the loopback range does.
    let (_proxy, grant, addr) = proxy_with(&[format!("0.0.0.0/0:{port}")], Budget::UNLIMITED).await;
    let (status, _) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 403);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    let refused = refusals(&grant.drain_log().0);
    assert!(
        matches!(
            refused.as_slice(),
            [Refusal::Policy(DenyReason::DeniedRange {
                range: ReservedRange::Loopback,
                ..
            })]
        ),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_rule_for_localhost_does_not_reach_loopback() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) = proxy_with(&[format!("localhost:{port}")], Budget::UNLIMITED).await;
    let (status, _) = connect(addr, &grant, &format!("localhost:{port}")).await;
    assert_ne!(status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    let refused = refusals(&grant.drain_log().0);
    // Either the absolute name `localhost.` does not resolve here (glibc skips /etc/hosts
    // for it), or it resolves to loopback, which the name rule cannot open.
    assert!(
        refused.iter().all(|r| matches!(
            r,
            Refusal::Unresolvable(_)
                | Refusal::Policy(DenyReason::DeniedRange {
                    range: ReservedRange::Loopback,
                    ..
                })
        )) && !refused.is_empty(),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_at_and_percent_in_the_authority_are_refused_not_interpreted() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    for host in [
        "127.0.0.1\0.allowed.example".to_string(),
        "user@127.0.0.1".to_string(),
        "127.0.0.1%2e".to_string(),
        "[fe80::1%25lo]".to_string(),
        "127.0.0.1\t".to_string(),
    ] {
        let (status, _) = connect(addr, &grant, &format!("{host}:{port}")).await;
        assert_eq!(status, 403, "{host:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    let refused = refusals(&grant.drain_log().0);
    assert_eq!(refused.len(), 5);
    assert!(
        refused
            .iter()
            .all(|r| matches!(r, Refusal::Policy(DenyReason::InvalidName { .. }))),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crlf_in_the_authority_cannot_inject_headers() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    for authority in [
        format!("127.0.0.1\r\nX-Injected: 1\r\n:{port}"),
        format!("127.0.0.1\n.evil:{port}"),
        format!("127.0.0.1\r.evil:{port}"),
    ] {
        let (status, _) = connect(addr, &grant, &authority).await;
        assert!(status == 400 || status == 403, "{authority:?}: {status}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decimal_octal_hex_and_short_ipv4_forms_are_refused() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    for host in [
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "127.1",
        "[::ffff:127.0.0.1]",
    ] {
        let (status, _) = connect(addr, &grant, &format!("{host}:{port}")).await;
        assert_eq!(status, 403, "{host}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert!(refusals(&grant.drain_log().0)
        .iter()
        .all(|r| matches!(r, Refusal::Policy(DenyReason::InvalidName { .. }))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_or_revoked_credential_gets_407() {
    let (port, accepted) = echo_server().await;
    let (proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let target = format!("127.0.0.1:{port}");
    assert_eq!(connect_raw(addr, &target, None).await.0, 407);
    assert_eq!(
        connect_raw(addr, &target, Some("Basic d3Jvbmc6")).await.0,
        407
    );
    // Another run's token is not this run's: register a second run and revoke it.
    let other = proxy
        .register(EgressPolicy::deny_all(), Budget::UNLIMITED)
        .unwrap();
    let other_auth = other.proxy_authorization();
    drop(other);
    assert_eq!(connect_raw(addr, &target, Some(&other_auth)).await.0, 407);
    // Two credentials: refused, even if one is right.
    let stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: {}\r\nProxy-Authorization: Basic d3Jvbmc6\r\n\r\n",
        grant.proxy_authorization()
    );
    assert_eq!(send_head(stream, head.as_bytes()).await.0, 407);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert!(grant.drain_log().0.is_empty());
    assert_eq!(connect(addr, &grant, &target).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_allowlist_denies_everything() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) = proxy_with(&[], Budget::UNLIMITED).await;
    for target in [
        format!("127.0.0.1:{port}"),
        "example.com:443".into(),
        "93.184.215.14:80".into(),
    ] {
        assert_eq!(connect(addr, &grant, &target).await.0, 403, "{target}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert_eq!(
        refusals(&grant.drain_log().0),
        vec![Refusal::Policy(DenyReason::NoRule); 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_header_naming_another_authority_is_refused() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: evil.example:443\r\nProxy-Authorization: {}\r\n\r\n",
        grant.proxy_authorization()
    );
    assert_eq!(send_head(stream, head.as_bytes()).await.0, 400);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flood_is_cut_by_the_connection_budget() {
    let (port, accepted) = echo_server().await;
    let budget = Budget {
        max_connections: Some(2),
        max_bytes: None,
    };
    let (_proxy, grant, addr) = proxy_with(&[format!("127.0.0.1/32:{port}")], budget).await;
    let target = format!("127.0.0.1:{port}");
    let (a, mut sa) = connect(addr, &grant, &target).await;
    let (b, mut sb) = connect(addr, &grant, &target).await;
    assert_eq!((a, b), (200, 200));
    // The echo server has accepted both once they answer.
    echo_roundtrip(&mut sa, b"one\r\n").await;
    echo_roundtrip(&mut sb, b"two\r\n").await;
    for _ in 0..5 {
        assert_eq!(connect(addr, &grant, &target).await.0, 429);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let refused = refusals(&grant.drain_log().0);
    assert_eq!(
        refused,
        vec![Refusal::Budget(BudgetLimit::Connections { max: 2 }); 5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_flood_is_cut_by_the_byte_budget() {
    let (port, _) = echo_server().await;
    let budget = Budget {
        max_connections: None,
        max_bytes: Some(1000),
    };
    let (_proxy, grant, addr) = proxy_with(&[format!("127.0.0.1/32:{port}")], budget).await;
    let (status, mut stream) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    // Within budget: 100 up + 100 echoed back.
    echo_roundtrip(&mut stream, &[0u8; 100]).await;
    // The flood: the proxy closes the tunnel.
    let flood = vec![b'b'; 64 * 1024];
    let _ = stream.write_all(&flood).await;
    let mut received = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(WAIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received += n,
            }
        }
    })
    .await
    .expect("the proxy closes the tunnel");
    assert!(
        received <= 800,
        "{received} bytes came back past the budget"
    );
    assert!(grant.bytes() > 1000);
    let refused = refusals(&grant.drain_log().0);
    assert_eq!(
        refused,
        vec![Refusal::Budget(BudgetLimit::Bytes { max: 1000 })]
    );
}

/// A SOCKS5 client by hand: greeting with `methods`, then (if the proxy picked
/// username/password) `user`, then a CONNECT to `atyp`+`addr`+`port`. Returns the reply
/// code of the last step reached and the stream.
async fn socks5(
    proxy: SocketAddr,
    methods: &[u8],
    user: &str,
    atyp: u8,
    addr: &[u8],
    port: u16,
) -> (u8, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let mut greeting = vec![5, methods.len() as u8];
    greeting.extend_from_slice(methods);
    stream.write_all(&greeting).await.unwrap();
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await.unwrap();
    if choice[1] != 2 {
        return (choice[1], stream);
    }
    let mut auth = vec![1, user.len() as u8];
    auth.extend_from_slice(user.as_bytes());
    auth.extend_from_slice(&[1, b'x']);
    stream.write_all(&auth).await.unwrap();
    let mut status = [0u8; 2];
    stream.read_exact(&mut status).await.unwrap();
    if status[1] != 0 {
        return (0xee, stream);
    }
    let mut request = vec![5, 1, 0, atyp];
    if atyp == 3 {
        request.push(addr.len() as u8);
    }
    request.extend_from_slice(addr);
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    tokio::time::timeout(WAIT, stream.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    (reply[1], stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5h_tunnel_reaches_allowed_echo_server() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let (code, mut stream) = socks5(addr, &[0, 2], grant.token(), 3, b"127.0.0.1", port).await;
    assert_eq!(code, 0);
    echo_roundtrip(&mut stream, b"socks by name\r\n").await;
    let (code, mut stream) = socks5(addr, &[2], grant.token(), 1, &[127, 0, 0, 1], port).await;
    assert_eq!(code, 0);
    echo_roundtrip(&mut stream, b"socks by address\r\n").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_nul_in_domain_name_does_not_match_a_wildcard() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) = proxy_with(
        &[
            format!("127.0.0.1/32:{port}"),
            format!("*.allowed.example:{port}"),
        ],
        Budget::UNLIMITED,
    )
    .await;
    let (code, _) = socks5(
        addr,
        &[2],
        grant.token(),
        3,
        b"127.0.0.1\0.allowed.example",
        port,
    )
    .await;
    assert_eq!(code, 2, "connection not allowed by ruleset");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert!(matches!(
        refusals(&grant.drain_log().0).as_slice(),
        [Refusal::Policy(DenyReason::InvalidName { .. })]
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_ipv4_mapped_ipv6_cannot_smuggle_loopback() {
    let (port, accepted) = echo_server().await;
    let (_proxy, grant, addr) = proxy_with(
        &[format!("[::/0]:{port}"), format!("0.0.0.0/0:{port}")],
        Budget::UNLIMITED,
    )
    .await;
    let mapped: std::net::Ipv6Addr = "::ffff:127.0.0.1".parse().unwrap();
    let (code, _) = socks5(addr, &[2], grant.token(), 4, &mapped.octets(), port).await;
    assert_eq!(code, 2);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert!(matches!(
        refusals(&grant.drain_log().0).as_slice(),
        [Refusal::Policy(DenyReason::InvalidName { .. })]
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_without_the_run_credential_is_refused() {
    let (port, accepted) = echo_server().await;
    let (_proxy, _grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    // No username/password method offered: no acceptable method.
    let (code, _) = socks5(addr, &[0], "", 1, &[127, 0, 0, 1], port).await;
    assert_eq!(code, 0xff);
    // A wrong token: authentication fails.
    let (code, _) = socks5(addr, &[2], "not-the-token", 1, &[127, 0, 0, 1], port).await;
    assert_eq!(code, 0xee);
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_socks5h_reaches_only_the_allowed_server() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl is not installed; skipping");
        return;
    }
    let port = http_server().await;
    let other = http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let curl = |target: u16| {
        let proxy_url = format!("socks5h://{}:x@{addr}", grant.token());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", "--noproxy", "", "-x"])
                .arg(proxy_url)
                .arg(format!("http://127.0.0.1:{target}/"))
                .output()
                .unwrap()
        })
    };
    let ok = curl(port).await.unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(ok.stdout, b"ok");
    let refused = curl(other).await.unwrap();
    assert!(!refused.status.success());
}

/// A loopback HTTP server that keeps everything each connection sent (reading for a
/// moment past the head, to catch anything smuggled after it), then answers `ok`.
async fn recording_http_server() -> (u16, Arc<std::sync::Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, however slow the machine...
                let _ = tokio::time::timeout(WAIT, async {
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                })
                .await;
                // ...then whatever follows it for a moment.
                let _ = tokio::time::timeout(Duration::from_millis(300), async {
                    loop {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                })
                .await;
                record.lock().unwrap().extend_from_slice(&buf);
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    (port, seen)
}

async fn read_to_end(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_request_reaches_allowed_server_without_the_credential() {
    let (port, seen) = recording_http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST http://127.0.0.1:{port}/submit?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: {}\r\nContent-Length: 4\r\n\r\nbody",
        grant.proxy_authorization()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_to_end(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("ok"), "{response}");
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert!(seen.starts_with("POST /submit?x=1 HTTP/1.1\r\n"), "{seen}");
    assert!(seen.ends_with("\r\n\r\nbody"), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("proxy-authorization"),
        "{seen}"
    );
    assert!(
        !seen.contains(grant.token()),
        "the credential leaked upstream: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_pipelined_second_request_to_another_host_is_not_forwarded() {
    let (port, seen) = recording_http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let auth = grant.proxy_authorization();
    let head = format!(
        "GET http://127.0.0.1:{port}/ HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\nGET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: {auth}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let response = read_to_end(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let seen = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert_eq!(seen.matches("HTTP/1.1\r\n").count(), 1, "{seen}");
    assert!(!seen.contains("evil"), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_smuggling_shapes_are_refused() {
    let (port, seen) = recording_http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let auth = grant.proxy_authorization();
    for (extra, status) in [
        ("Transfer-Encoding: chunked\r\n", 501),
        ("Content-Length: 4\r\nContent-Length: 5\r\n", 400),
        ("Content-Length: +4\r\n", 400),
        ("Host: evil.example\r\n", 400),
    ] {
        let stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST http://127.0.0.1:{port}/ HTTP/1.1\r\n{extra}Proxy-Authorization: {auth}\r\n\r\n"
        );
        assert_eq!(
            send_head(stream, head.as_bytes()).await.0,
            status,
            "{extra}"
        );
    }
    for target in [
        format!("ftp://127.0.0.1:{port}/"),
        format!("http://user@127.0.0.1:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://127.0.0.1:{port}/#frag"),
        "/relative".to_string(),
    ] {
        let stream = TcpStream::connect(addr).await.unwrap();
        let head = format!("GET {target} HTTP/1.1\r\nProxy-Authorization: {auth}\r\n\r\n");
        let status = send_head(stream, head.as_bytes()).await.0;
        assert!(status == 400 || status == 403, "{target}: {status}");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_plain_http_proxy_reaches_only_the_allowed_server() {
    if std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("curl is not installed; skipping");
        return;
    }
    let port = http_server().await;
    let other = http_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let curl = |target: u16| {
        let proxy_url = grant.proxy_url(addr);
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "10",
                    "--noproxy",
                    "",
                    "-o",
                    "-",
                    "-w",
                    " %{http_code}",
                    "-x",
                ])
                .arg(proxy_url)
                .arg(format!("http://127.0.0.1:{target}/"))
                .output()
                .unwrap()
        })
    };
    let ok = curl(port).await.unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "ok 200");
    let refused = curl(other).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&refused.stdout), " 403");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_runs_credential_is_refused_on_a_runs_own_listener() {
    let (port, accepted) = echo_server().await;
    let proxy = EgressProxy::bind(&[]).await.unwrap();
    let rules = [format!("127.0.0.1/32:{port}")];
    let mine = proxy.register(policy(&rules), Budget::UNLIMITED).unwrap();
    let other = proxy.register(policy(&rules), Budget::UNLIMITED).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let attached = proxy.attach(listener, &mine).unwrap();
    let target = format!("127.0.0.1:{port}");

    let (status, _) = connect(addr, &other, &target).await;
    assert_eq!(status, 407, "another run's credential must not work here");
    let (status, _) = connect_raw(addr, &target, None).await;
    assert_eq!(status, 407, "no credential");
    let (status, mut tunnel) = connect(addr, &mine, &target).await;
    assert_eq!(status, 200);
    echo_roundtrip(&mut tunnel, b"through the run's own listener\r\n").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let receipt = mine.receipt("127.0.0.1:3128", rules.to_vec());
    assert_eq!(receipt.decisions.len(), 1, "{receipt:?}");
    assert!(receipt.decisions[0].allowed);
    assert_eq!(
        receipt.decisions[0].rule.as_deref(),
        Some(rules[0].as_str())
    );

    drop(attached);
    // The accept task is aborted: the listener closes, so new clients are refused.
    let refused = tokio::time::timeout(WAIT, async {
        loop {
            match TcpStream::connect(addr).await {
                Err(_) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    assert!(refused.is_ok(), "the listener kept accepting after detach");
}

#[tokio::test]
async fn budget_cuts_become_typed_receipt_limits() {
    let (port, _) = echo_server().await;
    let rules = [format!("127.0.0.1/32:{port}")];
    let budget = Budget {
        max_connections: Some(1),
        max_bytes: None,
    };
    let (_proxy, grant, addr) = proxy_with(&rules, budget).await;
    let target = format!("127.0.0.1:{port}");
    let (status, _first) = connect(addr, &grant, &target).await;
    assert_eq!(status, 200);
    let (status, _) = connect(addr, &grant, &target).await;
    assert_eq!(status, 429);
    let receipt = grant.receipt("test", rules.to_vec());
    let cut = receipt
        .decisions
        .iter()
        .find(|d| !d.allowed)
        .expect("a refusal");
    assert_eq!(
        cut.refusal,
        Some(sandbox_core::receipt::EgressRefusal::Budget)
    );
    assert_eq!(cut.limit, Some(sandbox_core::LimitKind::EgressConnections));
    assert_eq!(receipt.connections, 2);
}

#[tokio::test]
async fn http_host_inside_a_tunnel_naming_another_host_is_cut_before_reaching_upstream() {
    let (port, accepted) = echo_server().await;
    let rules = [format!("127.0.0.1/32:{port}")];
    let (_proxy, grant, addr) = proxy_with(&rules, Budget::UNLIMITED).await;
    let (status, mut tunnel) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    tunnel
        .write_all(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        .await
        .unwrap();
    let mut back = Vec::new();
    let read = tokio::time::timeout(WAIT, tunnel.read_to_end(&mut back)).await;
    assert!(read.is_ok(), "the tunnel stayed open");
    assert!(
        back.is_empty(),
        "the request reached the upstream: {back:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    let (events, _) = grant.drain_log();
    let refused = refusals(&events);
    assert!(
        matches!(&refused[..], [Refusal::BadRequest(why)] if why.contains("evil.example")),
        "{refused:?}"
    );

    // The same request naming the allowed host goes through.
    let (status, mut tunnel) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    tunnel.write_all(request.as_bytes()).await.unwrap();
    let mut back = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(WAIT, async {
        while !back.ends_with(b"\r\n\r\n") {
            assert_eq!(tunnel.read(&mut byte).await.unwrap(), 1, "{back:?}");
            back.push(byte[0]);
        }
    })
    .await
    .unwrap();
    // One request, sent on as the plain-HTTP path sends it.
    assert_eq!(
        String::from_utf8(back).unwrap(),
        format!("GET / HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n")
    );
}

/// What a keep-alive HTTP server (a shared front end) read on each connection.
type Records = Arc<std::sync::Mutex<Vec<Vec<u8>>>>;

/// A loopback HTTP server that keeps connections alive the way a shared front end does: it
/// answers every request it reads, framed by `Content-Length`, whatever its `Host`, and
/// ignores `Connection: close`; it closes a connection at EOF or once it has been idle for
/// a moment. Each connection's bytes are recorded whole when it closes, then `closed`
/// gets a message, so a test checks the record only after the connection is over.
async fn keepalive_server() -> (u16, Records, Closed) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (records, closed) = serve_keepalive(listener);
    (port, records, closed)
}

/// Tells when the keep-alive server closed a connection.
type Closed = tokio::sync::mpsc::UnboundedReceiver<()>;

fn serve_keepalive(listener: TcpListener) -> (Records, Closed) {
    let records: Records = Arc::default();
    let all = records.clone();
    let (tx, closed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let (all, tx) = (all.clone(), tx.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut pending = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Answer every complete request buffered so far.
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                        let body: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if pending.len() < end + 4 + body {
                            break;
                        }
                        pending.drain(..end + 4 + body);
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                            .await;
                    }
                    let idle = Duration::from_millis(1000);
                    match tokio::time::timeout(idle, stream.read(&mut chunk)).await {
                        Ok(Ok(n)) if n > 0 => {
                            seen.extend_from_slice(&chunk[..n]);
                            pending.extend_from_slice(&chunk[..n]);
                        }
                        _ => break,
                    }
                }
                all.lock().unwrap().push(seen);
                let _ = tx.send(());
            });
        }
    });
    (records, closed)
}

/// Waits (within a generous bound) until the keep-alive server closed one more connection,
/// then returns everything its connections read, as text.
async fn upstream_saw(
    records: &Records,
    closed: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> String {
    tokio::time::timeout(Duration::from_secs(30), closed.recv())
        .await
        .expect("the upstream connection never closed")
        .unwrap();
    let records = records.lock().unwrap();
    records
        .iter()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect::<Vec<_>>()
        .join("\n--\n")
}

/// Reads one `ok` response (or until the proxy closes), within a generous bound.
async fn read_first_response<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while !got.ends_with(b"ok") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

/// Two requests in one write: the first to the allowed host, the second naming another
/// host served by the same front end.
fn pipelined(allowed: &str, body: &str) -> String {
    format!(
        "POST / HTTP/1.1\r\nHost: {allowed}\r\nContent-Length: {}\r\n\r\n{body}GET /steal HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        body.len()
    )
}

fn assert_only_the_allowed_request(seen: &str) {
    assert_eq!(seen.matches(" HTTP/1.1\r\n").count(), 1, "{seen}");
    assert!(!seen.contains("evil.example"), "{seen}");
    assert!(!seen.contains("/steal"), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_second_request_with_another_host_on_a_plain_http_proxy_connection_never_reaches_upstream(
) {
    let (port, records, mut closed) = keepalive_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let allowed = format!("127.0.0.1:{port}");
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST http://{allowed}/ HTTP/1.1\r\nHost: {allowed}\r\nProxy-Authorization: {}\r\nContent-Length: 4\r\n\r\nbodyGET /steal HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        grant.proxy_authorization()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let response = read_first_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    drop(stream);
    assert_only_the_allowed_request(&upstream_saw(&records, &mut closed).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_second_request_with_another_host_in_a_connect_tunnel_never_reaches_upstream() {
    let (port, records, mut closed) = keepalive_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let allowed = format!("127.0.0.1:{port}");
    let (status, mut tunnel) = connect(addr, &grant, &allowed).await;
    assert_eq!(status, 200);
    tunnel
        .write_all(pipelined(&allowed, "body").as_bytes())
        .await
        .unwrap();
    let response = read_first_response(&mut tunnel).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let seen = upstream_saw(&records, &mut closed).await;
    assert_only_the_allowed_request(&seen);
    assert!(
        seen.ends_with("\r\n\r\nbody"),
        "the body is forwarded whole: {seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_request_after_the_first_response_in_a_connect_tunnel_never_reaches_upstream() {
    let (port, records, mut closed) = keepalive_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let allowed = format!("127.0.0.1:{port}");
    let (status, mut tunnel) = connect(addr, &grant, &allowed).await;
    assert_eq!(status, 200);
    let first = format!("GET / HTTP/1.1\r\nHost: {allowed}\r\n\r\n");
    tunnel.write_all(first.as_bytes()).await.unwrap();
    let response = read_first_response(&mut tunnel).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // A keep-alive client reuses the connection: the proxy must not carry it.
    let _ = tunnel
        .write_all(b"GET /steal HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        .await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tunnel.read_to_end(&mut rest)).await;
    assert!(
        !String::from_utf8_lossy(&rest).contains("200"),
        "a second response came back"
    );
    assert_only_the_allowed_request(&upstream_saw(&records, &mut closed).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_second_request_with_another_host_in_a_socks5_tunnel_never_reaches_upstream() {
    let (port, records, mut closed) = keepalive_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let (code, mut tunnel) = socks5(addr, &[2], grant.token(), 1, &[127, 0, 0, 1], port).await;
    assert_eq!(code, 0);
    tunnel
        .write_all(pipelined(&format!("127.0.0.1:{port}"), "").as_bytes())
        .await
        .unwrap();
    let response = read_first_response(&mut tunnel).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_only_the_allowed_request(&upstream_saw(&records, &mut closed).await);
}

/// A transparent listener on `127.0.0.2:PORT` whose address maps to the name
/// `127.0.0.1`, for an upstream on `127.0.0.1:PORT` (the transparent port is the
/// upstream's), and the run's policy naming that upstream explicitly.
async fn transparent_run(
    proxy: &EgressProxy,
    budget: Budget,
) -> (RunGrant, Attached, SocketAddr, u16, Records, Closed) {
    for _ in 0..50 {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        let Ok(listener) = std::net::TcpListener::bind(("127.0.0.2", port)) else {
            continue;
        };
        let (records, closed) = serve_keepalive(upstream);
        let grant = proxy
            .register(policy(&[format!("127.0.0.1/32:{port}")]), budget)
            .unwrap();
        let names = [("127.0.0.2".parse().unwrap(), "127.0.0.1".to_string())].into();
        let addr = listener.local_addr().unwrap();
        let attached = proxy.attach_transparent(listener, &grant, names).unwrap();
        return (grant, attached, addr, port, records, closed);
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_second_request_with_another_host_on_the_transparent_listener_never_reaches_upstream(
) {
    let proxy = EgressProxy::attach_only(tokio::runtime::Handle::current());
    let (grant, _attached, addr, port, records, mut closed) =
        transparent_run(&proxy, Budget::UNLIMITED).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(pipelined(&format!("127.0.0.1:{port}"), "x").as_bytes())
        .await
        .unwrap();
    let response = read_first_response(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_only_the_allowed_request(&upstream_saw(&records, &mut closed).await);
    assert!(grant
        .drain_log()
        .0
        .iter()
        .any(|e| matches!(e.outcome, Outcome::Allowed { .. })));
}

/// Opens a `CONNECT` tunnel to a keep-alive front end, sends `bytes` (then half-closes if
/// `half_close`), and returns what the front end read over the whole connection and the
/// run's refusals.
async fn through_a_tunnel(bytes: &[u8], half_close: bool) -> (String, Vec<Refusal>) {
    let (port, records, mut closed) = keepalive_server().await;
    let (_proxy, grant, addr) =
        proxy_with(&[format!("127.0.0.1/32:{port}")], Budget::UNLIMITED).await;
    let (status, mut tunnel) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    tunnel.write_all(bytes).await.unwrap();
    if half_close {
        tunnel.shutdown().await.unwrap();
    }
    let mut back = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tunnel.read_to_end(&mut back)).await;
    let seen = upstream_saw(&records, &mut closed).await;
    (seen, refusals(&grant.drain_log().0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_shapes_that_could_hide_a_second_host_in_a_tunnel_never_reach_upstream() {
    for (what, bytes) in [
        (
            "an empty line before the request (servers skip it)",
            &b"\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"[..],
        ),
        (
            "a lower-case method",
            b"get / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        ),
        (
            "a chunked body, whose framing the proxy does not parse",
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        ),
        (
            "HTTP/2 with prior knowledge (a stream per host)",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ),
        (
            "a bare LF in the request target, injecting a header line",
            b"GET /\nHost:evil.example\nX: HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ),
        (
            "an absolute target naming another host",
            b"GET http://evil.example/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        ),
    ] {
        let (seen, refused) = through_a_tunnel(bytes, false).await;
        assert!(seen.is_empty(), "{what}: the upstream read {seen:?}");
        assert!(
            matches!(refused.as_slice(), [Refusal::BadRequest(_)]),
            "{what}: {refused:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_cut_short_by_a_half_close_never_reaches_upstream() {
    // Bare LFs after the request line: the head never ends in CRLF CRLF, but a lenient
    // server would read it.
    let (seen, refused) = through_a_tunnel(b"GET / HTTP/1.1\r\nHost: evil.example\n\n", true).await;
    assert!(seen.is_empty(), "the upstream read {seen:?}");
    assert!(
        matches!(refused.as_slice(), [Refusal::BadRequest(why)] if why.contains("closed")),
        "{refused:?}"
    );
}

/// Tells when the proxy closed an idle connection.
type ClosedTx = tokio::sync::mpsc::UnboundedSender<()>;

/// Opens `n` connections to `addr` (from `from` if given) that send nothing; `closed` is
/// told each time the proxy closes one of them.
async fn idle_connections(
    addr: SocketAddr,
    from: Option<std::net::IpAddr>,
    n: usize,
    closed: &ClosedTx,
) {
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(ip) = from {
            socket.bind(SocketAddr::new(ip, 0)).unwrap();
        }
        let mut stream = socket.connect(addr).await.unwrap();
        let tx = closed.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 256];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            let _ = tx.send(());
        });
    }
}

/// Waits, within a generous bound, until `count` of the connections were closed.
async fn closed_by_the_proxy(closed: &mut Closed, count: usize) {
    tokio::time::timeout(Duration::from_secs(30), async {
        for _ in 0..count {
            closed.recv().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the proxy did not close {count} connections"));
}

/// Waits, within a generous bound, until the run counted `count` connections.
async fn counted(grant: &RunGrant, count: u64) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while grant.connections() < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} of {count} connections counted", grant.connections()));
}

/// A `CONNECT` that succeeds once the proxy has a slot for it, retried within a generous
/// bound while the proxy closes it at accept.
async fn connect_once_free(addr: SocketAddr, grant: &RunGrant, target: &str) -> TcpStream {
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        grant.proxy_authorization()
    );
    let attempt = async {
        loop {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let mut reply = Vec::new();
            let mut byte = [0u8; 1];
            if stream.write_all(head.as_bytes()).await.is_ok() {
                while !reply.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => reply.push(byte[0]),
                        _ => break,
                    }
                }
            }
            if reply.starts_with(b"HTTP/1.1 200") {
                return stream;
            }
            assert!(reply.is_empty(), "{}", String::from_utf8_lossy(&reply));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), attempt)
        .await
        .expect("the slot was never given back")
}

fn attach_listener(proxy: &EgressProxy, grant: &RunGrant) -> (Attached, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (proxy.attach(listener, grant).unwrap(), addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_unauthenticated_connections_of_one_run_do_not_starve_another_run() {
    let (port, accepted) = echo_server().await;
    // Small limits, so the attack fits in a test: without a per-run quota, run A's twelve
    // idle connections would take all eight of the proxy's slots.
    let limits = ClientLimits {
        max_clients: 8,
        max_clients_per_run: 4,
        auth_timeout: Duration::from_secs(600),
        ..ClientLimits::default()
    };
    let proxy = EgressProxy::attach_only_with_limits(tokio::runtime::Handle::current(), limits);
    // Run A: its proxy listener and its transparent listener.
    let (a, _transparent, transparent_addr, ..) = transparent_run(&proxy, Budget::UNLIMITED).await;
    let (_a_listener, a_addr) = attach_listener(&proxy, &a);
    let b = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), Budget::UNLIMITED)
        .unwrap();
    let (_b_listener, b_addr) = attach_listener(&proxy, &b);

    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    idle_connections(a_addr, None, 6, &tx).await;
    idle_connections(transparent_addr, None, 6, &tx).await;
    counted(&a, 12).await;
    // A holds its four slots; its eight other connections are closed at accept (and the
    // admitted transparent ones may see their upstream close too: at least eight).
    closed_by_the_proxy(&mut closed, 8).await;

    let (status, mut tunnel) = connect(b_addr, &b, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200, "run B got no slot");
    echo_roundtrip(&mut tunnel, b"run B still gets through\r\n").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // A's log names each connection closed at accept.
    let mut refused = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while refused.len() < 8 {
            refused.extend(refusals(&a.drain_log().0));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        refused,
        vec![Refusal::Budget(BudgetLimit::Concurrent { max: 4 }); 8],
        "A's log"
    );
    assert_eq!(a.connections(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_connections_past_its_budget_are_refused_at_accept() {
    let (port, accepted) = echo_server().await;
    let proxy = EgressProxy::attach_only(tokio::runtime::Handle::current());
    let budget = Budget {
        max_connections: Some(2),
        max_bytes: None,
    };
    let grant = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), budget)
        .unwrap();
    let (_attached, addr) = attach_listener(&proxy, &grant);
    // Two connections that never present a credential spend the budget...
    let (tx, _closed) = tokio::sync::mpsc::unbounded_channel();
    idle_connections(addr, None, 2, &tx).await;
    counted(&grant, 2).await;
    // ...so the next one, with the credential, is refused without an upstream.
    let (status, mut stream) = connect(addr, &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 429);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest))
        .await
        .expect("the refused connection stays open")
        .unwrap();
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    assert_eq!(grant.connections(), 3);
    let (events, _) = grant.drain_log();
    assert_eq!(
        refusals(&events),
        vec![Refusal::Budget(BudgetLimit::Connections { max: 2 })]
    );
    assert_eq!(
        events[0].host, "",
        "refused at accept, before it named a host"
    );
    let receipt = grant.receipt("test", Vec::new());
    assert!(receipt.decisions.is_empty(), "drained already");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_without_credentials_is_closed_quickly() {
    let (port, _) = echo_server().await;
    let limits = ClientLimits {
        max_clients_per_run: 1,
        max_unauthenticated_per_peer: 1,
        auth_timeout: Duration::from_secs(1),
        ..ClientLimits::default()
    };
    let proxy = EgressProxy::attach_only_with_limits(tokio::runtime::Handle::current(), limits);
    let grant = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), Budget::UNLIMITED)
        .unwrap();
    let (_attached, own) = attach_listener(&proxy, &grant);
    let shared = proxy
        .serve_shared(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    let target = format!("127.0.0.1:{port}");
    for addr in [own, shared.addr()] {
        // One that sends nothing, one that stops in the middle of its head: each holds the
        // only slot (the run's, or the peer's unauthenticated place) until it is closed.
        let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
        idle_connections(addr, None, 1, &tx).await;
        closed_by_the_proxy(&mut closed, 1).await;
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"CONNECT 127.0.0.1:").await.unwrap();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), partial.read_to_end(&mut rest))
            .await
            .expect("a partial head is closed")
            .unwrap();
        assert!(rest.starts_with(b"HTTP/1.1 408"), "{rest:?}");
        // The slot was given back (the client may see the close a moment before the
        // proxy's task ends and gives it back: retry until it is).
        let mut tunnel = connect_once_free(addr, &grant, &target).await;
        echo_roundtrip(&mut tunnel, b"the slot is free again\r\n").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_unauthenticated_connections_on_a_shared_listener_do_not_take_every_slot() {
    let (port, accepted) = echo_server().await;
    let limits = ClientLimits {
        max_clients: 8,
        max_unauthenticated_per_peer: 4,
        auth_timeout: Duration::from_secs(600),
        ..ClientLimits::default()
    };
    let proxy = EgressProxy::attach_only_with_limits(tokio::runtime::Handle::current(), limits);
    let grant = proxy
        .register(policy(&[format!("127.0.0.1/32:{port}")]), Budget::UNLIMITED)
        .unwrap();
    let shared = proxy
        .serve_shared(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .unwrap();
    // Another peer (127.0.0.2) opens twelve connections and never authenticates: it keeps
    // four, the others are closed at once, and the proxy's other slots stay free.
    let attacker = "127.0.0.2".parse().unwrap();
    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    idle_connections(shared.addr(), Some(attacker), 12, &tx).await;
    closed_by_the_proxy(&mut closed, 8).await;
    let (status, mut tunnel) = connect(shared.addr(), &grant, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200);
    echo_roundtrip(&mut tunnel, b"a run on the shared listener\r\n").await;
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        grant.connections(),
        1,
        "unauthenticated ones count for no run"
    );
}
