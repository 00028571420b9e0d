//! One run over a [`Carrier`]: wait for the agent, hand it the request, relay stdin and
//! output, give up at the wall clock (the caller then ends the carrier), and receive the
//! read-write grants back. Every message is worded from the carrier's [`Place`].

use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_core::{
    Error, ExitStatus, LimitKind, OutputSink, Result, RunContext, SetupStage, Stream,
};

use crate::carrier::Carrier;
use crate::place::Place;
use crate::protocol::{
    encode, AgentMsg, Applied, Decoder, GuestExit, GuestLimit, HostMsg, OutStream, RunRequest,
    CHUNK, PROTOCOL_VERSION,
};

/// How much longer than the tool's timeout the host waits for the agent's own report
/// before it switches the VM off.
pub const WALL_GRACE: Duration = Duration::from_millis(500);

/// How long the agent may take to send the read-write grants back after the tool ended.
pub const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// How the agent is greeted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Greeting {
    /// A freshly started agent: wait for its `ready`, then say hello.
    AwaitReady,
    /// An agent that already said `ready` (a VM restored from a snapshot taken after it):
    /// say hello at once.
    HelloNow,
}

/// Where a read-write grant's archive goes, and how large it may grow.
#[derive(Clone, Debug)]
pub struct ArchiveTarget {
    /// The index of the mount in the request.
    pub mount: u32,
    /// The file the tar stream is written to.
    pub path: PathBuf,
    /// Bytes accepted; more makes the archive fail.
    pub cap: u64,
}

/// A received archive: the file, or why it is unusable.
pub type Archive = std::result::Result<PathBuf, String>;

/// How an agent run ended, seen from the host.
#[derive(Debug)]
pub enum Ending {
    /// The agent reported.
    Agent(GuestExit),
    /// The host's deadline passed first (the caller ends the carrier).
    HostWall,
}

/// What came back from an agent run.
#[derive(Debug)]
pub struct AgentRun {
    /// How it ended.
    pub ending: Ending,
    /// Kept standard output.
    pub stdout: Vec<u8>,
    /// Kept standard error.
    pub stderr: Vec<u8>,
    /// Start (boot, restore, exec) to the agent's welcome.
    pub boot: Duration,
    /// The guest kernel release the agent reported.
    pub kernel: String,
    /// The read-write grants' archives, in the order of the targets given.
    pub archives: Vec<Archive>,
    /// The report file's contents, when the request named one.
    pub report: Option<Vec<u8>>,
    /// What the agent applied for the tool, as it read it back (`None`: it never said,
    /// e.g. the tool did not start).
    pub applied: Option<Applied>,
}

/// One run's parameters beyond the carrier itself.
pub struct RunPlan<'a> {
    /// Wait for the agent's `ready` or greet it at once.
    pub greeting: Greeting,
    /// Start (boot, restore, exec) to the agent's welcome.
    pub ready_timeout: Duration,
    /// What to run.
    pub request: RunRequest,
    /// The tool's stdin.
    pub stdin: &'a [u8],
    /// Where read-write grants come back.
    pub archives: Vec<ArchiveTarget>,
}

/// Waits for a freshly started agent's `ready` (until `deadline`; `timeout` is how long
/// that was, for the error).
///
/// # Errors
/// [`Error::Setup`] at [`SetupStage::AgentReady`] when the agent is not ready in time;
/// [`Error::Internal`] when it speaks another protocol version or says something else.
pub fn wait_ready(
    carrier: &mut dyn Carrier,
    deadline: Instant,
    timeout: Duration,
    ctx: &RunContext,
) -> Result<()> {
    let place = carrier.place();
    let mut chan = Channel::open(carrier)?;
    match chan.recv(carrier, deadline, ctx)? {
        Recv::Msg(AgentMsg::Ready { version, .. }) => check_version(place, version),
        Recv::Msg(other) => Err(unexpected(place, &other)),
        Recv::Deadline => Err(not_ready(carrier, timeout)),
    }
}

fn check_version(place: Place, version: u32) -> Result<()> {
    if version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(Error::Internal {
        message: place.say(format!(
            "{} speaks protocol {version}, host {PROTOCOL_VERSION} (rebuild the agent)",
            place.agent()
        )),
        source: None,
    })
}

fn not_ready(carrier: &mut dyn Carrier, timeout: Duration) -> Error {
    let place = carrier.place();
    Error::setup(
        SetupStage::AgentReady,
        place.say(format!(
            "{} was not ready within {} s",
            place.agent(),
            timeout.as_secs()
        )),
        std::io::Error::new(IoKind::TimedOut, carrier.diagnostics()),
    )
}

