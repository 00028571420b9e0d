//! The wasm backend runs WASI commands with exactly the caps it was given, and reports
//! what it enforced.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use sandbox_core::{
    Access, Backend, ByteSize, CancelToken, Capability, ErrorKind, ExitStatus, LimitKind,
    RunContext, Stream, Tool,
};

#[test]
fn runs_a_wat_command_and_captures_stdout() {
    let out = run(
        &Tool::wasm(wat_fixture("hello"), Vec::<String>::new()),
        &caps(),
    );
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert_eq!(stdout(&out), "hello from wasm\n");
    assert!(!out.stdout_truncated);
    assert_eq!(out.receipt.layers, vec![sandbox_core::BackendKind::Wasm]);
}

#[test]
fn passes_arguments_after_the_program_name() {
    let out = run_probe(&["echo", "a b", "c"], &caps());
    assert_eq!(stdout(&out), "a b c\n");
}

#[test]
fn exit_codes_are_reported() {
    let out = run_probe(&["exit", "7"], &caps());
    assert_eq!(out.status, ExitStatus::Exited { code: 7 });
    assert_eq!(out.cli_exit_code(), 7);
}

#[test]
fn stdin_comes_from_the_caps() {
    let out = run_probe(&["stdin"], &caps().stdin(b"line one\nline two\n".to_vec()));
    assert_eq!(stdout(&out), "line one\nline two\n");
}

#[test]
fn stdin_stream_reaches_the_guest_exactly() {
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let (reader, mut writer) = pipe();
    let (ctx, _source) = streaming(reader);
    let expected = [b"prefix|".as_slice(), &data].concat();
    let producer = std::thread::spawn(move || std::io::Write::write_all(&mut writer, &data));
    let mut with_prefix = caps().stdin(b"prefix|".to_vec());
    with_prefix.limits.output = ByteSize::mib(4);
    let out = backend()
        .run_caps(&Tool::wasm(probe(), ["stdin"]), &with_prefix, &ctx)
        .expect("run");
    producer.join().expect("producer").expect("written");
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert!(out.stdout == expected, "stdout differs from the stream");
}

#[test]
fn silent_stdin_stream_cannot_outlive_the_timeout() {
    let (reader, writer) = pipe();
    let (ctx, _source) = streaming(reader);
    let out = backend()
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
fn endless_stdin_stream_is_held_back_and_closed_after_the_run() {
    let (reader, writer) = pipe();
    let (ctx, source) = streaming(reader);
    let producer = endless_producer(writer);
    let out = backend()
        .run_caps(
            &Tool::wasm(probe(), ["sleep", "100"]),
            &caps().timeout(Duration::from_millis(500)),
            &ctx,
        )
        .expect("run");
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    assert!(source.is_taken());
    let written = producer.join().expect("producer");
    eprintln!("the producer got {written} bytes in");
    assert!(
        written <= 8 * sandbox_core::STDIN_BUFFER as u64,
        "{written} bytes taken from a producer the guest never read"
    );
}

#[test]
fn env_is_exactly_the_caps_env() {
    let out = run_probe(&["env"], &caps().env("GREETING", "hi").env("N", "1"));
    assert_eq!(stdout(&out), "GREETING=hi\nN=1\n");
    assert!(out
        .receipt
        .has(Capability::Env, "explicit WASI environment"));
}

#[test]
fn stderr_is_captured_separately() {
    let out = run_probe(&["stderr", "oops"], &caps());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    assert!(out.stdout.is_empty());
}

#[test]
fn read_only_mount_is_readable_at_its_guest_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("input.txt"), "data!").expect("write");
    let caps = caps().mount(dir.path(), "/data", Access::ReadOnly);
    let out = run_probe(&["read", "/data/input.txt"], &caps);
    assert_eq!(stdout(&out), "OK read data!\n");
    assert!(out.receipt.has(Capability::Fs, "WASI preopens"));
    let fs = out
        .receipt
        .enforced_for(Capability::Fs)
        .next()
        .expect("fs enforcement");
    assert!(fs.detail.contains("ro: /data"), "{}", fs.detail);
}

#[test]
fn read_write_mount_accepts_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    let out = run_probe(&["write", "/out/result.txt", "42"], &caps);
    assert_eq!(stdout(&out), "OK write\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("result.txt")).expect("read"),
        "42"
    );
}

#[test]
fn receipt_names_every_mechanism() {
    let out = run_probe(&["exit", "0"], &caps());
    let r = &out.receipt;
    for (cap, mechanism) in [
        (Capability::Fs, "WASI preopens"),
        (Capability::Net, "no sockets"),
        (Capability::Memory, "ResourceLimiter"),
        (Capability::Wall, "epoch deadline"),
        (Capability::Cpu, "epoch interruption"),
        (Capability::Output, "host-side capture"),
        (Capability::Disk, "metered WASI writes"),
        (Capability::Pids, "single wasm instance"),
        (Capability::OpenFiles, "ResourceTable"),
    ] {
        assert!(r.has(cap, mechanism), "{cap}: {mechanism} missing in\n{r}");
    }
    assert!(r.gaps.is_empty(), "{r}");
}

