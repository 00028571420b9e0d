//! The host ↔ guest-agent protocol, spoken over the virtio-serial port
//! `org.strata.agent`.
//!
//! A frame is a big-endian `u32` payload length followed by that many bytes of JSON (one
//! [`HostMsg`] or [`AgentMsg`]). Payloads larger than [`MAX_FRAME`] are refused by both
//! sides. Byte strings (stdin, output, entropy) travel as base64 text.
//!
//! A conversation: the agent sends [`AgentMsg::Ready`] once its port is open after a cold
//! boot (a VM restored from a snapshot was saved after that message, so the host does not
//! wait for it again); the host sends [`HostMsg::Hello`] (the protocol version it speaks) and
//! the agent answers [`AgentMsg::Welcome`]; then the host sends [`HostMsg::Run`], the stdin
//! bytes as [`HostMsg::Stdin`] chunks and [`HostMsg::StdinEnd`]; it may send
//! [`HostMsg::Kill`] at any time. The agent answers with [`AgentMsg::Output`] chunks and
//! one [`AgentMsg::Applied`] (what the agent applied, read back), and one [`AgentMsg::Exit`]; then, for each read-write grant the run asked back, the grant's
//! tree as [`AgentMsg::Archive`] chunks (a tar stream) and one [`AgentMsg::ArchiveEnd`].
//! [`AgentMsg::Error`] means the agent refused (version mismatch, a malformed frame).
//!
//! [`Decoder`] never panics, whatever bytes it is fed (a property test feeds it random and
//! mutated input): a bad frame is a [`ProtocolError`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks. Host and agent refuse any other.
pub const PROTOCOL_VERSION: u32 = 4;

/// Largest payload of one frame: 1 MiB.
pub const MAX_FRAME: usize = 1024 * 1024;

/// Stdin and output travel in chunks of at most this many bytes (well under
/// [`MAX_FRAME`] once base64-encoded).
pub const CHUNK: usize = 256 * 1024;

/// The name of the virtio-serial port the agent talks on.
pub const PORT_NAME: &str = "org.strata.agent";

