//! Where the guest comes from: the kernel, initramfs and root image built by
//! `scripts/build-vm-guest.sh`, and the guest tools disk: an ext4 image (built here, cached)
//! holding `strata-guest-agent` and, when found next to it, the `strata` CLI and
//! `strata-helper`, which the agent uses to run tools under the process, container and wasm
//! backends inside the guest.

use std::path::{Path, PathBuf};

/// The agent binary's file name.
pub const AGENT_NAME: &str = "strata-guest-agent";

/// The binaries the guest runs tools with, looked for next to the agent: the CLI and the
/// process backend's helper.
pub const INNER_TOOLS: [&str; 2] = ["strata", "strata-helper"];

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
    /// `strata` and `strata-helper` for the layers inside the guest, when both were found
    /// next to the agent.
    pub inner: Option<[PathBuf; 2]>,
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
        // Normalized (the jail refuses `..` in granted paths).
        let dir = std::fs::canonicalize(&dir)
            .map_err(|e| format!("guest directory {}: {e}: {BUILD_HINT}", dir.display()))?;
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
        let inner = agent.parent().and_then(|dir| {
            let [cli, helper] = INNER_TOOLS.map(|name| dir.join(name));
            (cli.is_file() && helper.is_file()).then_some([cli, helper])
        });
        Ok(GuestArtifacts {
            kernel,
            initramfs,
            kernel_version,
            rootfs,
            rootfs_version,
            agent,
            inner,
        })
    }

    /// The guest tools disk under `store` (built on first use, then reused while the
    /// binaries are unchanged; older ones are removed): the agent, and `strata` and
    /// `strata-helper` when found.
    ///
    /// # Errors
    /// When the binaries cannot be copied or `mke2fs` fails.
    pub fn tools_image(&self, store: &Path) -> std::io::Result<PathBuf> {
        use std::hash::{Hash, Hasher};
        let mut files = vec![self.agent.clone()];
        if let Some(inner) = &self.inner {
            files.extend(inner.iter().cloned());
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for file in &files {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(file)?;
            (
                file,
                meta.len(),
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ino(),
            )
                .hash(&mut hasher);
        }
        let name = format!("tools-{:016x}.ext4", hasher.finish());
        let image = store.join(&name);
        if image.is_file() {
            return Ok(image);
        }
        std::fs::create_dir_all(store)?;
        let staging = tempfile::Builder::new()
            .prefix("tools-")
            .tempdir_in(store)?;
        let mut bytes = 0;
        for file in &files {
            let to = staging.path().join(file.file_name().unwrap_or_default());
            bytes += std::fs::copy(file, &to)?;
        }
        let partial = store.join(format!("{name}.partial-{}", std::process::id()));
        let mib = bytes / (1 << 20) + bytes / (4 << 20) + 8;
        let out = std::process::Command::new(crate::grants::mke2fs_path()?)
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-O",
                "^has_journal,^resize_inode",
                "-m",
                "0",
            ])
            .args(["-E", "root_owner=0:0", "-L", "strata-tools", "-d"])
            .arg(staging.path())
            .arg(&partial)
            .arg(format!("{mib}M"))
            .env_clear()
            .output()?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&partial);
            return Err(std::io::Error::other(format!(
                "mke2fs (guest tools): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::rename(&partial, &image)?;
        for entry in std::fs::read_dir(store)?.flatten() {
            let old = entry.file_name().to_string_lossy().into_owned();
            if old.starts_with("tools-") && old.ends_with(".ext4") && old != name {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(image)
    }
}

fn find_agent() -> Result<PathBuf, String> {
    sandbox_core::binary::locate(
        AGENT_NAME,
        "STRATA_VM_AGENT",
        "build it with cargo build -p sandbox-agent, set STRATA_VM_AGENT, or pass its path to MicrovmBackend::with_agent",
    )
}
