//! Layering: the wasm engine runs inside the process sandbox (namespaces, landlock,
//! seccomp) through `strata-wasm-host`; the receipt lists both layers. Needs the
//! `strata-helper` binary (built by `cargo build --workspace --bins`); fails loudly without.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use sandbox_core::{
    Access, Backend, BackendKind, ByteSize, Capability, ExitStatus, LimitKind, RunContext,
    ScriptLanguage, Stream, Tool, TrapKind,
};
use sandbox_wasm::{Layering, WasmBackend};

fn layered() -> &'static WasmBackend {
    static B: OnceLock<WasmBackend> = OnceLock::new();
    B.get_or_init(|| {
        let helper = sandbox_os::find_helper().unwrap_or_else(|e| {
            panic!("layered tests need strata-helper: {e} (run `cargo build --release --workspace --bins` first)")
        });
        let outer: Arc<dyn Backend> = Arc::new(sandbox_os::ProcessBackend::with_helper(helper));
        let layering = Layering {
            outer,
            host_binary: PathBuf::from(env!("CARGO_BIN_EXE_strata-wasm-host")),
        };
        WasmBackend::with_config(test_config().layered(Some(layering))).expect("backend")
    })
}

fn run_layered(tool: &Tool, caps: &sandbox_core::Caps) -> sandbox_core::RunOutput {
    run_with(layered(), tool, caps)
}

#[test]
fn layered_run_lists_both_layers_and_their_mechanisms() {
    let out = run_layered(&Tool::wasm(probe(), ["echo", "layered"]), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 0 }, "{out:?}");
    assert_eq!(stdout(&out), "layered\n");
    let r = &out.receipt;
    assert_eq!(r.layers, vec![BackendKind::Process, BackendKind::Wasm]);
    assert!(r.has(Capability::Fs, "WASI preopens"), "{r}");
    assert!(r.has(Capability::Syscalls, "seccomp"), "{r}");
    assert!(r.has(Capability::Fs, "mount namespace"), "{r}");
}

#[test]
fn layered_run_maps_mounts_env_and_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("in.txt"), "hello").expect("write");
    let caps = caps()
        .mount(dir.path(), "/data", Access::ReadWrite)
        .env("A", "1")
        .stdin(b"piped".to_vec());
    let out = run_layered(&Tool::wasm(probe(), ["read", "/data/in.txt"]), &caps);
    assert_eq!(stdout(&out), "OK read hello\n");
    let out = run_layered(&Tool::wasm(probe(), ["env"]), &caps);
    assert_eq!(stdout(&out), "A=1\n");
    let out = run_layered(&Tool::wasm(probe(), ["stdin"]), &caps);
    assert_eq!(stdout(&out), "piped");
    let out = run_layered(&Tool::wasm(probe(), ["write", "/data/out.txt", "w"]), &caps);
    assert_eq!(stdout(&out), "OK write\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).expect("out"),
        "w"
    );
}

#[test]
fn layered_stdin_stream_reaches_the_guest_and_cannot_outlive_the_timeout() {
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let (reader, mut writer) = pipe();
    let (ctx, _source) = streaming(reader);
    let expected = [b"caps|".as_slice(), &data].concat();
    let producer = std::thread::spawn(move || std::io::Write::write_all(&mut writer, &data));
    let mut with_prefix = caps().stdin(b"caps|".to_vec());
    with_prefix.limits.output = ByteSize::mib(2);
    let out = layered()
        .run_caps(&Tool::wasm(probe(), ["stdin"]), &with_prefix, &ctx)
        .expect("run");
    producer.join().expect("producer").expect("written");
    assert_eq!(out.status, ExitStatus::Exited { code: 0 }, "{out:?}");
    assert!(out.stdout == expected, "stdout differs from the stream");

    // A producer that never writes nor closes.
    let (reader, writer) = pipe();
    let (ctx, _source) = streaming(reader);
    let out = layered()
        .run_caps(
            &Tool::wasm(probe(), ["stdin"]),
            &caps().timeout(Duration::from_millis(500)),
            &ctx,
        )
        .expect("run");
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    drop(writer);
}