/// A message from the host to the agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum HostMsg {
    /// The host's protocol version; the agent refuses a mismatch.
    Hello {
        /// [`PROTOCOL_VERSION`] of the host.
        version: u32,
    },
    /// Run one command.
    Run(RunRequest),
    /// A chunk of the tool's standard input.
    Stdin {
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// End of the tool's standard input.
    StdinEnd,
    /// Kill the tool's process group now.
    Kill,
    /// Hold the machine for a live sandbox instead of one run: set it up as for a run
    /// (clock, network, entropy, disks, files; `argv` is empty, `rlimits` apply to every
    /// exec), answer [`AgentMsg::Applied`] (read back from a probe process started with the
    /// exec's limits), then start one [`HostMsg::Exec`] after another until the host closes
    /// the channel, which kills every exec.
    Live(RunRequest),
    /// Start a live exec (after [`HostMsg::Live`]).
    Exec(LiveExec),
    /// Bytes for live exec `id`'s stdin; the agent answers [`AgentMsg::InputTaken`] once
    /// they are written (the host keeps a bounded number of bytes in flight).
    Input {
        /// The exec.
        id: u64,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// End of live exec `id`'s stdin.
    InputEnd {
        /// The exec.
        id: u64,
    },
    /// Send `signal` to the process group of the live exec whose pid is `pid`.
    Signal {
        /// The exec's pid in the guest.
        pid: i32,
        /// The signal number.
        signal: i32,
    },
    /// Set the guest's wall clock to the host's (after a resume: a stopped VM's clock
    /// stood still).
    SetClock {
        /// Nanoseconds since the Unix epoch.
        unix_ns: u64,
    },
    /// Set the terminal size of the tty exec whose pid is `pid`.
    Resize {
        /// The exec's pid in the guest.
        pid: i32,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// Open TCP connection `id` to `127.0.0.1:port` in the guest (a published port); the
    /// answer is [`AgentMsg::Connected`] or [`AgentMsg::ConnectFailed`].
    Connect {
        /// The host's number for this connection.
        id: u64,
        /// The port in the guest.
        port: u16,
    },
    /// Bytes for connection `id` (at most [`CONN_WINDOW`] not yet taken).
    ConnData {
        /// The connection.
        id: u64,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// The host's side of connection `id` sends no more (the guest half-closes it).
    ConnEnd {
        /// The connection.
        id: u64,
    },
    /// `bytes` of connection `id`'s data from the agent were delivered on the host.
    ConnTaken {
        /// The connection.
        id: u64,
        /// How many.
        bytes: u64,
    },
    /// The live sandbox ends: kill every exec, then send each read-write mount's tree back
    /// ([`AgentMsg::Archive`] chunks and one [`AgentMsg::ArchiveEnd`] per mount, as after a
    /// run).
    Finish,
    /// A file operation in the guest; the answer is [`AgentMsg::FileDone`] with `id`.
    File {
        /// The host's number for this operation.
        id: u64,
        /// What to do.
        op: GuestFileOp,
    },
}

/// A file operation in a live guest. Paths are absolute guest paths; the last component is
/// never followed when it is a symlink (`lstat`, `O_NOFOLLOW`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuestFileOp {
    /// At most `len` bytes of a regular file from `offset`.
    Read {
        /// The file.
        path: String,
        /// Where to start.
        offset: u64,
        /// How many bytes at most (at most [`CHUNK`] * 4).
        len: u64,
    },
    /// Writes `data` at `offset`; offset 0 creates or truncates the file (mode `mode`, 0:
    /// 0644), making missing parents.
    Write {
        /// The file.
        path: String,
        /// Where to write.
        offset: u64,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
        /// Permission bits of a new file.
        #[serde(default)]
        mode: u32,
    },
    /// A directory's entries.
    List {
        /// The directory.
        path: String,
    },
    /// One entry.
    Stat {
        /// The entry.
        path: String,
    },
    /// Makes a directory (with `parents`, missing parents too, an existing one is fine).
    Mkdir {
        /// The directory.
        path: String,
        /// Make parents.
        parents: bool,
        /// Permission bits (0: 0755).
        #[serde(default)]
        mode: u32,
    },
    /// Renames an entry.
    Rename {
        /// The entry.
        from: String,
        /// Its new path.
        to: String,
    },
    /// Removes a file, symlink or directory tree.
    Remove {
        /// The entry.
        path: String,
    },
}

/// One entry a guest file operation describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestEntry {
    /// Its name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// `st_size`.
    pub size: u64,
    /// `st_mode & 0o7777`.
    pub mode: u32,
}

/// What a guest file operation came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuestFileResult {
    /// Done.
    Ok,
    /// A read's bytes (fewer than asked at the end of the file).
    Data {
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// A directory's entries.
    Entries {
        /// The entries.
        entries: Vec<GuestEntry>,
    },
    /// One entry.
    Entry {
        /// The entry.
        entry: GuestEntry,
    },
    /// Failed.
    Failed {
        /// The OS error number.
        errno: i32,
        /// The OS error text.
        message: String,
    },
}

/// Bytes of one connection's data either side sends ahead of what the other side took.
pub const CONN_WINDOW: u64 = 256 * 1024;

/// A terminal's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// One live exec: a program with exactly this environment, in its own session and process
/// group, stdin, stdout and stderr carried over the channel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveExec {
    /// The host's number for this exec, echoed in every message about it.
    pub id: u64,
    /// Program and arguments (`argv[0]` is looked up in `PATH` of `env` without a `/`).
    pub argv: Vec<String>,
    /// The whole environment.
    pub env: BTreeMap<String, String>,
    /// Working directory (empty: `/`).
    pub cwd: String,
    /// Run on a new terminal of this size in the guest (its controlling terminal; stdout
    /// carries the terminal's output, stderr nothing).
    #[serde(default)]
    pub tty: Option<TermSize>,
}

