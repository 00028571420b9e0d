//! A live sandbox on the microVM backend: one VM that stays up while its agent starts one
//! exec after another ([`sandbox_agent::protocol::HostMsg::Live`]).
//!
//! [`LiveVm`] offers what the live supervisor needs of a sandbox, the same shape as the
//! process backend's `sandbox_os::live::LiveProcess`: exec with the caller's stdio
//! descriptors, signals, init-style events ([`LiveEvent`]) behind a pollable descriptor,
//! pause and resume (QMP `stop`/`cont`, the guest clock set again after), CPU time (the
//! VMM's), and stop. The descriptors stay on the host: a reader thread carries each exec's
//! output from the channel into its stdout and stderr, and one pump per exec carries its
//! stdin the other way, at most [`STDIN_WINDOW`] bytes ahead of what the guest wrote.
//!
//! A tty exec gets a terminal in the guest; the supervisor's terminal on the host is made
//! raw and carries its bytes both ways, and a resize is passed on ([`LiveVm::resized`]). A
//! published port's connection is a TCP connection the agent opens to the guest port; the
//! supervisor gets one end of a socket pair whose other end is carried over the channel,
//! with a [`Window`] each way.
//!
//! Files go through the agent too ([`crate::live_files`]); not yet on this backend (typed
//! refusals): watches and file grants.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use sandbox_agent::driver::{unix_now_ns, LiveOpened};
use sandbox_agent::protocol::{
    encode, AgentMsg, Decoder, HostMsg, LiveExec, OutStream, TermSize, CONN_WINDOW,
};
use sandbox_agent::window::Window;
use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{Error, Receipt, Result, SetupStage};
use sandbox_os::live::{LiveCommand, LiveEvent, PauseMethod};
use sandbox_os::private::PrivateDir;

use crate::vmm::{NetRelay, VmInstance};

/// Stdin bytes of one exec sent to the guest and not yet written there, at most.
pub const STDIN_WINDOW: u64 = 256 * 1024;

/// Stdin travels in chunks of at most this many bytes.
const STDIN_CHUNK: usize = 64 * 1024;

/// How often a stdin pump blocked on its descriptor looks whether its exec ended.
const PUMP_POLL: Duration = Duration::from_millis(200);

/// A live microVM sandbox. See the module docs. Dropping it switches the VM off.
pub struct LiveVm {
    vm: Box<dyn VmInstance>,
    writer: Arc<Mutex<UnixStream>>,
    shared: Arc<Shared>,
    events: OwnedFd,
    ended: OwnedFd,
    reader: Option<JoinHandle<()>>,
    receipt: Receipt,
    env: Vec<String>,
    workdir: PathBuf,
    paused: bool,
    vmm_pid: Option<u32>,
    egress: Option<sandbox_os::RunEgress>,
    writable: Vec<crate::grants::WritableGrant>,
    /// The VM's files (sockets, disks, archives); removed when the sandbox is dropped.
    dir: PrivateDir,
}

impl std::fmt::Debug for LiveVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveVm")
            .field("vmm_pid", &self.vmm_pid)
            .field("paused", &self.paused)
            .finish_non_exhaustive()
    }
}

/// What the reader thread, the stdin pumps and the sandbox share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when stdin was taken or an exec ended (pumps wait on it).
    changed: Condvar,
    /// Connection bytes sent to the guest and not yet written there.
    conn_window: Window,
    /// Answers of file operations.
    answers: Arc<crate::live_files::Answers>,
    /// The next file operation's id (shared by every files handle).
    file_ids: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            state: Mutex::default(),
            changed: Condvar::new(),
            conn_window: Window::new(CONN_WINDOW),
            answers: Arc::default(),
            file_ids: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        }
    }
}

