//! The seam between the backend and a virtual machine monitor: QEMU `microvm` here
//! ([`crate::qemu::Qemu`]); Firecracker later, where KVM works.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use sandbox_agent::Carrier;
use sandbox_core::Result;

/// How guest instructions execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Accel {
    /// Hardware virtualisation through `/dev/kvm`.
    Kvm,
    /// QEMU's TCG: every guest instruction emulated (slower, no KVM needed).
    Tcg,
}

impl Accel {
    /// The name QEMU's `-accel` / `-M ...,accel=` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }

    /// How receipts and `doctor` describe it: `kvm (hardware)` or `tcg (emulated)`.
    pub fn describe(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm (hardware)",
            Accel::Tcg => "tcg (emulated)",
        }
    }
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A disk image attached as a virtio block device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// The raw image file.
    pub path: PathBuf,
    /// Opened read-only by the VMM: the guest cannot write it whatever it mounts or
    /// remounts (writes fail with an I/O error).
    pub read_only: bool,
    /// The serial number the guest sees (`/sys/block/vdX/serial`), how the guest finds
    /// the disk; at most 20 bytes.
    pub serial: String,
}

/// The guest's way out: QEMU's user-mode network with `restrict=on` (the guest reaches
/// nothing) except one forward, [`NetRelay::GUEST_PROXY`], whose connections run
/// `program relay socket`, which joins them to the host's egress proxy on `socket`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetRelay {
    /// The relay program (the guest agent binary, in its `relay` mode).
    pub program: PathBuf,
    /// The proxy's Unix socket for this run.
    pub socket: PathBuf,
}

impl NetRelay {
    /// Where the guest reaches the proxy: `10.0.2.100:3128`.
    pub const GUEST_PROXY: &'static str = "10.0.2.100:3128";
}

/// One VM to start.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The guest kernel (bzImage).
    pub kernel: PathBuf,
    /// The initramfs as booted (agent segment + base archive).
    pub initrd: PathBuf,
    /// Disks, in order (the root disk first).
    pub disks: Vec<Disk>,
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Accelerator.
    pub accel: Accel,
    /// A private directory for the VMM's sockets; the caller removes it.
    pub dir: PathBuf,
    /// Bytes of serial console output kept (the tail); the rest is read and dropped, so a
    /// guest flooding its console neither blocks nor fills a disk.
    pub console_cap: usize,
    /// How long the VMM may take to connect the agent channel after it started.
    pub connect_timeout: Duration,
    /// A network device whose only peer is a relay to the run's egress proxy (`None`: no
    /// network device at all).
    pub network: Option<NetRelay>,
    /// Restore this saved VM state instead of booting (the devices must be the ones the
    /// state was saved with; disk contents may differ).
    pub incoming: Option<PathBuf>,
}

/// A virtual machine monitor that can start a VM with a kernel, an initramfs and an agent
/// channel.
pub trait Vmm: Send + Sync {
    /// The VMM's name for receipts (`"qemu microvm"`).
    fn name(&self) -> &'static str;

    /// Starts a VM. The returned instance owns the VMM process: dropping it kills and reaps
    /// the process.
    ///
    /// # Errors
    /// [`sandbox_core::Error::Setup`] when the VMM cannot start or does not connect the
    /// agent channel in time.
    fn start(&self, config: &VmConfig) -> Result<Box<dyn VmInstance>>;
}

/// A running VM: the agent's [`Carrier`] (its channel is the virtio-serial port, its end the
/// VMM exiting, its diagnostics the serial console's tail and the VMM's error output, its
/// teardown a kill and reap), plus what only a VM can do.
pub trait VmInstance: Carrier {
    /// The VMM's process id, for measurements (`None` once reaped).
    fn pid(&self) -> Option<u32>;

    /// Pauses the VM and saves its whole state (RAM, devices, vCPUs) to `path`, for
    /// [`VmConfig::incoming`]. The VM stays paused.
    ///
    /// # Errors
    /// When the VMM cannot save (the file is left incomplete; the caller removes it).
    fn save(&mut self, path: &std::path::Path) -> Result<()>;

    /// Waits until a VM started with [`VmConfig::incoming`] has loaded its state and runs.
    ///
    /// # Errors
    /// When loading fails or `deadline` passes first.
    fn wait_running(&mut self, deadline: std::time::Instant) -> Result<()>;

    /// Stops (`false`) or continues (`true`) the VM's vCPUs (QMP `stop`/`cont`): a stopped
    /// VM runs no guest code and its virtual clock stands still; its RAM is kept.
    ///
    /// # Errors
    /// When the VMM does not answer or refuses.
    fn set_running(&mut self, running: bool) -> Result<()>;
}