/// What the agent runs. Build one with [`crate::request`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Program and arguments (`argv[0]` is looked up in `PATH` of `env` when it has no `/`).
    pub argv: Vec<String>,
    /// The whole environment of the tool.
    pub env: BTreeMap<String, String>,
    /// Working directory inside the guest.
    pub cwd: String,
    /// Wall-clock limit of the tool in milliseconds, from its start.
    pub timeout_ms: u64,
    /// Bytes forwarded per stream; more ends the run with the output limit.
    pub output_cap: u64,
    /// Host randomness mixed into the guest RNG (followed by a reseed) before the tool
    /// starts.
    #[serde(with = "b64")]
    pub entropy: Vec<u8>,
    /// Per-process limits set in the guest before the tool starts.
    pub rlimits: GuestRlimits,
    /// The host's wall clock (nanoseconds since the Unix epoch) when the run was sent; the
    /// agent sets the guest clock to it (a restored VM's clock is the snapshot's). 0: leave
    /// the clock alone.
    pub clock_unix_ns: u64,
    /// Disks to mount before the tool starts, in order.
    pub mounts: Vec<GuestMount>,
    /// Files the agent writes before the tool starts (parents created), e.g. the caps of
    /// the sandbox run inside the guest.
    pub files: Vec<GuestFile>,
    /// A file the agent reads after the tool ended and sends as [`AgentMsg::Report`] (at
    /// most [`MAX_REPORT`] bytes), e.g. the inner run's result.
    pub report: Option<String>,
    /// Bring the network device up (`eth0`, `10.0.2.15/24`; its only peer is the egress
    /// proxy at `10.0.2.100:3128`).
    pub network: bool,
}

/// Largest report the agent sends back: 256 KiB.
pub const MAX_REPORT: usize = 256 * 1024;

/// A file the agent writes in the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestFile {
    /// Absolute guest path.
    pub path: String,
    /// Contents (base64 in JSON).
    #[serde(with = "b64")]
    pub data: Vec<u8>,
}

/// A disk the agent mounts for the tool (ext4, `nosuid,nodev`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestMount {
    /// The disk's serial number (`/sys/block/vdX/serial`).
    pub serial: String,
    /// Where it is mounted in the guest (absolute).
    pub target: String,
    /// Mounted read-write, and its tree sent back as an archive after the tool ends.
    /// Read-only disks are also opened read-only by the VMM.
    pub writable: bool,
}

/// Resource limits the agent applies with `setrlimit` (inherited by the tool).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestRlimits {
    /// `RLIMIT_CPU` in seconds.
    pub cpu_seconds: u64,
    /// `RLIMIT_FSIZE` in bytes.
    pub file_size: u64,
    /// `RLIMIT_NOFILE`.
    pub open_files: u64,
}