#[test]
fn layered_blocks_dotdot_traversal_out_of_preopen() {
    let root = tempfile::tempdir().expect("tempdir");
    let granted = root.path().join("granted");
    std::fs::create_dir(&granted).expect("mkdir");
    std::fs::write(root.path().join("secret.txt"), "TOP-SECRET").expect("canary");
    let caps = caps().mount(&granted, "/data", Access::ReadWrite);
    let out = run_layered(&Tool::wasm(probe(), ["read", "/data/../secret.txt"]), &caps);
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
}

#[test]
fn layered_limits_and_traps_are_reported_from_the_inner_layer() {
    let out = run_layered(
        &Tool::wasm(probe(), ["spin"]),
        &caps().timeout(Duration::from_millis(500)),
    );
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    let mut c = caps();
    c.limits.output = ByteSize(1000);
    let out = run_layered(&Tool::wasm(probe(), ["spam", "100000"]), &c);
    assert_eq!(out.limit(), Some(LimitKind::Output));
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated);
    let out = run_layered(&Tool::wasm(wat_fixture("traps"), ["recurse"]), &caps());
    assert_eq!(out.trap(), Some(TrapKind::StackOverflow));
    let out = run_layered(&Tool::wasm(probe(), ["exit", "9"]), &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 9 });
}

#[test]
fn layered_output_streams_through_the_sink() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let ctx = RunContext {
        sink: Some(Arc::new(move |stream: Stream, chunk: &[u8]| {
            if stream == Stream::Stdout {
                s.lock().expect("lock").extend_from_slice(chunk);
            }
        })),
        ..RunContext::default()
    };
    let out = layered()
        .run_caps(&Tool::wasm(probe(), ["echo", "streamed"]), &caps(), &ctx)
        .expect("run");
    assert_eq!(&*seen.lock().expect("lock"), b"streamed\n");
    assert_eq!(out.stdout, b"streamed\n");
}

#[test]
fn layered_python_one_liner() {
    require_interpreters();
    let out = run_layered(
        &Tool::script(ScriptLanguage::Python, "print(6 * 7)"),
        &caps().timeout(Duration::from_secs(60)),
    );
    assert_eq!(
        stdout(&out),
        "42\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.receipt.layers,
        vec![BackendKind::Process, BackendKind::Wasm]
    );
}

#[test]
fn layered_git_hook_in_writable_grant_is_read_only() {
    // The outer process sandbox binds the hook read-only; the inner preopen's rights do
    // not matter, and the run is not refused.
    let dir = tempfile::tempdir().expect("tempdir");
    let hooks = dir.path().join(".git/hooks");
    std::fs::create_dir_all(&hooks).expect("mkdir");
    std::fs::write(hooks.join("pre-commit"), "original").expect("hook");
    let caps = caps().mount(dir.path(), "/data", Access::ReadWrite);
    let out = run_layered(
        &Tool::wasm(probe(), ["write", "/data/.git/hooks/pre-commit", "evil"]),
        &caps,
    );
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
    let out = run_layered(
        &Tool::wasm(probe(), ["rename", "/data/.git", "/data/.git.old"]),
        &caps,
    );
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
    let out = run_layered(&Tool::wasm(probe(), ["write", "/data/ok.txt", "w"]), &caps);
    assert_eq!(stdout(&out), "OK write\n");
    assert_eq!(
        std::fs::read_to_string(hooks.join("pre-commit")).expect("hook"),
        "original"
    );
    assert!(!dir.path().join(".git.old").exists());
    let r = &out.receipt;
    assert!(
        r.to_string()
            .contains("host-executed paths read-only: /data/.git/hooks"),
        "{r}"
    );
    assert!(r.gaps.is_empty(), "{r}");
}