#[derive(Default)]
struct State {
    /// Events not yet taken (with the descriptor a connection's carries); one byte per
    /// event is in the events pipe.
    queue: VecDeque<(LiveEvent, Option<OwnedFd>)>,
    /// Connections asked for and not yet answered: the supervisor's end and ours.
    connecting: HashMap<u64, (UnixStream, UnixStream)>,
    /// Open connections: the queue of the guest's bytes to our end's writer.
    conns: HashMap<u64, std::sync::mpsc::SyncSender<Vec<u8>>>,
    /// The host ends of each exec's output streams.
    outs: HashMap<(u64, Stream), Arc<File>>,
    /// The program of each exec not yet started, for its failure event.
    programs: HashMap<u64, String>,
    /// Stdin bytes in flight per exec.
    in_flight: HashMap<u64, u64>,
    /// Execs that ended (their pumps stop).
    finished: HashSet<u64>,
    /// The channel closed: the agent (or the VM) is gone.
    gone: bool,
    /// Read-write grants coming back at the end, by mount index.
    archives: HashMap<u32, ArchiveIn>,
}

/// One read-write grant's tree coming back from the guest (a tar stream into a file).
struct ArchiveIn {
    path: PathBuf,
    cap: u64,
    file: Option<File>,
    written: u64,
    failed: Option<String>,
    done: Option<std::result::Result<PathBuf, String>>,
}

impl ArchiveIn {
    fn push(&mut self, data: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        self.written += data.len() as u64;
        if self.written > self.cap {
            self.failed = Some(format!("the archive passed its {} bytes", self.cap));
            self.file = None;
            return;
        }
        if self.file.is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&self.path)
            {
                Ok(file) => self.file = Some(file),
                Err(e) => {
                    self.failed = Some(format!("write {}: {e}", self.path.display()));
                    return;
                }
            }
        }
        if let Some(file) = self.file.as_mut() {
            if let Err(e) = file.write_all(data) {
                self.failed = Some(format!("write {}: {e}", self.path.display()));
                self.file = None;
            }
        }
    }

    fn end(&mut self, error: Option<String>) {
        if let Some(file) = self.file.take() {
            if let Err(e) = file.sync_all() {
                self.failed
                    .get_or_insert(format!("write {}: {e}", self.path.display()));
            }
        }
        self.done = Some(match (error, self.failed.take()) {
            (Some(why), _) => Err(format!("the guest could not archive it: {why}")),
            (None, Some(why)) => Err(why),
            (None, None) if self.written == 0 => Err("the guest sent an empty archive".into()),
            (None, None) => Ok(self.path.clone()),
        });
    }
}

/// [`OutStream`] as a map key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stream {
    Out,
    Err,
}

