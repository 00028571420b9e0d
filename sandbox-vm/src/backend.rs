//! [`MicrovmBackend`]: one freshly booted VM per run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sandbox_core::{
    Backend, BackendKind, BackendReport, ByteSize, Capability, Caps, Check, Error, ExitStatus,
    LimitKind, Mechanism, Net, Receipt, ResourceUsage, Result, RunContext, RunOutput,
    ScriptLanguage, Strictness, Tool,
};

use crate::artifacts::GuestArtifacts;
use crate::probe::{self, AccelProbe};
use crate::protocol::{GuestExit, GuestLimit, GuestRlimits, RunRequest};
use crate::qemu::Qemu;
use crate::session::{self, Ending};
use crate::vmm::{Accel, VmConfig, Vmm};

/// Smallest guest RAM: the Debian cloud kernel does not boot in 64 MiB, 72 MiB is measured
/// to work; 128 MiB leaves room for the tool.
pub const MIN_GUEST_MIB: u64 = 128;

/// Default time from VMM start to the agent's `ready`: 60 s (TCG boots in 2–5 s here; a
/// loaded CI machine can be much slower).
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Default serial console bytes kept (the tail, for error messages): 64 KiB.
pub const DEFAULT_CONSOLE_CAP: usize = 64 * 1024;

/// The microVM backend: each run boots a fresh guest (Debian's cloud kernel, Strata's
/// initramfs and guest agent) under QEMU `-M microvm`, runs the tool through the agent over
/// virtio-serial, and switches the VM off.
///
/// Defaults: QEMU from `PATH`; guest artifacts from `$STRATA_VM_GUEST_DIR` (else the
/// checkout's `.ci/cache/vm`, built by `scripts/build-vm-guest.sh`); the agent next to the
/// running executable (or `$STRATA_VM_AGENT`); accelerator from the cached KVM probe
/// ([`crate::probe`]); hardware virtualisation not required; ready timeout
/// [`DEFAULT_READY_TIMEOUT`]; console cap [`DEFAULT_CONSOLE_CAP`].
///
/// This increment: `Tool::Command` and `sh` scripts; no mounts (refused when strict, a
/// gap when best-effort), no network (anything but [`Net::None`] is refused), no streamed
/// stdin, no snapshot pool (every run is a cold boot).
pub struct MicrovmBackend {
    vmm: Arc<dyn Vmm>,
    guest_dir: Option<PathBuf>,
    agent: Option<PathBuf>,
    require_hardware: bool,
    ready_timeout: Duration,
    console_cap: usize,
    accel: OnceLock<AccelProbe>,
}

impl std::fmt::Debug for MicrovmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MicrovmBackend")
            .field("vmm", &self.vmm.name())
            .field("guest_dir", &self.guest_dir)
            .field("require_hardware", &self.require_hardware)
            .field("ready_timeout", &self.ready_timeout)
            .finish()
    }
}

impl Default for MicrovmBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MicrovmBackend {
    /// The backend with the defaults above.
    pub fn new() -> Self {
        MicrovmBackend {
            vmm: Arc::new(Qemu::default()),
            guest_dir: None,
            agent: None,
            require_hardware: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            console_cap: DEFAULT_CONSOLE_CAP,
            accel: OnceLock::new(),
        }
    }

    /// Another VMM implementation (default: [`Qemu`]).
    pub fn with_vmm(mut self, vmm: Arc<dyn Vmm>) -> Self {
        self.vmm = vmm;
        self
    }

    /// The directory holding `vmlinuz`, `initramfs.cpio.gz` and `kernel-version`.
    pub fn with_guest_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.guest_dir = Some(dir.into());
        self
    }

    /// The `strata-guest-agent` binary to put in the guest.
    pub fn with_agent(mut self, agent: impl Into<PathBuf>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Refuse runs ([`Error::Unenforceable`]) unless guests run under hardware
    /// virtualisation (KVM that really boots a guest). Default: `false` (TCG is used where
    /// KVM does not work).
    pub fn require_hardware_virtualization(mut self, require: bool) -> Self {
        self.require_hardware = require;
        self
    }

    /// How long a booting guest may take to bring its agent up. Default:
    /// [`DEFAULT_READY_TIMEOUT`].
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    fn artifacts(&self) -> Result<GuestArtifacts> {
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

    fn kvm_boots(&self, artifacts: &GuestArtifacts) -> bool {
        let Ok(dir) = private_dir() else {
            return false;
        };
        let Ok(config) = self.vm_config(artifacts, dir.path(), Accel::Kvm, MIN_GUEST_MIB, 1) else {
            return false;
        };
        let request = RunRequest {
            argv: vec!["/bin/true".into()],
            env: Default::default(),
            cwd: "/".into(),
            timeout_ms: 1000,
            output_cap: 0,
            entropy: host_entropy(),
            rlimits: GuestRlimits::default(),
        };
        session::run(
            self.vmm.as_ref(),
            &config,
            probe::KVM_PROBE_TIMEOUT,
            request,
            &[],
            &RunContext::default(),
        )
        .is_ok()
    }

    fn vm_config(
        &self,
        artifacts: &GuestArtifacts,
        dir: &Path,
        accel: Accel,
        memory_mib: u64,
        vcpus: u32,
    ) -> Result<VmConfig> {
        let initrd = dir.join("initrd");
        let bytes = artifacts
            .boot_initrd()
            .map_err(|e| Error::setup("microvm: reading the guest initramfs and agent", e))?;
        std::fs::write(&initrd, bytes)
            .map_err(|e| Error::setup("microvm: writing the initrd", e))?;
        Ok(VmConfig {
            kernel: artifacts.kernel.clone(),
            initrd,
            memory_mib,
            vcpus,
            accel,
            dir: dir.to_path_buf(),
            console_cap: self.console_cap,
            connect_timeout: Duration::from_secs(10),
        })
    }
}

/// A private directory for one VM's initrd and sockets, removed when dropped.
fn private_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("strata-vm-").tempdir()
}

