//! What the egress proxy costs, measured in one run against a direct connection to the same
//! loopback server: connection latency (connect, one request byte, one reply byte) and bulk
//! throughput (one connection, both directions counted by the proxy's budget).
//!
//! `cargo bench -p sandbox-egress --bench proxy_vs_direct` (env: `CONNS`, default 2000;
//! `MIB`, default 256). Prints p50/p90 and ratios (proxied / direct); no thresholds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sandbox_core::caps::NetRule;
use sandbox_core::egress::EgressPolicy;
use sandbox_egress::{Budget, EgressProxy, Listen, RunGrant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Echoes every byte back, per connection.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn tunnel(proxy: SocketAddr, grant: &RunGrant, target: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(proxy).await.expect("connect proxy");
    stream.set_nodelay(true).expect("nodelay");
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nProxy-Authorization: {}\r\n\r\n",
        grant.proxy_authorization()
    );
    stream.write_all(head.as_bytes()).await.expect("send head");
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.expect("reply");
        reply.push(byte[0]);
    }
    assert!(reply.starts_with(b"HTTP/1.1 200"), "{reply:?}");
    stream
}

async fn direct(target: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(target).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
}

/// One byte each way. Not a letter or digit: through the proxy, a first message made of
/// token characters alone could still become an HTTP request line, so the tunnel waits
/// for the byte that ends it; a binary byte is classified at once.
async fn ping(stream: &mut TcpStream) {
    stream.write_all(b"\x01").await.expect("write");
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte).await.expect("read");
}

/// Sends `bytes` and reads them back concurrently; returns MiB/s of payload.
async fn bulk(stream: TcpStream, bytes: usize) -> f64 {
    let (mut r, mut w) = stream.into_split();
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            w.write_all(&chunk[..n]).await.expect("write");
            left -= n;
        }
        w
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < bytes {
        let n = r.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed early at {got}");
        got += n;
    }
    drop(writer.await.expect("writer"));
    bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let conns = env_or("CONNS", 2000);
    let mib = env_or("MIB", 256);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let target = echo_server().await;
        let proxy = EgressProxy::bind(&[Listen::TcpLoopback])
            .await
            .expect("proxy");
        let rule: NetRule = format!("127.0.0.1/32:{}", target.port())
            .parse()
            .expect("rule");
        let policy = EgressPolicy::new(&[rule]).expect("policy");
        let grant = proxy.register(policy, Budget::UNLIMITED).expect("register");
        let proxy_addr = proxy.tcp_addr().expect("tcp");

        let (mut d, mut p) = (Vec::with_capacity(conns), Vec::with_capacity(conns));
        // Interleaved, so drift in the machine's load hits both series alike.
        for _ in 0..conns {
            let start = Instant::now();
            let mut s = direct(target).await;
            ping(&mut s).await;
            d.push(start.elapsed());
            let start = Instant::now();
            let mut s = tunnel(proxy_addr, &grant, target).await;
            ping(&mut s).await;
            p.push(start.elapsed());
            let _ = grant.drain_log();
        }
        d.sort();
        p.sort();
        let us = |x: Duration| x.as_secs_f64() * 1e6;
        println!(
            "load: {}",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        );
        println!("connection + 1-byte round trip, {conns} each (µs):");
        for (name, q) in [("p50", 0.5), ("p90", 0.9)] {
            let (a, b) = (percentile(&d, q), percentile(&p, q));
            println!(
                "  {name}: direct {:8.1}   proxied {:8.1}   ratio {:.2}x   added {:+.1}",
                us(a),
                us(b),
                us(b) / us(a),
                us(b) - us(a)
            );
        }
        let bytes = mib << 20;
        let direct_rate = bulk(direct(target).await, bytes).await;
        let proxied_rate = bulk(tunnel(proxy_addr, &grant, target).await, bytes).await;
        println!("bulk echo of {mib} MiB on one connection (MiB/s):");
        println!(
            "  direct {direct_rate:8.1}   proxied {proxied_rate:8.1}   ratio {:.2}x",
            proxied_rate / direct_rate
        );
    });
}
