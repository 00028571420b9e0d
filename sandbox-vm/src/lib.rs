//! Strata's microVM backend (QEMU `microvm`, Firecracker).
//!
//! Not implemented yet: [`MicrovmBackend::run`] returns
//! [`sandbox_core::Error::BackendUnavailable`] so nothing pretends to be sandboxed.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use sandbox_core::{
    Backend, BackendKind, BackendReport, Caps, Error, Result, RunContext, RunOutput, Tool,
};

/// The microVM backend.
#[derive(Debug, Default)]
pub struct MicrovmBackend {}

impl MicrovmBackend {
    /// Creates the backend.
    pub fn new() -> Self {
        MicrovmBackend {}
    }
}

const NOT_BUILT: &str = "the microvm backend is not implemented in this build";

impl Backend for MicrovmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn run(&self, _tool: &Tool, _caps: &Caps, _ctx: &RunContext) -> Result<RunOutput> {
        Err(Error::unavailable(BackendKind::Microvm, NOT_BUILT))
    }

    fn report(&self) -> BackendReport {
        BackendReport::unavailable(BackendKind::Microvm, NOT_BUILT)
    }
}