/// 64 bytes of host randomness for the guest RNG.
fn host_entropy() -> Vec<u8> {
    use std::io::Read;
    let mut bytes = vec![0u8; 64];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    bytes
}

/// The argv the agent runs for `tool`.
fn argv_for(tool: &Tool) -> Result<Vec<String>> {
    match tool {
        Tool::Command { argv } => {
            if argv.is_empty() {
                return Err(Error::invalid("argv must not be empty"));
            }
            Ok(argv.clone())
        }
        Tool::Script {
            language: ScriptLanguage::Sh,
            source,
        } => Ok(vec!["/bin/sh".into(), "-c".into(), source.clone()]),
        Tool::Script { language, .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "{language} scripts need the guest root file system with their interpreter, which this version does not build yet (the guest has only busybox); sh scripts and commands work"
            ),
        )),
        Tool::Wasm { .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            "wasm tools inside the microVM are not implemented yet; use the wasm backend",
        )),
        _ => Err(Error::invalid("unknown tool kind")),
    }
}

/// What the caps ask of this backend, checked before anything boots.
struct Plan {
    memory_mib: u64,
    vcpus: u32,
    gaps: Vec<(Capability, String)>,
}

fn plan(caps: &Caps, strictness: Strictness) -> Result<Plan> {
    let mut gaps = Vec::new();
    let unenforceable =
        |guarantee: &str, reason: String, gaps: &mut Vec<(Capability, String)>, cap: Capability| {
            match strictness {
                Strictness::Strict => Err(Error::unenforceable(guarantee, reason)),
                Strictness::BestEffort => {
                    gaps.push((cap, reason));
                    Ok(())
                }
            }
        };
    if !caps.mounts.is_empty() {
        unenforceable(
            "fs: microvm grants",
            format!(
                "the microvm backend cannot share host paths yet ({} mount(s) asked for); best-effort runs without them",
                caps.mounts.len()
            ),
            &mut gaps,
            Capability::Fs,
        )?;
    }
    if caps.net != Net::None {
        return Err(Error::unenforceable(
            "net: microvm",
            format!(
                "the guest has no network device yet; only net none is supported (asked for {})",
                caps.net
            ),
        ));
    }
    if !caps.secrets.is_empty() {
        return Err(Error::unenforceable(
            "net: microvm secrets",
            "secrets need a network allowlist, which the microvm backend does not support yet",
        ));
    }
    if caps.container.is_some() {
        return Err(Error::invalid("caps.container is read only by the container backend (images in the microVM are not implemented yet)"));
    }
    let asked = caps.limits.memory.bytes() / ByteSize::mib(1).bytes();
    let memory_mib = if asked < MIN_GUEST_MIB {
        unenforceable(
            "memory: microvm guest RAM",
            format!("limits.memory is {asked} MiB; a guest needs at least {MIN_GUEST_MIB} MiB, so best-effort gives it {MIN_GUEST_MIB} MiB"),
            &mut gaps,
            Capability::Memory,
        )?;
        MIN_GUEST_MIB
    } else {
        asked
    };
    let cpus = caps.limits.cpus;
    let host_cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as u32;
    let vcpus = (cpus.ceil() as u32).clamp(1, host_cores.max(1));
    if cpus.fract() != 0.0 {
        unenforceable(
            "cpu: microvm vCPUs",
            format!("limits.cpus is {cpus}; the guest gets whole vCPUs ({vcpus}) and the VMM's host CPU bandwidth is not capped yet"),
            &mut gaps,
            Capability::Cpu,
        )?;
    }
    gaps.push((
        Capability::Pids,
        format!(
            "limits.processes ({}) is not applied in the guest (the tool runs as the guest's root); its processes are bounded by guest RAM and die with the VM",
            caps.limits.processes
        ),
    ));
    Ok(Plan {
        memory_mib,
        vcpus,
        gaps,
    })
}

