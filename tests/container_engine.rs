//! The container backend's engine runtimes on a real Docker engine (Debian's docker.io,
//! started by scripts/start-dockerd.sh), with the test images loaded from their
//! `docker save` archives. These tests fail loudly when no engine is running: they never
//! pass without one.

mod container_common;
mod egress_common;

use std::time::Duration;

use container_common::*;
use strata::{
    BackendKind, CancelToken, Capability, Caps, ContainerRuntime, ErrorKind, LimitKind, RunContext,
    ScriptLanguage, StdinSource, Tool,
};

const DOCKER: ContainerRuntime = ContainerRuntime::Docker;

/// Engine tests run one at a time, so "no container of this process is left" is exact.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Engine containers this test process created and did not remove.
fn leftover_containers() -> Vec<String> {
    let (ok, out) = docker(&[
        "ps",
        "-a",
        "-q",
        "--filter",
        &format!("label=org.strata.run={}", std::process::id()),
    ]);
    assert!(ok, "docker ps failed");
    out.lines().map(str::to_string).collect()
}

#[test]
fn python3_runs_on_the_docker_engine() {
    let _serial = serial();
    let images = engine_images();
    let out = run(
        &Tool::command(["python3", "-c", "print(1)"]),
        &caps(&images.python_archive(), DOCKER),
    );
    assert_eq!(ok_stdout(&out), "1\n");
    let receipt = &out.receipt;
    assert_eq!(receipt.backend, BackendKind::Container);
    let container = receipt.container.as_ref().expect("container receipt");
    assert_eq!(container.runtime, "docker");
    assert!(container.digest.starts_with("sha256:"));
    assert!(receipt.has(Capability::Net, "--network none"), "{receipt}");
    assert!(
        receipt.has(Capability::Privileges, "--cap-drop ALL"),
        "{receipt}"
    );
    // By name, as the engine knows it, and the same id as the native runtime reports.
    let by_name = run(
        &Tool::script(ScriptLanguage::Python, "print(2)"),
        &caps("strata-test/python:1", DOCKER),
    );
    assert_eq!(ok_stdout(&by_name), "2\n");
    let native = run(
        &Tool::command(["python3", "-c", "print(3)"]),
        &caps(&images.python_archive(), ContainerRuntime::Native),
    );
    assert_eq!(
        native.receipt.container.expect("native").digest,
        by_name.receipt.container.expect("engine").digest,
        "one image id across runtimes"
    );
}

#[test]
fn engine_container_is_locked_down() {
    let _serial = serial();
    let images = engine_images();
    let out = run(
        &sh(
            "id -u; grep -E '^(CapEff|NoNewPrivs):' /proc/self/status | tr -s '\\t' ' '; \
             touch /rootfs-write 2>/dev/null || echo ro-root; \
             echo ok > /tmp/t && cat /tmp/t; \
             cp /bin/busybox /tmp/bb 2>/dev/null; /tmp/bb true 2>/dev/null || echo noexec-tmp; \
             ls /sys/class/net | tr '\\n' ' '",
        ),
        &caps(&images.python_archive(), DOCKER),
    );
    let text = ok_stdout(&out);
    for want in [
        "65534\n",
        "CapEff: 0000000000000000",
        "NoNewPrivs: 1",
        "ro-root",
        "ok\n",
        "noexec-tmp",
    ] {
        assert!(text.contains(want), "{want:?} missing in {text}");
    }
    assert_eq!(text.lines().last(), Some("lo "), "only loopback: {text}");
}

#[test]
fn engine_docker_socket_is_never_visible_inside() {
    let _serial = serial();
    let images = engine_images();
    let out = run(
        &sh("for p in /var/run/docker.sock /run/docker.sock; do test -e $p && echo visible $p; done; echo done"),
        &caps(&images.python_archive(), DOCKER),
    );
    assert_eq!(ok_stdout(&out), "done\n");
}

#[test]
fn engine_limits_end_the_run_with_a_typed_reason() {
    let _serial = serial();
    let images = engine_images();
    let caps = caps(&images.python_archive(), DOCKER).timeout(Duration::from_secs(2));
    let out = run(&Tool::command(["sleep", "30"]), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);

    let mut caps = caps.timeout(Duration::from_secs(20));
    caps.limits.output = "4K".parse().expect("size");
    let out = run(&sh("yes strata | head -c 1000000"), &caps);
    assert!(out.stdout_truncated);
    assert_eq!(out.stdout.len(), 4096);

    let mut caps = Caps::new().image(images.python_archive()).runtime(DOCKER);
    caps.limits.memory = "64M".parse().expect("size");
    let out = run(
        &Tool::command(["python3", "-c", "b = bytearray(512 << 20); print(len(b))"]),
        &caps,
    );
    assert!(
        !out.success(),
        "a 512M allocation under a 64M limit must fail"
    );
    assert!(leftover_containers().is_empty());
}