#[test]
fn output_is_cut_at_exactly_the_limit_and_the_run_ends() {
    let mut caps = caps();
    caps.limits.output = ByteSize(10_000);
    let out = run_probe(&["spam", "1000000"], &caps);
    assert_eq!(
        out.status,
        ExitStatus::Limit {
            limit: LimitKind::Output,
            signal: None
        }
    );
    assert_eq!(out.stdout.len(), 10_000);
    assert!(out.stdout_truncated);
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::Output));
}

#[test]
fn stderr_flood_is_cut_too() {
    let mut caps = caps();
    caps.limits.output = ByteSize(4096);
    let out = run_probe(&["spam-stderr", "100000"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::Output));
    assert_eq!(out.stderr.len(), 4096);
    assert!(out.stderr_truncated && !out.stdout_truncated);
}

#[test]
fn output_streams_to_the_sink_as_it_is_written() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    let ctx = RunContext {
        sink: Some(Arc::new(move |stream: Stream, chunk: &[u8]| {
            s.lock().expect("lock").push((stream, chunk.to_vec()));
        })),
        ..RunContext::default()
    };
    let tool = Tool::wasm(probe(), ["echo", "streamed"]);
    let out = backend().run_caps(&tool, &caps(), &ctx).expect("run");
    let seen = seen.lock().expect("lock");
    let joined: Vec<u8> = seen
        .iter()
        .filter(|(s, _)| *s == Stream::Stdout)
        .flat_map(|(_, c)| c.clone())
        .collect();
    assert_eq!(joined, out.stdout);
}

#[test]
fn cancelling_stops_a_spinning_module() {
    let cancel = CancelToken::new();
    let c = cancel.clone();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        c.cancel();
    });
    let ctx = RunContext {
        cancel,
        ..RunContext::default()
    };
    let err = backend()
        .run_caps(&Tool::wasm(probe(), ["spin"]), &caps(), &ctx)
        .expect_err("cancelled");
    canceller.join().expect("join");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
}

#[test]
fn cancelling_interrupts_a_blocking_sleep() {
    let cancel = CancelToken::new();
    let c = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        c.cancel();
    });
    let ctx = RunContext {
        cancel,
        ..RunContext::default()
    };
    let err = backend()
        .run_caps(&Tool::wasm(probe(), ["sleep", "600"]), &caps(), &ctx)
        .expect_err("cancelled");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
}

#[test]
fn missing_module_is_an_invalid_request() {
    let err = backend()
        .run_caps(
            &Tool::wasm("/nonexistent/x.wasm", Vec::<String>::new()),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("missing");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("/nonexistent/x.wasm"), "{err}");
}

