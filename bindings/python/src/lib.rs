//! `strata._strata`: the native module of the `strata` Python package.
//!
//! A thin layer over the `strata` crate: it converts Python values to the core's types
//! ([`types`], [`convert`]), maps [`strata::Error`] kinds to a Python exception hierarchy
//! ([`errors`]), releases the GIL while a run executes ([`sandbox`]), and forwards Rust
//! `tracing` events to Python `logging` ([`logging`]). Every decision about what a sandbox
//! allows or enforces is made by the Rust core, never here.
//!
//! The Python package (`python/strata/__init__.py`) re-exports this module, passes the
//! `strata-helper` binary shipped inside the wheel to `Sandbox`, and adds `Sandbox.arun`
//! (asyncio) and the framework adapters.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod convert;
mod errors;
mod live;
mod logging;
mod messages;
mod policy;
mod result;
mod sandbox;
mod session;
mod snapshots;
mod types;
mod workspace;

use pyo3::prelude::*;

/// The native module. See the `strata` package for the public API.
/// `$STRATA_HELPER` when set, else the `strata-helper` in `package_dir` when it is an
/// executable file, else `None` ([`strata::packaged_helper`]).
#[pyfunction]
fn packaged_helper(package_dir: std::path::PathBuf) -> Option<String> {
    strata::packaged_helper(&package_dir).map(|path| path.display().to_string())
}

#[pymodule]
fn _strata(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<types::PyTool>()?;
    m.add_class::<types::PyCaps>()?;
    m.add_class::<result::PyRunResult>()?;
    m.add_class::<result::PyReceipt>()?;
    m.add_class::<result::PyDoctorReport>()?;
    m.add_class::<sandbox::PySandbox>()?;
    m.add_class::<sandbox::PyRunHandle>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<live::PyLiveSandbox>()?;
    m.add_function(wrap_pyfunction!(snapshots::snapshots, m)?)?;
    m.add_function(wrap_pyfunction!(snapshots::remove_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(packaged_helper, m)?)?;
    m.add_function(wrap_pyfunction!(policy::tier_preset, m)?)?;
    m.add_function(wrap_pyfunction!(policy::verify_audit, m)?)?;
    m.add_class::<messages::PyAgentDirectory>()?;
    m.add_class::<messages::PyMessageVerifier>()?;
    m.add_function(wrap_pyfunction!(messages::generate_agent_key, m)?)?;
    m.add_function(wrap_pyfunction!(messages::agent_public_key, m)?)?;
    m.add_class::<workspace::PyWorkspace>()?;
    m.add_function(wrap_pyfunction!(workspace::caps_for_call, m)?)?;
    logging::install(m.py())?;
    Ok(())
}