/// Runs `plan` over `carrier` (started at `started`, which the ready timeout counts from).
/// The carrier is left as it is: the caller ends it on every path.
///
/// # Errors
/// Setup errors of the channel and the agent's greeting, [`Error::Cancelled`] when `ctx`
/// is cancelled (the agent is told to kill the tool), [`Error::Internal`] for a broken
/// channel or protocol.
pub fn drive(
    carrier: &mut dyn Carrier,
    started: Instant,
    plan: RunPlan<'_>,
    ctx: &RunContext,
) -> Result<AgentRun> {
    let place = carrier.place();
    let RunPlan {
        greeting,
        ready_timeout,
        mut request,
        stdin,
        archives: targets,
    } = plan;
    let ready_deadline = started + ready_timeout;
    if greeting == Greeting::AwaitReady {
        wait_ready(carrier, ready_deadline, ready_timeout, ctx)?;
    }
    let mut chan = Channel::open(carrier)?;
    let kernel = chan.greet(carrier, ready_deadline, ready_timeout, ctx)?;
    let boot = started.elapsed();
    let timeout = Duration::from_millis(request.timeout_ms);
    let cap = request.output_cap;
    request.clock_unix_ns = unix_now_ns();
    chan.send(&HostMsg::Run(request))?;
    for chunk in stdin.chunks(CHUNK) {
        chan.send(&HostMsg::Stdin {
            data: chunk.to_vec(),
        })?;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _streaming = match &ctx.stdin {
        Some(source) => Some(StopOnDrop {
            stop: std::sync::Arc::clone(&stop),
            _thread: chan.stream_stdin(source.take()?, std::sync::Arc::clone(&stop))?,
        }),
        None => {
            chan.send(&HostMsg::StdinEnd)?;
            None
        }
    };
    let deadline = Instant::now() + timeout + WALL_GRACE;
    let mut out = Output::new(cap, ctx.sink.as_deref());
    let mut report = None;
    let mut applied = None;
    let ending = loop {
        match chan.recv(carrier, deadline, ctx)? {
            Recv::Msg(AgentMsg::Output { stream, data }) => out.push(stream, &data),
            Recv::Msg(AgentMsg::Report { data }) => report = Some(data),
            Recv::Msg(AgentMsg::Applied { applied: seen }) => applied = Some(seen),
            Recv::Msg(AgentMsg::Exit { status }) => break Ending::Agent(status),
            Recv::Msg(AgentMsg::Error { message }) => {
                return Err(Error::setup(
                    SetupStage::AgentRun,
                    place.say(format!("{} refused the run", place.agent())),
                    std::io::Error::other(message),
                ))
            }
            Recv::Msg(other) => return Err(unexpected(place, &other)),
            Recv::Deadline => break Ending::HostWall,
        }
    };
    let archives = match ending {
        Ending::Agent(_) if !targets.is_empty() => {
            receive_archives(&mut chan, carrier, &targets, ctx)?
        }
        _ => targets
            .iter()
            .map(|_| Err("the VM was switched off before the grant came back".to_string()))
            .collect(),
    };
    Ok(AgentRun {
        ending,
        stdout: out.stdout,
        stderr: out.stderr,
        boot,
        kernel,
        archives,
        report,
        applied,
    })
}

/// A live agent, set up and waiting for execs (see [`open_live`]).
#[derive(Debug)]
pub struct LiveOpened {
    /// The channel, blocking (no read timeout), for the caller's reader and writer.
    pub stream: UnixStream,
    /// Bytes received past the agent's [`AgentMsg::Applied`], to be decoded first.
    pub decoder: Decoder,
    /// The guest kernel release the agent reported.
    pub kernel: String,
    /// Start (boot, restore, exec) to the agent's welcome.
    pub boot: Duration,
    /// What the agent applied, as it read it back.
    pub applied: Applied,
}

/// Greets the agent on `carrier` (started at `started`) like a run, then hands it
/// `request` as a live sandbox ([`HostMsg::Live`], the host's clock set in it) and waits
/// for what it applied.
///
/// # Errors
/// As [`drive`] before the tool starts: the ready timeout, a version mismatch, the
/// agent's refusal (at [`SetupStage::AgentRun`]), a broken channel.
pub fn open_live(
    carrier: &mut dyn Carrier,
    started: Instant,
    greeting: Greeting,
    ready_timeout: Duration,
    mut request: RunRequest,
    ctx: &RunContext,
) -> Result<LiveOpened> {
    let place = carrier.place();
    let ready_deadline = started + ready_timeout;
    if greeting == Greeting::AwaitReady {
        wait_ready(carrier, ready_deadline, ready_timeout, ctx)?;
    }
    let mut chan = Channel::open(carrier)?;
    let kernel = chan.greet(carrier, ready_deadline, ready_timeout, ctx)?;
    let boot = started.elapsed();
    request.clock_unix_ns = unix_now_ns();
    chan.send(&HostMsg::Live(request))?;
    let applied = match chan.recv(carrier, Instant::now() + ready_timeout, ctx)? {
        Recv::Msg(AgentMsg::Applied { applied }) => applied,
        Recv::Msg(AgentMsg::Error { message }) => {
            return Err(Error::setup(
                SetupStage::AgentRun,
                place.say(format!("{} refused the live sandbox", place.agent())),
                std::io::Error::other(message),
            ))
        }
        Recv::Msg(other) => return Err(unexpected(place, &other)),
        Recv::Deadline => return Err(not_ready(carrier, ready_timeout)),
    };
    let Channel {
        stream, decoder, ..
    } = chan;
    stream
        .set_read_timeout(None)
        .map_err(|e| Error::setup(SetupStage::AgentChannel, place.say("agent channel"), e))?;
    Ok(LiveOpened {
        stream,
        decoder,
        kernel,
        boot,
        applied,
    })
}

/// The host's wall clock in nanoseconds since the Unix epoch (0 if it reads before it).
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .unwrap_or(0)
}

