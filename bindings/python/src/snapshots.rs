//! The snapshot store from Python: `strata.snapshots()` and `strata.remove_snapshot(name)`
//! (`LiveSandbox.snapshot`, `.fork` and `Sandbox.start_from` are in [`crate::live`]).

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use strata::live::SnapshotStore;

use crate::errors::IntoPyResult;
use crate::session::json;

/// The store in `dir`, else the user's default one.
pub(crate) fn store(dir: Option<&Path>) -> strata::Result<SnapshotStore> {
    match dir {
        Some(dir) => SnapshotStore::open(dir),
        None => SnapshotStore::open_default(),
    }
}

/// The snapshots in the store (`snapshot_dir`, default `$STRATA_SNAPSHOT_DIR` or
/// `~/.local/share/strata/snapshots`) that verify, oldest first: a list of dicts (id, name,
/// backend, source, created_at, carries, not_carried, files, bytes).
#[pyfunction]
#[pyo3(signature = (*, snapshot_dir = None))]
pub(crate) fn snapshots(
    py: Python<'_>,
    snapshot_dir: Option<PathBuf>,
) -> PyResult<Bound<'_, PyAny>> {
    let list = py
        .detach(|| store(snapshot_dir.as_deref())?.list())
        .py_err(py)?;
    json(py, &list)
}

/// Removes the snapshot `name` from the store, leaving nothing of it.
#[pyfunction]
#[pyo3(signature = (name, *, snapshot_dir = None))]
pub(crate) fn remove_snapshot(
    py: Python<'_>,
    name: String,
    snapshot_dir: Option<PathBuf>,
) -> PyResult<()> {
    py.detach(|| store(snapshot_dir.as_deref())?.remove(&name))
        .py_err(py)
}
