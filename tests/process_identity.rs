//! Attack class L (identity and shared kernel state) and M (limits for every caller) on the
//! process backend: a tool never acts as host root, cannot plant a privilege in a grant,
//! cannot use another agent's files, and cannot hold host-wide kernel state.
//!
//! Each test checks host-side evidence (owners and modes of files on the host), not only
//! what the probe reports.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;
use strata::{Caps, ErrorKind, IdentitySource, LimitKind, RunOutput, Sandbox, Strictness};

/// A host directory the tool may write (mode 0755, owned by the test's uid).
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("strata-ws")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), PermissionsExt::from_mode(0o755)).expect("chmod");
    dir
}

fn host_uid(out: &RunOutput) -> u32 {
    out.receipt
        .identity
        .as_ref()
        .unwrap_or_else(|| panic!("receipt names no identity: {}", out.receipt))
        .host_uid
}

/// Every file under `dir` (recursively): (path, uid, mode).
fn files_under(dir: &Path) -> Vec<(String, u32, u32)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let meta = entry.path().symlink_metadata().expect("lstat");
            if meta.is_dir() {
                stack.push(entry.path());
            }
            found.push((entry.path().display().to_string(), meta.uid(), meta.mode()));
        }
    }
    found
}

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_IFMT: u32 = 0o170000;

