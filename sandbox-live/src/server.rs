//! The supervisor of one live sandbox: holds the sandbox, serves its control socket, keeps
//! its clocks, and ends it.
//!
//! Threads: the event loop (this module's [`serve`]: init's events, the helper's report, the
//! owner, stop signals, TTLs and per-exec timeouts), one acceptor, one thread per client
//! connection and one output reader per exec. The sandbox ends on `stop`, at its TTL or
//! idle TTL, when its owner goes away (owned sandboxes), on SIGTERM/SIGINT/SIGHUP, or when
//! it ends by itself (its init was killed); then every process is killed, the cgroup is
//! removed and the sandbox's state directory deleted before the supervisor exits.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::event::{PollFd, PollFlags};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandbox_core::{Capability, Error, Mechanism};
use sandbox_os::live::LiveEvent;

use crate::held::Held;

use crate::exec;
use crate::protocol::{PublishedPort, Reply, Request, SandboxInfo, WireError};
use crate::state;
use crate::table::Shared;

/// How the sandbox is held.
#[derive(Clone, Debug)]
pub struct Config {
    /// Its directory (control socket, `info.json`), removed when it ends.
    pub dir: PathBuf,
    /// Absolute time to live.
    pub ttl: Option<Duration>,
    /// Time without client activity after which it ends.
    pub idle_ttl: Option<Duration>,
    /// Time without client activity (or a connection through a published port) after
    /// which it is paused until the next request that needs it running.
    pub idle_pause: Option<Duration>,
    /// The uid whose clients may connect (root may too).
    pub owner_uid: u32,
}

/// Ports bound when the sandbox started ([`crate::ports::bind`]), served from the start.
pub type StartPorts = Vec<(std::net::TcpListener, crate::protocol::PublishedPort)>;

/// Why the sandbox ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// A client asked (`stop`).
    Stopped,
    /// Its TTL ran out.
    Ttl,
    /// Its idle TTL ran out.
    Idle,
    /// The process that owned it went away.
    OwnerGone,
    /// The supervisor got a termination signal.
    Signal,
    /// The sandbox ended by itself (its init is gone).
    SandboxEnded,
}

impl Ending {
    /// In words, for the audit log.
    pub fn describe(self) -> &'static str {
        match self {
            Ending::Stopped => "stopped by a client",
            Ending::Ttl => "its ttl ran out",
            Ending::Idle => "its idle ttl ran out",
            Ending::OwnerGone => "its owner went away",
            Ending::Signal => "its supervisor got a stop signal",
            Ending::SandboxEnded => "it ended by itself",
        }
    }
}

/// What the connection threads share with the loop.
pub(crate) struct Context {
    pub(crate) sandbox: Mutex<Option<Held>>,
    /// The tier, approver and audit log every exec goes through.
    pub(crate) policy: Arc<crate::policy::ExecPolicy>,
    pub(crate) table: Shared,
    pub(crate) info: SandboxInfo,
    pub(crate) stop: AtomicBool,
    /// Written to wake the loop (a stop request).
    pub(crate) wake: OwnedFd,
}

impl Context {
    /// Asks the loop to end the sandbox.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake_loop();
    }

    /// Makes the loop look at its clocks again (they changed: a pause or resume).
    pub(crate) fn wake_loop(&self) {
        let _ = rustix::io::write(&self.wake, b"w");
    }

    /// The sandbox as it is now: its description, whether it is paused, its published
    /// ports (also as receipt lines) and the CPU time it used.
    pub(crate) fn current_info(&self) -> SandboxInfo {
        let mut info = self.info.clone();
        {
            let table = self.table.lock();
            info.paused = table.paused_since.is_some();
            info.ports.clone_from(&table.ports);
        }
        port_lines(&mut info.receipt, &info.ports);
        info.cpu_us = self
            .sandbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Held::cpu_usage_us);
        info
    }
}