#[test]
fn garbage_module_is_an_invalid_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.wasm");
    std::fs::write(&path, b"\0asm\x01\0\0\0garbage").expect("write");
    let err = backend()
        .run_caps(
            &Tool::wasm(&path, Vec::<String>::new()),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("invalid");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[test]
fn precompiled_artifacts_from_outside_are_refused() {
    let engine = wasmtime::Engine::default();
    let artifact = engine
        .precompile_module(br#"(module (func (export "_start")))"#)
        .expect("precompile");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("evil.cwasm");
    std::fs::write(&path, artifact).expect("write");
    let err = backend()
        .run_caps(
            &Tool::wasm(&path, Vec::<String>::new()),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("precompiled"), "{err}");
}

#[test]
fn imports_outside_wasi_are_refused_before_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("imports.wat");
    std::fs::write(
        &path,
        r#"(module (import "env" "system" (func (param i32))) (func (export "_start")))"#,
    )
    .expect("write");
    let err = backend()
        .run_caps(
            &Tool::wasm(&path, Vec::<String>::new()),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[test]
fn host_commands_and_sh_scripts_are_not_this_backends_job() {
    let err = backend()
        .run_caps(&Tool::command(["ls"]), &caps(), &RunContext::default())
        .expect_err("command");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    let err = backend()
        .run_caps(
            &Tool::script(sandbox_core::ScriptLanguage::Sh, "echo hi"),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("sh");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[test]
fn file_mounts_are_refused_because_wasi_preopens_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("f.txt");
    std::fs::write(&file, "x").expect("write");
    let err = backend()
        .run_caps(
            &Tool::wasm(probe(), ["exit", "0"]),
            &caps().read_only(&file),
            &RunContext::default(),
        )
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn warm_runs_reuse_the_compiled_module() {
    let tool = Tool::wasm(wat_fixture("trivial"), Vec::<String>::new());
    for _ in 0..50 {
        let out = run(&tool, &caps());
        assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    }
}

#[test]
fn a_new_backend_loads_the_module_from_the_disk_cache() {
    let probe = probe();
    WasmBackend::with_config(test_config())
        .expect("backend")
        .precompile(&probe)
        .expect("precompile");
    let fresh = WasmBackend::with_config(test_config()).expect("backend");
    let out = run_with(&fresh, &Tool::wasm(&probe, ["echo", "cached"]), &caps());
    assert_eq!(stdout(&out), "cached\n");
    let cached = std::fs::read_dir(test_cache_dir())
        .expect("cache dir")
        .flatten()
        .any(|engine_dir| {
            std::fs::read_dir(engine_dir.path())
                .map(|files| {
                    files
                        .flatten()
                        .any(|f| f.file_name().to_string_lossy().ends_with(".cwasm"))
                })
                .unwrap_or(false)
        });
    assert!(cached, "no precompiled artifact in the disk cache");
}

#[test]
fn runs_in_parallel_from_many_threads() {
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let arg = format!("t{i}");
                let out = run_probe(&["echo", &arg], &caps());
                assert_eq!(stdout(&out), format!("{arg}\n"));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn fuel_budgets_are_deterministic() {
    let config = test_config().fuel(Some(2_000_000));
    let fueled = WasmBackend::with_config(config).expect("backend");
    let out = run_with(&fueled, &Tool::wasm(probe(), ["spin"]), &caps());
    assert_eq!(
        out.status,
        ExitStatus::Limit {
            limit: LimitKind::Fuel,
            signal: None
        }
    );
    assert!(out.receipt.has(Capability::Cpu, "fuel"));
    let ok = run_with(&fueled, &Tool::wasm(probe(), ["echo", "x"]), &caps());
    assert_eq!(stdout(&ok), "x\n");
}

#[test]
fn works_from_inside_a_tokio_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt.block_on(async { run_probe(&["echo", "async"], &caps()) });
    assert_eq!(stdout(&out), "async\n");
}

#[test]
fn works_from_a_tokio_blocking_task() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let out = rt
        .block_on(async {
            tokio::task::spawn_blocking(|| run_probe(&["echo", "blocking"], &caps())).await
        })
        .expect("join");
    assert_eq!(stdout(&out), "blocking\n");
}

#[test]
fn runs_past_max_concurrent_runs_are_refused_not_queued() {
    let one =
        Arc::new(WasmBackend::with_config(test_config().max_concurrent_runs(1)).expect("backend"));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let started_tx = Mutex::new(started_tx);
    let cancel = CancelToken::new();
    let spinner = {
        let one = Arc::clone(&one);
        let ctx = RunContext {
            cancel: cancel.clone(),
            sink: Some(Arc::new(move |_: Stream, _: &[u8]| {
                let _ = started_tx.lock().expect("lock").send(());
            })),
            ..RunContext::default()
        };
        std::thread::spawn(move || {
            one.run_caps(&Tool::wasm(probe(), ["announce-spin"]), &caps(), &ctx)
        })
    };
    started_rx.recv().expect("the spinner started");
    let err = one
        .run_caps(
            &Tool::wasm(probe(), ["exit", "0"]),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("busy");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    cancel.cancel();
    let spun = spinner.join().expect("spinner").expect_err("cancelled");
    assert_eq!(spun.kind(), ErrorKind::Cancelled);
}

#[test]
fn report_lists_engine_cache_and_interpreters() {
    let report = backend().report();
    assert!(report.available);
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    for name in [
        "engine",
        "pooling allocator",
        "module cache",
        "python interpreter",
    ] {
        assert!(names.contains(&name), "{names:?}");
    }
}

use sandbox_wasm::WasmBackend;

#[test]
fn root_grant_resolves_relative_and_absolute_paths_as_wasmtime_dir_host_root_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("notes.txt"), "at the root").expect("write");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    std::fs::write(dir.path().join("sub/deep.txt"), "deeper").expect("write");
    let caps = caps().mount(dir.path(), "/", Access::ReadOnly);
    assert_eq!(
        stdout(&run_probe(&["read", "notes.txt"], &caps)),
        "OK read at the root\n"
    );
    assert_eq!(
        stdout(&run_probe(&["read", "/sub/deep.txt"], &caps)),
        "OK read deeper\n"
    );
    assert_eq!(
        stdout(&run_probe(&["read", "sub/../notes.txt"], &caps)),
        "OK read at the root\n"
    );
    // Read-only holds at the root too; nothing above the granted directory is reachable.
    let out = run_probe(&["write", "new.txt", "x"], &caps);
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
    assert!(!dir.path().join("new.txt").exists());
    let out = run_probe(&["read", "../../../../etc/hostname"], &caps);
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
}
