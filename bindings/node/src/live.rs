//! Live sandboxes for Node (`strata::live`): every request runs on libuv's thread pool and
//! settles a Promise with JSON text, a Buffer or a `NativeError`. `index.js` wraps it as
//! the `LiveSandbox` class (Promises, an async iterator of output, AbortSignal).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Either4, Unknown};
use napi::{Env, Task};
use napi_derive::napi;
use serde::Deserialize;
use strata::live::{
    ExecRequest, LiveSandbox, PauseMethod, PublishRequest, SnapshotStore, StartOptions, Stream,
    TtySize,
};
use strata::{Caps, Error};

use crate::convert::{self, NativeError, NodeCaps};
use crate::NativeSandbox;

/// A live sandbox handle (see `LiveSandbox` in index.d.ts).
#[napi]
pub struct NativeLive {
    live: Arc<Mutex<Option<Arc<LiveSandbox>>>>,
}

/// Options of `sandbox.start` (JSON from index.js).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartArgs {
    ttl: Option<f64>,
    idle_ttl: Option<f64>,
    idle_pause: Option<f64>,
    name: Option<String>,
    #[serde(default)]
    publish: Vec<u16>,
    supervisor: Option<String>,
    state_dir: Option<String>,
    /// The snapshot store (`startFrom`).
    snapshot_dir: Option<String>,
}

impl StartArgs {
    fn options(self) -> strata::Result<(StartOptions, Option<String>)> {
        let options = StartOptions {
            ttl: seconds(self.ttl, "ttl")?,
            idle_ttl: seconds(self.idle_ttl, "idleTtl")?,
            idle_pause: seconds(self.idle_pause, "idlePause")?,
            name: self.name,
            supervisor: self.supervisor.map(PathBuf::from),
            state_dir: self.state_dir.map(PathBuf::from),
            publish: self
                .publish
                .into_iter()
                .map(PublishRequest::loopback)
                .collect(),
            ..StartOptions::default()
        };
        Ok((options, self.snapshot_dir))
    }
}

/// The snapshot store in `dir`, else the user's default one.
fn store(dir: Option<&str>) -> strata::Result<SnapshotStore> {
    match dir {
        Some(dir) => SnapshotStore::open(std::path::Path::new(dir)),
        None => SnapshotStore::open_default(),
    }
}

/// One exec's arguments (JSON from index.js).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ExecArgs {
    argv: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    workdir: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    stdin: bool,
    tty: Option<TtySize>,
}

impl From<ExecArgs> for ExecRequest {
    fn from(args: ExecArgs) -> ExecRequest {
        ExecRequest {
            argv: args.argv,
            env: args.env,
            workdir: args.workdir,
            timeout_ms: args.timeout_ms,
            stdin: args.stdin,
            tty: args.tty,
            ..ExecRequest::default()
        }
    }
}

fn seconds(value: Option<f64>, what: &str) -> strata::Result<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Error::invalid(format!(
            "{what} must be a positive number of seconds, got {s}"
        ))),
    }
}

fn args<T: for<'de> Deserialize<'de>>(json: &str, what: &str) -> strata::Result<T> {
    serde_json::from_str(json).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

fn to_json<T: serde::Serialize>(value: &T) -> strata::Result<Done> {
    serde_json::to_string(value)
        .map(Done::Json)
        .map_err(|e| Error::invalid(format!("not representable as JSON: {e}")))
}

/// What a request gives back: JSON text, or bytes.
pub enum Done {
    /// A JSON document (`null` for nothing).
    Json(String),
    /// File contents.
    Bytes(Vec<u8>),
    /// A started sandbox.
    Started(Box<LiveSandbox>),
    /// Sandboxes started by a fork.
    Forked(Vec<LiveSandbox>),
}

/// One request of a live sandbox (or its start) on libuv's thread pool.
pub struct LiveTask {
    work: Option<Box<dyn FnOnce() -> strata::Result<Done> + Send>>,
}

impl Task for LiveTask {
    type Output = strata::Result<Done>;
    type JsValue = Either4<String, Buffer, Either<NativeLive, NativeError>, Vec<NativeLive>>;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(match self.work.take() {
            Some(work) => work(),
            None => Err(Error::invalid("this request already ran")),
        })
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
        Ok(match output {
            Ok(Done::Json(text)) => Either4::A(text),
            Ok(Done::Bytes(data)) => Either4::B(Buffer::from(data)),
            Ok(Done::Started(live)) => Either4::C(Either::A(NativeLive::owning(*live))),
            Ok(Done::Forked(children)) => {
                Either4::D(children.into_iter().map(NativeLive::owning).collect())
            }
            Err(e) => Either4::C(Either::B((&e).into())),
        })
    }
}

fn task(work: impl FnOnce() -> strata::Result<Done> + Send + 'static) -> AsyncTask<LiveTask> {
    AsyncTask::new(LiveTask {
        work: Some(Box::new(work)),
    })
}

