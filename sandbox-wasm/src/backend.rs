//! The `Backend` implementation: validation, routing to the engine in this process or to
//! the layered host, and the backend report.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use sandbox_core::{
    Backend, BackendKind, BackendReport, Caps, Check, Error, ExitStatus, ResourceUsage, Result,
    RunContext, RunOutput, RunSpec, Tool,
};

use crate::cache::{Loaded, ModuleCache, Prepared};
use crate::config::WasmConfig;
use crate::engine;
use crate::exec::{self, End, Exec};
use crate::executor::Executor;
use crate::linkers::Linkers;
use crate::plan::{self, Plan};
use crate::program::Program;
use crate::receipt::{self, EngineFacts};
use crate::script;
use crate::ticker::Ticker;

/// The WebAssembly backend: wasmtime with WASI preview 1 and 2.
///
/// One engine, linker and module cache per backend (so per `Sandbox`); each run gets a
/// fresh store and instance. See the crate docs for how caps map to WASI.
pub struct WasmBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: WasmConfig,
    pub(crate) linkers: Linkers,
    pub(crate) cache: ModuleCache,
    pub(crate) pooling: bool,
    pooling_note: String,
    ticker: Ticker,
    active: AtomicU32,
    receipts: receipt::ReceiptCache,
    executor: Executor,
}

impl std::fmt::Debug for WasmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmBackend")
            .field("config", &self.inner.config)
            .field("pooling", &self.inner.pooling)
            .finish()
    }
}

fn engine_error(e: wasmtime::Error) -> Error {
    Error::unavailable(
        BackendKind::Wasm,
        format!("cannot create the wasmtime engine: {e:#}"),
    )
}

impl WasmBackend {
    /// A backend with [`WasmConfig::default`].
    pub fn new() -> Result<Self> {
        Self::with_config(WasmConfig::default())
    }