/// A pipe (read end, write end).
fn pipe() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(ret, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: pipe2 returned two fresh descriptors that nothing else owns.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

#[test]
fn engine_stdin_stream_reaches_the_container_and_cannot_outlive_the_timeout() {
    let _serial = serial();
    let images = engine_images();
    let streaming = |reader: std::fs::File| RunContext {
        stdin: Some(std::sync::Arc::new(StdinSource::from_fd(reader))),
        ..RunContext::default()
    };
    // Exactly: the caps' bytes, then 3 MB from the stream.
    let (reader, mut writer) = pipe();
    let producer =
        std::thread::spawn(move || std::io::Write::write_all(&mut writer, &vec![b'x'; 3_000_000]));
    let with_prefix = caps(&images.python_archive(), DOCKER).stdin(b"12345".to_vec());
    let out = sandbox()
        .run_with(
            &Tool::command(["wc", "-c"]),
            &with_prefix,
            &streaming(reader),
        )
        .expect("run");
    producer.join().expect("producer").expect("written");
    assert_eq!(ok_stdout(&out).trim(), "3000005");

    // A producer that never stops, into a tool that never reads: held back, cut by the
    // timeout, and its pipe closed after the run.
    let (reader, mut writer) = pipe();
    let producer = std::thread::spawn(move || {
        let chunk = vec![b'y'; 16 * 1024];
        let mut written = 0u64;
        while let Ok(n) = std::io::Write::write(&mut writer, &chunk) {
            written += n as u64;
        }
        written
    });
    let short = caps(&images.python_archive(), DOCKER).timeout(Duration::from_secs(2));
    let out = sandbox()
        .run_with(&Tool::command(["sleep", "30"]), &short, &streaming(reader))
        .expect("run");
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    let written = producer.join().expect("producer");
    eprintln!("the producer got {written} bytes in");
    assert!(
        written < 16 << 20,
        "{written} bytes taken from a producer the container never read"
    );
    assert!(leftover_containers().is_empty());
}

#[test]
fn engine_mounts_are_read_only_or_read_write_as_granted() {
    let _serial = serial();
    let images = engine_images();
    let data = tempdir();
    std::fs::write(data.path().join("in.txt"), "input").expect("write");
    let out_dir = tempdir();
    // The container runs as nobody: let it write the read-write grant.
    std::fs::set_permissions(
        out_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let caps = caps(&images.python_archive(), DOCKER)
        .mount(data.path(), "/data", strata::Access::ReadOnly)
        .mount(out_dir.path(), "/out", strata::Access::ReadWrite);
    let tool = sh("cat /data/in.txt > /out/o.txt; echo x > /data/x 2>/dev/null || echo ro");
    let out = run(&tool, &caps);
    assert_eq!(ok_stdout(&out), "ro\n");
    // The engine cannot give an agent its own host uid: refused when strict.
    let err = sandbox()
        .run(
            &Tool::command(["true"]),
            &container_common::caps(&images.python_archive(), DOCKER).agent("eng"),
        )
        .expect_err("strict refuses an agent");
    assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");
    assert!(err.to_string().contains("agent eng"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("o.txt")).expect("out"),
        "input"
    );
}

#[test]
fn engine_containers_are_removed_after_success_error_timeout_and_cancel() {
    let _serial = serial();
    let images = engine_images();
    let caps = caps(&images.python_archive(), DOCKER);
    run(&Tool::command(["true"]), &caps);
    run(&Tool::command(["false"]), &caps);
    let err = sandbox()
        .run(&Tool::command(["no-such-program-xyz"]), &caps)
        .expect_err("missing program");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    let token = CancelToken::new();
    let canceller = token.clone();
    let thread = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        canceller.cancel();
    });
    let ctx = RunContext {
        cancel: token,
        ..RunContext::default()
    };
    let err = sandbox()
        .run_with(&Tool::command(["sleep", "30"]), &caps, &ctx)
        .expect_err("cancelled");
    thread.join().expect("join");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(
        leftover_containers().is_empty(),
        "containers left behind: {:?}",
        leftover_containers()
    );
}

