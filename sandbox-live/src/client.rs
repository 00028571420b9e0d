//! The client side: starting a live sandbox (spawning its supervisor, `strata-live`), and
//! driving one by id over its control socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use sandbox_core::{BackendKind, Caps, Error, Result, Strictness};

use crate::protocol::{
    decode, encode, ExecRequest, ExitInfo, ProcessInfo, PublishRequest, PublishedPort, Reply,
    Request, SandboxInfo, TtySize, WireError, PROTOCOL_VERSION,
};
use crate::ring::Stream;
use crate::state;
use sandbox_os::live::PauseMethod;

use crate::policy::LivePolicy;

/// The supervisor binary's name.
pub const SUPERVISOR_NAME: &str = "strata-live";

/// What the supervisor reads on its stdin to start a sandbox.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// [`PROTOCOL_VERSION`].
    pub version: u32,
    /// The caps, fixed for the sandbox's life.
    pub caps: Caps,
    /// Strict (refuse what cannot be enforced) or best-effort.
    pub strictness: Strictness,
    /// The backend: `process` (more to come).
    pub backend: BackendKind,
    /// A name to find it by besides its id.
    pub name: Option<String>,
    /// Absolute time to live, seconds.
    pub ttl_s: Option<u64>,
    /// Idle time to live, seconds.
    pub idle_ttl_s: Option<u64>,
    /// End with the starting process.
    pub owned: bool,
    /// The `strata-helper` to use; default: the library's search.
    pub helper: Option<PathBuf>,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Ports to publish from the start.
    #[serde(default)]
    pub publish: Vec<PublishRequest>,
    /// The tier, approver program and audit log every exec goes through.
    #[serde(default)]
    pub policy: LivePolicy,
    /// Where the sandbox comes from (a snapshot), for its receipt.
    #[serde(default)]
    pub origin: Option<String>,
    /// Pause the sandbox after this many idle seconds, until the next request.
    #[serde(default)]
    pub idle_pause_s: Option<u64>,
}

/// The supervisor's one-line answer to a [`StartRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StartReply {
    /// Started.
    Ok(Box<SandboxInfo>),
    /// Refused; nothing is left.
    Error(WireError),
}

/// How to start a live sandbox.
#[derive(Clone, Debug)]
pub struct StartOptions {
    /// Strict (default) or best-effort.
    pub strictness: Strictness,
    /// The backend. Default: process.
    pub backend: BackendKind,
    /// A name to find it by besides its id (unique among this user's live sandboxes).
    pub name: Option<String>,
    /// Absolute time to live. Default: none.
    pub ttl: Option<Duration>,
    /// Idle time to live (no client activity). Default: none.
    pub idle_ttl: Option<Duration>,
    /// Freeze the sandbox after this long without a client request or a connection
    /// through a published port (opt-in), until the next request that needs it running
    /// (an exec, a followed log, a connection to a published port; on the microVM backend a
    /// file operation too: the others serve files from the host, paused or not); its
    /// TTLs stand still while it is frozen. Default: none.
    pub idle_pause: Option<Duration>,
    /// End the sandbox when the [`LiveSandbox`] handle is dropped or this process dies.
    /// Default: true (the library's default; the CLI starts unowned sandboxes).
    pub owned: bool,
    /// The `strata-helper` to use. Default: the library's search.
    pub helper: Option<PathBuf>,
    /// The supervisor binary. Default: `$STRATA_LIVE`, else `strata-live` next to this
    /// executable.
    pub supervisor: Option<PathBuf>,
    /// The state directory. Default: [`state::state_dir`].
    pub state_dir: Option<PathBuf>,
    /// Ports to publish from the start (see [`LiveSandbox::publish`]). Default: none.
    pub publish: Vec<PublishRequest>,
    /// The policy every exec goes through: the tier its programs are checked against,
    /// the approver program asked about one beyond it, the audit log each is recorded in.
    /// The caps are not checked here: `strata::Sandbox::start` admits them against the
    /// tier first. Default: none.
    pub policy: LivePolicy,
    /// Where the sandbox comes from, stated in its receipt (set by
    /// [`LiveSandbox::start_from`] and [`LiveSandbox::fork`]). Default: none.
    pub origin: Option<String>,
}

