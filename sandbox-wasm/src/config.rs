//! Configuration of the wasm backend: caches, interpreters, pool size, fuel, layering.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::Backend;

/// Environment variable overriding the on-disk module cache directory (`off` disables it).
pub const CACHE_ENV: &str = "STRATA_WASM_CACHE";
/// Environment variable overriding the directory holding the WASI interpreters.
pub const INTERPRETERS_ENV: &str = "STRATA_WASM_INTERPRETERS";
/// Environment variable naming the `strata-wasm-host` binary used for layered runs.
pub const WASM_HOST_ENV: &str = "STRATA_WASM_HOST";
/// File name of the binary that hosts wasmtime inside the process sandbox.
pub const WASM_HOST_NAME: &str = "strata-wasm-host";

/// How the wasm backend is set up. Built once per backend (per `Sandbox`).
///
/// | field | default |
/// |---|---|
/// | `cache_dir` | `$STRATA_WASM_CACHE`, else `$XDG_CACHE_HOME/strata/wasm`, else `~/.cache/strata/wasm` |
/// | `interpreter_dir` | `$STRATA_WASM_INTERPRETERS`, else `$XDG_DATA_HOME/strata/wasm-interpreters`, else `~/.local/share/strata/wasm-interpreters` |
/// | `max_concurrent_runs` | 32 |
/// | `pooling` | `true` |
/// | `fuel` | `None` (no deterministic budget) |
/// | `epoch_tick` | 1 ms |
/// | `layered` | `None` (the engine runs in the calling process) |
#[derive(Clone)]
pub struct WasmConfig {
    /// Directory of precompiled modules, keyed by engine and content hash, at most 2 GiB per
    /// engine (oldest first out). `None` keeps compiled modules in memory only (at most 256
    /// distinct modules). The directory is created with mode 0700 and is
    /// ignored (with a warning) when it is not owned by this user or is writable by others,
    /// because loading a precompiled artifact trusts its contents.
    pub cache_dir: Option<PathBuf>,
    /// Directory holding `python.wasm` and `qjs.wasm`, installed by
    /// `scripts/fetch-wasm-interpreters.sh`.
    pub interpreter_dir: Option<PathBuf>,
    /// Runs executing at once. Sizes the pooling allocator; a run beyond it is refused with
    /// `BackendUnavailable`. Default 32; at least 1.
    pub max_concurrent_runs: u32,
    /// Use wasmtime's pooling allocator (pre-reserved slots, copy-on-write memory images,
    /// memory reset between runs). Default `true`; `false` allocates on demand.
    pub pooling: bool,
    /// A deterministic budget of fuel units (about one per wasm instruction) for every run;
    /// running out ends the run with `LimitKind::Fuel`. Turning it on compiles fuel checks
    /// into the code (slower) and canonicalises NaNs. Default `None`.
    pub fuel: Option<u64>,
    /// How often running modules are interrupted to check the wall-clock and CPU limits and
    /// cancellation. Default 1 ms; clamped to 100 µs..=100 ms.
    pub epoch_tick: Duration,
    /// Run the engine inside the process sandbox instead of this process. Default `None`.
    pub layered: Option<Layering>,
}

/// Running wasmtime inside another backend (the process sandbox), so an escape from the
/// engine still meets namespaces, landlock and seccomp. The receipt lists both layers.
#[derive(Clone)]
pub struct Layering {
    /// The outer backend; it runs the `strata-wasm-host` binary with the run's mounts.
    pub outer: Arc<dyn Backend>,
    /// The `strata-wasm-host` binary.
    pub host_binary: PathBuf,
}

impl Layering {
    /// Layers inside `outer`, using the host binary found by [`find_wasm_host`].
    pub fn new(outer: Arc<dyn Backend>) -> Result<Self, String> {
        Ok(Layering {
            outer,
            host_binary: find_wasm_host()?,
        })
    }
}

impl fmt::Debug for Layering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layering")
            .field("outer", &self.outer.kind())
            .field("host_binary", &self.host_binary)
            .finish()
    }
}

impl fmt::Debug for WasmConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WasmConfig")
            .field("cache_dir", &self.cache_dir)
            .field("interpreter_dir", &self.interpreter_dir)
            .field("max_concurrent_runs", &self.max_concurrent_runs)
            .field("pooling", &self.pooling)
            .field("fuel", &self.fuel)
            .field("epoch_tick", &self.epoch_tick)
            .field("layered", &self.layered)
            .finish()
    }
}

impl Default for WasmConfig {
    fn default() -> Self {
        WasmConfig {
            cache_dir: default_cache_dir(),
            interpreter_dir: default_interpreter_dir(),
            max_concurrent_runs: 32,
            pooling: true,
            fuel: None,
            epoch_tick: Duration::from_millis(1),
            layered: None,
        }
    }
}

impl WasmConfig {
    /// The defaults (see the table on [`WasmConfig`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets or disables the on-disk cache of precompiled modules.
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// Sets the directory holding the WASI interpreters.
    pub fn interpreter_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.interpreter_dir = Some(dir.into());
        self
    }

    /// Sets how many runs may execute at once.
    pub fn max_concurrent_runs(mut self, runs: u32) -> Self {
        self.max_concurrent_runs = runs;
        self
    }

    /// Turns the pooling allocator on or off.
    pub fn pooling(mut self, pooling: bool) -> Self {
        self.pooling = pooling;
        self
    }

    /// Gives every run a deterministic budget of `fuel` units.
    pub fn fuel(mut self, fuel: Option<u64>) -> Self {
        self.fuel = fuel;
        self
    }

    /// Runs the engine inside another backend.
    pub fn layered(mut self, layering: Option<Layering>) -> Self {
        self.layered = layering;
        self
    }

    pub(crate) fn tick(&self) -> Duration {
        self.epoch_tick
            .clamp(Duration::from_micros(100), Duration::from_millis(100))
    }
}

fn home_subdir(xdg: &str, fallback: &str, leaf: &str) -> Option<PathBuf> {
    let base = std::env::var_os(xdg)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(fallback))
        })?;
    Some(base.join("strata").join(leaf))
}

/// The default on-disk cache directory (see [`WasmConfig`]); `None` when
/// `STRATA_WASM_CACHE=off` or no home directory is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var_os(CACHE_ENV) {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => home_subdir("XDG_CACHE_HOME", ".cache", "wasm"),
    }
}

/// The default interpreter directory (see [`WasmConfig`]).
pub fn default_interpreter_dir() -> Option<PathBuf> {
    match std::env::var_os(INTERPRETERS_ENV) {
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => home_subdir("XDG_DATA_HOME", ".local/share", "wasm-interpreters"),
    }
}

/// Finds `strata-wasm-host`: `$STRATA_WASM_HOST`, then next to the running executable, then
/// one directory up when the executable is a cargo test binary in `target/*/deps`
/// ([`sandbox_core::binary::locate`]).
pub fn find_wasm_host() -> Result<PathBuf, String> {
    sandbox_core::binary::locate(
        WASM_HOST_NAME,
        WASM_HOST_ENV,
        &format!("build it with `cargo build --bins`, set {WASM_HOST_ENV}, or pass its path"),
    )
}
