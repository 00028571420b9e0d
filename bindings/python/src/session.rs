//! `Session`: a sandbox whose files live across calls (`strata::Session`), with the GIL
//! released during every call and file copy.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use strata::session::{Call, Session, SessionOptions};
use strata::{ByteSize, CancelToken, Error};

use crate::convert::{self, json_to_py};
use crate::errors::{to_py, IntoPyResult};
use crate::logging::{self, CallScope};
use crate::result::PyRunResult;
use crate::sandbox::{
    context, finish, link, spawn_run, tool_arg, PyRunHandle, PySandbox, RunPolicy,
};

/// `value` as the Python value of its JSON form.
pub(crate) fn json<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(value).map_err(|e| {
        to_py(
            py,
            &Error::invalid(format!("not representable as JSON: {e}")),
        )
    })?;
    json_to_py(py, &value)
}

/// A call's timeout in seconds: `None` keeps the caps' timeout, `0` means none.
fn timeout(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    match obj {
        Some(obj) if !obj.is_none() => convert::seconds(obj, "timeout").map(Some),
        _ => Ok(None),
    }
}

/// A sandbox whose files live across calls, on any backend: `Sandbox.session(caps)`.
///
/// Every `run` is one sandbox run with the session's caps plus its private directory
/// mounted read-write at `workdir` (default `/workspace`, also the working directory):
/// processes of a call end with it, files stay. File methods take paths relative to
/// `workdir` or absolute inside it; copies never follow symlinks, refuse devices, FIFOs,
/// sockets and hard-linked files on the way out, are byte-exact, and move at most
/// `max_transfer` bytes (default 256 MiB) each. Sessions are isolated from each other.
/// `close()` (or leaving a `with` block, or garbage collection) cancels calls in flight
/// and removes the directory; a closed session raises `InvalidRequestError`.
#[pyclass(frozen, module = "strata._strata", name = "Session")]
pub struct PySession {
    session: Session,
    shutdown: CancelToken,
}

impl PySession {
    /// Opens a session of `sandbox` (used by `Sandbox.session`).
    pub(crate) fn open(
        py: Python<'_>,
        sandbox: &PySandbox,
        caps: Option<&Bound<'_, PyAny>>,
        workdir: Option<PathBuf>,
        max_transfer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PySession> {
        sandbox.ensure_open(py)?;
        let caps = sandbox.caps_or_profile(caps)?.into_owned();
        let mut options = match &sandbox.profile {
            Some(profile) => profile.session_options(),
            None => SessionOptions::default(),
        };
        if let Some(workdir) = workdir {
            options.workdir = workdir;
        }
        if let Some(limit) = max_transfer.filter(|m| !m.is_none()) {
            options.max_transfer = byte_size(py, limit)?;
        }
        let session = py
            .detach(|| sandbox.sandbox.session_with(&caps, options))
            .py_err(py)?;
        Ok(PySession {
            session,
            shutdown: sandbox.shutdown.clone(),
        })
    }
}

fn byte_size(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<ByteSize> {
    if let Ok(n) = obj.extract::<u64>() {
        return Ok(ByteSize(n));
    }
    let text = obj.extract::<String>().map_err(|_| {
        PyTypeError::new_err("max_transfer must be a number of bytes or a size such as \"256M\"")
    })?;
    text.parse::<ByteSize>()
        .map_err(|e| to_py(py, &Error::invalid(format!("max_transfer: {e}"))))
}

#[pymethods]
impl PySession {
    /// Runs `tool` (an argv list or a `strata.Tool`) in the session and returns its
    /// RunResult. `timeout`: seconds for this call (`None`: the caps' timeout; `0`: none).
    /// Streaming callbacks, `text`, `tier` and `risk` as for `Sandbox.run`.
    #[pyo3(signature = (
        tool, *, timeout = None, on_stdout = None, on_stderr = None, text = true, tier = None,
        risk = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
        tier: Option<String>,
        risk: Option<String>,
    ) -> PyResult<PyRunResult> {
        let tool = tool_arg(tool)?;
        let timeout = self::timeout(timeout)?;
        let policy = RunPolicy { tier, risk };
        let (ctx, sink) = context(py, None, on_stdout, on_stderr, text, &policy)?;
        logging::refresh_level(py);
        let call = Call { timeout, ctx };
        let result = py.detach(|| {
            let _scope = CallScope::enter();
            let _link = link(&self.shutdown, &call.ctx.cancel);
            self.session.run_with(&tool, &call)
        });
        logging::drain(py);
        drop(call);
        finish(py, result, sink.as_deref())
    }

    /// Starts a call on a new thread and returns its RunHandle at once; `done(result,
    /// error)` is called on that thread when it ends. The building block of
    /// `AsyncSession.run`; arguments as for `run`.
    #[pyo3(signature = (
        tool, done, *, timeout = None, on_stdout = None, on_stderr = None, text = true,
        tier = None, risk = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn _start(
        &self,
        py: Python<'_>,
        tool: &Bound<'_, PyAny>,
        done: Py<PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        on_stdout: Option<Py<PyAny>>,
        on_stderr: Option<Py<PyAny>>,
        text: bool,
        tier: Option<String>,
        risk: Option<String>,
    ) -> PyResult<PyRunHandle> {
        if !done.bind(py).is_callable() {
            return Err(PyTypeError::new_err("done must be callable"));
        }
        let tool = tool_arg(tool)?.into_owned();
        let timeout = self::timeout(timeout)?;
        let (ctx, sink) = context(
            py,
            None,
            on_stdout,
            on_stderr,
            text,
            &RunPolicy { tier, risk },
        )?;
        let session = self.session.clone();
        spawn_run(py, ctx, sink, self.shutdown.clone(), done, move |ctx| {
            let call = Call {
                timeout,
                ctx: ctx.clone(),
            };
            session.run_with(&tool, &call)
        })
    }

    /// Writes `data` (bytes, or str encoded as UTF-8) to the file at `path`, replacing a
    /// file there (never writing through it) and creating missing directories.
    fn write_file(&self, py: Python<'_>, path: &str, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes: Vec<u8> = if let Ok(b) = data.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if let Ok(s) = data.cast::<PyString>() {
            s.to_cow()?.as_bytes().to_vec()
        } else if let Ok(v) = data.extract::<Vec<u8>>() {
            v
        } else {
            return Err(PyTypeError::new_err("data must be bytes or str"));
        };
        py.detach(|| self.session.write_file(path, &bytes))
            .py_err(py)
    }

