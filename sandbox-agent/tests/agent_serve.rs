//! The guest agent's pod modes, run as real processes on this host: `serve` speaks the agent
//! protocol on its standard input and output (what the cluster backend reaches through a
//! pod's exec stream), `pod` is the container's idle entrypoint.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_agent::protocol::{
    encode, AgentMsg, Applied, Decoder, GuestExit, GuestFile, GuestMount, GuestRlimits, HostMsg,
    OutStream, RunRequest, PROTOCOL_VERSION,
};

/// How long any one step may take before the test calls it hung (not a timing assertion).
const HANG: Duration = Duration::from_secs(60);

struct Agent {
    child: Child,
    to: Option<ChildStdin>,
    from: ChildStdout,
    decoder: Decoder,
    dir: tempfile::TempDir,
    /// What the agent said it applied (kept aside by `recv`, which returns the rest).
    applied: Option<Applied>,
}

impl Agent {
    fn serve() -> Agent {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata-guest-agent"))
            .arg("serve")
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the agent starts");
        let to = child.stdin.take().expect("stdin");
        let from = child.stdout.take().expect("stdout");
        Agent {
            child,
            to: Some(to),
            from,
            decoder: Decoder::new(),
            dir,
            applied: None,
        }
    }

    fn send(&mut self, msg: &HostMsg) {
        let frame = encode(msg).expect("encodes");
        self.to
            .as_mut()
            .expect("open")
            .write_all(&frame)
            .expect("the agent reads");
    }

    fn recv(&mut self) -> Option<AgentMsg> {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match self.decoder.next_msg::<AgentMsg>().expect("a good frame") {
                Some(AgentMsg::Applied { applied }) => {
                    assert!(self.applied.is_none(), "one report of what was applied");
                    self.applied = Some(applied);
                    continue;
                }
                Some(msg) => return Some(msg),
                None => {}
            }
            match self.from.read(&mut buf).expect("reads") {
                0 => return None,
                n => self.decoder.feed(&buf[..n]),
            }
        }
    }

    /// Ready, hello, welcome.
    fn greet(&mut self) {
        assert!(
            matches!(self.recv(), Some(AgentMsg::Ready { version, .. }) if version == PROTOCOL_VERSION)
        );
        self.send(&HostMsg::Hello {
            version: PROTOCOL_VERSION,
        });
        assert!(matches!(self.recv(), Some(AgentMsg::Welcome { .. })));
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + HANG;
        loop {
            if let Some(status) = self.child.try_wait().expect("waits") {
                return status;
            }
            assert!(Instant::now() < deadline, "the agent did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn request(script: &str) -> RunRequest {
    RunRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]),
        cwd: String::new(),
        timeout_ms: HANG.as_millis() as u64,
        output_cap: 1 << 20,
        entropy: vec![7; 32],
        rlimits: GuestRlimits::default(),
        clock_unix_ns: 0,
        mounts: Vec::new(),
        files: Vec::new(),
        report: None,
        network: false,
    }
}

#[test]
fn serve_runs_one_request_over_stdio_in_its_own_directory_and_exits() {
    let mut agent = Agent::serve();
    agent.greet();
    let mut req = request("cat; cat given.txt; pwd >&2; exit 3");
    let given = agent.dir.path().join("given.txt");
    req.files = vec![GuestFile {
        path: given.display().to_string(),
        data: b" and a file".to_vec(),
    }];
    agent.send(&HostMsg::Run(req));
    agent.send(&HostMsg::Stdin {
        data: b"from the host".to_vec(),
    });
    agent.send(&HostMsg::StdinEnd);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = loop {
        match agent.recv().expect("the agent reports") {
            AgentMsg::Output {
                stream: OutStream::Stdout,
                data,
            } => out.extend(data),
            AgentMsg::Output {
                stream: OutStream::Stderr,
                data,
            } => err.extend(data),
            AgentMsg::Exit { status } => break status,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, GuestExit::Exited { code: 3 });
    assert_eq!(String::from_utf8_lossy(&out), "from the host and a file");
    let cwd = std::fs::canonicalize(agent.dir.path()).expect("canonical");
    assert_eq!(
        String::from_utf8_lossy(&err).trim(),
        cwd.display().to_string()
    );
    assert!(agent.wait().success());
}

/// The host checks the tool's limits against what the agent reads back from the started
/// process, not against what it asked for.
#[test]
fn serve_reports_the_limits_the_tool_started_with() {
    let mut agent = Agent::serve();
    agent.greet();
    let mut req = request("ulimit -n");
    req.rlimits = GuestRlimits {
        cpu_seconds: 7,
        file_size: 1 << 20,
        open_files: 33,
    };
    agent.send(&HostMsg::Run(req.clone()));
    agent.send(&HostMsg::StdinEnd);
    let mut out = Vec::new();
    loop {
        match agent.recv().expect("the agent reports") {
            AgentMsg::Output { data, .. } => out.extend(data),
            AgentMsg::Exit { status } => {
                assert_eq!(status, GuestExit::Exited { code: 0 });
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&out).trim(), "33");
    let applied = agent
        .applied
        .clone()
        .expect("the agent said what it applied");
    assert_eq!(applied.rlimits, Some(req.rlimits));
    assert!(applied.mounts.is_empty());
    assert!(applied.memory_total.is_some_and(|m| m > 0), "{applied:?}");
    assert!(
        sandbox_agent::applied::missing(&req, Some(&applied)).is_empty(),
        "{applied:?}"
    );
    agent.wait();
}

#[test]
fn serve_refuses_disks_since_a_pod_has_none() {
    let mut agent = Agent::serve();
    agent.greet();
    let mut req = request("touch ran");
    req.mounts = vec![GuestMount {
        serial: "strata-grant-0".into(),
        target: "/mnt".into(),
        writable: true,
    }];
    agent.send(&HostMsg::Run(req));
    match agent.recv() {
        Some(AgentMsg::Error { message }) => assert!(message.contains("no disks"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(agent.wait().code(), Some(1));
    assert!(!agent.dir.path().join("ran").exists(), "nothing ran");
}

#[test]
fn host_going_away_mid_run_kills_the_tool() {
    let mut agent = Agent::serve();
    agent.greet();
    agent.send(&HostMsg::Run(request(
        "echo $$ > pid; echo started; exec sleep 1000",
    )));
    assert!(matches!(agent.recv(), Some(AgentMsg::Output { .. })));
    let pid: i32 = std::fs::read_to_string(agent.dir.path().join("pid"))
        .expect("the tool wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    // The exec stream breaks: the agent sees its input end.
    drop(agent.to.take());
    match agent.recv() {
        Some(AgentMsg::Exit { status }) => assert_eq!(status, GuestExit::Killed),
        other => panic!("expected the exit, got {other:?}"),
    }
    agent.wait();
    // SAFETY: kill with signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "the tool {pid} outlived the channel");
}

#[test]
fn pod_entrypoint_idles_until_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata-guest-agent"))
        .arg("pod")
        .spawn()
        .expect("the entrypoint starts");
    // Wait until it catches SIGTERM (bit 15 of SigCgt), so the signal below tests the
    // handler, not the default action.
    let status_file = format!("/proc/{}/status", child.id());
    let deadline = Instant::now() + HANG;
    loop {
        let status = std::fs::read_to_string(&status_file).expect("its status");
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (libc::SIGTERM - 1)) != 0 {
            break;
        }
        assert!(Instant::now() < deadline, "it never installed its handler");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(child.try_wait().expect("waits").is_none(), "it idles");
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + HANG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break status;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not end it");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn unknown_mode_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata-guest-agent"))
        .arg("serv")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode"));
}
