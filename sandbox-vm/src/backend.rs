//! [`MicrovmBackend`]: one freshly booted VM per run.

use sandbox_core::SetupStage;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sandbox_core::{
    Backend, BackendKind, BackendReport, ByteSize, Capability, Caps, Check, Error, ExitStatus,
    LimitKind, Mechanism, Net, Receipt, ResourceUsage, Result, RunContext, RunOutput, Stream,
    Strictness, Tool,
};

use sandbox_os::private::PrivateDir;

use crate::artifacts::GuestArtifacts;
use crate::grants::{self, Prepared};
use crate::pool::{self, Pool};
use crate::probe::{self, AccelProbe};
use crate::qemu::Qemu;
use crate::session::{self, ArchiveTarget, Boot, Ending, RunPlan};
use crate::snapshot::{self, Shape, Snapshot};
use crate::vmm::{Accel, Disk, NetRelay, VmConfig, Vmm};
use sandbox_agent::inner::{self, InnerPaths};
use sandbox_agent::protocol::{GuestExit, GuestRlimits, RunRequest};
use sandbox_agent::Place;

/// The serial number of the root disk; the guest's `/init` mounts the disk with it.
const ROOT_SERIAL: &str = "strata-root";

/// The serial number of the guest tools disk (agent, `strata`, `strata-helper`), which
/// `/init` mounts at `/run/strata/tools`.
const TOOLS_SERIAL: &str = "strata-tools";

/// The environment the guest gives tools (and the inner CLI) when the caller sets none.
const GUEST_ENV: [(&str, &str); 3] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
    ("HOME", "/tmp"),
    ("LANG", "C.UTF-8"),
];

/// Disks every VM has before the grant slots: root and tools.
const FIXED_DISKS: usize = 2;

/// Smallest guest RAM: the Debian cloud kernel does not boot in 64 MiB, 72 MiB is measured
/// to work; 128 MiB leaves room for the tool.
pub const MIN_GUEST_MIB: u64 = 128;