    /// A backend with `config`. Fails with `BackendUnavailable` only when no engine can be
    /// created (unsupported CPU); a pooling allocator that cannot reserve its memory falls
    /// back to on-demand allocation (see [`WasmBackend::report`]).
    pub fn with_config(config: WasmConfig) -> Result<Self> {
        let (engine, pooling, pooling_note) = if config.pooling {
            match engine::build(&config, true) {
                Ok(e) => (
                    e,
                    true,
                    format!("{} concurrent runs", config.max_concurrent_runs.max(1)),
                ),
                Err(err) => {
                    tracing::warn!(error = %err, "pooling allocator unavailable; allocating on demand");
                    (
                        engine::build(&config, false).map_err(engine_error)?,
                        false,
                        format!("unavailable ({err}); allocating on demand"),
                    )
                }
            }
        } else {
            (
                engine::build(&config, false).map_err(engine_error)?,
                false,
                "off by configuration".to_string(),
            )
        };
        let linkers = Linkers::new(engine.clone());
        let cache = ModuleCache::new(config.cache_dir.as_deref(), &engine);
        let ticker = Ticker::start(engine, config.tick())
            .map_err(|e| Error::internal("cannot start the epoch ticker thread", e))?;
        let executor =
            Executor::new().map_err(|e| Error::internal("cannot start the wasm I/O runtime", e))?;
        Ok(WasmBackend {
            inner: Arc::new(Inner {
                config,
                linkers,
                cache,
                pooling,
                pooling_note,
                ticker,
                active: AtomicU32::new(0),
                receipts: receipt::ReceiptCache::default(),
                executor,
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &WasmConfig {
        &self.inner.config
    }

    /// Compiles (or loads from the disk cache) `module` so later runs start warm.
    pub fn precompile(&self, module: &Path) -> Result<()> {
        self.inner.cache.load(module, &self.inner.linkers).map(drop)
    }
}

/// Holds one of the `max_concurrent_runs` slots.
struct Slot<'a>(&'a AtomicU32);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Inner {
    fn slot(&self) -> Result<Slot<'_>> {
        let max = self.config.max_concurrent_runs.max(1);
        let before = self.active.fetch_add(1, Ordering::SeqCst);
        let slot = Slot(&self.active);
        if before >= max {
            return Err(Error::unavailable(
                BackendKind::Wasm,
                format!("{max} wasm runs are already executing (raise max_concurrent_runs)"),
            ));
        }
        Ok(slot)
    }

    /// Loads the program's module.
    pub(crate) fn load(&self, program: &Program) -> Result<Loaded> {
        let loaded = self.cache.load(&program.module, &self.linkers)?;
        if loaded.origin != crate::cache::Origin::Memory {
            tracing::debug!(
                module = %program.module.display(),
                origin = ?loaded.origin,
                "wasm module prepared"
            );
        }
        Ok(loaded)
    }

    /// Runs a resolved program in this process.
    pub(crate) fn run_here(
        &self,
        program: &Program,
        plan: &Plan,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<RunOutput> {
        let loaded = self.load(program)?;
        self.run_prepared(&loaded.prepared, program, plan, caps, ctx)
    }

    /// Runs a prepared program in this process.
    pub(crate) fn run_prepared(
        &self,
        prepared: &Prepared,
        program: &Program,
        plan: &Plan,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<RunOutput> {
        let _slot = self.slot()?;
        let active = self.ticker.active();
        let mut finished = exec::run(Exec {
            engine: &self.linkers.engine,
            prepared,
            program,
            plan,
            caps,
            ctx,
            fuel: self.config.fuel,
            active: &active,
            executor: &self.executor,
        })?;
        match &finished.end {
            End::Cancelled => return Err(Error::Cancelled),
            End::Refused(why) => return Err(Error::invalid(why.clone())),
            End::Busy(why) => return Err(Error::unavailable(BackendKind::Wasm, why.clone())),
            _ => {}
        }
        let facts = EngineFacts {
            pooling: self.pooling,
            fuel: self.config.fuel,
        };
        let mut r = self.receipts.get(plan, caps, &facts, ctx.strictness);
        let status: ExitStatus = receipt::status(&finished);
        receipt::denials(&mut r, &finished, caps, &status);
        if let Some((network, denials)) = finished.network.take() {
            r.denials.extend(denials);
            r.network = Some(network);
        }
        let cpu_us = u64::try_from(finished.cpu.as_micros()).unwrap_or(u64::MAX);
        Ok(RunOutput {
            status,
            stdout: finished.stdout.0,
            stderr: finished.stderr.0,
            stdout_truncated: finished.stdout.1,
            stderr_truncated: finished.stderr.1,
            duration: finished.duration,
            usage: ResourceUsage {
                user_cpu_us: cpu_us,
                system_cpu_us: 0,
                peak_memory_bytes: finished.peak_memory,
            },
            receipt: r,
        })
    }

    fn interpreter_check(&self, file: &str, name: &str) -> Check {
        match &self.config.interpreter_dir {
            Some(dir) if dir.join(file).is_file() => {
                Check::new(name, true, dir.join(file).display().to_string())
            }
            Some(dir) => Check::new(
                name,
                false,
                format!(
                    "{} missing: run {}",
                    dir.join(file).display(),
                    script::FETCH_SCRIPT
                ),
            ),
            None => Check::new(name, false, "no interpreter directory configured"),
        }
    }
}

impl Backend for WasmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput> {
        spec.require_kind(BackendKind::Wasm)?;
        let caps = &spec.caps;
        let inner = &self.inner;
        let program = script::resolve(tool, inner.config.interpreter_dir.as_deref())?;
        // Planned here in both modes, so a request this backend cannot honour is refused
        // before anything starts (the layered host plans again inside the sandbox).
        match &inner.config.layered {
            Some(layering) => {
                // The outer sandbox binds host-executed paths read-only (or refuses).
                let mut outer_protected = caps.clone();
                outer_protected.protect_host_executed = false;
                plan::plan(&outer_protected, ctx.strictness)?;
                crate::layered::run(inner, layering, &program, caps, ctx)
            }
            None => {
                let plan = plan::plan(caps, ctx.strictness)?;
                inner.run_here(&program, &plan, caps, ctx)
            }
        }
    }

    /// Modules always; Python and JavaScript scripts when their WASI interpreter is
    /// installed; no commands and no sh scripts (the errors [`Backend::run`] would give).
    fn supports(&self, tool: &Tool) -> Result<()> {
        script::resolve(tool, self.inner.config.interpreter_dir.as_deref()).map(drop)
    }

    fn report(&self) -> BackendReport {
        let inner = &self.inner;
        let mut checks = vec![
            Check::new(
                "engine",
                true,
                format!("wasmtime 48 (cranelift, {})", std::env::consts::ARCH),
            ),
            Check::new(
                "pooling allocator",
                inner.pooling,
                inner.pooling_note.clone(),
            ),
            Check::new(
                "module cache",
                true,
                format!("memory + disk: {}", inner.cache.disk_status()),
            ),
            inner.interpreter_check(script::PYTHON_FILE, "python interpreter"),
            inner.interpreter_check(script::QUICKJS_FILE, "javascript interpreter"),
        ];
        if let Some(layering) = &inner.config.layered {
            checks.push(Check::new(
                "layering",
                true,
                format!(
                    "inside the {} backend via {}",
                    layering.outer.kind(),
                    layering.host_binary.display()
                ),
            ));
        }
        BackendReport {
            backend: BackendKind::Wasm,
            available: true,
            reason: None,
            checks,
        }
    }
}
