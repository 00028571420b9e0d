//! What this machine offers the backend: the guest artifacts, the accelerator probe, the
//! doctor report.

use super::*;

impl MicrovmBackend {
    pub(super) fn artifacts(&self) -> Result<GuestArtifacts> {
        GuestArtifacts::locate(self.guest_dir.as_deref(), self.agent.as_deref())
            .map_err(|why| Error::unavailable(BackendKind::Microvm, why))
    }

    /// The accelerator guests use here and why (probed once, cached on disk).
    pub fn accel(&self) -> Result<AccelProbe> {
        if let Some(probe) = self.accel.get() {
            return Ok(probe.clone());
        }
        let artifacts = self.artifacts()?;
        let probe = probe::decide(&artifacts.kernel_version, || self.kvm_boots(&artifacts));
        Ok(self.accel.get_or_init(|| probe).clone())
    }

    /// [`MicrovmBackend::accel`], refused when hardware virtualisation is required and
    /// guests would run without it.
    pub(super) fn usable_accel(&self) -> Result<AccelProbe> {
        let accel = self.accel()?;
        if self.require_hardware && accel.accel != Accel::Kvm {
            return Err(Error::unenforceable(
                "microvm: hardware virtualisation",
                format!(
                    "guests would run under {} here: {}",
                    accel.accel.describe(),
                    accel.reason
                ),
            ));
        }
        Ok(accel)
    }

    pub(super) fn kvm_boots(&self, artifacts: &GuestArtifacts) -> bool {
        let Ok(dir) = private_dir() else {
            return false;
        };
        let shape = Shape {
            memory_mib: MIN_GUEST_MIB,
            vcpus: 1,
            accel: Accel::Kvm,
            network: false,
        };
        let Ok(config) = self.cold_config(artifacts, dir.path(), shape, Vec::new()) else {
            return false;
        };
        let request = request::probe();
        let plan = RunPlan {
            greeting: Boot::Cold.greeting(),
            ready_timeout: probe::KVM_PROBE_TIMEOUT,
            request,
            stdin: &[],
            archives: Vec::new(),
        };
        session::run(
            self.vmm.as_ref(),
            &config,
            Boot::Cold,
            plan,
            &RunContext::default(),
        )
        .is_ok()
    }

    pub(super) fn backend_report(&self) -> BackendReport {
        let mut checks = Vec::new();
        let qemu = which("qemu-system-x86_64");
        checks.push(Check::new(
            "qemu",
            qemu.is_some(),
            qemu.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| {
                    "qemu-system-x86_64 not on PATH (apt-get install qemu-system-x86)".into()
                }),
        ));
        let artifacts = self.artifacts();
        checks.push(match &artifacts {
            Ok(a) => Check::new(
                "guest",
                true,
                format!(
                    "kernel {} ({}), agent {}",
                    a.kernel_version,
                    a.kernel.display(),
                    a.agent.display()
                ),
            ),
            Err(e) => Check::new("guest", false, e.to_string()),
        });
        let accel = match (&artifacts, qemu.is_some()) {
            (Ok(_), true) => self.accel().ok(),
            _ => None,
        };
        if let Some(probe) = &accel {
            checks.push(Check::new(
                "accel",
                true,
                format!("{}: {}", probe.accel.describe(), probe.reason),
            ));
            if self.require_hardware && probe.accel != Accel::Kvm {
                checks.push(Check::new(
                    "hardware virtualisation",
                    false,
                    "required but unavailable",
                ));
            }
        }
        let available = checks.iter().all(|c| c.ok);
        BackendReport {
            backend: BackendKind::Microvm,
            available,
            reason: (!available).then(|| {
                checks
                    .iter()
                    .filter(|c| !c.ok)
                    .map(|c| format!("{}: {}", c.name, c.detail))
                    .collect::<Vec<_>>()
                    .join("; ")
            }),
            checks,
        }
    }
}
