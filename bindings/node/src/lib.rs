//! Node.js binding of Strata, built with napi-rs.
//!
//! This crate is the native half of the `strata-sandbox` npm package (`index.js` wraps it
//! into the public API: `Sandbox`, `Tool`, the error classes and the agent adapters). It
//! only converts values and maps errors; every sandbox decision is the `strata` crate's.
//!
//! A run never blocks the JavaScript thread: [`NativeSandbox::run`] converts its arguments,
//! hands the blocking `Sandbox::run_with` call to a thread of a private blocking pool, and
//! reports back through one threadsafe function per run: output chunks first (when asked
//! for), then the outcome, in that order.

#![deny(missing_docs)]

mod convert;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use napi::bindgen_prelude::{Buffer, Either, FnArgs, Function, Unknown};
use napi::threadsafe_function::{ThreadsafeCallContext, ThreadsafeFunctionCallMode};
use napi::{Env, Status};
use napi_derive::napi;
use strata::{
    BackendKind, BackendReport, CancelToken, Caps, DoctorReport, OutputSink, RunContext, Sandbox,
    Stream, Strictness,
};

use crate::convert::{Finished, NativeError, NativeOutcome, NodeCaps, NodeTool};

/// Options of [`create_sandbox`]. Every field is optional.
#[napi(object)]
pub struct NativeSandboxOptions {
    /// `auto` (default: WebAssembly modules to `wasm`, everything else to `process`),
    /// `process`, `wasm`, `container` or `microvm`.
    pub backend: Option<String>,
    /// Default `true`: refuse runs whose caps cannot be fully enforced on this host.
    /// `false` runs them best-effort and lists the gaps in the receipt.
    pub strict: Option<bool>,
    /// Path of the `strata-helper` binary the process backend runs. Default: `$STRATA_HELPER`,
    /// then next to the running executable (`index.js` passes the packaged one).
    pub helper: Option<String>,
}

/// A sandbox handle: the backend choice and strictness, with backends created on first use
/// and reused. Made by [`create_sandbox`].
#[napi]
pub struct NativeSandbox {
    inner: Sandbox,
}

/// Builds a sandbox, or returns why not (an unknown or not compiled-in backend).
#[napi]
pub fn create_sandbox(options: NativeSandboxOptions) -> Either<NativeSandbox, NativeError> {
    let strictness = if options.strict.unwrap_or(true) {
        Strictness::Strict
    } else {
        Strictness::BestEffort
    };
    let built = convert::backend_choice(options.backend.as_deref()).and_then(|backend| {
        let mut builder = Sandbox::builder().backend(backend).strictness(strictness);
        if let Some(helper) = options.helper {
            builder = builder.helper(helper);
        }
        builder.build()
    });
    match built {
        Ok(inner) => Either::A(NativeSandbox { inner }),
        Err(err) => Either::B(NativeError::from(&err)),
    }
}

/// Which output a run streams to its callback. Default: none.
#[napi(object)]
pub struct RunFlags {
    /// Send stdout chunks (event kind 0).
    pub stdout: Option<bool>,
    /// Send stderr chunks (event kind 1).
    pub stderr: Option<bool>,
    /// Report a run that did not exit 0 as an error too (`tool_failed` or
    /// `limit_exceeded`), with its output. Default: a non-zero exit is data.
    pub check: Option<bool>,
}

/// Cancels one run: the sandbox and everything in it is killed and the run ends with the
/// `cancelled` error. Cancelling after the run ended does nothing.
#[napi]
pub struct NativeCancel {
    token: CancelToken,
}

impl Default for NativeCancel {
    fn default() -> Self {
        Self::new()
    }
}

#[napi]
impl NativeCancel {
    /// A token that has not been cancelled.
    #[napi(constructor)]
    pub fn new() -> Self {
        NativeCancel {
            token: CancelToken::new(),
        }
    }

