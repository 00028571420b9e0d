//! What clients and a live sandbox's supervisor say to each other over its control socket:
//! one JSON object per line each way. A request gets one reply, except the streaming ones
//! (`exec` in the foreground, `logs` with `follow`), which send events until the process
//! ends. Output bytes travel base64-encoded.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use sandbox_core::{BackendKind, Error, Receipt, SetupStage};

use crate::ring::Stream;

/// Bumped when a message changes incompatibly; the supervisor refuses other versions.
pub const PROTOCOL_VERSION: u32 = 1;

/// Client to supervisor.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The sandbox's id, backend, receipt and clocks.
    Info,
    /// Run a command in the sandbox.
    Exec(ExecRequest),
    /// Every process started with `exec`, running or exited.
    Ps,
    /// A process's output from the start of what is kept; with `follow`, then live until it
    /// exits.
    Logs {
        /// The process.
        pid: i32,
        /// Keep streaming until the process exits.
        follow: bool,
    },
    /// A process's output from byte `offset` of everything it wrote (long-poll: waits up
    /// to `wait_ms`, at most 30 s, for output past it or for the process to end). The
    /// answer is one [`Reply::Since`].
    LogsSince {
        /// The process.
        pid: i32,
        /// Where the caller's last read ended (0 at first).
        offset: u64,
        /// How long to wait for something new.
        #[serde(default)]
        wait_ms: u64,
    },
    /// Waits for a process to exit and returns how it ended.
    Wait {
        /// The process.
        pid: i32,
    },
    /// Sends a signal to a process's group.
    Kill {
        /// The process.
        pid: i32,
        /// The signal number.
        signal: i32,
    },
    /// Writes to a process's stdin (one started with `stdin`).
    Stdin {
        /// The process.
        pid: i32,
        /// Base64 of the bytes.
        data: String,
    },
    /// Closes a process's stdin.
    CloseStdin {
        /// The process.
        pid: i32,
    },
    /// Resizes the terminal of a process started with `tty`.
    Resize {
        /// The process.
        pid: i32,
        /// The new size.
        size: TtySize,
    },
    /// Pauses every process of the sandbox (its TTLs and exec timeouts stop counting);
    /// output stays readable, new execs are refused until `resume`.
    Pause,
    /// Resumes a paused sandbox.
    Resume,
    /// Forwards a host address to a TCP port inside the sandbox.
    Publish(PublishRequest),
    /// A file operation ([`crate::files`]).
    Files(crate::files::FileRequest),
    /// Ends the sandbox: every process, its namespaces and cgroup, its state directory.
    Stop,
}

/// A port to publish: connections to `host_ip:host_port` on the host reach
/// `127.0.0.1:guest_port` inside the sandbox, and nothing else of it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The port the tool listens on inside (on `127.0.0.1` or every address).
    pub guest_port: u16,
    /// The host address to listen on. Default: `127.0.0.1`.
    #[serde(default)]
    pub host_ip: Option<std::net::IpAddr>,
    /// The host port. Default: one the kernel chooses.
    #[serde(default)]
    pub host_port: Option<u16>,
}

impl PublishRequest {
    /// `guest_port` on host loopback, on a port the kernel chooses.
    pub fn loopback(guest_port: u16) -> PublishRequest {
        PublishRequest {
            guest_port,
            host_ip: None,
            host_port: None,
        }
    }

    /// Parses the CLI's `[IP:]HOST:GUEST` (or `GUEST` alone: a port the kernel chooses on
    /// loopback). An IPv6 address goes in brackets: `[::1]:8080:80`.
    ///
    /// # Errors
    /// Text that is not of that shape, or port 0 inside.
    pub fn parse(text: &str) -> Result<PublishRequest, Error> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "--publish {text:?}: {why} (expected [IP:]HOST_PORT:GUEST_PORT or GUEST_PORT)"
            ))
        };
        let port = |p: &str| p.parse::<u16>().map_err(|_| bad("a port is 0-65535"));
        let (front, guest) = match text.rsplit_once(':') {
            Some((front, guest)) => (Some(front), port(guest)?),
            None => (None, port(text)?),
        };
        if guest == 0 {
            return Err(bad("the port inside cannot be 0"));
        }
        let (host_ip, host_port) = match front {
            None => (None, None),
            Some(front) => match front.rsplit_once(':') {
                None => (None, Some(port(front)?)),
                Some((ip, host)) => {
                    let ip = ip.trim_start_matches('[').trim_end_matches(']');
                    let ip = ip
                        .parse::<std::net::IpAddr>()
                        .map_err(|_| bad("the host address is not an IP address"))?;
                    (Some(ip), Some(port(host)?))
                }
            },
        };
        Ok(PublishRequest {
            guest_port: guest,
            host_ip,
            host_port: host_port.filter(|p| *p != 0),
        })
    }
}

