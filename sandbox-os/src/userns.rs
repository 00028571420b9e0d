//! Why this host gives the process backend no user namespace, in words a user can act on.
//! The helper's run refusal and `strata doctor` say the same thing.
//!
//! Three ways a host withholds them, each seen in the field: `unshare(CLONE_NEWUSER)`
//! fails with `ENOSPC` (`user.max_user_namespaces` is 0, or used up), with `EPERM` (Debian's
//! `kernel.unprivileged_userns_clone=0`, a container runtime's seccomp profile, a parent
//! namespace that forbids nesting), or it succeeds but the namespace holds no capabilities
//! (Ubuntu 23.10+'s AppArmor restriction, `kernel.apparmor_restrict_unprivileged_userns=1`),
//! so the first step that needs them (setgroups, the id maps, a mount) fails.

use sandbox_core::SetupStage;

use crate::protocol::Event;

/// How creating or using a user namespace failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// `unshare` itself failed with this errno.
    Create(i32),
    /// The namespace was made, but `step` (which needs its capabilities) failed.
    Powerless {
        /// What failed, e.g. `"write uid_map"`.
        step: &'static str,
        /// Its errno.
        errno: i32,
    },
}

/// The guarantee a run lacks without a user namespace (every other namespace of the process
/// sandbox is made inside it).
pub(crate) const GUARANTEE: &str =
    "isolation: user namespace (and in it the mount, pid, ipc, uts and network namespaces)";

/// What to do about it.
const REMEDY: &str = "to enable them: sysctl user.max_user_namespaces=15000 (ENOSPC), sysctl kernel.unprivileged_userns_clone=1 (Debian), sysctl kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile that grants `userns,` to strata-helper (Ubuntu 23.10+), or, in a container, a runtime or seccomp profile that allows them; until then the process backend cannot sandbox here (the wasm backend, and the container backend on a Docker engine, need none)";

/// Whether `failure` is the host withholding user namespaces (rather than something else
/// going wrong while the sandbox was built).
pub(crate) fn withheld(failure: Failure) -> bool {
    match failure {
        Failure::Create(errno) => matches!(
            errno,
            libc::EPERM | libc::EACCES | libc::ENOSPC | libc::EUSERS | libc::EINVAL | libc::ENOSYS
        ),
        Failure::Powerless { errno, .. } => matches!(errno, libc::EPERM | libc::EACCES),
    }
}

/// What the host's sysctls already say, without creating anything: `user.max_user_namespaces`
/// of 0 in this user namespace, or (for an unprivileged caller) Debian's
/// `kernel.unprivileged_userns_clone` of 0. `None` when neither withholds them; other
/// refusals (AppArmor's powerless namespaces, seccomp) show when the helper tries.
pub(crate) fn withheld_by_sysctl(euid: u32) -> Option<Failure> {
    let zero = |path: &str| std::fs::read_to_string(path).is_ok_and(|value| value.trim() == "0");
    if zero("/proc/sys/user/max_user_namespaces") {
        return Some(Failure::Create(libc::ENOSPC));
    }
    if euid != 0 && zero("/proc/sys/kernel/unprivileged_userns_clone") {
        return Some(Failure::Create(libc::EPERM));
    }
    None
}

/// Whether AppArmor's restriction of unprivileged user namespaces is on for this caller
/// (`kernel.apparmor_restrict_unprivileged_userns=1`, not root): namespaces are then made
/// powerless unless a profile grants `userns` to the helper, which only trying tells.
pub(crate) fn apparmor_may_restrict(euid: u32) -> bool {
    euid != 0
        && std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .is_ok_and(|value| value.trim() == "1")
}

/// The helper's refusal of a run on a host that withholds user namespaces: what is missing,
/// why, and how to enable them ([`explain`]).
pub(crate) fn refusal(failure: Failure, step: &str) -> Event {
    let errno = match failure {
        Failure::Create(errno) | Failure::Powerless { errno, .. } => errno,
    };
    Event::SetupFailed {
        stage: SetupStage::Namespaces,
        step: step.to_string(),
        errno,
        message: explain(failure),
        unenforceable: Some(GUARANTEE.to_string()),
    }
}

/// The cause in words, then the remedy.
pub(crate) fn explain(failure: Failure) -> String {
    let cause = match failure {
        Failure::Create(errno) => {
            let error = std::io::Error::from_raw_os_error(errno);
            match errno {
                libc::ENOSPC | libc::EUSERS => format!(
                    "user namespaces are unavailable: user.max_user_namespaces is 0 or used up for this user ({error})"
                ),
                libc::EPERM | libc::EACCES => format!(
                    "unprivileged user namespaces are disabled: kernel.unprivileged_userns_clone=0, a container's seccomp profile, or a parent namespace that forbids them ({error})"
                ),
                libc::EINVAL | libc::ENOSYS => {
                    format!("this kernel has no user namespaces (CONFIG_USER_NS) ({error})")
                }
                _ => format!("unshare(CLONE_NEWUSER) failed ({error})"),
            }
        }
        Failure::Powerless { step, errno } => format!(
            "a user namespace is created without capabilities (an AppArmor restriction such as kernel.apparmor_restrict_unprivileged_userns=1): {step}: {}",
            std::io::Error::from_raw_os_error(errno)
        ),
    };
    format!("{cause}; {REMEDY}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_of_withholding_user_namespaces_is_named_with_its_remedy() {
        let limit = explain(Failure::Create(libc::ENOSPC));
        assert!(limit.contains("user.max_user_namespaces is 0"), "{limit}");
        let disabled = explain(Failure::Create(libc::EPERM));
        assert!(
            disabled.contains("kernel.unprivileged_userns_clone=0"),
            "{disabled}"
        );
        let apparmor = explain(Failure::Powerless {
            step: "write uid_map",
            errno: libc::EPERM,
        });
        assert!(apparmor.contains("without capabilities"), "{apparmor}");
        assert!(apparmor.contains("write uid_map"), "{apparmor}");
        for text in [limit, disabled, apparmor] {
            assert!(text.contains("to enable them: sysctl"), "{text}");
            assert!(!text.contains("best-effort"), "{text}");
        }
        assert!(withheld(Failure::Create(libc::ENOSPC)));
        assert!(!withheld(Failure::Create(libc::ENOMEM)));
        assert!(!withheld(Failure::Powerless {
            step: "mount",
            errno: libc::ENOENT
        }));
    }
}