    /// Cancels the run this token was given to (now, or as soon as it starts).
    #[napi]
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// Whether [`NativeCancel::cancel`] was called.
    #[napi(getter)]
    pub fn cancelled(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// What a run reports to its callback, in order.
enum Event {
    Chunk(Stream, Vec<u8>),
    Done(Box<Finished>),
}

/// The callback's arguments: an event kind and its payload.
type EventArgs = FnArgs<(u32, Either<Buffer, NativeOutcome>)>;

/// Event kinds as the callback receives them.
const STDOUT: u32 = 0;
const STDERR: u32 = 1;
const DONE: u32 = 2;

#[napi]
impl NativeSandbox {
    /// The backend choice (`auto`, `process`, ...).
    #[napi(getter)]
    pub fn backend(&self) -> String {
        self.inner.choice().to_string()
    }

    /// Whether runs are strict (refused when their caps cannot be enforced).
    #[napi(getter)]
    pub fn strict(&self) -> bool {
        self.inner.strictness() == Strictness::Strict
    }

    /// Starts running `tool` with `caps` on a pool thread and returns at once.
    ///
    /// Returns the error when the request cannot be converted (nothing ran); otherwise
    /// `callback(kind, payload)` gets the stdout (0) and stderr (1) chunks that `flags` asks
    /// for, as `Buffer`s, and then exactly one `(2, outcome)`.
    #[napi]
    pub fn run(
        &self,
        env: Env,
        tool: Unknown<'_>,
        caps: Unknown<'_>,
        flags: RunFlags,
        cancel: Option<&NativeCancel>,
        callback: Function<'_, EventArgs, ()>,
    ) -> napi::Result<Option<NativeError>> {
        let tool = match env.from_js_value::<NodeTool, _>(tool) {
            Ok(tool) => tool.0,
            Err(e) => return Ok(Some((&convert::invalid_argument("tool", &e)).into())),
        };
        let caps: Caps = match env.from_js_value::<Option<NodeCaps>, _>(caps) {
            Ok(caps) => caps.unwrap_or_default().into(),
            Err(e) => return Ok(Some((&convert::invalid_argument("caps", &e)).into())),
        };
        let pool = match pool() {
            Ok(pool) => pool,
            Err(e) => return Ok(Some((&e).into())),
        };
        let tsfn = Arc::new(
            callback
                .build_threadsafe_function::<Event>()
                .callee_handled::<false>()
                .build_callback(|ctx: ThreadsafeCallContext<Event>| Ok(to_js_args(ctx.value)))?,
        );
        let (want_stdout, want_stderr) =
            (flags.stdout.unwrap_or(false), flags.stderr.unwrap_or(false));
        let sink: Option<Arc<dyn OutputSink>> = if want_stdout || want_stderr {
            let tsfn = Arc::clone(&tsfn);
            Some(Arc::new(move |stream: Stream, chunk: &[u8]| {
                let wanted = match stream {
                    Stream::Stdout => want_stdout,
                    Stream::Stderr => want_stderr,
                };
                if wanted {
                    tsfn.call(
                        Event::Chunk(stream, chunk.to_vec()),
                        ThreadsafeFunctionCallMode::NonBlocking,
                    );
                }
            }))
        } else {
            None
        };
        let ctx = RunContext {
            cancel: cancel.map(|c| c.token.clone()).unwrap_or_default(),
            sink,
            ..RunContext::default()
        };
        let check = flags.check.unwrap_or(false);
        let sandbox = self.inner.clone();
        pool.spawn_blocking(move || {
            let start = Instant::now();
            // A panic must still settle the Promise (and release the callback), or the
            // event loop would wait for it forever.
            let result =
                std::panic::catch_unwind(AssertUnwindSafe(|| sandbox.run_with(&tool, &caps, &ctx)))
                    .unwrap_or_else(|_| {
                        Err(strata::Error::Internal {
                            message: "the run panicked".to_string(),
                            source: None,
                        })
                    });
            let native = start.elapsed();
            // The sink holds a reference to the callback; drop it before the last event so
            // the callback is released as soon as that event is delivered.
            drop(ctx);
            let finished = Finished::new(result, native, check);
            tsfn.call(
                Event::Done(Box::new(finished)),
                ThreadsafeFunctionCallMode::NonBlocking,
            );
        });
        Ok(None)
    }
}

/// The callback's arguments for `event`, on the JavaScript thread.
fn to_js_args(event: Event) -> EventArgs {
    FnArgs::from(match event {
        Event::Chunk(Stream::Stdout, chunk) => (STDOUT, Either::A(Buffer::from(chunk))),
        Event::Chunk(Stream::Stderr, chunk) => (STDERR, Either::A(Buffer::from(chunk))),
        Event::Done(finished) => (DONE, Either::B(finished.into_outcome())),
    })
}

/// The blocking pool runs go on: threads are reused between runs (no thread start per
/// call), created on demand up to 1024 at once, and leave after 10 s idle.
fn pool() -> Result<&'static tokio::runtime::Runtime, strata::Error> {
    static POOL: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .thread_name("strata-run")
            .max_blocking_threads(1024)
            .thread_keep_alive(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| strata::Error::Internal {
        message: format!("cannot start the run thread pool: {e}"),
        source: None,
    })
}

/// Probes this host: which backends and guarantees are available, and why not, as the
/// JSON of `DoctorReport`. `helper` is the `strata-helper` the process backend would use.
#[napi]
pub fn doctor(helper: Option<String>) -> napi::Result<String> {
    let mut builder = Sandbox::builder();
    if let Some(helper) = helper {
        builder = builder.helper(helper);
    }
    let report = match builder.build() {
        Ok(sandbox) => DoctorReport {
            backends: BackendKind::ALL
                .into_iter()
                .map(|kind| match sandbox.backend(kind) {
                    Ok(backend) => backend.report(),
                    Err(e) => BackendReport::unavailable(kind, e.to_string()),
                })
                .collect(),
        },
        Err(_) => strata::doctor(),
    };
    serde_json::to_string(&report).map_err(|e| napi::Error::new(Status::GenericFailure, e))
}

/// The version of the native addon (the `strata` crate's version).
#[napi]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