/// A published port.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PublishedPort {
    /// The host address it listens on.
    pub host_ip: std::net::IpAddr,
    /// The host port.
    pub host_port: u16,
    /// The port inside the sandbox it reaches.
    pub guest_port: u16,
}

/// A command to run in a live sandbox.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments (a name is looked up in the sandbox's `PATH`).
    pub argv: Vec<String>,
    /// Variables set for this exec on top of the sandbox's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox; default: the sandbox's.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Kill the exec's process group after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Keep stdin open for `stdin` requests (otherwise it reads end of file at once).
    #[serde(default)]
    pub stdin: bool,
    /// Reply at once with the pid instead of streaming the output until it exits.
    #[serde(default)]
    pub detach: bool,
    /// Run on a terminal of this size (a pty: stdin, stdout and stderr are its slave, the
    /// output is one stream, `stdin` is implied). Default: pipes.
    #[serde(default)]
    pub tty: Option<TtySize>,
}

/// A terminal's size.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TtySize {
    /// Rows (1-4096).
    pub rows: u16,
    /// Columns (1-4096).
    pub cols: u16,
}

impl TtySize {
    /// Checks the size.
    ///
    /// # Errors
    /// Rows or columns outside 1-4096.
    pub fn check(self) -> Result<TtySize, Error> {
        if (1..=4096).contains(&self.rows) && (1..=4096).contains(&self.cols) {
            Ok(self)
        } else {
            Err(Error::invalid(format!(
                "a terminal of {} rows and {} columns: both must be 1-4096",
                self.rows, self.cols
            )))
        }
    }
}

/// One process of a live sandbox, as `ps` lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox.
    pub pid: i32,
    /// What was executed.
    pub argv: Vec<String>,
    /// `running` or `exited`.
    pub state: ProcessState,
    /// The exit code, once it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Its per-exec timeout ended it.
    pub timed_out: bool,
}

/// Whether a process is still running.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// Still running.
    Running,
    /// Ended (its output stays readable until the sandbox stops).
    Exited,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExitInfo {
    /// The process.
    pub pid: i32,
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    pub signal: Option<i32>,
    /// Its per-exec timeout ended it.
    pub timed_out: bool,
}

impl ExitInfo {
    /// The shell's convention: the code, 128 + signal, or 124 after a timeout.
    pub fn shell_code(&self) -> i32 {
        if self.timed_out {
            return 124;
        }
        match (self.exit_code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        }
    }
}

/// What a live sandbox is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxInfo {
    /// Its id.
    pub id: String,
    /// The name it was started with, if any.
    pub name: Option<String>,
    /// The backend holding it.
    pub backend: BackendKind,
    /// The supervisor's pid on the host.
    pub supervisor_pid: u32,
    /// Seconds since the Unix epoch when it started.
    pub started_at: u64,
    /// Its absolute time to live, seconds, if any.
    pub ttl_s: Option<u64>,
    /// Its idle time to live, seconds, if any.
    pub idle_ttl_s: Option<u64>,
    /// Whether it ends when the process that started it does.
    pub owned: bool,
    /// What was enforced, for every exec (with a line per published port).
    pub receipt: Receipt,
    /// Whether it is paused now.
    #[serde(default)]
    pub paused: bool,
    /// Its published ports.
    #[serde(default)]
    pub ports: Vec<PublishedPort>,
    /// CPU time its processes used so far, microseconds, when its cgroup counts it.
    #[serde(default)]
    pub cpu_us: Option<u64>,
}

