//! The receipt of a microVM run: what the guest, its grants and the layer inside enforced.

use super::*;

/// What a run saw of its guest, for the receipt.
pub(super) struct GuestSeen<'a> {
    pub(super) kernel: &'a str,
    pub(super) rootfs: &'a str,
    pub(super) boot: Duration,
    pub(super) restored: bool,
    pub(super) pooled: bool,
    /// The guest's memory as its kernel reported it (`MemTotal`), read back by the agent.
    pub(super) memory_total: Option<u64>,
}

/// What came of each read-write grant: applied, or why not.
pub(super) type WrittenBack = Vec<(PathBuf, std::result::Result<grants::Applied, String>)>;

pub(super) fn write_back(prepared: &Prepared, archives: &[session::Archive]) -> WrittenBack {
    prepared
        .writable
        .iter()
        .zip(archives)
        .map(|(grant, archive)| {
            let result = match archive {
                Ok(path) => {
                    grants::apply(grant, path).map_err(|e| format!("the archive is malformed: {e}"))
                }
                Err(why) => Err(why.clone()),
            };
            (grant.host.clone(), result)
        })
        .collect()
}

pub(super) fn grant_receipt(
    receipt: &mut Receipt,
    caps: &Caps,
    prepared: &Prepared,
    back: &WrittenBack,
) {
    for (mount, disk) in caps.mounts.iter().zip(&prepared.disks) {
        let (what, detail) = if disk.read_only {
            (
                "read-only disk image",
                format!(
                    "{} -> {}: a copy taken at the start of the run, opened readonly=on by the VMM (no guest write reaches it or the host)",
                    mount.host.display(),
                    mount.guest.display()
                ),
            )
        } else {
            (
                "private disk image, written back through a filter",
                format!(
                    "{} -> {}: a private copy; the tree comes back through openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS); new symbolic links, devices and paths outside the grant refused; setuid bits dropped",
                    mount.host.display(),
                    mount.guest.display()
                ),
            )
        };
        receipt.enforce(Capability::Fs, Mechanism::Vm, what, detail);
    }
    for (host, result) in back {
        match result {
            Ok(applied) => {
                receipt.enforce(
                    Capability::Fs,
                    Mechanism::Host,
                    "grant written back",
                    format!(
                        "{}: {} written, {} deleted, {} refused",
                        host.display(),
                        applied.written,
                        applied.deleted,
                        applied.refused.len()
                    ),
                );
                for refused in &applied.refused {
                    receipt.deny(Capability::Fs, format!("{}: {refused}", host.display()));
                }
            }
            Err(why) => receipt.deny(
                Capability::Fs,
                format!("{}: nothing written back: {why}", host.display()),
            ),
        }
    }
}

