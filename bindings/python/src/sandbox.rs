//! `Sandbox`: the handle that runs tools, with the GIL released during each run.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use strata::policy::{Risk, RoutePolicy};
use strata::{
    BackendChoice, BackendKind, CancelToken, Caps, Error, ExitStatus, Receipt, ResourceUsage,
    RunContext, RunOutput, Sandbox, Stream, Strictness, Tool,
};

use crate::convert;
use crate::errors::{to_py, IntoPyResult};
use crate::logging::{self, CallScope};
use crate::policy;
use crate::result::{PyDoctorReport, PyRunResult};
use crate::types::{PyCaps, PyTool};

/// Runs tools in sandboxes. Thread-safe; runs release the GIL, so threads run
/// concurrently.
///
/// `Sandbox(backend="auto", *, strict=True, helper=None)`:
///
/// - `backend`: `"auto"` (default: WebAssembly modules on `wasm`, everything else on
///   `process`), `"process"`, `"wasm"`, `"container"` or `"microvm"`.
/// - `strict`: `True` (default) refuses a run whose caps this host cannot fully enforce
///   (UnenforceableError, nothing runs); `False` runs anyway and lists the gaps in the
///   receipt.
/// - `helper`: path of the `strata-helper` binary of the process backend. The `strata`
///   package passes `$STRATA_HELPER` or the copy shipped inside the wheel.
/// - `warm_pool`: process sandboxes kept pre-built per caps shape already run. Default
///   `None`: sized by recent demand (at most 4 per shape, 8 in all, killed after 30 s
///   unused); `0` turns pre-building off. A warm run skips most of the sandbox setup. Each
///   pre-built sandbox serves one run.
///
/// Use it as a context manager (or call `close()`) to kill runs still in flight when
/// leaving.
#[pyclass(frozen, subclass, module = "strata._strata", name = "Sandbox")]
pub struct PySandbox {
    pub(crate) sandbox: Sandbox,
    backend: String,
    strict: bool,
    helper: Option<PathBuf>,
    closed: AtomicBool,
    /// Cancelled by `close()`; every run links its own token to it.
    pub(crate) shutdown: CancelToken,
    /// The profile's caps and risk: what runs without `caps` (or `risk`) get.
    pub(crate) profile: Option<strata::Profile>,
}

/// Streaming callbacks of one run, called on the thread that runs the sandbox.
pub(crate) struct PySink {
    callbacks: [Option<Py<PyAny>>; 2],
    text: bool,
    /// Incomplete UTF-8 sequences held back per stream (text mode).
    pending: Mutex<[Vec<u8>; 2]>,
    /// The first exception a callback raised; it cancels the run.
    error: Mutex<Option<PyErr>>,
    cancel: CancelToken,
}

/// Appends `chunk` to `pending` and returns the longest decodable prefix (invalid bytes
/// replaced by U+FFFD), keeping an incomplete trailing sequence in `pending`.
fn decode_utf8(pending: &mut Vec<u8>, chunk: &[u8]) -> String {
    if pending.is_empty() {
        if let Ok(s) = std::str::from_utf8(chunk) {
            return s.to_owned();
        }
    }
    pending.extend_from_slice(chunk);
    let mut out = String::new();
    let mut rest: &[u8] = pending;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                out.push_str(&String::from_utf8_lossy(valid));
                match e.error_len() {
                    Some(len) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[len..];
                    }
                    None => {
                        rest = after;
                        break;
                    }
                }
            }
        }
    }
    *pending = rest.to_vec();
    out
}

impl PySink {
    fn index(stream: Stream) -> usize {
        match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    fn failed(&self) -> bool {
        self.error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    fn fail(&self, err: PyErr) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(err);
        }
        drop(slot);
        self.cancel.cancel();
    }

    fn deliver(&self, py: Python<'_>, index: usize, text: Option<String>, chunk: &[u8]) {
        let Some(callback) = &self.callbacks[index] else {
            return;
        };
        let arg = match text {
            Some(text) => PyString::new(py, &text).into_any(),
            None => PyBytes::new(py, chunk).into_any(),
        };
        if let Err(e) = callback.call1(py, (arg,)) {
            self.fail(e);
        }
    }

