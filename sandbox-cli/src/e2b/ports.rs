//! `get_host(port)`: the SDKs' address of a port inside a sandbox is `PORT-ID.DOMAIN`, and
//! a request to this server with that `Host` is forwarded to the port (HTTP/1, WebSocket and
//! other upgrades included).
//!
//! The port is published on first use by the sandbox's live supervisor, on host loopback
//! only (`strata::live::LiveSandbox::publish`: init opens the connection inside the
//! sandbox's own network namespace, so nothing else of the sandbox is reachable). As on
//! E2B, a sandbox's ports answer whoever reaches this server unless it was made with
//! `network.allowPublicTraffic: false`; then each request needs its
//! `e2b-traffic-access-token`. A paused sandbox's ports answer 502 until it is resumed.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;

use strata::live::PublishRequest;

use super::http::{self, Body};
use super::registry::{self, Entry};
use super::Server;

/// The port and sandbox id a `Host` names: `PORT-ID.` and a domain (`8000-iab12.localhost:49999`).
pub fn target(host: &str) -> Option<(u16, &str)> {
    let (label, rest) = host.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
    let well_formed = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then_some((port, id))
}

/// E2B's answer for a port that cannot be reached: 502 with what went wrong.
fn unreachable(status: StatusCode, id: &str, port: u16, message: String) -> Response<Body> {
    http::json(
        status,
        &json!({ "sandboxId": id, "port": port, "message": message, "code": status.as_u16() }),
    )
}

/// Forwards `request` to port `port` of sandbox `id`.
pub async fn forward(
    server: Arc<Server>,
    mut request: Request<Incoming>,
    port: u16,
    id: &str,
) -> Response<Body> {
    let Some(entry) = server.registry.get_any(id) else {
        return unreachable(
            StatusCode::BAD_GATEWAY,
            id,
            port,
            format!("sandbox {id} not found (killed, timed out, or never made)"),
        );
    };
    if let Some(token) = &entry.traffic_token {
        let sent = http::header(request.headers(), "e2b-traffic-access-token").unwrap_or("");
        if !registry::same_secret(sent, token) {
            return unreachable(
                StatusCode::FORBIDDEN,
                id,
                port,
                "this sandbox's ports need its traffic access token \
                 (e2b-traffic-access-token: sandbox.traffic_access_token)"
                    .into(),
            );
        }
    }
    if entry.paused.load(Ordering::SeqCst) {
        return unreachable(
            StatusCode::BAD_GATEWAY,
            id,
            port,
            format!("sandbox {id} is paused: resume or connect to it first"),
        );
    }
    let host_port = match published(&entry, port).await {
        Ok(host_port) => host_port,
        Err(message) => return unreachable(StatusCode::BAD_GATEWAY, id, port, message),
    };
    let closed = |e: &dyn std::fmt::Display| {
        unreachable(
            StatusCode::BAD_GATEWAY,
            id,
            port,
            format!("nothing answers on port {port} in sandbox {id} (is a server listening?): {e}"),
        )
    };
    let stream = match tokio::net::TcpStream::connect(("127.0.0.1", host_port)).await {
        Ok(stream) => stream,
        Err(e) => return closed(&e),
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return closed(&e),
        };
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let upgrading = request
        .headers()
        .contains_key(hyper::header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut request));
    let mut response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => return closed(&e),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = upgrading {
            let sandbox_side = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                if let (Ok(client), Ok(sandbox)) = tokio::join!(client_side, sandbox_side) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(client),
                        &mut TokioIo::new(sandbox),
                    )
                    .await;
                }
            });
        }
    }
    response.map(|body| BoxBody::new(EndsOnError { body }))
}

/// The host loopback port `port` of `entry` is published on, publishing it the first time.
async fn published(entry: &Arc<Entry>, port: u16) -> Result<u16, String> {
    if let Some(host_port) = registry::lock(&entry.ports).get(&port) {
        return Ok(*host_port);
    }
    let publishing = entry.clone();
    let made = tokio::task::spawn_blocking(move || {
        let mut ports = registry::lock(&publishing.ports);
        if let Some(host_port) = ports.get(&port) {
            return Ok(*host_port);
        }
        let published = publishing
            .live
            .publish(&PublishRequest::loopback(port))
            .map_err(|e| format!("publish port {port}: {e}"))?;
        ports.insert(port, published.host_port);
        Ok(published.host_port)
    })
    .await;
    made.map_err(|e| format!("a worker: {e}"))?
}

/// A forwarded response body that ends where the sandbox's side fails (the client sees a
/// short body and a closed connection, as from the server itself).
struct EndsOnError {
    body: Incoming,
}

impl hyper::body::Body for EndsOnError {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(_)) | None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn a_host_names_a_port_and_a_sandbox() {
        assert_eq!(
            target("8000-i0123abcd.localhost:49999"),
            Some((8000, "i0123abcd"))
        );
        assert_eq!(target("3000-ixyz.e2b.example"), Some((3000, "ixyz")));
    }

    #[test]
    fn other_hosts_are_the_server_itself() {
        for host in [
            "localhost:49999",
            "127.0.0.1:49999",
            "0-iabc.localhost",
            "70000-iabc.localhost",
            "8000-.localhost",
            "8000-i/../x.localhost",
            "8000-iabc",
            "api.localhost",
        ] {
            assert_eq!(target(host), None, "{host}");
        }
    }
}
