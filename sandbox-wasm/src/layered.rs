//! Layering: the wasm engine runs inside the process sandbox. The backend compiles the
//! module on the host side, then asks the outer backend to run `strata-wasm-host` with the
//! run's mounts (at their guest paths), the precompiled artifact and the host binary mounted
//! read-only. The host reads its request from stdin, runs the module with the same WASI
//! mapping and limits, and streams frames back (see [`crate::frame`]). An escape from
//! wasmtime then still meets namespaces, landlock and seccomp; the receipt lists both layers.

use sandbox_core::SetupStage;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sandbox_core::{
    Access, BackendKind, ByteSize, Caps, Error, ErrorKind, ExitStatus, Mount, OutputSink, Receipt,
    ResourceUsage, Result, RunContext, RunOutput, StdinSource, Stream, Strictness, SystemDirs,
    Tool,
};
use serde::{Deserialize, Serialize};

use crate::backend::{Inner, WasmBackend};
use crate::config::{Layering, WasmConfig};
use crate::frame::{self, Decoder};
use crate::plan;
use crate::program::Program;

/// Where the layered run's own files appear inside the process sandbox.
const GUEST_DIR: &str = "/.strata-wasm";
/// Protocol version of [`HostRequest`].
const VERSION: u32 = 1;
/// Extra wall and CPU time the outer layer allows for the host's own start-up.
const GRACE: Duration = Duration::from_secs(2);
/// Extra memory for wasmtime itself and the mapped artifact.
const HOST_MEMORY: u64 = 512 << 20;
/// Threads of the host: main, epoch ticker, tokio's blocking pool.
const HOST_TASKS: u32 = 32;
/// Largest request header accepted.
const MAX_HEADER: usize = 16 << 20;

/// What the backend sends the host, before the guest's stdin.
#[derive(Serialize, Deserialize)]
struct HostRequest {
    version: u32,
    program: Program,
    /// The original module, inside the sandbox, if the artifact cannot be loaded.
    source: PathBuf,
    caps: Caps,
    strictness: Strictness,
    fuel: Option<u64>,
}