impl From<OutStream> for Stream {
    fn from(stream: OutStream) -> Self {
        match stream {
            OutStream::Stdout => Stream::Out,
            OutStream::Stderr => Stream::Err,
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What [`LiveVm::new`] takes besides the VM and its opened agent.
pub(crate) struct LiveParts {
    pub(crate) receipt: Receipt,
    pub(crate) env: Vec<String>,
    pub(crate) workdir: PathBuf,
    pub(crate) egress: Option<sandbox_os::RunEgress>,
    pub(crate) dir: PrivateDir,
    /// The read-write grants, written back from the guest when the sandbox stops.
    pub(crate) writable: Vec<crate::grants::WritableGrant>,
}

impl LiveVm {
    /// Takes over `vm`, whose agent was opened for a live sandbox, and starts the reader.
    pub(crate) fn new(
        vm: Box<dyn VmInstance>,
        opened: LiveOpened,
        parts: LiveParts,
    ) -> Result<Self> {
        let failed = |e: std::io::Error| Error::setup(SetupStage::Host, "microvm live: channel", e);
        let (events, events_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed(e.into()))?;
        let (ended, ended_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| failed(e.into()))?;
        let writer = Arc::new(Mutex::new(opened.stream.try_clone().map_err(failed)?));
        let shared = Arc::new(Shared::default());
        let reader = {
            let shared = Arc::clone(&shared);
            let writer = Arc::clone(&writer);
            let stream = opened.stream;
            let decoder = opened.decoder;
            thread::Builder::new()
                .name("strata-live-vm".into())
                .spawn(move || {
                    read_agent(stream, decoder, &shared, &File::from(events_w), &writer);
                    drop(ended_w);
                })
                .map_err(failed)?
        };
        let vmm_pid = vm.pid();
        Ok(LiveVm {
            vm,
            writer,
            shared,
            events,
            ended,
            reader: Some(reader),
            receipt: parts.receipt,
            env: parts.env,
            workdir: parts.workdir,
            paused: false,
            vmm_pid,
            egress: parts.egress,
            writable: parts.writable,
            dir: parts.dir,
        })
    }

    /// The sandbox's receipt: what was enforced when it started, for all its execs.
    pub fn receipt(&self) -> &Receipt {
        &self.receipt
    }

    /// The environment every exec starts from (`KEY=VALUE`).
    pub fn base_env(&self) -> &[String] {
        &self.env
    }

    /// The default working directory of an exec.
    pub fn workdir(&self) -> &Path {
        &self.workdir
    }

    /// Starts `command` in `workdir` with `stdio` (stdin, stdout, stderr; they stay on the
    /// host, their bytes are carried over the channel); the answer is a
    /// [`LiveEvent::Started`] or [`LiveEvent::ExecFailed`] with `id`. With `tty`, stdin is
    /// the supervisor's terminal: the exec gets a terminal of its size in the guest.
    ///
    /// # Errors
    /// A descriptor cannot be copied, the terminal cannot be made raw, or the VM is gone.
    pub fn exec(
        &self,
        id: u64,
        command: LiveCommand,
        workdir: PathBuf,
        stdio: [BorrowedFd<'_>; 3],
        tty: bool,
    ) -> Result<()> {
        let copy = |fd: BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|e| Error::setup(SetupStage::Processes, "microvm live: copy stdio", e))
        };
        let [stdin, stdout, stderr] = stdio;
        let (stdin, stdout, stderr) = (copy(stdin)?, copy(stdout)?, copy(stderr)?);
        let tty = if tty {
            Some(raw_terminal(&stdin)?)
        } else {
            None
        };
        let mut argv = command.argv;
        match argv.first_mut() {
            Some(first) => first.clone_from(&command.program),
            None => argv.push(command.program.clone()),
        }
        let env = command
            .env
            .iter()
            .filter_map(|entry| entry.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        {
            let mut state = self.shared.lock();
            if state.gone {
                return Err(gone());
            }
            state
                .outs
                .insert((id, Stream::Out), Arc::new(File::from(stdout)));
            state
                .outs
                .insert((id, Stream::Err), Arc::new(File::from(stderr)));
            state.programs.insert(id, command.program);
        }
        let exec = LiveExec {
            id,
            argv,
            env,
            cwd: workdir.to_string_lossy().into_owned(),
            tty,
        };
        if let Err(error) = self.send(&HostMsg::Exec(exec)) {
            let mut state = self.shared.lock();
            state.outs.retain(|(exec, _), _| *exec != id);
            state.programs.remove(&id);
            return Err(error);
        }
        let (writer, shared) = (Arc::clone(&self.writer), Arc::clone(&self.shared));
        thread::Builder::new()
            .name("strata-live-vm-stdin".into())
            .spawn(move || pump_stdin(id, File::from(stdin), &writer, &shared))
            .map_err(|e| Error::setup(SetupStage::Processes, "microvm live: stdin pump", e))?;
        Ok(())
    }

    /// Passes a resize of a tty exec's terminal (the supervisor resized its own) on to the
    /// guest's.
    ///
    /// # Errors
    /// The VM is gone.
    pub fn resized(&self, pid: i32, rows: u16, cols: u16) -> Result<()> {
        self.send(&HostMsg::Resize { pid, rows, cols })
    }

    /// Asks the agent for a TCP connection to `127.0.0.1:port` in the guest; the answer is
    /// a [`LiveEvent::Connecting`] with the supervisor's end of the connection (a connected
    /// socket) or [`LiveEvent::ConnectFailed`] with `id`.
    ///
    /// # Errors
    /// No socket pair could be made, or the VM is gone.
    pub fn connect(&self, id: u64, port: u16) -> Result<()> {
        let pair = UnixStream::pair()
            .map_err(|e| Error::internal("microvm live: a connection's socket pair", e))?;
        self.shared.lock().connecting.insert(id, pair);
        let sent = self.send(&HostMsg::Connect { id, port });
        if sent.is_err() {
            self.shared.lock().connecting.remove(&id);
        }
        sent
    }

    /// A handle on the guest's files (see [`crate::live_files`]), usable without holding
    /// the sandbox.
    pub fn files(&self) -> crate::live_files::VmFiles {
        let shared = Arc::clone(&self.shared);
        crate::live_files::VmFiles {
            writer: Arc::clone(&self.writer),
            answers: Arc::clone(&self.shared.answers),
            next: Arc::clone(&self.shared.file_ids),
            gone: Arc::new(move || shared.lock().gone),
        }
    }

    /// Sends `signal` to exec `pid`'s process group in the guest.
    ///
    /// # Errors
    /// The VM is gone.
    pub fn signal(&self, pid: i32, signal: i32) -> Result<()> {
        self.send(&HostMsg::Signal { pid, signal })
    }

    /// The descriptor that is readable when an event waits ([`LiveVm::next_event`]), and at
    /// end of file once the agent is gone.
    pub fn events(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// The next event; `Ok(None)` once the agent is gone (the sandbox ended). Call it when
    /// [`LiveVm::events`] is readable (it blocks otherwise).
    ///
    /// # Errors
    /// The events pipe failed.
    pub fn next_event(&self) -> Result<Option<(LiveEvent, Option<OwnedFd>)>> {
        let mut byte = [0u8; 1];
        let read = rustix::io::read(&self.events, &mut byte)
            .map_err(|e| Error::internal("read the live VM's events", e.into()))?;
        let _ = read;
        Ok(self.shared.lock().queue.pop_front())
    }

    /// Readable (end of file) once the agent's channel closed: the VM or its agent is gone.
    pub fn gone_events(&self) -> BorrowedFd<'_> {
        self.ended.as_fd()
    }

    /// Whether the sandbox has ended (its agent's channel closed).
    pub fn ended(&self) -> bool {
        self.shared.lock().gone
    }

    /// Stops the VM's vCPUs (QMP `stop`): nothing in the guest runs, its clock stands still,
    /// its RAM is kept.
    ///
    /// # Errors
    /// The VMM did not stop the VM.
    pub fn pause(&mut self) -> Result<PauseMethod> {
        if !self.paused {
            self.vm.set_running(false)?;
            self.paused = true;
        }
        Ok(PauseMethod::Vm)
    }

    /// Continues a paused VM and sets its clock to the host's.
    ///
    /// # Errors
    /// The VMM did not continue the VM.
    pub fn resume(&mut self) -> Result<()> {
        if self.paused {
            self.vm.set_running(true)?;
            self.paused = false;
            self.send(&HostMsg::SetClock {
                unix_ns: unix_now_ns(),
            })?;
        }
        Ok(())
    }

    /// Whether the VM is paused.
    pub fn paused(&self) -> Option<PauseMethod> {
        self.paused.then_some(PauseMethod::Vm)
    }

    /// CPU time the VMM used so far (every vCPU and QEMU itself), from `/proc`.
    pub fn cpu_usage_us(&self) -> Option<u64> {
        vmm_cpu_us(self.vmm_pid?)
    }

    /// The VMM's process id.
    pub fn vmm_pid(&self) -> Option<u32> {
        self.vmm_pid
    }

    /// Ends the sandbox now: the channel closes (the agent kills every exec), the VM is
    /// switched off and its files removed. Returns the egress decisions of its life, when
    /// it had an allowlist.
    pub fn stop(mut self) -> Option<(NetworkReceipt, Vec<Denial>)> {
        self.write_back();
        self.shutdown();
        self.egress.take().map(|egress| {
            egress.finish_as(format!(
                "{} in the guest -> the host's egress proxy",
                NetRelay::GUEST_PROXY
            ))
        })
    }

    /// Brings the read-write grants back: the agent kills every process and sends each
    /// grant's tree, which is applied to the host directory through the grants' filter
    /// ([`crate::grants::apply`]). Returns one line per grant saying what came of it (also
    /// logged); a second call (and [`LiveVm::stop`] after it) has nothing left to bring.
    /// Every process in the VM is gone afterwards: call it only to end the sandbox.
    pub fn write_back(&mut self) -> Vec<String> {
        let writable = std::mem::take(&mut self.writable);
        if writable.is_empty() {
            return Vec::new();
        }
        {
            let mut state = self.shared.lock();
            for grant in &writable {
                state.archives.insert(
                    grant.mount,
                    ArchiveIn {
                        path: self
                            .dir
                            .path()
                            .join(format!("live-archive{}.tar", grant.mount)),
                        cap: grant.image_size + (16 << 20),
                        file: None,
                        written: 0,
                        failed: None,
                        done: None,
                    },
                );
            }
        }
        if self.paused {
            let _ = self.resume();
        }
        let asked = self.send(&HostMsg::Finish).is_ok();
        let deadline = std::time::Instant::now() + sandbox_agent::driver::ARCHIVE_TIMEOUT;
        let mut state = self.shared.lock();
        while asked
            && !state.gone
            && std::time::Instant::now() < deadline
            && state.archives.values().any(|a| a.done.is_none())
        {
            state = self
                .shared
                .changed
                .wait_timeout(state, PUMP_POLL)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        let results: Vec<_> = writable
            .iter()
            .map(|grant| {
                state
                    .archives
                    .get_mut(&grant.mount)
                    .and_then(|a| a.done.take())
                    .unwrap_or_else(|| Err("the guest did not send it back in time".into()))
            })
            .collect();
        drop(state);
        let mut lines = Vec::new();
        for (grant, result) in writable.iter().zip(results) {
            let applied = result.and_then(|archive| {
                crate::grants::apply(grant, &archive)
                    .map_err(|e| format!("the archive is malformed: {e}"))
            });
            let host = grant.host.display();
            let line = match applied {
                Ok(applied) if applied.refused.is_empty() => format!(
                    "{host} written back ({} written, {} deleted)",
                    applied.written, applied.deleted
                ),
                Ok(applied) => format!(
                    "{host} written back ({} written, {} deleted), refused: {}",
                    applied.written,
                    applied.deleted,
                    applied.refused.join(", ")
                ),
                Err(why) => format!("{host} was not written back: {why}"),
            };
            tracing::info!("live microVM: {line}");
            lines.push(line);
        }
        lines
    }

    fn shutdown(&mut self) {
        if let Ok(stream) = self.writer.lock() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        self.vm.teardown();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }

    fn send(&self, msg: &HostMsg) -> Result<()> {
        send_frame(&self.writer, msg)
    }
}

impl Drop for LiveVm {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn gone() -> Error {
    Error::internal(
        "the live microVM sandbox",
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "the VM or its agent is gone",
        ),
    )
}

pub(crate) fn send_frame(writer: &Mutex<UnixStream>, msg: &HostMsg) -> Result<()> {
    let frame = encode(msg).map_err(|e| Error::invalid(format!("live exec: {e}")))?;
    let mut stream = writer.lock().unwrap_or_else(|e| e.into_inner());
    stream.write_all(&frame).map_err(|_| gone())
}

/// Reads the agent's messages until the channel closes; queues events (a byte each in
/// `events`) and writes output to the execs' descriptors.
fn read_agent(
    mut stream: UnixStream,
    mut decoder: Decoder,
    shared: &Arc<Shared>,
    events: &File,
    writer: &Arc<Mutex<UnixStream>>,
) {
    let push_with = |event: LiveEvent, fd: Option<OwnedFd>| {
        shared.lock().queue.push_back((event, fd));
        let _ = (&*events).write_all(b"e");
    };
    let push = |event: LiveEvent| push_with(event, None);
    let mut buf = vec![0u8; 64 * 1024];
    'read: loop {
        loop {
            let msg = match decoder.next_msg::<AgentMsg>() {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("live microVM agent: {e}");
                    break 'read;
                }
            };
            match msg {
                AgentMsg::Started { id, pid } => {
                    shared.lock().programs.remove(&id);
                    push(LiveEvent::Started { id, pid });
                }
                AgentMsg::ExecFailed { id, errno } => {
                    let program = {
                        let mut state = shared.lock();
                        state.outs.retain(|(exec, _), _| *exec != id);
                        state.finished.insert(id);
                        state.programs.remove(&id).unwrap_or_default()
                    };
                    shared.changed.notify_all();
                    push(LiveEvent::ExecFailed { id, program, errno });
                }
                AgentMsg::ExecOutput { id, stream, data } => {
                    let out = shared.lock().outs.get(&(id, stream.into())).cloned();
                    if let Some(out) = out {
                        // A reader that went away loses the output, not the sandbox.
                        let _ = (&*out).write_all(&data);
                    }
                }
                AgentMsg::OutputEnd { id, stream } => {
                    shared.lock().outs.remove(&(id, stream.into()));
                }
                AgentMsg::InputTaken { id, bytes } => {
                    if let Some(n) = shared.lock().in_flight.get_mut(&id) {
                        *n = n.saturating_sub(bytes);
                    }
                    shared.changed.notify_all();
                }
                AgentMsg::Ended {
                    id,
                    pid,
                    wait_status,
                } => {
                    shared.lock().finished.insert(id);
                    shared.changed.notify_all();
                    push(LiveEvent::Exited { pid, wait_status });
                }
                AgentMsg::Connected { id } => {
                    let pair = shared.lock().connecting.remove(&id);
                    if let Some((theirs, ours)) = pair {
                        carry_connection(id, ours, shared, writer);
                        push_with(LiveEvent::Connecting { id }, Some(OwnedFd::from(theirs)));
                    }
                }
                AgentMsg::ConnectFailed { id, errno } => {
                    shared.lock().connecting.remove(&id);
                    push(LiveEvent::ConnectFailed { id, errno });
                }
                AgentMsg::ConnData { id, data } => {
                    let queue = shared.lock().conns.get(&id).cloned();
                    match queue {
                        Some(queue) => {
                            let bytes = data.len() as u64;
                            if queue.send(data).is_err() {
                                let _ = send_frame(writer, &HostMsg::ConnTaken { id, bytes });
                            }
                        }
                        // Gone on our side: taken, so the agent does not wait for it.
                        None => {
                            let bytes = data.len() as u64;
                            let _ = send_frame(writer, &HostMsg::ConnTaken { id, bytes });
                        }
                    }
                }
                AgentMsg::ConnEnd { id } => {
                    shared.lock().conns.remove(&id);
                }
                AgentMsg::ConnTaken { id, bytes } => shared.conn_window.give_back(id, bytes),
                AgentMsg::FileDone { id, result } => shared.answers.answer(id, result),
                AgentMsg::Archive { mount, data } => {
                    if let Some(archive) = shared.lock().archives.get_mut(&mount) {
                        archive.push(&data);
                    }
                }
                AgentMsg::ArchiveEnd { mount, error } => {
                    if let Some(archive) = shared.lock().archives.get_mut(&mount) {
                        archive.end(error);
                    }
                    shared.changed.notify_all();
                }
                AgentMsg::Error { message } => {
                    tracing::warn!("live microVM agent: {message}");
                }
                other => tracing::warn!("live microVM agent sent {other:?} out of place"),
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => decoder.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let mut state = shared.lock();
    state.gone = true;
    // The host ends close: every reader of an exec's output sees end of file, every
    // connection ends.
    state.outs.clear();
    state.conns.clear();
    state.connecting.clear();
    drop(state);
    shared.changed.notify_all();
    shared.conn_window.wake();
    shared.answers.wake();
}

/// Carries connection `id` between `ours` (the other end is the supervisor's) and the
/// agent: a writer thread delivers the guest's bytes (acknowledging each chunk, delivered
/// or not), a pump sends what the supervisor writes within the window, then half-closes.
fn carry_connection(
    id: u64,
    ours: UnixStream,
    shared: &Arc<Shared>,
    writer: &Arc<Mutex<UnixStream>>,
) {
    let (Ok(mut deliver), Ok(mut source)) = (ours.try_clone(), ours.try_clone()) else {
        let _ = send_frame(writer, &HostMsg::ConnEnd { id });
        return;
    };
    let (queue, queued) = std::sync::mpsc::sync_channel::<Vec<u8>>(64);
    shared.lock().conns.insert(id, queue);
    {
        let writer = Arc::clone(writer);
        let spawned = thread::Builder::new()
            .name("strata-live-vm-conn".into())
            .spawn(move || {
                for chunk in queued {
                    let _ = deliver.write_all(&chunk);
                    let bytes = chunk.len() as u64;
                    if send_frame(&writer, &HostMsg::ConnTaken { id, bytes }).is_err() {
                        break;
                    }
                }
                let _ = deliver.shutdown(std::net::Shutdown::Write);
            });
        if spawned.is_err() {
            shared.lock().conns.remove(&id);
        }
    }
    let (writer, shared) = (Arc::clone(writer), Arc::clone(shared));
    let _ = thread::Builder::new()
        .name("strata-live-vm-conn".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match source.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if !shared.conn_window.take(id, n as u64, || shared.lock().gone) {
                    break;
                }
                let data = buf[..n].to_vec();
                if send_frame(&writer, &HostMsg::ConnData { id, data }).is_err() {
                    break;
                }
            }
            let _ = send_frame(&writer, &HostMsg::ConnEnd { id });
            shared.conn_window.forget(id);
            drop(ours);
        });
}

/// Makes the supervisor's terminal (`slave`) raw, so the guest terminal's bytes pass
/// unchanged, and returns its size.
fn raw_terminal(slave: &OwnedFd) -> Result<TermSize> {
    let failed = |e: rustix::io::Errno| {
        Error::setup(
            SetupStage::Processes,
            "microvm live: the exec's terminal",
            e.into(),
        )
    };
    let mut termios = rustix::termios::tcgetattr(slave).map_err(failed)?;
    termios.make_raw();
    rustix::termios::tcsetattr(slave, rustix::termios::OptionalActions::Now, &termios)
        .map_err(failed)?;
    let size = rustix::termios::tcgetwinsize(slave).map_err(failed)?;
    Ok(TermSize {
        rows: size.ws_row,
        cols: size.ws_col,
    })
}

/// Carries exec `id`'s stdin from `source` to the guest, at most [`STDIN_WINDOW`] bytes
/// ahead of what the guest wrote; ends with an end-of-input message at end of file, and
/// quietly once the exec ended or the VM is gone.
fn pump_stdin(id: u64, source: File, writer: &Mutex<UnixStream>, shared: &Shared) {
    let mut buf = vec![0u8; STDIN_CHUNK];
    let over = |state: &State| state.gone || state.finished.contains(&id);
    loop {
        // Wait for data without missing the exec's end.
        let mut fds = [rustix::event::PollFd::new(
            &source,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: PUMP_POLL.as_nanos() as i64,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) => {
                if over(&shared.lock()) {
                    break;
                }
                continue;
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        }
        let n = match (&source).read(&mut buf) {
            Ok(0) => {
                let _ = send_frame(writer, &HostMsg::InputEnd { id });
                break;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut state = shared.lock();
        while !over(&state) && state.in_flight.get(&id).copied().unwrap_or(0) >= STDIN_WINDOW {
            state = shared
                .changed
                .wait_timeout(state, PUMP_POLL)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        if over(&state) {
            break;
        }
        *state.in_flight.entry(id).or_insert(0) += n as u64;
        drop(state);
        let data = buf[..n].to_vec();
        if send_frame(writer, &HostMsg::Input { id, data }).is_err() {
            break;
        }
    }
    let mut state = shared.lock();
    state.in_flight.remove(&id);
}

/// User and system CPU time of process `pid`, in microseconds (`/proc/PID/stat`).
fn vmm_cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second();
    Some((utime + stime) * 1_000_000 / ticks.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_from_proc_and_a_missing_process_has_none() {
        assert!(vmm_cpu_us(std::process::id()).is_some());
        assert_eq!(vmm_cpu_us(u32::MAX), None);
    }
}
