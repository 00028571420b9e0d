//! HTTP/1 on the proxy's client side: each client's first request (the credential, then
//! `CONNECT` or plain HTTP), the request-head reader and strict parser, the authority
//! splitters, and plain-HTTP proxying of one request per connection (absolute URIs, and
//! the requests read from tunnels).

use std::net::IpAddr;
use std::sync::Weak;
use std::time::Duration;

use base64::Engine as _;
use sandbox_core::egress::Host;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::admission::Ticket;
use crate::socks::{serve_socks, SOCKS_VERSION};
use crate::tunnel::{copy, splice, Stop};
use crate::{
    find_run, intercept, open_upstream, refuse, secrets, EgressEvent, Outcome, Refusal, RunState,
    Runs, MAX_HEADERS, MAX_HEAD_BYTES, SPLICE_BUF,
};

/// The realm of the `407` challenge.
const REALM: &str = "strata-egress";

/// A parsed request head.
pub(crate) struct Head {
    pub(crate) method: String,
    pub(crate) target: String,
    pub(crate) headers: Vec<(String, String)>,
}

/// Reads the request head, starting with the bytes in `buf` already read; returns it and
/// the bytes the client sent after it.
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
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
pub(crate) fn parse_head(raw: &[u8]) -> Result<Head, String> {
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
pub(crate) fn basic_user(value: &str) -> Option<String> {
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
pub(crate) fn split_authority(authority: &str) -> Result<(&str, u16), String> {
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

pub(crate) async fn respond<S: AsyncWrite + Unpin>(client: &mut S, status: &str, extra: &str) {
    let response =
        format!("HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// Splits an absolute `http://` URI into its authority and the origin-form target
/// (`/path?query`). Fragments, userinfo (refused later by [`Host::parse`]), other schemes,
/// and control characters or spaces in the path are refused.
pub(crate) fn split_absolute_uri(target: &str) -> Result<(bool, &str, String), String> {
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
pub(crate) fn split_authority_default(
    authority: &str,
    default: u16,
) -> Result<(&str, u16), String> {
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
pub(crate) async fn serve_plain_http<S: AsyncRead + AsyncWrite + Unpin>(
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
    let host_port = HostPort::Exactly {
        port,
        default: default_port,
    };
    let body = match check_request_headers(&head, host_text, host_port) {
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

/// Which port a request's `Host` header must name.
#[derive(Clone, Copy, Debug)]
pub(crate) enum HostPort {
    /// This port; a `Host` without one names `default` (the scheme's).
    Exactly {
        /// The request's port.
        port: u16,
        /// The port a `Host` without one names.
        default: u16,
    },
    /// Any port: a tunnel's request, whose destination is pinned already (only the host
    /// can route it elsewhere on a shared front end).
    Any,
}

/// Checks the headers of a request to `host_text`: one decimal `Content-Length` at most,
/// no `Transfer-Encoding`, and every `Host` naming the same host (and the port of
/// `host_port`). Returns the body length, or the status and reason of a refusal.
pub(crate) fn check_request_headers(
    head: &Head,
    host_text: &str,
    host_port: HostPort,
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
            "host" => {
                let (default, port) = match host_port {
                    HostPort::Exactly { port, default } => (default, Some(port)),
                    HostPort::Any => (0, None),
                };
                match split_authority_default(value, default) {
                    Ok((h, p))
                        if port.is_none_or(|port| p == port)
                            && Host::parse(h).is_ok()
                            && Host::parse(h) == Host::parse(host_text) =>
                    {
                        None
                    }
                    _ => Some(format!(
                        "the Host header {value:?} differs from the request's destination"
                    )),
                }
            }
            _ => None,
        };
        if let Some(why) = problem {
            return Err(("400 Bad Request", why));
        }
    }
    Ok(length.unwrap_or(0))
}

/// The one request of a tunnel or an intercepted connection, from its head `raw` (up to
/// CRLF CRLF): an origin-form target (`/`, then visible ASCII only, so nothing can be
/// injected into the request line sent on), headers that pass [`check_request_headers`]
/// for `host`, rebuilt by [`build_request`] (so it ends with `connection: close`; the
/// client's checked `Host` is kept). Returns it and the body length, or the status and
/// reason of a refusal.
pub(crate) fn origin_request(
    run: &RunState,
    raw: &[u8],
    host: &str,
    port: u16,
    addr: IpAddr,
    host_port: HostPort,
) -> Result<(String, u64), (&'static str, String)> {
    let bad = |why: String| ("400 Bad Request", why);
    let head = parse_head(raw).map_err(bad)?;
    if !is_origin_form(&head.target) {
        return Err(bad(format!(
            "a request in a tunnel must use an origin-form target, not {:?}",
            head.target
        )));
    }
    let body = check_request_headers(&head, host, host_port)?;
    let authority = match head.headers.iter().find(|(name, _)| name == "host") {
        Some((_, value)) => value.clone(),
        None => {
            let default = match host_port {
                HostPort::Exactly { default, .. } => default,
                HostPort::Any => 80,
            };
            let bracketed = match host.contains(':') {
                true => format!("[{host}]"),
                false => host.to_string(),
            };
            match port == default {
                true => bracketed,
                false => format!("{bracketed}:{port}"),
            }
        }
    };
    let request = build_request(run, &head, &head.target, &authority, host, port, addr);
    Ok((request, body))
}

/// Whether `target` is an origin-form request target: `/`, then visible ASCII only (no
/// control character, space or byte past ASCII to inject into the request line sent on).
fn is_origin_form(target: &str) -> bool {
    target.starts_with('/') && target.bytes().all(|b| b.is_ascii_graphic())
}

/// The one request a tunnel carries when its first bytes are an HTTP head (`early`, as
/// [`crate::first_bytes::classify`] found them, so the head is complete): returns the
/// request to send on (see [`origin_request`]), where the head ends in `early`, and the
/// body length. What follows the body is never forwarded: a client cannot pipeline or
/// keep alive a second request, for another `Host`, to the pinned address.
pub(crate) fn tunnel_request(
    run: &RunState,
    early: &[u8],
    host: &str,
    port: u16,
    addr: IpAddr,
) -> Result<(String, usize, u64), String> {
    let end = early
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|pos| pos + 4)
        .ok_or("an HTTP request head without its end")?;
    if end > MAX_HEAD_BYTES {
        return Err(format!("the request head exceeds {MAX_HEAD_BYTES} bytes"));
    }
    let (request, body) = origin_request(run, &early[..end], host, port, addr, HostPort::Any)
        .map_err(|(_, why)| why)?;
    Ok((request, end, body))
}

/// The request forwarded upstream: origin-form, the client's headers but hop-by-hop and
/// proxy ones, `connection: close`, and the run's secrets bound to `host_text` in place of
/// their placeholders (logged as a decision naming the variables, never the values).
pub(crate) fn build_request(
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
pub(crate) async fn forward_request<C, U>(
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
    // The upstream's write side stays open until the response is in (some servers treat
    // a half-close as an abort); nothing more from the client is forwarded.
    let (mut up_read, mut up_write) = tokio::io::split(upstream);
    let up = send_request(&mut client_read, &mut up_write, run, &request, &early, body);
    let down = copy(&mut up_read, &mut client_write, run);
    if let Err(Stop::Refused(why)) = tokio::try_join!(up, down) {
        on_stop(why);
    }
}

/// Writes `request` upstream, then exactly `body` bytes of the client's body: first from
/// `early` (bytes already read), then from `client`. Nothing after the body is read or
/// sent. Every byte counts against the run's byte budget.
pub(crate) async fn send_request<R, W>(
    client: &mut R,
    upstream: &mut W,
    run: &RunState,
    request: &str,
    early: &[u8],
    body: u64,
) -> Result<(), Stop>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let budget = |limit| Stop::Refused(Refusal::Budget(limit));
    run.take_bytes(request.len() as u64).map_err(budget)?;
    upstream
        .write_all(request.as_bytes())
        .await
        .map_err(|_| Stop::Io)?;
    let early_body = early.len().min(usize::try_from(body).unwrap_or(usize::MAX));
    if early_body > 0 {
        run.take_bytes(early_body as u64).map_err(budget)?;
        upstream
            .write_all(&early[..early_body])
            .await
            .map_err(|_| Stop::Io)?;
    }
    let mut left = body - early_body as u64;
    let mut buf = vec![0u8; SPLICE_BUF];
    while left > 0 {
        let want = usize::try_from(left).unwrap_or(SPLICE_BUF).min(SPLICE_BUF);
        let n = client.read(&mut buf[..want]).await.map_err(|_| Stop::Io)?;
        if n == 0 {
            return Err(Stop::Io);
        }
        run.take_bytes(n as u64).map_err(budget)?;
        upstream.write_all(&buf[..n]).await.map_err(|_| Stop::Io)?;
        left -= n as u64;
    }
    upstream.flush().await.map_err(|_| Stop::Io)
}

/// Serves one client connection, admitted by `ticket`: SOCKS5 if its first byte is 5,
/// HTTP otherwise. The client has `auth_timeout` from now to present its credential.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    runs: Weak<Runs>,
    mut ticket: Ticket,
    auth_timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + auth_timeout;
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, client.read_exact(&mut first)).await {
        Ok(Ok(_)) => {}
        _ => return,
    }
    if first[0] == SOCKS_VERSION {
        serve_socks(client, runs, &mut ticket, deadline).await;
    } else {
        serve_http(client, runs, first[0], &mut ticket, deadline).await;
    }
}

/// Serves an HTTP `CONNECT` or plain-HTTP request whose first byte was already read; its
/// head must be in by `deadline`.
async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    runs: Weak<Runs>,
    first: u8,
    ticket: &mut Ticket,
    deadline: tokio::time::Instant,
) {
    let read = tokio::time::timeout_at(deadline, read_head(&mut client, vec![first])).await;
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
    if let Err(fail) = ticket.admit(&run, &head.target, 0) {
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
    splice(client, upstream, early, &run, host_text, port, addr).await;
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
    fn only_visible_ascii_origin_form_targets_are_sent_on() {
        assert!(is_origin_form("/a/b?c=d&e=%20"));
        for target in [
            "http://evil.example/",
            "*",
            "/a\nHost:evil.example",
            "/a\rb",
            "/a\u{0}",
            "/caf\u{e9}",
            "",
        ] {
            assert!(!is_origin_form(target), "{target:?}");
        }
    }

    #[test]
    fn basic_credential_takes_the_user_only() {
        assert_eq!(basic_user("Basic YWJjOg=="), Some("abc".into()));
        assert_eq!(basic_user("basic YWJjOnh5eg=="), Some("abc".into()));
        assert_eq!(basic_user("Bearer abc"), None);
        assert_eq!(basic_user("Basic !!!"), None);
    }
}
