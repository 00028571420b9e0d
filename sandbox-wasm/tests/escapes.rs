//! Escape tests of the wasm backend, named after the attack (SECURITY.md classes A, B, D,
//! E, I, J). The probe (tests/fixtures/probe.c) attacks from inside; the harness checks its
//! report and the host-side evidence (canary files intact, nothing written outside).

mod common;

use std::path::Path;

use common::*;
use sandbox_core::{
    Access, Backend, ByteSize, Capability, ExitStatus, LimitKind, Net, NetRule, RunContext, Tool,
    TrapKind,
};

/// A host layout: `outside/secret.txt` next to the granted `granted/` directory.
struct Layout {
    _root: tempfile::TempDir,
    granted: std::path::PathBuf,
    secret: std::path::PathBuf,
}

fn layout() -> Layout {
    let root = tempfile::tempdir().expect("tempdir");
    let granted = root.path().join("granted");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&granted).expect("mkdir");
    std::fs::create_dir_all(&outside).expect("mkdir");
    let secret = outside.join("secret.txt");
    std::fs::write(&secret, "TOP-SECRET").expect("canary");
    std::fs::write(granted.join("ok.txt"), "fine").expect("file");
    Layout {
        _root: root,
        granted,
        secret,
    }
}

fn assert_refused(out: &sandbox_core::RunOutput, what: &str) {
    let text = stdout(out);
    assert!(
        text.starts_with("ERR") && !text.contains("TOP-SECRET"),
        "{what}: the probe got through: {text:?}"
    );
}

fn assert_canary_intact(l: &Layout) {
    assert_eq!(
        std::fs::read_to_string(&l.secret).expect("canary"),
        "TOP-SECRET"
    );
}

// ---- A: paths ------------------------------------------------------------------------

#[test]
fn blocks_dotdot_traversal_out_of_preopen() {
    let l = layout();
    let caps = caps().mount(&l.granted, "/data", Access::ReadWrite);
    for path in [
        "/data/../outside/secret.txt",
        "/data/../../outside/secret.txt",
        "/data/./../outside/secret.txt",
        "../outside/secret.txt",
        "/data/sub/../../outside/secret.txt",
    ] {
        assert_refused(&run_probe(&["read", path], &caps), path);
    }
    assert_refused(
        &run_probe(&["write", "/data/../outside/secret.txt", "pwned"], &caps),
        "write via ..",
    );
    assert_canary_intact(&l);
}

#[test]
fn blocks_absolute_host_paths_outside_preopens() {
    let l = layout();
    let caps = caps().mount(&l.granted, "/data", Access::ReadOnly);
    let secret = l.secret.to_string_lossy().into_owned();
    for path in [secret.as_str(), "/etc/passwd", "/proc/self/environ", "/"] {
        let out = run_probe(&["read", path], &caps);
        assert_refused(&out, path);
    }
    assert_refused(&run_probe(&["ls", "/"], &caps), "ls /");
}

#[test]
fn blocks_symlink_planted_in_writable_mount() {
    let l = layout();
    // A symlink planted on the host side, and one the probe plants itself.
    std::os::unix::fs::symlink(&l.secret, l.granted.join("host-link")).expect("symlink");
    let caps = caps().mount(&l.granted, "/data", Access::ReadWrite);
    assert_refused(
        &run_probe(&["read", "/data/host-link"], &caps),
        "host-planted absolute symlink",
    );
    let planted = run_probe(
        &["symlink", "../outside/secret.txt", "/data/guest-link"],
        &caps,
    );
    // Creating a dangling relative link is allowed; following it out is not.
    let _ = planted;
    assert_refused(
        &run_probe(&["read", "/data/guest-link"], &caps),
        "guest-planted relative symlink",
    );
    assert_refused(
        &run_probe(&["write", "/data/guest-link", "pwned"], &caps),
        "write through symlink",
    );
    let abs = l.secret.to_string_lossy().into_owned();
    let _ = run_probe(&["symlink", &abs, "/data/abs-link"], &caps);
    assert_refused(
        &run_probe(&["read", "/data/abs-link"], &caps),
        "guest-planted absolute symlink",
    );
    assert_canary_intact(&l);
}

