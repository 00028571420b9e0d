//! What a run produced.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::receipt::Receipt;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExitStatus {
    /// The tool exited with a code.
    Exited {
        /// The exit code (0-255).
        code: i32,
    },
    /// The tool was killed by a signal it did not get from a Strata limit.
    Signaled {
        /// The signal number.
        signal: i32,
    },
    /// A limit ended the run; the whole process tree was killed.
    Limit {
        /// Which limit.
        limit: LimitKind,
        /// The signal that ended the tool, when it was a signal.
        signal: Option<i32>,
    },
    /// A WebAssembly tool trapped (wasm backend): the engine stopped it safely at a fault
    /// such as an out-of-bounds access or a stack overflow.
    Trapped {
        /// What the module did.
        trap: TrapKind,
    },
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Exited { code } => write!(f, "exit code {code}"),
            ExitStatus::Signaled { signal } => write!(f, "killed by signal {signal}"),
            ExitStatus::Limit { limit, .. } => write!(f, "{limit} limit exceeded"),
            ExitStatus::Trapped { trap } => write!(f, "trapped: {trap}"),
        }
    }
}

/// Why a WebAssembly tool trapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TrapKind {
    /// The wasm call stack was exhausted (deep or infinite recursion).
    StackOverflow,
    /// A load or store outside linear memory.
    MemoryOutOfBounds,
    /// A table access outside the table.
    TableOutOfBounds,
    /// An indirect call to a null or mistyped table entry.
    BadIndirectCall,
    /// Integer division by zero, overflow, or an invalid float-to-integer conversion.
    Arithmetic,
    /// An `unreachable` instruction (how C `abort()` ends in WASI).
    Unreachable,
    /// Any other trap.
    Other,
}

impl TrapKind {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::StackOverflow => "stack_overflow",
            TrapKind::MemoryOutOfBounds => "memory_out_of_bounds",
            TrapKind::TableOutOfBounds => "table_out_of_bounds",
            TrapKind::BadIndirectCall => "bad_indirect_call",
            TrapKind::Arithmetic => "arithmetic",
            TrapKind::Unreachable => "unreachable",
            TrapKind::Other => "other",
        }
    }
}

impl fmt::Display for TrapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit that ended a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LimitKind {
    /// Wall-clock timeout.
    Wall,
    /// CPU time.
    Cpu,
    /// Memory.
    Memory,
    /// Number of processes or threads.
    Pids,
    /// Output bytes on stdout or stderr.
    Output,
    /// Scratch disk (`/tmp`, workdir) full.
    Disk,
    /// A single file grew past the file-size limit.
    FileSize,
    /// WebAssembly fuel (deterministic instruction budget).
    Fuel,
    /// Open descriptors (the wasm backend's WASI descriptor table is full).
    OpenFiles,
    /// Bytes through the egress proxy ([`crate::Limits::egress_bytes`]).
    EgressBytes,
    /// Connections through the egress proxy ([`crate::Limits::egress_connections`]).
    EgressConnections,
}

impl LimitKind {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Wall => "wall",
            LimitKind::Cpu => "cpu",
            LimitKind::Memory => "memory",
            LimitKind::Pids => "pids",
            LimitKind::Output => "output",
            LimitKind::Disk => "disk",
            LimitKind::FileSize => "file_size",
            LimitKind::Fuel => "fuel",
            LimitKind::OpenFiles => "open_files",
            LimitKind::EgressBytes => "egress_bytes",
            LimitKind::EgressConnections => "egress_connections",
        }
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Resources the run used, as far as the backend can measure them.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct ResourceUsage {
    /// User CPU time in microseconds.
    pub user_cpu_us: u64,
    /// System CPU time in microseconds.
    pub system_cpu_us: u64,
    /// Peak memory in bytes (cgroup peak when available, otherwise max RSS).
    pub peak_memory_bytes: u64,
}

/// The result of a run that happened. A non-zero exit is data, not an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutput {
    /// How the run ended.
    pub status: ExitStatus,
    /// Captured standard output, at most `limits.output` bytes.
    pub stdout: Vec<u8>,
    /// Captured standard error, at most `limits.output` bytes.
    pub stderr: Vec<u8>,
    /// Whether stdout was cut at the output limit.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the output limit.
    pub stderr_truncated: bool,
    /// Wall time from start of the sandbox to the end of the run.
    pub duration: Duration,
    /// Measured resource usage.
    pub usage: ResourceUsage,
    /// What was enforced.
    pub receipt: Receipt,
}

impl RunOutput {
    /// The exit code, when the tool exited normally.
    pub fn exit_code(&self) -> Option<i32> {
        match self.status {
            ExitStatus::Exited { code } => Some(code),
            _ => None,
        }
    }

    /// The signal that ended the tool, if any.
    pub fn signal(&self) -> Option<i32> {
        match self.status {
            ExitStatus::Signaled { signal } => Some(signal),
            ExitStatus::Limit { signal, .. } => signal,
            ExitStatus::Exited { .. } | ExitStatus::Trapped { .. } => None,
        }
    }

    /// The limit that ended the run, if any.
    pub fn limit(&self) -> Option<LimitKind> {
        match self.status {
            ExitStatus::Limit { limit, .. } => Some(limit),
            _ => None,
        }
    }

    /// Whether the wall-clock timeout ended the run.
    pub fn timed_out(&self) -> bool {
        self.limit() == Some(LimitKind::Wall)
    }

    /// Whether the tool exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code() == Some(0)
    }

    /// `Ok(self)` on success, otherwise [`crate::Error::LimitExceeded`] or
    /// [`crate::Error::ToolFailed`].
    pub fn check(self) -> crate::Result<Self> {
        match self.status {
            ExitStatus::Exited { code: 0 } => Ok(self),
            ExitStatus::Limit { limit, .. } => Err(crate::Error::LimitExceeded { limit }),
            status => Err(crate::Error::ToolFailed {
                status: status.to_string(),
            }),
        }
    }

    /// The trap that ended a WebAssembly tool, if any.
    pub fn trap(&self) -> Option<TrapKind> {
        match self.status {
            ExitStatus::Trapped { trap } => Some(trap),
            _ => None,
        }
    }

    /// The process exit code a CLI should use: the tool's code, 124 on timeout, 137 when
    /// killed for another limit, 128+N for signal N, 134 for a WebAssembly trap (as the
    /// `wasmtime` CLI does).
    pub fn cli_exit_code(&self) -> i32 {
        match self.status {
            ExitStatus::Exited { code } => code,
            ExitStatus::Limit {
                limit: LimitKind::Wall,
                ..
            } => 124,
            ExitStatus::Limit { .. } => 137,
            ExitStatus::Signaled { signal } => 128 + signal,
            ExitStatus::Trapped { .. } => 134,
        }
    }

    /// The JSON object of the CLI contract: `exit_code, signal, timed_out, limit, stdout,
    /// stderr, stdout_truncated, stderr_truncated, duration_ms, usage, receipt`, plus `trap`
    /// (null unless a WebAssembly tool trapped).
    pub fn to_json(&self) -> serde_json::Value {
        // Its shape is `schema::RunOutputJson`, whose schema is `schema/run-output.schema.json`.
        serde_json::to_value(crate::schema::RunOutputJson::from(self))
            .unwrap_or(serde_json::Value::Null)
    }
}
