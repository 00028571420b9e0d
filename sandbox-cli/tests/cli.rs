//! The CLI contract of DESIGN.md: arguments, exit codes, `--json`, `doctor`.
//! Needs `strata-helper` next to the `strata` binary (built by `cargo test --workspace`).

use std::process::{Command, Output};

fn strata(args: &[&str]) -> Output {
    let exe = env!("CARGO_BIN_EXE_strata");
    let helper = std::path::Path::new(exe).with_file_name("strata-helper");
    assert!(
        helper.exists(),
        "{} is missing: build the workspace binaries (cargo build --workspace --bins)",
        helper.display()
    );
    Command::new(exe)
        .args(args)
        .env_clear()
        .output()
        .expect("run strata")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn read_only_grant_prints_the_file() {
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--ro",
        "/etc/hostname",
        "--",
        "cat",
        "/etc/hostname",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let host = std::fs::read_to_string("/etc/hostname").expect("hostname");
    assert_eq!(text(&out.stdout), host);
}

#[test]
fn ungranted_file_is_not_readable_and_the_tool_code_passes_through() {
    let out = strata(&["run", "--backend", "process", "--", "cat", "/etc/shadow"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("No such file"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn json_object_has_the_contract_keys_and_a_receipt() {
    let out = strata(&[
        "run",
        "--json",
        "--backend",
        "process",
        "--",
        "sh",
        "-c",
        "echo hi; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in [
        "exit_code",
        "signal",
        "timed_out",
        "limit",
        "stdout",
        "stderr",
        "stdout_truncated",
        "duration_ms",
        "receipt",
    ] {
        assert!(value.get(key).is_some(), "missing {key}: {value}");
    }
    assert_eq!(value["exit_code"], 3);
    assert_eq!(value["stdout"], "hi\n");
    let mechanisms: Vec<String> = value["receipt"]["enforced"]
        .as_array()
        .expect("enforced")
        .iter()
        .map(|e| e["mechanism"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        mechanisms.iter().any(|m| m.starts_with("landlock ABI")),
        "{mechanisms:?}"
    );
    assert!(
        mechanisms.iter().any(|m| m == "seccomp-bpf"),
        "{mechanisms:?}"
    );
    assert!(
        mechanisms.iter().any(|m| m == "empty network namespace"),
        "{mechanisms:?}"
    );
}

#[test]
fn timeout_exits_124_and_limit_kill_exits_137() {
    let out = strata(&["run", "--timeout", "0.3", "--", "sleep", "10"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    let out = strata(&["run", "--max-output", "1K", "--", "yes"]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 1024);
}

#[test]
fn script_mode_runs_source_code() {
    let out = strata(&["run", "--script", "python", "--", "print(6*7)"]);
    assert_eq!(text(&out.stdout), "42\n", "{}", text(&out.stderr));
    let out = strata(&["run", "--script", "sh", "--", "echo $((6*7))"]);
    assert_eq!(text(&out.stdout), "42\n");
}

#[test]
fn bad_arguments_exit_2_with_one_line_and_run_nothing() {
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let touch = format!("touch {}", flag.display());
    let rw = marker.path().display().to_string();
    for args in [
        vec![
            "run",
            "--backend",
            "nope",
            "--rw",
            &rw,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "run", "--memory", "lots", "--rw", &rw, "--", "sh", "-c", &touch,
        ],
        vec![
            "run",
            "--net",
            "everything",
            "--rw",
            &rw,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "run",
            "--ro",
            "relative/../path",
            "--rw",
            &rw,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "run",
            "--ro",
            "/does/not/exist",
            "--rw",
            &rw,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec![
            "run", "--env", "NOEQUALS", "--rw", &rw, "--", "sh", "-c", &touch,
        ],
        vec![
            "run",
            "--timeout",
            "-1",
            "--rw",
            &rw,
            "--",
            "sh",
            "-c",
            &touch,
        ],
        vec!["run", "--image", "x", "--rw", &rw, "--", "sh", "-c", &touch],
        vec!["run", "--script", "cobol", "--", "x"],
        vec!["run", "--frobnicate", "--", "true"],
        vec!["run"],
    ] {
        let out = strata(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(err.starts_with("strata: "), "{err}");
        assert!(!flag.exists(), "{args:?} ran the tool");
    }
}

#[test]
fn unavailable_backend_is_refused_with_125() {
    let out = strata(&["run", "--backend", "microvm", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("microvm"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn doctor_reports_every_backend() {
    let out = strata(&["doctor", "--json"]);
    assert!(out.status.success());
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let backends: Vec<&str> = value["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter_map(|b| b["backend"].as_str())
        .collect();
    assert_eq!(backends, ["process", "wasm", "container", "microvm"]);
    let human = strata(&["doctor"]);
    assert!(text(&human.stdout).contains("landlock"));
}

fn strata_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .current_dir(dir)
        .env_clear()
        .output()
        .expect("run strata")
}

#[test]
fn relative_grant_is_made_absolute_against_the_current_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("data")).expect("mkdir");
    std::fs::write(dir.path().join("data/f.txt"), "relative").expect("write");
    let abs = dir.path().join("data");
    let file = abs.join("f.txt").display().to_string();
    let out = strata_in(
        dir.path(),
        &[
            "run",
            "--backend",
            "process",
            "--json",
            "--ro",
            "./data/",
            "--",
            "cat",
            &file,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(value["stdout"], "relative");
    assert!(
        value["receipt"]
            .to_string()
            .contains(&format!("{abs}={abs}", abs = abs.display())),
        "{}",
        value["receipt"]
    );
    let out = strata_in(dir.path(), &["run", "--ro", "data/../..", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("'..'"), "{}", text(&out.stderr));
}

#[test]
fn planted_symlink_grant_exits_2_and_ro_follow_opts_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    std::fs::write(real.join("f.txt"), "through the link").expect("write");
    std::os::unix::fs::symlink("real", dir.path().join("src")).expect("symlink");
    let cat = dir.path().join("src/f.txt").display().to_string();
    let out = strata_in(
        dir.path(),
        &[
            "run",
            "--backend",
            "process",
            "--ro",
            "src",
            "--",
            "cat",
            &cat,
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("is a symlink") && err.contains("--ro-follow"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let out = strata_in(
        dir.path(),
        &[
            "run",
            "--backend",
            "process",
            "--json",
            "--ro-follow",
            "src",
            "--",
            "cat",
            &cat,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(value["stdout"], "through the link");
    assert!(
        value["receipt"]
            .to_string()
            .contains("symlinks followed from"),
        "{}",
        value["receipt"]
    );
}

#[test]
fn rw_grant_keeps_git_hooks_read_only_unless_allow_host_executed_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hooks = dir.path().join(".git/hooks");
    std::fs::create_dir_all(&hooks).expect("mkdir");
    std::fs::write(hooks.join("pre-commit"), "original\n").expect("hook");
    let write = format!("echo evil > {}/pre-commit", hooks.display());
    let out = strata_in(
        dir.path(),
        &[
            "run",
            "--backend",
            "process",
            "--rw",
            ".",
            "--",
            "sh",
            "-c",
            &write,
        ],
    );
    assert_ne!(out.status.code(), Some(0), "the write must fail");
    assert!(
        text(&out.stderr).contains("Read-only"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(hooks.join("pre-commit")).expect("hook"),
        "original\n"
    );
    let out = strata_in(
        dir.path(),
        &[
            "run",
            "--backend",
            "process",
            "--rw",
            ".",
            "--allow-host-executed-writes",
            "--",
            "sh",
            "-c",
            &write,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(hooks.join("pre-commit")).expect("hook"),
        "evil\n"
    );
}