/// Serves `sandbox` on `listener` until it ends; `owner` (an owned sandbox) is a descriptor
/// that reads end of file when the owner is gone; `signals` is readable when a stop signal
/// arrived. Removes the sandbox's directory before returning.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    sandbox: Held,
    policy: Arc<crate::policy::ExecPolicy>,
    info: SandboxInfo,
    config: Config,
    listener: UnixListener,
    ports: StartPorts,
    owner: Option<OwnedFd>,
    signals: Option<OwnedFd>,
) -> Ending {
    let (wake_r, wake_w) = match rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC) {
        Ok(pair) => pair,
        Err(_) => {
            drop(sandbox.stop());
            let _ = std::fs::remove_dir_all(&config.dir);
            return Ending::SandboxEnded;
        }
    };
    let context = Arc::new(Context {
        sandbox: Mutex::new(Some(sandbox)),
        policy,
        table: Shared::default(),
        info,
        stop: AtomicBool::new(false),
        wake: wake_w,
    });
    context.table.lock().last_activity = Some(Instant::now());
    for (port_listener, port) in ports {
        if let Err(error) = crate::ports::serve(&context, port_listener, port) {
            tracing::warn!("a published port is not served: {error}");
        }
    }
    accept_in_background(listener, Arc::clone(&context), config.owner_uid);
    let ending = event_loop(&context, &config, &wake_r, owner.as_ref(), signals.as_ref());
    let sandbox = context
        .sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(mut sandbox) = sandbox {
        for line in sandbox.finish() {
            if let Err(error) = context.policy.lifecycle("written back", line) {
                tracing::warn!(%error, "could not record a grant's write-back in the audit log");
            }
        }
        drop(sandbox.stop());
    }
    let _ = std::fs::remove_dir_all(&config.dir);
    sandbox_os::live::flush_cleanup();
    // Only now is everything gone: waiters (a `stop` request) are told, and get a moment
    // to say so before the process exits.
    let mut table = context.table.lock();
    table.stop();
    context.table.notify();
    let deadline = Instant::now() + Duration::from_secs(2);
    while table.stop_waiters > 0 && Instant::now() < deadline {
        table = context.table.wait(table, Duration::from_millis(20));
    }
    ending
}

fn accept_in_background(listener: UnixListener, context: Arc<Context>, owner_uid: u32) {
    let spawned = std::thread::Builder::new()
        .name("strata-live-accept".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if context.stop.load(Ordering::SeqCst) {
                    break;
                }
                // Another user's client learns nothing, not even that the sandbox exists.
                if !state::peer_allowed(&stream, owner_uid) {
                    continue;
                }
                let context = Arc::clone(&context);
                let _ = crate::workers::run(move || connection(stream, &context));
            }
        });
    if spawned.is_err() {
        tracing::warn!("the live sandbox cannot accept clients: no thread");
    }
}