/// The argv an agent runs for a command, an `sh` script or a `python` script (`None` for
/// other tools, which each backend answers for itself).
///
/// # Errors
/// [`Error::InvalidRequest`] for an empty argv.
pub fn plain_argv(tool: &sandbox_core::Tool) -> Result<Option<Vec<String>>> {
    use sandbox_core::{ScriptLanguage, Tool};
    Ok(match tool {
        Tool::Command { argv } if argv.is_empty() => {
            return Err(Error::invalid("argv must not be empty"))
        }
        Tool::Command { argv } => Some(argv.clone()),
        Tool::Script {
            language: ScriptLanguage::Sh,
            source,
        } => Some(vec!["/bin/sh".into(), "-c".into(), source.clone()]),
        Tool::Script {
            language: ScriptLanguage::Python,
            source,
        } => Some(vec!["python3".into(), "-c".into(), source.clone()]),
        _ => None,
    })
}

/// The run's status and the limit it hit, from how it ended (`program`: the tool's
/// `argv[0]`, named when it could not start).
///
/// # Errors
/// [`Error::Cancelled`] for a run the host killed ([`HostMsg::Kill`]); [`Error::Exec`] when
/// the agent could not start the program.
pub fn exit_status(ending: &Ending, program: &str) -> Result<(ExitStatus, Option<LimitKind>)> {
    Ok(match ending {
        Ending::HostWall => (
            ExitStatus::Limit {
                limit: LimitKind::Wall,
                signal: None,
            },
            Some(LimitKind::Wall),
        ),
        Ending::Agent(GuestExit::Exited { code }) => (ExitStatus::Exited { code: *code }, None),
        Ending::Agent(GuestExit::Signaled { signal }) => {
            (ExitStatus::Signaled { signal: *signal }, None)
        }
        Ending::Agent(GuestExit::Limit { limit }) => {
            let limit = match limit {
                GuestLimit::Wall => LimitKind::Wall,
                GuestLimit::Output => LimitKind::Output,
                GuestLimit::Memory => LimitKind::Memory,
            };
            (
                ExitStatus::Limit {
                    limit,
                    signal: Some(9),
                },
                Some(limit),
            )
        }
        Ending::Agent(GuestExit::Killed) => return Err(Error::Cancelled),
        Ending::Agent(GuestExit::SpawnFailed { errno, .. }) => {
            return Err(Error::Exec {
                program: program.to_owned(),
                source: std::io::Error::from_raw_os_error(*errno),
            })
        }
    })
}

