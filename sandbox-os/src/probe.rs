//! One-time host probe for the process backend (`strata doctor`, fail-closed checks).

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use sandbox_core::Check;

use crate::cgroup::{self, Layout};
use crate::sys;

/// What this host offers the process backend.
#[derive(Clone, Debug)]
pub struct HostProbe {
    /// Landlock ABI (0 = unavailable).
    pub landlock_abi: i32,
    /// seccomp filters can be installed.
    pub seccomp: bool,
    /// The helper could create user, mount, pid, net, ipc, uts and cgroup namespaces
    /// (`None`: not probed; the run itself fails closed if they cannot be created).
    pub namespaces: Option<Result<(), String>>,
    /// Where per-run cgroups go, or why there are none.
    pub cgroup: Result<Layout, String>,
    /// Caller's effective uid and gid.
    pub ids: (u32, u32),
}

/// What `strata-helper probe` prints (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
pub struct HelperProbe {
    /// `unshare` of every namespace Strata uses succeeded in a child.
    pub namespaces_ok: bool,
    /// The error otherwise.
    pub error: Option<String>,
}

impl HostProbe {
    /// The cheap probe (no child process), computed once per process. Runs use it; a
    /// missing namespace feature then fails the run closed in the helper.
    pub fn cached() -> HostProbe {
        static CACHE: OnceLock<HostProbe> = OnceLock::new();
        CACHE
            .get_or_init(|| HostProbe {
                landlock_abi: sys::landlock_abi(),
                seccomp: sys::seccomp_available(),
                namespaces: None,
                cgroup: cgroup::detect(),
                ids: sys::ids(),
            })
            .clone()
    }

    /// The full probe, using `helper` to test namespace creation in a child process (the
    /// embedding process itself is never forked or unshared). Used by `strata doctor`.
    pub fn run(helper: Option<&Path>) -> Self {
        let namespaces = match helper {
            Some(helper) => probe_namespaces(helper),
            None => Err("strata-helper binary not found".to_string()),
        };
        HostProbe {
            namespaces: Some(namespaces),
            ..HostProbe::cached()
        }
    }

    /// The probe as doctor checks.
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = vec![
            Check::new(
                "landlock",
                self.landlock_abi > 0,
                if self.landlock_abi > 0 {
                    format!("ABI {}", self.landlock_abi)
                } else {
                    "not available (kernel without landlock, or not in the lsm= list)".to_string()
                },
            ),
            Check::new(
                "seccomp",
                self.seccomp,
                if self.seccomp {
                    "filters available"
                } else {
                    "not available"
                },
            ),
            Check::new(
                "namespaces",
                matches!(self.namespaces, Some(Ok(()))),
                match &self.namespaces {
                    Some(Ok(())) => "user, mount, pid, net, ipc, uts, cgroup".to_string(),
                    Some(Err(e)) => e.clone(),
                    None => "not probed".to_string(),
                },
            ),
        ];
        checks.push(match &self.cgroup {
            Ok(layout) => Check::new("cgroup", true, format!("{} (memory, pids)", layout.name())),
            Err(e) => Check::new(
                "cgroup",
                false,
                format!("{e}; memory and processes fall back to rlimits"),
            ),
        });
        checks
    }
}

fn probe_namespaces(helper: &Path) -> Result<(), String> {
    let output = Command::new(helper)
        .arg("probe")
        .env_clear()
        .output()
        .map_err(|e| format!("cannot run {}: {e}", helper.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let probe: HelperProbe = serde_json::from_str(text.trim())
        .map_err(|e| format!("helper probe printed {text:?}: {e}"))?;
    if probe.namespaces_ok {
        Ok(())
    } else {
        Err(probe
            .error
            .unwrap_or_else(|| "namespace creation failed".into()))
    }
}

/// `strata-helper probe`: tries to create the namespaces in a forked child and prints the
/// result as JSON. Returns the exit code.
pub fn helper_probe() -> i32 {
    let result = match sys::fork() {
        Ok(sys::Fork::Child) => {
            let flags = libc::CLONE_NEWUSER
                | libc::CLONE_NEWNS
                | libc::CLONE_NEWPID
                | libc::CLONE_NEWNET
                | libc::CLONE_NEWIPC
                | libc::CLONE_NEWUTS
                | libc::CLONE_NEWCGROUP;
            let code = match sys::unshare(flags) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(255).clamp(1, 255),
            };
            sys::exit_now(code)
        }
        Ok(sys::Fork::Parent(pid)) => match sys::wait4(pid, 0) {
            Ok(Some((_, status, _))) if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => HelperProbe {
                namespaces_ok: true,
                error: None,
            },
            Ok(Some((_, status, _))) => HelperProbe {
                namespaces_ok: false,
                error: Some(format!(
                    "unshare(user|mount|pid|net|ipc|uts|cgroup) failed: {} (is kernel.unprivileged_userns_clone or user.max_user_namespaces 0, or an AppArmor userns restriction on?)",
                    std::io::Error::from_raw_os_error(libc::WEXITSTATUS(status))
                )),
            },
            _ => HelperProbe {
                namespaces_ok: false,
                error: Some("probe child vanished".into()),
            },
        },
        Err(e) => HelperProbe {
            namespaces_ok: false,
            error: Some(format!("fork: {e}")),
        },
    };
    match serde_json::to_string(&result) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(_) => 1,
    }
}