    fn on_output(&self, stream: Stream, chunk: &[u8]) {
        let index = Self::index(stream);
        if self.callbacks[index].is_none() || self.failed() {
            return;
        }
        let text = if self.text {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let text = decode_utf8(&mut pending[index], chunk);
            if text.is_empty() {
                return;
            }
            Some(text)
        } else {
            None
        };
        Python::try_attach(|py| self.deliver(py, index, text, chunk));
    }

    /// Delivers held-back bytes and returns the first exception a callback raised.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        if self.text && !self.failed() {
            let rests: Vec<(usize, Vec<u8>)> = {
                let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
                pending
                    .iter_mut()
                    .enumerate()
                    .filter(|(_, p)| !p.is_empty())
                    .map(|(i, p)| (i, std::mem::take(p)))
                    .collect()
            };
            for (index, rest) in rests {
                let text = String::from_utf8_lossy(&rest).into_owned();
                self.deliver(py, index, Some(text), &rest);
            }
        }
        match self
            .error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

fn callable(py: Python<'_>, cb: Option<Py<PyAny>>, name: &str) -> PyResult<Option<Py<PyAny>>> {
    match cb {
        Some(cb) if cb.is_none(py) => Ok(None),
        Some(cb) if !cb.bind(py).is_callable() => {
            Err(PyTypeError::new_err(format!("{name} must be callable")))
        }
        other => Ok(other),
    }
}

/// A run context with its own cancel token (or, when only `close()` can cancel it, the
/// sandbox's `shared` one) and, when callbacks are given, a sink.
pub(crate) fn context(
    py: Python<'_>,
    shared: Option<&CancelToken>,
    on_stdout: Option<Py<PyAny>>,
    on_stderr: Option<Py<PyAny>>,
    text: bool,
    policy: &RunPolicy,
) -> PyResult<(RunContext, Option<Arc<PySink>>)> {
    let on_stdout = callable(py, on_stdout, "on_stdout")?;
    let on_stderr = callable(py, on_stderr, "on_stderr")?;
    let mut ctx = RunContext {
        tier: policy.tier.clone(),
        risk: match &policy.risk {
            Some(risk) => Some(risk.parse::<Risk>().py_err(py)?),
            None => None,
        },
        ..RunContext::default()
    };
    if on_stdout.is_none() && on_stderr.is_none() {
        if let Some(shutdown) = shared {
            // Nothing but `close()` cancels this run: share the sandbox's token.
            ctx.cancel = shutdown.clone();
        }
        return Ok((ctx, None));
    }
    let sink = Arc::new(PySink {
        callbacks: [on_stdout, on_stderr],
        text,
        pending: Mutex::new([Vec::new(), Vec::new()]),
        error: Mutex::new(None),
        cancel: ctx.cancel.clone(),
    });
    let for_core = Arc::clone(&sink);
    ctx.sink = Some(Arc::new(move |stream: Stream, chunk: &[u8]| {
        for_core.on_output(stream, chunk)
    }));
    Ok((ctx, Some(sink)))
}

/// A run's `tier` and `risk` keywords.
#[derive(Default)]
pub(crate) struct RunPolicy {
    pub(crate) tier: Option<String>,
    pub(crate) risk: Option<String>,
}

/// The Python outcome of a run: callback exceptions first, then the run's own result.
pub(crate) fn finish(
    py: Python<'_>,
    result: strata::Result<RunOutput>,
    sink: Option<&PySink>,
) -> PyResult<PyRunResult> {
    if let Some(sink) = sink {
        sink.finish(py)?;
    }
    match result {
        Ok(output) => Ok(PyRunResult { output }),
        Err(e) => Err(to_py(py, &e)),
    }
}

pub(crate) fn tool_arg<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, Tool>> {
    match obj.cast::<PyTool>() {
        Ok(tool) => Ok(Cow::Borrowed(&tool.get().tool)),
        Err(_) => Ok(Cow::Owned(Tool::command(convert::argv(obj)?))),
    }
}

fn caps_arg<'a>(obj: Option<&'a Bound<'_, PyAny>>) -> PyResult<Cow<'a, Caps>> {
    match obj {
        Some(obj) => match obj.cast::<PyCaps>() {
            Ok(caps) => Ok(Cow::Borrowed(&caps.get().caps)),
            Err(_) => PyCaps::from_arg(Some(obj)).map(Cow::Owned),
        },
        None => Ok(Cow::Owned(Caps::new())),
    }
}

