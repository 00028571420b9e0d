//! The exception hierarchy and the mapping from [`strata::Error`] to it.
//!
//! Every exception derives from `strata.SandboxError` and from the builtin a Python caller
//! would reach for (`ValueError` for a malformed request, `PermissionError` for a policy
//! refusal, `TimeoutError` for a timed-out run, ...), carries the stable `code` string of
//! [`strata::ErrorKind::code`] and the message of the Rust error.

use pyo3::exceptions::{
    PyException, PyOSError, PyPermissionError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use strata::{Error, ErrorKind, LimitKind};

/// One exception class: its name, `code`, builtin bases (after its Strata parent) and doc.
struct Spec {
    name: &'static str,
    code: &'static str,
    /// Index into [`SPECS`] of the Strata parent class (`None` for `SandboxError`).
    parent: Option<usize>,
    builtin: fn(Python<'_>) -> Option<Bound<'_, PyType>>,
    doc: &'static str,
}

const SANDBOX: usize = 0;
const INVALID: usize = 1;
const DENIED: usize = 2;
const UNAVAILABLE: usize = 3;
const UNENFORCEABLE: usize = 4;
const LIMIT: usize = 5;
const TIMEOUT: usize = 6;
const TOOL_FAILED: usize = 7;
const CANCELLED: usize = 8;
const SETUP: usize = 9;
const INTERNAL: usize = 10;

fn none(_: Python<'_>) -> Option<Bound<'_, PyType>> {
    None
}

const SPECS: [Spec; 11] = [
    Spec {
        name: "SandboxError",
        code: "internal",
        parent: None,
        builtin: |py| Some(py.get_type::<PyException>()),
        doc: "Base class of every Strata error. `code` is the stable error code (the same \
              strings as the Rust `ErrorKind::code` and Node's `error.code`).",
    },
    Spec {
        name: "InvalidRequestError",
        code: "invalid_request",
        parent: Some(SANDBOX),
        builtin: |py| Some(py.get_type::<PyValueError>()),
        doc: "The request is malformed: unknown or invalid caps, an empty argv, a mount \
              whose source does not exist, a program that cannot be executed. Nothing ran.",
    },
    Spec {
        name: "DeniedError",
        code: "denied",
        parent: Some(SANDBOX),
        builtin: |py| Some(py.get_type::<PyPermissionError>()),
        doc: "A policy (trust tier, approval) refused the request. Nothing ran.",
    },
    Spec {
        name: "BackendUnavailableError",
        code: "backend_unavailable",
        parent: Some(SANDBOX),
        builtin: |py| Some(py.get_type::<PyRuntimeError>()),
        doc: "The chosen backend cannot run on this host or is not built in. Nothing ran.",
    },
    Spec {
        name: "UnenforceableError",
        code: "unenforceable",
        parent: Some(SANDBOX),
        // The host lacks a mechanism; it is not the caller lacking a permission, so this
        // is a RuntimeError like BackendUnavailableError, not a PermissionError.
        builtin: |py| Some(py.get_type::<PyRuntimeError>()),
        doc: "A guarantee the caps need cannot be enforced on this host and the sandbox is \
              strict, so the run was refused (nothing ran). Use `strict=False` to run with \
              the gap listed in the receipt. A RuntimeError, not a PermissionError: the host \
              lacks a mechanism, the caller lacks no permission.",
    },
    Spec {
        name: "LimitExceededError",
        code: "limit_exceeded",
        parent: Some(SANDBOX),
        builtin: none,
        doc: "Raised by `RunResult.check()` when a limit ended the run. `limit` names it \
              (`\"memory\"`, `\"cpu\"`, ...); `result` is the RunResult.",
    },
    Spec {
        name: "SandboxTimeoutError",
        code: "limit_exceeded",
        parent: Some(LIMIT),
        builtin: |py| Some(py.get_type::<PyTimeoutError>()),
        doc: "Raised by `RunResult.check()` when the wall-clock timeout ended the run \
              (`limit == \"wall\"`). Also a TimeoutError.",
    },
    Spec {
        name: "ToolFailedError",
        code: "tool_failed",
        parent: Some(SANDBOX),
        builtin: none,
        doc: "Raised by `RunResult.check()` when the tool exited non-zero or was killed by a \
              signal. `result` is the RunResult. `run()` itself never raises it: a non-zero \
              exit is data.",
    },
    Spec {
        name: "CancelledError",
        code: "cancelled",
        parent: Some(SANDBOX),
        builtin: none,
        doc: "The run was cancelled (the Sandbox was closed, or a streaming callback raised) \
              and everything it started was killed. A cancelled `arun` task raises \
              `asyncio.CancelledError` instead.",
    },
    Spec {
        name: "SetupFailedError",
        code: "setup_failed",
        parent: Some(SANDBOX),
        builtin: |py| Some(py.get_type::<PyOSError>()),
        doc: "Building the sandbox failed at some stage (an OS error). Nothing of the tool ran.",
    },
    Spec {
        name: "InternalError",
        code: "internal",
        parent: Some(SANDBOX),
        builtin: |py| Some(py.get_type::<PyRuntimeError>()),
        doc: "A bug or an unexpected host failure.",
    },
];

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn create_classes(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let type_ = py.get_type::<PyType>();
    let mut classes: Vec<Py<PyType>> = Vec::with_capacity(SPECS.len());
    for spec in &SPECS {
        let mut bases = Vec::new();
        if let Some(parent) = spec.parent {
            bases.push(classes[parent].bind(py).clone().into_any());
        }
        if let Some(builtin) = (spec.builtin)(py) {
            bases.push(builtin.into_any());
        }
        let namespace = PyDict::new(py);
        namespace.set_item("__doc__", spec.doc)?;
        namespace.set_item("__module__", "strata")?;
        namespace.set_item("code", spec.code)?;
        if spec.parent.is_none() {
            namespace.set_item("result", py.None())?;
            namespace.set_item("limit", py.None())?;
        }
        let class = type_
            .call1((spec.name, PyTuple::new(py, bases)?, namespace))?
            .cast_into::<PyType>()?;
        classes.push(class.unbind());
    }
    Ok(classes)
}

/// Creates the classes (once per process) and adds them to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let classes = CLASSES.get_or_try_init(py, || create_classes(py))?;
    for (spec, class) in SPECS.iter().zip(classes) {
        m.add(spec.name, class.bind(py))?;
    }
    Ok(())
}

fn class(py: Python<'_>, index: usize) -> Bound<'_, PyType> {
    match CLASSES.get(py).and_then(|c| c.get(index)) {
        Some(class) => class.bind(py).clone(),
        // Unreachable once the module is initialised; fall back to a builtin.
        None => py.get_type::<PyRuntimeError>(),
    }
}

fn index_for(err: &Error) -> usize {
    match err.kind() {
        ErrorKind::InvalidRequest => INVALID,
        ErrorKind::Denied => DENIED,
        ErrorKind::Unavailable => UNAVAILABLE,
        ErrorKind::Unenforceable => UNENFORCEABLE,
        ErrorKind::LimitExceeded => match err {
            Error::LimitExceeded {
                limit: LimitKind::Wall,
            } => TIMEOUT,
            _ => LIMIT,
        },
        ErrorKind::ToolFailed => TOOL_FAILED,
        ErrorKind::Cancelled => CANCELLED,
        ErrorKind::SetupFailed => SETUP,
        _ => INTERNAL,
    }
}

/// The error's message followed by each cause it does not already spell out.
fn message(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The OS error number behind `err`, if any.
fn os_errno(err: &Error) -> Option<i32> {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(code) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
        {
            return Some(code);
        }
        source = cause.source();
    }
    None
}

/// Converts a Rust error into the matching Python exception: the Rust message (with its
/// causes), `limit` for limit errors, and `errno` when an OS error is the cause.
pub fn to_py(py: Python<'_>, err: &Error) -> PyErr {
    let exc = PyErr::from_type(class(py, index_for(err)), (message(err),));
    let value = exc.value(py);
    if let Error::LimitExceeded { limit } = err {
        let _ = value.setattr("limit", limit.as_str());
    }
    if let Some(errno) = os_errno(err) {
        let _ = value.setattr("errno", errno);
    }
    exc
}

/// [`to_py`] with `result` attached (for `RunResult.check()`).
pub fn to_py_with_result(py: Python<'_>, err: &Error, result: Py<PyAny>) -> PyErr {
    let exc = to_py(py, err);
    let _ = exc.value(py).setattr("result", result);
    exc
}

/// A Python exception for an invalid request built by the binding itself (caps
/// conversion), through the same mapping as Rust errors.
pub fn invalid(py: Python<'_>, reason: impl Into<String>) -> PyErr {
    to_py(py, &Error::invalid(reason))
}

/// Extension to map `strata::Result` into `PyResult`.
pub trait IntoPyResult<T> {
    /// Maps the error with [`to_py`].
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for strata::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, &e))
    }
}