/// What the host sends back in the final frame.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum HostResult {
    Ran {
        status: ExitStatus,
        stdout_truncated: bool,
        stderr_truncated: bool,
        usage: ResourceUsage,
        receipt: Box<Receipt>,
    },
    Failed {
        kind: String,
        message: String,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Splits the host's framed stdout into the guest's streams, forwarding them to the
/// caller's sink as they arrive.
struct Demux {
    user: Option<Arc<dyn OutputSink>>,
    state: Mutex<DemuxState>,
}

#[derive(Default)]
struct DemuxState {
    decoder: Decoder,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    result: Option<Vec<u8>>,
    host_stderr: Vec<u8>,
}

impl OutputSink for Demux {
    fn on_output(&self, stream: Stream, chunk: &[u8]) {
        let mut state = lock(&self.state);
        if stream == Stream::Stderr {
            let room = (64usize << 10).saturating_sub(state.host_stderr.len());
            state
                .host_stderr
                .extend_from_slice(&chunk[..room.min(chunk.len())]);
            return;
        }
        let DemuxState {
            decoder,
            stdout,
            stderr,
            result,
            ..
        } = &mut *state;
        decoder.feed(chunk, |tag, payload| match tag {
            frame::STDOUT => {
                stdout.extend_from_slice(payload);
                if let Some(sink) = &self.user {
                    sink.on_output(Stream::Stdout, payload);
                }
            }
            frame::STDERR => {
                stderr.extend_from_slice(payload);
                if let Some(sink) = &self.user {
                    sink.on_output(Stream::Stderr, payload);
                }
            }
            _ => *result = Some(payload.to_vec()),
        });
    }
}

/// A read-only file mount of Strata's own (the host binary, the artifact, the module the
/// caller named), not a directory grant: its path may go through symlinks.
fn mount_file(host: &Path, name: &str) -> (Mount, PathBuf) {
    let guest = Path::new(GUEST_DIR).join(name);
    (
        Mount::new(host.to_path_buf(), guest.clone(), Access::ReadOnly).follow_symlinks(),
        guest,
    )
}

/// Runs `program` inside the outer backend.
pub(crate) fn run(
    inner: &Inner,
    layering: &Layering,
    program: &Program,
    caps: &Caps,
    ctx: &RunContext,
) -> Result<RunOutput> {
    let loaded = inner.load(program)?;
    let scratch = tempfile::Builder::new()
        .prefix("strata-wasm-")
        .tempdir()
        .map_err(|e| {
            Error::setup(
                SetupStage::Host,
                "create a scratch directory for the layered run",
                e,
            )
        })?;
    let artifact = inner.cache.artifact(&loaded, scratch.path())?;
    let artifact_name = artifact
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "module.cwasm".into());
    let (host_mount, host_guest) = mount_file(&layering.host_binary, "strata-wasm-host");
    let (artifact_mount, artifact_guest) = mount_file(&artifact, &artifact_name);
    let (source_mount, source_guest) = mount_file(&program.module, "source.wasm");

    // The inner run sees each mount at its guest path, which is where the outer layer
    // puts it.
    let mut inner_caps = caps.clone();
    inner_caps.stdin = Vec::new();
    for m in &mut inner_caps.mounts {
        m.host = m.guest.clone();
    }
    // The outer sandbox binds the host-executed paths of writable grants read-only; inside
    // it, writes there fail with EROFS whatever the inner preopen allows.
    inner_caps.protect_host_executed = false;
    let request = HostRequest {
        version: VERSION,
        program: Program {
            module: artifact_guest,
            argv: program.argv.clone(),
            entry: program.entry,
        },
        source: source_guest,
        caps: inner_caps,
        strictness: ctx.strictness,
        fuel: inner.config.fuel,
    };
    let header = serde_json::to_vec(&request).map_err(|e| Error::Internal {
        message: format!("cannot encode the layered request: {e}"),
        source: None,
    })?;
    let mut stdin = Vec::with_capacity(4 + header.len() + caps.stdin.len());
    stdin.extend_from_slice(&(header.len() as u32).to_le_bytes());
    stdin.extend_from_slice(&header);
    stdin.extend_from_slice(&caps.stdin);

    let mut outer = Caps::new().system(SystemDirs::Runtime);
    outer.mounts = caps.mounts.clone();
    outer
        .mounts
        .extend([host_mount, artifact_mount, source_mount]);
    outer.net = caps.net.clone();
    outer.stdin = stdin;
    let l = &caps.limits;
    outer.limits.timeout = l.timeout + GRACE;
    outer.limits.cpu_time = l.cpu_time + GRACE;
    outer.limits.memory = ByteSize(l.memory.bytes().saturating_add(HOST_MEMORY));
    outer.limits.processes = HOST_TASKS;
    // Both guest streams travel on the host's stdout, each chunk with a 5-byte frame header
    // (a guest writing one byte at a time makes 6 bytes of frames per byte).
    outer.limits.output = ByteSize(l.output.bytes().saturating_mul(12).saturating_add(1 << 20));
    outer.limits.open_files = l.open_files.saturating_add(64);
    outer.limits.disk = l.disk;
    outer.limits.file_size = l.file_size;

    let demux = Arc::new(Demux {
        user: ctx.sink.clone(),
        state: Mutex::default(),
    });
    // The guest's stdin after the header: the caps' bytes, then the caller's stream, which
    // the outer backend streams into the host's stdin pipe.
    let outer_ctx = RunContext {
        strictness: ctx.strictness,
        cancel: ctx.cancel.clone(),
        sink: Some(demux.clone()),
        stdin: ctx.stdin.clone(),
        ..RunContext::default()
    };
    let tool = Tool::Command {
        argv: vec![host_guest.display().to_string()],
    };
    let out = layering.outer.run_caps(&tool, &outer, &outer_ctx)?;
    drop(scratch);
    let mut state = std::mem::take(&mut *lock(&demux.state));
    if state.result.is_none() && !out.stdout.is_empty() && state.stdout.is_empty() {
        // The outer backend did not stream: decode what it captured.
        let mut decoder = Decoder::default();
        let DemuxState {
            stdout,
            stderr,
            result,
            ..
        } = &mut state;
        decoder.feed(&out.stdout, |tag, payload| match tag {
            frame::STDOUT => stdout.extend_from_slice(payload),
            frame::STDERR => stderr.extend_from_slice(payload),
            _ => *result = Some(payload.to_vec()),
        });
    }
    let host_stderr = if state.host_stderr.is_empty() {
        String::from_utf8_lossy(&out.stderr).into_owned()
    } else {
        String::from_utf8_lossy(&state.host_stderr).into_owned()
    };
    let result = state
        .result
        .as_deref()
        .map(serde_json::from_slice::<HostResult>);
    let mut receipt = out.receipt.clone();
    receipt.layers = vec![out.receipt.backend, BackendKind::Wasm];
    match (out.status, result) {
        (
            ExitStatus::Exited { code: 0 },
            Some(Ok(HostResult::Ran {
                status,
                stdout_truncated,
                stderr_truncated,
                usage,
                receipt: inner_receipt,
            })),
        ) => {
            receipt.enforced.extend(inner_receipt.enforced);
            receipt.gaps.extend(
                inner_receipt
                    .gaps
                    .into_iter()
                    .filter(|g| g.reason != crate::receipt::HOST_EXECUTED_WRITABLE),
            );
            receipt.denials.extend(inner_receipt.denials);
            Ok(RunOutput {
                status,
                stdout: state.stdout,
                stderr: state.stderr,
                stdout_truncated,
                stderr_truncated,
                duration: out.duration,
                usage,
                receipt,
            })
        }
        (_, Some(Ok(HostResult::Failed { kind, message }))) => Err(rebuild_error(&kind, message)),
        (ExitStatus::Exited { code: 0 }, _) | (ExitStatus::Exited { .. }, None) => {
            Err(Error::Internal {
                message: format!(
                    "the layered wasm host ended without a result (status {}): {}",
                    out.status,
                    host_stderr.trim()
                ),
                source: None,
            })
        }
        (status, _) => {
            // The outer layer ended the host: a limit, or a signal (seccomp, a crash).
            receipt.deny(
                sandbox_core::Capability::Lifetime,
                format!(
                    "the wasm host was ended by the {} layer: {status}",
                    out.receipt.backend
                ),
            );
            Ok(RunOutput {
                status,
                stdout: state.stdout,
                stderr: state.stderr,
                stdout_truncated: false,
                stderr_truncated: false,
                duration: out.duration,
                usage: out.usage,
                receipt,
            })
        }
    }
}

