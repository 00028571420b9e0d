//! Live sandboxes through the CLI (`strata start | exec | ps | logs | kill | stop | ls`) on
//! the process backend, named after what they stop: processes that outlive their sandbox,
//! another user's access, runaway execs. Each test has its own state directory
//! (`STRATA_STATE_DIR`), so tests never see each other's sandboxes.
//! Needs `strata-helper` and `strata-live` next to `strata` (built by `cargo test
//! --workspace`); the tests that switch users need root (`.ci/run` runs as root).

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{exe, marker, nix_root, processes_with, text, wait_until, Live};

#[test]
fn start_exec_ps_logs_kill_and_stop_work_on_the_process_backend() {
    let live = Live::new();
    let id = live.start(&[]);
    assert!(id.starts_with("sb-"), "{id}");
    let out = live.strata(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    // State kept between execs: files written by one are read by the next.
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "echo kept > /tmp/note"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--", "cat", "/tmp/note"]);
    assert_eq!(text(&out.stdout), "kept\n");
    // Detached: prints the pid that ps shows as the last word.
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        "echo started; sleep 1000",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = text(&out.stdout).trim().to_string();
    assert!(pid.parse::<i32>().is_ok(), "{pid}");
    let out = live.strata(&["ps", &id]);
    let line = text(&out.stdout)
        .lines()
        .find(|l| l.ends_with(&format!(" {pid}")))
        .unwrap_or_else(|| panic!("pid {pid} in ps: {}", text(&out.stdout)))
        .to_string();
    assert!(line.starts_with("running"), "{line}");
    wait_until(
        "the detached output is kept",
        Duration::from_secs(10),
        || text(&live.strata(&["logs", &id, &pid]).stdout) == "started\n",
    );
    let out = live.strata(&["kill", &id, &pid, "--signal", "KILL"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["logs", &id, &pid, "--follow"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["ps", &id, "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ps json");
    let entry = list
        .as_array()
        .expect("array")
        .iter()
        .find(|p| p["pid"].as_i64().map(|n| n.to_string()).as_deref() == Some(pid.as_str()))
        .expect("listed")
        .clone();
    assert_eq!(entry["state"], "exited", "{entry}");
    assert_eq!(entry["signal"], libc::SIGKILL, "{entry}");
    assert_eq!(entry["argv"][0], "sh", "{entry}");
    assert_eq!(live.ids(), vec![id.clone()]);
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(live.ids().is_empty());
    assert!(
        live.sandbox_dirs().is_empty(),
        "the sandbox's state directory is removed"
    );
    let out = live.strata(&["exec", &id, "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a stopped sandbox: {}",
        text(&out.stderr)
    );
}

#[test]
fn start_json_names_the_id_and_backend_and_the_receipt_holds_for_every_exec() {
    let live = Live::new();
    let out = live.strata(&["start", "--json", "--name", "json-test"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(started["backend"], "process", "{started}");
    let id = started["id"].as_str().expect("id").to_string();
    let enforced = started["receipt"]["enforced"].to_string();
    for mechanism in [
        "\"namespace\"",
        "\"landlock\"",
        "\"seccomp\"",
        "output ring",
    ] {
        assert!(enforced.contains(mechanism), "{mechanism}: {enforced}");
    }
    // The name works wherever the id does.
    let out = live.strata(&["exec", "json-test", "--json", "--", "echo", "hi"]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("exec json");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert_eq!(result["stdout"], "hi\n", "{result}");
    let again = live.strata(&["start", "--name", "json-test"]);
    assert_eq!(
        again.status.code(),
        Some(2),
        "a name in use: {}",
        text(&again.stderr)
    );
    assert!(live.strata(&["stop", &id]).status.success());
}

#[test]
fn bad_arguments_are_refused_with_exit_2_and_nothing_starts() {
    let live = Live::new();
    for args in [
        vec!["start", "--", "echo", "no program for start"],
        vec!["start", "--ttl", "0"],
        vec!["start", "--backend", "wasm"],
        vec!["start", "--name", "../escape"],
        vec!["exec", "sb-0000000000000000", "--", "true"],
        vec!["exec", "../x", "--", "true"],
    ] {
        let out = live.strata(&args);
        assert!(
            matches!(out.status.code(), Some(2) | Some(125)),
            "{args:?}: {:?} {}",
            out.status.code(),
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).is_empty(), "{args:?} says why");
    }
    let wasm = live.strata(&["start", "--backend", "wasm"]);
    let why = text(&wasm.stderr);
    assert!(
        why.contains("process"),
        "names the backends that can: {why}"
    );
    assert!(live.ids().is_empty(), "nothing started");
}

#[test]
fn an_exec_timeout_kills_its_process_group_and_exits_124() {
    let live = Live::new();
    let id = live.start(&[]);
    let mark = marker();
    let started = Instant::now();
    let out = live.strata(&[
        "exec",
        &id,
        "--timeout",
        "1",
        "--",
        "sh",
        "-c",
        &format!("sleep {mark} & sleep {mark}"),
    ]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(60));
    wait_until(
        "the exec's children are gone",
        Duration::from_secs(10),
        || processes_with(&mark).is_empty(),
    );
    assert!(live.strata(&["stop", &id]).status.success());
}

#[test]
fn a_detached_process_does_not_survive_stop_even_after_setsid() {
    let live = Live::new();
    let id = live.start(&[]);
    let mark = marker();
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        &format!("setsid sleep {mark} & sleep {mark}"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_until("both sleeps run", Duration::from_secs(10), || {
        processes_with(&mark).len() >= 2
    });
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // `stop` returns once everything is gone.
    assert!(
        processes_with(&mark).is_empty(),
        "{:?}",
        processes_with(&mark)
    );
    assert!(live.ids().is_empty());
}

#[test]
fn a_detached_process_does_not_survive_the_ttl_or_the_idle_ttl() {
    for flag in ["--ttl", "--idle-ttl"] {
        let live = Live::new();
        let id = live.start(&[flag, "2"]);
        let mark = marker();
        let out = live.strata(&["exec", &id, "--detach", "--", "sleep", &mark]);
        assert!(out.status.success(), "{flag}: {}", text(&out.stderr));
        assert!(!processes_with(&mark).is_empty());
        wait_until(
            "the sandbox ends by its clock",
            Duration::from_secs(30),
            || live.ids().is_empty(),
        );
        wait_until("its processes are gone", Duration::from_secs(10), || {
            processes_with(&mark).is_empty()
        });
        wait_until("its state is gone", Duration::from_secs(10), || {
            live.sandbox_dirs().is_empty()
        });
    }
}

#[test]
fn limits_cover_the_whole_sandbox_across_execs() {
    let live = Live::new();
    let id = live.start(&["--pids", "16"]);
    let mark = marker();
    let mut started = 0;
    for _ in 0..8 {
        let out = live.strata(&["exec", &id, "--detach", "--", "sleep", &mark]);
        if out.status.success() {
            started += 1;
        }
    }
    assert_eq!(started, 8, "eight execs fit under 16 processes");
    // Eight more processes in one exec do not: the limit is the sandbox's, not the exec's.
    let out = live.strata(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "n=0; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 100 & n=$((n+1)); done; wait",
    ]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "forks beyond the sandbox's pids limit fail"
    );
    assert!(live.strata(&["stop", &id]).status.success());
    assert!(processes_with(&mark).is_empty());
}

#[test]
fn an_output_flood_is_kept_bounded_and_the_exec_still_ends() {
    let live = Live::new();
    let id = live.start(&[]);
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        "head -c 20000000 /dev/zero",
    ]);
    let pid = text(&out.stdout).trim().to_string();
    let out = live.strata(&["logs", &id, &pid, "--follow"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kept = live.strata(&["logs", &id, &pid]);
    assert!(
        kept.stdout.len() <= 1 << 20,
        "the ring keeps at most 1 MiB, kept {}",
        kept.stdout.len()
    );
    assert!(!kept.stdout.is_empty());
    assert!(live.strata(&["stop", &id]).status.success());
}

/// As root: another user's `exec`, `ls` and raw socket connections get nothing.
#[test]
fn another_local_user_cannot_exec_list_or_read_output() {
    if !nix_root() {
        eprintln!("SKIPPED another_local_user_cannot_exec_list_or_read_output: needs root");
        return;
    }
    let live = Live::new();
    let id = live.start(&[]);
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        "echo private; sleep 1000",
    ]);
    let pid = text(&out.stdout).trim().to_string();
    let bins = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        bins.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let cli = bins.path().join("strata");
    std::fs::copy(exe(), &cli).expect("copy");
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&cli)
            .args(args)
            .env("STRATA_STATE_DIR", live.state_dir())
            .output()
            .expect("setpriv")
    };
    for args in [
        vec!["exec", id.as_str(), "--", "true"],
        vec!["logs", id.as_str(), pid.as_str()],
        vec!["stop", id.as_str()],
        vec!["ls"],
    ] {
        let out = as_nobody(&args);
        assert!(
            !out.status.success(),
            "{args:?} as nobody: {}",
            text(&out.stdout)
        );
        assert!(!text(&out.stdout).contains("private"), "{args:?}");
        assert!(!text(&out.stdout).contains(&id), "{args:?}");
    }
    // Even with the directories opened up, the socket refuses other users' connections
    // (SO_PEERCRED): nobody gets no answer at all.
    let dir = live.state_dir().join(&id);
    for path in [live.state_dir(), dir.as_path()] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    std::fs::set_permissions(
        dir.join("control.sock"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let probe = format!(
        "import socket\ns=socket.socket(socket.AF_UNIX)\ns.connect('{}')\ntry:\n  s.sendall(b'{{\"op\":\"logs\",\"pid\":{pid},\"follow\":false}}\\n')\n  print(repr(s.recv(65536)))\nexcept OSError:\n  print(repr(b''))",
        dir.join("control.sock").display()
    );
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            &probe,
        ])
        .output()
        .expect("setpriv");
    assert_eq!(
        text(&out.stdout).trim(),
        "b''",
        "stderr: {}",
        text(&out.stderr)
    );
    // The owner still can (with the state directory private again).
    std::fs::set_permissions(
        live.state_dir(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let out = live.strata(&["logs", &id, &pid]);
    assert_eq!(text(&out.stdout), "private\n");
    assert!(live.strata(&["stop", &id]).status.success());
}

/// As root: the same flow for an unprivileged embedder (uid 65534, no cgroup of its own, so
/// best effort): start, exec, a detached process, stop; nothing survives.
#[test]
fn an_unprivileged_caller_gets_a_live_sandbox_that_ends_completely() {
    if !nix_root() {
        eprintln!("SKIPPED an_unprivileged_caller_gets_a_live_sandbox_that_ends_completely: needs root to switch users");
        return;
    }
    let bins = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        bins.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    for name in ["strata", "strata-helper", "strata-live"] {
        std::fs::copy(exe().with_file_name(name), bins.path().join(name)).expect("copy");
    }
    let state = bins.path().join("state");
    std::fs::create_dir(&state).expect("state");
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).expect("chown");
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bins.path().join("strata"))
            .args(args)
            .env("STRATA_STATE_DIR", &state)
            .env("STRATA_HELPER", bins.path().join("strata-helper"))
            .env("STRATA_LIVE", bins.path().join("strata-live"))
            .current_dir("/")
            .output()
            .expect("setpriv")
    };
    let out = as_nobody(&["start", "--best-effort"]);
    assert!(out.status.success(), "start: {}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    // A failed assertion below must not leave the sandbox running (nobody's supervisor
    // outlives the test's temporary directory otherwise): stop it on the way out.
    struct StopOnDrop<F: Fn()>(F);
    impl<F: Fn()> Drop for StopOnDrop<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    let _stop = StopOnDrop(|| {
        let _ = as_nobody(&["stop", &id]);
    });
    let out = as_nobody(&["exec", &id, "--", "id", "-u"]);
    assert!(out.status.success(), "exec: {}", text(&out.stderr));
    let mark = marker();
    let out = as_nobody(&["exec", &id, "--detach", "--", "sleep", &mark]);
    assert!(out.status.success(), "detach: {}", text(&out.stderr));
    wait_until("the detached process runs", Duration::from_secs(10), || {
        !processes_with(&mark).is_empty()
    });
    // Without a cgroup it pauses with stop signals: its output stands still until resumed.
    let busy_mark = marker();
    let out = as_nobody(&["exec", &id, "--detach", "--", "sh", "-c", BUSY, &busy_mark]);
    assert!(out.status.success(), "busy: {}", text(&out.stderr));
    let busy = text(&out.stdout).trim().to_string();
    let logs = || text(&as_nobody(&["logs", &id, &busy]).stdout);
    wait_until("the loop prints", Duration::from_secs(20), || {
        !logs().is_empty()
    });
    let out = as_nobody(&["pause", &id]);
    assert!(out.status.success(), "pause: {}", text(&out.stderr));
    std::thread::sleep(Duration::from_millis(300));
    let before = logs();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(logs(), before, "no output while paused");
    let out = as_nobody(&["resume", &id]);
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    wait_until("the loop prints again", Duration::from_secs(20), || {
        logs().len() > before.len()
    });
    let out = as_nobody(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    assert!(processes_with(&mark).is_empty(), "nothing survives stop");
    assert!(
        processes_with(&busy_mark).is_empty(),
        "nothing survives stop"
    );
    let left: Vec<_> = std::fs::read_dir(&state)
        .expect("state")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sb-"))
        .collect();
    assert!(left.is_empty(), "no sandbox state left");
}

/// The `ls --json` entry of sandbox `id`.
fn listed(live: &Live, id: &str) -> serde_json::Value {
    let out = live.strata(&["ls", "--json"]);
    assert!(out.status.success(), "ls: {}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ls json");
    list.as_array()
        .expect("array")
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} listed: {list}"))
        .clone()
}

/// A shell loop that burns CPU and prints a counter now and then; `mark` finds it.
const BUSY: &str = "i=0; while :; do i=$((i+1)); [ $((i % 5000)) = 0 ] && echo $i; done";

/// As root the sandbox has a cgroup with a freezer: a paused sandbox uses no CPU at all (the
/// cgroup's usage stands still), writes no output, refuses new execs, still shows its
/// logs, and resumes with its files and processes intact; stopping a paused sandbox leaves
/// nothing.
#[test]
fn a_paused_sandbox_uses_no_cpu_and_resumes_intact() {
    let live = Live::new();
    let id = live.start(&[]);
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "echo intact > /tmp/state"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mark = marker();
    let out = live.strata(&["exec", &id, "--detach", "--", "sh", "-c", BUSY, &mark]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = text(&out.stdout).trim().to_string();
    let logs = |live: &Live| text(&live.strata(&["logs", &id, &pid]).stdout);
    wait_until("the loop prints", Duration::from_secs(20), || {
        !logs(&live).is_empty()
    });
    let out = live.strata(&["pause", &id]);
    assert!(out.status.success(), "pause: {}", text(&out.stderr));
    let entry = listed(&live, &id);
    assert_eq!(entry["state"], "paused", "{entry}");
    let frozen = nix_root();
    std::thread::sleep(Duration::from_millis(300));
    let (cpu_before, logs_before) = (listed(&live, &id)["cpu_us"].as_u64(), logs(&live));
    std::thread::sleep(Duration::from_secs(1));
    let (cpu_after, logs_after) = (listed(&live, &id)["cpu_us"].as_u64(), logs(&live));
    assert_eq!(logs_before, logs_after, "no output while paused");
    if frozen {
        let (before, after) = (cpu_before.expect("cpu_us"), cpu_after.expect("cpu_us"));
        assert!(
            after - before < 10_000,
            "a frozen sandbox used {} µs of CPU in a second",
            after - before
        );
    }
    let out = live.strata(&["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "exec while paused");
    assert!(
        text(&out.stderr).contains("paused"),
        "{}",
        text(&out.stderr)
    );
    let out = live.strata(&["resume", &id]);
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    assert_eq!(listed(&live, &id)["state"], "running");
    wait_until("the loop prints again", Duration::from_secs(20), || {
        logs(&live).len() > logs_after.len()
    });
    if frozen {
        let cpu = listed(&live, &id)["cpu_us"].as_u64().expect("cpu_us");
        assert!(cpu > cpu_after.expect("cpu_us"), "it runs again");
    }
    let out = live.strata(&["exec", &id, "--", "cat", "/tmp/state"]);
    assert_eq!(text(&out.stdout), "intact\n", "{}", text(&out.stderr));
    // Stopping a paused sandbox ends it completely too.
    assert!(live.strata(&["pause", &id]).status.success());
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    assert!(processes_with(&mark).is_empty(), "nothing survives stop");
    assert!(live.sandbox_dirs().is_empty());
}

/// A one-connection-at-a-time TCP server inside the sandbox that answers `reply` on
/// `127.0.0.1:port`.
fn server(port: u16, reply: &str) -> String {
    format!(
        "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',{port}))\ns.listen(8)\nwhile True:\n  c,_=s.accept()\n  c.sendall(b'{reply}')\n  c.close()\n"
    )
}

/// Reads what the server at `address` sends, if it accepts.
fn fetch(address: &str) -> Option<String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// `--publish` with the default `--net none`: the host port reaches the one port inside
/// (not another server of the sandbox), the receipt and `ls` list it, the sandbox still
/// cannot reach the host (its egress is unchanged), and the host port closes with `stop`.
#[test]
fn a_published_port_reaches_only_that_port_and_opens_no_egress() {
    let live = Live::new();
    let out = live.strata(&["start", "--publish", "8000", "--json"]);
    assert!(out.status.success(), "start: {}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let id = started["id"].as_str().expect("id").to_string();
    let ports = started["ports"].as_array().expect("ports").clone();
    assert_eq!(ports.len(), 1, "{started}");
    assert_eq!(ports[0]["guest_port"], 8000);
    assert_eq!(ports[0]["host_ip"], "127.0.0.1");
    let host_port = ports[0]["host_port"].as_u64().expect("host port");
    let receipt = started["receipt"].to_string();
    assert!(
        receipt.contains(&format!(
            "127.0.0.1:{host_port} on the host reaches 127.0.0.1:8000"
        )),
        "{receipt}"
    );
    let address = format!("127.0.0.1:{host_port}");
    // Nothing listens inside yet: the connection is closed without an answer.
    assert_eq!(fetch(&address).unwrap_or_default(), "");
    for (port, reply) in [(8000, "published"), (8001, "private")] {
        let code = server(port, reply);
        let out = live.strata(&["exec", &id, "--detach", "--", "python3", "-c", &code]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    wait_until(
        "the published server answers",
        Duration::from_secs(30),
        || fetch(&address).as_deref() == Some("published"),
    );
    for _ in 0..5 {
        assert_eq!(fetch(&address).as_deref(), Some("published"));
    }
    assert_eq!(
        listed(&live, &id)["ports"].as_array().map(Vec::len),
        Some(1)
    );
    // The sandbox's own network is unchanged: from inside, the host's listener is not
    // there (its loopback is the sandbox's own).
    let probe = format!(
        "import socket,sys\ntry:\n  socket.create_connection(('127.0.0.1',{host_port}),timeout=3)\n  sys.exit(0)\nexcept OSError:\n  sys.exit(7)\n"
    );
    let out = live.strata(&["exec", &id, "--", "python3", "-c", &probe]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "the host port is closed with the sandbox"
    );
}

#[test]
fn a_bad_publish_flag_is_refused_and_nothing_starts() {
    let live = Live::new();
    for bad in ["0", "80:0", "host:1:2", "99999"] {
        let out = live.strata(&["start", "--publish", bad]);
        assert_eq!(out.status.code(), Some(2), "--publish {bad}");
        assert!(
            text(&out.stderr).contains("--publish"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(live.sandbox_dirs().is_empty());
}

/// `exec --tty`: the program runs on a terminal of the caller's size (24x80 when the caller
/// has none) and its exit code passes through; `--tty` with `--json` is refused.
#[test]
fn exec_tty_runs_on_a_terminal_and_passes_the_exit_code() {
    let live = Live::new();
    let id = live.start(&[]);
    let out = live.strata(&[
        "exec",
        &id,
        "--tty",
        "--",
        "sh",
        "-c",
        "test -t 0 && test -t 1 && stty size; exit 5",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("24 80"), "{}", text(&out.stdout));
    let out = live.strata(&["exec", &id, "--tty", "--json", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(live.strata(&["stop", &id]).status.success());
}

/// `strata cp` both ways: a host tree goes in (into a directory by its name), comes back
/// out byte for byte, a copy out never overwrites the host, and a symlink the tool planted
/// refuses the copy out before anything is written.
#[test]
fn strata_cp_copies_trees_both_ways_and_refuses_a_planted_symlink() {
    let live = Live::new();
    let id = live.start(&[]);
    let host = tempfile::tempdir().expect("tempdir");
    let tree = host.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    std::fs::write(tree.join("a.txt"), "alpha").expect("write");
    std::fs::write(tree.join("sub/b.bin"), [0u8, 1, 2, 255]).expect("write");
    let into = format!("{id}:/tmp");
    let out = live.strata(&["cp", tree.to_str().expect("utf-8"), &into]);
    assert!(out.status.success(), "cp in: {}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--", "cat", "/tmp/tree/a.txt"]);
    assert_eq!(text(&out.stdout), "alpha");
    let back = host.path().join("back");
    let from = format!("{id}:/tmp/tree");
    let out = live.strata(&["cp", &from, back.to_str().expect("utf-8")]);
    assert!(out.status.success(), "cp out: {}", text(&out.stderr));
    assert_eq!(
        std::fs::read(back.join("sub/b.bin")).expect("read"),
        [0u8, 1, 2, 255]
    );
    // Into an existing host directory: under the entry's name; never over a file.
    let out = live.strata(&[
        "cp",
        &format!("{id}:/tmp/tree/a.txt"),
        back.to_str().expect("utf-8"),
    ]);
    assert!(
        !out.status.success(),
        "back/a.txt exists: nothing is overwritten"
    );
    assert_eq!(
        std::fs::read_to_string(back.join("a.txt")).expect("read"),
        "alpha"
    );
    let out = live.strata(&[
        "exec",
        &id,
        "--",
        "ln",
        "-s",
        "/etc/hostname",
        "/tmp/tree/sub/link",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let refused = host.path().join("refused");
    let out = live.strata(&["cp", &from, refused.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("symlink"),
        "{}",
        text(&out.stderr)
    );
    assert!(!refused.exists(), "nothing written");
    let out = live.strata(&["cp", "a", "b"]);
    assert_eq!(out.status.code(), Some(2), "host to host is refused");
    assert!(live.strata(&["stop", &id]).status.success());
}

#[test]
fn an_idle_sandbox_is_frozen_by_its_idle_pause_and_the_next_exec_resumes_it() {
    let live = Live::new();
    let out = live.strata(&["start", "--idle-pause", "1", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let id = started["id"].as_str().expect("id").to_string();
    assert!(
        started["receipt"].to_string().contains("idle pause"),
        "{started}"
    );
    let mark = marker();
    let out = live.strata(&["exec", &id, "--detach", "--", "sh", "-c", BUSY, &mark]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = text(&out.stdout).trim().to_string();
    // Listing (`ls`) and reading kept output (`logs`) neither keep it awake nor wake it.
    wait_until("the idle pause freezes it", Duration::from_secs(20), || {
        listed(&live, &id)["state"] == "paused"
    });
    let logs_before = text(&live.strata(&["logs", &id, &pid]).stdout);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(listed(&live, &id)["state"], "paused");
    assert_eq!(text(&live.strata(&["logs", &id, &pid]).stdout), logs_before);
    // An exec needs it running: it is resumed, and the loop goes on.
    let out = live.strata(&["exec", &id, "--", "echo", "awake"]);
    assert_eq!(text(&out.stdout), "awake\n", "{}", text(&out.stderr));
    wait_until("the loop prints again", Duration::from_secs(20), || {
        text(&live.strata(&["logs", &id, &pid]).stdout).len() > logs_before.len()
    });
    // A client's own pause is not undone by a request.
    wait_until("frozen again", Duration::from_secs(20), || {
        listed(&live, &id)["state"] == "paused"
    });
    assert!(live.strata(&["resume", &id]).status.success());
    assert!(live.strata(&["pause", &id]).status.success());
    let out = live.strata(&["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "a client's pause holds");
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(processes_with(&mark).is_empty());
}
