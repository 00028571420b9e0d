//! A VM held for a live sandbox: planned like a run without the layer inside (the VM is
//! the sandbox; execs run as the guest's root), booted or restored, its agent opened in
//! live mode, and its receipt.

use super::*;
use crate::live::{LiveParts, LiveVm};

impl MicrovmBackend {
    /// Starts a live sandbox for `spec` (planned for [`BackendKind::Microvm`]): one VM whose
    /// agent starts one exec after another until [`LiveVm::stop`]. Its receipt is built from
    /// what the agent read back, like a run's.
    ///
    /// File grants are disk images as for a run: read-only ones a copy taken at start,
    /// read-write ones a private copy written back through the grants' filter when the
    /// sandbox stops (not before). Limits: no images or secrets yet; execs run directly as
    /// the guest's root (no sandbox inside the guest), so `limits.processes` is a gap; the
    /// VMM's jail ends it after 24 hours at the latest.
    ///
    /// # Errors
    /// As a run before anything runs: unenforceable or unavailable requests, a missing
    /// guest, the VMM or agent not coming up (with their stage).
    pub fn start_live(&self, spec: &RunSpec, ctx: &RunContext) -> Result<LiveVm> {
        spec.require_kind(BackendKind::Microvm)?;
        let caps = &spec.caps;
        let plan = plan(caps, ctx.strictness)?.with_layers(caps, false)?;
        let artifacts = self.artifacts()?;
        let accel = self.usable_accel()?;
        let dir = private_dir()
            .map_err(|e| Error::setup(SetupStage::Host, "microvm: private temp dir", e))?;
        let (egress, proxy_env) = self.guest_egress(caps, dir.path(), &artifacts)?;
        let mut request = request::plain(Vec::new(), caps, &GUEST, &proxy_env, egress.is_some());
        let prepared = grants::prepare(&caps.mounts, dir.path(), caps.limits.disk.bytes())?;
        request.mounts = prepared.mounts.clone();
        let shape = Shape {
            memory_mib: plan.memory_mib,
            vcpus: plan.vcpus,
            accel: accel.accel,
            network: egress.is_some(),
        };
        let disks = RunDisks {
            grants: prepared.disks.clone(),
            input: None,
            network: egress.as_ref().map(|e| e.relay.clone()),
        };
        let (config, boot, snapshot) = if self.snapshots {
            let snap = self.snapshot(&artifacts, shape)?;
            let config = restore_config(
                self.console_cap,
                &artifacts,
                &snap,
                dir.path(),
                shape,
                &disks,
            )?;
            (config, Boot::Restored, Some(snap))
        } else {
            let mut config =
                self.cold_config(&artifacts, dir.path(), shape, prepared.disks.clone())?;
            config.network = disks.network.clone();
            (config, Boot::Cold, None)
        };
        let started = Instant::now();
        let opened = self.vmm.start(&config).and_then(|mut vm| {
            if boot == Boot::Restored {
                vm.wait_running(started + self.ready_timeout)?;
            }
            let opened = sandbox_agent::driver::open_live(
                vm.as_mut(),
                started,
                boot.greeting(),
                self.ready_timeout,
                request.clone(),
                ctx,
            )?;
            Ok((vm, opened))
        });
        let (vm, opened) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                if let (true, Some(snap)) = (snapshot_is_suspect(&error), &snapshot) {
                    snap.discard();
                }
                return Err(error);
            }
        };
        let applied_gaps = applied::require(
            applied::missing(&request, Some(&opened.applied)),
            ctx.strictness,
            Place::Vm,
        )?;
        let mut receipt = Receipt::new(BackendKind::Microvm, ctx.strictness);
        let guest = GuestSeen {
            kernel: &opened.kernel,
            rootfs: &artifacts.rootfs_version,
            boot: opened.boot,
            restored: boot == Boot::Restored,
            pooled: false,
            memory_total: opened.applied.memory_total,
        };
        self.fill_receipt(&mut receipt, caps, &plan, &accel, &guest);
        grant_receipt(&mut receipt, caps, &prepared, &Vec::new());
        live_receipt(&mut receipt, !prepared.writable.is_empty());
        if egress.is_some() {
            receipt.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "host egress proxy",
                format!(
                    "{}; the guest's one network device is QEMU's user-mode network with restrict=on: its only peer is {} (relayed to the sandbox's proxy socket, credential per sandbox); no other address, no DNS",
                    caps.net,
                    NetRelay::GUEST_PROXY
                ),
            );
        }
        for (cap, reason) in plan.gaps.into_iter().chain(applied_gaps) {
            receipt.gap(cap, reason);
        }
        let env = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let parts = LiveParts {
            receipt,
            env,
            workdir: PathBuf::from(&request.cwd),
            egress: egress.map(|e| e.run),
            dir,
            writable: prepared.writable,
        };
        LiveVm::new(vm, opened, parts)
    }
}

/// A run's receipt lines that a live sandbox words differently: no per-run deadline or
/// output cap (the supervisor's TTLs, exec timeouts and output rings take their place) and
/// the VM's life is the sandbox's.
fn live_receipt(receipt: &mut Receipt, writable: bool) {
    receipt.enforced.retain(|line| {
        !matches!(
            line.mechanism.as_str(),
            "host deadline: the VMM is killed" | "output cap (agent and host)" | "VM switched off"
        )
    });
    receipt.enforce(
        Capability::Processes,
        Mechanism::Vm,
        "live VM",
        "each exec runs in the VM as the guest's root, in its own session and process group, with the guest rlimits above; stdio is carried over the agent channel (no host descriptor reaches the guest)",
    );
    if writable {
        receipt.enforce(
            Capability::Fs,
            Mechanism::Vm,
            "read-write grants written back at stop",
            "each read-write grant's tree comes back when the sandbox stops (stop, ttl, idle ttl, owner gone), after every process in the VM was killed; until then the host directory is unchanged",
        );
    }
    receipt.enforce(
        Capability::Lifetime,
        Mechanism::Vm,
        "VM switched off",
        "every process of the sandbox, also one that left its session, dies with the VM when the sandbox ends (its VMM's jail ends it after 24 h at the latest)",
    );
}
