//! The contract between the `Sandbox` facade and each isolation backend.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::caps::Caps;
use crate::doctor::BackendReport;
use crate::error::{Error, Result};
use crate::grant::RealHost;
use crate::output::RunOutput;
use crate::spec::RunSpec;
use crate::tool::Tool;

/// An isolation backend. Implementations receive a [`RunSpec`] planned (validated, grants
/// resolved) for their kind, refuse what they cannot enforce (unless
/// [`Strictness::BestEffort`]), run the tool, and report what they enforced.
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Runs `tool` under `spec` (planned for this backend's kind with [`RunSpec::plan`]),
    /// blocking until the run and everything it started are gone.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a spec planned for another kind; the backend's own
    /// refusals and setup failures otherwise.
    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput>;

    /// Plans `caps` for this backend on the real host ([`RunSpec::plan`] with
    /// [`RealHost`]) and runs `tool` under them: for callers that hold caps, not a spec.
    ///
    /// # Errors
    /// As [`RunSpec::plan`] and [`Backend::run`].
    fn run_caps(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        let spec = RunSpec::plan(self.kind(), tool, caps, &RealHost)?;
        self.run(tool, &spec, ctx)
    }

    /// Probes the host: is this backend usable here, and which guarantees does it have.
    fn report(&self) -> BackendReport;

    /// Whether this backend, as configured on this host, has what `tool` needs (the wasm
    /// backend: the WASI interpreter of a script's language). Cheap, and touches nothing
    /// but the backend's own files; the router asks it before choosing a backend, so a
    /// tool this backend cannot start falls to the next one instead of failing.
    /// Default: `Ok(())`. Errors are those [`Backend::run`] would return for the tool
    /// (typically [`Error::BackendUnavailable`]).
    fn supports(&self, tool: &Tool) -> Result<()> {
        let _ = tool;
        Ok(())
    }
}

/// The backends Strata knows.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BackendKind {
    /// Linux process sandbox: namespaces, landlock, seccomp, cgroups, rlimits.
    Process,
    /// wasmtime + WASI.
    Wasm,
    /// OCI image rootfs on the process sandbox, or a container engine.
    Container,
    /// A microVM (QEMU microvm or Firecracker).
    Microvm,
    /// A pod on a Kubernetes cluster through kubernetes-sigs/agent-sandbox (gVisor or Kata
    /// runtime classes). Never picked by the router: only when asked for by name, on a
    /// sandbox given a cluster to use.
    Cluster,
}

impl BackendKind {
    /// The backends of this machine, in routing preference order ([`BackendKind::Cluster`]
    /// is not one: it runs elsewhere and is only used when named).
    pub const ALL: [BackendKind; 4] = [
        BackendKind::Process,
        BackendKind::Wasm,
        BackendKind::Container,
        BackendKind::Microvm,
    ];

    /// The lowercase name used by the CLI and bindings.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Process => "process",
            BackendKind::Wasm => "wasm",
            BackendKind::Container => "container",
            BackendKind::Microvm => "microvm",
            BackendKind::Cluster => "cluster",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        BackendKind::ALL
            .into_iter()
            .chain([BackendKind::Cluster])
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown backend {s:?} (expected process, wasm, container, microvm or cluster)"
                ))
            })
    }
}

/// What happens when a guarantee the caps need cannot be enforced on this host.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Strictness {
    /// Refuse the run with [`Error::Unenforceable`] naming the missing guarantee. Default.
    #[default]
    Strict,
    /// Run with what can be enforced and list each gap in the receipt. Spelled
    /// `best_effort`; `best-effort` is read as a legacy spelling.
    #[serde(alias = "best-effort")]
    BestEffort,
}

impl fmt::Display for Strictness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strictness::Strict => "strict",
            Strictness::BestEffort => "best_effort",
        })
    }
}

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives output while the run is going (streaming callbacks). Chunks arrive in order per
/// stream; the kept output in [`RunOutput`] is unaffected.
pub trait OutputSink: Send + Sync {
    /// Called with each chunk read from the tool, at most up to the output limit.
    fn on_output(&self, stream: Stream, chunk: &[u8]);
}

impl<F: Fn(Stream, &[u8]) + Send + Sync> OutputSink for F {
    fn on_output(&self, stream: Stream, chunk: &[u8]) {
        self(stream, chunk)
    }
}

/// Per-run options that are not capabilities.
#[derive(Clone, Default)]
pub struct RunContext {
    /// Strict (default) or best-effort.
    pub strictness: Strictness,
    /// Cancelling it kills the run; `run` then returns [`Error::Cancelled`].
    pub cancel: CancelToken,
    /// Streaming output callback.
    pub sink: Option<Arc<dyn OutputSink>>,
    /// Standard input streamed to the tool while it runs, after the bytes of
    /// [`Caps::stdin`]. Default: none (the tool's stdin ends after `Caps::stdin`). See
    /// [`StdinSource`] for the buffering and limits every backend applies.
    #[cfg(unix)]
    pub stdin: Option<Arc<StdinSource>>,
    /// The trust tier to check this run against, by name (a preset `low`, `medium`,
    /// `high`, or one the sandbox defines). Default: the sandbox's tier, if any. Backends
    /// ignore it; `strata::Sandbox` applies it.
    pub tier: Option<String>,
    /// The declared risk; with backend `auto` the router picks the backend from it (see
    /// the policy crate's router). Default: none (backend by the tool's kind).
    pub risk: Option<crate::risk::Risk>,
}

impl fmt::Debug for RunContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RunContext");
        d.field("strictness", &self.strictness)
            .field("cancelled", &self.cancel.is_cancelled())
            .field("sink", &self.sink.is_some())
            .field("tier", &self.tier)
            .field("risk", &self.risk);
        #[cfg(unix)]
        d.field("stdin", &self.stdin);
        d.finish()
    }
}