#[napi]
impl NativeSandbox {
    /// Starts a live sandbox with `caps` (default: the profile's, else `{}`) and `options`
    /// (JSON: ttl, idleTtl, name, publish, supervisor, stateDir): resolves to a
    /// `NativeLive` or a `NativeError`.
    #[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError>")]
    pub fn start_live(&self, env: Env, caps: Unknown<'_>, options: String) -> AsyncTask<LiveTask> {
        let caps: strata::Result<Caps> = match (
            env.from_js_value::<Option<NodeCaps>, _>(caps),
            &self.profile,
        ) {
            (Ok(None), Some(profile)) => Ok(profile.caps.clone()),
            (Ok(caps), _) => Ok(caps.unwrap_or_default().into()),
            (Err(e), _) => Err(convert::invalid_argument("caps", &e)),
        };
        let sandbox = self.inner.clone();
        task(move || {
            let caps = caps?;
            let (options, _) = args::<StartArgs>(&options, "start option")?.options()?;
            sandbox
                .start(&caps, options)
                .map(|live| Done::Started(Box::new(live)))
        })
    }

    /// Starts a live sandbox from the snapshot `snapshot` with `options` (JSON: those of
    /// `startLive` and snapshotDir): resolves to a `NativeLive` or a `NativeError`.
    #[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError>")]
    pub fn start_live_from(&self, snapshot: String, options: String) -> AsyncTask<LiveTask> {
        let sandbox = self.inner.clone();
        task(move || {
            let (options, dir) = args::<StartArgs>(&options, "start option")?.options()?;
            let store = store(dir.as_deref())?;
            sandbox
                .start_from(&store, &snapshot, options)
                .map(|live| Done::Started(Box::new(live)))
        })
    }
}

/// The snapshots in the store `dir` (default: the user's) that verify: resolves to JSON
/// text or a `NativeError`.
#[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError>")]
pub fn list_snapshots(dir: Option<String>) -> AsyncTask<LiveTask> {
    task(move || to_json(&store(dir.as_deref())?.list()?))
}

/// Removes the snapshot `name` from the store `dir` (default: the user's).
#[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError>")]
pub fn remove_snapshot(name: String, dir: Option<String>) -> AsyncTask<LiveTask> {
    task(move || {
        store(dir.as_deref())?.remove(&name)?;
        to_json(&())
    })
}

/// Reaches the live sandbox `id` (or name) of this user: resolves to a `NativeLive` (not
/// owned) or a `NativeError`.
#[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError>")]
pub fn attach_live(id: String) -> AsyncTask<LiveTask> {
    task(move || LiveSandbox::attach(&id).map(|live| Done::Started(Box::new(live))))
}

impl NativeLive {
    fn owning(live: LiveSandbox) -> NativeLive {
        NativeLive {
            live: Arc::new(Mutex::new(Some(Arc::new(live)))),
        }
    }
}