fn rebuild_error(kind: &str, message: String) -> Error {
    match kind {
        "invalid_request" => Error::InvalidRequest { reason: message },
        "backend_unavailable" => Error::unavailable(BackendKind::Wasm, message),
        "unenforceable" => Error::unenforceable("wasm (inner layer)", message),
        "cancelled" => Error::Cancelled,
        _ => Error::Internal {
            message: format!("layered wasm host: {message}"),
            source: None,
        },
    }
}

/// Writes frames to this process's stdout (the host side).
struct FrameWriter;

impl OutputSink for FrameWriter {
    fn on_output(&self, stream: Stream, chunk: &[u8]) {
        let tag = match stream {
            Stream::Stdout => frame::STDOUT,
            Stream::Stderr => frame::STDERR,
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&frame::encode(tag, chunk));
        let _ = out.flush();
    }
}

/// Reads the request header, exactly: what follows it is the guest's stdin.
fn read_request(input: &mut impl Read) -> std::result::Result<HostRequest, String> {
    let mut len = [0u8; 4];
    input
        .read_exact(&mut len)
        .map_err(|e| format!("cannot read the request length: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HEADER {
        return Err(format!("request of {len} bytes is too large"));
    }
    let mut header = vec![0; len];
    input
        .read_exact(&mut header)
        .map_err(|e| format!("cannot read the request: {e}"))?;
    let request: HostRequest =
        serde_json::from_slice(&header).map_err(|e| format!("invalid request: {e}"))?;
    if request.version != VERSION {
        return Err(format!(
            "request version {} (this host speaks {VERSION})",
            request.version
        ));
    }
    Ok(request)
}

/// Runs the request, streaming `stdin` (the rest of the host's stdin) to the guest.
fn host_run(request: HostRequest, stdin: OwnedFd) -> Result<RunOutput> {
    let config = WasmConfig {
        cache_dir: None,
        interpreter_dir: None,
        max_concurrent_runs: 1,
        pooling: false,
        fuel: request.fuel,
        layered: None,
        ..WasmConfig::default()
    };
    let backend = WasmBackend::with_config(config)?;
    let inner = &backend.inner;
    let mut caps = request.caps;
    caps.stdin = Vec::new();
    let ctx = host_context(request.strictness, stdin);
    let plan = plan::plan(&caps, request.strictness)?;
    let prepared = match crate::cache::load_precompiled(&request.program.module, &inner.linkers) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "compiling the module inside the sandbox instead");
            let source = Program {
                module: request.source.clone(),
                ..request.program.clone()
            };
            return inner.run_here(&source, &plan, &caps, &ctx);
        }
    };
    inner.run_prepared(&prepared, &request.program, &plan, &caps, &ctx)
}

fn host_context(strictness: Strictness, stdin: OwnedFd) -> RunContext {
    RunContext {
        strictness,
        cancel: sandbox_core::CancelToken::new(),
        sink: Some(Arc::new(FrameWriter)),
        stdin: Some(Arc::new(StdinSource::from_fd(stdin))),
        ..RunContext::default()
    }
}

/// Entry point of the `strata-wasm-host` binary: reads one request from stdin, runs it,
/// writes frames to stdout, and returns the process exit code (0 when a result frame was
/// written). Not meant to be run by hand.
pub fn host_main() -> i32 {
    // Unbuffered, so nothing past the header is consumed here.
    let request = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("cannot duplicate stdin: {e}"))
        .map(std::fs::File::from)
        .and_then(|mut stdin| Ok((read_request(&mut stdin)?, stdin)));
    let result = match request {
        Ok((request, stdin)) => match host_run(request, stdin.into()) {
            Ok(out) => HostResult::Ran {
                status: out.status,
                stdout_truncated: out.stdout_truncated,
                stderr_truncated: out.stderr_truncated,
                usage: out.usage,
                receipt: Box::new(out.receipt),
            },
            Err(e) => HostResult::Failed {
                kind: e.kind().code().to_string(),
                message: match e {
                    Error::InvalidRequest { reason } => reason,
                    Error::BackendUnavailable { reason, .. } => reason,
                    Error::Unenforceable {
                        guarantee, reason, ..
                    } => {
                        format!("{guarantee}: {reason}")
                    }
                    other => other.to_string(),
                },
            },
        },
        Err(message) => HostResult::Failed {
            kind: ErrorKind::Internal.code().to_string(),
            message,
        },
    };
    let Ok(payload) = serde_json::to_vec(&result) else {
        eprintln!("strata-wasm-host: cannot encode the result");
        return 70;
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&frame::encode(frame::RESULT, &payload))
        .is_err()
        || out.flush().is_err()
    {
        return 74;
    }
    0
}
