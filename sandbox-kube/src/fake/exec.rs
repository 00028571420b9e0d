//! `pods/exec` over a websocket (`v5.channel.k8s.io`, else `v4.channel.k8s.io`), as the
//! kubelet serves it: binary messages whose first byte is the channel (0 stdin, 1 stdout,
//! 2 stderr, 3 the final status, 255 close a stream, v5 only).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::http::{error_response, param, query_pairs, Body};
use super::process::{self, Streams};
use super::store::ApiError;
use super::Shared;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;
const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

/// Answers an exec request: `404` when the pod does not run, `400` when it is not a
/// websocket upgrade with a supported protocol, else `101` and the session on its own task.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let pairs = query_pairs(request.uri().query().unwrap_or_default());
    let Some(dir) = shared.pods.running(ns, pod) else {
        let mut e = ApiError::new(404, "NotFound", format!("pods \"{pod}\" not found"));
        e.details = Some(json!({"name": pod, "kind": "pods"}));
        return error_response(&e);
    };
    let command: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let flag = |key: &str| param(&pairs, key).is_some_and(|v| v == "true" || v == "1");
    let streams = Streams {
        stdin: flag("stdin"),
        stdout: flag("stdout"),
        stderr: flag("stderr"),
    };
    if flag("tty") {
        return error_response(&ApiError::bad_request(
            "tty is not supported by the fake API server",
        ));
    }
    let headers = request.headers();
    let upgrade = headers
        .get(http::header::UPGRADE)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h.eq_ignore_ascii_case("websocket"));
    let key = headers
        .get(http::header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()));
    let offered: Vec<String> = headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|h| h.to_str().ok())
        .flat_map(|h| h.split(',').map(|p| p.trim().to_owned()))
        .collect();
    let protocol = [V5, V4]
        .into_iter()
        .find(|p| offered.iter().any(|o| o == p));
    let (Some(accept), true, Some(protocol)) = (key, upgrade, protocol) else {
        return error_response(&ApiError::bad_request(format!(
            "exec needs a websocket upgrade offering {V5} or {V4}"
        )));
    };
    let Some(alive) = shared.alive() else {
        return error_response(&ApiError::new(
            503,
            "ServiceUnavailable",
            "the fake API server is shutting down",
        ));
    };
    let commands = shared.commands.clone();
    let shutdown = shared.shutdown.clone();
    tokio::spawn(async move {
        let _alive = alive;
        let mut down = shutdown.clone();
        let upgraded = tokio::select! {
            upgraded = hyper::upgrade::on(request) => upgraded,
            _ = down.wait_for(|down| *down) => return,
        };
        let Ok(upgraded) = upgraded else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        session(
            ws,
            commands,
            command,
            dir,
            streams,
            protocol == V5,
            shutdown,
        )
        .await;
    });
    let mut response = Response::new(Empty::<Bytes>::new().boxed_unsync());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    h.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(protocol),
    );
    if let Ok(accept) = http::HeaderValue::from_str(&accept) {
        h.insert(http::header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Runs one exec: starts the process, pumps the streams, sends the final status. The
/// process group is killed and the process reaped however the session ends (the client
/// closing or dropping the connection, or the server shutting down).
async fn session(
    ws: Ws,
    commands: BTreeMap<String, PathBuf>,
    command: Vec<String>,
    dir: PathBuf,
    streams: Streams,
    v5: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let (mut tx, mut rx) = ws.split();
    let mut child = match process::spawn(&commands, &command, &dir, &streams) {
        Ok(child) => child,
        Err(why) => {
            let status = json!({"metadata": {}, "status": "Failure", "message": why, "reason": "InternalError", "code": 500});
            let _ = tx
                .send(channel(STATUS, status.to_string().as_bytes()))
                .await;
            let _ = tx.close().await;
            return;
        }
    };
    let pid = child.id();
    let exit = tokio::select! {
        exit = pump(&mut child, &mut tx, &mut rx, v5) => exit,
        _ = shutdown.wait_for(|down| *down) => None,
    };
    process::kill_group(pid);
    let reaped = child.wait().await;
    let Some(exit) = exit else {
        return;
    };
    let status = match exit.or(reaped) {
        Ok(s) if s.success() => json!({"metadata": {}, "status": "Success"}),
        Ok(s) => {
            let code = s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
            failure(&command, code)
        }
        Err(e) => {
            json!({"metadata": {}, "status": "Failure", "message": format!("cannot wait for the process: {e}"), "reason": "InternalError", "code": 500})
        }
    };
    // A client that stops reading must not hold up the server's shutdown.
    let finish = async {
        let _ = tx
            .send(channel(STATUS, status.to_string().as_bytes()))
            .await;
        let _ = tx.close().await;
    };
    tokio::select! {
        () = finish => {}
        _ = shutdown.wait_for(|down| *down) => {}
    }
}

type WsTx = futures_util::stream::SplitSink<Ws, Message>;
type WsRx = futures_util::stream::SplitStream<Ws>;

/// Moves data between the websocket and the process until the process's output ends and
/// it exits (`Some(exit)`), or the client goes away (`None`).
async fn pump(
    child: &mut Child,
    tx: &mut WsTx,
    rx: &mut WsRx,
    v5: bool,
) -> Option<std::io::Result<ExitStatus>> {
    // stdin: written by its own task so a child blocked on output never blocks our reads.
    let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<Bytes>();
    if let Some(mut stdin) = child.stdin.take() {
        tokio::spawn(async move {
            while let Some(data) = stdin_rx.recv().await {
                if stdin.write_all(&data).await.is_err() {
                    break;
                }
            }
            // Dropping `stdin` closes the child's end.
        });
    }
    let mut stdin_tx = Some(stdin_tx);
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (mut out_buf, mut err_buf) = (vec![0u8; 32 * 1024], vec![0u8; 32 * 1024]);
    loop {
        let output_done = stdout.is_none() && stderr.is_none();
        tokio::select! {
            n = read(&mut stdout, &mut out_buf), if stdout.is_some() => match n {
                Some(n) => tx.send(channel(STDOUT, &out_buf[..n])).await.ok()?,
                None => stdout = None,
            },
            n = read(&mut stderr, &mut err_buf), if stderr.is_some() => match n {
                Some(n) => tx.send(channel(STDERR, &err_buf[..n])).await.ok()?,
                None => stderr = None,
            },
            exit = child.wait(), if output_done => return Some(exit),
            message = rx.next() => match message {
                Some(Ok(Message::Binary(data))) => match data.first() {
                    Some(&STDIN) => {
                        if let Some(s) = &stdin_tx {
                            let _ = s.send(data.slice(1..));
                        }
                    }
                    // v5: the client closes a stream; only stdin is the client's to close.
                    Some(&CLOSE) if v5 && data.get(1) == Some(&STDIN) => stdin_tx = None,
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The kubelet's status for a non-zero exit.
fn failure(command: &[String], code: i32) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

fn channel(id: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(id);
    v.extend_from_slice(data);
    Message::binary(v)
}

/// One read; `None` at end of stream or on error.
async fn read<R: tokio::io::AsyncRead + Unpin>(
    stream: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    let s = stream.as_mut()?;
    match s.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}
