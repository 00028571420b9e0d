//! Transactional workspaces and tool-call permissions for Python. Staging, diffing and
//! committing are `strata::Workspace`'s; which changes may be committed is
//! `strata::policy::workspace`'s; the caps of a tool call are `strata::policy::toolcall`'s.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use strata::policy::workspace::{CommitMode, Selection};
use strata::{ByteSize, Workspace};

use crate::convert::{json_to_py, py_to_json};
use crate::errors::{to_py, IntoPyResult};
use crate::sandbox::PySandbox;
use crate::types::PyCaps;

fn json<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(value).map_err(|e| {
        to_py(
            py,
            &strata::Error::invalid(format!("not representable as JSON: {e}")),
        )
    })?;
    json_to_py(py, &value)
}

fn size(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<ByteSize> {
    let Some(obj) = obj else {
        return Ok(strata::Limits::default().disk);
    };
    if let Ok(n) = obj.extract::<u64>() {
        return Ok(ByteSize(n));
    }
    let text = obj.extract::<String>()?;
    text.parse::<ByteSize>()
        .map_err(|e| to_py(py, &strata::Error::invalid(format!("limit: {e}"))))
}

/// A transactional copy of a host directory: runs write to the copy
/// (`Sandbox.run_in_workspace`), `diff()` shows what they changed (added, changed, deleted;
/// symlinks, devices, set-id bits and host-executed paths such as `.git/hooks` flagged),
/// and `commit()` applies all or part of it to the source, never following a symlink out
/// of it. `limit` (bytes or `"64M"`, default the caps' disk default 64 MiB) caps what a
/// diff may add: a larger diff cannot be committed. The copy is removed by `discard()`,
/// on leaving a `with` block, or when the object is collected.
#[pyclass(frozen, module = "strata._strata", name = "Workspace")]
pub struct PyWorkspace {
    inner: Mutex<Option<Workspace>>,
    source: PathBuf,
}

impl PyWorkspace {
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Workspace) -> strata::Result<R>,
    ) -> PyResult<R> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match inner.as_mut() {
            Some(ws) => f(ws).py_err(py),
            None => Err(to_py(
                py,
                &strata::Error::invalid("this Workspace was discarded"),
            )),
        }
    }

    /// Runs `f` with the staged workspace (without the GIL), or fails when it was
    /// discarded.
    pub(crate) fn staged<R>(
        &self,
        f: impl FnOnce(&Workspace) -> strata::Result<R>,
    ) -> strata::Result<R> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match inner.as_ref() {
            Some(ws) => f(ws),
            None => Err(strata::Error::invalid("this Workspace was discarded")),
        }
    }
}

#[pymethods]
impl PyWorkspace {
    #[new]
    #[pyo3(signature = (source, *, limit = None))]
    fn new(py: Python<'_>, source: PathBuf, limit: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let limit = size(py, limit)?;
        let ws = py.detach(|| Workspace::stage(&source, limit)).py_err(py)?;
        Ok(PyWorkspace {
            source: ws.grant_dir().to_path_buf(),
            inner: Mutex::new(Some(ws)),
        })
    }

    /// The directory this workspace stands for.
    #[getter]
    fn source(&self) -> String {
        self.source.display().to_string()
    }

    /// The staging copy (what runs write to).
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |ws| Ok(ws.path().display().to_string()))
    }

    /// What the runs changed: `{"changes": [{"path", "kind", "entry", "size", "mode",
    /// "flags"}], "upper_bytes", "limit", "over_limit"}`.
    fn diff<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let diff = self.with(py, |ws| ws.diff())?;
        json(py, &diff)
    }

    /// Applies the changes below `paths` (default: all) to the source and returns the
    /// report `{"applied", "refused": [{"path", "reason"}], "dropped_bits", "unselected"}`.
    /// Flagged changes (host-executed paths, symlinks, set-id files) are refused unless
    /// their path is in `accept`; devices and symlinks out of the source never commit.
    /// `all_or_nothing=True` applies nothing when anything would be refused. With
    /// `sandbox`, the outcome is recorded in its audit log.
    #[pyo3(signature = (paths = None, *, accept = None, all_or_nothing = false, sandbox = None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        paths: Option<Vec<PathBuf>>,
        accept: Option<Vec<PathBuf>>,
        all_or_nothing: bool,
        sandbox: Option<Py<PySandbox>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let selection = match paths {
            Some(paths) => Selection::Paths(paths),
            None => Selection::All,
        };
        let accept = accept.unwrap_or_default();
        let mode = if all_or_nothing {
            CommitMode::AllOrNothing
        } else {
            CommitMode::SkipRefused
        };
        let sandbox = sandbox.map(|s| s.get().sandbox.clone());
        let report = self.with(py, |ws| match &sandbox {
            Some(sandbox) => sandbox.commit_workspace(ws, &selection, &accept, mode),
            None => ws.commit(&selection, &accept, mode),
        })?;
        json(py, &report)
    }

    /// Removes the staging copy; the source is left as it is. Idempotent.
    fn discard(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match taken {
            Some(ws) => py.detach(|| ws.discard()).py_err(py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.discard(py)?;
        Ok(false)
    }
}

/// `caps_for_call(schema, arguments, base=None, *, tier=None, program=None)`: the narrowest
/// caps for one tool call. Properties of the tool's JSON `schema` annotated
/// `"x-strata": "read-path" | "write-path" | "host" | "url"` turn this call's `arguments`
/// into exactly those mounts and allowlist entries, added to `base`. With `tier` (a preset
/// name), an argument beyond it raises DeniedError naming the argument before anything
/// runs. Returns `(caps, arguments)`, where `arguments` lists `{"pointer", "annotation",
/// "capability", "target"}`.
#[pyfunction]
#[pyo3(signature = (schema, arguments, base = None, *, tier = None, program = None))]
pub fn caps_for_call<'py>(
    py: Python<'py>,
    schema: &Bound<'py, PyAny>,
    arguments: &Bound<'py, PyAny>,
    base: Option<&Bound<'py, PyAny>>,
    tier: Option<String>,
    program: Option<String>,
) -> PyResult<(PyCaps, Bound<'py, PyAny>)> {
    let schema = py_to_json(schema, "schema")?;
    let arguments = py_to_json(arguments, "arguments")?;
    let base = PyCaps::from_arg(base)?;
    let derived = match tier {
        Some(name) => {
            let tier = strata::policy::Tier::lookup(&name, &[], None).map_err(|e| to_py(py, &e))?;
            let tool = strata::Tool::command([program.unwrap_or_else(|| "tool".into())]);
            strata::policy::derive_for_tier(&schema, &arguments, &base, &tier, &tool)
        }
        None => strata::policy::derive_caps(&schema, &arguments, &base),
    }
    .py_err(py)?;
    let listed = json(py, &derived.arguments)?;
    Ok((PyCaps { caps: derived.caps }, listed))
}
