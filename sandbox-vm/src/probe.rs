//! The one host probe of the microVM backend: can KVM really boot a guest here?
//!
//! Opening `/dev/kvm` is not enough: under a nested paravirtual KVM a tiny guest runs but a
//! stock kernel hangs. So the probe boots the real guest once with `accel=kvm` and a short
//! ready timeout, and caches the answer in the state directory (`$STRATA_STATE_DIR`, else
//! `/var/lib/strata` for root, else `$XDG_CACHE_HOME/strata` or `~/.cache/strata`), keyed by
//! the host kernel release and the guest kernel version. `STRATA_VM_ACCEL=tcg|kvm` skips
//! the probe.

use std::path::PathBuf;
use std::time::Duration;

use crate::vmm::Accel;

/// How long the KVM probe waits for the agent (a working KVM boots in well under a second).
pub const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The accelerator decision and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccelProbe {
    /// What runs guests.
    pub accel: Accel,
    /// Why, for `doctor` and errors.
    pub reason: String,
}

/// Decides the accelerator. `boot_with_kvm` boots the guest under KVM and says whether the
/// agent came up; it runs only when nothing cached or forced answers.
pub fn decide(guest_kernel: &str, boot_with_kvm: impl FnOnce() -> bool) -> AccelProbe {
    match std::env::var("STRATA_VM_ACCEL").as_deref() {
        Ok("tcg") => {
            return AccelProbe {
                accel: Accel::Tcg,
                reason: "forced by STRATA_VM_ACCEL=tcg".into(),
            }
        }
        Ok("kvm") => {
            return AccelProbe {
                accel: Accel::Kvm,
                reason: "forced by STRATA_VM_ACCEL=kvm (not probed)".into(),
            }
        }
        _ => {}
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return AccelProbe {
            accel: Accel::Tcg,
            reason: "/dev/kvm cannot be opened".into(),
        };
    }
    let host = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let key = format!("host {host} guest {guest_kernel}");
    let cache = state_dir().map(|d| d.join("microvm-kvm-probe"));
    if let Some(cached) = cache.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        let mut lines = cached.lines();
        if lines.next() == Some(key.as_str()) {
            let boots = lines.next() == Some("kvm boots");
            return verdict(boots, " (cached)");
        }
    }
    let boots = boot_with_kvm();
    if let Some(path) = cache {
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let answer = if boots { "kvm boots" } else { "kvm hangs" };
        let _ = std::fs::write(&path, format!("{key}\n{answer}\n"));
    }
    verdict(boots, "")
}

fn verdict(boots: bool, suffix: &str) -> AccelProbe {
    if boots {
        AccelProbe {
            accel: Accel::Kvm,
            reason: format!("a guest boots under /dev/kvm{suffix}"),
        }
    } else {
        AccelProbe {
            accel: Accel::Tcg,
            reason: format!(
                "/dev/kvm opens but the guest kernel does not boot under it within {} s (nested KVM){suffix}",
                KVM_PROBE_TIMEOUT.as_secs()
            ),
        }
    }
}

/// Strata's state directory for this user.
pub fn state_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("STRATA_STATE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if rustix::process::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/strata"));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("strata"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/strata"))
}
