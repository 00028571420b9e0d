//! Node.js binding of Strata, built with napi-rs.
//!
//! This crate is the native half of the `strata-sandbox` npm package (`index.js` wraps it
//! into the public API: `Sandbox`, `Tool`, the error classes and the agent adapters). It
//! only converts values and maps errors; every sandbox decision is the `strata` crate's.
//!
//! A run never blocks the JavaScript thread: [`NativeSandbox::run`] converts its arguments,
//! hands the blocking `Sandbox::run_with` call to a thread of a private blocking pool (hop
//! one: a futex wake-up, no libuv-pool queue), and that thread reports back through the
//! JavaScript thread's shared threadsafe function (hop two: `uv_async_send`): output chunks
//! first (when asked for), then the outcome, in that order.
//!
//! Two hops, because everything a run does before the tool starts (the id registry and its
//! file lock, cgroup directories, spawning the helper) takes a millisecond or more and may
//! wait, so none of it can run on the JavaScript thread; `bench/overhead.mjs` measures
//! what each hop costs.

#![deny(missing_docs)]

pub mod agents;
mod convert;
mod deliver;
pub mod live;
pub mod policy;
pub mod session;
pub mod workspace;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use napi::bindgen_prelude::{Either, External, FnArgs, Function, Unknown};
use napi::{Env, Status};
use napi_derive::napi;
use strata::{
    BackendKind, BackendReport, CancelToken, Caps, DoctorReport, OutputSink, Receipt, RunContext,
    Sandbox, Stream, Strictness,
};

use crate::convert::{Finished, NativeError, NodeCaps, NodeTool};
use crate::deliver::{Event, EventArgs, Reply};

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
    /// Check every run against this tier (`low`, `medium`, `high` or one of `tiers_json`).
    pub tier: Option<String>,
    /// Tiers the embedder defines, as a JSON array of tier objects.
    pub tiers_json: Option<String>,
    /// Append every run, refusal and policy decision to this hash-chained JSONL log.
    pub audit: Option<String>,
    /// Backends the risk router may choose (default: all).
    pub route_backends: Option<Vec<String>>,
    /// Let the router use a backend below a risk's floor (said in the receipt).
    pub allow_weaker: Option<bool>,
    /// A profile file (TOML, or JSON for `*.json`): its backend (unless `backend` names one
    /// other than `auto`), strictness (unless `strict` is given), tiers and tier (unless
    /// `tier` is given), and the caps and risk of runs that give none.
    pub profile: Option<String>,
}

/// Per-run policy options of [`NativeSandbox::run`].
#[napi(object)]
pub struct NativeRunPolicy {
    /// Check this run against this tier instead of the sandbox's.
    pub tier: Option<String>,
    /// `compute`, `files`, `build` or `untrusted`: with backend `auto` the backend is chosen
    /// from it.
    pub risk: Option<String>,
    /// With a workspace: where the tool sees it (default: the workspace's source path).
    pub at: Option<String>,
    /// With a session: this call's timeout in milliseconds (`0`: none; default the caps').
    pub timeout_ms: Option<f64>,
}

/// A sandbox handle: the backend choice and strictness, with backends created on first use
/// and reused. Made by [`create_sandbox`].
#[napi]
pub struct NativeSandbox {
    pub(crate) inner: Sandbox,
    /// The profile's caps and risk, for runs that give none.
    pub(crate) profile: Option<Arc<strata::Profile>>,
}

/// Builds a sandbox, or returns why not (an unknown or not compiled-in backend, a bad
/// tier, an audit log that does not verify). `approver(id, requestJson)` decides requests
/// beyond the tier and answers through `answerElevation`.
#[napi]
pub fn create_sandbox(
    options: NativeSandboxOptions,
    approver: Option<Function<'_, FnArgs<(f64, String)>, ()>>,
) -> napi::Result<Either<NativeSandbox, NativeError>> {
    let approver = approver.map(policy::NodeApprover::new).transpose()?;
    let profile = match options
        .profile
        .as_deref()
        .map(|p| strata::Profile::load(std::path::Path::new(p)))
    {
        Some(Ok(profile)) => Some(profile),
        Some(Err(e)) => return Ok(Either::B((&e).into())),
        None => None,
    };
    let strictness = match (options.strict, &profile) {
        (Some(true), _) => Strictness::Strict,
        (Some(false), _) => Strictness::BestEffort,
        (None, Some(profile)) => profile.strictness,
        (None, None) => Strictness::Strict,
    };
    let built = convert::backend_choice(options.backend.as_deref()).and_then(|backend| {
        let mut builder = Sandbox::builder();
        if let Some(profile) = &profile {
            builder = profile.apply(builder);
        }
        if backend != strata::BackendChoice::Auto || profile.is_none() {
            builder = builder.backend(backend);
        }
        builder = builder.strictness(strictness);
        if let Some(helper) = options.helper {
            builder = builder.helper(helper);
        }
        if let Some(json) = &options.tiers_json {
            let tiers: Vec<strata::policy::Tier> = serde_json::from_str(json)
                .map_err(|e| strata::Error::invalid(format!("tiers: {e}")))?;
            for tier in tiers {
                builder = builder.define_tier(tier);
            }
        }
        if let Some(tier) = options.tier {
            builder = builder.tier(tier);
        }
        if let Some(approver) = approver {
            builder = builder.approver(approver);
        }
        if let Some(audit) = options.audit {
            builder = builder.audit(audit);
        }
        let mut route = strata::policy::RoutePolicy {
            allow_weaker: options.allow_weaker.unwrap_or(false),
            ..strata::policy::RoutePolicy::default()
        };
        if let Some(names) = &options.route_backends {
            route.allowed = names
                .iter()
                .map(|n| n.parse::<BackendKind>())
                .collect::<strata::Result<_>>()?;
        }
        builder.route_policy(route).build()
    });
    Ok(match built {
        Ok(inner) => Either::A(NativeSandbox {
            inner,
            profile: profile.map(Arc::new),
        }),
        Err(err) => Either::B(NativeError::from(&err)),
    })
}

