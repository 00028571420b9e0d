//! The per-run data a wasmtime `Store` carries.

use std::sync::Arc;

use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::{WasiCtxView, WasiView};

use crate::egress::EgressGuard;
use crate::limiter::Limiter;
use crate::quota::DiskMeter;

/// Store data of one run. Both WASI preview 1 (core modules) and preview 2 (components)
/// are served from the same context: `WasiP1Ctx` wraps the preview 2 `WasiCtx` and its
/// resource table.
pub(crate) struct State {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) limiter: Limiter,
    pub(crate) meter: Arc<DiskMeter>,
    /// The run's egress state under a network allowlist (see [`crate::egress`]).
    pub(crate) egress: Option<Arc<EgressGuard>>,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.wasi.ctx()
    }
}
