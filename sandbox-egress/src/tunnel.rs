//! Byte tunnels (`CONNECT`, SOCKS5, transparent connections) once the upstream is open:
//! the check of the client's first bytes, then the splice both ways under the run's byte
//! budget.

use std::net::IpAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::first_bytes::{self, FirstBytes};
use crate::http1::{send_request, tunnel_request};
use crate::{refuse, Refusal, RunState, HEAD_TIMEOUT, SPLICE_BUF};

/// Splices a tunnel to `host:port` (pinned at `addr`) both ways, counting bytes against
/// the run's budget. The client's first bytes are inspected before any reach the upstream
/// (see [`inspect_first_bytes`]):
///
/// - an HTTP request head carries exactly one request: it is checked and rebuilt as on the
///   plain-HTTP path (an origin-form target, its `Host` naming `host`, a body framed by one
///   `Content-Length`, `Transfer-Encoding` refused, `connection: close` sent on), and
///   nothing the client sends after its body is forwarded, so a second request (pipelined
///   or kept alive) for another `Host` never reaches the pinned address;
/// - a TLS ClientHello must name `host` (or nothing) as its server name; what follows is
///   encrypted, so it is spliced as it comes (one server name per connection);
/// - anything else that cannot be an HTTP/1 request is spliced as it comes.
///
/// Upstream bytes flow from the start, so server-speaks-first protocols work. Why a
/// tunnel was cut goes to the run's log.
pub(crate) async fn splice<S: AsyncRead + AsyncWrite + Unpin>(
    client: S,
    upstream: TcpStream,
    early: Vec<u8>,
    run: &RunState,
    host: &str,
    port: u16,
    addr: IpAddr,
) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut up_read, mut up_write) = upstream.into_split();
    let up = async {
        let mut early = early;
        let carry = inspect_first_bytes(&mut client_read, &mut early, host)
            .await
            .map_err(Stop::Refused)?;
        if carry == Carry::OneRequest {
            let (request, head_end, body) = tunnel_request(run, &early, host, port, addr)
                .map_err(|why| Stop::Refused(Refusal::BadRequest(why)))?;
            let rest = &early[head_end..];
            // The write side stays open until the response is in.
            return send_request(&mut client_read, &mut up_write, run, &request, rest, body).await;
        }
        if !early.is_empty() {
            run.take_bytes(early.len() as u64)
                .map_err(|limit| Stop::Refused(Refusal::Budget(limit)))?;
            up_write.write_all(&early).await.map_err(|_| Stop::Io)?;
        }
        copy(&mut client_read, &mut up_write, run).await
    };
    let down = copy(&mut up_read, &mut client_write, run);
    if let Err(Stop::Refused(why)) = tokio::try_join!(up, down) {
        refuse(run, host, port, Some(addr), why);
    }
}

/// How a tunnel carries the client's bytes once its first bytes are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carry {
    /// One HTTP request, then nothing more from the client.
    OneRequest,
    /// Every byte as it comes (TLS, other protocols, or a client that sent nothing).
    Bytes,
}

/// Reads the client's first bytes into `early` until [`first_bytes::classify`] can decide,
/// and refuses a destination other than `authority`, malformed bytes, and bytes left
/// undecided when the client closes (a head without its end could still be read as a
/// request by a lenient server). A client that sends nothing at all has nothing to check;
/// once it started, it has [`HEAD_TIMEOUT`] to finish.
async fn inspect_first_bytes<R: AsyncRead + Unpin>(
    client: &mut R,
    early: &mut Vec<u8>,
    authority: &str,
) -> Result<Carry, Refusal> {
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
            FirstBytes::Http { .. } => return Ok(Carry::OneRequest),
            FirstBytes::Malformed(why) => return Err(Refusal::BadRequest(why.to_string())),
            FirstBytes::Tls { .. } | FirstBytes::Other => return Ok(Carry::Bytes),
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
            Ok(0) | Err(_) if early.is_empty() => return Ok(Carry::Bytes),
            Ok(0) | Err(_) => {
                return Err(Refusal::BadRequest(
                    "the client closed before its first bytes could be checked".into(),
                ))
            }
            Ok(n) => {
                early.extend_from_slice(&chunk[..n]);
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + HEAD_TIMEOUT);
            }
        }
    }
}

/// Why one direction of a connection stopped.
pub(crate) enum Stop {
    /// A read or write failed (the peer went away): nothing to log.
    Io,
    /// The proxy cut it, for this reason (logged).
    Refused(Refusal),
}

/// Copies `from` to `to` until EOF (then shuts `to` down), counting bytes against the
/// run's byte budget.
pub(crate) async fn copy<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
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
