//! `RunResult`, `Receipt` and `DoctorReport`: read-only views of the core's results.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use serde_json::Value;
use strata::{Capability, DoctorReport, Receipt, RunOutput};

use crate::convert::json_to_py;
use crate::errors::{invalid, to_py_with_result};

/// The result of a run that happened. A non-zero exit, a signal or a limit is data here,
/// not an exception; call `check()` to raise on failure.
#[pyclass(frozen, module = "strata._strata", name = "RunResult")]
pub struct PyRunResult {
    pub output: RunOutput,
}

fn serialize<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<Value> {
    serde_json::to_value(value).map_err(|e| invalid(py, format!("cannot serialize: {e}")))
}

fn text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// At most `max` characters of `s`, with `...` when cut.
fn preview(py: Python<'_>, s: &str, max: usize) -> PyResult<String> {
    let cut: String = s.chars().take(max).collect();
    let suffix = if cut.len() < s.len() { "..." } else { "" };
    Ok(format!("{}{suffix}", PyString::new(py, &cut).repr()?))
}

#[pymethods]
impl PyRunResult {
    /// Standard output decoded as UTF-8 (invalid bytes replaced by U+FFFD).
    #[getter]
    fn stdout(&self) -> std::borrow::Cow<'_, str> {
        text(&self.output.stdout)
    }

    /// Standard error decoded as UTF-8 (invalid bytes replaced by U+FFFD).
    #[getter]
    fn stderr(&self) -> std::borrow::Cow<'_, str> {
        text(&self.output.stderr)
    }

    /// Standard output as bytes, exactly as the tool wrote it (up to the output limit).
    #[getter]
    fn stdout_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.output.stdout)
    }

    /// Standard error as bytes, exactly as the tool wrote it (up to the output limit).
    #[getter]
    fn stderr_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.output.stderr)
    }

    /// Whether stdout was cut at the output limit.
    #[getter]
    fn stdout_truncated(&self) -> bool {
        self.output.stdout_truncated
    }

    /// Whether stderr was cut at the output limit.
    #[getter]
    fn stderr_truncated(&self) -> bool {
        self.output.stderr_truncated
    }

    /// The exit code when the tool exited normally, else `None` (signal or limit).
    #[getter]
    fn exit_code(&self) -> Option<i32> {
        self.output.exit_code()
    }

    /// The signal that ended the tool, if any.
    #[getter]
    fn signal(&self) -> Option<i32> {
        self.output.signal()
    }

    /// Whether the wall-clock timeout ended the run.
    #[getter]
    fn timed_out(&self) -> bool {
        self.output.timed_out()
    }

    /// The limit that ended the run (`"wall"`, `"cpu"`, `"memory"`, `"pids"`, `"output"`,
    /// `"disk"`, `"file_size"`, `"fuel"`, `"open_files"`), or `None`.
    #[getter]
    fn limit(&self) -> Option<&'static str> {
        self.output.limit().map(|l| l.as_str())
    }

    /// Whether the tool exited with code 0.
    #[getter]
    fn ok(&self) -> bool {
        self.output.success()
    }

    /// How the run ended, as text (`"exit code 0"`, `"wall limit exceeded"`, ...).
    #[getter]
    fn status(&self) -> String {
        self.output.status.to_string()
    }

    /// Wall time of the run in seconds, measured by the backend.
    #[getter]
    fn duration(&self) -> f64 {
        self.output.duration.as_secs_f64()
    }

    /// Resources used: `{"user_cpu_us", "system_cpu_us", "peak_memory_bytes"}`.
    #[getter]
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.output.usage)?)
    }

    /// The backend that ran the tool (`"process"`, `"wasm"`, ...).
    #[getter]
    fn backend(&self) -> &'static str {
        self.output.receipt.backend.as_str()
    }

    /// What was enforced for this run, and what was denied.
    #[getter]
    fn receipt(&self) -> PyReceipt {
        PyReceipt {
            receipt: self.output.receipt.clone(),
        }
    }

    /// Returns this result when the tool exited with code 0. Otherwise raises
    /// SandboxTimeoutError (a TimeoutError) on timeout, LimitExceededError for another
    /// limit, or ToolFailedError; the exception's `result` is this RunResult.
    fn check(slf: &Bound<'_, Self>) -> PyResult<Py<Self>> {
        let py = slf.py();
        match slf.get().output.clone().check() {
            Ok(_) => Ok(slf.clone().unbind()),
            Err(e) => Err(to_py_with_result(py, &e, slf.clone().into_any().unbind())),
        }
    }

    /// The result as a dict, the CLI's `--json` object: `exit_code, signal, timed_out,
    /// limit, stdout, stderr, stdout_truncated, stderr_truncated, duration_ms, usage,
    /// receipt`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.output.to_json())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let out = &self.output;
        let status = match (out.limit(), out.exit_code(), out.signal()) {
            (Some(limit), _, _) => format!("limit='{}'", limit.as_str()),
            (None, Some(code), _) => format!("exit_code={code}"),
            (None, None, Some(signal)) => format!("signal={signal}"),
            _ => format!("status={:?}", out.status.to_string()),
        };
        Ok(format!(
            "RunResult({status}, duration={:.1}ms, stdout={}, stderr={}, backend='{}')",
            out.duration.as_secs_f64() * 1000.0,
            preview(py, &text(&out.stdout), 60)?,
            preview(py, &text(&out.stderr), 60)?,
            out.receipt.backend.as_str(),
        ))
    }
}