impl Backend for MicrovmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn run(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        let started = Instant::now();
        caps.validate()?;
        let argv = argv_for(tool)?;
        #[cfg(unix)]
        if ctx.stdin.is_some() {
            return Err(Error::unavailable(
                BackendKind::Microvm,
                "streamed stdin is not implemented for the microvm backend yet; pass the bytes as caps.stdin",
            ));
        }
        let plan = plan(caps, ctx.strictness)?;
        let artifacts = self.artifacts()?;
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
        let mut env = caps.env.clone();
        for (key, value) in [
            ("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
            ("HOME", "/tmp"),
            ("LANG", "C.UTF-8"),
        ] {
            env.entry(key.to_string())
                .or_insert_with(|| value.to_string());
        }
        let limits = &caps.limits;
        let cwd = caps.effective_workdir().to_string_lossy().into_owned();
        let request = RunRequest {
            argv: argv.clone(),
            env,
            cwd,
            timeout_ms: limits.timeout.as_millis().min(u64::MAX as u128) as u64,
            output_cap: limits.output.bytes(),
            entropy: host_entropy(),
            rlimits: GuestRlimits {
                cpu_seconds: limits.cpu_time.as_secs().max(1),
                file_size: limits.file_size.bytes(),
                open_files: u64::from(limits.open_files),
            },
        };
        let dir = private_dir().map_err(|e| Error::setup("microvm: private temp dir", e))?;
        let config = self.vm_config(
            &artifacts,
            dir.path(),
            accel.accel,
            plan.memory_mib,
            plan.vcpus,
        )?;
        let result = session::run(
            self.vmm.as_ref(),
            &config,
            self.ready_timeout,
            request,
            &caps.stdin,
            ctx,
        );
        drop(dir);
        let vm = result?;
        let cap = limits.output.bytes();
        let (status, limit_hit) = match vm.ending {
            Ending::HostWall => (
                ExitStatus::Limit {
                    limit: LimitKind::Wall,
                    signal: None,
                },
                Some(LimitKind::Wall),
            ),
            Ending::Agent(GuestExit::Exited { code }) => (ExitStatus::Exited { code }, None),
            Ending::Agent(GuestExit::Signaled { signal }) => {
                (ExitStatus::Signaled { signal }, None)
            }
            Ending::Agent(GuestExit::Limit { limit }) => {
                let limit = match limit {
                    GuestLimit::Wall => LimitKind::Wall,
                    GuestLimit::Output => LimitKind::Output,
                };
                (
                    ExitStatus::Limit {
                        limit,
                        signal: Some(9),
                    },
                    Some(limit),
                )
            }
            Ending::Agent(GuestExit::Killed) => return Err(Error::Cancelled),
            Ending::Agent(GuestExit::SpawnFailed { errno, .. }) => {
                return Err(Error::Exec {
                    program: argv.first().cloned().unwrap_or_default(),
                    source: std::io::Error::from_raw_os_error(errno),
                })
            }
        };
        let mut receipt = Receipt::new(BackendKind::Microvm, ctx.strictness);
        self.fill_receipt(&mut receipt, caps, &plan, &accel, &vm.kernel, vm.boot);
        for (cap, reason) in plan.gaps {
            receipt.gap(cap, reason);
        }
        match limit_hit {
            Some(LimitKind::Wall) => receipt.deny(
                Capability::Wall,
                format!(
                    "timeout {} ms reached; the tool and the VM were killed",
                    limits.timeout.as_millis()
                ),
            ),
            Some(LimitKind::Output) => receipt.deny(
                Capability::Output,
                format!("output cap {} reached; the tool was killed", limits.output),
            ),
            _ => {}
        }
        let stdout_truncated =
            limit_hit == Some(LimitKind::Output) && vm.stdout.len() as u64 >= cap;
        let stderr_truncated =
            limit_hit == Some(LimitKind::Output) && vm.stderr.len() as u64 >= cap;
        Ok(RunOutput {
            status,
            stdout: vm.stdout,
            stderr: vm.stderr,
            stdout_truncated,
            stderr_truncated,
            duration: started.elapsed(),
            usage: ResourceUsage::default(),
            receipt,
        })
    }

    fn report(&self) -> BackendReport {
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

impl MicrovmBackend {
    fn fill_receipt(
        &self,
        receipt: &mut Receipt,
        caps: &Caps,
        plan: &Plan,
        accel: &AccelProbe,
        kernel: &str,
        boot: Duration,
    ) {
        let vm = format!("{}, accel: {}", self.vmm.name(), accel.accel.describe());
        let limits = &caps.limits;
        receipt.enforce(
            Capability::Processes,
            Mechanism::Vm,
            vm.clone(),
            format!(
                "guest kernel {kernel}; {} vCPU, {} MiB; booted in {} ms; the tool's processes, IPC, hostname and system calls belong to the guest",
                plan.vcpus,
                plan.memory_mib,
                boot.as_millis()
            ),
        );
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
            "the root is the initramfs in guest RAM; no host path is shared (no 9p, virtiofs or disk device)",
        );
        receipt.enforce(
            Capability::Net,
            Mechanism::Vm,
            vm.clone(),
            "no network device (-nodefaults, no -netdev)",
        );
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
        receipt.enforce(
            Capability::Memory,
            Mechanism::Vm,
            "guest RAM",
            format!(
                "{} MiB (guest kernel and initramfs included)",
                plan.memory_mib
            ),
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

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