fn event_loop(
    context: &Context,
    config: &Config,
    wake: &OwnedFd,
    owner: Option<&OwnedFd>,
    signals: Option<&OwnedFd>,
) -> Ending {
    let started = Instant::now();
    // Own copies of the sandbox's descriptors, to poll without holding its lock.
    let dups = {
        let guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map(|sandbox| {
            (
                sandbox.events().try_clone_to_owned(),
                sandbox.end_events().try_clone_to_owned(),
            )
        })
    };
    let (Some(Ok(events)), Some(Ok(helper))) = (
        dups.as_ref().map(|d| d.0.as_ref().map(|fd| fd.as_fd())),
        dups.as_ref().map(|d| d.1.as_ref().map(|fd| fd.as_fd())),
    ) else {
        return Ending::SandboxEnded;
    };
    loop {
        if context.stop.load(Ordering::SeqCst) {
            return Ending::Stopped;
        }
        let now = Instant::now();
        let mut next = now + Duration::from_secs(3600);
        let (paused, paused_total) = {
            let table = context.table.lock();
            (table.paused_since.is_some(), table.paused_total(now))
        };
        // A paused sandbox's clocks stand still: its TTLs and exec timeouts count only the
        // time it ran (resuming wakes this loop).
        if let (Some(ttl), false) = (config.ttl, paused) {
            let end = started + ttl + paused_total;
            if now >= end {
                return Ending::Ttl;
            }
            next = next.min(end);
        }
        if !paused {
            let mut table = context.table.lock();
            if let Some(idle) = config.idle_ttl {
                let last = table.last_activity.unwrap_or(started);
                if table.attached == 0 && now >= last + idle {
                    return Ending::Idle;
                }
                next = next.min(if table.attached == 0 {
                    last + idle
                } else {
                    now + idle
                });
            }
            if let Some(idle) = config.idle_pause {
                let last = table.last_activity.unwrap_or(started);
                if table.attached == 0 && table.forwarding == 0 && now >= last + idle {
                    drop(table);
                    if matches!(pause(context), Reply::Paused { .. }) {
                        context.table.lock().auto_paused = true;
                        let idle = idle.as_secs();
                        if let Err(error) = context
                            .policy
                            .lifecycle("paused", format!("idle for {idle} s (idle pause)"))
                        {
                            tracing::warn!(%error, "could not record an idle pause in the audit log");
                        }
                    }
                    continue;
                }
                next = next.min(if table.attached == 0 && table.forwarding == 0 {
                    last + idle
                } else {
                    now + idle
                });
            }
            let expired: Vec<i32> = table
                .procs
                .iter_mut()
                .filter(|(_, p)| p.exit.is_none() && p.deadline.is_some_and(|d| now >= d))
                .map(|(pid, p)| {
                    p.timed_out = true;
                    p.deadline = None;
                    *pid
                })
                .collect();
            next = table
                .procs
                .values()
                .filter_map(|p| p.deadline)
                .fold(next, Instant::min);
            drop(table);
            if let Some(sandbox) = context
                .sandbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                for pid in expired {
                    let _ = sandbox.signal(pid, libc::SIGKILL);
                }
            }
        }
        let wait = next.saturating_duration_since(Instant::now());
        let mut fds = vec![
            PollFd::new(&events, PollFlags::IN),
            PollFd::new(&helper, PollFlags::IN),
            PollFd::new(wake, PollFlags::IN),
        ];
        fds.extend(owner.map(|fd| PollFd::new(fd, PollFlags::IN)));
        fds.extend(signals.map(|fd| PollFd::new(fd, PollFlags::IN)));
        let timeout = rustix::time::Timespec {
            tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(wait.subsec_nanos()),
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(_) => continue,
            Ok(_) => {}
        }
        let ready: Vec<bool> = fds.iter().map(|fd| !fd.revents().is_empty()).collect();
        drop(fds);
        if ready[0] && !init_events(context) {
            return Ending::SandboxEnded;
        }
        if ready[1] {
            let mut guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
            if guard.as_mut().is_none_or(Held::ended) {
                return Ending::SandboxEnded;
            }
        }
        if ready[2] {
            let mut byte = [0u8; 64];
            let _ = rustix::io::read(wake, &mut byte);
        }
        let mut next_index = 3;
        if owner.is_some() {
            if ready[next_index] {
                return Ending::OwnerGone;
            }
            next_index += 1;
        }
        if signals.is_some() && ready[next_index] {
            return Ending::Signal;
        }
    }
}

