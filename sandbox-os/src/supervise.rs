//! Host side of a run: spawns the helper, feeds stdin, collects capped output, relays
//! cancellation, and always reaps the helper (nothing is left behind, even on error).

use sandbox_core::SetupStage;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::{Error, Result, RunContext, Stream, STDIN_BUFFER};

use crate::egress_link;
use crate::protocol::{self, Command, EndReason, Event, FrameBuffer, HostMessage, NetMode, Spec};
use crate::sys;

/// Extra time the host grants the helper past the deadline before killing it itself.
const BACKSTOP: Duration = Duration::from_secs(10);

/// Everything observed during one run.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Events from the helper, in order.
    pub events: Vec<Event>,
    /// Kept stdout.
    pub stdout: Vec<u8>,
    /// Kept stderr.
    pub stderr: Vec<u8>,
    /// stdout hit the output limit.
    pub stdout_truncated: bool,
    /// stderr hit the output limit.
    pub stderr_truncated: bool,
    /// The caller cancelled.
    pub cancelled: bool,
    /// The helper missed the deadline and the host killed it.
    pub backstop_killed: bool,
    /// A memory-pressure trigger watched the run.
    pub memory_watched: bool,
    /// The memory-pressure trigger fired: the run was ended as thrashing at its memory
    /// limit.
    pub thrashed: bool,
    /// Wall time of the whole run.
    pub duration: Duration,
    /// The helper, still to be reaped: the run is over once the tool's processes are gone
    /// and their output is drained, and the helper's own exit (namespace teardown) is
    /// waited for after the caller has its result. Dropping it kills and reaps the helper.
    pub helper: Option<HelperProcess>,
}

/// A helper process that may still be exiting; killed (if need be) and reaped on drop.
#[derive(Debug)]
pub struct HelperProcess {
    _helper: Helper,
}

/// The helper process; killed and reaped on drop unless already reaped.
#[derive(Debug)]
struct Helper {
    pid: libc::pid_t,
    reaped: bool,
}

impl Helper {
    fn reap(&mut self) {
        if !self.reaped {
            let _ = sys::wait4(self.pid, 0);
            self.reaped = true;
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            self.reap();
        }
    }
}

struct OutputStream {
    fd: OwnedFd,
    open: bool,
    kept: Vec<u8>,
    truncated: bool,
    which: Stream,
}

/// A helper that received its [`Spec`] and is building (or has built) the sandbox. Dropping
/// it kills the helper and everything in the sandbox.
pub struct Prepared {
    child: Helper,
    control: UnixStream,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stdin: OwnedFd,
    /// The host's end of the egress link, for runs under an allowlist.
    egress: Option<UnixStream>,
    /// The host's end of init's channel, for a live sandbox.
    live: Option<OwnedFd>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("pid", &self.child.pid)
            .finish()
    }
}