/// Supervisor to client.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The request was done.
    Ok,
    /// Answer to `info`.
    Info {
        /// The sandbox.
        info: Box<SandboxInfo>,
    },
    /// An exec started.
    Started {
        /// Its pid inside the sandbox.
        pid: i32,
    },
    /// Output of a process.
    Output {
        /// Which stream.
        stream: Stream,
        /// Base64 of the bytes.
        data: String,
    },
    /// Output the ring dropped before this reader got to it.
    Missed {
        /// How many bytes.
        bytes: u64,
    },
    /// A process ended (the last event of a foreground exec or a followed log).
    Exited {
        /// How.
        exit: ExitInfo,
    },
    /// Answer to `pause`.
    Paused {
        /// How it is paused.
        method: sandbox_os::live::PauseMethod,
    },
    /// Answer to `publish`.
    Published {
        /// The port.
        port: PublishedPort,
    },
    /// Answer to `logs_since`.
    Since {
        /// Output past the offset, in order, each chunk base64 with its stream.
        chunks: Vec<(Stream, String)>,
        /// Bytes the ring dropped before the caller got to them.
        missed: u64,
        /// Where the next `logs_since` starts.
        next: u64,
        /// How the process ended, once it did and all its output is in `chunks`.
        exit: Option<ExitInfo>,
    },
    /// A file's contents (`read`).
    FileData {
        /// Base64 of the bytes.
        data: String,
    },
    /// A directory's entries (`list`).
    Entries {
        /// Sorted by name.
        entries: Vec<sandbox_os::file_tree::DirEntry>,
    },
    /// One entry (`stat`).
    Entry {
        /// The entry.
        entry: sandbox_os::file_tree::DirEntry,
    },
    /// What an `upload` or `download` moved.
    Transferred {
        /// Files, directories and bytes.
        transfer: sandbox_os::file_tree::Transfer,
    },
    /// A change under a watched directory.
    FileEvent {
        /// What changed.
        change: crate::watch::FileChange,
    },
    /// Answer to `ps`.
    Processes {
        /// Every process started with `exec`.
        processes: Vec<ProcessInfo>,
    },
    /// The request failed; nothing was done.
    Error {
        /// Why, typed.
        error: WireError,
    },
}

/// Encodes bytes for [`Reply::Output`] and [`Request::Stdin`].
pub fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes [`encode`]'s text.
///
/// # Errors
/// Text that is not base64.
pub fn decode(text: &str) -> Result<Vec<u8>, Error> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| Error::invalid(format!("stdin data is not base64: {e}")))
}

/// An [`Error`] on the wire: its kind and fields, so the client gets the same typed error
/// the supervisor had.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "code", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireError {
    /// [`Error::InvalidRequest`].
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// [`Error::Denied`].
    Denied {
        /// Why.
        reason: String,
    },
    /// [`Error::BackendUnavailable`].
    BackendUnavailable {
        /// The backend.
        backend: BackendKind,
        /// Why.
        reason: String,
    },
    /// [`Error::Unenforceable`].
    Unenforceable {
        /// The guarantee.
        guarantee: String,
        /// Why.
        reason: String,
        /// Whether best effort would run without it (absent from older peers: `false`).
        #[serde(default)]
        best_effort_runs: bool,
    },
    /// [`Error::Exec`].
    Exec {
        /// The program.
        program: String,
        /// The OS error number (0 when unknown).
        errno: i32,
        /// The error in words.
        message: String,
    },
    /// [`Error::Setup`].
    SetupFailed {
        /// The typed stage.
        at: SetupStage,
        /// The step in words.
        stage: String,
        /// The OS error in words.
        message: String,
    },
    /// [`Error::Cancelled`].
    Cancelled,
    /// [`Error::Internal`] and anything else.
    Internal {
        /// What went wrong.
        message: String,
    },
}

impl From<&Error> for WireError {
    fn from(error: &Error) -> WireError {
        match error {
            Error::InvalidRequest { reason } => WireError::InvalidRequest {
                reason: reason.clone(),
            },
            Error::Denied { reason } => WireError::Denied {
                reason: reason.clone(),
            },
            Error::BackendUnavailable { backend, reason } => WireError::BackendUnavailable {
                backend: *backend,
                reason: reason.clone(),
            },
            Error::Unenforceable {
                guarantee,
                reason,
                best_effort_runs,
            } => WireError::Unenforceable {
                guarantee: guarantee.clone(),
                reason: reason.clone(),
                best_effort_runs: *best_effort_runs,
            },
            Error::Exec { program, source } => WireError::Exec {
                program: program.clone(),
                errno: source.raw_os_error().unwrap_or(0),
                message: source.to_string(),
            },
            Error::Setup { at, stage, source } => WireError::SetupFailed {
                at: *at,
                stage: stage.clone(),
                message: source.to_string(),
            },
            Error::Cancelled => WireError::Cancelled,
            // The OS error travels in words: the client's error says what failed and why.
            Error::Internal { message, source } => WireError::Internal {
                message: match source {
                    Some(source) => format!("{message}: {source}"),
                    None => message.clone(),
                },
            },
            other => WireError::Internal {
                message: other.to_string(),
            },
        }
    }
}