/// Which output stream a chunk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A message from the agent to the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentMsg {
    /// The agent is up and listening.
    Ready {
        /// [`PROTOCOL_VERSION`] of the agent.
        version: u32,
        /// The guest kernel release (`uname -r`).
        kernel: String,
    },
    /// The answer to [`HostMsg::Hello`]: the agent speaks the host's version.
    Welcome {
        /// [`PROTOCOL_VERSION`] of the agent.
        version: u32,
        /// The guest kernel release (`uname -r`).
        kernel: String,
    },
    /// A chunk of the tool's output.
    Output {
        /// The stream.
        stream: OutStream,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// What the agent applied for the tool, read back once it started (before
    /// [`AgentMsg::Exit`]); the host checks it against the request.
    Applied {
        /// What was read back.
        applied: Applied,
    },
    /// The tool ended.
    Exit {
        /// How.
        status: GuestExit,
    },
    /// The contents of [`RunRequest::report`] (sent before [`AgentMsg::Exit`]); empty when
    /// the file was missing.
    Report {
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// A chunk of a read-write grant's tree, as a tar stream (after [`AgentMsg::Exit`]).
    Archive {
        /// The index of the mount in [`RunRequest::mounts`].
        mount: u32,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// The end of one grant's archive.
    ArchiveEnd {
        /// The index of the mount in [`RunRequest::mounts`].
        mount: u32,
        /// Why the archive is incomplete, if it is (the host then applies nothing of it).
        error: Option<String>,
    },
    /// Live exec `id` runs as `pid` (its process group and session).
    Started {
        /// The exec.
        id: u64,
        /// Its pid in the guest.
        pid: i32,
    },
    /// Live exec `id` did not start (nothing ran).
    ExecFailed {
        /// The exec.
        id: u64,
        /// The OS error number.
        errno: i32,
    },
    /// A chunk of live exec `id`'s output.
    ExecOutput {
        /// The exec.
        id: u64,
        /// The stream.
        stream: OutStream,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Live exec `id`'s stream reached end of file (every process holding it closed it).
    OutputEnd {
        /// The exec.
        id: u64,
        /// The stream.
        stream: OutStream,
    },
    /// `bytes` of live exec `id`'s stdin were written to it.
    InputTaken {
        /// The exec.
        id: u64,
        /// How many.
        bytes: u64,
    },
    /// Live exec `id`'s main process ended.
    Ended {
        /// The exec.
        id: u64,
        /// Its pid.
        pid: i32,
        /// The raw wait status.
        wait_status: i32,
    },
    /// Connection `id` is open.
    Connected {
        /// The connection.
        id: u64,
    },
    /// Connection `id` could not be opened.
    ConnectFailed {
        /// The connection.
        id: u64,
        /// The OS error number.
        errno: i32,
    },
    /// Bytes from connection `id` (at most [`CONN_WINDOW`] not yet taken).
    ConnData {
        /// The connection.
        id: u64,
        /// The bytes (base64 in JSON).
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// The guest's side of connection `id` sends no more.
    ConnEnd {
        /// The connection.
        id: u64,
    },
    /// `bytes` of connection `id`'s data from the host were written in the guest.
    ConnTaken {
        /// The connection.
        id: u64,
        /// How many.
        bytes: u64,
    },
    /// File operation `id` is done.
    FileDone {
        /// The operation.
        id: u64,
        /// How it went.
        result: GuestFileResult,
    },
    /// The agent refused or failed; nothing more follows.
    Error {
        /// What went wrong.
        message: String,
    },
}

/// What the agent applied for the tool, read back where the agent's place lets it read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Applied {
    /// The indices in [`RunRequest::mounts`] of the disks found mounted at their targets
    /// (read back from `/proc/self/mountinfo`).
    pub mounts: Vec<u32>,
    /// The machine's memory as its kernel reports it (`MemTotal`), in bytes; `None` when
    /// unreadable.
    pub memory_total: Option<u64>,
    /// `memory.max` of the agent's cgroup (v2), in bytes; `None` for no limit, no cgroup v2
    /// or unreadable.
    pub cgroup_memory_max: Option<u64>,
    /// `pids.max` of the agent's cgroup (v2); `None` for no limit, no cgroup v2 or
    /// unreadable.
    pub cgroup_pids_max: Option<u64>,
    /// The tool process's resource limits (soft), read from `/proc/PID/limits` once it
    /// started; `None` when unreadable. A limit without a value reads as 0.
    pub rlimits: Option<GuestRlimits>,
}

/// How the tool ended, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuestExit {
    /// Exited with a code.
    Exited {
        /// The code.
        code: i32,
    },
    /// Killed by a signal the agent did not send.
    Signaled {
        /// The signal number.
        signal: i32,
    },
    /// The agent ended it for a limit.
    Limit {
        /// `wall` or `output`.
        limit: GuestLimit,
    },
    /// Killed on the host's [`HostMsg::Kill`].
    Killed,
    /// The program could not be started.
    SpawnFailed {
        /// The OS error number.
        errno: i32,
        /// The OS error text.
        message: String,
    },
}

/// A limit the agent enforces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestLimit {
    /// The wall-clock timeout.
    Wall,
    /// The output cap.
    Output,
    /// The guest ran out of memory and its OOM killer ended the tool (the guest's RAM is
    /// the run's memory limit; the agent and the layer inside are never its first pick).
    Memory,
}

/// Why bytes are not a valid frame.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The length prefix exceeds [`MAX_FRAME`].
    TooLarge {
        /// The announced length.
        len: usize,
    },
    /// The payload is not a valid message.
    BadMessage {
        /// The JSON error.
        reason: String,
    },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::TooLarge { len } => {
                write!(f, "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit")
            }
            ProtocolError::BadMessage { reason } => write!(f, "malformed message: {reason}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Encodes one message as a frame.
///
/// # Errors
/// [`ProtocolError::TooLarge`] when the JSON exceeds [`MAX_FRAME`];
/// [`ProtocolError::BadMessage`] if it cannot be serialized.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtocolError> {
    let json = serde_json::to_vec(msg).map_err(|e| ProtocolError::BadMessage {
        reason: e.to_string(),
    })?;
    if json.len() > MAX_FRAME {
        return Err(ProtocolError::TooLarge { len: json.len() });
    }
    let len = u32::try_from(json.len()).map_err(|_| ProtocolError::TooLarge { len: json.len() })?;
    let mut frame = Vec::with_capacity(4 + json.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&json);
    Ok(frame)
}

/// An incremental frame decoder: feed it bytes as they arrive, take whole messages out.
///
/// It holds at most one partial frame (≤ 4 + [`MAX_FRAME`] bytes) plus what was fed and
/// not yet taken. After an error the stream is out of sync; callers drop the connection.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held and not yet decoded.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// The next whole message, `Ok(None)` if more bytes are needed.
    ///
    /// # Errors
    /// [`ProtocolError`] when the next frame is too large or not a valid `T`.
    pub fn next_msg<T: for<'de> Deserialize<'de>>(&mut self) -> Result<Option<T>, ProtocolError> {
        let Some(head) = self.buf.get(..4) else {
            return Ok(None);
        };
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(head);
        let len = u32::from_be_bytes(len_bytes) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge { len });
        }
        let Some(payload) = self.buf.get(4..4 + len) else {
            return Ok(None);
        };
        let parsed = serde_json::from_slice::<T>(payload);
        self.buf.drain(..4 + len);
        parsed.map(Some).map_err(|e| ProtocolError::BadMessage {
            reason: e.to_string(),
        })
    }
}