/// What the benchmark's no-op path returns instead of running anything.
fn noop_output() -> RunOutput {
    RunOutput {
        status: ExitStatus::Exited { code: 0 },
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration: Duration::ZERO,
        usage: ResourceUsage::default(),
        receipt: Receipt::new(BackendKind::Process, Strictness::Strict),
    }
}

impl PySandbox {
    /// `caps` as given, else the profile's, else `Caps()`.
    pub(crate) fn caps_or_profile<'a>(
        &'a self,
        caps: Option<&'a Bound<'_, PyAny>>,
    ) -> PyResult<Cow<'a, Caps>> {
        match (caps, &self.profile) {
            (None, Some(profile)) => Ok(Cow::Borrowed(&profile.caps)),
            (caps, _) => caps_arg(caps),
        }
    }

    /// The run's risk, else the profile's.
    pub(crate) fn risk_or_profile(&self, policy: RunPolicy) -> RunPolicy {
        let profile_risk = self.profile.as_ref().and_then(|p| p.risk);
        RunPolicy {
            risk: policy
                .risk
                .or_else(|| profile_risk.map(|r| r.as_str().to_string())),
            ..policy
        }
    }

    pub(crate) fn ensure_open(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(to_py(
                py,
                &Error::invalid("this Sandbox is closed; create a new one"),
            ));
        }
        Ok(())
    }

    /// The blocking run shared by `run` and the benchmark's no-op path.
    #[allow(clippy::too_many_arguments)]
    fn run_blocking<F>(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyAny>>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
        policy: RunPolicy,
        exec: F,
    ) -> PyResult<PyRunResult>
    where
        F: FnOnce(&Sandbox, &Tool, &Caps, &RunContext) -> strata::Result<RunOutput> + Send,
    {
        self.ensure_open(py)?;
        let tool = tool_arg(tool)?;
        let caps = self.caps_or_profile(caps)?;
        let policy = self.risk_or_profile(policy);
        let (ctx, sink) = context(
            py,
            Some(&self.shutdown),
            on_stdout,
            on_stderr,
            text,
            &policy,
        )?;
        logging::refresh_level(py);
        let result = py.detach(|| {
            let _scope = CallScope::enter();
            let _link = sink.as_ref().map(|_| link(&self.shutdown, &ctx.cancel));
            exec(&self.sandbox, &tool, &caps, &ctx)
        });
        logging::drain(py);
        drop(ctx);
        finish(py, result, sink.as_deref())
    }
}

/// Runs `exec` on a new thread and returns its handle at once; `done(result, error)` is
/// called on that thread when it ends (one of the two is `None`).
pub(crate) fn spawn_run<F>(
    py: Python<'_>,
    ctx: RunContext,
    sink: Option<Arc<PySink>>,
    shutdown: CancelToken,
    done: Py<PyAny>,
    exec: F,
) -> PyResult<PyRunHandle>
where
    F: FnOnce(&RunContext) -> strata::Result<RunOutput> + Send + 'static,
{
    let handle = PyRunHandle {
        cancel: ctx.cancel.clone(),
    };
    logging::refresh_level(py);
    std::thread::Builder::new()
        .name("strata-run".into())
        .spawn(move || {
            let result = {
                let _scope = CallScope::enter();
                let _link = link(&shutdown, &ctx.cancel);
                exec(&ctx)
            };
            Python::try_attach(move |py| {
                logging::drain(py);
                drop(ctx);
                let (value, error) = match finish(py, result, sink.as_deref()) {
                    Ok(result) => match Py::new(py, result) {
                        Ok(obj) => (obj.into_any(), py.None()),
                        Err(e) => (py.None(), e.into_value(py).into_any()),
                    },
                    Err(e) => (py.None(), e.into_value(py).into_any()),
                };
                if let Err(e) = done.call1(py, (value, error)) {
                    e.write_unraisable(py, Some(done.bind(py)));
                }
            });
        })
        .map_err(|e| to_py(py, &Error::internal("cannot start a run thread", e)))?;
    Ok(handle)
}

