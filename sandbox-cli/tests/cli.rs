//! The CLI contract of DESIGN.md: arguments, exit codes, `--json`, `doctor`, streamed
//! `--stdin`, and output neutralised on a terminal unless `--raw-output`.
//! Needs `strata-helper` next to the `strata` binary (built by `cargo test --workspace`),
//! and `script` from util-linux for the terminal tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    let exe = env!("CARGO_BIN_EXE_strata");
    let helper = std::path::Path::new(exe).with_file_name("strata-helper");
    assert!(
        helper.exists(),
        "{} is missing: build the workspace binaries (cargo build --workspace --bins)",
        helper.display()
    );
    exe
}

fn strata(args: &[&str]) -> Output {
    Command::new(exe())
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
fn egress_budget_flags_run_and_without_an_allowlist_the_receipt_has_no_network() {
    let out = strata(&[
        "run",
        "--json",
        "--egress-bytes",
        "1M",
        "--egress-connections",
        "4",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(value["receipt"].is_object(), "{value}");
    assert!(value["receipt"].get("network").is_none(), "{value}");
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
            "run", "--agent", "../x", "--rw", &rw, "--", "sh", "-c", &touch,
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
        vec![
            "run",
            "--egress-bytes",
            "lots",
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

/// `strata` with only `vars` in its environment.
/// The microVM guest `scripts/build-vm-guest.sh` builds for this clone, named to the CLI
/// at run time (its compiled-in fallback is the directory of the clone it was built in).
fn guest_dir(repo: &Path) -> PathBuf {
    std::env::var_os("STRATA_VM_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".ci/cache/vm"))
}

fn strata_with_env(args: &[&str], vars: &[(&str, &str)]) -> Output {
    Command::new(exe())
        .args(args)
        .env_clear()
        .envs(vars.iter().copied())
        .output()
        .expect("run strata")
}

#[test]
fn bad_secret_flags_exit_2_naming_the_problem_and_run_nothing() {
    let value = "s3cr3t-never-printed";
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let touch = format!("touch {}", flag.display());
    let rw = marker.path().display().to_string();
    let allow = "allow:api.example.com:443";
    for (secret, net, vars, expected) in [
        // No `@`: not NAME@HOSTS.
        ("TOKEN", allow, vec![("TOKEN", value)], "expected NAME@HOST"),
        ("@api.example.com", allow, vec![], "expected NAME@HOST"),
        // The value comes from strata's own environment; here it is not set.
        (
            "TOKEN@api.example.com",
            allow,
            vec![],
            "set the environment variable TOKEN",
        ),
        // Secrets are sent by the egress proxy: no allowlist, no secrets.
        (
            "TOKEN@api.example.com",
            "none",
            vec![("TOKEN", value)],
            "secrets need a network allowlist",
        ),
        (
            "TOKEN@api.example.com",
            "host",
            vec![("TOKEN", value)],
            "secrets need a network allowlist",
        ),
        // A value that would break out of its header line.
        (
            "TOKEN@api.example.com",
            allow,
            vec![("TOKEN", "v\r\nX-Injected: 1")],
            "no CR, LF",
        ),
        (
            "TOKEN@192.0.2.7",
            "allow:192.0.2.7:443",
            vec![("TOKEN", value)],
            "bind secrets to host names",
        ),
    ] {
        let args = [
            "run", "--secret", secret, "--net", net, "--rw", &rw, "--", "sh", "-c", &touch,
        ];
        let out = strata_with_env(&args, &vars);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(err.starts_with("strata: "), "{err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains(value) && !err.contains("X-Injected"), "{err}");
        assert!(!flag.exists(), "{args:?} ran the tool");
    }
}

#[test]
fn secret_flag_gives_the_tool_a_placeholder_and_the_receipt_names_it() {
    let value = "s3cr3t-never-printed";
    let out = strata_with_env(
        &[
            "run",
            "--json",
            "--backend",
            "process",
            "--net",
            "allow:api.example.com:443",
            "--secret",
            "TOKEN@api.example.com,*.example.org",
            "--",
            "sh",
            "-c",
            "echo \"$TOKEN\"",
        ],
        &[("TOKEN", value)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains(value),
        "the value reached the tool or the output: {stdout}"
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let lines: Vec<&str> = json["stdout"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .collect();
    assert!(lines[0].starts_with("strata-secret-"), "{json}");
    let enforced = json["receipt"]["enforced"].as_array().expect("enforced");
    assert!(
        enforced
            .iter()
            .any(|e| e["mechanism"] == "secrets at egress"
                && e["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("TOKEN:")),
        "{enforced:?}"
    );
}

#[test]
fn unavailable_backend_is_refused_with_125() {
    // The microvm guest has no JavaScript runtime: refused before anything boots.
    let out = strata(&[
        "run",
        "--backend",
        "microvm",
        "--script",
        "javascript",
        "--",
        "console.log(1)",
    ]);
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

#[test]
fn agent_runs_as_its_own_host_uid_and_the_receipt_says_so() {
    let out = strata(&["run", "--json", "--agent", "cli-agent", "--", "true"]);
    // As root (CI); an unprivileged run naming an agent is refused (process_identity tests).
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let identity = &json["receipt"]["identity"];
    assert_eq!(identity["agent"], "cli-agent", "{json}");
    assert_eq!(
        identity["source"], "agent",
        "run as root (.ci/run does): {json}"
    );
    assert_ne!(identity["host_uid"], 0, "{json}");
}

/// A generous outer guard for runs that end by their own 1 s timeout.
const GUARD_SECS: u64 = 60;

/// Waits for `pid` and returns its exit code and the peak resident set (KiB) of it and its
/// reaped descendants.
fn wait_with_peak_rss(pid: u32) -> (Option<i32>, i64) {
    let mut status = 0;
    // SAFETY: rusage is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers; `pid` is our child, not yet waited for.
    let ret = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(
        ret,
        pid as libc::pid_t,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, usage.ru_maxrss)
}

#[test]
fn stdin_stream_from_endless_producer_times_out_with_bounded_memory() {
    let mut yes = Command::new("yes")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn yes");
    let input = yes.stdout.take().expect("yes stdout");
    let start = Instant::now();
    // `timeout` is the outer guard; it reports a guard kill as 137 after GUARD_SECS.
    #[allow(
        clippy::zombie_processes,
        reason = "reaped by wait4, for its resource usage"
    )]
    let child = Command::new("timeout")
        .args(["-s", "KILL", &GUARD_SECS.to_string(), exe()])
        .args(["run", "--backend", "process", "--stdin", "--timeout", "1"])
        .args(["--", "sleep", "100"])
        .env_clear()
        .stdin(input)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strata");
    let (code, peak_kib) = wait_with_peak_rss(child.id());
    let elapsed = start.elapsed();
    let _ = yes.kill();
    let _ = yes.wait();
    eprintln!(
        "strata with an endless producer: exit {code:?} after {elapsed:?}, peak RSS {peak_kib} KiB"
    );
    assert!(
        elapsed < Duration::from_secs(GUARD_SECS),
        "the guard had to kill it"
    );
    assert_eq!(code, Some(124));
    assert!(
        peak_kib < 64 * 1024,
        "strata (or its helper) grew to {peak_kib} KiB reading an endless stdin"
    );
}

#[test]
fn stdin_stream_reaches_the_tool_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&data, &bytes).expect("write data");
    let expected = Command::new("sha256sum")
        .arg(&data)
        .output()
        .expect("host sha256sum");
    let expected = text(&expected.stdout);
    let expected = expected.split_whitespace().next().expect("digest");
    // Through a pipe, as from a producer program.
    let mut cat = Command::new("cat")
        .arg(&data)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn cat");
    let input = cat.stdout.take().expect("cat stdout");
    let out = Command::new(exe())
        .args(["run", "--backend", "process", "--stdin", "--", "sha256sum"])
        .env_clear()
        .stdin(input)
        .output()
        .expect("run strata");
    let _ = cat.wait();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).split_whitespace().next(), Some(expected));
    // From a file redirect, and byte-exact through wc.
    let out = Command::new(exe())
        .args(["run", "--backend", "process", "--stdin", "--", "wc", "-c"])
        .env_clear()
        .stdin(std::fs::File::open(&data).expect("open"))
        .output()
        .expect("run strata");
    assert_eq!(text(&out.stdout).trim(), bytes.len().to_string());
}

#[test]
fn without_stdin_flag_the_tool_reads_nothing() {
    let out = Command::new(exe())
        .args(["run", "--backend", "process", "--", "wc", "-c"])
        .env_clear()
        .stdin(std::fs::File::open("/etc/hostname").expect("open"))
        .output()
        .expect("run strata");
    assert_eq!(text(&out.stdout).trim(), "0");
}

fn shell_quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// Runs strata with a pseudo-terminal as its stdin, stdout and stderr (script(1) from
/// util-linux) and returns what reached the terminal.
fn strata_on_a_terminal(args: &[&str]) -> Vec<u8> {
    let command: Vec<String> = std::iter::once(exe())
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect();
    let out = Command::new("script")
        .args(["-qec", &command.join(" "), "/dev/null"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the terminal tests need script(1) from util-linux (apt-get install bsdutils): {e}"
            )
        });
    assert!(out.status.success(), "script failed: {}", text(&out.stderr));
    out.stdout
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

const OSC52: &str = r"a\033]52;c;cm0gLXJmIH4=\007b";

#[test]
fn osc52_clipboard_write_is_neutralised_on_a_terminal() {
    let screen = strata_on_a_terminal(&["run", "--backend", "process", "--", "printf", OSC52]);
    assert!(
        !contains(&screen, b"\x1b]52"),
        "raw OSC 52 reached the terminal: {screen:?}"
    );
    assert!(
        contains(&screen, br"a\x1b]52;c;cm0gLXJmIH4=\x07b"),
        "{}",
        text(&screen)
    );
    // The same on stderr.
    let code = format!("printf '{OSC52}' >&2");
    let screen = strata_on_a_terminal(&["run", "--backend", "process", "--", "sh", "-c", &code]);
    assert!(
        !contains(&screen, b"\x1b]52"),
        "raw OSC 52 on stderr: {screen:?}"
    );
    assert!(contains(&screen, br"\x1b]52;c;"), "{}", text(&screen));
}

#[test]
fn title_change_is_neutralised_on_a_terminal() {
    let screen = strata_on_a_terminal(&[
        "run",
        "--backend",
        "process",
        "--",
        "printf",
        r"\033]0;pwned\007\033]2;pwned\033\\\033[2J\033[H",
    ]);
    assert!(
        !screen.contains(&0x1b),
        "raw ESC reached the terminal: {screen:?}"
    );
    assert!(
        !screen.contains(&0x07),
        "raw BEL reached the terminal: {screen:?}"
    );
    assert!(
        contains(&screen, br"\x1b]0;pwned\x07\x1b]2;pwned\x1b\\x1b[2J\x1b[H"),
        "{}",
        text(&screen)
    );
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
fn sgr_colours_pass_on_a_terminal() {
    let screen = strata_on_a_terminal(&[
        "run",
        "--backend",
        "process",
        "--",
        "printf",
        r"\033[1;31mred\033[0m plain",
    ]);
    assert!(
        contains(&screen, b"\x1b[1;31mred\x1b[0m plain"),
        "{}",
        text(&screen)
    );
}

#[test]
fn raw_output_passes_control_sequences() {
    let screen = strata_on_a_terminal(&[
        "run",
        "--backend",
        "process",
        "--raw-output",
        "--",
        "printf",
        OSC52,
    ]);
    assert!(
        contains(&screen, b"a\x1b]52;c;cm0gLXJmIH4=\x07b"),
        "{}",
        text(&screen)
    );
}

#[test]
fn output_to_a_pipe_is_unchanged() {
    let out = strata(&["run", "--backend", "process", "--", "printf", OSC52]);
    assert_eq!(out.stdout, b"a\x1b]52;c;cm0gLXJmIH4=\x07b");
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

#[test]
fn caps_file_and_result_file_carry_a_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let caps = dir.path().join("caps.json");
    let result = dir.path().join("result.json");
    std::fs::write(
        &caps,
        r#"{"env": {"GREETING": "hi"}, "limits": {"timeout_ms": 5000}}"#,
    )
    .expect("caps");
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--caps",
        caps.to_str().expect("utf-8"),
        "--result-file",
        result.to_str().expect("utf-8"),
        "--",
        "/bin/sh",
        "-c",
        "echo $GREETING; exit 4",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).expect("result")).expect("json");
    assert_eq!(value["exit_code"], 4);
    assert_eq!(value["receipt"]["backend"], "process");
    assert!(value.get("stdout").is_none(), "the output is not repeated");

    // A caps flag next to --caps is refused; a bad caps file names the problem, in the
    // result file too, and nothing runs.
    let out = strata(&[
        "run",
        "--caps",
        caps.to_str().expect("utf-8"),
        "--env",
        "A=b",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(&caps, r#"{"limits": {"timeout": 5}}"#).expect("caps");
    let out = strata(&[
        "run",
        "--caps",
        caps.to_str().expect("utf-8"),
        "--result-file",
        result.to_str().expect("utf-8"),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).expect("result")).expect("json");
    assert_eq!(value["error"]["kind"], "invalid_request", "{value}");
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("timeout"),
        "{value}"
    );
}

#[test]
fn microvm_runs_python_and_an_image_from_the_cli() {
    let repo =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("..");
    for script in ["scripts/build-vm-guest.sh", "scripts/build-test-images.sh"] {
        let built = Command::new(repo.join(script)).output().expect(script);
        assert!(built.status.success(), "{script}: {}", text(&built.stderr));
    }
    let guest = guest_dir(&repo);
    let path = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
        ("STRATA_VM_GUEST_DIR", guest.to_str().expect("utf-8")),
    ];
    let out = strata_with_env(
        &[
            "run",
            "--backend",
            "microvm",
            "--",
            "python3",
            "-c",
            "print(1)",
        ],
        &path,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "1\n");
    let image = repo.join(".ci/cache/images/busybox-oci");
    let out = strata_with_env(
        &[
            "run",
            "--backend",
            "microvm",
            "--image",
            image.to_str().expect("utf-8"),
            "--json",
            "--",
            "/bin/sh",
            "-c",
            "echo from-image",
        ],
        &path,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(value["stdout"], "from-image\n", "{value}");
    assert_eq!(
        value["receipt"]["layers"],
        serde_json::json!(["microvm", "container"])
    );
}

#[test]
fn audit_log_records_runs_and_refusals_and_verify_names_a_tampered_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("audit.jsonl");
    let log_arg = log.to_str().expect("utf-8");
    for command in [["/bin/true"], ["/bin/false"]] {
        strata(&[
            "run",
            "--backend",
            "process",
            "--audit",
            log_arg,
            "--",
            command[0],
        ]);
    }
    // A refused request is recorded too (before anything runs).
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--audit",
        log_arg,
        "--ro",
        "/nonexistent-strata-audit-path",
        "--",
        "/bin/true",
    ]);
    assert_ne!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&log).expect("log");
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.contains("\"kind\":\"refusal\""), "{text}");
    let out = strata(&["audit", "verify", log_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));
    assert!(
        text_of(&out).starts_with("ok: 3 records"),
        "{}",
        text_of(&out)
    );

    // Tamper with the second record: verify fails naming line 2, and run refuses to append.
    let tampered = text.replacen("/bin/false", "/bin/fals3", 1);
    assert_ne!(tampered, text);
    std::fs::write(&log, &tampered).expect("tamper");
    let out = strata(&["audit", "verify", log_arg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text_of(&out).contains("line 2"), "{}", text_of(&out));
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--audit",
        log_arg,
        "--",
        "/bin/true",
    ]);
    assert_ne!(out.status.code(), Some(0), "appended to a tampered log");
    assert_eq!(std::fs::read_to_string(&log).expect("log"), tampered);
}

fn text_of(out: &Output) -> String {
    format!("{}{}", text(&out.stdout), text(&out.stderr))
}

#[test]
fn tier_refuses_beyond_it_and_an_approver_program_decides_with_the_request_on_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    let ws_arg = ws.to_str().expect("utf-8");
    let request = dir.path().join("request.json");
    let grant = dir.path().join("grant.sh");
    std::fs::write(
        &grant,
        format!(
            "#!/bin/sh\ncat > {}\necho '{{\"runs\": 1}}'\n",
            request.display()
        ),
    )
    .expect("approver");
    let deny = dir.path().join("deny.sh");
    std::fs::write(&deny, "#!/bin/sh\necho 'no writes today' >&2\nexit 3\n").expect("approver");
    for script in [&grant, &deny] {
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(script, mode).expect("chmod");
    }
    let write = format!("echo ok > {ws_arg}/out");
    // Without an approver: refused naming the tier and the capability; nothing ran.
    let out = strata(&[
        "run", "--tier", "low", "--rw", ws_arg, "--", "/bin/sh", "-c", &write,
    ]);
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(err.contains("tier low") && err.contains("write:"), "{err}");
    assert!(!ws.join("out").exists());
    // A refusing approver: its reason reaches the caller.
    let out = strata(&[
        "run",
        "--tier",
        "low",
        "--rw",
        ws_arg,
        "--approver",
        deny.to_str().expect("utf-8"),
        "--",
        "/bin/sh",
        "-c",
        &write,
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("no writes today"),
        "{}",
        text(&out.stderr)
    );
    assert!(!ws.join("out").exists());
    // A granting approver sees the request as JSON; the receipt names tier and grant.
    let out = strata(&[
        "run",
        "--tier",
        "low",
        "--rw",
        ws_arg,
        "--approver",
        grant.to_str().expect("utf-8"),
        "--json",
        "--",
        "/bin/sh",
        "-c",
        &write,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(ws.join("out").exists());
    let asked: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&request).expect("request")).expect("json");
    assert_eq!(asked["tier"], "low");
    assert!(asked["needs"][0]["capability"]
        .as_str()
        .is_some_and(|c| c.starts_with("write:")));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(result["receipt"]["policy"]["tier"], "low");
    assert_eq!(result["receipt"]["policy"]["elevations"][0]["id"], 1);
}

#[test]
fn declared_risk_is_routed_and_a_weaker_fixed_backend_is_refused() {
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--risk",
        "untrusted",
        "--",
        "/bin/true",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("risk untrusted"),
        "{}",
        text(&out.stderr)
    );
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--risk",
        "untrusted",
        "--allow-weaker",
        "--json",
        "--",
        "/bin/true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(result["receipt"]["policy"]["route"]["backend"], "process");
    let out = strata(&["run", "--risk", "reckless", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// `strata run --approve-interactive` on a pseudo-terminal whose keyboard types `answer`.
fn interactive_approval(dir: &Path, answer: &str) -> (Option<i32>, String) {
    use std::io::{Read, Write};
    let ws = dir.to_str().expect("utf-8");
    let write = format!("echo ok > {ws}/out");
    let args = [
        "run",
        "--tier",
        "low",
        "--rw",
        ws,
        "--approve-interactive",
        "--",
        "/bin/sh",
        "-c",
        &write,
    ];
    let command: Vec<String> = std::iter::once(exe())
        .chain(args.iter().copied())
        .map(shell_quote)
        .collect();
    let mut child = Command::new("script")
        .args(["-qec", &command.join(" "), "/dev/null"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the terminal tests need script(1) from util-linux");
    let mut keyboard = child.stdin.take().expect("stdin");
    keyboard.write_all(answer.as_bytes()).expect("type");
    let mut screen = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        let _ = screen.read_to_string(&mut seen);
        seen
    });
    let status = child.wait().expect("wait");
    drop(keyboard);
    (status.code(), reader.join().expect("reader"))
}

#[test]
fn approve_interactive_asks_on_the_terminal_and_only_yes_grants() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, screen) = interactive_approval(dir.path(), "n\n");
    assert_ne!(code, Some(0), "{screen}");
    assert!(screen.contains("asks to run /bin/sh with:"), "{screen}");
    assert!(screen.contains("write:"), "{screen}");
    assert!(screen.contains("refused on the terminal"), "{screen}");
    assert!(!dir.path().join("out").exists());
    let (code, screen) = interactive_approval(dir.path(), "y\n");
    assert_eq!(code, Some(0), "{screen}");
    assert!(dir.path().join("out").exists(), "{screen}");
}

#[test]
fn profile_gives_caps_tier_and_backend_and_bad_profiles_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data");
    std::fs::write(data.join("x"), "from the profile\n").expect("x");
    let profile = dir.path().join("p.toml");
    std::fs::write(
        &profile,
        format!(
            "backend = \"process\"\ntier = \"low\"\n[caps]\nmounts = [{{ host = \"{0}\", guest = \"{0}\", access = \"ro\" }}]\nlimits = {{ timeout_ms = 5000 }}\n",
            data.display()
        ),
    )
    .expect("profile");
    let p = profile.to_str().expect("utf-8");
    let x = data.join("x");
    let out = strata(&[
        "run",
        "--profile",
        p,
        "--json",
        "--",
        "cat",
        x.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(result["stdout"], "from the profile\n");
    assert_eq!(result["receipt"]["policy"]["tier"], "low");
    assert_eq!(result["receipt"]["backend"], "process");
    // Caps flags are refused with a profile; a profile that does not match the schema is
    // refused naming where.
    let out = strata(&["run", "--profile", p, "--ro", "/etc", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::write(&profile, "[caps]\nlimits = { timeout_ms = \"soon\" }\n").expect("profile");
    let out = strata(&["run", "--profile", p, "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("caps/limits/timeout_ms"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn low_tier_refuses_a_followed_symlink_into_etc_and_allows_one_into_tmp() {
    // Under /tmp itself, the only host paths the low tier grants (whatever TMPDIR says).
    let dir = tempfile::Builder::new()
        .prefix("strata-tier-follow")
        .tempdir_in("/tmp")
        .expect("tempdir in /tmp");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink("/etc", &link).expect("symlink");
    let link_arg = link.to_str().expect("utf-8");
    let hostname = format!("{link_arg}/hostname");
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--tier",
        "low",
        "--ro-follow",
        link_arg,
        "--",
        "cat",
        &hostname,
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text_of(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains("tier low") && err.contains("read:/etc"),
        "refused for where the link leads: {err}"
    );
    assert!(err.contains(&format!("{link_arg} -> /etc")), "{err}");
    assert!(out.stdout.is_empty(), "nothing ran");

    // A link that stays within /tmp is allowed; the receipt names where it led.
    let real = dir.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    std::fs::write(real.join("f.txt"), "inside the tier").expect("write");
    let ok = dir.path().join("ok");
    std::os::unix::fs::symlink(&real, &ok).expect("symlink");
    let ok_arg = ok.to_str().expect("utf-8");
    let out = strata(&[
        "run",
        "--backend",
        "process",
        "--tier",
        "low",
        "--json",
        "--ro-follow",
        ok_arg,
        "--",
        "cat",
        &format!("{ok_arg}/f.txt"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(value["stdout"], "inside the tier");
    let followed = &value["receipt"]["policy"]["followed"][0];
    assert_eq!(followed["requested"], ok_arg);
    assert_eq!(followed["resolved"], real.to_str().expect("utf-8"));
}

/// An approver program that saves the request it gets on stdin to `saved` and refuses.
fn saving_approver(dir: &Path, saved: &Path) -> std::path::PathBuf {
    let program = dir.join("save-and-refuse.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\ncat > {}\necho 'looked only' >&2\nexit 3\n",
            saved.display()
        ),
    )
    .expect("approver");
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&program, mode).expect("chmod");
    program
}

#[test]
fn an_approver_program_gets_the_whole_argv_script_and_caps_on_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    let ws_arg = ws.to_str().expect("utf-8");
    let saved = dir.path().join("request.json");
    let approver = saving_approver(dir.path(), &saved);
    let approver_arg = approver.to_str().expect("utf-8");
    let write = format!("echo pwned > {ws_arg}/out");
    let out = strata(&[
        "run",
        "--tier",
        "low",
        "--rw",
        ws_arg,
        "--env",
        "MODE=x",
        "--approver",
        approver_arg,
        "--",
        "/bin/sh",
        "-c",
        &write,
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text_of(&out));
    assert!(text(&out.stderr).contains("looked only"));
    let asked: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved).expect("request")).expect("json");
    assert_eq!(asked["tool"], "/bin/sh");
    assert_eq!(asked["argv"], serde_json::json!(["/bin/sh", "-c", write]));
    assert_eq!(asked["caps"]["mounts"][0]["host"], ws_arg);
    assert_eq!(asked["caps"]["mounts"][0]["access"], "rw");
    assert_eq!(asked["caps"]["env"]["MODE"], "x");
    assert!(!ws.join("out").exists());

    let source = "import os\nos.system('echo pwned')\n";
    std::fs::remove_file(&saved).expect("rm");
    let out = strata(&[
        "run",
        "--tier",
        "low",
        "--rw",
        ws_arg,
        "--approver",
        approver_arg,
        "--script",
        "python",
        "--",
        source,
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text_of(&out));
    let asked: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved).expect("request")).expect("json");
    assert_eq!(asked["script"]["language"], "python");
    assert_eq!(asked["script"]["source"], source);
    assert_eq!(asked["script"]["bytes"], source.len());
    assert!(asked.get("argv").is_none(), "{asked}");
}

#[test]
fn an_escape_sequence_in_a_requested_path_reaches_the_terminal_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory whose name clears the screen and retitles the window when printed raw.
    let evil = dir.path().join("\u{1b}[2J\u{1b}]0;ok\u{7}ws");
    std::fs::create_dir(&evil).expect("mkdir");
    let (code, screen) = interactive_approval(&evil, "n\n");
    assert_ne!(code, Some(0), "{screen}");
    assert!(screen.contains("asks to run /bin/sh with:"), "{screen}");
    assert!(screen.contains("\\x1b[2J\\x1b]0;ok\\x07ws"), "{screen}");
    assert!(
        screen.contains("command line: \"/bin/sh\" \"-c\""),
        "{screen}"
    );
    assert!(
        !screen.contains('\u{1b}') && !screen.contains('\u{7}'),
        "no raw escape reaches the terminal: {screen:?}"
    );
    assert!(screen.contains("refused on the terminal"), "{screen}");
}

/// The `strata-vm-*` run directories whose owner file names process `pid`.
fn vm_dirs_of(tmp: &Path, pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("strata-vm-"))
                && std::fs::read_to_string(p.join("owner"))
                    .is_ok_and(|o| o.split_whitespace().next() == Some(&pid.to_string()))
        })
        .collect()
}

/// Round 3: a run stopped from outside (Ctrl-C, a supervisor's SIGTERM) left a microVM's
/// `strata-vm-*` directory behind. SIGINT and SIGTERM cancel the run, everything it made is
/// removed, and the CLI exits 128 + the signal, on the process and microVM backends.
#[test]
fn a_stopped_cli_cancels_its_run_and_leaves_no_run_directory() {
    let repo =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("..");
    let built = Command::new(repo.join("scripts/build-vm-guest.sh"))
        .output()
        .expect("build-vm-guest.sh");
    assert!(built.status.success(), "{}", text(&built.stderr));
    let tmp = tempfile::tempdir().expect("tempdir");
    for (backend, signal) in [("process", libc::SIGINT), ("microvm", libc::SIGTERM)] {
        let mut child = Command::new(exe())
            .args(["run", "--backend", backend, "--timeout", "120", "--"])
            .args(["/bin/sh", "-c", "echo started; sleep 100"])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("TMPDIR", tmp.path())
            .env("STRATA_VM_GUEST_DIR", guest_dir(&repo))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn strata");
        let mut out = child.stdout.take().expect("stdout");
        let mut first = [0u8; 8];
        std::io::Read::read_exact(&mut out, &mut first).expect("the tool started");
        assert_eq!(&first, b"started\n");
        let pid = child.id();
        if backend == "microvm" {
            assert!(
                !vm_dirs_of(tmp.path(), pid).is_empty(),
                "no run directory seen"
            );
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "{backend}: the CLI did not stop");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err);
        assert_eq!(status.code(), Some(128 + signal), "{backend}: {err}");
        assert!(err.contains("cancelled"), "{backend}: {err}");
        assert!(
            vm_dirs_of(tmp.path(), pid).is_empty(),
            "{backend}: left behind: {:?}",
            vm_dirs_of(tmp.path(), pid)
        );
    }
}