/// Bits of [`NativeSandbox::run`]'s `flags`: stream stdout chunks to the callback.
pub const RUN_STDOUT: u32 = 1;
/// Stream stderr chunks to the callback.
pub const RUN_STDERR: u32 = 2;
/// Report a run that did not exit 0 as an error too (`tool_failed` or `limit_exceeded`),
/// with its output. Without it a non-zero exit is data.
pub const RUN_CHECK: u32 = 4;

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

    /// Revokes every elevation granted so far.
    #[napi]
    pub fn revoke_elevations(&self) {
        self.inner.revoke_elevations();
    }

    /// Starts running `tool` with `caps` on a pool thread and returns at once.
    ///
    /// Returns the error when the request cannot be converted (nothing ran); otherwise
    /// `callback` gets the stdout `(0, chunk)` and stderr `(1, chunk)` chunks that `flags`
    /// asks for ([`RUN_STDOUT`], [`RUN_STDERR`]), as `Buffer`s, and then exactly one
    /// `(2, error, exitCode, ...)`, whose arguments are listed at `DoneArgs` (convert.rs).
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        env: Env,
        tool: Unknown<'_>,
        caps: Unknown<'_>,
        flags: u32,
        cancel: Option<&NativeCancel>,
        callback: Function<'_, EventArgs, ()>,
        policy: Option<NativeRunPolicy>,
        workspace: Option<&workspace::NativeWorkspace>,
        session: Option<&session::NativeSession>,
    ) -> napi::Result<Option<NativeError>> {
        let policy = policy.unwrap_or(NativeRunPolicy {
            tier: None,
            risk: None,
            at: None,
            timeout_ms: None,
        });
        let session = session.map(|s| s.session.clone());
        let timeout = match policy.timeout_ms {
            Some(ms) if ms.is_finite() && ms >= 0.0 => Some(Duration::from_secs_f64(ms / 1000.0)),
            Some(ms) => {
                let e = strata::Error::invalid(format!(
                    "timeoutMs must be a non-negative number of milliseconds, got {ms}"
                ));
                return Ok(Some((&e).into()));
            }
            None => None,
        };
        let staged = workspace.map(|w| (Arc::clone(&w.shared), policy.at.clone()));
        let risk = match policy
            .risk
            .as_deref()
            .map(str::parse::<strata::policy::Risk>)
            .transpose()
        {
            Ok(risk) => risk.or_else(|| self.profile.as_ref().and_then(|p| p.risk)),
            Err(e) => return Ok(Some((&e).into())),
        };
        let tool = match env.from_js_value::<NodeTool, _>(tool) {
            Ok(tool) => tool.0,
            Err(e) => return Ok(Some((&convert::invalid_argument("tool", &e)).into())),
        };
        let caps: Caps = match (
            env.from_js_value::<Option<NodeCaps>, _>(caps),
            &self.profile,
        ) {
            (Ok(None), Some(profile)) => profile.caps.clone(),
            (Ok(caps), _) => caps.unwrap_or_default().into(),
            (Err(e), _) => return Ok(Some((&convert::invalid_argument("caps", &e)).into())),
        };
        let pool = match pool() {
            Ok(pool) => pool,
            Err(e) => return Ok(Some((&e).into())),
        };
        let reply = Reply::open(&env, &callback)?;
        let (want_stdout, want_stderr) = (flags & RUN_STDOUT != 0, flags & RUN_STDERR != 0);
        let sink: Option<Arc<dyn OutputSink>> = if want_stdout || want_stderr {
            let reply = reply.clone();
            Some(Arc::new(move |stream: Stream, chunk: &[u8]| {
                let wanted = match stream {
                    Stream::Stdout => want_stdout,
                    Stream::Stderr => want_stderr,
                };
                if wanted {
                    reply.send(Event::Chunk(stream, chunk.to_vec()));
                }
            }))
        } else {
            None
        };
        let ctx = RunContext {
            cancel: cancel.map(|c| c.token.clone()).unwrap_or_default(),
            sink,
            tier: policy.tier,
            risk,
            ..RunContext::default()
        };
        let check = flags & RUN_CHECK != 0;
        let sandbox = self.inner.clone();
        pool.spawn_blocking(move || {
            // A panic must still settle the Promise (and release the callback and the event
            // loop), or the event loop would wait for it forever.
            let finished = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let start = Instant::now();
                let result = match (&staged, &session) {
                    (_, Some(session)) => {
                        let call = strata::session::Call {
                            timeout,
                            ctx: ctx.clone(),
                        };
                        session.run_with(&tool, &call)
                    }
                    (Some((shared, at)), None) => workspace::with(shared, |ws| {
                        let at = at.as_deref().map(std::path::Path::new);
                        sandbox.run_in_workspace(ws, at, &tool, &caps, &ctx)
                    }),
                    (None, None) => sandbox.run_with(&tool, &caps, &ctx),
                };
                Finished::new(result, start.elapsed(), check)
            }))
            .unwrap_or_else(|_| {
                let panicked = strata::Error::Internal {
                    message: "the run panicked".to_string(),
                    source: None,
                };
                Finished::new(Err(panicked), Duration::ZERO, check)
            });
            // The sink holds a clone of the reply; drop it before the last event so the
            // callback is released on the JavaScript thread once that event is delivered.
            drop(ctx);
            reply.send(Event::Done(Box::new(finished)));
        });
        Ok(None)
    }
}

