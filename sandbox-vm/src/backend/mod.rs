//! [`MicrovmBackend`]: one freshly booted VM per run.
//!
//! Module map: [`config`] (the VM's devices), [`snapshots`] (boot once, restore per run; the
//! pool's restorer), [`egress`] (the run's proxy and relay), [`run`] (one run), [`live`] (a
//! VM held for a live sandbox), [`receipt`]
//! (what the run's receipt says), [`report`] (artifacts, accelerator probe, doctor).

mod config;
mod egress;
mod live;
mod receipt;
mod report;
mod run;
mod snapshots;

use config::*;
use receipt::*;
use run::*;
use snapshots::*;

use sandbox_core::SetupStage;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sandbox_core::grant::RealHost;
use sandbox_core::{
    Backend, BackendKind, BackendReport, ByteSize, Capability, Caps, Check, Error, ExitStatus,
    LimitKind, Mechanism, Net, Receipt, ResourceUsage, Result, RunContext, RunOutput, RunSpec,
    Stream, Strictness, Tool,
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
use sandbox_agent::applied;
use sandbox_agent::inner::{self, InnerPaths};
use sandbox_agent::protocol::GuestExit;
use sandbox_agent::request::{self, Base};
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

/// How the guest shapes the agent's requests: [`GUEST_ENV`], `/tmp` as the working directory
/// when the caps name none, the caller's proxy variables always dropped (the guest's only
/// way out is the egress proxy), and the inner CLI's state under `/run/strata/state`.
const GUEST: Base = Base {
    env: &GUEST_ENV,
    default_cwd: Some("/tmp"),
    strip_proxy_always: true,
    inner_env: &[
        GUEST_ENV[0],
        GUEST_ENV[1],
        GUEST_ENV[2],
        ("STRATA_STATE_DIR", "/run/strata/state"),
    ],
    inner_cwd: "/",
};

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
        let spec = RunSpec::plan(
            BackendKind::Microvm,
            &Tool::command(["true"]),
            caps,
            &RealHost,
        )?;
        let plan = plan(&spec.caps, Strictness::BestEffort)?.with_layers(&spec.caps, layered)?;
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
}

impl Backend for MicrovmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Microvm
    }

    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput> {
        spec.require_kind(BackendKind::Microvm)?;
        self.run_tool(tool, &spec.caps, ctx)
    }

    fn report(&self) -> BackendReport {
        self.backend_report()
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