/// Takes init's events; `false` once init is gone.
fn init_events(context: &Context) -> bool {
    let event = {
        let guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(sandbox) => sandbox.next_event(),
            None => return false,
        }
    };
    let mut table = context.table.lock();
    match event {
        Ok(Some((LiveEvent::Started { id, pid }, _))) => table.started(id, pid),
        Ok(Some((LiveEvent::ExecFailed { id, program, errno }, _))) => {
            if let Some(pending) = table.pending.get_mut(&id) {
                pending.answer = Some(Err(Error::Exec {
                    program,
                    source: std::io::Error::from_raw_os_error(errno),
                }));
            }
        }
        Ok(Some((LiveEvent::Exited { pid, wait_status }, _))) => {
            table.exited(pid, wait_status);
            if context.policy.audited() {
                if let Some(proc) = table.procs.get(&pid) {
                    let status = proc.exit.map_or_else(|| "ended".into(), exit_status);
                    let argv = proc.argv.clone();
                    drop(table);
                    context.policy.ended(&argv, pid, status);
                    context.table.notify();
                    return true;
                }
            }
        }
        Ok(Some((LiveEvent::Connecting { id }, socket))) => {
            if let Some(slot) = table.connecting.get_mut(&id) {
                *slot = Some(socket.ok_or(libc::EIO));
            }
        }
        Ok(Some((LiveEvent::ConnectFailed { id, errno }, _))) => {
            if let Some(slot) = table.connecting.get_mut(&id) {
                *slot = Some(Err(errno));
            }
        }
        // Taken once when the sandbox started; init sends it on request only.
        Ok(Some((LiveEvent::Root, _))) => {}
        Ok(Some((LiveEvent::Refused { message }, _))) => {
            tracing::warn!("the live sandbox's init refused a request: {message}");
        }
        Ok(None) => return false,
        Err(e) => tracing::warn!("{e}"),
    }
    drop(table);
    context.table.notify();
    true
}

/// How an exec ended, in the audit log's words (`exited 0`, `signaled 9`, `timed out`).
fn exit_status(exit: crate::protocol::ExitInfo) -> String {
    match (exit.timed_out, exit.exit_code, exit.signal) {
        (true, _, _) => "timed out".into(),
        (false, Some(code), _) => format!("exited {code}"),
        (false, None, Some(signal)) => format!("signaled {signal}"),
        (false, None, None) => "ended".into(),
    }
}

/// Serves one client: a request per line, replies as lines.
fn connection(stream: UnixStream, context: &Arc<Context>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut lines = BufReader::new(read_half);
    // One writer per connection, shared with the thread that streams a foreground exec, so
    // replies never interleave inside a line.
    let out: Out = Arc::new(Mutex::new(stream));
    let mut line = String::new();
    let mut foreground: Vec<i32> = Vec::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => {
                cancel_foreground(context, &foreground);
                return;
            }
            Ok(_) => {}
        }
        let request: Request = match serde_json::from_str(line.trim_end()) {
            Ok(request) => request,
            Err(e) => {
                let error = Error::invalid(format!("not a live sandbox request: {e}"));
                if send(
                    &out,
                    &Reply::Error {
                        error: WireError::from(&error),
                    },
                )
                .is_err()
                {
                    return;
                }
                continue;
            }
        };
        // Looking a sandbox up (`ls`, attach) does not keep it alive; everything else does.
        if !matches!(request, Request::Info) {
            context.table.lock().last_activity = Some(Instant::now());
        }
        // A sandbox its idle pause froze runs again for a request that needs it running.
        // The file operations of the process and container backends are served from the
        // host (they work while paused; a snapshot's copy must not wake the sandbox); a
        // microVM's go through its agent.
        let host_files = matches!(request, Request::Files(_))
            && context.info.backend != sandbox_core::BackendKind::Microvm;
        if !host_files
            && !matches!(
                request,
                Request::Info
                    | Request::Ps
                    | Request::Logs { follow: false, .. }
                    | Request::Pause
                    | Request::Resume
                    | Request::Stop
            )
        {
            wake_if_idle_paused(context);
        }
        let keep_going = match request {
            Request::Info => send(
                &out,
                &Reply::Info {
                    info: Box::new(context.current_info()),
                },
            )
            .is_ok(),
            Request::Pause => {
                context.table.lock().auto_paused = false;
                send(&out, &pause(context)).is_ok()
            }
            Request::Resume => send(&out, &resume(context)).is_ok(),
            Request::Files(crate::files::FileRequest::Watch { path, recursive }) => {
                match crate::files::workdir(context)
                    .and_then(|workdir| crate::files::relative(&path, &workdir))
                {
                    Ok(rel) => crate::watch::watch(context, &rel, recursive, &out),
                    Err(error) => send(
                        &out,
                        &Reply::Error {
                            error: WireError::from(&error),
                        },
                    )
                    .is_ok(),
                }
            }
            Request::Files(request) => send(&out, &crate::files::serve(context, request)).is_ok(),
            Request::Publish(request) => {
                let reply = match crate::ports::publish(context, &request) {
                    Ok(port) => Reply::Published { port },
                    Err(error) => Reply::Error {
                        error: WireError::from(&error),
                    },
                };
                send(&out, &reply).is_ok()
            }
            Request::Stop => {
                context.request_stop();
                // Answered once the sandbox is gone, so `stop` returning means it is.
                let mut table = context.table.lock();
                table.stop_waiters += 1;
                while !table.stopped {
                    table = context.table.wait(table, Duration::from_millis(100));
                }
                drop(table);
                let _ = send(&out, &Reply::Ok);
                context.table.lock().stop_waiters -= 1;
                context.table.notify();
                false
            }
            Request::Exec(request) => exec::exec(context, request, &out, &mut foreground),
            other => exec::control(context, other, &out),
        };
        if !keep_going {
            return;
        }
    }
}

