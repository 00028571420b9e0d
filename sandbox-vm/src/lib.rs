//! Strata's microVM backend: a guest kernel per sandbox.
//!
//! [`MicrovmBackend`] boots Debian's cloud kernel with Strata's initramfs under QEMU
//! `-M microvm` (KVM where a probe shows it really boots a guest, TCG otherwise), runs the
//! tool through `strata-guest-agent` over virtio-serial (the protocol and run driver of
//! [`sandbox_agent`], shared with the cluster backend), and switches the VM off at the end
//! of the run. The VMM sits behind the [`Vmm`] trait so Firecracker can be
//! a second implementation where KVM works.
//!
//! Module map: [`vmm`] (the VMM seam; a VM is the agent's [`sandbox_agent::Carrier`]),
//! [`qemu`] (QEMU microvm), [`artifacts`] (locating kernel, initramfs, root image, agent;
//! the guest tools disk), [`probe`] (KVM or TCG), [`session`] (one run in one VM: start,
//! drive the agent, switch off), [`snapshot`] (boot once, restore per run), [`pool`] (VMs restored ahead of
//! time), [`grants`] (host directories as
//! disk images, read-write ones written back through a filter), [`input`] (the image or
//! module an inner run needs, on the input disk), [`live`] (a VM that stays up for a live
//! sandbox; [`live_files`] its files), `backend` ([`MicrovmBackend`]).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod artifacts;
mod backend;
pub mod grants;
pub mod input;
pub mod leftovers;
pub mod live;
pub mod live_files;
pub mod pool;
pub mod probe;
pub mod qemu;
pub mod session;
pub mod snapshot;
pub mod vmm;

pub use backend::{MicrovmBackend, DEFAULT_CONSOLE_CAP, DEFAULT_READY_TIMEOUT, MIN_GUEST_MIB};
pub use live::LiveVm;
pub use live_files::VmFiles;
pub use sandbox_agent::Carrier;
pub use vmm::{Accel, Disk, NetRelay, VmConfig, VmInstance, Vmm};
