//! envd's process service (`process.Process`, `../shared/e2b/envd/process/process.proto`)
//! over Connect's JSON codec: Start, Connect, List, SendInput, StreamInput, SendSignal,
//! CloseStdin and Update (a terminal's size), on the live sandbox's processes.
//!
//! A started process outlives its stream: a client that goes away (a background command's
//! `disconnect`) leaves it running, and Connect follows it again. Its output is the live
//! sandbox's per-process ring (1 MiB kept), streamed as it arrives; a stream with nothing
//! to say sends a keepalive every `Keepalive-Ping-Interval` seconds (default 50). The
//! stream's `Connect-Timeout-Ms` is the process's deadline: the supervisor kills its group
//! then, and the stream ends with `deadline_exceeded`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use strata::live::{ExecRequest, ExitInfo, ProcessState, Stream, TtySize};

use super::connect::{self, Code, Envelopes, RpcError};
use super::http::{self, Body};
use super::registry::{lock, Entry, ProcessRecord, HOME};
use super::{blocking, Server, MAX_BODY};

/// The longest one output poll waits (the live sandbox's own cap).
const POLL: Duration = Duration::from_secs(30);

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct Size {
    cols: u32,
    rows: u32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PtyConfig {
    size: Option<Size>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartRequest {
    process: Option<ProcessConfig>,
    pty: Option<PtyConfig>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selected {
    process: Option<Selector>,
    input: Option<Input>,
    pty: Option<PtyConfig>,
    signal: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamStart {
    process: Option<Selector>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamData {
    input: Option<Input>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StreamInputMessage {
    start: Option<StreamStart>,
    data: Option<StreamData>,
    keepalive: Option<Value>,
}

/// Serves one call of the process service.
pub async fn handle(
    server: Arc<Server>,
    entry: Arc<Entry>,
    request: Request<Incoming>,
) -> Response<Body> {
    let method = request
        .uri()
        .path()
        .trim_start_matches("/process.Process/")
        .to_string();
    let headers = request.headers().clone();
    if method == "StreamInput" {
        return stream_input(entry, request.into_body()).await;
    }
    let body = match http::read_body(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(e) => return e.response(),
    };
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let result = match method.as_str() {
        "Start" => start(&server, &entry, &headers, &body).await,
        "Connect" => connect_to(&entry, &headers, &body).await,
        "List" => list(&entry).await,
        "SendInput" => send_input(&entry, &body).await,
        "SendSignal" => send_signal(&server, &entry, &body).await,
        "CloseStdin" => close_stdin(&entry, &body).await,
        "Update" => update(&entry, &body).await,
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("process.Process/{other}: no such method"),
        )),
    };
    match result {
        Ok(response) => response,
        Err(error) if streaming => super::stream_failure(&error),
        Err(error) => super::unary_response(Err(error)),
    }
}

fn unary_ok(value: &Value) -> Result<Response<Body>, RpcError> {
    Ok(super::unary_response(Ok(value.clone())))
}

fn size_of(pty: Option<&PtyConfig>) -> Result<Option<TtySize>, RpcError> {
    let Some(size) = pty.and_then(|p| p.size) else {
        return Ok(pty.map(|_| TtySize { rows: 24, cols: 80 }));
    };
    let (Ok(rows), Ok(cols)) = (u16::try_from(size.rows), u16::try_from(size.cols)) else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!(
                "pty size {}x{}: rows and cols from 1 to 4096",
                size.cols, size.rows
            ),
        ));
    };
    TtySize { rows, cols }
        .check()
        .map(Some)
        .map_err(RpcError::from)
}

async fn start(
    server: &Arc<Server>,
    entry: &Arc<Entry>,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<Response<Body>, RpcError> {
    let request: StartRequest = connect::stream_request(body)?;
    let config = request
        .process
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process: required"))?;
    if config.cmd.is_empty() {
        return Err(RpcError::new(Code::InvalidArgument, "process.cmd: empty"));
    }
    let tty = size_of(request.pty.as_ref())?;
    let deadline = connect::timeout(headers)?;
    let keepalive = connect::keepalive(headers);
    let permit = entry.streams.clone().try_acquire_owned().map_err(|_| {
        RpcError::new(
            Code::ResourceExhausted,
            format!(
                "sandbox {}: {} streams open (close some: disconnect or kill background commands)",
                entry.id,
                super::registry::MAX_STREAMS
            ),
        )
    })?;
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let exec = ExecRequest {
        argv: argv.clone(),
        env: config.envs.clone(),
        workdir: Some(config.cwd.clone().unwrap_or_else(|| HOME.into())),
        timeout_ms: deadline.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        stdin: request.stdin.unwrap_or(false) || tty.is_some(),
        detach: true,
        tty,
    };
    server
        .audit(
            "e2b.process.start",
            "granted",
            format!("sandbox {} argv {argv:?}", entry.id),
        )
        .map_err(RpcError::from)?;
    let spawning = entry.clone();
    let pid = blocking(move || spawning.live.spawn(exec).map_err(RpcError::from)).await?;
    lock(&entry.processes).insert(
        pid,
        ProcessRecord {
            cmd: config.cmd,
            args: config.args,
            envs: config.envs,
            cwd: config.cwd,
            tag: request.tag,
            tty: tty.is_some(),
        },
    );
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let following = entry.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        follow(&following, pid, 0, tty.is_some(), keepalive, &tx);
    });
    Ok(super::stream_response(rx))
}

