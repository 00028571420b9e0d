//! What the live-sandbox tests share: the CLI pointed at a private state directory that
//! stops what is left on drop, and ways to find a test's processes on the host.
#![allow(dead_code)] // each test crate uses its own part of this

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn exe() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_strata"));
    for sibling in ["strata-helper", "strata-live"] {
        let path = exe.with_file_name(sibling);
        assert!(
            path.exists(),
            "{} is missing: build the workspace binaries (cargo build --workspace --bins)",
            path.display()
        );
    }
    exe
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A private state directory and the CLI pointed at it; stops what is left on drop.
pub struct Live {
    state: tempfile::TempDir,
}

impl Live {
    pub fn new() -> Live {
        let state = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(
            state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("chmod");
        Live { state }
    }

    /// The sandbox directories left in the state directory (the identity registry of
    /// `strata run` may share it).
    pub fn sandbox_dirs(&self) -> Vec<String> {
        std::fs::read_dir(self.state.path())
            .expect("state")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("sb-"))
            .collect()
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// The snapshot store of this test's CLI (`STRATA_SNAPSHOT_DIR`), in the state directory.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.state.path().join("snapshots")
    }

    pub fn strata(&self, args: &[&str]) -> Output {
        Command::new(exe())
            .args(args)
            .env("STRATA_STATE_DIR", self.state.path())
            .env("STRATA_SNAPSHOT_DIR", self.snapshot_dir())
            .output()
            .expect("run strata")
    }

    pub fn start(&self, extra: &[&str]) -> String {
        let mut args = vec!["start"];
        args.extend_from_slice(extra);
        let out = self.strata(&args);
        assert!(out.status.success(), "start: {}", text(&out.stderr));
        let id = text(&out.stdout);
        assert!(
            id.ends_with('\n') && id.lines().count() == 1,
            "only the id: {id:?}"
        );
        id.trim().to_string()
    }

    pub fn ids(&self) -> Vec<String> {
        let out = self.strata(&["ls", "--json"]);
        assert!(out.status.success(), "ls: {}", text(&out.stderr));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ls json");
        list.as_array()
            .expect("array")
            .iter()
            .map(|s| s["id"].as_str().expect("id").to_string())
            .collect()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Never panics (a failed test is unwinding through here): stops whatever is left.
        let _ = std::fs::set_permissions(
            self.state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        );
        for id in self.sandbox_dirs() {
            let _ = self.strata(&["stop", &id]);
        }
    }
}

/// Host processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if text(&cmdline).replace('\0', " ").contains(marker) {
                found.push(pid);
            }
        }
    }
    found
}

/// A unique `sleep` argument to find a test's processes by.
pub fn marker() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("1000.{}{}", std::process::id(), nanos % 100_000)
}

pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn nix_root() -> bool {
    rustix_uid() == 0
}

pub fn rustix_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