#[test]
fn blocks_trailing_slash_and_odd_path_forms() {
    let l = layout();
    let caps = caps().mount(&l.granted, "/data", Access::ReadOnly);
    for path in [
        "/data/../outside/secret.txt/",
        "/data/..//outside//secret.txt",
        "/data/.././outside/./secret.txt",
        "//data/../outside/secret.txt",
        "/data/ok.txt/../../outside/secret.txt",
    ] {
        assert_refused(&run_probe(&["read", path], &caps), path);
    }
    // A file path with a trailing slash is not a directory.
    assert_refused(&run_probe(&["read", "/data/ok.txt/"], &caps), "file/");
    // The granted file itself stays readable.
    assert_eq!(
        stdout(&run_probe(&["read", "/data//./ok.txt"], &caps)),
        "OK read fine\n"
    );
}

#[test]
fn blocks_hard_link_and_rename_across_the_boundary() {
    let l = layout();
    let caps = caps().mount(&l.granted, "/data", Access::ReadWrite);
    assert_refused(
        &run_probe(
            &["link", "/data/../outside/secret.txt", "/data/stolen"],
            &caps,
        ),
        "hard link out",
    );
    assert_refused(
        &run_probe(
            &["rename", "/data/ok.txt", "/data/../outside/moved.txt"],
            &caps,
        ),
        "rename out",
    );
    assert!(!l.secret.parent().expect("dir").join("moved.txt").exists());
    assert!(l.granted.join("ok.txt").exists());
    assert_canary_intact(&l);
}

#[test]
fn blocks_writes_to_read_only_mount() {
    let l = layout();
    let caps = caps().mount(&l.granted, "/data", Access::ReadOnly);
    for (args, what) in [
        (vec!["write", "/data/ok.txt", "pwned"], "overwrite"),
        (vec!["append", "/data/ok.txt", "more"], "append"),
        (vec!["truncate", "/data/ok.txt"], "truncate"),
        (vec!["write", "/data/new.txt", "x"], "create"),
        (vec!["mkdir", "/data/dir"], "mkdir"),
        (vec!["unlink", "/data/ok.txt"], "unlink"),
        (
            vec!["rename", "/data/ok.txt", "/data/renamed.txt"],
            "rename",
        ),
        (vec!["link", "/data/ok.txt", "/data/hard"], "link"),
        (vec!["symlink", "ok.txt", "/data/soft"], "symlink"),
    ] {
        assert_refused(&run_probe(&args, &caps), what);
    }
    let entries: Vec<String> = std::fs::read_dir(&l.granted)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, vec!["ok.txt".to_string()]);
    assert_eq!(
        std::fs::read_to_string(l.granted.join("ok.txt")).expect("read"),
        "fine"
    );
}

#[test]
fn nothing_is_visible_without_mounts() {
    for path in ["/", ".", "/tmp", "/etc"] {
        assert_refused(&run_probe(&["ls", path], &caps()), path);
    }
}

// ---- B: network ----------------------------------------------------------------------

#[test]
fn preview1_modules_cannot_import_socket_creation() {
    // WASI preview 1 has no socket-creating function; a module asking for one is refused
    // before it runs.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sock.wat");
    std::fs::write(
        &path,
        r#"(module
             (import "wasi_snapshot_preview1" "sock_open" (func (param i32 i32 i32) (result i32)))
             (memory (export "memory") 1)
             (func (export "_start")))"#,
    )
    .expect("write");
    let err = backend()
        .run_caps(
            &Tool::wasm(&path, Vec::<String>::new()),
            &caps(),
            &RunContext::default(),
        )
        .expect_err("refused");
    assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
}

#[test]
fn blocks_sock_accept_on_preopened_directories() {
    let l = layout();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("accept.wat");
    // fd 3 is the first preopen; sock_accept on it must fail with an errno, not a socket.
    std::fs::write(
        &path,
        r#"(module
             (import "wasi_snapshot_preview1" "sock_accept" (func $accept (param i32 i32 i32) (result i32)))
             (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
             (memory (export "memory") 1)
             (func (export "_start")
               (call $exit (call $accept (i32.const 3) (i32.const 0) (i32.const 16)))))"#,
    )
    .expect("write");
    let caps = caps().mount(&l.granted, "/data", Access::ReadWrite);
    let out = run(&Tool::wasm(&path, Vec::<String>::new()), &caps);
    match out.status {
        ExitStatus::Exited { code } => assert_ne!(code, 0, "sock_accept succeeded"),
        other => panic!("unexpected status {other}"),
    }
}