/// Receives every read-write grant's tar stream into its file, each capped.
fn receive_archives(
    chan: &mut Channel,
    carrier: &mut dyn Carrier,
    targets: &[ArchiveTarget],
    ctx: &RunContext,
) -> Result<Vec<Archive>> {
    let place = carrier.place();
    let mut files = Vec::new();
    for target in targets {
        let file = private_file(&target.path)
            .map_err(|e| Error::setup(SetupStage::Host, place.say("archive file"), e))?;
        files.push((file, 0u64, None::<String>, false));
    }
    let deadline = Instant::now() + ARCHIVE_TIMEOUT;
    let index_of = |mount: u32| targets.iter().position(|t| t.mount == mount);
    while files.iter().any(|f| !f.3) {
        match chan.recv(carrier, deadline, ctx)? {
            Recv::Msg(AgentMsg::Archive { mount, data }) => {
                let Some(i) = index_of(mount) else {
                    return Err(unexpected(place, &AgentMsg::Archive { mount, data }));
                };
                let (file, written, error, _) = &mut files[i];
                if error.is_some() {
                    continue;
                }
                *written += data.len() as u64;
                if *written > targets[i].cap {
                    *error = Some(format!(
                        "the archive exceeds {} bytes (the grant's disk size)",
                        targets[i].cap
                    ));
                } else if let Err(e) = file.write_all(&data) {
                    *error = Some(format!("writing the archive: {e}"));
                }
            }
            Recv::Msg(AgentMsg::ArchiveEnd { mount, error }) => {
                let Some(i) = index_of(mount) else {
                    return Err(unexpected(place, &AgentMsg::ArchiveEnd { mount, error }));
                };
                let slot = &mut files[i];
                if slot.2.is_none() {
                    slot.2 = error;
                }
                slot.3 = true;
            }
            Recv::Msg(other) => return Err(unexpected(place, &other)),
            Recv::Deadline => {
                for slot in files.iter_mut().filter(|f| !f.3) {
                    slot.2 = Some(format!(
                        "the grant did not come back within {} s",
                        ARCHIVE_TIMEOUT.as_secs()
                    ));
                    slot.3 = true;
                }
            }
        }
    }
    Ok(files
        .into_iter()
        .zip(targets)
        .map(|((_, _, error, _), target)| match error {
            None => Ok(target.path.clone()),
            Some(why) => Err(why),
        })
        .collect())
}

/// Creates `path` owner-only (0600), not following a symlink there, truncating what was
/// there (narrowed to 0600 too).
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

fn unexpected(place: Place, msg: &AgentMsg) -> Error {
    Error::Internal {
        message: place.say(format!(
            "unexpected message from {}: {msg:?}",
            place.agent()
        )),
        source: None,
    }
}

enum Recv {
    Msg(AgentMsg),
    Deadline,
}

/// The agent channel with its decoder.
struct Channel {
    place: Place,
    stream: UnixStream,
    /// Serializes frames written by this channel and by a stdin streaming thread.
    writer: std::sync::Arc<std::sync::Mutex<()>>,
    decoder: Decoder,
}

/// How often a blocked read wakes to check the deadline, cancellation and the VMM.
const POLL: Duration = Duration::from_millis(20);

impl Channel {
    fn open(carrier: &dyn Carrier) -> Result<Self> {
        let place = carrier.place();
        let failed = |e| Error::setup(SetupStage::AgentChannel, place.say("agent channel"), e);
        let stream = carrier.channel().map_err(failed)?;
        stream.set_read_timeout(Some(POLL)).map_err(failed)?;
        Ok(Channel {
            place,
            stream,
            writer: std::sync::Arc::default(),
            decoder: Decoder::new(),
        })
    }

    /// Says hello and takes the agent's welcome (by `deadline`); the guest kernel release.
    fn greet(
        &mut self,
        carrier: &mut dyn Carrier,
        deadline: Instant,
        ready_timeout: Duration,
        ctx: &RunContext,
    ) -> Result<String> {
        let place = self.place;
        self.send(&HostMsg::Hello {
            version: PROTOCOL_VERSION,
        })?;
        match self.recv(carrier, deadline, ctx)? {
            Recv::Msg(AgentMsg::Welcome { version, kernel }) => {
                check_version(place, version)?;
                Ok(kernel)
            }
            Recv::Msg(AgentMsg::Error { message }) => Err(Error::Internal {
                message: place.say(format!("{} refused the hello: {message}", place.agent())),
                source: None,
            }),
            Recv::Msg(other) => Err(unexpected(place, &other)),
            Recv::Deadline => Err(not_ready(carrier, ready_timeout)),
        }
    }

    fn send(&mut self, msg: &HostMsg) -> Result<()> {
        let place = self.place;
        write_frame(&mut self.stream, &self.writer, msg)
            .map_err(|e| Error::internal(place.say(format!("writing to {}", place.agent())), e))
    }

