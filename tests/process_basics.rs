//! The process backend's core promises (issue: foundation), each checked from both sides:
//! what the tool inside reports, and what the host observes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use strata::{Caps, ErrorKind, LimitKind, Net, Tool};

#[test]
fn reads_a_read_only_mount_and_cannot_write_it() {
    let canary = Canary::new();
    let caps = Caps::new().read_only(canary.dir.path());
    let secret = canary.secret.display().to_string();
    let out = run(&Tool::command(["cat", &secret]), &caps);
    assert_eq!(ok_stdout(&out), SECRET);
    let out = run(&sh(&format!("echo pwned > {secret}")), &caps);
    assert!(!out.success(), "write to a read-only mount must fail");
    assert!(
        stderr(&out).contains("Read-only file system"),
        "{}",
        stderr(&out)
    );
    assert!(canary.intact());
}

#[test]
fn cannot_read_host_file_outside_mounts_by_absolute_path() {
    let canary = Canary::new();
    let out = run(
        &Tool::command(["cat", &canary.secret.display().to_string()]),
        &Caps::new(),
    );
    assert!(!out.success());
    assert!(!stdout(&out).contains(SECRET));
    let out = run(&Tool::command(["cat", "/etc/shadow"]), &Caps::new());
    assert!(
        !out.success() && out.stdout.is_empty(),
        "/etc/shadow must be invisible"
    );
}

#[test]
fn cannot_escape_a_mount_with_dotdot() {
    let canary = Canary::new();
    let inner = canary.dir.path().join("inner");
    std::fs::create_dir(&inner).expect("mkdir");
    let caps = Caps::new().read_only(&inner);
    let path = format!("{}/../secret.txt", inner.display());
    let out = run(&Tool::command(["cat", &path]), &caps);
    assert!(
        !out.success() && !stdout(&out).contains(SECRET),
        "{}",
        stdout(&out)
    );
}

#[test]
fn symlink_planted_in_writable_mount_does_not_reach_host_file() {
    let canary = Canary::new();
    let work = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(&canary.secret, work.path().join("link")).expect("symlink");
    let caps = Caps::new().read_write(work.path());
    let link = work.path().join("link").display().to_string();
    let out = run(&Tool::command(["cat", &link]), &caps);
    assert!(!out.success() && !stdout(&out).contains(SECRET));
    // The tool plants its own symlink to the host path and follows it: still nothing.
    let out = run(
        &sh(&format!(
            "ln -s {} {}/mine && cat {}/mine",
            canary.secret.display(),
            work.path().display(),
            work.path().display()
        )),
        &caps,
    );
    assert!(!stdout(&out).contains(SECRET));
    assert!(canary.intact());
}

#[test]
fn cannot_connect_to_host_loopback_listener() {
    let listener = Listener::start();
    let code = format!(
        "import socket\ns=socket.socket()\ns.settimeout(2)\ntry:\n  s.connect(('127.0.0.1',{}))\n  print('CONNECTED', s.recv(10))\nexcept OSError as e:\n  print('refused', e.errno)",
        listener.port
    );
    let out = run(&py(&code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(text.starts_with("refused"), "{text}");
    assert!(!listener.was_hit(), "the host listener saw a connection");
}

#[test]
fn cannot_see_or_signal_host_processes() {
    let mut sleeper = std::process::Command::new("sleep")
        .arg("77.5")
        .spawn()
        .expect("spawn sleep");
    let pid = sleeper.id();
    let code = format!(
        "import os,signal\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\ntry:\n  os.kill({pid}, signal.SIGKILL); print('KILLED')\nexcept OSError as e:\n  print('denied', e.errno)"
    );
    let out = run(&py(&code), &Caps::new());
    let text = ok_stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        !first.contains(&pid.to_string()),
        "host pid visible: {first}"
    );
    assert!(text.contains("denied 3"), "expected ESRCH: {text}");
    assert!(
        sleeper.try_wait().expect("wait").is_none(),
        "host process must survive"
    );
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn host_environment_secret_is_invisible() {
    std::env::set_var("STRATA_TEST_HOST_SECRET", SECRET);
    let out = run(&Tool::command(["env"]), &Caps::new().env("GIVEN", "yes"));
    let text = ok_stdout(&out);
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.contains("GIVEN=yes"));
    let keys: Vec<&str> = text.lines().filter_map(|l| l.split('=').next()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        ["GIVEN", "HOME", "LANG", "PATH"],
        "only declared and documented variables"
    );
}

#[test]
fn background_child_is_gone_after_the_run() {
    let marker = "1000.4242";
    let out = run(
        &sh(&format!(
            "sleep {marker} & disown 2>/dev/null; echo started"
        )),
        &Caps::new(),
    );
    assert_eq!(ok_stdout(&out).trim(), "started");
    assert!(
        eventually(Duration::from_secs(2), || processes_with(marker).is_empty()),
        "sandboxed background process survived: {:?}",
        processes_with(marker)
    );
}

#[test]
fn timeout_kills_a_busy_loop() {
    let start = Instant::now();
    let out = run(
        &sh("while :; do :; done"),
        &Caps::new().timeout(Duration::from_millis(500)),
    );
    assert!(out.timed_out(), "{}", out.status);
    assert_eq!(out.limit(), Some(LimitKind::Wall));
    assert_eq!(out.cli_exit_code(), 124);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "run must return after the timeout"
    );
}