/// What a run actually enforced, per capability and mechanism, and what it saw denied.
/// `str(receipt)` is the human-readable form the CLI prints.
#[pyclass(frozen, module = "strata._strata", name = "Receipt")]
pub struct PyReceipt {
    pub receipt: Receipt,
}

#[pymethods]
impl PyReceipt {
    /// The backend that ran the tool (the outermost layer).
    #[getter]
    fn backend(&self) -> &'static str {
        self.receipt.backend.as_str()
    }

    /// Isolation layers from outermost to innermost.
    #[getter]
    fn layers(&self) -> Vec<&'static str> {
        self.receipt.layers.iter().map(|l| l.as_str()).collect()
    }

    /// `"strict"` or `"best_effort"`.
    #[getter]
    fn strictness(&self, py: Python<'_>) -> PyResult<String> {
        match serialize(py, &self.receipt.strictness)? {
            Value::String(s) => Ok(s),
            other => Ok(other.to_string()),
        }
    }

    /// Every guarantee in force: dicts `{"capability", "kind", "mechanism", "detail"}`, where
    /// `kind` is the family of mechanism (`"landlock"`, `"seccomp"`, `"cgroup"`, ...).
    #[getter]
    fn enforced<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.enforced)?)
    }

    /// Guarantees not enforced: `{"capability", "reason", "by_request"?}`; `by_request`
    /// (true) marks a relaxation the caller asked for, the only kind a strict run keeps.
    #[getter]
    fn gaps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.gaps)?)
    }

    /// Denials and limit hits observed: `{"capability", "detail"}`.
    #[getter]
    fn denials<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.denials)?)
    }

    /// Container runs only: `{"runtime", "image", "digest"}` (the image id, `sha256:...`, or
    /// `dir:PATH` for a root file system directory); `None` for other backends.
    #[getter]
    fn container<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.container)?)
    }

    /// The host identity the tool ran as: `{"agent"?, "source", "host_uid", "host_gid",
    /// "uid", "gid"}`, where `source` is `"agent"`, `"fresh"` or `"embedder"` (an
    /// unprivileged embedder's own uid); `None` for backends without host identities.
    #[getter]
    fn identity<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.identity)?)
    }

    /// Runs under a network allowlist only: what the egress enforcement decided,
    /// `{"enforcer", "rules", "connections", "bytes", "decisions", "dropped"}`; `None` for
    /// other runs. `enforcer` is where the tool reached the egress proxy (never a
    /// credential), `bytes` what allowed connections moved (both directions), and
    /// `decisions` every allow or deny decision, oldest first (`dropped` counts those past
    /// the cap): `{"host", "port", "allowed", "addr"?, "rule"?, "refusal"?, "limit"?,
    /// "reason"?}`, where `refusal` is `"policy"`, `"bad_request"`, `"unresolvable"`,
    /// `"connect_failed"` or `"budget"` (then `limit` is `"egress_bytes"` or
    /// `"egress_connections"`). Keys without a value are left out, as in `to_dict()`.
    #[getter]
    fn network<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.network)?)
    }

    /// What the policy layer decided: `{"tier"?, "route"?: {"risk", "declared", "backend",
    /// "reason"}, "elevations"?: [{"id", "agent", "capabilities", "expires_at_ms",
    /// "runs_left"}]}`; `None` when no tier applied and no risk was routed.
    #[getter]
    fn policy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt.policy)?)
    }

    /// Whether `capability` (e.g. `"fs"`, `"net"`) is enforced by a mechanism whose name
    /// contains `mechanism` (e.g. `"landlock"`).
    fn has(&self, py: Python<'_>, capability: &str, mechanism: &str) -> PyResult<bool> {
        let capability: Capability = serde_json::from_value(Value::String(capability.into()))
            .map_err(|e| invalid(py, format!("unknown capability {capability:?}: {e}")))?;
        Ok(self.receipt.has(capability, mechanism))
    }

    /// Whether `capability` is enforced by a mechanism of the family `kind` (e.g.
    /// `has_kind("fs", "landlock")`): the typed check, with no matching of names.
    fn has_kind(&self, py: Python<'_>, capability: &str, kind: &str) -> PyResult<bool> {
        let capability: Capability = serde_json::from_value(Value::String(capability.into()))
            .map_err(|e| invalid(py, format!("unknown capability {capability:?}: {e}")))?;
        let kind: strata::Mechanism = serde_json::from_value(Value::String(kind.into()))
            .map_err(|e| invalid(py, format!("unknown mechanism kind {kind:?}: {e}")))?;
        Ok(self.receipt.has_kind(capability, kind))
    }

    /// The receipt as a dict (the `receipt` object of the CLI's JSON).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.receipt)?)
    }

    fn __str__(&self) -> String {
        self.receipt.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "Receipt(backend='{}', enforced={}, gaps={}, denials={})",
            self.receipt.backend.as_str(),
            self.receipt.enforced.len(),
            self.receipt.gaps.len(),
            self.receipt.denials.len()
        )
    }
}

/// Which backends and guarantees this host supports, and why not (`strata doctor`).
/// `str(report)` is the CLI's text.
#[pyclass(frozen, module = "strata._strata", name = "DoctorReport")]
pub struct PyDoctorReport {
    pub report: DoctorReport,
}

#[pymethods]
impl PyDoctorReport {
    /// One dict per backend: `{"backend", "available", "reason", "checks": [...]}`.
    #[getter]
    fn backends<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.report.backends)?)
    }

    /// Whether `backend` (`"process"`, `"wasm"`, ...) can run tools here.
    fn available(&self, backend: &str) -> bool {
        self.report
            .backends
            .iter()
            .any(|b| b.backend.as_str() == backend && b.available)
    }

    /// The report as a dict (the CLI's `doctor --json`).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &serialize(py, &self.report)?)
    }

    fn __str__(&self) -> String {
        self.report.to_string()
    }

    fn __repr__(&self) -> String {
        let names: Vec<String> = self
            .report
            .backends
            .iter()
            .map(|b| format!("{}={}", b.backend, if b.available { "ok" } else { "no" }))
            .collect();
        format!("DoctorReport({})", names.join(", "))
    }
}
