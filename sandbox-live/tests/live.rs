//! The library's live sandboxes on the process backend: owned sandboxes end with their
//! owner, processes keep their stdin and output between clients, and nothing is left.
//! Needs `strata-helper` (built with the workspace) and `strata-live` next to the test
//! binary's directory (cargo builds this crate's binary for its tests).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_core::Caps;
use sandbox_live::{ExecRequest, LiveSandbox, ProcessState, StartOptions, Stream};

fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps");
    deps.parent().expect("profile dir").to_path_buf()
}

/// A private (0700) state directory.
fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    dir
}

/// Sandbox directories left in `state`.
fn sandbox_dirs(state: &Path) -> usize {
    std::fs::read_dir(state)
        .expect("state")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sb-"))
        .count()
}

fn options(state: &Path) -> StartOptions {
    let bins = bin_dir();
    StartOptions {
        state_dir: Some(state.to_path_buf()),
        helper: Some(bins.join("strata-helper")),
        supervisor: Some(bins.join("strata-live")),
        ..StartOptions::default()
    }
}

fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .expect("proc")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            String::from_utf8_lossy(c)
                .replace('\0', " ")
                .contains(marker)
        })
        .count()
}

fn marker(tag: u32) -> String {
    format!("1000.{}{tag}", std::process::id())
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn argv(args: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: args.iter().map(|s| s.to_string()).collect(),
        ..ExecRequest::default()
    }
}

#[test]
fn an_owned_sandbox_ends_when_its_handle_drops_and_leaves_nothing() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let mark = marker(1);
    let pid = sandbox.spawn(argv(&["sleep", &mark])).expect("spawn");
    assert!(pid > 1, "{pid}");
    wait_until("the process runs", || processes_with(&mark) == 1);
    drop(sandbox);
    assert_eq!(processes_with(&mark), 0, "nothing survives its owner");
    assert_eq!(sandbox_dirs(state.path()), 0, "no state left");
}