/// Serde adapter: bytes as standard base64 text.
mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_run() -> HostMsg {
        HostMsg::Run(RunRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
            env: BTreeMap::from([("PATH".into(), "/bin".into())]),
            cwd: "/tmp".into(),
            timeout_ms: 1000,
            output_cap: 1 << 20,
            entropy: vec![1, 2, 3, 255],
            rlimits: GuestRlimits::default(),
            clock_unix_ns: 1_790_000_000_000_000_000,
            mounts: vec![GuestMount {
                serial: "strata-g0".into(),
                target: "/work".into(),
                writable: true,
            }],
            files: vec![GuestFile {
                path: "/run/strata/caps.json".into(),
                data: b"{}".to_vec(),
            }],
            report: Some("/run/strata/result.json".into()),
            network: true,
        })
    }

    #[test]
    fn round_trips_split_at_every_byte() {
        let msgs = vec![
            HostMsg::Hello {
                version: PROTOCOL_VERSION,
            },
            sample_run(),
            HostMsg::Live(RunRequest::default()),
            HostMsg::Stdin {
                data: b"\x00\xffdata".to_vec(),
            },
            HostMsg::StdinEnd,
            HostMsg::Kill,
            HostMsg::Exec(LiveExec {
                id: 3,
                argv: vec!["sh".into(), "-c".into(), "cat".into()],
                env: BTreeMap::from([("A".into(), "b=c".into())]),
                cwd: "/tmp".into(),
                tty: Some(TermSize { rows: 24, cols: 80 }),
            }),
            HostMsg::Connect { id: 4, port: 8000 },
            HostMsg::Finish,
            HostMsg::ConnData {
                id: 4,
                data: b"GET /".to_vec(),
            },
            HostMsg::ConnEnd { id: 4 },
            HostMsg::ConnTaken { id: 4, bytes: 5 },
            HostMsg::Resize {
                pid: 41,
                rows: 50,
                cols: 132,
            },
            HostMsg::File {
                id: 5,
                op: GuestFileOp::Write {
                    path: "/tmp/a".into(),
                    offset: 0,
                    data: vec![1, 2],
                    mode: 0o600,
                },
            },
            HostMsg::Input {
                id: 3,
                data: vec![0, 255, 10],
            },
            HostMsg::InputEnd { id: 3 },
            HostMsg::Signal { pid: 41, signal: 9 },
            HostMsg::SetClock { unix_ns: 7 },
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend(encode(m).expect("encode"));
        }
        for split in 0..wire.len() {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                d.feed(part);
                while let Some(m) = d.next_msg::<HostMsg>().expect("decode") {
                    got.push(m);
                }
            }
            assert_eq!(got, msgs);
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut d = Decoder::new();
        d.feed(&u32::MAX.to_be_bytes());
        assert!(matches!(
            d.next_msg::<AgentMsg>(),
            Err(ProtocolError::TooLarge { .. })
        ));
    }

    #[test]
    fn unknown_fields_and_types_are_refused() {
        for json in [
            r#"{"type":"hello","version":1,"extra":1}"#,
            r#"{"type":"format_disk"}"#,
            r#"{"type":"hello"}"#,
        ] {
            let mut frame = (json.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(json.as_bytes());
            let mut d = Decoder::new();
            d.feed(&frame);
            assert!(
                matches!(
                    d.next_msg::<HostMsg>(),
                    Err(ProtocolError::BadMessage { .. })
                ),
                "{json}"
            );
        }
    }
}