#[napi]
impl NativeLive {
    /// The sandbox, shared with requests in flight.
    fn shared(&self) -> strata::Result<Arc<LiveSandbox>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::invalid("the live sandbox was stopped"))
    }

    /// The sandbox's id (empty once stopped).
    #[napi(getter)]
    pub fn id(&self) -> String {
        self.shared()
            .map(|live| live.id().to_string())
            .unwrap_or_default()
    }

    /// Whether `stop` was called on this handle.
    #[napi(getter)]
    pub fn stopped(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// One request: `op` names it, `json` holds its arguments, `data` the bytes of
    /// `exec` stdin, `writeStdin` and `writeFile`. Resolves to JSON text, a Buffer
    /// (`readFile`) or a `NativeError`.
    #[napi(ts_return_type = "Promise<string | Buffer | NativeLive | NativeError | NativeLive[]>")]
    pub fn call(&self, op: String, json: String, data: Option<Buffer>) -> AsyncTask<LiveTask> {
        let data = data.map(|d| d.to_vec());
        let state = Arc::clone(&self.live);
        let live = self.shared();
        task(move || {
            if op == "stop" {
                let taken = state.lock().unwrap_or_else(|e| e.into_inner()).take();
                return match taken {
                    Some(live) => live.stop_shared().and_then(|()| to_json(&())),
                    None => to_json(&()),
                };
            }
            let live = live?;
            request(&live, &op, &json, data)
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pid {
    pid: i32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Path1 {
    path: String,
    #[serde(default)]
    parents: bool,
}

fn request(
    live: &LiveSandbox,
    op: &str,
    json: &str,
    data: Option<Vec<u8>>,
) -> strata::Result<Done> {
    let what = format!("{op} arguments");
    match op {
        "info" => to_json(&live.refresh()?),
        "snapshot" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            struct Snap {
                name: Option<String>,
                snapshot_dir: Option<String>,
            }
            let a: Snap = args(json, &what)?;
            to_json(&live.snapshot(&store(a.snapshot_dir.as_deref())?, a.name.as_deref())?)
        }
        "fork" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            struct Fork {
                count: usize,
                ttl: Option<f64>,
                idle_ttl: Option<f64>,
                snapshot_dir: Option<String>,
            }
            let a: Fork = args(json, &what)?;
            let options = StartOptions {
                ttl: seconds(a.ttl, "ttl")?,
                idle_ttl: seconds(a.idle_ttl, "idleTtl")?,
                ..StartOptions::default()
            };
            let forked = live.fork(&store(a.snapshot_dir.as_deref())?, a.count, &options)?;
            Ok(Done::Forked(forked.children))
        }
        "exec" => {
            let request: ExecRequest = args::<ExecArgs>(json, &what)?.into();
            let stdin = data.map(|bytes| {
                Box::new(std::io::Cursor::new(bytes)) as Box<dyn std::io::Read + Send>
            });
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let exit = live.exec(request, stdin, |stream, bytes| match stream {
                Stream::Stdout => out.extend_from_slice(bytes),
                Stream::Stderr => err.extend_from_slice(bytes),
            })?;
            to_json(&serde_json::json!({
                "pid": exit.pid,
                "exitCode": exit.exit_code,
                "signal": exit.signal,
                "timedOut": exit.timed_out,
                "stdout": strata::live::encode_bytes(&out),
                "stderr": strata::live::encode_bytes(&err),
            }))
        }
        "spawn" => to_json(&live.spawn(args::<ExecArgs>(json, &what)?.into())?),
        "ps" => to_json(&live.ps()?),
        "since" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            struct Since {
                pid: i32,
                offset: u64,
                wait_ms: u64,
            }
            let a: Since = args(json, &what)?;
            let since = live.logs_since(a.pid, a.offset, Duration::from_millis(a.wait_ms))?;
            to_json(&serde_json::json!({
                "chunks": since.chunks.iter().map(|(stream, bytes)| serde_json::json!({
                    "stream": stream,
                    "data": strata::live::encode_bytes(bytes),
                })).collect::<Vec<_>>(),
                "missed": since.missed,
                "next": since.next,
                "exit": since.exit,
            }))
        }
        "wait" => to_json(&live.wait(args::<Pid>(json, &what)?.pid)?),
        "kill" => {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Kill {
                pid: i32,
                signal: i32,
            }
            let a: Kill = args(json, &what)?;
            live.kill(a.pid, a.signal)?;
            to_json(&())
        }
        "writeStdin" => {
            live.write_stdin(args::<Pid>(json, &what)?.pid, &data.unwrap_or_default())?;
            to_json(&())
        }
        "closeStdin" => {
            live.close_stdin(args::<Pid>(json, &what)?.pid)?;
            to_json(&())
        }
        "resize" => {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Resize {
                pid: i32,
                rows: u16,
                cols: u16,
            }
            let a: Resize = args(json, &what)?;
            live.resize(
                a.pid,
                TtySize {
                    rows: a.rows,
                    cols: a.cols,
                },
            )?;
            to_json(&())
        }
        "pause" => to_json(&match live.pause()? {
            PauseMethod::Freezer => "freezer",
            PauseMethod::Signals => "signals",
            PauseMethod::Vm => "vm",
        }),
        "resume" => {
            live.resume()?;
            to_json(&())
        }
        "publish" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase", deny_unknown_fields)]
            struct Publish {
                guest_port: u16,
                host_port: Option<u16>,
                host_ip: Option<String>,
            }
            let a: Publish = args(json, &what)?;
            let host_ip = a
                .host_ip
                .map(|ip| {
                    ip.parse()
                        .map_err(|_| Error::invalid(format!("{ip:?} is not an IP address")))
                })
                .transpose()?;
            to_json(&live.publish(&PublishRequest {
                guest_port: a.guest_port,
                host_ip,
                host_port: a.host_port,
            })?)
        }
        "readFile" => Ok(Done::Bytes(
            live.read_file(&args::<Path1>(json, &what)?.path)?,
        )),
        "writeFile" => {
            live.write_file(&args::<Path1>(json, &what)?.path, &data.unwrap_or_default())?;
            to_json(&())
        }
        "listDir" => to_json(&live.list_dir(&args::<Path1>(json, &what)?.path)?),
        "stat" => to_json(&live.stat(&args::<Path1>(json, &what)?.path)?),
        "mkdir" => {
            let a: Path1 = args(json, &what)?;
            live.mkdir(&a.path, a.parents)?;
            to_json(&())
        }
        "remove" => {
            live.remove(&args::<Path1>(json, &what)?.path)?;
            to_json(&())
        }
        "rename" | "upload" | "download" => {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Two {
                from: String,
                to: String,
            }
            let a: Two = args(json, &what)?;
            match op {
                "rename" => {
                    live.rename(&a.from, &a.to)?;
                    to_json(&())
                }
                "upload" => to_json(&live.upload(std::path::Path::new(&a.from), &a.to)?),
                _ => to_json(&live.download(&a.from, std::path::Path::new(&a.to))?),
            }
        }
        other => Err(Error::invalid(format!(
            "{other:?} is not a live sandbox request"
        ))),
    }
}