#[test]
fn an_owned_sandbox_ends_when_its_owner_is_killed() {
    let state = state_dir();
    let bins = bin_dir();
    let request = serde_json::json!({
        "version": sandbox_live::protocol::PROTOCOL_VERSION,
        "caps": Caps::new(),
        "strictness": "strict",
        "backend": "process",
        "name": null,
        "ttl_s": null,
        "idle_ttl_s": null,
        "owned": true,
        "helper": bins.join("strata-helper"),
        "state_dir": state.path(),
    });
    // The owner: a process that starts the supervisor, prints its answer and sleeps. It is
    // killed with SIGKILL, so nothing of it says goodbye; its end of the pipe just closes.
    let owner_script = format!(
        "import subprocess,sys,time\np=subprocess.Popen(['{}','serve'],stdin=subprocess.PIPE,stdout=subprocess.PIPE)\np.stdin.write(sys.argv[1].encode()+b'\\n'); p.stdin.flush()\nsys.stdout.write(p.stdout.readline().decode()); sys.stdout.flush()\ntime.sleep(1000)",
        bins.join("strata-live").display()
    );
    let mut owner = Command::new("/usr/bin/python3")
        .args(["-c", &owner_script, &request.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("owner");
    // The reader stays open until the owner is killed: the owner must die by the kill,
    // not by writing to a closed pipe.
    let mut owner_out = std::io::BufReader::new(owner.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut owner_out, &mut line).expect("answer");
    let answer: serde_json::Value = serde_json::from_str(&line).expect("json answer");
    let id = answer["ok"]["id"].as_str().expect("started").to_string();
    let sandbox = LiveSandbox::attach_in(state.path(), &id).expect("attach");
    let mark = marker(2);
    sandbox.spawn(argv(&["sleep", &mark])).expect("spawn");
    wait_until("the process runs", || processes_with(&mark) == 1);
    owner.kill().expect("kill the owner");
    let _ = owner.wait();
    drop(owner_out);
    wait_until("the sandbox ends with its owner", || {
        processes_with(&mark) == 0
    });
    wait_until("its state is removed", || sandbox_dirs(state.path()) == 0);
}

#[test]
fn a_detached_process_keeps_its_stdin_and_output_for_any_client() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let mut request = argv(&["sh", "-c", "read line; echo \"got $line\"; cat >&2"]);
    request.stdin = true;
    let pid = sandbox.spawn(request).expect("spawn");
    // Another client (a second handle) writes and closes its stdin.
    let other = LiveSandbox::attach_in(state.path(), sandbox.id()).expect("attach");
    other.write_stdin(pid, b"hello\nrest").expect("write");
    other.close_stdin(pid).expect("close");
    let exit = other.wait(pid).expect("wait");
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let ended = sandbox
        .logs(pid, true, |stream, bytes| match stream {
            Stream::Stdout => out.extend_from_slice(bytes),
            Stream::Stderr => err.extend_from_slice(bytes),
        })
        .expect("logs");
    assert!(ended.is_some());
    assert_eq!(String::from_utf8_lossy(&out), "got hello\n");
    assert_eq!(String::from_utf8_lossy(&err), "rest");
    let listed = sandbox.ps().expect("ps");
    assert_eq!(listed[0].state, ProcessState::Exited);
    assert!(matches!(
        sandbox.write_stdin(pid, b"late"),
        Err(e) if e.kind() == sandbox_core::ErrorKind::InvalidRequest
    ));
    sandbox.stop().expect("stop");
}

#[test]
fn a_foreground_exec_streams_its_output_and_takes_stdin() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let mut seen = Vec::new();
    let input: Box<dyn std::io::Read + Send> = Box::new(std::io::Cursor::new(b"abc".to_vec()));
    let exit = sandbox
        .exec(argv(&["tr", "a-z", "A-Z"]), Some(input), |stream, bytes| {
            assert_eq!(stream, Stream::Stdout);
            seen.extend_from_slice(bytes);
        })
        .expect("exec");
    assert_eq!(exit.exit_code, Some(0));
    assert_eq!(seen, b"ABC");
    let missing = sandbox.exec(argv(&["no-such-program-here"]), None, |_, _| {});
    assert!(
        matches!(&missing, Err(sandbox_core::Error::Exec { program, .. }) if program == "no-such-program-here"),
        "{missing:?}"
    );
    let mut env_request = argv(&["sh", "-c", "echo $GREETING; pwd"]);
    env_request.env.insert("GREETING".into(), "hi".into());
    env_request.workdir = Some("/tmp".into());
    let mut out = Vec::new();
    sandbox
        .exec(env_request, None, |_, bytes| out.extend_from_slice(bytes))
        .expect("exec env");
    assert_eq!(String::from_utf8_lossy(&out), "hi\n/tmp\n");
    let mut bad = argv(&["true"]);
    bad.env.insert("BAD NAME".into(), "x".into());
    assert!(sandbox.exec(bad, None, |_, _| {}).is_err());
    let _ = std::io::stdout().flush();
    sandbox.stop().expect("stop");
}

/// Reads a terminal's kept output until it holds `wanted`; returns all of it.
fn terminal_shows(pty: &sandbox_live::Pty, wanted: &str) -> String {
    let mut seen = String::new();
    wait_until(&format!("the terminal shows {wanted:?}"), || {
        seen.clear();
        pty.output(false, |bytes| {
            seen.push_str(&String::from_utf8_lossy(bytes))
        })
        .expect("output");
        seen.contains(wanted)
    });
    seen
}

