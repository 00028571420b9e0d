//! The WASI linkers of a backend, built on first use: preview 1 for core modules, preview 2
//! for components, each with the disk-quota shims (and, for components, the egress shims). A backend that only runs modules never
//! pays for the component linker (and the reverse).

use std::sync::OnceLock;

use wasmtime::component;
use wasmtime::{Engine, Linker};

use crate::state::State;

/// Linkers for one engine.
pub(crate) struct Linkers {
    pub engine: Engine,
    core: OnceLock<Result<Linker<State>, String>>,
    component: OnceLock<Result<component::Linker<State>, String>>,
}

fn build_core(engine: &Engine) -> wasmtime::Result<Linker<State>> {
    let mut core = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut core, |s: &mut State| &mut s.wasi)?;
    crate::quota::shim_p1(&mut core)?;
    Ok(core)
}

fn build_component(engine: &Engine) -> wasmtime::Result<component::Linker<State>> {
    let mut linker = component::Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    crate::quota::shim_p2(&mut linker)?;
    crate::egress::shim_p2(&mut linker)?;
    Ok(linker)
}

impl Linkers {
    pub(crate) fn new(engine: Engine) -> Self {
        Linkers {
            engine,
            core: OnceLock::new(),
            component: OnceLock::new(),
        }
    }

    /// The WASI preview 1 linker.
    pub(crate) fn core(&self) -> wasmtime::Result<&Linker<State>> {
        self.core
            .get_or_init(|| build_core(&self.engine).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| wasmtime::format_err!("cannot link WASI preview 1: {e}"))
    }

    /// The WASI preview 2 linker.
    pub(crate) fn component(&self) -> wasmtime::Result<&component::Linker<State>> {
        self.component
            .get_or_init(|| build_component(&self.engine).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| wasmtime::format_err!("cannot link WASI preview 2: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_linkers_build() {
        let linkers = Linkers::new(Engine::default());
        assert!(linkers.core().is_ok());
        assert!(linkers.component().is_ok());
    }
}