#[test]
fn output_flood_is_capped_and_the_run_returns() {
    let mut caps = Caps::new();
    caps.limits.output = strata::ByteSize::kib(64);
    let out = run(&Tool::command(["yes"]), &caps);
    assert_eq!(out.stdout.len(), 64 * 1024);
    assert!(out.stdout_truncated);
    assert_eq!(out.limit(), Some(LimitKind::Output));
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.detail.contains("stdout cut")));
}

#[test]
fn receipt_names_the_mechanisms() {
    let out = run(&Tool::command(["true"]), &Caps::new());
    let r = &out.receipt;
    use strata::Capability as C;
    assert!(r.has(C::Fs, "landlock ABI"), "{r}");
    assert!(r.has(C::Fs, "mount namespace"));
    assert!(r.has(C::Net, "empty network namespace"));
    assert!(r.has(C::Syscalls, "seccomp"));
    assert!(r.has(C::Privileges, "user namespace"));
    assert!(r.gaps.is_empty(), "strict runs have no gaps: {r}");
    // The same, typed: the family of each mechanism, no names matched.
    use strata::Mechanism as M;
    for (capability, kind) in [
        (C::Fs, M::Landlock),
        (C::Fs, M::Namespace),
        (C::Fs, M::Mounts),
        (C::Net, M::Namespace),
        (C::Syscalls, M::Seccomp),
        (C::Fds, M::Descriptors),
        (C::Wall, M::Supervisor),
        (C::Output, M::Host),
        (C::Disk, M::Tmpfs),
        (C::FileSize, M::Rlimit),
    ] {
        assert!(
            r.has_kind(capability, kind),
            "{capability} by {kind:?}: {r}"
        );
    }
    if is_root() {
        assert!(r.has_kind(C::Memory, M::Cgroup), "{r}");
        assert!(r.has_kind(C::Pids, M::Cgroup), "{r}");
    }
    assert!(!r.has_kind(C::Net, M::Wasm));
}

#[test]
fn missing_mount_source_is_refused_and_nothing_runs() {
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let caps = Caps::new()
        .read_only("/definitely/not/here")
        .read_write(marker.path());
    let err = sandbox()
        .run(&sh(&format!("touch {}", flag.display())), &caps)
        .expect_err("must refuse");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    assert!(!flag.exists(), "nothing may run");
}

#[test]
fn unknown_program_is_an_exec_error() {
    let err = sandbox()
        .run(&Tool::command(["no-such-program-xyz"]), &Caps::new())
        .expect_err("exec");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("no-such-program-xyz"), "{err}");
}

#[test]
fn allowlist_rule_wildcarding_a_public_suffix_is_refused_before_anything_runs() {
    let rule = strata::NetRule {
        host: "*.co.uk".into(),
        port: Some(443),
    };
    let caps = Caps::new().net(Net::Allow(vec![rule]));
    let err = sandbox()
        .run(&Tool::command(["true"]), &caps)
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
}

