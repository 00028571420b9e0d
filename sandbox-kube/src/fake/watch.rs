//! Watches: newline-delimited JSON events on a chunked response, replayed from a
//! `resourceVersion` then live, ended after `timeoutSeconds`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::http::{param, Body, Filter};
use super::store::{ApiError, Event};
use super::Shared;
use crate::crd::Kind;

/// How long a watch stays open when the request gives no `timeoutSeconds`.
pub const DEFAULT_WATCH_SECONDS: u64 = 1800;

/// Answers a watch request: `200` with a stream of events; a `resourceVersion` older than
/// the kept history gets one `ERROR` event with a `410 Gone` status, as a real API server's
/// watch cache answers.
pub(crate) fn serve(
    shared: Arc<Shared>,
    kind: Kind,
    ns: &str,
    pairs: &[(String, String)],
    filter: Filter,
) -> Result<Response<Body>, ApiError> {
    let since = param(pairs, "resourceVersion").unwrap_or_default();
    let since: Option<u64> = match since {
        "" | "0" => None,
        v => Some(v.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion {v:?} is not a version of this server"
            ))
        })?),
    };
    let seconds = match param(pairs, "timeoutSeconds") {
        Some(t) => t
            .parse()
            .map_err(|_| ApiError::bad_request(format!("timeoutSeconds {t:?} is not a number")))?,
        None => DEFAULT_WATCH_SECONDS,
    };
    let bookmarks = param(pairs, "allowWatchBookmarks") == Some("true");
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let ns = ns.to_owned();
    let mut closed = shared.close_watches.subscribe();
    tokio::spawn(async move {
        let send = |value: Value| {
            let tx = tx.clone();
            async move {
                let mut line = value.to_string().into_bytes();
                line.push(b'\n');
                tx.send(Bytes::from(line)).await.is_ok()
            }
        };
        let matches = |e: &Event| e.kind == kind && e.namespace == ns && filter.matches(&e.object);
        let subscribed = match since {
            Some(rv) => shared.store.subscribe(rv),
            // "Any version": the current objects as ADDED, then what follows.
            None => {
                let rv = shared.store.version();
                let (items, _) = shared.store.list(kind, Some(&ns), |o| filter.matches(o));
                for item in items {
                    if !send(json!({"type": "ADDED", "object": item})).await {
                        return;
                    }
                }
                shared.store.subscribe(rv)
            }
        };
        let (replay, mut live) = match subscribed {
            Ok(s) => s,
            Err(oldest) => {
                let gone = ApiError::new(
                    410,
                    "Expired",
                    format!(
                        "too old resource version: {} ({oldest})",
                        since.unwrap_or_default()
                    ),
                );
                let _ = send(json!({"type": "ERROR", "object": gone.to_status()})).await;
                return;
            }
        };
        let mut last = since.unwrap_or_default();
        for event in replay {
            last = event.rv;
            if matches(&event) && !send(event_json(&event)).await {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(seconds));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                event = live.recv() => match event {
                    Ok(event) if event.rv <= last => {}
                    Ok(event) => {
                        last = event.rv;
                        if matches(&event) && !send(event_json(&event)).await {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let gone = ApiError::new(410, "Expired", "the watch fell behind: too old resource version");
                        let _ = send(json!({"type": "ERROR", "object": gone.to_status()})).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = &mut deadline => {
                    if bookmarks {
                        let version = shared.store.version().max(last);
                        let _ = send(json!({"type": "BOOKMARK", "object": {
                            "apiVersion": kind.api_version(),
                            "kind": kind.name(),
                            "metadata": {"resourceVersion": version.to_string()},
                        }})).await;
                    }
                    return;
                }
                // Ended abruptly, without a bookmark, as when an API server restarts.
                _ = closed.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(Frame::data(bytes)), rx))
    });
    let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn event_json(event: &Event) -> Value {
    json!({"type": event.type_.as_str(), "object": &*event.object})
}
