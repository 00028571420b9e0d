//! Shared harness for the cross-backend and escape suites: sandboxes, probes and canaries.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata::{BackendChoice, BackendKind, Caps, RunOutput, Sandbox, Tool};

/// Debian's interpreter (the `python3` first on PATH may be a slow pyenv shim).
pub const PY: &str = "/usr/bin/python3";

/// The helper binary cargo built for this test run.
pub fn helper() -> &'static str {
    env!("CARGO_BIN_EXE_strata-helper")
}

/// A process-backend sandbox using this build's helper.
pub fn sandbox() -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("process backend is compiled in")
}

/// A Python probe run as a command (`python3 -c CODE`).
pub fn py(code: &str) -> Tool {
    Tool::command([PY, "-c", code])
}

/// A shell probe.
pub fn sh(code: &str) -> Tool {
    Tool::command(["/bin/sh", "-c", code])
}

/// Runs and panics on a refused run, printing the error.
pub fn run(tool: &Tool, caps: &Caps) -> RunOutput {
    match sandbox().run(tool, caps) {
        Ok(out) => out,
        Err(e) => panic!("run of {} was refused: {e}", tool.describe()),
    }
}

/// Stdout as text.
pub fn stdout(out: &RunOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(out: &RunOutput) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a successful run and returns stdout.
pub fn ok_stdout(out: &RunOutput) -> String {
    assert!(
        out.success(),
        "expected success, got {}; stdout={:?} stderr={:?}",
        out.status,
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// Whether this test process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Tests that need root fail loudly without it, unless STRATA_SKIP_ROOT_TESTS=1 asks to
/// skip them, which is printed.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    if std::env::var_os("STRATA_SKIP_ROOT_TESTS").is_some() {
        eprintln!("SKIPPED {test}: needs root (STRATA_SKIP_ROOT_TESTS is set)");
        return false;
    }
    panic!("{test} needs root; run the suite as root (.ci/run does) or set STRATA_SKIP_ROOT_TESTS=1 to skip it loudly");
}

/// A host directory with a secret file, removed on drop.
pub struct Canary {
    pub dir: tempfile::TempDir,
    pub secret: PathBuf,
}

pub const SECRET: &str = "canary-7f3a9c-do-not-leak";

impl Canary {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("strata-canary")
            .tempdir()
            .expect("tempdir");
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, SECRET).expect("write canary");
        Canary { dir, secret }
    }

    pub fn intact(&self) -> bool {
        std::fs::read_to_string(&self.secret).is_ok_and(|s| s == SECRET)
    }
}

/// A TCP listener on the host's loopback that records whether anything connected.
pub struct Listener {
    pub port: u16,
    pub hit: Arc<AtomicBool>,
}

impl Listener {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let hit = Arc::new(AtomicBool::new(false));
        let flag = hit.clone();
        std::thread::spawn(move || {
            for _ in 0..600 {
                if let Ok((mut stream, _)) = listener.accept() {
                    flag.store(true, Ordering::SeqCst);
                    let _ = stream.write_all(b"canary");
                    let mut buf = [0u8; 16];
                    let _ = stream.read(&mut buf);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Listener { port, hit }
    }

    pub fn was_hit(&self) -> bool {
        std::thread::sleep(Duration::from_millis(100));
        self.hit.load(Ordering::SeqCst)
    }
}

/// Pids of host processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmdline).contains(marker) && pid != std::process::id() {
                found.push(pid);
            }
        }
    }
    found
}

/// Waits up to `timeout` for `f` to hold.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// The path of the `strata` CLI binary built next to the helper.
pub fn cli() -> PathBuf {
    let dir = Path::new(helper())
        .parent()
        .expect("target dir")
        .to_path_buf();
    dir.join("strata")
}

/// Run cgroups (`run-PID-N`) of embedding process `pid` anywhere under /sys/fs/cgroup.
pub fn run_cgroups_of(pid: u32) -> usize {
    let prefix = format!("run-{pid}-");
    let mut count = 0;
    let mut stack = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() || path.is_symlink() {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                count += 1;
            } else if path.components().count() < 12 {
                stack.push(path);
            }
        }
    }
    count
}

