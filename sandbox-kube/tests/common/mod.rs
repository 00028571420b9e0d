//! Shared by the integration tests: where the pinned agent-sandbox data is, loaded once.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use sandbox_kube::check::{Pinned, DIR_ENV};

/// The pinned data's directory: `$STRATA_AGENT_SANDBOX_DIR`, else the workspace's
/// `../shared/k8s/agent-sandbox` when it exists, else the copy in `tests/data/agent-sandbox`
/// (what a fresh clone has).
pub fn pinned_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(DIR_ENV) {
        return PathBuf::from(dir);
    }
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let shared = manifest.join("../../shared/k8s/agent-sandbox");
    if shared.is_dir() {
        return shared;
    }
    manifest.join("tests/data/agent-sandbox")
}

/// The in-repository copy of the pinned data.
pub fn copy_dir() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("tests/data/agent-sandbox")
}

/// The pinned data, loaded once per test binary.
pub fn pinned() -> &'static Pinned {
    static PINNED: OnceLock<Pinned> = OnceLock::new();
    PINNED.get_or_init(|| {
        let dir = pinned_dir();
        eprintln!("agent-sandbox data from {}", dir.display());
        match Pinned::load(&dir) {
            Ok(p) => p,
            Err(e) => panic!(
                "cannot load the pinned agent-sandbox data from {}: {e}",
                dir.display()
            ),
        }
    })
}