impl Default for StartOptions {
    fn default() -> Self {
        StartOptions {
            strictness: Strictness::Strict,
            backend: BackendKind::Process,
            name: None,
            ttl: None,
            idle_ttl: None,
            idle_pause: None,
            owned: true,
            helper: None,
            supervisor: None,
            state_dir: None,
            publish: Vec::new(),
            policy: LivePolicy::default(),
            origin: None,
        }
    }
}

/// A handle on a live sandbox. An owned one ends when this handle is dropped (or its
/// process dies); an attached or unowned one lives on until stopped or its TTLs.
#[derive(Debug)]
pub struct LiveSandbox {
    info: SandboxInfo,
    socket: PathBuf,
    /// The supervisor's stdin, for an owned sandbox: closing it ends the sandbox.
    owner: Option<ChildStdin>,
    /// The supervisor, for an owned sandbox: reaped when this handle drops.
    child: Option<Child>,
}

impl Drop for LiveSandbox {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            drop(owner);
            if let Some(mut child) = self.child.take() {
                let _ = child.wait();
            }
        }
    }
}

/// Finds the supervisor binary.
///
/// # Errors
/// [`Error::BackendUnavailable`] naming where it was looked for.
pub fn find_supervisor(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    sandbox_core::binary::locate(
        SUPERVISOR_NAME,
        "STRATA_LIVE",
        "install it beside your program or set STRATA_LIVE",
    )
    .map_err(|why| {
        Error::unavailable(
            BackendKind::Process,
            format!("live sandboxes need {SUPERVISOR_NAME}: {why}"),
        )
    })
}

