//! Strata's WebAssembly backend: wasmtime with WASI preview 1 (core modules) and preview 2
//! (components), for pure-compute tools and for Python and JavaScript code run by
//! interpreters compiled to WASI.
//!
//! # How caps map
//!
//! | caps | in this backend |
//! |---|---|
//! | `mounts` | WASI preopened directories at the guest paths; read-only mounts refuse every mutation. A mount must be a directory. A mount at the guest root `/` is a root preopen, as `wasmtime run --dir HOST::/` gives (relative paths resolve against it); the other backends refuse one. Nothing else of the host is visible (no system directories: modules need none). |
//! | `env` | exactly the listed variables; the host environment is never inherited |
//! | `net` | `none`: no sockets. `allow`: preview 2 `wasi:sockets` checked against the shared egress policy (the proxy's matcher): name lookups only for names a rule matches (others are never resolved), TCP connect only to an address a rule admits for that port, reached through a name the run resolved or as an IP literal (reserved ranges and the host's own addresses only by an explicit IP/CIDR rule); no listening, no UDP; connection and byte budgets; every decision in the receipt's `network` section. `host`: unrestricted WASI sockets, listed as a gap. |
//! | `stdin` | the bytes given, then the context's stream ([`sandbox_core::StdinSource`]) read asynchronously with bounded buffering (at most [`sandbox_core::STDIN_BUFFER`] in flight), then end of file; a guest blocked on it is still cut by the deadline |
//! | `workdir` | the component's initial directory; must be inside a mount |
//! | `limits.timeout` | epoch interruption every tick plus an async deadline that also cuts blocking WASI calls |
//! | `limits.cpu_time` | the running thread's CPU clock, checked every tick |
//! | `limits.memory` (and `address_space`) | a `ResourceLimiter` budget over all linear memories and tables |
//! | `limits.output` | per-stream capture; writing past it ends the run (`LimitKind::Output`), keeping exactly the limit |
//! | `limits.disk`, `limits.file_size` | metered WASI writes into read-write preopens (see `quota`) |
//! | `limits.open_files` | capacity of the WASI resource table |
//! | `limits.processes` | trivially held: WASI cannot create processes and wasm threads are off |
//!
//! Traps (out-of-bounds access, stack overflow, `unreachable`) end a run with
//! `ExitStatus::Trapped`; they never take the host down. Optional fuel gives deterministic
//! budgets (`LimitKind::Fuel`).
//!
//! # Speed
//!
//! One engine per backend; compiled modules are cached in memory as `InstancePre`s keyed by
//! content hash and on disk as precompiled artifacts; instances come from the pooling
//! allocator with copy-on-write memory images.
//!
//! # Layering
//!
//! With [`Layering`] the engine runs inside another backend (the process sandbox) through
//! the `strata-wasm-host` binary, so an engine escape still meets that sandbox.

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod backend;
mod cache;
mod capture;
pub mod config;
mod egress;
mod engine;
mod exec;
mod executor;
mod frame;
mod layered;
mod limiter;
mod linkers;
mod plan;
mod program;
mod quota;
mod receipt;
mod script;
mod state;
mod stdin;
mod ticker;
mod wasi;

pub use backend::WasmBackend;
pub use config::{
    default_cache_dir, default_interpreter_dir, find_wasm_host, Layering, WasmConfig,
};
pub use layered::host_main;
pub use script::{FETCH_SCRIPT, PYTHON_FILE, QUICKJS_FILE};