/// Spawns the helper and sends it the sandbox's shape. Returns at once; the helper builds
/// the sandbox in the background and waits for [`run`].
pub fn prepare(helper: &Path, spec: &Spec) -> Result<Prepared> {
    let (control, control_child) = UnixStream::pair().map_err(internal("control socket"))?;
    let (out_r, out_w) = sys::pipe().map_err(internal("stdout pipe"))?;
    let (err_r, err_w) = sys::pipe().map_err(internal("stderr pipe"))?;
    let (in_r, in_w) = sys::pipe().map_err(internal("stdin pipe"))?;
    let (egress, egress_child) = match spec.net() {
        NetMode::Egress => {
            let (host, child) = UnixStream::pair().map_err(internal("egress link"))?;
            (Some(host), Some(child))
        }
        _ => (None, None),
    };
    let (live, live_child) = match spec.live {
        true => {
            let (host, child) =
                crate::live::wire::packet_pair().map_err(internal("live channel"))?;
            (Some(host), Some(child))
        }
        false => (None, None),
    };
    let mut fds = vec![
        in_r.as_raw_fd(),
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        control_child.as_raw_fd(),
    ];
    fds.extend(egress_child.as_ref().map(|link| link.as_raw_fd()));
    if let Some(channel) = &live_child {
        // fd 4 is the egress link or, without one, a copy of the channel the helper
        // closes unused; fd 5 is the channel.
        if egress_child.is_none() {
            fds.push(channel.as_raw_fd());
        }
        fds.push(channel.as_raw_fd());
    }
    let pid = sys::spawn_with_fds(helper, &["strata-helper", "run"], &fds)
        .map_err(|e| Error::internal(format!("spawn helper {}", helper.display()), e))?;
    let prepared = Prepared {
        child: Helper { pid, reaped: false },
        control,
        stdout: out_r,
        stderr: err_r,
        stdin: in_w,
        egress,
        live,
    };
    drop((in_r, out_w, err_w, control_child, egress_child, live_child));
    let mut frame = Vec::new();
    protocol::write_frame(&mut frame, spec).map_err(internal("encode spec"))?;
    sys::send_all(prepared.control.as_raw_fd(), &frame).map_err(internal("send spec to helper"))?;
    Ok(prepared)
}

impl Prepared {
    /// The host's end of a live sandbox's init channel (once).
    pub fn take_live(&mut self) -> Option<OwnedFd> {
        self.live.take()
    }

    /// The helper's control socket (its reports).
    pub fn control_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.control.as_fd()
    }

    /// For a run under an allowlist: the listeners the helper created inside the sandbox's
    /// network namespace (see `egress_link`): the proxy's and one per transparent port in
    /// `ports`, waiting at most `timeout` for the helper to get that far. `Ok(None)`: the
    /// helper's setup failed first (the run then reports why) or the run has no egress link.
    pub fn take_egress_listeners(
        &mut self,
        timeout: Duration,
        ports: &[u16],
    ) -> Result<Option<egress_link::Listeners>> {
        match self.egress.take() {
            Some(link) => egress_link::receive_listeners(&link, timeout, ports).map_err(|e| {
                Error::setup(
                    SetupStage::Egress,
                    "receive the egress listeners from the helper",
                    e,
                )
            }),
            None => Ok(None),
        }
    }
}

fn internal(what: &str) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.to_string();
    move |e| Error::internal(what, e)
}

/// Watches the CPU time of the whole sandbox (a cgroup counter) against a limit.
pub struct CpuWatch<'a> {
    /// Reads the CPU time used so far, microseconds.
    pub usage_us: &'a dyn Fn() -> Option<u64>,
    /// The limit, microseconds.
    pub limit_us: u64,
}

/// A memory-pressure trigger of the run's cgroup ([`crate::cgroup::RunCgroup::memory_pressure_trigger`]):
/// when it fires the run is ended as the memory limit.
pub struct MemoryWatch<'a> {
    /// The trigger's descriptor (`POLLPRI` when it fires).
    pub trigger: &'a OwnedFd,
}

/// What the supervisor watches while the run goes, besides its output and the helper.
#[derive(Default)]
pub struct Watches<'a> {
    /// The run's CPU time against its limit.
    pub cpu: Option<CpuWatch<'a>>,
    /// The run's memory pressure.
    pub memory: Option<MemoryWatch<'a>>,
}

/// How often the CPU counter is read while a run is going.
const CPU_CHECK: Duration = Duration::from_millis(100);