    /// The bytes of the regular file at `path`.
    fn read_file<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let data = py.detach(|| self.session.read_file(path)).py_err(py)?;
        Ok(PyBytes::new(py, &data))
    }

    /// Copies the host file or directory `host_path` to `path` (a directory is merged into
    /// an existing one). The whole source is checked first: symlinks, devices, FIFOs and
    /// sockets in it refuse the upload before anything is written. Returns
    /// `{"files", "dirs", "bytes"}`.
    fn upload<'py>(
        &self,
        py: Python<'py>,
        host_path: &Bound<'_, PyAny>,
        path: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let host = convert::path(host_path, "host_path")?;
        let done = py.detach(|| self.session.upload(&host, path)).py_err(py)?;
        json(py, &done)
    }

    /// Copies the file or directory at `path` to the host path `host_path`, which must not
    /// exist. Returns `{"files", "dirs", "bytes"}`.
    fn download<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        host_path: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let host = convert::path(host_path, "host_path")?;
        let done = py
            .detach(|| self.session.download(path, &host))
            .py_err(py)?;
        json(py, &done)
    }

    /// The entries of the directory at `path` (default the workdir), one level, sorted by
    /// name: dicts with `path`, `name`, `kind` (`"file"`, `"dir"`, `"symlink"`,
    /// `"other"`), `size` and `mode`.
    #[pyo3(signature = (path = "."))]
    fn list_files<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let entries = py.detach(|| self.session.list_files(path)).py_err(py)?;
        json(py, &entries)
    }

    /// Removes the file, symlink or directory tree at `path`.
    fn remove(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.session.remove(path)).py_err(py)
    }

    /// Cancels the calls in flight, waits for them to end and removes the session's
    /// directory. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.session.close()).py_err(py)
    }

    /// The session's id (`s-` and 32 hex digits: 128 random bits).
    #[getter]
    fn id(&self) -> &str {
        self.session.id()
    }

    /// The guest path of the session's directory.
    #[getter]
    fn workdir(&self) -> String {
        self.session.workdir().to_string_lossy().into_owned()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.session.is_closed()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!(
            "Session(id={:?}, workdir={:?}, closed={})",
            self.session.id(),
            self.session.workdir().display().to_string(),
            if self.session.is_closed() {
                "True"
            } else {
                "False"
            }
        )
    }
}
