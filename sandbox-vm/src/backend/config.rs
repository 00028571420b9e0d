//! The VM's devices: the root and tools disks, a cold boot's and a restore's configuration,
//! a run's own disks.

use super::*;

impl MicrovmBackend {
    pub(super) fn root_disk(artifacts: &GuestArtifacts) -> Disk {
        Disk {
            path: artifacts.rootfs.clone(),
            read_only: true,
            serial: ROOT_SERIAL.into(),
        }
    }

    /// Where snapshots and the guest tools disk are kept.
    pub(super) fn store() -> PathBuf {
        match probe::state_dir() {
            Some(dir) => dir.join("microvm-snapshots"),
            None => std::env::temp_dir().join(format!(
                "strata-microvm-snapshots-{}",
                rustix::process::geteuid().as_raw()
            )),
        }
    }

    pub(super) fn tools_disk(artifacts: &GuestArtifacts) -> Result<Disk> {
        let path = artifacts.tools_image(&Self::store()).map_err(|e| {
            Error::setup(
                SetupStage::Host,
                "microvm: building the guest tools disk",
                e,
            )
        })?;
        Ok(Disk {
            path,
            read_only: true,
            serial: TOOLS_SERIAL.into(),
        })
    }

    pub(super) fn base_config(
        &self,
        artifacts: &GuestArtifacts,
        dir: &Path,
        shape: Shape,
    ) -> Result<VmConfig> {
        base_config(self.console_cap, artifacts, dir, shape)
    }

    /// A VM booted from scratch with `grants` (the disks of [`grants::prepare`]).
    pub(super) fn cold_config(
        &self,
        artifacts: &GuestArtifacts,
        dir: &Path,
        shape: Shape,
        grants: Vec<Disk>,
    ) -> Result<VmConfig> {
        let mut config = self.base_config(artifacts, dir, shape)?;
        config.disks.extend(grants);
        Ok(config)
    }
}

/// The devices every VM has: kernel, initramfs, root and tools disks, the agent channel.
pub(super) fn base_config(
    console_cap: usize,
    artifacts: &GuestArtifacts,
    dir: &Path,
    shape: Shape,
) -> Result<VmConfig> {
    Ok(VmConfig {
        kernel: artifacts.kernel.clone(),
        initrd: artifacts.initramfs.clone(),
        disks: vec![
            MicrovmBackend::root_disk(artifacts),
            MicrovmBackend::tools_disk(artifacts)?,
        ],
        memory_mib: shape.memory_mib,
        vcpus: shape.vcpus,
        accel: shape.accel,
        dir: dir.to_path_buf(),
        console_cap,
        connect_timeout: Duration::from_secs(10),
        network: None,
        incoming: None,
    })
}

/// A VM restored from `snap` with `grants` in the first slots and `input` in the last.
pub(super) fn restore_config(
    console_cap: usize,
    artifacts: &GuestArtifacts,
    snap: &Snapshot,
    dir: &Path,
    shape: Shape,
    disks: &RunDisks,
) -> Result<VmConfig> {
    let mut config = base_config(console_cap, artifacts, dir, shape)?;
    config.incoming = Some(snap.state.clone());
    config.network = disks.network.clone();
    let placeholder = |i: usize| Disk {
        path: snap.placeholder.clone(),
        read_only: true,
        serial: grants::slot_serial(i),
    };
    for i in 0..grants::MAX_GRANTS {
        config.disks.push(
            disks
                .grants
                .get(i)
                .cloned()
                .unwrap_or_else(|| placeholder(i)),
        );
    }
    config.disks.push(
        disks
            .input
            .clone()
            .unwrap_or_else(|| placeholder(grants::MAX_GRANTS)),
    );
    Ok(config)
}

/// A run's own devices: its grants, the input disk of the layer inside, its network.
pub(super) struct RunDisks {
    pub(super) grants: Vec<Disk>,
    pub(super) input: Option<Disk>,
    pub(super) network: Option<NetRelay>,
}

impl RunDisks {
    pub(super) fn all(&self) -> Vec<Disk> {
        self.grants.iter().chain(&self.input).cloned().collect()
    }
}