/// Runs `command` in a prepared sandbox and returns what happened, as soon as the helper
/// reported the end of the run and both output streams are drained. The helper is handed
/// back in [`Outcome::helper`] to be reaped later (or reaped here, when the run ended
/// another way).
pub fn run(
    prepared: Prepared,
    command: &Command,
    timeout: Duration,
    stdin: Input<'_>,
    output_limit: u64,
    watches: Watches<'_>,
    ctx: &RunContext,
) -> Result<Outcome> {
    let Watches { cpu, memory } = watches;
    let start = Instant::now();
    let Prepared {
        mut child,
        control,
        stdout,
        stderr,
        stdin: in_w,
        egress: _,
        live: _,
    } = prepared;
    let (wake_r, wake_w) = sys::pipe().map_err(internal("wake pipe"))?;

    // Small stdin goes into the pipe buffer before the tool starts; the rest is streamed.
    sys::set_nonblocking(in_w.as_raw_fd()).map_err(internal("stdin pipe"))?;
    if !stdin.bytes.is_empty() {
        let want = stdin.bytes.len().min(1 << 20) as libc::c_int;
        let _ = sys::set_pipe_size(in_w.as_raw_fd(), want);
    }
    let mut feed = StdinFeed::new(in_w, stdin)?;
    feed.pump();

    let mut frame = Vec::new();
    protocol::write_frame(
        &mut frame,
        &HostMessage::Run {
            command: command.clone(),
        },
    )
    .map_err(internal("encode command"))?;
    sys::send_all(control.as_raw_fd(), &frame).map_err(internal("send command to helper"))?;

    let wake_w = Arc::new(wake_w);
    let waker = Arc::clone(&wake_w);
    let _registration = ctx.cancel.on_cancel(move || {
        let _ = sys::write(waker.as_raw_fd(), b"x");
    });

    for fd in [
        stdout.as_raw_fd(),
        stderr.as_raw_fd(),
        control.as_raw_fd(),
        wake_r.as_raw_fd(),
    ] {
        sys::set_nonblocking(fd).map_err(internal("nonblocking"))?;
    }
    let mut streams = [
        OutputStream {
            fd: stdout,
            open: true,
            kept: Vec::new(),
            truncated: false,
            which: Stream::Stdout,
        },
        OutputStream {
            fd: stderr,
            open: true,
            kept: Vec::new(),
            truncated: false,
            which: Stream::Stderr,
        },
    ];
    let mut outcome = Outcome {
        memory_watched: memory.is_some(),
        ..Outcome::default()
    };
    let mut events = FrameBuffer::default();
    let mut control_open = true;
    let mut exited = false;
    let mut kill_sent = false;
    let backstop = start + timeout + BACKSTOP;
    let mut buf = vec![0u8; 64 * 1024];
    let limit = usize::try_from(output_limit).unwrap_or(usize::MAX);

    let send_kill = |reason: EndReason| {
        let mut frame = Vec::new();
        if protocol::write_frame(&mut frame, &HostMessage::Kill { reason }).is_ok() {
            let _ = sys::send_all(control.as_raw_fd(), &frame);
        }
    };

    let mut finished = false;
    while control_open || streams.iter().any(|s| s.open) {
        if finished && streams.iter().all(|s| !s.open) {
            break; // the helper said the run is over and the output is drained
        }
        let now = Instant::now();
        if now >= backstop {
            // The helper ignored its own deadline: kill it; init dies with it (parent-death
            // signal) and the kernel tears the namespace down.
            let _ = sys::kill(child.pid, libc::SIGKILL);
            outcome.backstop_killed = true;
            break;
        }
        let mut wait = backstop - now;
        if cpu.is_some() && !kill_sent {
            wait = wait.min(CPU_CHECK);
        }
        let timeout = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX).max(1);
        let mut fds = [
            pollfd(
                streams[0].open.then(|| streams[0].fd.as_raw_fd()),
                libc::POLLIN,
            ),
            pollfd(
                streams[1].open.then(|| streams[1].fd.as_raw_fd()),
                libc::POLLIN,
            ),
            pollfd(control_open.then(|| control.as_raw_fd()), libc::POLLIN),
            feed.pipe_poll(),
            pollfd(Some(wake_r.as_raw_fd()), libc::POLLIN),
            feed.source_poll(),
            pollfd(
                memory
                    .as_ref()
                    .filter(|_| !kill_sent)
                    .map(|m| m.trigger.as_raw_fd()),
                libc::POLLPRI,
            ),
        ];
        sys::poll(&mut fds, timeout).map_err(internal("poll"))?;
        if fds[6].revents & libc::POLLPRI != 0 && !kill_sent {
            // Every task of the run stalled on memory (thrashing at the limit).
            send_kill(EndReason::Memory);
            kill_sent = true;
            outcome.thrashed = true;
        }
        if let Some(watch) = &cpu {
            if !kill_sent && (watch.usage_us)().is_some_and(|used| used >= watch.limit_us) {
                send_kill(EndReason::Cpu);
                kill_sent = true;
            }
        }

        if fds[2].revents != 0 {
            loop {
                match sys::read(control.as_raw_fd(), &mut buf) {
                    Ok(0) => {
                        control_open = false;
                        break;
                    }
                    Ok(n) => events.push(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        control_open = false;
                        break;
                    }
                }
            }
            while let Some(event) = events
                .next_frame::<Event>()
                .map_err(internal("helper protocol"))?
            {
                if matches!(
                    event,
                    Event::Exited { .. } | Event::SetupFailed { .. } | Event::ExecFailed { .. }
                ) {
                    exited = true;
                }
                finished |= matches!(event, Event::Exited { .. });
                outcome.events.push(event);
            }
        }
        for (i, stream) in streams.iter_mut().enumerate() {
            if fds[i].revents == 0 {
                continue;
            }
            loop {
                match sys::read(stream.fd.as_raw_fd(), &mut buf) {
                    Ok(0) => {
                        stream.open = false;
                        break;
                    }
                    Ok(n) => {
                        let room = limit.saturating_sub(stream.kept.len());
                        let keep = n.min(room);
                        if keep > 0 {
                            stream.kept.extend_from_slice(&buf[..keep]);
                            if let Some(sink) = &ctx.sink {
                                sink.on_output(stream.which, &buf[..keep]);
                            }
                        }
                        if keep < n && !stream.truncated {
                            stream.truncated = true;
                            if !kill_sent {
                                send_kill(EndReason::Output);
                                kill_sent = true;
                            }
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        stream.open = false;
                        break;
                    }
                }
            }
        }
        if exited {
            feed.stop();
        } else {
            feed.on_pipe(fds[3].revents);
            feed.on_source(fds[5].revents);
        }
        if fds[4].revents != 0 {
            let _ = sys::read(wake_r.as_raw_fd(), &mut buf);
            if ctx.cancel.is_cancelled() && !outcome.cancelled {
                outcome.cancelled = true;
                if !kill_sent {
                    send_kill(EndReason::Cancelled);
                    kill_sent = true;
                }
            }
        }
    }
    if control_open {
        outcome.helper = Some(HelperProcess { _helper: child });
    } else {
        child.reap();
    }
    let [out, err] = streams;
    outcome.stdout = out.kept;
    outcome.stdout_truncated = out.truncated;
    outcome.stderr = err.kept;
    outcome.stderr_truncated = err.truncated;
    outcome.duration = start.elapsed();
    Ok(outcome)
}

