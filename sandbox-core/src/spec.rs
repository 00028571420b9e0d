//! The run spec: everything a backend enforces for one run, produced once from [`Caps`].
//!
//! [`RunSpec::plan`] validates the tool and the caps (the only validation on the run path:
//! backends receive the spec and do not validate again), applies the backend kind's rules
//! (whose root the sandbox owns) and, for backends that bind host paths into the sandbox,
//! resolves every grant on the host: symlinks refused or followed as the grant says,
//! host-executed paths in writable grants found and protected. The result is plain, versioned serde data:
//! it is what crosses to the process backend's helper (and to a guest agent or a cluster
//! driver), and two runs with equal specs can use interchangeable pre-built sandboxes, so
//! a warm pool keys on the whole spec and cannot mix up two runs' limits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::caps::{Access, Caps, Limits, Mount, Net, SystemDirs};
use crate::error::{Error, Result};
use crate::grant::{self, HostLookup};
use crate::tool::Tool;

/// The version of [`RunSpec`]'s shape. A receiver refuses any other version (fail closed:
/// an old helper must not half-understand a newer spec).
pub const RUN_SPEC_VERSION: u32 = 2;

/// Everything a backend enforces for one run. Build it with [`RunSpec::plan`]; see the
/// module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// [`RUN_SPEC_VERSION`] when built.
    pub version: u32,
    /// The backend the spec was planned for: its rules were applied, and only it runs the
    /// spec ([`RunSpec::require_kind`]).
    pub backend: BackendKind,
    /// The caller's grants, resolved on the host, sorted so parents come before children,
    /// for the backends that bind host paths (process, container); empty for the others,
    /// which carry grants their own way (wasm preopens, microVM disk images, none in a pod).
    /// System directories are not here: they depend on the backend ([`RunSpec::system`]).
    pub mounts: Vec<MountSpec>,
    /// Which host system directories the run may read (backends that run host programs).
    pub system: SystemDirs,
    /// The tool's environment as the caps set it; backends add their defaults (`PATH`,
    /// `HOME`, `LANG`) only for keys not set here.
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (`/tmp` unless the caps set one).
    pub workdir: PathBuf,
    /// Network policy.
    pub net: Net,
    /// Every resource limit, including those a cgroup enforces.
    pub limits: Limits,
    /// The agent the run acts for, if named (its identity is the backend's to map).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// Existing host-executed paths in writable directory grants are bound read-only
    /// (their entries are in `mounts`); `false` only when the caps opted out.
    pub protect_host_executed: bool,
    /// The caps the spec was planned from, as validated. Host-side only: never serialized
    /// (a helper or a guest gets the fields above). Backends read from it what the spec
    /// does not restate (stdin, secrets, the container image, the caller's grants as given).
    #[serde(skip)]
    pub caps: Caps,
}

/// A host path bound into the sandbox, resolved on the host.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Canonical host path (no symlinks); opened with `RESOLVE_NO_SYMLINKS` so a swap
    /// between planning and mounting fails instead of redirecting.
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// Read-write (otherwise read-only, recursively).
    pub writable: bool,
    /// The source is a directory (otherwise a file).
    pub is_dir: bool,
    /// Allow executing files from it.
    pub exec: bool,
    /// Why the mount exists. Backends mount every role alike; receipts and file policies
    /// tell them apart.
    pub role: MountRole,
    /// For a caller's grant whose symlinks were followed (`follow_symlinks`): the host path
    /// the caller gave, which resolved to `source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followed_from: Option<PathBuf>,
}

/// What a [`MountSpec`] is for.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum MountRole {
    /// A host system directory (`/usr`, ...) so host programs can run.
    System,
    /// A path the caller granted.
    Grant,
    /// A host-executed path inside a writable grant, bound read-only over it.
    HostExecuted,
    /// A directory between a writable grant's root and a host-executed path, bound onto
    /// itself (still writable) so it cannot be renamed or removed.
    Pin,
}

