//! What a live sandbox costs (criterion), next to what it replaces, in the same run:
//!
//! - `live/posix_spawn_true`: `/bin/true` spawned directly on the host (std's `Command`,
//!   which uses `posix_spawn`): the floor.
//! - `live/exec_true`: `/bin/true` exec'd in the foreground into a warm live sandbox on the
//!   process backend (client connection, request, fork and exec by the sandbox's init,
//!   exit report): the target is at most 1.5x the floor.
//! - `live/exec_detached_true`: the same, detached (answer at start, no output stream).
//! - `live/one_shot_run_true`: a warm one-shot run of `/bin/true` (`Sandbox::run`, pooled).
//! - `live/start_stop`: starting an owned live sandbox and stopping it.
//! - `live/pause_resume`: pausing a live sandbox (its cgroup frozen, or stop signals) and
//!   resuming it.
//! - `live/pty_round_trip`: a byte typed into a terminal exec (`cat` on a pty) until its
//!   echo comes back to the client.
//! - `live/publish_connect`: a TCP connection through a published port to a server in the
//!   sandbox, until its first byte arrives.
//!
//! - `snapshot/take_100_files`: snapshotting a live sandbox whose `/tmp` holds 100 files
//!   of 4 KiB (pause, copy, hash, seal, resume).
//! - `snapshot/start_from_to_first_exec`: starting a live sandbox from that snapshot
//!   (verify every file, start, copy the files in) until a first exec returns, and stopping
//!   it.
//! - `snapshot/fork_4`: forking the sandbox into 4 children, and stopping them.
//!
//! `benches/live_many.rs` measures 100 live sandboxes on one machine and the memory each
//! idle one holds.
//!
//! Ratios: `benches/ratios.sh` style, or read them off criterion's report.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use strata::live::{ExecRequest, LiveSandbox, StartOptions};
use strata::{BackendChoice, BackendKind, Caps, Sandbox, Tool};

fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("bench binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join(name)
}

fn options(state: &std::path::Path) -> StartOptions {
    StartOptions {
        helper: Some(bin("strata-helper")),
        supervisor: Some(bin("strata-live")),
        state_dir: Some(state.to_path_buf()),
        ..StartOptions::default()
    }
}

fn live(c: &mut Criterion) {
    let mut group = c.benchmark_group("live");
    group.measurement_time(Duration::from_secs(5));
    let state = tempfile::tempdir().expect("state dir");
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let request = ExecRequest {
        argv: vec!["/bin/true".into()],
        ..ExecRequest::default()
    };
    group.bench_function("posix_spawn_true", |b| {
        b.iter(|| {
            std::process::Command::new("/bin/true")
                .status()
                .expect("spawn")
        })
    });
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    group.bench_function("exec_true", |b| {
        b.iter(|| {
            sandbox
                .exec(request.clone(), None, |_, _| {})
                .expect("exec")
        })
    });
    group.bench_function("exec_detached_true", |b| {
        b.iter(|| sandbox.spawn(request.clone()).expect("spawn"))
    });
    group.bench_function("pause_resume", |b| {
        b.iter(|| {
            sandbox.pause().expect("pause");
            sandbox.resume().expect("resume");
        })
    });
    pty_round_trip(&mut group, &sandbox);
    publish_connect(&mut group, &sandbox);
    drop(sandbox);
    let oneshot = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(bin("strata-helper").display().to_string())
        .build()
        .expect("sandbox");
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    group.bench_function("one_shot_run_true", |b| {
        b.iter(|| oneshot.run(&tool, &caps).expect("run"))
    });
    group.sample_size(10);
    group.bench_function("start_stop", |b| {
        b.iter(|| {
            LiveSandbox::start(&Caps::new(), &options(state.path()))
                .expect("start")
                .stop()
                .expect("stop")
        })
    });
    group.finish();
}

/// Reads what a channel delivers, as a process's stdin.
struct ChannelInput(std::sync::mpsc::Receiver<Vec<u8>>, Vec<u8>);