impl From<WireError> for Error {
    fn from(error: WireError) -> Error {
        match error {
            WireError::InvalidRequest { reason } => Error::InvalidRequest { reason },
            WireError::Denied { reason } => Error::Denied { reason },
            WireError::BackendUnavailable { backend, reason } => {
                Error::BackendUnavailable { backend, reason }
            }
            WireError::Unenforceable {
                guarantee,
                reason,
                best_effort_runs,
            } => Error::Unenforceable {
                guarantee,
                reason,
                best_effort_runs,
            },
            WireError::Exec {
                program,
                errno,
                message,
            } => Error::Exec {
                program,
                source: if errno > 0 {
                    std::io::Error::from_raw_os_error(errno)
                } else {
                    std::io::Error::other(message)
                },
            },
            WireError::SetupFailed { at, stage, message } => Error::Setup {
                at,
                stage,
                source: std::io::Error::other(message),
            },
            WireError::Cancelled => Error::Cancelled,
            WireError::Internal { message } => Error::Internal {
                message,
                source: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_error_crosses_the_socket_with_its_kind_and_fields() {
        let errors = [
            Error::invalid("argv is empty"),
            Error::unenforceable("fs: landlock", "no landlock here"),
            Error::setup(
                SetupStage::Cgroup,
                "create run cgroup",
                std::io::Error::other("busy"),
            ),
            Error::Exec {
                program: "nope".into(),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            },
        ];
        for error in errors {
            let line = serde_json::to_string(&WireError::from(&error)).expect("encode");
            let back: WireError = serde_json::from_str(&line).expect("decode");
            let back = Error::from(back);
            assert_eq!(back.kind(), error.kind(), "{line}");
            assert_eq!(back.setup_stage(), error.setup_stage());
            assert_eq!(back.to_string(), error.to_string());
        }
    }

    #[test]
    fn an_internal_error_keeps_its_os_error_in_words_and_one_prefix() {
        let error = Error::internal(
            "host path /x",
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        let text = Error::from(WireError::from(&error)).to_string();
        assert!(text.contains("host path /x"), "{text}");
        assert!(text.contains("Permission denied"), "{text}");
        assert_eq!(text.matches("internal failure").count(), 1, "{text}");
    }

    #[test]
    fn publish_flags_parse_and_bad_ones_are_refused() {
        let parse = |t: &str| PublishRequest::parse(t).expect(t);
        assert_eq!(parse("8000").guest_port, 8000);
        assert_eq!(parse("8000").host_port, None);
        let both = parse("9000:80");
        assert_eq!(
            (both.host_ip, both.host_port, both.guest_port),
            (None, Some(9000), 80)
        );
        let ip = parse("0.0.0.0:9000:80");
        assert_eq!(ip.host_ip, Some("0.0.0.0".parse().expect("ip")));
        let v6 = parse("[::1]:9000:80");
        assert_eq!(v6.host_ip, Some("::1".parse().expect("ip")));
        for bad in [
            "",
            "0",
            "x:80",
            "9000:70000",
            "host:9000:80",
            "1:2:3:4",
            "80:0",
        ] {
            let err = PublishRequest::parse(bad).expect_err(bad);
            assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn unknown_fields_and_operations_are_refused() {
        assert!(
            serde_json::from_str::<Request>(r#"{"op":"kill","pid":1,"signal":9,"x":1}"#).is_err()
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"exec","argv":["true"],"x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"format_disk"}"#).is_err());
        let exec: Request =
            serde_json::from_str(r#"{"op":"exec","argv":["true"],"detach":true}"#).expect("exec");
        assert!(matches!(
            exec,
            Request::Exec(ExecRequest { detach: true, .. })
        ));
    }
}
