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

/// Runs `inner` (an ignored test of this binary, with a reason) as `uid`/`gid`, with copies of this
/// test binary and the helper in a directory that user can enter and a scratch directory
/// (`STRATA_INNER_SCRATCH`, also `HOME`) it owns; `env` is passed on.
pub fn run_inner_as(inner: &str, (uid, gid): (u32, u32), env: &[(&str, String)]) {
    let bins = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        bins.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let exe = bins.path().join("inner-tests");
    let helper_copy = bins.path().join("strata-helper");
    std::fs::copy(std::env::current_exe().expect("exe"), &exe).expect("copy test binary");
    std::fs::copy(helper(), &helper_copy).expect("copy helper");
    let scratch = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(scratch.path(), Some(uid), Some(gid)).expect("chown");
    let out = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
        ])
        .arg(&exe)
        .args([
            "--exact",
            inner,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("STRATA_INNER_HELPER", &helper_copy)
        .env("STRATA_INNER_SCRATCH", scratch.path())
        .env("HOME", scratch.path())
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .expect("setpriv");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{inner} as uid {uid} failed:\n{text}");
    assert!(text.contains("1 passed"), "{inner} did not run:\n{text}");
}