/// A shell on a terminal: it is interactive (its stdin is a terminal that is its
/// controlling one, so `^C` interrupts the foreground job and the shell goes on), it sees
/// the size it was given and a resize, and its exit code comes back.
#[test]
fn a_shell_on_a_terminal_takes_input_resizes_and_is_interrupted_by_ctrl_c() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let size = sandbox_live::TtySize { rows: 30, cols: 90 };
    let pty = sandbox.pty(argv(&["sh", "-i"]), size).expect("pty");
    pty.write(b"stty size; echo sum=$((6*7))\n").expect("type");
    terminal_shows(&pty, "30 90");
    terminal_shows(&pty, "sum=42");
    pty.resize(sandbox_live::TtySize {
        rows: 40,
        cols: 100,
    })
    .expect("resize");
    pty.write(b"stty size\n").expect("type");
    terminal_shows(&pty, "40 100");
    let mark = marker(7);
    pty.write(format!("sleep {mark}\n").as_bytes())
        .expect("type");
    wait_until("sleep runs", || processes_with(&mark) == 1);
    pty.write(b"\x03").expect("ctrl-c");
    wait_until("ctrl-c ends the foreground job", || {
        processes_with(&mark) == 0
    });
    pty.write(b"echo still=here\n").expect("type");
    terminal_shows(&pty, "still=here");
    pty.write(b"exit 3\n").expect("type");
    let exit = pty.wait().expect("wait");
    assert_eq!(exit.exit_code, Some(3), "{exit:?}");
    let refused = sandbox
        .pty(argv(&["true"]), sandbox_live::TtySize { rows: 0, cols: 80 })
        .expect_err("a zero-row terminal");
    assert_eq!(refused.kind(), sandbox_core::ErrorKind::InvalidRequest);
}

/// A tool on a terminal cannot push input into it with TIOCSTI (what would type commands
/// into a terminal someone else reads): seccomp refuses the ioctl.
#[test]
fn a_tool_on_a_terminal_cannot_inject_input_with_tiocsti() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let script = "import fcntl,termios\ntry:\n  fcntl.ioctl(0, termios.TIOCSTI, b'x')\n  print('injected')\nexcept OSError as e:\n  print('refused', e.errno)\n";
    let pty = sandbox
        .pty(
            argv(&["python3", "-c", script]),
            sandbox_live::TtySize { rows: 24, cols: 80 },
        )
        .expect("pty");
    let exit = pty.wait().expect("wait");
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    let shown = terminal_shows(&pty, "refused");
    assert!(!shown.contains("injected"), "{shown}");
}

fn run_ok(sandbox: &LiveSandbox, script: &str) -> String {
    let mut out = Vec::new();
    let exit = sandbox
        .exec(argv(&["sh", "-c", script]), None, |_, bytes| {
            out.extend_from_slice(bytes)
        })
        .expect("exec");
    let text = String::from_utf8_lossy(&out).into_owned();
    assert_eq!(exit.exit_code, Some(0), "{script}: {text}");
    text
}

/// File operations on a live sandbox's own mount tree: what the host writes the tool reads
/// and may change, and a symlink the tool planted is never followed (not to read, not to
/// write through, not on the way); a read-only mount stays read-only; they work while the
/// sandbox is paused.
#[test]
fn file_operations_never_follow_a_symlink_the_tool_planted() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    sandbox
        .write_file("/tmp/a/b.txt", b"from the host")
        .expect("write");
    assert_eq!(run_ok(&sandbox, "cat /tmp/a/b.txt"), "from the host");
    // The sandbox's user owns what the host made.
    run_ok(&sandbox, "echo ' and the tool' >> /tmp/a/b.txt");
    assert_eq!(
        sandbox.read_file("/tmp/a/b.txt").expect("read"),
        b"from the host and the tool\n"
    );
    let names: Vec<String> = sandbox
        .list_dir("/tmp/a")
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["b.txt".to_string()]);
    assert_eq!(sandbox.stat("/tmp/a/b.txt").expect("stat").size, 27);
    sandbox.mkdir("/tmp/x/y", true).expect("mkdir -p");
    sandbox
        .rename("/tmp/a/b.txt", "/tmp/x/y/c.txt")
        .expect("rename");
    assert_eq!(run_ok(&sandbox, "ls /tmp/x/y"), "c.txt\n");
    run_ok(
        &sandbox,
        "echo secret > /tmp/secret; ln -s /tmp/secret /tmp/link; ln -s /tmp /tmp/dirlink",
    );
    for path in ["/tmp/link", "/tmp/dirlink/secret"] {
        let err = sandbox.read_file(path).expect_err(path);
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{err}");
    }
    assert!(sandbox.write_file("/tmp/dirlink/new", b"x").is_err());
    sandbox
        .write_file("/tmp/link", b"replaced")
        .expect("write over the link");
    assert_eq!(
        run_ok(&sandbox, "cat /tmp/secret"),
        "secret\n",
        "not written through"
    );
    assert_eq!(
        sandbox.read_file("/tmp/link").expect("a file now"),
        b"replaced"
    );
    assert!(
        sandbox.write_file("/usr/strata-test", b"x").is_err(),
        "read-only mount"
    );
    assert!(sandbox.read_file("../etc/passwd").is_err());
    sandbox.pause().expect("pause");
    assert_eq!(
        sandbox.read_file("/tmp/secret").expect("read while paused"),
        b"secret\n"
    );
    sandbox.resume().expect("resume");
    sandbox.remove("/tmp/x").expect("remove");
    assert_eq!(
        run_ok(&sandbox, "ls /tmp/x 2>&1 || echo gone"),
        "ls: cannot access '/tmp/x': No such file or directory\ngone\n"
    );
}