#[test]
fn receipt_states_no_sockets_and_enforces_host_name_allowlists() {
    let out = run_probe(&["exit", "0"], &caps());
    assert!(out.receipt.has(Capability::Net, "no sockets"));
    assert!(out.receipt.network.is_none());
    // Name rules are enforced (through the shared egress policy, see tests/egress.rs), so
    // a strict run accepts them and lists no gap.
    let caps = caps().net(Net::Allow(vec![NetRule {
        host: "example.com".into(),
        port: Some(443),
    }]));
    let out = backend()
        .run_caps(
            &Tool::wasm(probe(), ["exit", "0"]),
            &caps,
            &RunContext::default(),
        )
        .expect("strict");
    assert!(out
        .receipt
        .has(Capability::Net, "wasi:sockets egress policy"));
    assert!(!out
        .receipt
        .gaps
        .iter()
        .any(|g| g.capability == Capability::Net));
    let network = out.receipt.network.expect("network section");
    assert_eq!(network.enforcer, "wasi:sockets");
    assert_eq!(network.rules, vec!["example.com:443".to_string()]);
    assert!(network.decisions.is_empty());
}

// ---- D: exhaustion -------------------------------------------------------------------

#[test]
fn memory_bomb_ends_at_the_memory_limit() {
    let caps = caps().memory(ByteSize::mib(32));
    let out = run_probe(&["alloc"], &caps);
    assert_eq!(
        out.status,
        ExitStatus::Limit {
            limit: LimitKind::Memory,
            signal: None
        },
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("alloc failed"));
    assert!(out.usage.peak_memory_bytes <= 32 << 20);
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::Memory));
}

#[test]
fn raw_memory_grow_is_refused_at_the_limit() {
    let caps = caps().memory(ByteSize::mib(8));
    let out = run(&Tool::wasm(wat_fixture("traps"), ["grow"]), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Memory), "{}", out.status);
}

#[test]
fn table_growth_counts_against_the_memory_limit() {
    // 1 MiB is 131072 elements: below the pool's per-table cap, so the budget decides.
    let caps = caps().memory(ByteSize::mib(1));
    let out = run(&Tool::wasm(wat_fixture("traps"), ["table-grow"]), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Memory), "{}", out.status);
}

#[test]
fn cpu_spin_ends_at_the_cpu_limit() {
    let mut caps = caps();
    caps.limits.cpu_time = std::time::Duration::from_millis(300);
    let out = run(&Tool::wasm(wat_fixture("traps"), ["spin"]), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Cpu), "{}", out.status);
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::Cpu));
}

#[test]
fn cpu_spin_ends_at_the_wall_limit() {
    let caps = caps().timeout(std::time::Duration::from_millis(300));
    let out = run_probe(&["spin"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    assert!(out.timed_out());
    assert_eq!(out.cli_exit_code(), 124);
}

#[test]
fn blocking_sleep_is_interrupted_by_the_deadline() {
    let caps = caps().timeout(std::time::Duration::from_millis(300));
    let out = run_probe(&["sleep", "600"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
}

#[test]
fn disk_fill_stops_at_the_disk_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    caps.limits.disk = ByteSize::mib(1);
    let out = run_probe(&["fill", "/out/big", "10000000"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::Disk), "{}", stdout(&out));
    assert!(stdout(&out).contains("No space left"), "{}", stdout(&out));
    let size = std::fs::metadata(dir.path().join("big"))
        .expect("file")
        .len();
    assert!(size <= 1 << 20, "wrote {size} bytes past a 1 MiB quota");
}

#[test]
fn file_size_limit_refuses_growth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    caps.limits.file_size = ByteSize::kib(100);
    let out = run_probe(&["fill", "/out/f", "1000000"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::FileSize), "{}", stdout(&out));
    assert!(std::fs::metadata(dir.path().join("f")).expect("f").len() <= 100 << 10);
    // Extending a file with truncate is metered too.
    let out = run_probe(&["extend", "/out/f", "100000000"], &caps);
    assert!(stdout(&out).starts_with("ERR"), "{}", stdout(&out));
    assert!(std::fs::metadata(dir.path().join("f")).expect("f").len() <= 100 << 10);
}

/// Round 3: links, directories and empty files take disk blocks without a byte written;
/// each entry a run creates counts against the disk limit, so a flood of them stops there.
#[test]
fn a_symlink_directory_or_empty_file_flood_stops_at_the_disk_limit() {
    for kind in ["symlink", "mkdir", "touch"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
        caps.limits.disk = ByteSize::kib(400);
        let out = run_probe(&["flood", kind, "/out", "100000"], &caps);
        assert_eq!(
            out.limit(),
            Some(LimitKind::Disk),
            "{kind}: {}",
            stdout(&out)
        );
        let made = std::fs::read_dir(dir.path()).expect("read_dir").count() as u64;
        assert!(
            made * 4096 <= 400 << 10,
            "{kind}: {made} entries made under a 400 KiB limit"
        );
    }
}

#[test]
fn disk_quota_counts_every_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut caps = caps().mount(dir.path(), "/out", Access::ReadWrite);
    caps.limits.disk = ByteSize::kib(200);
    for name in ["a", "b"] {
        let out = run_probe(&["fill", &format!("/out/{name}"), "150000"], &caps);
        assert!(
            out.success(),
            "each run has its own quota: {}",
            stdout(&out)
        );
    }
    // Within one run, two files share the quota.
    let out = run_probe(&["fill", "/out/c", "250000"], &caps);
    assert_eq!(out.limit(), Some(LimitKind::Disk));
}

// ---- E: persistence ------------------------------------------------------------------

#[test]
fn pooled_instance_never_sees_previous_memory() {
    let probe = probe();
    for _ in 0..20 {
        let planted = run(&Tool::wasm(&probe, ["plant"]), &caps());
        assert_eq!(stdout(&planted), "OK planted\n");
        let peek = run(&Tool::wasm(&probe, ["peek"]), &caps());
        assert_eq!(
            stdout(&peek),
            "OK clean\n",
            "a run saw a previous run's memory"
        );
    }
    assert!(run_probe(&["exit", "0"], &caps())
        .receipt
        .has(Capability::Memory, "pooling allocator"));
}

// ---- I: host environment -------------------------------------------------------------

#[test]
fn host_environment_is_not_inherited() {
    // The test process has HOME, PATH and CARGO_* set; none may reach the module.
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some() || std::env::var_os("PATH").is_some());
    let out = run_probe(&["env"], &caps());
    assert_eq!(stdout(&out), "", "host env leaked");
    let out = run_probe(&["env"], &caps().env("ONLY", "this"));
    assert_eq!(stdout(&out), "ONLY=this\n");
}

