//! The `strata-live` binary: `strata-live serve` reads a [`StartRequest`] on stdin, starts
//! the sandbox, answers one [`StartReply`] line on stdout, and then holds the sandbox (see
//! [`crate::server`]) until it ends. An owned sandbox ends when its stdin reads end of file
//! (the owner closed it or died); an unowned one leaves the caller's session at once.

use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandbox_core::{
    BackendKind, Capability, Error, Mechanism, Receipt, Result, RunContext, RunSpec,
};
use sandbox_os::ProcessBackend;

use crate::client::{StartReply, StartRequest};
use crate::held::Held;
use crate::protocol::{SandboxInfo, WireError, PROTOCOL_VERSION};
use crate::server::{self, Config};
use crate::state;

/// Entry point of `strata-live`; returns the process's exit code.
pub fn main() -> i32 {
    // Before any thread exists: the stop signals are taken by the event loop only.
    let signals = sandbox_os::live::stop_signals().ok();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("serve") || args.len() != 1 {
        eprintln!("strata-live is started by the strata library and CLI (strata start); it is not a command to run by hand");
        return 2;
    }
    let request = match read_request() {
        Ok(request) => request,
        Err(error) => {
            answer(&StartReply::Error(WireError::from(&error)));
            return 1;
        }
    };
    let owned = request.owned;
    let started = match start(request) {
        Ok(started) => started,
        Err(error) => {
            answer(&StartReply::Error(WireError::from(&error)));
            return 1;
        }
    };
    let Started {
        backend,
        sandbox,
        policy,
        info,
        config,
        listener,
        ports,
    } = started;
    let mut answered = info.clone();
    server::port_lines(&mut answered.receipt, &answered.ports);
    answer(&StartReply::Ok(Box::new(answered)));
    detach_stdio();
    let owner = if owned {
        take_stdin()
    } else {
        let _ = rustix::process::setsid();
        None
    };
    let policy = Arc::new(policy);
    let ending = server::serve(
        sandbox,
        Arc::clone(&policy),
        info,
        config,
        listener,
        ports,
        owner,
        signals,
    );
    if let Err(error) = policy.lifecycle("ended", ending.describe().into()) {
        tracing::warn!(%error, "could not record the sandbox's end in the audit log");
    }
    // The backend (its egress proxy among others) outlives the sandbox it served.
    drop(backend);
    0
}

fn read_request() -> Result<StartRequest> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .take(4 << 20)
        .read_line(&mut line)
        .map_err(|e| Error::internal("read the start request", e))?;
    let request: StartRequest = serde_json::from_str(line.trim_end())
        .map_err(|e| Error::invalid(format!("not a live sandbox start request: {e}")))?;
    if request.version != PROTOCOL_VERSION {
        return Err(Error::invalid(format!(
            "the start request speaks live protocol {}, this supervisor {PROTOCOL_VERSION}",
            request.version
        )));
    }
    Ok(request)
}

/// What must outlive the sandbox: the backend it was started on (it holds the egress proxy
/// among others).
type KeepAlive = Box<dyn std::any::Any>;

struct Started {
    backend: KeepAlive,
    sandbox: Held,
    policy: crate::policy::ExecPolicy,
    info: SandboxInfo,
    config: Config,
    listener: UnixListener,
    ports: server::StartPorts,
}

/// The backends live sandboxes run on, in words (for refusals).
#[cfg(feature = "container")]
const LIVE_BACKENDS: &str = "process, container (native runtime) and microvm";
#[cfg(not(feature = "container"))]
const LIVE_BACKENDS: &str = "process and microvm (this build has no container backend)";

/// Starts the sandbox `request` asks for on its backend.
///
/// Returns the backend with the sandbox: it outlives the sandbox (it holds the egress
/// proxy among others); on the container backend it is the process backend the native
/// runtime ran on.
fn start_on_backend(request: &StartRequest, ctx: &RunContext) -> Result<(KeepAlive, Held)> {
    let process = Arc::new(match &request.helper {
        Some(helper) => ProcessBackend::with_helper(helper),
        None => ProcessBackend::new(),
    });
    let host = sandbox_core::grant::RealHost;
    let placeholder = sandbox_core::Tool::command(["true"]);
    match request.backend {
        BackendKind::Process => {
            let spec = RunSpec::new(&request.caps, &host)?;
            let sandbox = process.start_live(&spec, ctx)?;
            Ok((Box::new(process), Held::Process(Box::new(sandbox))))
        }
        #[cfg(feature = "container")]
        BackendKind::Container => {
            let backend = sandbox_container::ContainerBackend::with_process(Arc::clone(&process));
            let spec = RunSpec::plan(BackendKind::Container, &placeholder, &request.caps, &host)?;
            let sandbox = backend.start_live(&spec, ctx)?;
            Ok((Box::new(process), Held::Process(Box::new(sandbox))))
        }
        BackendKind::Microvm => {
            // The VMM's jail: the helper the request names, no warm pool.
            let jail = match &request.helper {
                Some(helper) => ProcessBackend::with_helper(helper),
                None => ProcessBackend::new(),
            }
            .with_warm_pool(0);
            let backend = sandbox_vm::MicrovmBackend::new().jailed_in(Arc::new(jail));
            let spec = RunSpec::plan(BackendKind::Microvm, &placeholder, &request.caps, &host)?;
            let sandbox = backend.start_live(&spec, ctx)?;
            Ok((Box::new(backend), Held::Vm(Box::new(sandbox))))
        }
        other => Err(Error::unavailable(
            other,
            format!("live sandboxes run on the {LIVE_BACKENDS} backends, not on {other}"),
        )),
    }
}