#[test]
fn engine_images_are_never_pulled() {
    let _serial = serial();
    engine_images();
    let err = sandbox()
        .run(
            &Tool::command(["true"]),
            &caps("strata-test/not-loaded:404", DOCKER),
        )
        .expect_err("unknown image");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("never pulls"), "{err}");
    assert!(leftover_containers().is_empty());
}

#[test]
fn engine_container_reaches_only_the_allowed_host_through_the_proxy() {
    let _serial = serial();
    let images = engine_images();
    assert!(is_root(), "the engine suites run as root (.ci/run)");
    let mut up = egress_common::Upstream::start();
    let other = format!("other-{}.strata-test.example", std::process::id());
    up.alias(&other, &up.ip.to_string());
    let rule = format!("{}:{}", up.name, egress_common::HTTP_PORT);
    let mut caps = caps(&images.python_archive(), DOCKER)
        .net(
            format!("allow:{rule},{other}:{}", egress_common::HTTP_PORT)
                .parse()
                .expect("net"),
        )
        .env("HTTP_PROXY", "http://attacker.example:1");
    caps.secrets.push(strata::Secret {
        env: "API_TOKEN".into(),
        value: egress_common::SECRET.into(),
        hosts: vec![up.name.clone()],
    });
    // busybox wget follows http_proxy with the run's credential; python3 tries to go
    // around the proxy, to the upstream's address and to a public resolver.
    let script = format!(
        "wget -q -O - {ok}; echo; wget -q -O - http://example.com/ 2>&1 || echo refused; \
         for h in {name} {other}; do wget -q -O - --header \"Authorization: Bearer $API_TOKEN\" \
         http://$h:{port}/auth; echo; done; test -s /etc/strata/ca-bundle.pem && echo trusted; \
         python3 -c 'import socket\n\
         for a in [(\"{ip}\", {port}), (\"8.8.8.8\", 53)]:\n\
         \x20   s = socket.socket(); s.settimeout(5)\n\
         \x20   try:\n\
         \x20       s.connect(a); print(\"direct connected\")\n\
         \x20   except OSError as err:\n\
         \x20       print(\"direct\", err.errno)'",
        ok = up.http_url("hello"),
        ip = up.ip,
        port = egress_common::HTTP_PORT,
        name = up.name,
    );
    let out = run(&Tool::command(["/bin/sh", "-c", &script]), &caps);
    let text = stdout(&out);
    assert!(
        text.contains(egress_common::HELLO),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("refused"), "{text}");
    assert!(
        text.contains("auth ok\nauth bad\ntrusted"),
        "the secret goes to its host only: {text}"
    );
    assert!(!text.contains(egress_common::SECRET));
    assert_eq!(
        text.matches("direct 101").count(),
        2,
        "ENETUNREACH expected: {text}"
    );
    let receipt = &out.receipt;
    assert!(
        receipt.has_kind(Capability::Net, strata::Mechanism::Proxy),
        "{receipt}"
    );
    let net = receipt.network.as_ref().expect("network receipt");
    assert!(net.decisions[0].allowed, "{net:?}");
    assert_eq!(net.decisions[0].rule.as_deref(), Some(rule.as_str()));
    assert_eq!(net.decisions[1].host, "example.com");
    assert!(!net.decisions[1].allowed);
    assert!(
        net.decisions
            .iter()
            .any(|d| d.secrets == ["API_TOKEN"] && d.host == up.name),
        "{net:?}"
    );
    // The tool's container and its network holder are both gone.
    assert!(
        leftover_containers().is_empty(),
        "{:?}",
        leftover_containers()
    );

    let runsc = caps.clone().runtime(ContainerRuntime::Runsc);
    let err = sandbox()
        .run(&Tool::command(["true"]), &runsc)
        .expect_err("gVisor cannot reach the listener");
    assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");
}

#[test]
fn docker_save_output_runs_on_the_native_runtime() {
    let _serial = serial();
    engine_images();
    let dir = tempdir();
    let archive = dir.path().join("saved.tar");
    let (ok, _) = docker(&[
        "save",
        "-o",
        &archive.display().to_string(),
        "strata-test/busybox:1",
    ]);
    assert!(ok, "docker save failed");
    let out = run(
        &sh("echo from-docker-save"),
        &caps(&archive.display().to_string(), ContainerRuntime::Native),
    );
    assert_eq!(ok_stdout(&out), "from-docker-save\n");
}