/// Guest RAM added to the run's memory limit when the layer inside runs: the guest kernel,
/// the agent and the layer inside live there, while the layer's cgroup holds the tool to
/// the limit itself. Without it the tool could use the guest's last page before its cgroup
/// limit, and the guest's OOM killer then found nothing it may kill.
pub const LAYER_OVERHEAD_MIB: u64 = 96;

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
    snapshots: bool,
    layers: bool,
    pool_size: usize,
    pool: Arc<Pool>,
    keeper: pool::Keeper,
    confined: bool,
    egress: OnceLock<std::result::Result<sandbox_os::EgressHost, String>>,
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
            vmm: Arc::new(Self::jailed_qemu()),
            guest_dir: None,
            agent: None,
            require_hardware: false,
            ready_timeout: DEFAULT_READY_TIMEOUT,
            console_cap: DEFAULT_CONSOLE_CAP,
            snapshots: true,
            layers: true,
            pool_size: 0,
            pool: Arc::new(Pool::default()),
            keeper: pool::Keeper::default(),
            confined: true,
            egress: OnceLock::new(),
            accel: OnceLock::new(),
        }
    }

    /// QEMU confined by the process backend (its own namespaces, seccomp, landlock limited
    /// to the VM's files, a cgroup capping its memory, an unprivileged uid), no warm pool.
    fn jailed_qemu() -> Qemu {
        let jail = sandbox_os::ProcessBackend::new().with_warm_pool(0);
        Qemu::default().jailed(Arc::new(jail))
    }

    /// Confine the VMM in the process backend's sandbox (default: `true`). With `false`
    /// QEMU runs as the embedder, still dying with it (`--pdeathsig`). Replaces a VMM set
    /// with [`MicrovmBackend::with_vmm`].
    pub fn confine_vmm(mut self, confine: bool) -> Self {
        self.vmm = Arc::new(if confine {
            Self::jailed_qemu()
        } else {
            Qemu::default()
        });
        self.confined = confine;
        self
    }

    /// Confine QEMU in `jail` (a process backend configured by the embedder: its helper
    /// binary, id range; give it no warm pool) instead of a default
    /// [`sandbox_os::ProcessBackend`], which looks for `strata-helper` next to the running
    /// executable or in `$STRATA_HELPER`.
    pub fn jailed_in(mut self, jail: Arc<dyn Backend>) -> Self {
        self.vmm = Arc::new(Qemu::default().jailed(jail));
        self.confined = true;
        self
    }

    /// Another VMM implementation (default: [`Qemu`], jailed).
    pub fn with_vmm(mut self, vmm: Arc<dyn Vmm>) -> Self {
        self.vmm = vmm;
        self.confined = false;
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

    /// Start each run's VM by restoring a snapshot (made by one cold boot per VM shape and
    /// guest build, kept in the state directory) instead of booting it. Default: `true`.
    pub fn snapshots(mut self, enabled: bool) -> Self {
        self.snapshots = enabled;
        self
    }

    /// Run tools inside the guest under Strata's own sandbox (the process backend for
    /// commands and scripts, the native container runtime for images, the wasm backend for
    /// wasm tools), when the guest tools (`strata`, `strata-helper`) are found next to the
    /// agent. Default: `true`. Without them (or with `false`) the agent runs commands and
    /// scripts directly as the guest's root, and the receipt says so.
    pub fn layers(mut self, enabled: bool) -> Self {
        self.layers = enabled;
        self
    }

    /// Keep this many VMs restored and idle per VM shape, so a run without grants or an
    /// image skips the restore (a replacement is restored in the background after each
    /// run). Default: 0 (each run restores its own VM). Needs snapshots. Each idle VM holds
    /// host memory (see the benchmark) and a QEMU process.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Fills the pool for runs with `caps`' VM shape (guest RAM, vCPUs) now, blocking
    /// until [`MicrovmBackend::pool_size`] VMs idle; returns how many idle.
    ///
    /// # Errors
    /// As a run's setup: missing guest, a snapshot that cannot be made.
    pub fn prewarm(&self, caps: &Caps) -> Result<usize> {
        let artifacts = self.artifacts()?;
        let layered = self.layers && artifacts.inner.is_some();
        let plan = plan(caps, Strictness::BestEffort, layered)?;
        let shape = Shape {
            memory_mib: plan.memory_mib,
            vcpus: plan.vcpus,
            accel: self.accel()?.accel,
            network: false,
        };
        let snap = self.snapshot(&artifacts, shape)?;
        let (done, finished) = std::sync::mpsc::channel();
        self.refill(self.restorer(&artifacts, &snap, shape), Some(done));
        let _ = finished.recv();
        Ok(self.pool.len())
    }

    /// The process ids of the idle pooled VMs' VMMs (for memory measurements).
    pub fn idle_vmm_pids(&self) -> Vec<u32> {
        self.pool.pids()
    }

    /// Tops the pool up on the keeper thread.
    fn refill(&self, restorer: Restorer, done: Option<std::sync::mpsc::Sender<()>>) {
        self.keeper.submit(pool::Job {
            pool: Arc::clone(&self.pool),
            target: self.pool_size,
            restore_one: Box::new(move || restorer.restore_one()),
            done,
        });
    }

    /// Registers the run with the host egress proxy (started on first use) and serves it on
    /// a socket in the run's directory, which the VM's relay joins guest connections to.
    fn egress_for(&self, caps: &Caps, dir: &Path, artifacts: &GuestArtifacts) -> Result<VmEgress> {
        let host = self
            .egress
            .get_or_init(|| sandbox_os::EgressHost::start().map_err(|e| e.to_string()));
        let host = host.as_ref().map_err(|e| {
            Error::setup(
                SetupStage::Egress,
                "microvm: egress proxy",
                std::io::Error::other(e.clone()),
            )
        })?;
        let mut run = sandbox_os::RunEgress::register(host, &caps.net, &caps.limits)?;
        let socket = dir.join("egress.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .map_err(|e| Error::setup(SetupStage::Egress, "microvm: egress socket", e))?;
        sandbox_os::private::restrict(&socket)
            .map_err(|e| Error::setup(SetupStage::Egress, "microvm: egress socket", e))?;
        run.attach_unix(host, listener)?;
        Ok(VmEgress {
            run,
            relay: NetRelay {
                program: artifacts.agent.clone(),
                socket,
            },
        })
    }

    fn restorer(&self, artifacts: &GuestArtifacts, snap: &Snapshot, shape: Shape) -> Restorer {
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
        let shape = Shape {
            memory_mib: MIN_GUEST_MIB,
            vcpus: 1,
            accel: Accel::Kvm,
            network: false,
        };
        let Ok(config) = self.cold_config(artifacts, dir.path(), shape, Vec::new()) else {
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
            clock_unix_ns: 0,
            mounts: Vec::new(),
            files: Vec::new(),
            report: None,
            network: false,
        };
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

    fn root_disk(artifacts: &GuestArtifacts) -> Disk {
        Disk {
            path: artifacts.rootfs.clone(),
            read_only: true,
            serial: ROOT_SERIAL.into(),
        }
    }

    /// Where snapshots and the guest tools disk are kept.
    fn store() -> PathBuf {
        match probe::state_dir() {
            Some(dir) => dir.join("microvm-snapshots"),
            None => std::env::temp_dir().join(format!(
                "strata-microvm-snapshots-{}",
                rustix::process::geteuid().as_raw()
            )),
        }
    }

    fn tools_disk(artifacts: &GuestArtifacts) -> Result<Disk> {
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

    fn base_config(
        &self,
        artifacts: &GuestArtifacts,
        dir: &Path,
        shape: Shape,
    ) -> Result<VmConfig> {
        base_config(self.console_cap, artifacts, dir, shape)
    }

    /// A VM booted from scratch with `grants` (the disks of [`grants::prepare`]).
    fn cold_config(
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

    /// The snapshot for `shape`, made now (one cold boot) if there is none yet.
    fn snapshot(&self, artifacts: &GuestArtifacts, shape: Shape) -> Result<Snapshot> {
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

/// The devices every VM has: kernel, initramfs, root and tools disks, the agent channel.
fn base_config(
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
fn restore_config(
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

/// Where the guest reaches the egress proxy.
const GUEST_PROXY_ADDR: std::net::SocketAddr = std::net::SocketAddr::V4(
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(10, 0, 2, 100), 3128),
);

/// A run's egress: its registration with the host proxy and the VM's relay to it.
struct VmEgress {
    run: sandbox_os::RunEgress,
    relay: NetRelay,
}

/// Restores pooled VMs (on a background thread after a run took one).
struct Restorer {
    vmm: Arc<dyn Vmm>,
    pool: Arc<Pool>,
    console_cap: usize,
    ready_timeout: Duration,
    artifacts: GuestArtifacts,
    snap: Snapshot,
    shape: Shape,
}

impl Restorer {
    /// Restores one VM into the pool; `false` when that failed.
    fn restore_one(&self) -> bool {
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

/// A run's own devices: its grants, the input disk of the layer inside, its network.
struct RunDisks {
    grants: Vec<Disk>,
    input: Option<Disk>,
    network: Option<NetRelay>,
}

impl RunDisks {
    fn all(&self) -> Vec<Disk> {
        self.grants.iter().chain(&self.input).cloned().collect()
    }
}

/// A run's private directory, naming this process as its owner; the first call of a
/// process sweeps directories of dead embedders ([`crate::leftovers`]).
fn private_dir() -> std::io::Result<PrivateDir> {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        crate::leftovers::sweep(&std::env::temp_dir());
    });
    crate::leftovers::run_dir()
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
fn argv_for(tool: &Tool, layered: bool) -> Result<Vec<String>> {
    if let Some(argv) = session::plain_argv(tool)? {
        return Ok(argv);
    }
    match tool {
        Tool::Script { language, .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "{language} scripts need their interpreter in the guest root file system, which holds python3 and busybox only; sh and python scripts and commands work"
            ),
        )),
        Tool::Wasm { module, .. } if layered => Ok(vec![module.to_string_lossy().into_owned()]),
        Tool::Wasm { .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "wasm tools run in the wasm backend inside the guest, which needs the guest tools ({} next to {})",
                crate::artifacts::INNER_TOOLS.join(" and "),
                crate::artifacts::AGENT_NAME
            ),
        )),
        _ => Err(Error::invalid("unknown tool kind")),
    }
}

/// What the caps ask of this backend, checked before anything boots.
struct Plan {
    /// Guest RAM.
    memory_mib: u64,
    /// The tool's memory limit (what the layer inside applies; the guest RAM without it).
    tool_mib: u64,
    /// Whether the layer inside runs (and keeps the tool to `tool_mib`).
    layered: bool,
    vcpus: u32,
    gaps: Vec<(Capability, String)>,
}

fn plan(caps: &Caps, strictness: Strictness, layered: bool) -> Result<Plan> {
    caps.refuse_root_mount(BackendKind::Microvm)?;
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
    if caps.net == Net::Host {
        return Err(Error::unenforceable(
            "net: microvm",
            "a guest's only way out is the egress proxy: use net none or an allowlist (allow:HOST[:PORT],...), not host",
        ));
    }
    if !caps.secrets.is_empty() {
        return Err(Error::unenforceable(
            "net: microvm secrets",
            "secrets need the run's interception CA in the guest's trust store, which the microvm backend does not install yet",
        ));
    }
    if caps.container.is_some() && !layered {
        return Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "images run with the native container runtime inside the guest, which needs the guest tools ({} next to {})",
                crate::artifacts::INNER_TOOLS.join(" and "),
                crate::artifacts::AGENT_NAME
            ),
        ));
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
    if !layered {
        gaps.push((
            Capability::Pids,
            format!(
                "limits.processes ({}) is not applied in the guest (the tool runs as the guest's root, without the sandbox inside the guest); its processes are bounded by guest RAM and die with the VM",
                caps.limits.processes
            ),
        ));
    }
    Ok(Plan {
        memory_mib: memory_mib + if layered { LAYER_OVERHEAD_MIB } else { 0 },
        tool_mib: memory_mib,
        layered,
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
        // Requests no guest could honour are refused before the guest is even looked for.
        plan(caps, ctx.strictness, true)?;
        let artifacts = self.artifacts()?;
        let layered = self.layers && artifacts.inner.is_some();
        let argv = argv_for(tool, layered)?;
        let plan = plan(caps, ctx.strictness, layered)?;
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
        let dir = private_dir()
            .map_err(|e| Error::setup(SetupStage::Host, "microvm: private temp dir", e))?;
        let egress = match &caps.net {
            Net::Allow(_) => Some(self.egress_for(caps, dir.path(), &artifacts)?),
            _ => None,
        };
        let proxy_env: Vec<(String, String)> = egress
            .as_ref()
            .map(|e| {
                let url = e.run.proxy_url_at(GUEST_PROXY_ADDR);
                sandbox_core::egress::PROXY_VARIABLES
                    .iter()
                    .map(|k| (k.to_string(), url.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let inner = if layered {
            Some(inner::plan(tool, caps, &proxy_env, &InnerPaths::guest())?)
        } else {
            None
        };
        let limits = &caps.limits;
        let cwd = caps.effective_workdir().to_string_lossy().into_owned();
        let mut request = match &inner {
            None => {
                let mut env = caps.env.clone();
                env.retain(|k, _| !sandbox_core::egress::PROXY_VARIABLES.contains(&k.as_str()));
                env.extend(proxy_env.iter().cloned());
                for (key, value) in GUEST_ENV {
                    env.entry(key.to_string())
                        .or_insert_with(|| value.to_string());
                }
                RunRequest {
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
                    clock_unix_ns: 0,
                    mounts: Vec::new(),
                    files: Vec::new(),
                    report: None,
                    network: egress.is_some(),
                }
            }
            Some(inner) => RunRequest {
                argv: inner.argv.clone(),
                env: GUEST_ENV
                    .iter()
                    .chain(&[("STRATA_STATE_DIR", "/run/strata/state")])
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                cwd: "/".into(),
                timeout_ms: (limits.timeout.as_millis().min(u64::MAX as u128) as u64)
                    .saturating_add(inner::INNER_SLACK_MS),
                output_cap: limits.output.bytes(),
                entropy: host_entropy(),
                rlimits: GuestRlimits::default(),
                clock_unix_ns: 0,
                mounts: Vec::new(),
                files: inner.files.clone(),
                report: Some(inner.report.clone()),
                network: egress.is_some(),
            },
        };
        let prepared = grants::prepare(&caps.mounts, dir.path(), limits.disk.bytes())?;
        request.mounts = prepared.mounts.clone();
        let input = match inner.as_ref().and_then(|i| i.input.as_deref()) {
            Some(host) => {
                let contents = crate::input::input_dir(host, dir.path())?;
                request.mounts.push(sandbox_agent::protocol::GuestMount {
                    serial: grants::input_serial(),
                    target: inner::INPUT_DIR.into(),
                    writable: false,
                });
                Some(grants::input_disk(&contents, dir.path())?)
            }
            None => None,
        };
        let disks = RunDisks {
            grants: prepared.disks.clone(),
            input,
            network: egress.as_ref().map(|e| e.relay.clone()),
        };
        let shape = Shape {
            memory_mib: plan.memory_mib,
            vcpus: plan.vcpus,
            accel: accel.accel,
            network: egress.is_some(),
        };
        let mut pooled = None;
        let (config, boot, snapshot) = if self.snapshots {
            let snap = self.snapshot(&artifacts, shape)?;
            if self.pool_size > 0
                && disks.grants.is_empty()
                && disks.input.is_none()
                && disks.network.is_none()
            {
                pooled = self.pool.take(shape, &snap.state);
                self.refill(self.restorer(&artifacts, &snap, shape), None);
            }
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
            let mut config = self.cold_config(&artifacts, dir.path(), shape, disks.all())?;
            config.network = disks.network.clone();
            (config, Boot::Cold, None)
        };
        let archives = prepared
            .writable
            .iter()
            .map(|w| ArchiveTarget {
                mount: w.mount,
                path: dir.path().join(format!("archive{}.tar", w.mount)),
                cap: w.image_size + (16 << 20),
            })
            .collect();
        let run_plan = RunPlan {
            greeting: boot.greeting(),
            ready_timeout: self.ready_timeout,
            request,
            stdin: &caps.stdin,
            archives,
        };
        let from_pool = pooled.is_some();
        let result = match pooled {
            Some(pooled) => {
                let result = session::run_on(pooled.vm, boot, run_plan, ctx);
                drop(pooled.dir);
                result
            }
            None => session::run(self.vmm.as_ref(), &config, boot, run_plan, ctx),
        };
        if let (Err(error), Some(snap)) = (&result, &snapshot) {
            if snapshot_is_suspect(error) {
                snap.discard();
            }
        }
        let vm = result?;
        let written_back = write_back(&prepared, &vm.archives);
        drop(dir);
        let cap = limits.output.bytes();
        let inner_result = match (&inner, &vm.ending) {
            (Some(_), Ending::Agent(GuestExit::Exited { .. } | GuestExit::Signaled { .. })) => {
                Some(inner::parse(vm.report.as_deref(), &vm.stderr, Place::Vm)?)
            }
            _ => None,
        };
        let (status, limit_hit) = if let Some(result) = &inner_result {
            let limit = match result.status {
                ExitStatus::Limit { limit, .. } => Some(limit),
                _ => None,
            };
            (result.status, limit)
        } else {
            session::exit_status(&vm.ending, argv.first().map_or("", String::as_str))?
        };
        let mut receipt = Receipt::new(BackendKind::Microvm, ctx.strictness);
        let guest = GuestSeen {
            kernel: &vm.kernel,
            rootfs: &artifacts.rootfs_version,
            boot: vm.boot,
            restored: boot == Boot::Restored,
            pooled: from_pool,
        };
        self.fill_receipt(&mut receipt, caps, &plan, &accel, &guest);
        grant_receipt(&mut receipt, caps, &prepared, &written_back);
        let proxied = egress.is_some();
        if let Some(egress) = egress {
            let (network, denials) = egress.run.finish_as(format!(
                "{} in the guest -> the host's egress proxy",
                NetRelay::GUEST_PROXY
            ));
            receipt.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "host egress proxy",
                format!(
                    "allowlist [{}]; the guest's one network device is QEMU's user-mode network with restrict=on: its only peer is {} (relayed to the run's proxy socket, credential per run); no other address, no DNS",
                    network.rules.join(", "),
                    NetRelay::GUEST_PROXY
                ),
            );
            receipt.denials.extend(denials);
            receipt.network = Some(network);
        }
        for (cap, reason) in plan.gaps {
            receipt.gap(cap, reason);
        }
        let inner_ran = inner_result.is_some();
        if let Some(result) = &inner_result {
            inner::require_complete(result, ctx.strictness, Place::Vm, proxied)?;
        }
        if let Some(result) = inner_result {
            if proxied {
                inner::merge_proxied(
                    &mut receipt,
                    result.receipt,
                    Place::Vm,
                    NetRelay::GUEST_PROXY,
                );
            } else {
                inner::merge(&mut receipt, result.receipt, Place::Vm);
            }
            if let (Some(seen), Some(spec)) = (receipt.container.as_mut(), &caps.container) {
                // The image as the caller named it, not its guest path.
                seen.image = spec.image.clone();
            }
        } else if let Some(inner) = &inner {
            receipt.layers.push(inner.backend);
        }
        match limit_hit {
            _ if inner_ran => {}
            Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => receipt.record_end(kind, limits),
            Some(LimitKind::Output) => {
                let cap = limits.output.bytes();
                for (stream, len) in [
                    (Stream::Stdout, vm.stdout.len()),
                    (Stream::Stderr, vm.stderr.len()),
                ] {
                    if len as u64 >= cap {
                        receipt.record_output_cut(stream, limits);
                    }
                }
            }
            Some(LimitKind::Memory) => receipt.deny(
                Capability::Memory,
                format!(
                    "the guest's {} MiB ran out; its OOM killer ended the tool",
                    plan.memory_mib
                ),
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

/// What a run saw of its guest, for the receipt.
struct GuestSeen<'a> {
    kernel: &'a str,
    rootfs: &'a str,
    boot: Duration,
    restored: bool,
    pooled: bool,
}

/// What came of each read-write grant: applied, or why not.
type WrittenBack = Vec<(PathBuf, std::result::Result<grants::Applied, String>)>;

fn write_back(prepared: &Prepared, archives: &[session::Archive]) -> WrittenBack {
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

fn grant_receipt(receipt: &mut Receipt, caps: &Caps, prepared: &Prepared, back: &WrittenBack) {
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
    fn fill_receipt(
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
        receipt.enforce(
            Capability::Memory,
            Mechanism::Vm,
            "guest RAM",
            if plan.layered {
                format!(
                    "{} MiB: the tool's {} MiB, held by the layer inside the guest, and {LAYER_OVERHEAD_MIB} MiB for the guest kernel, the agent and that layer",
                    plan.memory_mib, plan.tool_mib
                )
            } else {
                format!(
                    "{} MiB (guest kernel and initramfs included); the guest's OOM killer takes the tool first, never the agent",
                    plan.memory_mib
                )
            },
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

/// Whether a failed run puts the snapshot it restored from in doubt: the VMM could not resume
/// the state (a changed QEMU, a damaged file) or the agent in it never answered, so the next
/// run makes a new snapshot rather than failing the same way again.
fn snapshot_is_suspect(error: &Error) -> bool {
    matches!(
        error.setup_stage(),
        Some(SetupStage::AgentReady | SetupStage::Restore | SetupStage::Vmm)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_discarded_only_when_the_vmm_or_agent_could_not_resume_it() {
        let failed = |at| Error::setup(at, "step", std::io::Error::other("failed"));
        for at in [SetupStage::AgentReady, SetupStage::Restore, SetupStage::Vmm] {
            assert!(snapshot_is_suspect(&failed(at)), "{at}");
        }
        for at in [
            SetupStage::AgentChannel,
            SetupStage::AgentRun,
            SetupStage::Grants,
            SetupStage::Host,
            SetupStage::Egress,
        ] {
            assert!(!snapshot_is_suspect(&failed(at)), "{at}");
        }
        assert!(!snapshot_is_suspect(&Error::Cancelled));
    }
}