/// The receipt a run's last callback carried, as JSON (read when JavaScript first asks).
#[napi]
pub fn receipt_json(receipt: &External<Receipt>) -> napi::Result<String> {
    serde_json::to_string(&**receipt).map_err(|e| napi::Error::new(Status::GenericFailure, e))
}

/// Test probe for `test/`, not part of the package's API: the caps object converted and
/// validated exactly as [`NativeSandbox::run`] takes it, as the JSON of `Caps` (the shared
/// schema, `schema/caps.schema.json`), or the error a run with it would be refused with.
#[napi]
pub fn caps_json(env: Env, caps: Unknown<'_>) -> napi::Result<Either<String, NativeError>> {
    let caps: Caps = match env.from_js_value::<Option<NodeCaps>, _>(caps) {
        Ok(caps) => caps.unwrap_or_default().into(),
        Err(e) => return Ok(Either::B((&convert::invalid_argument("caps", &e)).into())),
    };
    if let Err(e) = caps.validate() {
        return Ok(Either::B((&e).into()));
    }
    serde_json::to_string(&caps)
        .map(Either::A)
        .map_err(|e| napi::Error::new(Status::GenericFailure, e))
}

/// Benchmark probe for `bench/overhead.mjs`, not part of the package's API: the two hops of
/// a run around a sleep instead of a sandbox, through the same pool and threadsafe function.
/// `callback(3, hopAUs, hopBUs, sleptUs)` gets the latency of the hand-off to the pool
/// (from just before it to the pool thread running), of the way back (from just before the
/// threadsafe call to the callback running) and how long the pool thread actually slept.
#[napi]
pub fn probe_hops(
    env: Env,
    sleep_us: u32,
    callback: Function<'_, EventArgs, ()>,
) -> napi::Result<()> {
    let pool = pool().map_err(|e| napi::Error::new(Status::GenericFailure, e.to_string()))?;
    let reply = Reply::open(&env, &callback)?;
    let handed = Instant::now();
    pool.spawn_blocking(move || {
        let hop_a = handed.elapsed();
        let asleep = Instant::now();
        if sleep_us > 0 {
            std::thread::sleep(Duration::from_micros(u64::from(sleep_us)));
        }
        reply.send(Event::Probe {
            hop_a,
            slept: asleep.elapsed(),
        });
    });
    Ok(())
}

/// Benchmark probe for `bench/overhead.mjs`, not part of the package's API: for the last run
/// that ended on this JavaScript thread, microseconds from its run thread queuing the final
/// event to the callback being called (the hop back, as `probe_hops` times it).
#[napi]
pub fn probe_last_hop_us() -> f64 {
    deliver::last_hop().as_secs_f64() * 1e6
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

/// `$STRATA_HELPER` when set, else the `strata-helper` in `package_dir` when it is an
/// executable file, else `undefined` ([`strata::packaged_helper`]).
#[napi]
pub fn packaged_helper(package_dir: String) -> Option<String> {
    strata::packaged_helper(std::path::Path::new(&package_dir)).map(|p| p.display().to_string())
}

/// The version of the native addon (the `strata` crate's version).
#[napi]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