fn event(value: Value) -> Bytes {
    connect::envelope(&json!({ "event": value }))
}

/// Streams process `pid`'s events from output offset `offset`: start, its output, keepalives,
/// its end. Returns when it ended or the client went away (the process keeps running).
fn follow(
    entry: &Entry,
    pid: i32,
    mut offset: u64,
    tty: bool,
    keepalive: Duration,
    tx: &mpsc::Sender<Bytes>,
) {
    let b64 = base64::engine::general_purpose::STANDARD;
    if tx
        .blocking_send(event(json!({ "start": { "pid": pid } })))
        .is_err()
    {
        return;
    }
    let mut last_sent = Instant::now();
    loop {
        let since = match entry.live.logs_since(pid, offset, keepalive.min(POLL)) {
            Ok(since) => since,
            Err(e) => {
                let _ = tx.blocking_send(connect::end_of_stream(Some(&RpcError::from(e))));
                return;
            }
        };
        offset = since.next;
        for (stream, bytes) in &since.chunks {
            let name = match (tty, stream) {
                (true, _) => "pty",
                (false, Stream::Stdout) => "stdout",
                (false, Stream::Stderr) => "stderr",
            };
            let data = json!({ "data": { name: b64.encode(bytes) } });
            if tx.blocking_send(event(data)).is_err() {
                return;
            }
            last_sent = Instant::now();
        }
        if let Some(exit) = since.exit {
            lock(&entry.processes).remove(&pid);
            let _ = tx.blocking_send(event(json!({ "end": end_event(&exit) })));
            let error = exit.timed_out.then(|| {
                RpcError::new(
                    Code::DeadlineExceeded,
                    format!("process {pid}: the call's deadline (Connect-Timeout-Ms) passed; it was killed"),
                )
            });
            let _ = tx.blocking_send(connect::end_of_stream(error.as_ref()));
            return;
        }
        if last_sent.elapsed() >= keepalive {
            if tx.blocking_send(event(json!({ "keepalive": {} }))).is_err() {
                return;
            }
            last_sent = Instant::now();
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// envd's `EndEvent`: the exit code and Go's `ProcessState.String()` status.
fn end_event(exit: &ExitInfo) -> Value {
    match (exit.exit_code, exit.signal) {
        (Some(code), _) if !exit.timed_out => json!({
            "exitCode": code,
            "exited": true,
            "status": format!("exit status {code}"),
        }),
        (_, signal) => {
            let name = match signal {
                Some(9) | None => "killed".to_string(),
                Some(15) => "terminated".to_string(),
                Some(2) => "interrupt".to_string(),
                Some(n) => format!("signal {n}"),
            };
            json!({
                "exitCode": -1,
                "exited": false,
                "status": format!("signal: {name}"),
            })
        }
    }
}

/// The pid a selector names, if that process is running now (decided from the sandbox's
/// process table, never from an error's text).
async fn running_pid(entry: &Arc<Entry>, selector: Option<&Selector>) -> Result<i32, RpcError> {
    let selector = selector.ok_or_else(|| {
        RpcError::new(Code::InvalidArgument, "process: a pid or a tag is required")
    })?;
    let pid = match (&selector.pid, &selector.tag) {
        (Some(pid), _) => i32::try_from(*pid).map_err(|_| {
            RpcError::new(Code::InvalidArgument, format!("pid {pid}: out of range"))
        })?,
        (None, Some(tag)) => lock(&entry.processes)
            .iter()
            .find(|(_, record)| record.tag.as_deref() == Some(tag.as_str()))
            .map(|(pid, _)| *pid)
            .ok_or_else(|| {
                RpcError::new(
                    Code::NotFound,
                    format!("process with tag {tag:?} not found"),
                )
            })?,
        (None, None) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "process: a pid or a tag is required",
            ))
        }
    };
    let asking = entry.clone();
    let table = blocking(move || asking.live.ps().map_err(RpcError::from)).await?;
    if table
        .iter()
        .any(|p| p.pid == pid && p.state == ProcessState::Running)
    {
        Ok(pid)
    } else {
        Err(RpcError::new(
            Code::NotFound,
            format!("process with pid {pid} not found (it exited, or never ran here)"),
        ))
    }
}