impl RunSpec {
    /// Plans `tool` under `caps` for the `kind` of backend: validates both (an empty command
    /// is the image's own for a container), refuses a grant
    /// at the guest root for backends that own their root (process, container, microVM), and
    /// resolves the grants on `host` for backends that bind host paths (process, container).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a tool or caps no backend could honour, a root grant
    /// the kind refuses, and grants that do not exist or hold a symlink the grant does not
    /// follow (or a host-executed path it cannot protect).
    pub fn plan<H: HostLookup + ?Sized>(
        kind: BackendKind,
        tool: &Tool,
        caps: &Caps,
        host: &H,
    ) -> Result<RunSpec> {
        match (kind, tool) {
            // A container runs its image's own command when the argv is empty.
            (BackendKind::Container, Tool::Command { argv }) if argv.is_empty() => {}
            _ => tool.validate()?,
        }
        Self::for_kind(kind, caps, host)
    }

    /// [`RunSpec::plan`] for the process backend without a tool: the caps' part of a plan.
    ///
    /// # Errors
    /// As [`RunSpec::plan`].
    pub fn new<H: HostLookup + ?Sized>(caps: &Caps, host: &H) -> Result<RunSpec> {
        Self::for_kind(BackendKind::Process, caps, host)
    }

    fn for_kind<H: HostLookup + ?Sized>(
        kind: BackendKind,
        caps: &Caps,
        host: &H,
    ) -> Result<RunSpec> {
        caps.validate()?;
        let (owns_root, binds_host_paths) = match kind {
            BackendKind::Process | BackendKind::Container => (true, true),
            BackendKind::Microvm => (true, false),
            _ => (false, false),
        };
        if owns_root {
            caps.refuse_root_mount(kind)?;
        }
        let mut mounts = Vec::new();
        if binds_host_paths {
            for mount in &caps.mounts {
                grant_mounts(mount, caps, host, &mut mounts)?;
            }
            sort_mounts(&mut mounts);
        }
        Ok(RunSpec {
            version: RUN_SPEC_VERSION,
            backend: kind,
            mounts,
            system: caps.system,
            env: caps.env.clone(),
            workdir: caps.effective_workdir().to_path_buf(),
            net: caps.net.clone(),
            limits: caps.limits.clone(),
            agent: caps.agent.clone(),
            protect_host_executed: caps.protect_host_executed,
            caps: caps.clone(),
        })
    }

    /// A copy without the host-side caps: what crosses to a helper, a guest or a pool key
    /// (the caps' stdin may be large, and none of it is sent).
    pub fn detached(&self) -> RunSpec {
        RunSpec {
            version: self.version,
            backend: self.backend,
            mounts: self.mounts.clone(),
            system: self.system,
            env: self.env.clone(),
            workdir: self.workdir.clone(),
            net: self.net.clone(),
            limits: self.limits.clone(),
            agent: self.agent.clone(),
            protect_host_executed: self.protect_host_executed,
            caps: Caps::default(),
        }
    }

    /// Refuses a spec planned for another kind of backend than `kind` (its rules would not
    /// be this backend's).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming both kinds.
    pub fn require_kind(&self, kind: BackendKind) -> Result<()> {
        if self.backend == kind {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "a run spec planned for the {} backend was given to the {kind} backend (plan it with RunSpec::plan for {kind})",
                self.backend
            )))
        }
    }

    /// Refuses a spec of another version.
    pub fn check_version(&self) -> Result<()> {
        if self.version == RUN_SPEC_VERSION {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "run spec version {} is not understood here (this side speaks version {RUN_SPEC_VERSION}); the library and its helper must come from the same release",
                self.version
            )))
        }
    }

    /// Whether a read-write directory of the caller is bound.
    pub fn has_writable_dir_grant(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| m.role == MountRole::Grant && m.writable && m.is_dir)
    }
}

/// Sorts mounts so parents come before children; stable, so a grant's pins and read-only
/// entries keep following it at equal depth.
pub fn sort_mounts(mounts: &mut [MountSpec]) {
    mounts.sort_by_key(|m| m.target.components().count());
}