// ---- J: engine invariants ------------------------------------------------------------

fn trap(mode: &str) -> sandbox_core::RunOutput {
    run(&Tool::wasm(wat_fixture("traps"), [mode]), &caps())
}

#[test]
fn out_of_bounds_access_traps() {
    assert_eq!(
        trap("oob").status,
        ExitStatus::Trapped {
            trap: TrapKind::MemoryOutOfBounds
        }
    );
}

#[test]
fn deep_recursion_traps_as_stack_overflow() {
    let out = trap("recurse");
    assert_eq!(
        out.status,
        ExitStatus::Trapped {
            trap: TrapKind::StackOverflow
        }
    );
    assert_eq!(out.cli_exit_code(), 134);
}

#[test]
fn unreachable_division_by_zero_and_null_calls_trap() {
    assert_eq!(trap("unreachable").trap(), Some(TrapKind::Unreachable));
    assert_eq!(trap("div0").trap(), Some(TrapKind::Arithmetic));
    assert_eq!(trap("null-call").trap(), Some(TrapKind::BadIndirectCall));
}

#[test]
fn c_abort_is_a_trap_not_a_host_crash() {
    let out = run_probe(&["abort"], &caps());
    assert_eq!(out.trap(), Some(TrapKind::Unreachable));
    // The backend keeps working after every kind of fault.
    assert_eq!(stdout(&run_probe(&["echo", "alive"], &caps())), "alive\n");
}

#[test]
fn probe_fixture_is_built_from_c_in_repo() {
    let path = probe();
    assert!(Path::new(&path).is_file());
}

#[test]
fn descriptor_flood_stops_at_the_open_files_limit() {
    let l = layout();
    let mut caps = caps().mount(&l.granted, "/data", Access::ReadOnly);
    caps.limits.open_files = 32;
    let out = run_probe(&["openmany", "/data/ok.txt", "10000"], &caps);
    assert_eq!(
        out.limit(),
        Some(LimitKind::OpenFiles),
        "{}: {}",
        out.status,
        stdout(&out)
    );
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::OpenFiles));
    // Within the limit it works.
    let out = run_probe(&["openmany", "/data/ok.txt", "8"], &caps);
    assert_eq!(stdout(&out), "OK openmany 8\n");
}

// ---- L, E2: grants redirected by planted symlinks; host-executed files ----------------