async fn connect_to(
    entry: &Arc<Entry>,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<Response<Body>, RpcError> {
    let request: Selected = connect::stream_request(body)?;
    let pid = running_pid(entry, request.process.as_ref()).await?;
    let keepalive = connect::keepalive(headers);
    let permit = entry
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| RpcError::new(Code::ResourceExhausted, "too many streams open"))?;
    // Output from now on, as envd's Connect streams it.
    let asking = entry.clone();
    let since = blocking(move || {
        asking
            .live
            .logs_since(pid, 0, Duration::ZERO)
            .map_err(RpcError::from)
    })
    .await?;
    let tty = lock(&entry.processes)
        .get(&pid)
        .is_some_and(|record| record.tty);
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let following = entry.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        follow(&following, pid, since.next, tty, keepalive, &tx);
    });
    Ok(super::stream_response(rx))
}

async fn list(entry: &Arc<Entry>) -> Result<Response<Body>, RpcError> {
    let asking = entry.clone();
    let table = blocking(move || asking.live.ps().map_err(RpcError::from)).await?;
    let records = lock(&entry.processes).clone();
    let processes: Vec<Value> = table
        .iter()
        .filter(|p| p.state == ProcessState::Running)
        .filter_map(|p| records.get(&p.pid).map(|record| (p.pid, record)))
        .map(|(pid, record)| {
            let mut info = json!({
                "pid": pid,
                "config": {
                    "cmd": record.cmd,
                    "args": record.args,
                    "envs": record.envs,
                },
            });
            if let Some(cwd) = &record.cwd {
                info["config"]["cwd"] = json!(cwd);
            }
            if let Some(tag) = &record.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    unary_ok(&json!({ "processes": processes }))
}

fn input_bytes(input: Option<&Input>) -> Result<Vec<u8>, RpcError> {
    let text = input
        .and_then(|i| i.stdin.as_ref().or(i.pty.as_ref()))
        .ok_or_else(|| {
            RpcError::new(Code::InvalidArgument, "input: stdin or pty bytes required")
        })?;
    decode_b64(text)
}

/// Protobuf JSON bytes: standard or URL-safe base64, padded or not.
fn decode_b64(text: &str) -> Result<Vec<u8>, RpcError> {
    let cleaned: String = text
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(cleaned)
        .map_err(|e| {
            RpcError::new(
                Code::InvalidArgument,
                format!("input bytes: not base64 ({e})"),
            )
        })
}

async fn send_input(entry: &Arc<Entry>, body: &[u8]) -> Result<Response<Body>, RpcError> {
    let request: Selected = connect::parse_unary(body)?;
    let data = input_bytes(request.input.as_ref())?;
    let pid = running_pid(entry, request.process.as_ref()).await?;
    let writing = entry.clone();
    blocking(move || writing.live.write_stdin(pid, &data).map_err(RpcError::from)).await?;
    unary_ok(&json!({}))
}

/// Reads the client stream of StreamInput: its start (the process), then input to write.
async fn stream_input(entry: Arc<Entry>, mut body: Incoming) -> Response<Body> {
    let mut envelopes = Envelopes::default();
    let mut pid: Option<i32> = None;
    let result: Result<(), RpcError> = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                RpcError::new(Code::Canceled, format!("the input stream broke: {e}"))
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            envelopes.push(&data)?;
            while let Some((flags, json)) = envelopes.next_message()? {
                if flags & 0x02 != 0 {
                    return Ok(());
                }
                let message: StreamInputMessage = connect::parse_unary(&json)?;
                if let Some(start) = message.start {
                    pid = Some(running_pid(&entry, start.process.as_ref()).await?);
                } else if let Some(data) = message.data {
                    let Some(pid) = pid else {
                        return Err(RpcError::new(
                            Code::FailedPrecondition,
                            "input before the stream's start message",
                        ));
                    };
                    let bytes = input_bytes(data.input.as_ref())?;
                    let writing = entry.clone();
                    blocking(move || {
                        writing
                            .live
                            .write_stdin(pid, &bytes)
                            .map_err(RpcError::from)
                    })
                    .await?;
                } else if message.keepalive.is_none() {
                    return Err(RpcError::new(
                        Code::InvalidArgument,
                        "an empty input message",
                    ));
                }
            }
        }
        Ok(())
    }
    .await;
    let body = match result {
        Ok(()) => {
            let mut out = connect::envelope(&json!({})).to_vec();
            out.extend_from_slice(&connect::end_of_stream(None));
            out
        }
        Err(error) => connect::end_of_stream(Some(&error)).to_vec(),
    };
    http::respond(StatusCode::OK, "application/connect+json", http::full(body))
}