fn start(request: StartRequest) -> Result<Started> {
    state::private_dir(&request.state_dir)?;
    let id = state::new_id()?;
    let dir = state::sandbox_dir(&request.state_dir, &id)?;
    let context = RunContext {
        strictness: request.strictness,
        ..RunContext::default()
    };
    // A log that cannot be written (or does not verify) refuses before anything starts.
    let policy = crate::policy::ExecPolicy::open(&request.policy, &id, &request.caps)?;
    let (backend, sandbox) = start_on_backend(&request, &context)?;
    if request.publish.len() > crate::ports::MAX_PORTS {
        return Err(Error::invalid(format!(
            "publish: at most {} ports per sandbox",
            crate::ports::MAX_PORTS
        )));
    }
    let ports = request
        .publish
        .iter()
        .map(crate::ports::bind)
        .collect::<Result<server::StartPorts>>()?;
    state::private_dir(&dir)?;
    let socket = dir.join(state::SOCKET);
    let listener = UnixListener::bind(&socket).map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        Error::internal(format!("listen on {}", socket.display()), e)
    })?;
    let _ = state::set_mode(&socket, 0o600);
    let info = SandboxInfo {
        id: id.clone(),
        name: request.name.clone(),
        backend: request.backend,
        supervisor_pid: std::process::id(),
        started_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        ttl_s: request.ttl_s,
        idle_ttl_s: request.idle_ttl_s,
        owned: request.owned,
        receipt: {
            let mut receipt = clock_receipt(sandbox.receipt().clone(), &request);
            request.policy.state_in(&mut receipt);
            receipt
        },
        paused: false,
        ports: ports.iter().map(|(_, port)| port.clone()).collect(),
        cpu_us: None,
    };
    let spec = state::SandboxSpec {
        caps: request.caps.clone(),
        strictness: request.strictness,
        backend: request.backend,
        policy: request.policy.clone(),
        helper: request.helper.clone(),
        supervisor: std::env::current_exe().ok(),
        workdir: sandbox.workdir().to_path_buf(),
    };
    write_info(&dir, &info)
        .and_then(|()| spec.write(&dir))
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
    policy.lifecycle(
        "started",
        format!("{} on the {} backend", info.id, info.backend),
    )?;
    Ok(Started {
        backend,
        sandbox,
        policy,
        info,
        config: Config {
            dir,
            ttl: request.ttl_s.map(Duration::from_secs),
            idle_ttl: request.idle_ttl_s.map(Duration::from_secs),
            idle_pause: request.idle_pause_s.map(Duration::from_secs),
            owner_uid: state::uid(),
        },
        listener,
        ports,
    })
}

/// The sandbox's receipt with the clocks its supervisor keeps: the TTLs, per-exec
/// timeouts, and (owned) its owner.
fn clock_receipt(mut receipt: Receipt, request: &StartRequest) -> Receipt {
    if let Some(ttl) = request.ttl_s {
        receipt.enforce(
            Capability::Wall,
            Mechanism::Supervisor,
            "live sandbox ttl",
            format!("the sandbox and every process in it end {ttl} s after it started"),
        );
    }
    if let Some(idle) = request.idle_ttl_s {
        receipt.enforce(
            Capability::Wall,
            Mechanism::Supervisor,
            "live sandbox idle ttl",
            format!("the sandbox ends after {idle} s without a client request or a client following output"),
        );
    }
    receipt.enforce(
        Capability::Wall,
        Mechanism::Supervisor,
        "exec timeout",
        "an exec given a timeout has its process group killed when it runs out",
    );
    receipt.enforce(
        Capability::Output,
        Mechanism::Supervisor,
        "output ring",
        format!(
            "each process's output is kept in a {} ring; older output is dropped (readers are told how much), the process is not stopped",
            sandbox_core::ByteSize(crate::ring::DEFAULT_RING_BYTES as u64)
        ),
    );
    if let Some(idle) = request.idle_pause_s {
        receipt.enforce(
            Capability::Lifetime,
            Mechanism::Supervisor,
            "idle pause",
            format!("the sandbox is paused after {idle} s without a client request or a connection through a published port, and resumed by the next request that needs it running; its ttls stand still meanwhile"),
        );
    }
    if let Some(origin) = &request.origin {
        receipt.enforce(
            Capability::Fs,
            Mechanism::Supervisor,
            "snapshot",
            origin.clone(),
        );
    }
    if request.owned {
        receipt.enforce(
            Capability::Lifetime,
            Mechanism::Supervisor,
            "owned live sandbox",
            "the sandbox ends when the process that started it closes its handle or dies",
        );
    }
    receipt
}

fn write_info(dir: &std::path::Path, info: &SandboxInfo) -> Result<()> {
    let path = dir.join(state::INFO);
    let text = serde_json::to_vec_pretty(info)
        .map_err(|e| Error::internal("encode info", std::io::Error::other(e)))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode_0600()
        .open(&path)
        .map_err(|e| Error::internal(format!("write {}", path.display()), e))?;
    file.write_all(&text)
        .map_err(|e| Error::internal(format!("write {}", path.display()), e))
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

fn answer(reply: &StartReply) {
    if let Ok(mut line) = serde_json::to_vec(reply) {
        line.push(b'\n');
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(&line);
        let _ = stdout.flush();
    }
}

/// Points stdout and stderr at `/dev/null`: the caller stops reading once it has the
/// answer, and nothing later may fail on (or block) a pipe nobody reads.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
}

/// The owner's end: stdin, kept as a descriptor that reads end of file once the owner is
/// gone; fd 0 itself then reads `/dev/null`.
fn take_stdin() -> Option<OwnedFd> {
    let owner = rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3).ok()?;
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = rustix::stdio::dup2_stdin(&null);
    }
    Some(owner)
}
