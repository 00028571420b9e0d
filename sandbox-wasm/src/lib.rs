//! Strata's WebAssembly backend (wasmtime + WASI).
//!
//! Not implemented yet: [`WasmBackend::run`] returns [`sandbox_core::Error::BackendUnavailable`]
//! so nothing pretends to be sandboxed.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use sandbox_core::{
    Backend, BackendKind, BackendReport, Caps, Error, Result, RunContext, RunOutput, Tool,
};

/// The WebAssembly backend.
#[derive(Debug, Default)]
pub struct WasmBackend {}

impl WasmBackend {
    /// Creates the backend.
    pub fn new() -> Result<Self> {
        Ok(WasmBackend {})
    }
}

const NOT_BUILT: &str = "the wasm backend is not implemented in this build";

impl Backend for WasmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    fn run(&self, _tool: &Tool, _caps: &Caps, _ctx: &RunContext) -> Result<RunOutput> {
        Err(Error::unavailable(BackendKind::Wasm, NOT_BUILT))
    }

    fn report(&self) -> BackendReport {
        BackendReport::unavailable(BackendKind::Wasm, NOT_BUILT)
    }
}
