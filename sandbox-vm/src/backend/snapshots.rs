//! Snapshots (boot once per shape, restore per run) and the restorer that keeps the pool
//! of restored VMs topped up.

use super::*;

impl MicrovmBackend {
    pub(super) fn restorer(
        &self,
        artifacts: &GuestArtifacts,
        snap: &Snapshot,
        shape: Shape,
    ) -> Restorer {
        Restorer {
            vmm: Arc::clone(&self.vmm),
            pool: Arc::clone(&self.pool),
            console_cap: self.console_cap,
            ready_timeout: self.ready_timeout,
            artifacts: artifacts.clone(),
            snap: snap.clone(),
            shape,
        }
    }

    /// The snapshot for `shape`, made now (one cold boot) if there is none yet.
    pub(super) fn snapshot(&self, artifacts: &GuestArtifacts, shape: Shape) -> Result<Snapshot> {
        let store = Self::store();
        let tools = Self::tools_disk(artifacts)?;
        let qemu = which("qemu-system-x86_64");
        let mut inputs: Vec<&Path> = vec![
            &artifacts.kernel,
            &artifacts.initramfs,
            &tools.path,
            &artifacts.rootfs,
        ];
        if let Some(qemu) = &qemu {
            inputs.push(qemu);
        }
        let extra = format!(
            "protocol {} vmm {} args {} slots {} x {}",
            sandbox_agent::protocol::PROTOCOL_VERSION,
            self.vmm.name(),
            crate::qemu::Qemu::kernel_args(),
            grants::SLOTS,
            grants::SLOT_CAPACITY
        );
        let key = snapshot::key(shape, &inputs, &extra);
        snapshot::get_or_make(&store, &key, shape, |snap| {
            let mut config = self.base_config(artifacts, &snap.dir, shape)?;
            if shape.network {
                config.network = Some(NetRelay {
                    program: artifacts.agent.clone(),
                    socket: snap.dir.join("egress.sock"),
                });
            }
            // Placeholders are writable here (no grant is mounted while the snapshot is
            // taken, so nothing writes them): a restored slot may then be read-only or
            // read-write, since a read-only disk only adds a feature the guest did not
            // negotiate.
            config.disks.extend((0..grants::SLOTS).map(|i| Disk {
                path: snap.placeholder.clone(),
                read_only: false,
                serial: grants::slot_serial(i),
            }));
            // QEMU locks the images it writes: each slot gets its own empty sparse file.
            for (i, disk) in config.disks.iter_mut().skip(FIXED_DISKS).enumerate() {
                let slot = snap.dir.join(format!("slot{i}.img"));
                sandbox_os::private::create(&slot)
                    .and_then(|f| f.set_len(grants::SLOT_CAPACITY))
                    .map_err(|e| {
                        Error::setup(SetupStage::Snapshot, "microvm: placeholder disk", e)
                    })?;
                disk.path = slot;
            }
            let mut vm = self.vmm.start(&config)?;
            let started = Instant::now();
            let ready = session::wait_ready(
                vm.as_mut(),
                started + self.ready_timeout,
                self.ready_timeout,
                &RunContext::default(),
            );
            let saved = ready.and_then(|()| vm.save(&snap.state));
            vm.teardown();
            for i in 0..grants::SLOTS {
                let _ = std::fs::remove_file(snap.dir.join(format!("slot{i}.img")));
            }
            for socket in ["agent.sock", "qmp.sock"] {
                let _ = std::fs::remove_file(snap.dir.join(socket));
            }
            saved
        })
    }
}

/// Restores pooled VMs (on a background thread after a run took one).
pub(super) struct Restorer {
    pub(super) vmm: Arc<dyn Vmm>,
    pub(super) pool: Arc<Pool>,
    pub(super) console_cap: usize,
    pub(super) ready_timeout: Duration,
    pub(super) artifacts: GuestArtifacts,
    pub(super) snap: Snapshot,
    pub(super) shape: Shape,
}

impl Restorer {
    /// Restores one VM into the pool; `false` when that failed.
    pub(super) fn restore_one(&self) -> bool {
        let empty = RunDisks {
            grants: Vec::new(),
            input: None,
            network: None,
        };
        let pooled = pool::restore(&self.vmm, self.shape, self.ready_timeout, |dir| {
            restore_config(
                self.console_cap,
                &self.artifacts,
                &self.snap,
                dir,
                self.shape,
                &empty,
            )
            .ok()
        });
        match pooled {
            Some(pooled) => {
                self.pool.put(pooled);
                true
            }
            None => false,
        }
    }
}
