//! Byte tunnels (`CONNECT`, SOCKS5, transparent connections) once the upstream is open:
//! the check of the client's first bytes, then the splice both ways under the run's byte
//! budget.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::first_bytes::{self, FirstBytes};
use crate::{Refusal, RunState, HEAD_TIMEOUT, SPLICE_BUF};

/// Copies bytes both ways until both sides are done, counting them against the run's byte
/// budget. Exceeding it calls `on_budget` (which logs it) and then drops both sides, so the
/// log has the reason before the client sees the connection close.
/// Splices a tunnel both ways, counting bytes against the run's budget. The client's first
/// bytes are inspected before any reach the upstream: a TLS server name or HTTP `Host`
/// naming another host than `authority` (the host the policy allowed) ends the tunnel, as
/// do malformed ones (see [`first_bytes`]). Upstream bytes flow from the start, so
/// server-speaks-first protocols work. `on_stop` gets why a tunnel was cut.
pub(crate) async fn splice<S: AsyncRead + AsyncWrite + Unpin>(
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

pub(crate) enum Stop {
    Io,
    Refused(Refusal),
}

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