impl std::io::Read for ChannelInput {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.1.is_empty() {
            match self.0.recv() {
                Ok(bytes) => self.1 = bytes,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.1.len());
        buf[..n].copy_from_slice(&self.1[..n]);
        self.1.drain(..n);
        Ok(n)
    }
}

fn pty_round_trip(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    sandbox: &LiveSandbox,
) {
    let (typed, input) = std::sync::mpsc::channel::<Vec<u8>>();
    let (echoed, echoes) = std::sync::mpsc::channel::<usize>();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let request = ExecRequest {
                argv: vec!["cat".into()],
                tty: Some(strata::live::TtySize { rows: 24, cols: 80 }),
                ..ExecRequest::default()
            };
            let stdin = Box::new(ChannelInput(input, Vec::new()));
            let _ = sandbox.exec(request, Some(stdin), |_, bytes| {
                let _ = echoed.send(bytes.iter().filter(|b| **b == b'x').count());
            });
        });
        group.bench_function("pty_round_trip", |b| {
            b.iter(|| {
                typed.send(b"x".to_vec()).expect("type");
                let mut seen = 0;
                while seen == 0 {
                    seen += echoes.recv().expect("echo");
                }
            })
        });
        // End of input ends cat (^D on an empty line).
        let _ = typed.send(b"\n\x04".to_vec());
        drop(typed);
    });
}

fn publish_connect(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    sandbox: &LiveSandbox,
) {
    use std::io::Read;
    let server = "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',8000))\ns.listen(64)\nwhile True:\n  c,_=s.accept()\n  c.sendall(b'x')\n  c.close()\n";
    let pid = sandbox
        .spawn(ExecRequest {
            argv: vec!["python3".into(), "-c".into(), server.into()],
            ..ExecRequest::default()
        })
        .expect("server");
    let port = sandbox
        .publish(&strata::live::PublishRequest {
            guest_port: 8000,
            host_ip: None,
            host_port: None,
        })
        .expect("publish");
    let address = format!("127.0.0.1:{}", port.host_port);
    let fetch = || {
        let mut stream = std::net::TcpStream::connect(&address).ok()?;
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).ok()?;
        Some(byte[0])
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fetch().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server in the sandbox answers"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    group.bench_function("publish_connect", |b| {
        b.iter(|| fetch().expect("through the published port"))
    });
    let _ = sandbox.kill(pid, libc::SIGKILL);
}

fn snapshots(c: &mut Criterion) {
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    let state = tempfile::tempdir().expect("state dir");
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let store = strata::live::SnapshotStore::open(&state.path().join("snapshots")).expect("store");
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    let fill = ExecRequest {
        argv: ["sh", "-c", "mkdir -p /tmp/w && for i in $(seq 100); do head -c 4096 /dev/urandom > /tmp/w/f$i; done"]
            .map(String::from)
            .to_vec(),
        ..ExecRequest::default()
    };
    sandbox.exec(fill, None, |_, _| {}).expect("fill");
    let mut n = 0u64;
    group.bench_function("take_100_files", |b| {
        b.iter(|| {
            n += 1;
            let name = format!("bench-{n}");
            sandbox.snapshot(&store, Some(&name)).expect("snapshot");
            store.remove(&name).expect("remove");
        })
    });
    sandbox.snapshot(&store, Some("base")).expect("snapshot");
    let first = ExecRequest {
        argv: vec!["/bin/true".into()],
        ..ExecRequest::default()
    };
    group.bench_function("start_from_to_first_exec", |b| {
        b.iter(|| {
            let copy = LiveSandbox::start_from(&store, "base", &options(state.path()))
                .expect("start from");
            copy.exec(first.clone(), None, |_, _| {}).expect("exec");
            copy.stop().expect("stop");
        })
    });
    group.bench_function("fork_4", |b| {
        b.iter(|| {
            let forked = sandbox
                .fork(&store, 4, &options(state.path()))
                .expect("fork");
            for child in forked.children {
                child.stop().expect("stop");
            }
        })
    });
    group.finish();
}

criterion_group!(benches, live, snapshots);
criterion_main!(benches);