#[test]
fn setuid_root_file_cannot_be_planted_through_a_rw_grant() {
    if !require_root("setuid_root_file_cannot_be_planted_through_a_rw_grant") {
        return;
    }
    let ws = workspace();
    let w = ws.path().display();
    // Every way we know to get a set-id bit onto a file or directory.
    let probe = format!(
        r#"
import os, shutil, stat
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
shutil.copy("/bin/sh", "{w}/sh")
attempt("chmod 6755", lambda: os.chmod("{w}/sh", 0o6755))
attempt("chmod 4755", lambda: os.chmod("{w}/sh", 0o4755))
attempt("chmod 2755", lambda: os.chmod("{w}/sh", 0o2755))
fd = os.open("{w}/sh", os.O_RDONLY)
attempt("fchmod", lambda: os.fchmod(fd, 0o4755))
attempt("open O_CREAT 4755", lambda: os.close(os.open("{w}/created", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mknod S_IFREG|4755", lambda: os.mknod("{w}/node", stat.S_IFREG | 0o4755))
attempt("mkdir 2775", lambda: os.mkdir("{w}/dir", 0o2775))
attempt("mknod char device", lambda: os.mknod("{w}/null", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
attempt("mknod block device", lambda: os.mknod("{w}/blk", stat.S_IFBLK | 0o666, os.makedev(7, 0)))
attempt("file capability", lambda: os.setxattr("{w}/sh", "security.capability", b"\x01\x00\x00\x02" + b"\xff" * 16))
"#
    );
    let out = run(&py(&probe), &Caps::new().read_write(ws.path()));
    let text = ok_stdout(&out);
    assert!(!text.contains("ALLOWED"), "{text}");
    for (path, uid, mode) in files_under(ws.path()) {
        assert_eq!(
            mode & (S_ISUID | S_ISGID),
            0,
            "{path} has a set-id bit: {mode:o}"
        );
        let kind = mode & S_IFMT;
        assert!(
            kind == 0o100000 || kind == 0o040000,
            "{path} is neither a file nor a directory: {mode:o}"
        );
        assert_ne!(uid, 0, "{path} belongs to host root");
        assert_eq!(uid, host_uid(&out), "{path} belongs to the tool's host uid");
    }
    assert!(ws.path().join("sh").exists(), "the copy itself was allowed");
}

#[test]
fn root_embedders_tool_never_runs_as_host_root() {
    if !require_root("root_embedders_tool_never_runs_as_host_root") {
        return;
    }
    let ws = workspace();
    let out = run(
        &sh(&format!("touch {}/mine; id -u", ws.path().display())),
        &Caps::new().read_write(ws.path()),
    );
    assert_eq!(
        ok_stdout(&out).trim(),
        "0",
        "root inside its own namespace only"
    );
    let id = out.receipt.identity.clone().expect("identity");
    assert_ne!(id.host_uid, 0);
    assert_ne!(id.host_gid, 0);
    assert_eq!(id.source, IdentitySource::Fresh);
    let meta = std::fs::metadata(ws.path().join("mine")).expect("created");
    assert_eq!((meta.uid(), meta.gid()), (id.host_uid, id.host_gid));
}

#[test]
fn tool_can_still_edit_the_embedders_files_in_its_grant() {
    if !require_root("tool_can_still_edit_the_embedders_files_in_its_grant") {
        return;
    }
    let ws = workspace();
    let file = ws.path().join("notes.txt");
    std::fs::write(&file, "before\n").expect("write");
    std::fs::set_permissions(&file, PermissionsExt::from_mode(0o600)).expect("chmod");
    let out = run(
        &sh(&format!(
            "echo after >> {f} && chmod 644 {f} && cat {f}",
            f = file.display()
        )),
        &Caps::new().read_write(ws.path()),
    );
    assert_eq!(ok_stdout(&out), "before\nafter\n");
    let meta = std::fs::metadata(&file).expect("meta");
    assert_eq!(meta.uid(), 0, "an existing file keeps its owner");
    assert_eq!(meta.mode() & 0o777, 0o644);
}

#[test]
fn agents_keep_their_own_host_ids_and_fresh_runs_share_none() {
    if !require_root("agents_keep_their_own_host_ids_and_fresh_runs_share_none") {
        return;
    }
    let uid_of = |caps: Caps| host_uid(&run(&sh("true"), &caps));
    let alice = uid_of(Caps::new().agent("test-alice"));
    let bob = uid_of(Caps::new().agent("test-bob"));
    assert_eq!(uid_of(Caps::new().agent("test-alice")), alice, "stable");
    assert_ne!(alice, bob);
    let fresh1 = uid_of(Caps::new());
    let fresh2 = uid_of(Caps::new());
    assert_ne!(fresh1, fresh2);
    for fresh in [fresh1, fresh2] {
        assert!(fresh != alice && fresh != bob && fresh != 0);
    }
}

#[test]
fn one_agent_cannot_read_or_write_another_agents_files() {
    if !require_root("one_agent_cannot_read_or_write_another_agents_files") {
        return;
    }
    let ws = workspace();
    let w = ws.path().display();
    let caps = |agent: &str| Caps::new().agent(agent).read_write(ws.path());
    let out = run(
        &sh(&format!(
            "umask 077; mkdir {w}/alice && echo alice-secret > {w}/alice/secret"
        )),
        &caps("test-alice"),
    );
    ok_stdout(&out);
    let probe = format!(
        r#"
def attempt(name, f):
    try:
        f(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
attempt("read", lambda: open("{w}/alice/secret").read())
attempt("list", lambda: __import__("os").listdir("{w}/alice"))
attempt("write", lambda: open("{w}/alice/planted", "w").write("x"))
attempt("remove", lambda: __import__("os").unlink("{w}/alice/secret"))
"#
    );
    let text = ok_stdout(&run(&py(&probe), &caps("test-bob")));
    assert!(!text.contains("ALLOWED"), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("alice/secret")).expect("host reads"),
        "alice-secret\n"
    );
    assert!(!ws.path().join("alice/planted").exists());
    // The agent itself can use its own files in a later run.
    let text = ok_stdout(&run(
        &sh(&format!("cat {w}/alice/secret")),
        &caps("test-alice"),
    ));
    assert_eq!(text, "alice-secret\n");
}

#[test]
fn pooled_sandboxes_each_get_a_fresh_identity() {
    if !require_root("pooled_sandboxes_each_get_a_fresh_identity") {
        return;
    }
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(helper())
        .warm_pool(1)
        .build()
        .expect("sandbox");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..4 {
        let out = sandbox.run(&sh("true"), &Caps::new()).expect("run");
        assert!(
            seen.insert(host_uid(&out)),
            "an identity was reused: {seen:?}"
        );
        // Give the refill a moment so later runs come from the pool.
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The CFS quota of the run cgroup of this process that holds a `sleep` (host side).
fn quota_of_the_sleeping_run() -> Option<i64> {
    let prefix = format!("run-{}-", std::process::id());
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !path.is_dir() || path.is_symlink() {
                continue;
            }
            if !entry.file_name().to_string_lossy().starts_with(&prefix) {
                if path.components().count() < 12 {
                    stack.push(path);
                }
                continue;
            }
            let sleeping = std::fs::read_to_string(path.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .any(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.trim() == "sleep")
                });
            let quota = std::fs::read_to_string(path.join("cpu.cfs_quota_us"))
                .ok()
                .or_else(|| {
                    std::fs::read_to_string(path.join("cpu.max"))
                        .ok()
                        .map(|m| m.split(' ').next().unwrap_or("").to_string())
                });
            if let (true, Some(q)) = (sleeping, quota) {
                return q.trim().parse().ok();
            }
        }
    }
    None
}

#[test]
fn pooled_runs_get_and_report_their_own_cpu_quota() {
    // Regression: the pool key omitted cpus, so a warm run could get another shape's quota
    // while its receipt stated its own.
    if !require_root("pooled_runs_get_and_report_their_own_cpu_quota") {
        return;
    }
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(helper())
        .warm_pool(1)
        .build()
        .expect("sandbox");
    let run_with = |cpus: f64| -> (Option<i64>, String) {
        let mut caps = Caps::new();
        caps.limits.cpus = cpus;
        std::thread::scope(|scope| {
            let runner = scope.spawn(|| sandbox.run(&sh("sleep 1"), &caps).expect("run"));
            let mut quota = None;
            eventually(std::time::Duration::from_secs(5), || {
                quota = quota_of_the_sleeping_run();
                quota.is_some()
            });
            let out = runner.join().expect("runner");
            let detail = out
                .receipt
                .enforced_for(strata::Capability::Cpu)
                .map(|e| e.detail.clone())
                .collect::<Vec<_>>()
                .join("; ");
            (quota, detail)
        })
    };
    for _ in 0..2 {
        let (half, half_receipt) = run_with(0.5);
        let (two, two_receipt) = run_with(2.0);
        assert_eq!(half, Some(50_000), "0.5 cpus: {half_receipt}");
        assert!(half_receipt.contains("0.5 core"), "{half_receipt}");
        assert_eq!(two, Some(200_000), "2 cpus: {two_receipt}");
        assert!(two_receipt.contains("2 core"), "{two_receipt}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn aio_setup_is_refused_so_the_host_keeps_its_global_event_budget() {
    let probe = r#"
import ctypes, ctypes.util
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
r = libc.syscall(206, 65536, ctypes.byref(ctx))
print(r, ctypes.get_errno())
"#;
    let text = ok_stdout(&run(&py(probe), &Caps::new()));
    assert_eq!(text.trim(), "-1 38", "io_setup must fail with ENOSYS");
}

#[test]
fn lease_on_a_granted_file_is_refused_so_host_writers_are_never_blocked() {
    let dir = workspace();
    let file = dir.path().join("shared.txt");
    std::fs::write(&file, "data").expect("write");
    let probe = format!(
        r#"
import fcntl, os
fd = os.open("{f}", os.O_RDONLY)
for name, cmd, arg in [("lease", 1024, fcntl.F_RDLCK), ("dnotify", 1026, 0x80000003)]:
    try:
        fcntl.fcntl(fd, cmd, arg); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
"#,
        f = file.display()
    );
    let text = ok_stdout(&run(&py(&probe), &Caps::new().read_only(dir.path())));
    assert!(text.contains("lease denied 1"), "{text}");
    assert!(text.contains("dnotify denied 1"), "{text}");
}

#[test]
fn inotify_is_refused_so_watches_cannot_see_host_activity_or_exhaust_the_uid() {
    let probe = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.inotify_init1(0), ctypes.get_errno())
"#;
    let text = ok_stdout(&run(&py(probe), &Caps::new()));
    assert_eq!(text.trim(), "-1 38", "inotify_init1 must fail with ENOSYS");
}

#[test]
fn openat2_is_refused_so_modes_go_through_the_filterable_openat() {
    let probe = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
how = (ctypes.c_uint64 * 3)(0o101, 0o4755, 0)
print(libc.syscall(437, -100, b"/tmp/x", ctypes.byref(how), 24), ctypes.get_errno())
"#;
    let text = ok_stdout(&run(&py(probe), &Caps::new()));
    assert_eq!(text.trim(), "-1 38", "openat2 must fail with ENOSYS");
}

#[test]
fn memory_limit_hit_through_kernel_buffers_ends_as_limit_memory_not_internal_failure() {
    if !require_root(
        "memory_limit_hit_through_kernel_buffers_ends_as_limit_memory_not_internal_failure",
    ) {
        return;
    }
    // Socket buffers are charged to the run's memory cgroup but belong to no process: the
    // OOM killer must still pick the tool, and the run must end with the memory limit.
    let probe = r#"
import socket
held = []
while True:
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        while True:
            a.send(b"x" * 65536)
    except BlockingIOError:
        pass
    held.append((a, b))
"#;
    let mut caps = Caps::new().memory("48M".parse().expect("size"));
    caps.limits.open_files = 4096;
    let out = sandbox()
        .run(&py(probe), &caps)
        .expect("the run itself must not fail");
    assert!(
        matches!(
            out.status,
            strata::ExitStatus::Limit {
                limit: LimitKind::Memory,
                ..
            }
        ),
        "{:?}\n{}",
        out.status,
        out.receipt
    );
}

#[test]
fn agent_on_an_unprivileged_embedder_is_refused_strict() {
    // As root this exercises the root path; the unprivileged path runs in
    // unprivileged_embedder_gets_every_promise_or_a_refusal (uid 65534).
    let caps = Caps::new().agent("test-carol");
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(helper())
        .strictness(Strictness::Strict)
        .build()
        .expect("sandbox");
    match sandbox.run(&sh("true"), &caps) {
        Ok(out) => {
            assert!(
                is_root(),
                "only a root embedder can give an agent its own uid"
            );
            assert_eq!(
                out.receipt.identity.expect("identity").source,
                IdentitySource::Agent
            );
        }
        Err(e) => {
            assert!(!is_root(), "{e}");
            assert_eq!(e.kind(), ErrorKind::Unenforceable, "{e}");
            assert!(e.to_string().contains("agent"), "{e}");
        }
    }
}

// ------------------------------------------------- the library as an unprivileged embedder

#[test]
fn unprivileged_embedder_gets_every_promise_or_a_refusal() {
    if !require_root("unprivileged_embedder_gets_every_promise_or_a_refusal") {
        return;
    }
    run_inner_as("unprivileged_embedder_inner", (65534, 65534), &[]);
}

#[test]
#[ignore = "runs as uid 65534 under unprivileged_embedder_gets_every_promise_or_a_refusal"]
fn unprivileged_embedder_inner() {
    assert!(!is_root(), "must run unprivileged");
    let helper = std::env::var("STRATA_INNER_HELPER").expect("run by its outer test");
    let scratch = std::path::PathBuf::from(std::env::var("STRATA_INNER_SCRATCH").expect("scratch"));
    let sandbox = |strictness| {
        Sandbox::builder()
            .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
            .helper(&helper)
            .strictness(strictness)
            .build()
            .expect("sandbox")
    };
    // The issue's memory bomb: eight processes of 200 MiB each under a 256 MiB limit. The
    // limit cannot hold without a cgroup, so the strict run is refused and nothing runs.
    let marker = scratch.join("ran");
    let bomb = sh(&format!(
        "touch {}; for i in 1 2 3 4 5 6 7 8; do {PY} -c 'b=bytearray(200<<20); import time; time.sleep(0.5)' & done; wait",
        marker.display()
    ));
    let mut caps = Caps::new()
        .read_write(&scratch)
        .memory("256M".parse().expect("size"));
    caps.limits.processes = 16;
    let err = sandbox(Strictness::Strict)
        .run(&bomb, &caps)
        .expect_err("strict must refuse");
    assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");
    for named in ["memory", "pids", "cpu"] {
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
    assert!(
        !marker.exists(),
        "the tool ran although the run was refused"
    );
    // Best effort: runs as the embedder's own uid, and the receipt says what did not hold.
    let out = sandbox(Strictness::BestEffort)
        .run(&sh("id -u"), &Caps::new().agent("test-dave"))
        .expect("best effort runs");
    assert_eq!(ok_stdout(&out).trim(), "65534");
    let id = out.receipt.identity.clone().expect("identity");
    assert_eq!(id.source, IdentitySource::Embedder);
    assert_eq!(id.host_uid, 65534);
    for capability in [
        strata::Capability::Memory,
        strata::Capability::Pids,
        strata::Capability::Cpu,
        strata::Capability::Privileges,
    ] {
        assert!(
            out.receipt.gaps.iter().any(|g| g.capability == capability),
            "{capability:?} gap: {}",
            out.receipt
        );
    }
}

/// A system user with subordinate ids (`/etc/subuid`, `/etc/subgid`), created once:
/// returns its uid, gid and the first subordinate id.
fn user_with_subordinate_ids() -> (u32, u32, u32) {
    const NAME: &str = "strata-subid";
    const FIRST: u32 = 3_000_000;
    let sh = |cmd: &str| {
        let status = std::process::Command::new("sh")
            .args(["-c", cmd])
            .status()
            .expect("sh");
        assert!(status.success(), "{cmd} failed");
    };
    sh(&format!(
        "id -u {NAME} >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin {NAME}"
    ));
    for file in ["/etc/subuid", "/etc/subgid"] {
        let table = std::fs::read_to_string(file).unwrap_or_default();
        if !table.lines().any(|l| l.starts_with(&format!("{NAME}:"))) {
            sh(&format!("echo {NAME}:{FIRST}:65536 >> {file}"));
        }
    }
    let id = |flag: &str| -> u32 {
        let out = std::process::Command::new("id")
            .args([flag, NAME])
            .output()
            .expect("id");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("numeric id")
    };
    (id("-u"), id("-g"), FIRST)
}

#[test]
fn unprivileged_embedder_with_subordinate_ids_gives_each_agent_its_own_uid() {
    if !require_root("unprivileged_embedder_with_subordinate_ids_gives_each_agent_its_own_uid") {
        return;
    }
    assert!(
        Path::new("/usr/bin/newuidmap").exists(),
        "needs newuidmap (apt-get install uidmap; scripts/deps.sh installs it)"
    );
    let (uid, gid, first) = user_with_subordinate_ids();
    run_inner_as(
        "subordinate_ids_inner",
        (uid, gid),
        &[("STRATA_INNER_FIRST_ID", first.to_string())],
    );
}

#[test]
#[ignore = "runs as a user with subordinate ids under unprivileged_embedder_with_subordinate_ids_gives_each_agent_its_own_uid"]
fn subordinate_ids_inner() {
    assert!(!is_root(), "must run unprivileged");
    let helper = std::env::var("STRATA_INNER_HELPER").expect("run by its outer test");
    let scratch = std::path::PathBuf::from(std::env::var("STRATA_INNER_SCRATCH").expect("dir"));
    let first: u32 = std::env::var("STRATA_INNER_FIRST_ID")
        .expect("first id")
        .parse()
        .expect("number");
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(&helper)
        .strictness(Strictness::BestEffort) // no cgroup for this user: limits are gaps
        .build()
        .expect("sandbox");
    let ws = scratch.join("ws");
    std::fs::create_dir(&ws).expect("mkdir");
    let run_as = |agent: Option<&str>, code: &str| {
        let mut caps = Caps::new().read_write(&ws);
        caps.agent = agent.map(str::to_string);
        let out = sandbox.run(&sh(code), &caps).expect("run");
        assert!(out.success(), "{}\n{}", stderr(&out), out.receipt);
        out
    };
    let w = ws.display();
    let alice = run_as(
        Some("alice"),
        &format!("touch {w}/made; umask 077; mkdir {w}/alice; echo secret > {w}/alice/s"),
    );
    let id = alice.receipt.identity.clone().expect("identity");
    assert_eq!(id.source, IdentitySource::Agent, "{}", alice.receipt);
    assert!(
        (first..first + 65536).contains(&id.host_uid),
        "{} is not a subordinate id",
        id.host_uid
    );
    // (The embedder itself cannot look inside alice's private directory: it is not root.)
    let meta = std::fs::metadata(ws.join("made")).expect("created");
    assert_eq!(meta.uid(), id.host_uid, "the file belongs to alice's uid");
    let bob = run_as(
        Some("bob"),
        &format!("cat {w}/alice/s 2>/dev/null && echo READ; touch {w}/alice/x 2>/dev/null && echo WROTE; true"),
    );
    assert_ne!(
        bob.receipt.identity.clone().expect("identity").host_uid,
        id.host_uid
    );
    assert_eq!(stdout(&bob), "", "bob reached alice's files");
    assert!(!ws.join("alice/x").exists());
    let fresh = run_as(None, "true").receipt.identity.expect("identity");
    assert_eq!(fresh.source, IdentitySource::Fresh);
    assert_ne!(fresh.host_uid, id.host_uid);
}

#[test]
fn configured_id_range_is_where_tools_run() {
    if !require_root("configured_id_range_is_where_tools_run") {
        return;
    }
    let range = strata::IdRange {
        uid_base: 1_800_000_000,
        gid_base: 1_810_000_000,
        count: 1024,
    };
    let sandbox = Sandbox::builder()
        .backend(strata::BackendChoice::Only(strata::BackendKind::Process))
        .helper(helper())
        .id_range(range)
        .build()
        .expect("sandbox");
    let id = |caps: Caps| {
        sandbox
            .run(&sh("true"), &caps)
            .expect("run")
            .receipt
            .identity
            .expect("identity")
    };
    let agent = id(Caps::new().agent("test-ranged"));
    let fresh = id(Caps::new());
    for ids in [&agent, &fresh] {
        assert!(
            (1_800_000_000..1_800_001_024).contains(&ids.host_uid),
            "{ids:?}"
        );
        assert!(
            (1_810_000_000..1_810_001_024).contains(&ids.host_gid),
            "{ids:?}"
        );
    }
    assert!(agent.host_uid < 1_800_000_512, "agents take the lower half");
    assert!(fresh.host_uid >= 1_800_000_512, "fresh ids the upper half");
}