/// Cancels `run` when `shutdown` is cancelled, until the returned guard drops.
pub(crate) fn link(shutdown: &CancelToken, run: &CancelToken) -> impl Drop {
    let run = run.clone();
    shutdown.on_cancel(move || run.cancel())
}

#[pymethods]
impl PySandbox {
    #[new]
    #[pyo3(signature = (
        backend = "auto",
        *,
        strict = None,
        helper = None,
        warm_pool = None,
        tier = None,
        tiers = None,
        approver = None,
        audit = None,
        route_backends = None,
        allow_weaker = false,
        profile = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: &str,
        strict: Option<bool>,
        helper: Option<PathBuf>,
        warm_pool: Option<usize>,
        tier: Option<String>,
        tiers: Option<Vec<Bound<'_, PyAny>>>,
        approver: Option<Py<PyAny>>,
        audit: Option<PathBuf>,
        route_backends: Option<Vec<String>>,
        allow_weaker: bool,
        profile: Option<PathBuf>,
    ) -> PyResult<Self> {
        let profile = profile
            .map(|path| strata::Profile::load(&path))
            .transpose()
            .py_err(py)?;
        let mut builder = Sandbox::builder();
        if let Some(profile) = &profile {
            builder = profile.apply(builder);
        }
        // Explicit arguments win over the profile: a backend other than "auto", a strictness.
        let mut choice: BackendChoice = backend.parse().py_err(py)?;
        match (&profile, choice) {
            (Some(profile), BackendChoice::Auto) => choice = profile.backend,
            _ => builder = builder.backend(choice),
        }
        let strict = strict.unwrap_or_else(|| {
            profile
                .as_ref()
                .is_none_or(|p| p.strictness == Strictness::Strict)
        });
        builder = builder.strictness(if strict {
            Strictness::Strict
        } else {
            Strictness::BestEffort
        });
        if let Some(per_shape) = warm_pool {
            builder = builder.warm_pool(per_shape);
        }
        if let Some(path) = &helper {
            builder = builder.helper(path);
        }
        for definition in tiers.unwrap_or_default() {
            builder = builder.define_tier(policy::tier(&definition)?);
        }
        if let Some(name) = tier {
            builder = builder.tier(name);
        }
        if let Some(callback) = approver {
            builder = builder.approver(policy::PyApprover::new(py, callback)?);
        }
        if let Some(path) = audit {
            builder = builder.audit(path);
        }
        let mut route = RoutePolicy {
            allow_weaker,
            ..RoutePolicy::default()
        };
        if let Some(names) = route_backends {
            route.allowed = names
                .iter()
                .map(|n| n.parse::<BackendKind>())
                .collect::<strata::Result<_>>()
                .py_err(py)?;
        }
        builder = builder.route_policy(route);
        Ok(PySandbox {
            sandbox: py.detach(|| builder.build()).py_err(py)?,
            backend: choice.to_string(),
            strict,
            helper,
            closed: AtomicBool::new(false),
            shutdown: CancelToken::new(),
            profile,
        })
    }

    /// Runs `tool` with `caps` and returns its RunResult, blocking until the run and
    /// everything it started are gone. The GIL is released meanwhile.
    ///
    /// - `tool`: an argv list (`["python3", "-c", code]`) or a `Tool`.
    /// - `caps`: a `Caps`, a dict of Caps keywords, or `None` (default: `Caps()`).
    /// - `on_stdout`, `on_stderr`: called with each chunk of output as it arrives, on the
    ///   thread running the sandbox; `str` chunks (UTF-8, split sequences held back, invalid
    ///   bytes replaced) unless `text=False`, then `bytes`. If a callback raises, the run is
    ///   killed and the exception propagates.
    ///
    /// A non-zero exit, a signal or a limit is a RunResult, not an exception. Raises
    /// InvalidRequestError, DeniedError, BackendUnavailableError, UnenforceableError,
    /// SetupFailedError or InternalError when the run was refused or could not start
    /// (then nothing of the tool ran), CancelledError when `close()` cancelled it.
    ///
    /// - `tier`: check this run against that tier instead of the sandbox's (DeniedError
    ///   beyond it, unless the approver grants it).
    /// - `risk`: `"compute"`, `"files"`, `"build"` or `"untrusted"`; with backend `"auto"`
    ///   the backend is chosen from it, never below the risk's floor unless the sandbox
    ///   has `allow_weaker=True` (`receipt.policy["route"]` says why).
    #[pyo3(signature = (
        tool, caps = None, *, on_stdout = None, on_stderr = None, text = true, tier = None,
        risk = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyAny>>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
        tier: Option<String>,
        risk: Option<String>,
    ) -> PyResult<PyRunResult> {
        self.run_blocking(
            py,
            tool,
            caps,
            on_stdout,
            on_stderr,
            text,
            RunPolicy { tier, risk },
            |sandbox, tool, caps, ctx| sandbox.run_with(tool, caps, ctx),
        )
    }

    /// Runs `tool` with `caps` plus `workspace`'s staging copy mounted read-write at `at`
    /// (default: the workspace's source path): the tool sees the source's files, and its
    /// writes stay in the copy until `workspace.commit()`. The tier sees a read of the
    /// source. Otherwise as `run`.
    #[pyo3(signature = (
        workspace, tool, caps = None, *, at = None, tier = None, risk = None, on_stdout = None,
        on_stderr = None, text = true
    ))]
    #[allow(clippy::too_many_arguments)]
    fn run_in_workspace(
        &self,
        py: Python<'_>,
        workspace: &Bound<'_, crate::workspace::PyWorkspace>,
        tool: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyAny>>,
        at: Option<PathBuf>,
        tier: Option<String>,
        risk: Option<String>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
    ) -> PyResult<PyRunResult> {
        let workspace = workspace.get();
        self.run_blocking(
            py,
            tool,
            caps,
            on_stdout,
            on_stderr,
            text,
            RunPolicy { tier, risk },
            |sandbox, tool, caps, ctx| {
                workspace.staged(|ws| sandbox.run_in_workspace(ws, at.as_deref(), tool, caps, ctx))
            },
        )
    }

    /// Opens a `Session`: a sandbox whose files live across calls. `caps` default to the
    /// profile's, else `Caps()`; `workdir` (default the profile's `[session]` workdir, else
    /// `/workspace`) is the guest path of its directory; `max_transfer` (bytes or `"256M"`)
    /// bounds each file copy.
    #[pyo3(signature = (caps = None, *, workdir = None, max_transfer = None))]
    fn session(
        &self,
        py: Python<'_>,
        caps: Option<&Bound<'_, PyAny>>,
        workdir: Option<PathBuf>,
        max_transfer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<crate::session::PySession> {
        crate::session::PySession::open(py, self, caps, workdir, max_transfer)
    }

    /// Starts a `LiveSandbox`: one sandbox that stays up for a task (process backend).
    /// `caps` default to the profile's, else `Caps()`; `ttl` and `idle_ttl` (seconds) end
    /// it; `idle_pause` (seconds) freezes it while idle until the next request that needs
    /// it running; `publish` lists TCP ports inside to publish on host loopback;
    /// `supervisor` is the `strata-live` binary (default: the package's). Owned by the
    /// returned handle.
    #[pyo3(signature = (
        caps = None, *, ttl = None, idle_ttl = None, idle_pause = None, name = None,
        publish = Vec::new(), supervisor = None, state_dir = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        caps: Option<&Bound<'_, PyAny>>,
        ttl: Option<&Bound<'_, PyAny>>,
        idle_ttl: Option<&Bound<'_, PyAny>>,
        idle_pause: Option<&Bound<'_, PyAny>>,
        name: Option<String>,
        publish: Vec<u16>,
        supervisor: Option<PathBuf>,
        state_dir: Option<PathBuf>,
    ) -> PyResult<crate::live::PyLiveSandbox> {
        crate::live::start(
            py, self, caps, ttl, idle_ttl, idle_pause, name, publish, supervisor, state_dir,
        )
    }

    /// Starts a `LiveSandbox` from the snapshot `snapshot` (`LiveSandbox.snapshot`): it is
    /// verified first (seal, owner, every file), its caps are admitted under this sandbox's
    /// tier, and it starts on the snapshot's backend with its files copied in.
    #[pyo3(signature = (
        snapshot, *, ttl = None, idle_ttl = None, name = None, publish = Vec::new(),
        supervisor = None, state_dir = None, snapshot_dir = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn start_from(
        &self,
        py: Python<'_>,
        snapshot: String,
        ttl: Option<&Bound<'_, PyAny>>,
        idle_ttl: Option<&Bound<'_, PyAny>>,
        name: Option<String>,
        publish: Vec<u16>,
        supervisor: Option<PathBuf>,
        state_dir: Option<PathBuf>,
        snapshot_dir: Option<PathBuf>,
    ) -> PyResult<crate::live::PyLiveSandbox> {
        crate::live::start_from(
            py,
            self,
            snapshot,
            ttl,
            idle_ttl,
            name,
            publish,
            supervisor,
            state_dir,
            snapshot_dir,
        )
    }

    /// Revokes every elevation the approver granted so far; later runs beyond their tier
    /// ask again.
    fn revoke_elevations(&self) {
        self.sandbox.revoke_elevations();
    }

    /// Benchmark only: does everything `run` does (argument conversion, GIL release, the
    /// result object) except running a sandbox, and returns a fixed successful result.
    #[pyo3(signature = (tool, caps = None, *, on_stdout = None, on_stderr = None, text = true))]
    fn _run_noop(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyAny>>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
    ) -> PyResult<PyRunResult> {
        self.run_blocking(
            py,
            tool,
            caps,
            on_stdout,
            on_stderr,
            text,
            RunPolicy::default(),
            |_, _, _, _| Ok(noop_output()),
        )
    }

    /// Starts a run on a new thread and returns its RunHandle at once; `done(result,
    /// error)` is called on that thread when it ends (one of the two is `None`). The
    /// building block of `Sandbox.arun`; arguments as for `run`.
    #[pyo3(signature = (
        tool, caps, done, *, on_stdout = None, on_stderr = None, text = true, tier = None,
        risk = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn _start(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        caps: Option<&Bound<'_, PyAny>>,
        done: Py<PyAny>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
        tier: Option<String>,
        risk: Option<String>,
    ) -> PyResult<PyRunHandle> {
        self.ensure_open(py)?;
        if !done.bind(py).is_callable() {
            return Err(PyTypeError::new_err("done must be callable"));
        }
        let tool = tool_arg(tool)?.into_owned();
        let caps = self.caps_or_profile(caps)?.into_owned();
        let policy = self.risk_or_profile(RunPolicy { tier, risk });
        let (ctx, sink) = context(py, None, on_stdout, on_stderr, text, &policy)?;
        let sandbox = self.sandbox.clone();
        spawn_run(py, ctx, sink, self.shutdown.clone(), done, move |ctx| {
            sandbox.run_with(&tool, &caps, ctx)
        })
    }

    /// Probes this host as this sandbox would use it (its helper included): which
    /// backends and guarantees are available, and why not.
    fn doctor(&self, py: Python<'_>) -> PyDoctorReport {
        let report = py.detach(|| self.sandbox.doctor());
        PyDoctorReport { report }
    }

    /// Kills every run still in flight on this sandbox (they raise CancelledError) and its
    /// pre-built sandboxes, and refuses new runs. Idempotent.
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::Release);
        self.shutdown.cancel();
        py.detach(|| self.sandbox.close_warm_pool());
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The backend choice: `"auto"`, `"process"`, `"wasm"`, ...
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether runs whose caps cannot be fully enforced are refused.
    #[getter]
    fn strict(&self) -> bool {
        self.strict
    }

    /// The helper binary path given at construction, if any.
    #[getter]
    fn helper(&self) -> Option<String> {
        self.helper.as_ref().map(|p| p.display().to_string())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get();
        let name = slf.get_type().name()?;
        Ok(format!(
            "{name}(backend={}, strict={}{})",
            PyString::new(slf.py(), &this.backend).repr()?,
            if this.strict { "True" } else { "False" },
            if this.closed() { ", closed" } else { "" }
        ))
    }
}

/// A run started by `Sandbox._start` (what `arun` awaits).
#[pyclass(frozen, module = "strata._strata", name = "RunHandle")]
pub struct PyRunHandle {
    cancel: CancelToken,
}

#[pymethods]
impl PyRunHandle {
    /// Kills the run and everything it started; it then ends with CancelledError.
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether `cancel()` was called.
    #[getter]
    fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}