/// The mounts of one caller's grant: the grant itself at its resolved host path (refused
/// when its host path holds a symlink and the grant does not follow symlinks), and, for a
/// writable directory, its existing host-executed paths bound read-only with their parent
/// directories pinned (unless the caps opt out). Entries that another, deeper grant of the
/// caller covers are left to that grant.
fn grant_mounts<H: HostLookup + ?Sized>(
    mount: &Mount,
    caps: &Caps,
    host: &H,
    mounts: &mut Vec<MountSpec>,
) -> Result<()> {
    let grant = grant::resolve(mount, host)?;
    let writable = mount.access == Access::ReadWrite;
    mounts.push(MountSpec {
        source: grant.resolved.clone(),
        target: mount.guest.clone(),
        writable,
        is_dir: grant.is_dir,
        exec: true,
        role: MountRole::Grant,
        followed_from: grant.followed_symlinks.then(|| grant.requested.clone()),
    });
    if !(writable && grant.is_dir && caps.protect_host_executed) {
        return Ok(());
    }
    let found = grant::host_executed(&grant.resolved, host);
    if let Some(err) = found.refusal(&grant.resolved) {
        return Err(err);
    }
    // Inside another, deeper grant of the caller, the path shows that grant's content (and
    // that grant gets its own protection); a deeper grant further down changes nothing.
    let covered = |target: &Path| {
        caps.mounts.iter().any(|other| {
            other.guest != mount.guest
                && other.guest.starts_with(&mount.guest)
                && target.starts_with(&other.guest)
        })
    };
    let pins = found.pins.iter().map(|rel| (rel, true, MountRole::Pin));
    let read_only = found
        .read_only
        .iter()
        .map(|(rel, is_dir)| (rel, *is_dir, MountRole::HostExecuted));
    for (rel, is_dir, role) in pins.chain(read_only) {
        let target = mount.guest.join(rel);
        if covered(&target) {
            continue;
        }
        mounts.push(MountSpec {
            source: grant.resolved.join(rel),
            target,
            writable: role == MountRole::Pin,
            is_dir,
            exec: true,
            role,
            followed_from: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;
    use crate::grant::EntryKind;

    /// A host with two plain directories.
    struct TwoDirs;

    impl HostLookup for TwoDirs {
        fn entry(&self, path: &Path) -> io::Result<EntryKind> {
            match path.to_str() {
                Some("/" | "/data" | "/data/in" | "/out") => Ok(EntryKind::Dir),
                _ => Err(io::Error::from_raw_os_error(2)),
            }
        }
        fn link_target(&self, _: &Path) -> io::Result<PathBuf> {
            Err(io::Error::from_raw_os_error(22))
        }
        fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
            Ok(path.to_path_buf())
        }
    }

    #[test]
    fn a_spec_carries_every_limit_and_sorted_grants() {
        let mut caps = Caps::new()
            .mount("/data/in", "/work/in", Access::ReadOnly)
            .mount("/data", "/work", Access::ReadOnly);
        caps.limits.cpus = 0.5;
        let spec = RunSpec::new(&caps, &TwoDirs).expect("spec");
        assert_eq!(spec.version, RUN_SPEC_VERSION);
        assert_eq!(spec.limits.cpus, 0.5);
        let targets: Vec<_> = spec.mounts.iter().map(|m| m.target.clone()).collect();
        assert_eq!(
            targets,
            [PathBuf::from("/work"), PathBuf::from("/work/in")],
            "parents first"
        );
        assert_eq!(spec.workdir, PathBuf::from("/tmp"));
    }

    #[test]
    fn specs_differing_only_in_cpus_differ() {
        let caps = Caps::new();
        let mut other = caps.clone();
        other.limits.cpus = 0.25;
        let a = RunSpec::new(&caps, &TwoDirs).expect("spec");
        let b = RunSpec::new(&other, &TwoDirs).expect("spec");
        assert_ne!(a, b);
        assert_ne!(
            serde_json::to_string(&a).expect("json"),
            serde_json::to_string(&b).expect("json")
        );
    }

    #[test]
    fn missing_grants_and_bad_caps_are_refused_before_anything_runs() {
        let missing = Caps::new().read_only("/nope");
        let err = RunSpec::new(&missing, &TwoDirs).expect_err("missing grant");
        assert!(err.to_string().contains("/nope"), "{err}");
        let mut zero = Caps::new();
        zero.limits.processes = 0;
        assert!(RunSpec::new(&zero, &TwoDirs).is_err());
        // The wasm backend's root grant is not the process sandbox's: its root is its own.
        let root = Caps::new().mount("/a", "/", crate::Access::ReadOnly);
        let err = RunSpec::new(&root, &TwoDirs).expect_err("root grant");
        assert!(err.to_string().contains("root cannot be a mount"), "{err}");
    }

    #[test]
    fn another_version_is_refused() {
        let mut spec = RunSpec::new(&Caps::new(), &TwoDirs).expect("spec");
        assert!(spec.check_version().is_ok());
        spec.version += 1;
        let err = spec.check_version().expect_err("version");
        assert!(err.to_string().contains("version"), "{err}");
    }
}