/// A signal from the request: `SIGNAL_SIGKILL`/`SIGNAL_SIGTERM` or their numbers.
fn signal_of(value: Option<&Value>) -> Result<i32, RpcError> {
    match value {
        Some(Value::String(name)) if name == "SIGNAL_SIGKILL" => Ok(9),
        Some(Value::String(name)) if name == "SIGNAL_SIGTERM" => Ok(15),
        Some(Value::Number(n)) if n.as_i64() == Some(9) => Ok(9),
        Some(Value::Number(n)) if n.as_i64() == Some(15) => Ok(15),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!("signal {other:?}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
        )),
    }
}

async fn send_signal(
    server: &Arc<Server>,
    entry: &Arc<Entry>,
    body: &[u8],
) -> Result<Response<Body>, RpcError> {
    let request: Selected = connect::parse_unary(body)?;
    let signal = signal_of(request.signal.as_ref())?;
    let pid = running_pid(entry, request.process.as_ref()).await?;
    server
        .audit(
            "e2b.process.signal",
            "granted",
            format!("sandbox {} pid {pid} signal {signal}", entry.id),
        )
        .map_err(RpcError::from)?;
    let killing = entry.clone();
    blocking(move || killing.live.kill(pid, signal).map_err(RpcError::from)).await?;
    unary_ok(&json!({}))
}

async fn close_stdin(entry: &Arc<Entry>, body: &[u8]) -> Result<Response<Body>, RpcError> {
    let request: Selected = connect::parse_unary(body)?;
    let pid = running_pid(entry, request.process.as_ref()).await?;
    let closing = entry.clone();
    blocking(move || closing.live.close_stdin(pid).map_err(RpcError::from)).await?;
    unary_ok(&json!({}))
}

async fn update(entry: &Arc<Entry>, body: &[u8]) -> Result<Response<Body>, RpcError> {
    let request: Selected = connect::parse_unary(body)?;
    let pid = running_pid(entry, request.process.as_ref()).await?;
    let Some(size) = size_of(request.pty.as_ref())? else {
        return unary_ok(&json!({}));
    };
    let resizing = entry.clone();
    blocking(move || resizing.live.resize(pid, size).map_err(RpcError::from)).await?;
    unary_ok(&json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_bytes_take_every_protobuf_base64_form() {
        assert_eq!(decode_b64("aGk=").expect("padded"), b"hi");
        assert_eq!(decode_b64("aGk").expect("unpadded"), b"hi");
        assert_eq!(decode_b64("-_8").expect("url-safe"), vec![0xfb, 0xff]);
        assert!(decode_b64("not base64!").is_err());
    }

    #[test]
    fn end_events_read_as_go_process_states() {
        let exit = |code, signal, timed_out| ExitInfo {
            pid: 1,
            exit_code: code,
            signal,
            timed_out,
        };
        assert_eq!(
            end_event(&exit(Some(3), None, false))["status"],
            "exit status 3"
        );
        assert_eq!(
            end_event(&exit(None, Some(9), false))["status"],
            "signal: killed"
        );
        assert_eq!(end_event(&exit(None, Some(9), true))["exitCode"], -1);
    }
}