/// A watch reports what a tool does under a directory, also in directories it makes.
#[test]
fn a_watch_reports_changes_a_tool_makes_below_a_directory() {
    let state = state_dir();
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    sandbox.mkdir("/tmp/w", false).expect("mkdir");
    let id = sandbox.id().to_string();
    let state_path = state.path().to_path_buf();
    let watcher = std::thread::spawn(move || {
        let other = LiveSandbox::attach_in(&state_path, &id).expect("attach");
        let mut seen = Vec::new();
        other
            .watch("/tmp/w", true, |change| {
                seen.push((change.kind, change.path.clone()));
                !(change.kind == sandbox_live::watch::ChangeKind::Remove
                    && change.path == "/tmp/w/f")
            })
            .expect("watch");
        seen
    });
    std::thread::sleep(Duration::from_millis(300));
    run_ok(
        &sandbox,
        "echo x > /tmp/w/f; mkdir /tmp/w/d; sleep 0.3; echo y > /tmp/w/d/g; rm /tmp/w/f",
    );
    let seen = watcher.join().expect("watcher");
    use sandbox_live::watch::ChangeKind::{Create, Remove, Write};
    for wanted in [
        (Create, "/tmp/w/f"),
        (Write, "/tmp/w/f"),
        (Create, "/tmp/w/d"),
        (Create, "/tmp/w/d/g"),
        (Remove, "/tmp/w/f"),
    ] {
        assert!(
            seen.iter().any(|(k, p)| *k == wanted.0 && p == wanted.1),
            "{wanted:?} in {seen:?}"
        );
    }
}

/// The microVM backend's terminal: a shell on a terminal in the guest takes input, sees its
/// size and a resize, and its exit code comes back. Needs QEMU and the guest
/// (`scripts/build-vm-guest.sh`, run here; cached).
#[test]
fn a_shell_on_a_microvm_terminal_takes_input_and_resizes() {
    let repo =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("..");
    let built = Command::new(repo.join("scripts/build-vm-guest.sh"))
        .output()
        .expect("scripts/build-vm-guest.sh");
    assert!(
        built.status.success(),
        "build-vm-guest: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let state = state_dir();
    let mut options = options(state.path());
    options.backend = sandbox_core::BackendKind::Microvm;
    let sandbox = LiveSandbox::start(&Caps::new(), &options).expect("start");
    let size = sandbox_live::TtySize { rows: 30, cols: 90 };
    let pty = sandbox.pty(argv(&["sh", "-i"]), size).expect("pty");
    pty.write(b"stty size; echo sum=$((6*7)); tty\n")
        .expect("type");
    terminal_shows(&pty, "30 90");
    terminal_shows(&pty, "sum=42");
    terminal_shows(&pty, "/dev/pts/");
    pty.resize(sandbox_live::TtySize {
        rows: 40,
        cols: 100,
    })
    .expect("resize");
    pty.write(b"stty size\n").expect("type");
    terminal_shows(&pty, "40 100");
    pty.write(b"exit 3\n").expect("type");
    let exit = pty.wait().expect("wait");
    assert_eq!(exit.exit_code, Some(3), "{exit:?}");
    sandbox.stop().expect("stop");
    assert_eq!(sandbox_dirs(state.path()), 0);
}
