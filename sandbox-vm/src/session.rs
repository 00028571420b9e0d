//! One run in one freshly booted VM: boot, wait for the agent, hand it the request, relay
//! output, enforce the wall clock by switching the VM off, and tear everything down.

use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use sandbox_core::{Error, OutputSink, Result, RunContext, Stream};

use crate::protocol::{
    encode, AgentMsg, Decoder, GuestExit, HostMsg, OutStream, RunRequest, CHUNK, PROTOCOL_VERSION,
};
use crate::vmm::{VmConfig, VmInstance, Vmm};

/// How much longer than the tool's timeout the host waits for the agent's own report
/// before it switches the VM off.
pub const WALL_GRACE: Duration = Duration::from_millis(500);

/// How a VM run ended, seen from the host.
#[derive(Debug)]
pub enum Ending {
    /// The agent reported.
    Agent(GuestExit),
    /// The host's deadline passed and the VM was switched off.
    HostWall,
}

/// What came back from a VM run.
#[derive(Debug)]
pub struct VmRun {
    /// How it ended.
    pub ending: Ending,
    /// Kept standard output.
    pub stdout: Vec<u8>,
    /// Kept standard error.
    pub stderr: Vec<u8>,
    /// Boot to agent ready.
    pub boot: Duration,
    /// The guest kernel release the agent reported.
    pub kernel: String,
}

/// Boots `config` on `vmm`, runs `request` with `stdin`, returns what happened. The VM is
/// shut down and reaped on every path (the instance's drop kills it on panic).
pub fn run(
    vmm: &dyn Vmm,
    config: &VmConfig,
    ready_timeout: Duration,
    request: RunRequest,
    stdin: &[u8],
    ctx: &RunContext,
) -> Result<VmRun> {
    let started = Instant::now();
    let mut vm = vmm.start(config)?;
    let result = drive(vm.as_mut(), started, ready_timeout, request, stdin, ctx);
    vm.shutdown();
    result
}

fn drive(
    vm: &mut dyn VmInstance,
    started: Instant,
    ready_timeout: Duration,
    request: RunRequest,
    stdin: &[u8],
    ctx: &RunContext,
) -> Result<VmRun> {
    let mut chan = Channel::new(
        vm.agent()
            .map_err(|e| Error::setup("microvm: agent channel", e))?,
    )?;
    let ready_deadline = started + ready_timeout;
    let kernel = match chan.recv(vm, ready_deadline, ctx)? {
        Recv::Msg(AgentMsg::Ready { version, kernel }) => {
            if version != PROTOCOL_VERSION {
                return Err(Error::Internal {
                    message: format!(
                        "microvm: guest agent speaks protocol {version}, host {PROTOCOL_VERSION} (rebuild the agent)"
                    ),
                    source: None,
                });
            }
            kernel
        }
        Recv::Msg(other) => return Err(unexpected(&other)),
        Recv::Deadline => {
            return Err(Error::setup(
                format!(
                    "microvm: the guest agent was not ready within {} s",
                    ready_timeout.as_secs()
                ),
                std::io::Error::new(IoKind::TimedOut, vm.console_tail()),
            ))
        }
    };
    let boot = started.elapsed();
    let timeout = Duration::from_millis(request.timeout_ms);
    let cap = request.output_cap;
    chan.send(&HostMsg::Hello {
        version: PROTOCOL_VERSION,
    })?;
    chan.send(&HostMsg::Run(request))?;
    for chunk in stdin.chunks(CHUNK) {
        chan.send(&HostMsg::Stdin {
            data: chunk.to_vec(),
        })?;
    }
    chan.send(&HostMsg::StdinEnd)?;
    let deadline = Instant::now() + timeout + WALL_GRACE;
    let mut out = Output::new(cap, ctx.sink.as_deref());
    let ending = loop {
        match chan.recv(vm, deadline, ctx)? {
            Recv::Msg(AgentMsg::Output { stream, data }) => out.push(stream, &data),
            Recv::Msg(AgentMsg::Exit { status }) => break Ending::Agent(status),
            Recv::Msg(AgentMsg::Error { message }) => {
                return Err(Error::Internal {
                    message: format!("microvm: the guest agent refused the run: {message}"),
                    source: None,
                })
            }
            Recv::Msg(other) => return Err(unexpected(&other)),
            Recv::Deadline => break Ending::HostWall,
        }
    };
    Ok(VmRun {
        ending,
        stdout: out.stdout,
        stderr: out.stderr,
        boot,
        kernel,
    })
}

fn unexpected(msg: &AgentMsg) -> Error {
    Error::Internal {
        message: format!("microvm: unexpected message from the guest agent: {msg:?}"),
        source: None,
    }
}

enum Recv {
    Msg(AgentMsg),
    Deadline,
}

/// The agent channel with its decoder.
struct Channel {
    stream: UnixStream,
    decoder: Decoder,
}

/// How often a blocked read wakes to check the deadline, cancellation and the VMM.
const POLL: Duration = Duration::from_millis(20);

impl Channel {
    fn new(stream: UnixStream) -> Result<Self> {
        stream
            .set_read_timeout(Some(POLL))
            .map_err(|e| Error::setup("microvm: agent channel", e))?;
        Ok(Channel {
            stream,
            decoder: Decoder::new(),
        })
    }

    fn send(&mut self, msg: &HostMsg) -> Result<()> {
        let frame = encode(msg).map_err(|e| Error::Internal {
            message: format!("microvm: encoding a message for the agent: {e}"),
            source: None,
        })?;
        self.stream
            .write_all(&frame)
            .map_err(|e| Error::internal("microvm: writing to the guest agent", e))
    }

    fn recv(
        &mut self,
        vm: &mut dyn VmInstance,
        deadline: Instant,
        ctx: &RunContext,
    ) -> Result<Recv> {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.decoder.next_msg::<AgentMsg>() {
                Ok(Some(msg)) => return Ok(Recv::Msg(msg)),
                Ok(None) => {}
                Err(e) => {
                    return Err(Error::Internal {
                        message: format!("microvm: bad frame from the guest agent: {e}"),
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
                        message: format!(
                            "microvm: the VM closed the agent channel ({})",
                            vm.console_tail()
                        ),
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
                    if vm.exited() {
                        return Err(Error::Internal {
                            message: format!(
                                "microvm: the VMM exited during the run ({})",
                                vm.console_tail()
                            ),
                            source: None,
                        });
                    }
                }
                Err(e) => return Err(Error::internal("microvm: reading from the guest agent", e)),
            }
        }
    }
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