#[test]
fn engine_runs_on_gvisor_runsc() {
    let _serial = serial();
    let images = engine_images();
    if !std::path::Path::new("/usr/bin/runsc").exists() {
        panic!("runsc is not installed: scripts/deps.sh installs Debian's runsc package");
    }
    let out = run(
        &Tool::command(["python3", "-c", "print(1)"]),
        &caps(&images.python_archive(), ContainerRuntime::Runsc),
    );
    assert_eq!(ok_stdout(&out), "1\n");
    let receipt = &out.receipt;
    assert_eq!(
        receipt.container.as_ref().expect("receipt").runtime,
        "runsc"
    );
    assert!(receipt.has(Capability::Syscalls, "gVisor"), "{receipt}");
}

#[test]
fn engine_grant_does_not_follow_a_planted_symlink() {
    let _serial = serial();
    let images = engine_images();
    let secret = tempdir();
    std::fs::write(secret.path().join("secret.txt"), "secret").expect("write");
    let ws = tempdir();
    let src = ws.path().join("src");
    std::os::unix::fs::symlink(secret.path(), &src).expect("symlink");
    let err = sandbox()
        .run(
            &sh("cat /src/secret.txt"),
            &caps(&images.busybox_archive(), DOCKER).mount(&src, "/src", strata::Access::ReadOnly),
        )
        .expect_err("planted symlink");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} is a symlink", src.display())),
        "{err}"
    );
    assert!(leftover_containers().is_empty(), "nothing was created");
}

#[test]
fn engine_git_hook_and_envrc_in_rw_grant_cannot_be_written() {
    let _serial = serial();
    let images = engine_images();
    let repo = Repo::new();
    let caps = caps(&images.busybox_archive(), DOCKER).mount(
        repo.dir.path(),
        "/ws",
        strata::Access::ReadWrite,
    );
    let out = run(&sh(REPO_ATTACKS), &caps);
    assert_repo_attacks_denied(&ok_stdout(&out));
    repo.assert_untouched();
    assert_eq!(
        std::fs::read_to_string(repo.dir.path().join("src/main.rs")).expect("src"),
        "edited\n"
    );
    let receipt = out.receipt.to_string();
    assert!(
        receipt
            .contains("host-executed paths read-only: /ws/.envrc, /ws/.git/config, /ws/.git/hooks"),
        "{receipt}"
    );
    assert!(
        receipt.contains(&format!("/ws={} (rw)", repo.dir.path().display())),
        "the resolved source: {receipt}"
    );
}

#[test]
fn engine_setuid_file_cannot_be_planted_through_a_rw_grant() {
    let _serial = serial();
    let images = engine_images();
    let ws = tempdir();
    // The container runs as nobody: let it write the grant.
    std::fs::set_permissions(
        ws.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let caps =
        caps(&images.python_archive(), DOCKER).mount(ws.path(), "/ws", strata::Access::ReadWrite);
    let probe = r#"
import os
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
open("/ws/sh", "wb").write(open("/bin/sh", "rb").read())
attempt("chmod 4755", lambda: os.chmod("/ws/sh", 0o4755))
attempt("chmod 2755", lambda: os.chmod("/ws/sh", 0o2755))
attempt("open O_CREAT 4755", lambda: os.close(os.open("/ws/created", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mknod S_IFREG|4755", lambda: os.mknod("/ws/node", 0o100000 | 0o4755))
attempt("mkdir 2775", lambda: os.mkdir("/ws/dir", 0o2775))
attempt("mknod char device", lambda: os.mknod("/ws/null", 0o020000 | 0o666, os.makedev(1, 3)))
"#;
    let out = run(&Tool::command(["python3", "-c", probe]), &caps);
    let text = ok_stdout(&out);
    assert!(!text.contains("ALLOWED"), "{text}");
    assert_eq!(
        text.matches(" denied ").count(),
        6,
        "every attempt ran: {text}"
    );
    for entry in std::fs::read_dir(ws.path()).expect("read_dir").flatten() {
        let mode = std::os::unix::fs::MetadataExt::mode(&entry.metadata().expect("meta"));
        assert_eq!(
            mode & 0o6000,
            0,
            "{} is set-id: {mode:o}",
            entry.path().display()
        );
    }
    assert!(
        out.receipt
            .has(Capability::Syscalls, "Strata's seccomp profile"),
        "{}",
        out.receipt
    );
}