#[test]
fn scripts_run_in_python_javascript_and_sh() {
    use strata::ScriptLanguage as L;
    for (language, source, expected) in [
        (L::Python, "print(6*7)", "42"),
        (L::Javascript, "console.log(6*7)", "42"),
        (L::Sh, "echo $((6*7))", "42"),
    ] {
        let out = run(&Tool::script(language, source), &Caps::new());
        assert_eq!(ok_stdout(&out).trim(), expected, "{language}");
    }
}

#[test]
fn stdin_is_delivered_and_large_stdin_does_not_deadlock() {
    let out = run(&Tool::command(["cat"]), &Caps::new().stdin("hello"));
    assert_eq!(ok_stdout(&out), "hello");
    let big = vec![b'x'; 3 << 20];
    let mut caps = Caps::new().stdin(big.clone());
    caps.limits.output = strata::ByteSize::mib(4);
    let out = run(&sh("cat; cat /dev/zero | head -c 100000 >&2"), &caps);
    assert!(out.success(), "{}", out.status);
    assert_eq!(out.stdout.len(), big.len());
    assert_eq!(out.stderr.len(), 100000);
}

#[test]
fn unprivileged_caller_gets_the_same_promises() {
    if !require_root("unprivileged_caller_gets_the_same_promises") {
        return;
    }
    let canary = Canary::new();
    let cli = cli();
    if !cli.exists() {
        panic!(
            "{} not built; run the workspace tests (cargo test --workspace)",
            cli.display()
        );
    }
    let listener = Listener::start();
    std::fs::set_permissions(
        canary.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::set_permissions(
        &canary.secret,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let script = format!(
        "import socket,os\nprint(open('{secret}').read())\ntry:\n  open('{secret}','w')\nexcept OSError as e: print('ro', e.errno)\ns=socket.socket()\ntry:\n  s.connect(('127.0.0.1',{port})); print('CONNECTED')\nexcept OSError as e: print('net', e.errno)\nprint('uid', os.getuid())",
        secret = canary.secret.display(),
        port = listener.port
    );
    // The checkout may sit under a directory only root can enter (a 0700 `mktemp -d`):
    // give the unprivileged caller its own copies of the CLI and the helper.
    let bins = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        bins.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let (cli_copy, helper_copy) = (
        bins.path().join("strata"),
        bins.path().join("strata-helper"),
    );
    std::fs::copy(&cli, &cli_copy).expect("copy cli");
    std::fs::copy(helper(), &helper_copy).expect("copy helper");
    let as_nobody = |extra: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&cli_copy)
            .arg("run")
            .args(extra)
            .args([
                "--ro",
                &canary.dir.path().display().to_string(),
                "--",
                PY,
                "-c",
                &script,
            ])
            .env("STRATA_HELPER", &helper_copy)
            .output()
            .expect("setpriv")
    };
    // No writable cgroup for uid 65534 here: the run's memory, pids and CPU limits cannot
    // be enforced, so the default (strict) run is refused before anything runs.
    let refused = as_nobody(&[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "refused: {err}");
    for named in ["memory", "pids", "cpu"] {
        assert!(err.contains(named), "{named}: {err}");
    }
    assert!(refused.stdout.is_empty(), "nothing ran");
    // Best effort runs, with every promise but those limits, which the receipt lists.
    let out = as_nobody(&["--best-effort", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout={} stderr={}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(json["exit_code"], 0, "{json}");
    let text = json["stdout"].as_str().expect("stdout").to_string();
    let receipt = &json["receipt"];
    for named in ["memory", "pids", "cpu"] {
        assert!(
            receipt["gaps"]
                .as_array()
                .expect("gaps")
                .iter()
                .any(|g| g["capability"] == named),
            "{named} gap: {receipt}"
        );
    }
    assert_eq!(receipt["identity"]["source"], "embedder", "{receipt}");
    assert_eq!(receipt["identity"]["host_uid"], 65534, "{receipt}");
    assert!(text.contains(SECRET), "{text}");
    assert!(text.contains("ro 30"), "read-only mount (EROFS): {text}");
    assert!(
        text.contains("net 111"),
        "only the sandbox's own loopback (ECONNREFUSED): {text}"
    );
    assert!(text.contains("uid 65534"), "{text}");
    assert!(!listener.was_hit());
    assert!(canary.intact());
}