/// Adds a receipt line per published port.
pub(crate) fn port_lines(receipt: &mut sandbox_core::Receipt, ports: &[PublishedPort]) {
    for port in ports {
        receipt.enforce(
            Capability::Net,
            Mechanism::Supervisor,
            "published port",
            format!(
                "{}:{} on the host reaches 127.0.0.1:{} inside the sandbox and nothing else of it; the sandbox's egress is unchanged",
                port.host_ip, port.host_port, port.guest_port
            ),
        );
    }
}

/// `pause`: freezes the sandbox and stops its clocks.
fn pause(context: &Context) -> Reply {
    let paused = {
        let mut guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(sandbox) => sandbox.pause(),
            None => Err(Error::invalid("the sandbox has stopped")),
        }
    };
    match paused {
        Ok(method) => {
            let mut table = context.table.lock();
            if table.paused_since.is_none() {
                table.paused_since = Some(Instant::now());
            }
            drop(table);
            context.wake_loop();
            Reply::Paused { method }
        }
        Err(error) => Reply::Error {
            error: WireError::from(&error),
        },
    }
}

/// Resumes the sandbox when its idle pause froze it (a client's pause stays).
pub(crate) fn wake_if_idle_paused(context: &Context) {
    let woken = std::mem::take(&mut context.table.lock().auto_paused);
    if woken {
        if let Reply::Error { error } = resume(context) {
            tracing::warn!(?error, "could not resume a sandbox its idle pause froze");
        }
    }
}

/// `resume`: thaws the sandbox; its clocks go on from where they stood.
fn resume(context: &Context) -> Reply {
    let resumed = {
        let mut guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(sandbox) => sandbox.resume(),
            None => Err(Error::invalid("the sandbox has stopped")),
        }
    };
    match resumed {
        Ok(()) => {
            let mut table = context.table.lock();
            table.auto_paused = false;
            table.resumed(Instant::now());
            drop(table);
            context.table.notify();
            context.wake_loop();
            Reply::Ok
        }
        Err(error) => Reply::Error {
            error: WireError::from(&error),
        },
    }
}

/// A client that went away cancels the foreground execs it started that still run.
fn cancel_foreground(context: &Context, pids: &[i32]) {
    let running: Vec<i32> = {
        let table = context.table.lock();
        pids.iter()
            .copied()
            .filter(|pid| table.procs.get(pid).is_some_and(|p| p.exit.is_none()))
            .collect()
    };
    if let Some(sandbox) = context
        .sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        for pid in running {
            let _ = sandbox.signal(pid, libc::SIGKILL);
        }
    }
}

/// A connection's writing half.
pub(crate) type Out = Arc<Mutex<UnixStream>>;

/// Writes one reply line.
pub(crate) fn send(out: &Out, reply: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.lock()
        .unwrap_or_else(|e| e.into_inner())
        .write_all(&line)
}