impl MicrovmBackend {
    pub(super) fn fill_receipt(
        &self,
        receipt: &mut Receipt,
        caps: &Caps,
        plan: &Plan,
        accel: &AccelProbe,
        guest: &GuestSeen<'_>,
    ) {
        let (kernel, boot) = (guest.kernel, guest.boot);
        let vm = format!("{}, accel: {}", self.vmm.name(), accel.accel.describe());
        let limits = &caps.limits;
        receipt.enforce(
            Capability::Processes,
            Mechanism::Vm,
            vm.clone(),
            format!(
                "guest kernel {kernel}; {} vCPU, {} MiB; {} in {} ms; the tool's processes, IPC, hostname and system calls belong to the guest",
                plan.vcpus,
                plan.memory_mib,
                if guest.pooled {
                    "restored from a snapshot ahead of the run (pool; RNG reseeded, clock set), ready"
                } else if guest.restored {
                    "restored from a snapshot (RNG reseeded, clock set)"
                } else {
                    "booted"
                },
                boot.as_millis()
            ),
        );
        if self.confined {
            receipt.enforce(
                Capability::Processes,
                Mechanism::Namespace,
                "jailed VMM",
                "VMM confined: QEMU runs in the process backend's sandbox (own user, mount, pid and network namespaces, seccomp, landlock limited to the VM's files, a cgroup capping its memory, an unprivileged uid)",
            );
        }
        for cap in [Capability::Ipc, Capability::Uts, Capability::Syscalls] {
            receipt.enforce(
                cap,
                Mechanism::Vm,
                vm.clone(),
                format!("guest kernel {kernel}"),
            );
        }
        receipt.enforce(
            Capability::Fs,
            Mechanism::Vm,
            vm.clone(),
            format!("the root is a read-only disk image ({}; QEMU opens it readonly=on) under an overlay whose writes stay in guest RAM and die with the VM; host paths only as the grants' disk images below", guest.rootfs),
        );
        if caps.net == Net::None {
            receipt.enforce(
                Capability::Net,
                Mechanism::Vm,
                vm.clone(),
                "no network device (-nodefaults, no -netdev)",
            );
        }
        let keys: Vec<&str> = caps.env.keys().map(String::as_str).collect();
        receipt.enforce(
            Capability::Env,
            Mechanism::Environment,
            "explicit environment",
            format!(
                "set: [{}] plus PATH, HOME, LANG defaults when unset",
                keys.join(", ")
            ),
        );
        receipt.enforce(
            Capability::Fds,
            Mechanism::Vm,
            vm.clone(),
            "no host descriptor reaches the guest",
        );
        let seen = guest
            .memory_total
            .map(|bytes| format!("; the guest kernel reports {} MiB", bytes >> 20))
            .unwrap_or_default();
        receipt.enforce(
            Capability::Memory,
            Mechanism::Vm,
            "guest RAM",
            format!("{}{seen}", if plan.layered {
                format!(
                    "{} MiB: the tool's {} MiB, held by the layer inside the guest, and {LAYER_OVERHEAD_MIB} MiB for the guest kernel, the agent and that layer",
                    plan.memory_mib, plan.tool_mib
                )
            } else {
                format!(
                    "{} MiB (guest kernel and initramfs included); the guest's OOM killer takes the tool first, never the agent",
                    plan.memory_mib
                )
            }),
        );
        receipt.enforce(
            Capability::Cpu,
            Mechanism::Vm,
            "vCPUs",
            format!("{} vCPU", plan.vcpus),
        );
        receipt.enforce(
            Capability::Cpu,
            Mechanism::Rlimit,
            "RLIMIT_CPU in the guest",
            format!("{} s", limits.cpu_time.as_secs().max(1)),
        );
        receipt.enforce(
            Capability::Wall,
            Mechanism::Supervisor,
            "host deadline: the VMM is killed",
            format!(
                "{} ms from the tool's start (the guest agent kills the tool at the timeout, the host switches the VM off {} ms later); boot bounded by the {} s ready timeout",
                limits.timeout.as_millis(),
                session::WALL_GRACE.as_millis(),
                self.ready_timeout.as_secs()
            ),
        );
        receipt.enforce(
            Capability::Output,
            Mechanism::Host,
            "output cap (agent and host)",
            format!("{} per stream", limits.output),
        );
        receipt.enforce(
            Capability::FileSize,
            Mechanism::Rlimit,
            "RLIMIT_FSIZE in the guest",
            limits.file_size.to_string(),
        );
        receipt.enforce(
            Capability::OpenFiles,
            Mechanism::Rlimit,
            "RLIMIT_NOFILE in the guest",
            limits.open_files.to_string(),
        );
        receipt.enforce(
            Capability::Disk,
            Mechanism::Vm,
            "guest RAM",
            format!("writes land in guest RAM ({} MiB in all)", plan.memory_mib),
        );
        receipt.enforce(
            Capability::Lifetime,
            Mechanism::Vm,
            "VM switched off",
            "every process of the run dies with the VM at its end",
        );
    }
}