    /// Streams `source` to the agent as stdin chunks on a thread of its own, ending with
    /// `stdin_end`; the thread stops at end of input, on a write error, or when `stop` is
    /// set (polled every [`POLL`]).
    fn stream_stdin(
        &self,
        source: std::os::fd::OwnedFd,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<std::thread::JoinHandle<()>> {
        let place = self.place;
        let mut stream = self
            .stream
            .try_clone()
            .map_err(|e| Error::setup(SetupStage::AgentChannel, place.say("agent channel"), e))?;
        let writer = std::sync::Arc::clone(&self.writer);
        std::thread::Builder::new()
            .name("strata-agent-stdin".into())
            .spawn(move || {
                use std::sync::atomic::Ordering;
                let mut file = std::fs::File::from(source);
                let mut buf = vec![0u8; 64 * 1024];
                while !stop.load(Ordering::SeqCst) {
                    let mut fds = [rustix::event::PollFd::new(
                        &file,
                        rustix::event::PollFlags::IN,
                    )];
                    let timeout = rustix::event::Timespec {
                        tv_sec: 0,
                        tv_nsec: POLL.as_nanos() as _,
                    };
                    match rustix::event::poll(&mut fds, Some(&timeout)) {
                        Ok(0) => continue,
                        Ok(_) => {}
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(_) => break,
                    }
                    match file.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            let msg = HostMsg::Stdin {
                                data: buf[..n].to_vec(),
                            };
                            if write_frame(&mut stream, &writer, &msg).is_err() {
                                return;
                            }
                        }
                        Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::Interrupted) => {}
                        Err(_) => break,
                    }
                }
                let _ = write_frame(&mut stream, &writer, &HostMsg::StdinEnd);
            })
            .map_err(|e| Error::setup(SetupStage::Host, place.say("stdin thread"), e))
    }

    fn recv(
        &mut self,
        carrier: &mut dyn Carrier,
        deadline: Instant,
        ctx: &RunContext,
    ) -> Result<Recv> {
        let place = self.place;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.decoder.next_msg::<AgentMsg>() {
                Ok(Some(msg)) => return Ok(Recv::Msg(msg)),
                Ok(None) => {}
                Err(e) => {
                    return Err(Error::Internal {
                        message: place.say(format!("bad frame from {}: {e}", place.agent())),
                        source: None,
                    })
                }
            }
            if ctx.cancel.is_cancelled() {
                let _ = self.send(&HostMsg::Kill);
                return Err(Error::Cancelled);
            }
            if Instant::now() >= deadline {
                return Ok(Recv::Deadline);
            }
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(Error::Internal {
                        message: place.say(format!(
                            "{} ({})",
                            place.channel_closed(),
                            carrier.diagnostics()
                        )),
                        source: None,
                    })
                }
                Ok(n) => self.decoder.feed(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        IoKind::WouldBlock | IoKind::TimedOut | IoKind::Interrupted
                    ) =>
                {
                    if carrier.ended() {
                        return Err(Error::Internal {
                            message: place.say(format!(
                                "{} during the run ({})",
                                place.carrier_gone(),
                                carrier.diagnostics()
                            )),
                            source: None,
                        });
                    }
                }
                Err(e) => {
                    return Err(Error::internal(
                        place.say(format!("reading from {}", place.agent())),
                        e,
                    ))
                }
            }
        }
    }
}

/// Stops the stdin thread when the run is over. It is not joined: a write blocked on a
/// guest that stopped reading ends when the VM is switched off and the channel closes.
struct StopOnDrop {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    _thread: std::thread::JoinHandle<()>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Encodes `msg` and writes the frame whole while holding `lock`.
fn write_frame(
    stream: &mut UnixStream,
    lock: &std::sync::Mutex<()>,
    msg: &HostMsg,
) -> std::io::Result<()> {
    let frame = encode(msg).map_err(|e| std::io::Error::other(e.to_string()))?;
    let _guard = match lock.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    stream.write_all(&frame)
}

/// Output kept on the host, capped again here (the agent caps too).
struct Output<'a> {
    cap: u64,
    sink: Option<&'a dyn OutputSink>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl<'a> Output<'a> {
    fn new(cap: u64, sink: Option<&'a dyn OutputSink>) -> Self {
        Output {
            cap,
            sink,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    fn push(&mut self, stream: OutStream, data: &[u8]) {
        let (buf, which) = match stream {
            OutStream::Stdout => (&mut self.stdout, Stream::Stdout),
            OutStream::Stderr => (&mut self.stderr, Stream::Stderr),
        };
        let room = self.cap.saturating_sub(buf.len() as u64) as usize;
        let take = data.len().min(room);
        if take == 0 {
            return;
        }
        buf.extend_from_slice(&data[..take]);
        if let Some(sink) = self.sink {
            sink.on_output(which, &data[..take]);
        }
    }
}
