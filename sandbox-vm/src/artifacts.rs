//! Where the guest comes from: the kernel and base initramfs built by
//! `scripts/build-vm-guest.sh`, and the `strata-guest-agent` binary.

use std::path::{Path, PathBuf};

use crate::initramfs::{agent_segment, AGENT_PATH};

/// The agent binary's file name.
pub const AGENT_NAME: &str = "strata-guest-agent";

/// The command that builds the guest artifacts, for error messages.
pub const BUILD_HINT: &str =
    "run scripts/build-vm-guest.sh (or set STRATA_VM_GUEST_DIR to its output directory)";

/// A located, readable guest.
#[derive(Clone, Debug)]
pub struct GuestArtifacts {
    /// The guest kernel (`vmlinuz`).
    pub kernel: PathBuf,
    /// The base initramfs (`initramfs.cpio.gz`), without the agent.
    pub initramfs: PathBuf,
    /// The kernel release, from `kernel-version`.
    pub kernel_version: String,
    /// The read-only root file system image (`rootfs.ext4`: python3 and busybox).
    pub rootfs: PathBuf,
    /// What the root file system holds (`python3=3.11.2-1+b1, ...`, from `rootfs-version`).
    pub rootfs_version: String,
    /// The guest agent binary.
    pub agent: PathBuf,
}

impl GuestArtifacts {
    /// Finds the guest: `guest_dir`, else `$STRATA_VM_GUEST_DIR`, else the repository's
    /// `.ci/cache/vm` (a development checkout); the agent: `agent`, else
    /// `$STRATA_VM_AGENT`, else next to the running executable (or its parent for test
    /// binaries under `deps/`).
    ///
    /// # Errors
    /// A message naming what is missing and the command that builds it.
    pub fn locate(guest_dir: Option<&Path>, agent: Option<&Path>) -> Result<Self, String> {
        let dir = match guest_dir {
            Some(dir) => dir.to_path_buf(),
            None => match std::env::var_os("STRATA_VM_GUEST_DIR") {
                Some(dir) => PathBuf::from(dir),
                None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/cache/vm"),
            },
        };
        let kernel = dir.join("vmlinuz");
        let initramfs = dir.join("initramfs.cpio.gz");
        let rootfs = dir.join("rootfs.ext4");
        for path in [&kernel, &initramfs, &rootfs] {
            if !path.is_file() {
                return Err(format!(
                    "guest artifact {} is missing: {BUILD_HINT}",
                    path.display()
                ));
            }
        }
        let kernel_version = std::fs::read_to_string(dir.join("kernel-version"))
            .map_err(|e| format!("{}/kernel-version: {e}: {BUILD_HINT}", dir.display()))?
            .trim()
            .to_string();
        let rootfs_version = std::fs::read_to_string(dir.join("rootfs-version"))
            .map_err(|e| format!("{}/rootfs-version: {e}: {BUILD_HINT}", dir.display()))?
            .lines()
            .filter(|l| l.starts_with("python3=") || l.starts_with("busybox-static="))
            .collect::<Vec<_>>()
            .join(", ");
        let agent = match agent {
            Some(path) => path.to_path_buf(),
            None => find_agent()?,
        };
        if !agent.is_file() {
            return Err(format!(
                "guest agent {} is missing (cargo build -p sandbox-vm --bin {AGENT_NAME})",
                agent.display()
            ));
        }
        Ok(GuestArtifacts {
            kernel,
            initramfs,
            kernel_version,
            rootfs,
            rootfs_version,
            agent,
        })
    }

    /// The initramfs as booted: the agent as an uncompressed cpio segment, then the base
    /// archive.
    ///
    /// # Errors
    /// When a file cannot be read.
    pub fn boot_initrd(&self) -> std::io::Result<Vec<u8>> {
        let agent = std::fs::read(&self.agent)?;
        let mut initrd = agent_segment(AGENT_PATH, &agent)?;
        initrd.extend(std::fs::read(&self.initramfs)?);
        Ok(initrd)
    }
}

fn find_agent() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("STRATA_VM_AGENT") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the running executable: {e}"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(AGENT_NAME));
        if dir.file_name().is_some_and(|n| n == "deps") {
            if let Some(up) = dir.parent() {
                candidates.push(up.join(AGENT_NAME));
            }
        }
    }
    candidates.into_iter().find(|c| c.is_file()).ok_or_else(|| {
        format!(
            "{AGENT_NAME} not found next to {} (build it with cargo build -p sandbox-vm, set STRATA_VM_AGENT, or pass its path to MicrovmBackend::with_agent)",
            exe.display()
        )
    })
}
