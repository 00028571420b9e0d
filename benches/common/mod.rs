//! What the process benchmarks share: the sandbox under test and the bwrap baseline.

use std::path::PathBuf;
use std::process::Command;

use strata::{BackendChoice, BackendKind, Sandbox};

/// The `strata-helper` built next to the bench binary (`target/release/`).
pub fn helper() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let deps = exe.parent().expect("deps");
    deps.parent().expect("target").join("strata-helper")
}

/// A process-backend sandbox keeping `warm` pre-built sandboxes per shape (0: cold runs).
pub fn sandbox(warm: usize) -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .warm_pool(warm)
        .build()
        .expect("sandbox")
}

/// A process-backend sandbox with the default configuration (the adaptive warm pool).
#[allow(dead_code)] // process_compare only
pub fn default_sandbox() -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("sandbox")
}

/// `bwrap --unshare-all` running `/bin/true` with the same read-only system view Strata
/// gives by default.
#[allow(dead_code)] // not microvm_compare
pub fn bwrap() -> Command {
    let mut cmd = Command::new("bwrap");
    cmd.args([
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    for link in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(target) = std::fs::read_link(format!("/{link}")) {
            cmd.arg("--symlink").arg(target).arg(format!("/{link}"));
        }
    }
    cmd.args([
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "/bin/true",
    ]);
    cmd
}
