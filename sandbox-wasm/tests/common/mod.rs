//! Shared helpers of the wasm backend's tests: fixtures built in-repo (C with Debian's
//! clang-14 + wasi-libc + lld-14, or WAT), backends, and run shorthands.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sandbox_core::{Backend, Caps, RunContext, RunOutput, Strictness, Tool};
use sandbox_wasm::{WasmBackend, WasmConfig};

pub const CLANG: &str = "clang-14";

fn fixtures_src() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
}

fn fixtures_out() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-fixtures");
    std::fs::create_dir_all(&dir).expect("create fixture dir");
    dir
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Builds (once, when the source is newer) a C fixture into a WASI preview 1 command.
/// Panics with what to install when the toolchain is missing: never skips silently.
pub fn c_fixture(name: &str) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let src = fixtures_src().join(format!("{name}.c"));
    let out = fixtures_out().join(format!("{name}.wasm"));
    let fresh = match (std::fs::metadata(&src), std::fs::metadata(&out)) {
        (Ok(s), Ok(o)) => o.modified().expect("mtime") >= s.modified().expect("mtime"),
        _ => false,
    };
    if !fresh {
        let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
        let status = Command::new(CLANG)
            .args(["--target=wasm32-wasi", "-O2", "-fuse-ld=lld", "-Wl,--strip-all"])
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {CLANG} to build the WASI fixture {name}: {e}. Install clang-14, lld-14, wasi-libc and libclang-rt-14-dev-wasm32 (scripts/deps.sh test)"
                )
            });
        assert!(
            status.success(),
            "{CLANG} failed to build fixture {name} (are wasi-libc, lld-14 and libclang-rt-14-dev-wasm32 installed? scripts/deps.sh test)"
        );
        std::fs::rename(&tmp, &out).expect("install fixture");
    }
    out
}

/// A WAT fixture (wasmtime compiles the text directly).
pub fn wat_fixture(name: &str) -> PathBuf {
    let path = fixtures_src().join(format!("{name}.wat"));
    assert!(path.is_file(), "missing fixture {}", path.display());
    path
}

/// The probe (see tests/fixtures/probe.c).
pub fn probe() -> PathBuf {
    c_fixture("probe")
}

/// A disk cache private to this test run, so tests never depend on the user's cache.
pub fn test_cache_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-cache");
    std::fs::create_dir_all(&dir).expect("cache dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    dir
}

/// The configuration tests use: a private disk cache, the default interpreter directory.
pub fn test_config() -> WasmConfig {
    WasmConfig::default().cache_dir(Some(test_cache_dir()))
}

/// One backend shared by the tests of a binary (like one `Sandbox` shared by an app).
pub fn backend() -> &'static WasmBackend {
    static B: OnceLock<WasmBackend> = OnceLock::new();
    B.get_or_init(|| WasmBackend::with_config(test_config()).expect("wasm backend"))
}

/// Caps with a short timeout so a broken limit fails the test instead of hanging it.
pub fn caps() -> Caps {
    Caps::new().timeout(Duration::from_secs(20))
}

pub fn run_with(backend: &WasmBackend, tool: &Tool, caps: &Caps) -> RunOutput {
    backend
        .run_caps(tool, caps, &RunContext::default())
        .unwrap_or_else(|e| panic!("run {} failed: {e}", tool.describe()))
}

pub fn run(tool: &Tool, caps: &Caps) -> RunOutput {
    run_with(backend(), tool, caps)
}

pub fn run_probe(args: &[&str], caps: &Caps) -> RunOutput {
    run(&Tool::wasm(probe(), args.iter().copied()), caps)
}

pub fn best_effort() -> RunContext {
    RunContext {
        strictness: Strictness::BestEffort,
        ..RunContext::default()
    }
}

pub fn stdout(out: &RunOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The interpreter directory the backend uses; panics (never skips) when the interpreters
/// are not installed.
pub fn require_interpreters() {
    let dir = sandbox_wasm::default_interpreter_dir().expect("an interpreter directory");
    for file in [sandbox_wasm::PYTHON_FILE, sandbox_wasm::QUICKJS_FILE] {
        assert!(
            dir.join(file).is_file(),
            "{} is missing: run {} first (CI does it in scripts/test.sh)",
            dir.join(file).display(),
            sandbox_wasm::FETCH_SCRIPT
        );
    }
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> (std::fs::File, std::fs::File) {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
    (r.into(), w.into())
}

/// A context streaming `reader` to the guest's stdin, and the source (to check it later).
pub fn streaming(reader: std::fs::File) -> (RunContext, std::sync::Arc<sandbox_core::StdinSource>) {
    let source = std::sync::Arc::new(sandbox_core::StdinSource::from_fd(reader));
    let ctx = RunContext {
        stdin: Some(std::sync::Arc::clone(&source)),
        ..RunContext::default()
    };
    (ctx, source)
}

/// Writes to the pipe until a write fails (the run closed its end); returns the bytes that
/// went in.
pub fn endless_producer(mut writer: std::fs::File) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        use std::io::Write;
        let chunk = vec![b'y'; 16 * 1024];
        let mut written = 0u64;
        while let Ok(n) = writer.write(&chunk) {
            written += n as u64;
        }
        written
    })
}