/// A pipe (read end, write end), both close-on-exec.
pub fn pipe() -> (std::fs::File, std::fs::File) {
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

/// Copies of this test binary and the helper in a directory any user can enter, and a
/// scratch directory owned by `uid`/`gid` (kept alive by the returned guards).
struct InnerFiles {
    bins: tempfile::TempDir,
    scratch: tempfile::TempDir,
}

impl InnerFiles {
    fn new((uid, gid): (u32, u32)) -> Self {
        let bins = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(
            bins.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        std::fs::copy(
            std::env::current_exe().expect("exe"),
            bins.path().join("inner-tests"),
        )
        .expect("copy test binary");
        std::fs::copy(helper(), bins.path().join("strata-helper")).expect("copy helper");
        let scratch = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::chown(scratch.path(), Some(uid), Some(gid)).expect("chown");
        InnerFiles { bins, scratch }
    }

    /// Adds what runs `inner` from the copies to `command` (whose program is, or ends in,
    /// [`InnerFiles::exe`]): the test's arguments, `env` and the harness's variables
    /// (`STRATA_INNER_HELPER`, `STRATA_INNER_SCRATCH`, `HOME`).
    fn add_inner(&self, command: &mut std::process::Command, inner: &str, env: &[(&str, String)]) {
        command
            .args([
                "--exact",
                inner,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                "STRATA_INNER_HELPER",
                self.bins.path().join("strata-helper"),
            )
            .env("STRATA_INNER_SCRATCH", self.scratch.path())
            .env("HOME", self.scratch.path())
            .envs(env.iter().map(|(k, v)| (*k, v)));
    }

    fn exe(&self) -> PathBuf {
        self.bins.path().join("inner-tests")
    }
}

/// Checks what the inner test printed: it passed, and it ran.
fn inner_passed(inner: &str, how: &str, out: &std::process::Output) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{inner} {how} failed:\n{text}");
    assert!(text.contains("1 passed"), "{inner} did not run:\n{text}");
}

/// Runs `inner` (an ignored test of this binary, with a reason) as `uid`/`gid`, with copies of this
/// test binary and the helper in a directory that user can enter and a scratch directory
/// (`STRATA_INNER_SCRATCH`, also `HOME`) it owns; `env` is passed on.
pub fn run_inner_as(inner: &str, (uid, gid): (u32, u32), env: &[(&str, String)]) {
    let files = InnerFiles::new((uid, gid));
    let mut command = std::process::Command::new("setpriv");
    command
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
        ])
        .arg(files.exe());
    files.add_inner(&mut command, inner, env);
    let out = command.output().expect("setpriv");
    inner_passed(inner, &format!("as uid {uid}"), &out);
}

/// Like [`run_inner_as`], on a host without user namespaces, made without touching the
/// host's settings (issue 33): the inner test runs in a user namespace made by root whose
/// maps hold 0 and `uid`/`gid` (each mapped to itself), where its root first sets
/// `user.max_user_namespaces` to 0 (for that namespace and everything below it) and then
/// drops to `uid`/`gid`. Nothing it starts can create a user namespace (`ENOSPC`).
pub fn run_inner_without_userns(inner: &str, (uid, gid): (u32, u32), env: &[(&str, String)]) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let files = InnerFiles::new((uid, gid));
    let mut command = std::process::Command::new(files.exe());
    files.add_inner(&mut command, inner, env);
    let (mut ready_read, ready_write) = pipe();
    let (go_read, mut go_write) = pipe();
    let (ready_fd, go_fd) = (ready_write.as_raw_fd(), go_read.as_raw_fd());
    // The child unshares its user namespace and waits; this thread (root outside) writes its
    // maps, which a process inside cannot do for ids other than its own.
    let mapper = std::thread::spawn(move || -> std::io::Result<()> {
        let mut pid = [0u8; 4];
        ready_read.read_exact(&mut pid)?;
        let pid = i32::from_ne_bytes(pid);
        std::fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("0 0 1\n{uid} {uid} 1\n"),
        )?;
        std::fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("0 0 1\n{gid} {gid} 1\n"),
        )?;
        go_write.write_all(b"g")
    });
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (unshare, getpid, read, write, open, close, setgroups,
    // setresgid, setresuid) on buffers it owns; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return fail();
            }
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(ready_fd, pid.as_ptr().cast(), pid.len()) != 4 {
                return fail();
            }
            let mut go = [0u8; 1];
            if libc::read(go_fd, go.as_mut_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::other("the id maps were not written"));
            }
            let limit = libc::open(
                c"/proc/sys/user/max_user_namespaces".as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            );
            if limit < 0 || libc::write(limit, b"0".as_ptr().cast(), 1) != 1 {
                return fail();
            }
            libc::close(limit);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
            {
                return fail();
            }
            Ok(())
        });
    }
    let out = command.output();
    // A child that failed before it wrote its pid leaves the thread reading: end its pipe.
    drop(ready_write);
    let out = out.expect("run the inner test in its user namespace");
    mapper
        .join()
        .expect("mapper thread")
        .expect("write the id maps");
    inner_passed(
        inner,
        &format!("as uid {uid} without user namespaces"),
        &out,
    );
}