fn pollfd(fd: Option<std::os::fd::RawFd>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events,
        revents: 0,
    }
}

/// What the tool reads on its standard input: `bytes` first, then `stream` until its end
/// of file.
#[derive(Debug, Default)]
pub struct Input<'a> {
    /// Bytes written first (the caps' stdin), held by the caller.
    pub bytes: &'a [u8],
    /// A stream read after the bytes, at most [`STDIN_BUFFER`] bytes ahead of the tool. The
    /// run switches it to non-blocking until it ends, then restores it and closes it.
    pub stream: Option<OwnedFd>,
}

/// Feeds the tool's stdin pipe (non-blocking) from the caps' bytes, then from the stream,
/// reading the stream only when everything read before went into the pipe: back-pressure
/// with at most [`STDIN_BUFFER`] bytes held here.
struct StdinFeed<'a> {
    pipe: Option<OwnedFd>,
    bytes: &'a [u8],
    source: Option<sys::NonBlocking>,
    buf: Vec<u8>,
    /// Unwritten bytes are `buf[start..]`.
    start: usize,
}

impl<'a> StdinFeed<'a> {
    fn new(pipe: OwnedFd, input: Input<'a>) -> Result<Self> {
        let source = match input.stream {
            Some(fd) => Some(
                sys::NonBlocking::new(fd)
                    .map_err(|e| Error::invalid(format!("the stdin stream cannot be read: {e}")))?,
            ),
            None => None,
        };
        let mut feed = StdinFeed {
            pipe: Some(pipe),
            bytes: input.bytes,
            buf: Vec::with_capacity(if source.is_some() { STDIN_BUFFER } else { 0 }),
            source,
            start: 0,
        };
        feed.close_when_done();
        Ok(feed)
    }