#[test]
fn preopen_does_not_follow_a_symlink_planted_by_an_earlier_run() {
    let l = layout();
    // Run 1 may write the granted directory: it plants `src` pointing at the secret's
    // directory (a dangling link inside its own preopen, which WASI allows).
    let caps_rw = caps().mount(&l.granted, "/data", Access::ReadWrite);
    let planted = run_probe(&["symlink", "../outside", "/data/src"], &caps_rw);
    assert_eq!(stdout(&planted), "OK symlink\n");
    let src = l.granted.join("src");
    assert!(std::fs::symlink_metadata(&src)
        .expect("planted")
        .file_type()
        .is_symlink());
    // Run 2 is granted only `src`: refused before anything runs, naming the link.
    let caps_ro = caps().mount(&src, "/src", Access::ReadOnly);
    let err = backend()
        .run_caps(
            &Tool::wasm(probe(), ["read", "/src/secret.txt"]),
            &caps_ro,
            &RunContext::default(),
        )
        .expect_err("planted symlink");
    assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} is a symlink", src.display())),
        "{err}"
    );
    assert!(!err.to_string().contains("TOP-SECRET"));
    assert_canary_intact(&l);
}

#[test]
fn preopen_follows_symlinks_only_when_asked_and_receipt_shows_resolved_path() {
    let l = layout();
    let links = tempfile::tempdir().expect("tempdir");
    let link = links.path().join("current");
    std::os::unix::fs::symlink(&l.granted, &link).expect("symlink");
    let mount =
        sandbox_core::Mount::new(link.clone(), "/data".into(), Access::ReadOnly).follow_symlinks();
    let out = run_probe(&["read", "/data/ok.txt"], &caps().with_mount(mount));
    assert_eq!(stdout(&out), "OK read fine\n");
    let fs = out
        .receipt
        .enforced
        .iter()
        .find(|e| e.mechanism == "WASI preopens")
        .expect("preopens");
    let granted = std::fs::canonicalize(&l.granted).expect("canonical");
    assert!(
        fs.detail.contains(&format!(
            "/data={} (symlinks followed from {})",
            granted.display(),
            link.display()
        )),
        "{}",
        fs.detail
    );
}

/// A granted directory holding a git hook.
fn repo(l: &Layout) -> std::path::PathBuf {
    let hooks = l.granted.join(".git/hooks");
    std::fs::create_dir_all(&hooks).expect("mkdir");
    std::fs::write(hooks.join("pre-commit"), "#!/bin/sh\necho original\n").expect("hook");
    hooks.join("pre-commit")
}

#[test]
fn git_hook_in_writable_preopen_is_refused_when_strict_and_a_gap_otherwise() {
    // Preopens cannot keep a path beneath them read-only: fail closed.
    let l = layout();
    let hook = repo(&l);
    let caps = caps().mount(&l.granted, "/data", Access::ReadWrite);
    let tool = Tool::wasm(probe(), ["write", "/data/.git/hooks/pre-commit", "evil"]);
    let err = backend()
        .run_caps(&tool, &caps, &RunContext::default())
        .expect_err("strict");
    assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable, "{err}");
    assert!(err.to_string().contains(".git/hooks"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&hook).expect("hook"),
        "#!/bin/sh\necho original\n",
        "nothing ran"
    );
    // Best effort runs, and says what it could not protect.
    let out = backend()
        .run_caps(
            &Tool::wasm(probe(), ["read", "/data/ok.txt"]),
            &caps,
            &best_effort(),
        )
        .expect("best effort");
    assert!(
        out.receipt
            .gaps
            .iter()
            .any(|g| g.capability == Capability::Fs && g.reason.contains(".git/hooks")),
        "{}",
        out.receipt
    );
    // Read-only grants need no protection.
    let ro = common::caps().mount(&l.granted, "/data", Access::ReadOnly);
    assert_refused(&run(&tool, &ro), "write to a read-only preopen");
}

#[test]
fn host_executed_protection_can_be_opted_out() {
    let l = layout();
    let hook = repo(&l);
    let caps = caps()
        .mount(&l.granted, "/data", Access::ReadWrite)
        .allow_host_executed_writes();
    let out = run_probe(&["write", "/data/.git/hooks/pre-commit", "edited"], &caps);
    assert_eq!(stdout(&out), "OK write\n");
    assert_eq!(std::fs::read_to_string(&hook).expect("hook"), "edited");
    assert!(
        out.receipt
            .gaps
            .iter()
            .any(|g| g.capability == Capability::Fs && g.reason.contains("by request")),
        "{}",
        out.receipt
    );
}