/// How much of a [`StdinSource`] a backend holds in memory at once: it reads at most this
/// many bytes ahead of what the tool has consumed.
pub const STDIN_BUFFER: usize = 64 * 1024;

/// A stream the tool reads on its standard input while it runs, for input that is too
/// large, endless or slow to hand over as [`Caps::stdin`] bytes (a pipe from another
/// program, a terminal, a socket, a file).
///
/// Every backend streams it; none reads it whole:
///
/// - the tool gets the bytes of `Caps::stdin` first, then the stream; end of file on the
///   stream closes the tool's stdin;
/// - at most [`STDIN_BUFFER`] bytes are read ahead of what the tool consumed (plus what the
///   backend's own pipe or connection buffers), so a producer that never stops is held
///   back, not buffered;
/// - the wall-clock timeout, the other limits and cancellation apply while the stream is
///   open: a producer that never closes cannot keep a run alive;
/// - when the tool exits or closes its stdin, reading stops; what it did not read stays
///   unread. A read error on the stream ends the tool's input like end of file.
///
/// A source feeds one run: the run that takes it owns the file descriptor and closes it
/// when the run ends, and a later run given the same source is refused with
/// [`Error::InvalidRequest`]. While a run reads it, the descriptor's open file description
/// is switched to non-blocking (shared with any duplicate of it, such as a shell's
/// terminal) and switched back when the run ends.
#[cfg(unix)]
pub struct StdinSource {
    fd: Mutex<Option<std::os::fd::OwnedFd>>,
}

#[cfg(unix)]
impl StdinSource {
    /// Streams from `fd`: a pipe, FIFO, socket, terminal or regular file (any readable file
    /// descriptor; a regular file is read from its current offset).
    pub fn from_fd(fd: impl Into<std::os::fd::OwnedFd>) -> Self {
        StdinSource {
            fd: Mutex::new(Some(fd.into())),
        }
    }

    /// Takes the descriptor for a run. Backends call this once they are about to start the
    /// tool, so a request refused earlier leaves the source for another run.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when an earlier run already took it.
    pub fn take(&self) -> Result<std::os::fd::OwnedFd> {
        let mut guard = match self.fd.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.take().ok_or_else(|| {
            Error::invalid(
                "the stdin stream was already used by an earlier run (a stream feeds one run)",
            )
        })
    }

    /// Whether a run has taken the descriptor.
    pub fn is_taken(&self) -> bool {
        match self.fd.lock() {
            Ok(guard) => guard.is_none(),
            Err(poisoned) => poisoned.into_inner().is_none(),
        }
    }
}

#[cfg(unix)]
impl fmt::Debug for StdinSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdinSource")
            .field("taken", &self.is_taken())
            .finish()
    }
}

type Callback = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct CancelInner {
    cancelled: AtomicBool,
    next_id: AtomicU64,
    callbacks: Mutex<Vec<(u64, Callback)>>,
}

/// A cloneable cancellation flag. Backends register a wake-up with
/// [`CancelToken::on_cancel`] so cancelling interrupts a blocked run at once.
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl CancelToken {
    /// A token that has not been cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels; runs every registered callback once.
    pub fn cancel(&self) {
        if self.inner.cancelled.swap(true, Ordering::SeqCst) {
            return;
        }
        let callbacks = match self.inner.callbacks.lock() {
            Ok(mut guard) => std::mem::take(&mut *guard),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        for (_, callback) in callbacks {
            callback();
        }
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Runs `callback` when cancelled (at once if already cancelled). The registration is
    /// removed when the returned guard drops.
    pub fn on_cancel(&self, callback: impl Fn() + Send + Sync + 'static) -> CancelRegistration {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut guard = match self.inner.callbacks.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            if !self.is_cancelled() {
                guard.push((id, Box::new(callback)));
                return CancelRegistration {
                    token: self.clone(),
                    id,
                };
            }
        }
        callback();
        CancelRegistration {
            token: self.clone(),
            id,
        }
    }
}

/// Removes a cancel callback when dropped.
pub struct CancelRegistration {
    token: CancelToken,
    id: u64,
}

impl Drop for CancelRegistration {
    fn drop(&mut self) {
        let mut guard = match self.token.inner.callbacks.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn cancel_runs_callbacks_once_and_late_registrations_immediately() {
        let token = CancelToken::new();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let _reg = token.on_cancel(move || {
            h.fetch_add(1, Ordering::SeqCst);
        });
        token.cancel();
        token.cancel();
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        let h = hits.clone();
        let _late = token.on_cancel(move || {
            h.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(hits.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn dropped_registration_is_not_called() {
        let token = CancelToken::new();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        drop(token.on_cancel(move || {
            h.fetch_add(1, Ordering::SeqCst);
        }));
        token.cancel();
        assert_eq!(hits.load(Ordering::SeqCst), 0);
    }

    #[cfg(unix)]
    #[test]
    fn stdin_source_feeds_one_run() {
        let file = std::fs::File::open("/dev/null").expect("open /dev/null");
        let source = StdinSource::from_fd(file);
        assert!(!source.is_taken());
        let _fd = source.take().expect("first take");
        assert!(source.is_taken());
        let err = source.take().expect_err("second take");
        assert_eq!(err.kind(), crate::ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("already used"));
    }

    #[test]
    fn unknown_backend_names_the_choices() {
        let err = "vm".parse::<BackendKind>().expect_err("unknown");
        assert!(err
            .to_string()
            .contains("process, wasm, container, microvm or cluster"));
        assert_eq!(
            "cluster".parse::<BackendKind>().expect("known"),
            BackendKind::Cluster
        );
    }
}