    fn pending(&self) -> bool {
        !self.bytes.is_empty() || self.start < self.buf.len()
    }

    /// The pipe, watched for room while bytes are pending; otherwise only for its reader
    /// going away (POLLERR is always reported).
    fn pipe_poll(&self) -> libc::pollfd {
        let events = if self.pending() { libc::POLLOUT } else { 0 };
        pollfd(self.pipe.as_ref().map(AsRawFd::as_raw_fd), events)
    }

    /// The stream, watched only when everything read from it is in the pipe.
    fn source_poll(&self) -> libc::pollfd {
        let fd = self
            .source
            .as_ref()
            .filter(|_| self.pipe.is_some() && !self.pending())
            .map(AsRawFd::as_raw_fd);
        pollfd(fd, libc::POLLIN)
    }

    fn on_pipe(&mut self, revents: libc::c_short) {
        if revents & (libc::POLLERR | libc::POLLHUP) != 0 {
            // The tool closed its stdin or is gone: stop reading the stream.
            self.stop();
        } else if revents & libc::POLLOUT != 0 {
            self.pump();
        }
    }

    fn on_source(&mut self, revents: libc::c_short) {
        if revents == 0 || self.pending() {
            return;
        }
        let Some(source) = &self.source else { return };
        self.buf.resize(STDIN_BUFFER, 0);
        self.start = 0;
        let read = sys::read(source.as_raw_fd(), &mut self.buf);
        self.buf.truncate(match read {
            Ok(n) => n,
            Err(_) => 0,
        });
        match read {
            Ok(0) => self.source = None,
            Ok(_) => self.pump(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading the stdin stream failed; ending the tool's input");
                self.source = None;
            }
        }
        self.close_when_done();
    }

    /// Writes what is pending until the pipe is full.
    fn pump(&mut self) {
        let Some(pipe) = &self.pipe else { return };
        let fd = pipe.as_raw_fd();
        loop {
            let chunk = if !self.bytes.is_empty() {
                self.bytes
            } else if self.start < self.buf.len() {
                &self.buf[self.start..]
            } else {
                break;
            };
            match sys::write_no_sigpipe(fd, chunk) {
                Ok(n) if !self.bytes.is_empty() => self.bytes = &self.bytes[n..],
                Ok(n) => self.start += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                // EPIPE: the tool closed its stdin, which is not an error.
                Err(_) => {
                    self.stop();
                    return;
                }
            }
        }
        self.close_when_done();
    }

    /// Closes the tool's stdin once nothing is pending and the stream ended.
    fn close_when_done(&mut self) {
        if !self.pending() && self.source.is_none() {
            self.pipe = None;
        }
    }

    /// Stops feeding: closes the pipe, restores and closes the stream.
    fn stop(&mut self) {
        self.pipe = None;
        self.source = None;
        self.bytes = &[];
        self.buf = Vec::new();
        self.start = 0;
    }
}
