//! Benchmarks of the wasm backend through the `Sandbox` facade (criterion):
//!
//! - `wasm/warm_run`: a trivial WASI command on a warm `Sandbox` (engine, compiled module and
//!   pooled slots ready). Target: p50 <= 20 µs.
//! - `wasm/runs_per_second`: 100 sequential warm runs per iteration on one thread; criterion
//!   reports the rate (target >= 20k runs/s on one core).
//! - `wasm/cold_run_disk_cache`: a new `Sandbox` (new engine, pool, ticker) running a module
//!   whose precompiled artifact is in the disk cache: the embedder's first run.
//! - `wasm/warm_hello`: a module that writes to stdout (captured).
//! - `wasm/warm_python`: `print(1)` in the CPython component, when the interpreters are
//!   installed (scripts/fetch-wasm-interpreters.sh).
//!
//! `benches/wasm_vs_cli.sh` runs these pinned to one core next to the `wasmtime` CLI on the
//! same module and prints the ratios.

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use strata::sandbox_wasm::WasmConfig;
use strata::{BackendChoice, BackendKind, Caps, Sandbox, ScriptLanguage, Tool};

/// `(module (memory (export "memory") 1) (func (export "_start")))`
const TRIVIAL: &[u8] = &[
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02,
    0x01, 0x00, 0x05, 0x03, 0x01, 0x00, 0x01, 0x07, 0x13, 0x02, 0x06, 0x6d, 0x65, 0x6d, 0x6f, 0x72,
    0x79, 0x02, 0x00, 0x06, 0x5f, 0x73, 0x74, 0x61, 0x72, 0x74, 0x00, 0x00, 0x0a, 0x04, 0x01, 0x02,
    0x00, 0x0b,
];

fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-wasm");
    std::fs::create_dir_all(dir.join("cache")).expect("bench dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("cache"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod cache");
    dir
}

fn trivial_module() -> PathBuf {
    let path = std::env::var_os("STRATA_BENCH_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| work_dir().join("trivial.wasm"));
    if !path.exists() {
        std::fs::write(&path, TRIVIAL).expect("write trivial.wasm");
    }
    path
}

fn hello_module() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("sandbox-wasm/tests/fixtures/hello.wat")
}

fn sandbox() -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Wasm))
        .wasm_config(WasmConfig::default().cache_dir(Some(work_dir().join("cache"))))
        .build()
        .expect("sandbox")
}

fn run_ok(sandbox: &Sandbox, tool: &Tool, caps: &Caps) {
    let out = sandbox.run(tool, caps).expect("run");
    assert!(out.success(), "{}", out.status);
}

fn benches(c: &mut Criterion) {
    let caps = Caps::new();
    let trivial = Tool::wasm(trivial_module(), Vec::<String>::new());
    let warm = sandbox();
    run_ok(&warm, &trivial, &caps);

    let mut g = c.benchmark_group("wasm");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("warm_run", |b| b.iter(|| run_ok(&warm, &trivial, &caps)));

    g.throughput(Throughput::Elements(100));
    g.bench_function("runs_per_second", |b| {
        b.iter(|| {
            for _ in 0..100 {
                run_ok(&warm, &trivial, &caps);
            }
        })
    });
    g.throughput(Throughput::Elements(1));

    g.bench_function("cold_run_disk_cache", |b| {
        b.iter(|| run_ok(&sandbox(), &trivial, &caps))
    });

    let hello = Tool::wasm(hello_module(), Vec::<String>::new());
    run_ok(&warm, &hello, &caps);
    g.bench_function("warm_hello", |b| b.iter(|| run_ok(&warm, &hello, &caps)));

    let python = Tool::script(ScriptLanguage::Python, "print(1)");
    match warm.run(&python, &caps) {
        Ok(out) if out.success() => {
            g.sample_size(20);
            g.bench_function("warm_python", |b| b.iter(|| run_ok(&warm, &python, &caps)));
        }
        Ok(out) => eprintln!(
            "wasm/warm_python skipped: python run failed ({})",
            out.status
        ),
        Err(e) => eprintln!("wasm/warm_python skipped: {e}"),
    }
    g.finish();
}

criterion_group!(wasm, benches);
criterion_main!(wasm);