impl LiveSandbox {
    /// Starts a live sandbox with `caps` (fixed for its life). Returns once it is built;
    /// its receipt says what is enforced for every exec.
    ///
    /// # Errors
    /// As a run before anything runs (invalid caps, unenforceable guarantees, setup
    /// failures), typed; [`Error::InvalidRequest`] for a bad name or a name in use.
    pub fn start(caps: &Caps, options: &StartOptions) -> Result<LiveSandbox> {
        caps.validate()?;
        match options.backend {
            BackendKind::Process | BackendKind::Container | BackendKind::Microvm => {}
            BackendKind::Wasm => {
                return Err(Error::unavailable(
                    BackendKind::Wasm,
                    "a WebAssembly module has no processes to keep: live sandboxes run on the process, container and microvm backends",
                ))
            }
            other => {
                return Err(Error::unavailable(
                    other,
                    format!("live sandboxes run on the process, container and microvm backends, not yet on {other}"),
                ))
            }
        }
        if let Some(name) = &options.name {
            if !state::valid_name(name) || name.starts_with("sb-") {
                return Err(Error::invalid(format!(
                    "--name {name:?}: 1-64 of A-Z a-z 0-9 _ . -, not starting with a dot or sb-"
                )));
            }
        }
        for (what, ttl) in [
            ("ttl", options.ttl),
            ("idle ttl", options.idle_ttl),
            ("idle pause", options.idle_pause),
        ] {
            if ttl.is_some_and(|t| t.as_secs() == 0) {
                return Err(Error::invalid(format!(
                    "the {what} must be at least 1 second"
                )));
            }
        }
        let state_dir = match &options.state_dir {
            Some(dir) => {
                state::private_dir(dir)?;
                dir.clone()
            }
            None => state::state_dir()?,
        };
        if let Some(name) = &options.name {
            if find(&state_dir, name).is_ok() {
                return Err(Error::invalid(format!(
                    "a live sandbox named {name:?} is running"
                )));
            }
        }
        let supervisor = find_supervisor(options.supervisor.as_deref())?;
        let request = StartRequest {
            version: PROTOCOL_VERSION,
            caps: caps.clone(),
            strictness: options.strictness,
            backend: options.backend,
            name: options.name.clone(),
            ttl_s: options.ttl.map(|t| t.as_secs()),
            idle_ttl_s: options.idle_ttl.map(|t| t.as_secs()),
            owned: options.owned,
            helper: options.helper.clone(),
            state_dir: state_dir.clone(),
            publish: options.publish.clone(),
            policy: options.policy.clone(),
            origin: options.origin.clone(),
            idle_pause_s: options.idle_pause.map(|t| t.as_secs()),
        };
        let mut child = std::process::Command::new(&supervisor)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Error::internal(format!("start the supervisor {}", supervisor.display()), e)
            })?;
        let reply = talk_to_supervisor(&mut child, &request);
        let info = match reply {
            Ok(StartReply::Ok(info)) => *info,
            Ok(StartReply::Error(error)) => {
                let _ = child.wait();
                return Err(error.into());
            }
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(error);
            }
        };
        let socket = state::sandbox_dir(&state_dir, &info.id)?.join(state::SOCKET);
        let (owner, child) = if options.owned {
            (child.stdin.take(), Some(child))
        } else {
            // The supervisor went its own way (its own session) and outlives this handle; a
            // thread reaps it when it ends, so a long-lived caller keeps no zombie.
            drop(child.stdin.take());
            let _ = std::thread::Builder::new()
                .name("strata-live-reap".into())
                .spawn(move || child.wait());
            (None, None)
        };
        Ok(LiveSandbox {
            info,
            socket,
            owner,
            child,
        })
    }

    /// Connects to the running sandbox `id` (or name) of this user.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when there is no such sandbox (or it is another user's).
    pub fn attach(id: &str) -> Result<LiveSandbox> {
        Self::attach_in(&state::state_dir()?, id)
    }

    /// [`LiveSandbox::attach`] in the state directory `state_dir`.
    ///
    /// # Errors
    /// As [`LiveSandbox::attach`].
    pub fn attach_in(state_dir: &Path, id: &str) -> Result<LiveSandbox> {
        let (socket, info) = find(state_dir, id)?;
        Ok(LiveSandbox {
            info,
            socket,
            owner: None,
            child: None,
        })
    }

    /// The sandbox's directory in the state directory.
    pub(crate) fn dir(&self) -> &Path {
        self.socket.parent().unwrap_or(Path::new("/"))
    }

    /// This user's running live sandboxes.
    ///
    /// # Errors
    /// The state directory is not usable.
    pub fn list() -> Result<Vec<SandboxInfo>> {
        list_in(&state::state_dir()?)
    }

    /// Its id.
    pub fn id(&self) -> &str {
        &self.info.id
    }

    /// What it is (id, name, backend, receipt, clocks) as of when this handle was made.
    pub fn info(&self) -> &SandboxInfo {
        &self.info
    }

    /// Runs `request` in the foreground: `on_output` gets its output as it comes; returns
    /// how it ended. `stdin`, when given, is copied to the process (and then closed).
    ///
    /// # Errors
    /// A refused exec (bad request, program not found: nothing ran), or the sandbox is gone.
    pub fn exec(
        &self,
        request: ExecRequest,
        stdin: Option<Box<dyn Read + Send>>,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExitInfo> {
        self.exec_started(request, stdin, |_| {}, on_output)
    }

    /// [`LiveSandbox::exec`], telling `on_started` the pid as soon as the process runs (to
    /// [`LiveSandbox::resize`] its terminal, or signal it, from another thread).
    ///
    /// # Errors
    /// As [`LiveSandbox::exec`].
    pub fn exec_started(
        &self,
        mut request: ExecRequest,
        stdin: Option<Box<dyn Read + Send>>,
        on_started: impl FnOnce(i32),
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExitInfo> {
        request.detach = false;
        request.stdin = stdin.is_some();
        let mut conn = Connection::open(&self.socket)?;
        conn.send(&Request::Exec(request))?;
        let pid = match conn.reply()? {
            Reply::Started { pid } => pid,
            other => return Err(unexpected(other)),
        };
        on_started(pid);
        if let Some(mut input) = stdin {
            let mut writer = conn.writer()?;
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match input.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let request = Request::Stdin {
                                pid,
                                data: encode(&buf[..n]),
                            };
                            if write_line(&mut writer, &request).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = write_line(&mut writer, &Request::CloseStdin { pid });
            });
        }
        loop {
            match conn.reply()? {
                Reply::Output { stream, data } => on_output(stream, &decode(&data)?),
                Reply::Exited { exit } => return Ok(exit),
                Reply::Ok | Reply::Missed { .. } => {}
                Reply::Error { error } => {
                    // A failed stdin write (the process stopped reading) is not the end.
                    if !matches!(error, WireError::InvalidRequest { .. }) {
                        return Err(error.into());
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Starts `request` detached; returns its pid (its output is kept for [`Self::logs`]).
    ///
    /// # Errors
    /// A refused exec (nothing ran), or the sandbox is gone.
    pub fn spawn(&self, mut request: ExecRequest) -> Result<i32> {
        request.detach = true;
        match self.request(&Request::Exec(request))? {
            Reply::Started { pid } => Ok(pid),
            other => Err(unexpected(other)),
        }
    }

    /// Starts `request` on a new terminal of `size` (a pseudo-terminal: `bash -i`, REPLs
    /// and full-screen programs work), detached: the returned [`Pty`] writes its input,
    /// resizes it, follows its output (one stream) and waits for it, from this or any
    /// other handle on the sandbox. No terminal of the caller's reaches the sandbox.
    ///
    /// # Errors
    /// A refused exec or size (nothing ran), or the sandbox is gone.
    pub fn pty(&self, mut request: ExecRequest, size: TtySize) -> Result<Pty> {
        request.tty = Some(size.check()?);
        let pid = self.spawn(request)?;
        Ok(Pty {
            socket: self.socket.clone(),
            pid,
        })
    }

    /// Resizes the terminal of a process started with a `tty` (it gets `SIGWINCH`).
    ///
    /// # Errors
    /// No such process, it has no terminal, a bad size, or the sandbox is gone.
    pub fn resize(&self, pid: i32, size: TtySize) -> Result<()> {
        self.ok(&Request::Resize { pid, size })
    }

    /// Every process started with exec.
    ///
    /// # Errors
    /// The sandbox is gone.
    pub fn ps(&self) -> Result<Vec<ProcessInfo>> {
        match self.request(&Request::Ps)? {
            Reply::Processes { processes } => Ok(processes),
            other => Err(unexpected(other)),
        }
    }

    /// A process's kept output to `on_output`; with `follow`, until it exits. Returns how
    /// it ended, if it did.
    ///
    /// # Errors
    /// No such process, or the sandbox is gone.
    pub fn logs(
        &self,
        pid: i32,
        follow: bool,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Option<ExitInfo>> {
        let mut conn = Connection::open(&self.socket)?;
        conn.send(&Request::Logs { pid, follow })?;
        loop {
            match conn.reply()? {
                Reply::Output { stream, data } => on_output(stream, &decode(&data)?),
                Reply::Missed { .. } => {}
                Reply::Exited { exit } => return Ok(Some(exit)),
                Reply::Ok => return Ok(None),
                Reply::Error { error } => return Err(error.into()),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// A process's output past byte `offset` of all it wrote, waiting up to `wait` (at most
    /// 30 s) for some: the chunks, the bytes the ring dropped before them, the offset to
    /// ask from next, and how the process ended once all its output was returned.
    ///
    /// # Errors
    /// No such process, or the sandbox is gone.
    pub fn logs_since(&self, pid: i32, offset: u64, wait: Duration) -> Result<OutputSince> {
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        match self.request(&Request::LogsSince {
            pid,
            offset,
            wait_ms,
        })? {
            Reply::Since {
                chunks,
                missed,
                next,
                exit,
            } => {
                let chunks = chunks
                    .into_iter()
                    .map(|(stream, data)| decode(&data).map(|bytes| (stream, bytes)))
                    .collect::<Result<Vec<_>>>()?;
                Ok(OutputSince {
                    chunks,
                    missed,
                    next,
                    exit,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Waits for a process to exit.
    ///
    /// # Errors
    /// No such process, or the sandbox stopped first.
    pub fn wait(&self, pid: i32) -> Result<ExitInfo> {
        match self.request(&Request::Wait { pid })? {
            Reply::Exited { exit } => Ok(exit),
            other => Err(unexpected(other)),
        }
    }

    /// Sends `signal` to a process's group.
    ///
    /// # Errors
    /// No such process, a bad signal number, or the sandbox is gone.
    pub fn kill(&self, pid: i32, signal: i32) -> Result<()> {
        self.ok(&Request::Kill { pid, signal })
    }

    /// Writes to the stdin of a process started with `stdin`.
    ///
    /// # Errors
    /// No such process or no open stdin.
    pub fn write_stdin(&self, pid: i32, data: &[u8]) -> Result<()> {
        self.ok(&Request::Stdin {
            pid,
            data: encode(data),
        })
    }

    /// Closes a process's stdin.
    ///
    /// # Errors
    /// No such process.
    pub fn close_stdin(&self, pid: i32) -> Result<()> {
        self.ok(&Request::CloseStdin { pid })
    }

    /// The sandbox as it is now (paused or not, its published ports, the CPU time it
    /// used), asked of its supervisor. Does not count as activity for the idle TTL.
    ///
    /// # Errors
    /// The sandbox is gone.
    pub fn refresh(&self) -> Result<SandboxInfo> {
        match self.request(&Request::Info)? {
            Reply::Info { info } => Ok(*info),
            other => Err(unexpected(other)),
        }
    }

    /// Pauses every process of the sandbox: none runs until [`LiveSandbox::resume`], its
    /// TTLs and exec timeouts stop counting, output stays readable (`logs`, `ps`) and new
    /// execs are refused. Returns how it was paused (the cgroup freezer where there is
    /// one, else stop signals).
    ///
    /// # Errors
    /// The sandbox is gone, or its cgroup did not freeze (it keeps running).
    pub fn pause(&self) -> Result<PauseMethod> {
        match self.request(&Request::Pause)? {
            Reply::Paused { method } => Ok(method),
            other => Err(unexpected(other)),
        }
    }

    /// Resumes a paused sandbox (a running one is left as it is).
    ///
    /// # Errors
    /// The sandbox is gone, or its cgroup did not thaw.
    pub fn resume(&self) -> Result<()> {
        self.ok(&Request::Resume)
    }

    /// Publishes a TCP port the tool listens on inside (on `127.0.0.1` or every address)
    /// to a host address: loopback and a port the kernel chooses unless `request` says
    /// otherwise. Only that port of the sandbox becomes reachable, and the sandbox's
    /// egress is unchanged. At most [`crate::ports::MAX_PORTS`] per sandbox.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for port 0 inside, a host address that cannot be listened
    /// on, or too many ports.
    pub fn publish(&self, request: &PublishRequest) -> Result<PublishedPort> {
        match self.request(&Request::Publish(request.clone()))? {
            Reply::Published { port } => Ok(port),
            other => Err(unexpected(other)),
        }
    }

    /// [`LiveSandbox::stop`] through a shared handle (other threads may still use it; their
    /// requests then fail as on a stopped sandbox). Returns once everything is gone.
    ///
    /// # Errors
    /// The sandbox was already gone.
    pub fn stop_shared(&self) -> Result<()> {
        self.ok(&Request::Stop)
    }

    /// Ends the sandbox: every process, its namespaces, cgroup and state; returns once
    /// everything is gone.
    ///
    /// # Errors
    /// The sandbox was already gone.
    pub fn stop(mut self) -> Result<()> {
        let result = self.ok(&Request::Stop);
        if let Some(mut child) = self.child.take() {
            drop(self.owner.take());
            let _ = child.wait();
        }
        result
    }

    pub(crate) fn ok(&self, request: &Request) -> Result<()> {
        LiveSandboxRef(&self.socket).ok(request)
    }

    pub(crate) fn request(&self, request: &Request) -> Result<Reply> {
        LiveSandboxRef(&self.socket).request(request)
    }

    /// A new connection to the sandbox, for a streaming request.
    pub(crate) fn connect(&self) -> Result<Connection> {
        Connection::open(&self.socket)
    }
}

/// What [`LiveSandbox::logs_since`] returns.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OutputSince {
    /// Output past the offset asked from, in order.
    pub chunks: Vec<(Stream, Vec<u8>)>,
    /// Bytes the ring dropped before these.
    pub missed: u64,
    /// The offset to ask from next.
    pub next: u64,
    /// How the process ended, once all its output was returned.
    pub exit: Option<ExitInfo>,
}

/// A process on a terminal in a live sandbox ([`LiveSandbox::pty`]).
#[derive(Debug, Clone)]
pub struct Pty {
    socket: PathBuf,
    pid: i32,
}

impl Pty {
    /// Its pid inside the sandbox.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    fn handle(&self) -> LiveSandboxRef<'_> {
        LiveSandboxRef(&self.socket)
    }

    /// Types `data` into the terminal (`\x03` is `^C`, `\x04` end of input).
    ///
    /// # Errors
    /// The process ended, or the sandbox is gone.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        self.handle().ok(&Request::Stdin {
            pid: self.pid,
            data: encode(data),
        })
    }

    /// Resizes the terminal.
    ///
    /// # Errors
    /// A bad size, or the sandbox is gone.
    pub fn resize(&self, size: TtySize) -> Result<()> {
        self.handle().ok(&Request::Resize {
            pid: self.pid,
            size,
        })
    }

    /// The terminal's output kept so far to `on_output`; with `follow`, until the process
    /// exits. Returns how it ended, if it did.
    ///
    /// # Errors
    /// The sandbox is gone.
    pub fn output(
        &self,
        follow: bool,
        mut on_output: impl FnMut(&[u8]),
    ) -> Result<Option<ExitInfo>> {
        let mut conn = Connection::open(&self.socket)?;
        conn.send(&Request::Logs {
            pid: self.pid,
            follow,
        })?;
        loop {
            match conn.reply()? {
                Reply::Output { data, .. } => on_output(&decode(&data)?),
                Reply::Missed { .. } => {}
                Reply::Exited { exit } => return Ok(Some(exit)),
                Reply::Ok => return Ok(None),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// Waits for the process to exit.
    ///
    /// # Errors
    /// The sandbox stopped first.
    pub fn wait(&self) -> Result<ExitInfo> {
        match self.handle().request(&Request::Wait { pid: self.pid })? {
            Reply::Exited { exit } => Ok(exit),
            other => Err(unexpected(other)),
        }
    }

    /// Sends `signal` to its process group.
    ///
    /// # Errors
    /// A bad signal number, or the sandbox is gone.
    pub fn kill(&self, signal: i32) -> Result<()> {
        self.handle().ok(&Request::Kill {
            pid: self.pid,
            signal,
        })
    }
}

/// One request-reply exchange with a sandbox's socket.
struct LiveSandboxRef<'a>(&'a Path);

impl LiveSandboxRef<'_> {
    fn ok(&self, request: &Request) -> Result<()> {
        match self.request(request)? {
            Reply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn request(&self, request: &Request) -> Result<Reply> {
        let mut conn = Connection::open(self.0)?;
        conn.send(request)?;
        match conn.reply()? {
            Reply::Error { error } => Err(error.into()),
            reply => Ok(reply),
        }
    }
}

/// Sends the start request and reads the one-line answer.
fn talk_to_supervisor(child: &mut Child, request: &StartRequest) -> Result<StartReply> {
    let gone = |e: std::io::Error| Error::internal("talk to the live sandbox's supervisor", e);
    let mut line = serde_json::to_vec(request).map_err(|e| gone(std::io::Error::other(e)))?;
    line.push(b'\n');
    let stdin = child
        .stdin
        .as_mut()
        .ok_or_else(|| gone(std::io::Error::other("no stdin")))?;
    stdin.write_all(&line).map_err(gone)?;
    stdin.flush().map_err(gone)?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| gone(std::io::Error::other("no stdout")))?;
    let mut answer = String::new();
    BufReader::new(stdout)
        .take(1 << 20)
        .read_line(&mut answer)
        .map_err(gone)?;
    if answer.is_empty() {
        return Err(Error::Internal {
            message: "the live sandbox's supervisor ended without an answer".into(),
            source: None,
        });
    }
    serde_json::from_str(answer.trim_end()).map_err(|e| gone(std::io::Error::other(e)))
}

/// The socket and description of sandbox `id` (or name) in `state_dir`.
fn find(state_dir: &Path, id: &str) -> Result<(PathBuf, SandboxInfo)> {
    let dir = state::sandbox_dir(state_dir, id)?;
    if let Some(info) = read_info(&dir) {
        return Ok((dir.join(state::SOCKET), info));
    }
    for info in list_in(state_dir)? {
        if info.name.as_deref() == Some(id) {
            let dir = state::sandbox_dir(state_dir, &info.id)?;
            return Ok((dir.join(state::SOCKET), info));
        }
    }
    Err(Error::invalid(format!(
        "no live sandbox {id:?} of this user"
    )))
}

/// A sandbox directory's description, when its supervisor answers.
fn read_info(dir: &Path) -> Option<SandboxInfo> {
    let socket = dir.join(state::SOCKET);
    let mut conn = Connection::open(&socket).ok()?;
    conn.send(&Request::Info).ok()?;
    match conn.reply().ok()? {
        Reply::Info { info } => Some(*info),
        _ => None,
    }
}

/// Every sandbox in `state_dir` whose supervisor answers. Directories of supervisors that
/// died without cleaning up are removed.
///
/// # Errors
/// The state directory cannot be read.
pub fn list_in(state_dir: &Path) -> Result<Vec<SandboxInfo>> {
    let entries = std::fs::read_dir(state_dir)
        .map_err(|e| Error::invalid(format!("state directory {}: {e}", state_dir.display())))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.starts_with("sb-") || !state::valid_name(name) {
            continue;
        }
        match read_info(&dir) {
            Some(info) => found.push(info),
            None => {
                if supervisor_gone(&dir) {
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
        }
    }
    found.sort_by_key(|info| info.started_at);
    Ok(found)
}

/// Whether the supervisor recorded in `dir` no longer runs.
fn supervisor_gone(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join(state::INFO)) else {
        return true;
    };
    let Ok(info) = serde_json::from_str::<SandboxInfo>(&text) else {
        return true;
    };
    !Path::new(&format!("/proc/{}", info.supervisor_pid)).exists()
}

pub(crate) fn unexpected(reply: Reply) -> Error {
    match reply {
        Reply::Error { error } => error.into(),
        other => Error::Internal {
            message: format!("unexpected answer from the live sandbox: {other:?}"),
            source: None,
        },
    }
}

fn write_line(out: &mut UnixStream, request: &Request) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)
}

/// One connection to a sandbox's control socket.
pub(crate) struct Connection {
    out: UnixStream,
    lines: BufReader<UnixStream>,
}

impl Connection {
    fn open(socket: &Path) -> Result<Connection> {
        let out = UnixStream::connect(socket).map_err(|e| {
            Error::invalid(format!(
                "the live sandbox at {} does not answer ({e}): stopped, or not yours",
                socket.display()
            ))
        })?;
        let read = out
            .try_clone()
            .map_err(|e| Error::internal("clone a socket", e))?;
        Ok(Connection {
            out,
            lines: BufReader::new(read),
        })
    }

    fn writer(&self) -> Result<UnixStream> {
        self.out
            .try_clone()
            .map_err(|e| Error::internal("clone a socket", e))
    }

    pub(crate) fn send(&mut self, request: &Request) -> Result<()> {
        write_line(&mut self.out, request)
            .map_err(|e| Error::internal("send to the live sandbox", e))
    }

    pub(crate) fn reply(&mut self) -> Result<Reply> {
        let mut line = String::new();
        let n = self
            .lines
            .read_line(&mut line)
            .map_err(|e| Error::internal("read from the live sandbox", e))?;
        if n == 0 {
            return Err(Error::invalid(
                "the live sandbox closed the connection (it stopped, or refused this user)",
            ));
        }
        serde_json::from_str(line.trim_end())
            .map_err(|e| Error::internal("read from the live sandbox", std::io::Error::other(e)))
    }
}
