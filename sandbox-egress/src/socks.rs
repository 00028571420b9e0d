//! SOCKS5 (RFC 1928) with the username/password method (RFC 1929): `CONNECT` only, names
//! resolved by the proxy (`socks5h`).

use std::io;
use std::sync::{Arc, Weak};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::admission::Ticket;
use crate::tunnel::splice;
use crate::{find_run, intercept, open_upstream, refuse, Refusal, RunState, Runs};

/// The SOCKS protocol version served (SOCKS5, RFC 1928).
pub(crate) const SOCKS_VERSION: u8 = 0x05;
/// The username/password method (RFC 1929): the username is the run's token.
const SOCKS_USERPASS: u8 = 0x02;

/// A SOCKS5 reply without a bound address (`0.0.0.0:0`).
fn socks_reply(code: u8) -> [u8; 10] {
    [SOCKS_VERSION, code, 0, 0x01, 0, 0, 0, 0, 0, 0]
}

/// Serves SOCKS5 (`CONNECT` only; the `h` of `socks5h`: names are resolved here, never by
/// the client). The version byte was already read; the handshake must be done by
/// `deadline`. Only the username/password method is offered, with the run's token as
/// username; the password is ignored.
pub(crate) async fn serve_socks<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    runs: Weak<Runs>,
    ticket: &mut Ticket,
    deadline: tokio::time::Instant,
) {
    let handshake = tokio::time::timeout_at(deadline, socks_handshake(&mut client, &runs)).await;
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
    let opened = match ticket.admit(&run, &host_text, port) {
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
    splice(client, upstream, Vec::new(), &run, &host_text, port, addr).await;
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
