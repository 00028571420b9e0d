//! Landlock rules of the process sandbox: which paths of the new root get which rights.
//!
//! The mount namespace already decides what exists; landlock is the second, independent
//! wall: even a tool that escaped the mount namespace could only use these paths, with
//! these rights. Rules are built by a pure function ([`rules`]) and enforced by [`enforce`].
//!
//! What landlock cannot do: take a right away beneath a path that has it. Rights are the
//! union of the rules on a path and all its parents, so a host-executed path inside a
//! writable grant (`/ws/.git/hooks`) keeps the grant's write rights as far as landlock is
//! concerned. Those paths are protected by the mount layer alone: a read-only bind over
//! them (`EROFS` for write, truncate, chmod, create and delete inside) that is itself a
//! mount point (`EBUSY` for renaming, replacing or removing it), with every directory
//! between it and the grant's root pinned the same way (so `.git` cannot be renamed
//! aside and rebuilt). [`rules`] adds no rule for them, so nothing re-grants anything.

use std::path::{Path, PathBuf};

use landlock::{
    make_bitflags, Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::protocol::{LandlockStatus, MountRole, Spec};

/// The landlock ABI whose rights Strata asks for. Newer kernels enforce all of them;
/// older ones enforce a subset and the receipt says "partially enforced".
pub const TARGET_ABI: ABI = ABI::V6;

/// Rights granted on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Read files, list directories, execute.
    ReadExec,
    /// Read files and list directories only (`/proc`, synthesized `/etc` files).
    Read,
    /// List directories only (the root tmpfs, so `ls /` works; it holds no file data).
    List,
    /// Read and write device files (`/dev/null`, ...).
    Device,
    /// Full access beneath, without execute (scratch `/tmp`, workdir, `/dev/shm`).
    ReadWrite,
    /// Full access beneath, including execute (read-write mounts).
    ReadWriteExec,
}

impl Grant {
    fn access(self) -> BitFlags<AccessFs> {
        let read = make_bitflags!(AccessFs::{ReadFile | ReadDir});
        let write = make_bitflags!(AccessFs::{
            WriteFile | RemoveDir | RemoveFile | MakeDir | MakeReg | MakeSock | MakeFifo | MakeSym | Refer | Truncate
        });
        match self {
            Grant::ReadExec => read | AccessFs::Execute,
            Grant::Read => read,
            Grant::List => make_bitflags!(AccessFs::{ReadDir}),
            Grant::Device => make_bitflags!(AccessFs::{ReadFile | WriteFile}),
            Grant::ReadWrite => read | write,
            Grant::ReadWriteExec => read | write | AccessFs::Execute,
        }
    }
}

/// One landlock rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Path inside the new root.
    pub path: PathBuf,
    /// Rights beneath it.
    pub grant: Grant,
}

/// Device files every sandbox gets.
pub const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// The rules implied by a spec. Pure: no file is opened.
pub fn rules(spec: &Spec) -> Vec<Rule> {
    let mut rules = vec![
        Rule {
            path: "/".into(),
            grant: Grant::List,
        },
        Rule {
            path: "/proc".into(),
            grant: Grant::Read,
        },
        Rule {
            path: "/tmp".into(),
            grant: Grant::ReadWrite,
        },
        Rule {
            path: "/dev/shm".into(),
            grant: Grant::ReadWrite,
        },
    ];
    for dev in DEVICES {
        rules.push(Rule {
            path: Path::new("/dev").join(dev),
            grant: Grant::Device,
        });
    }
    if spec.workdir_is_scratch {
        rules.push(Rule {
            path: spec.workdir().to_path_buf(),
            grant: Grant::ReadWrite,
        });
    }
    for file in &spec.files {
        rules.push(Rule {
            path: file.path.clone(),
            grant: Grant::Read,
        });
    }
    if let Some(image) = &spec.image {
        // The run's private copy of the image: full access beneath its top-level
        // directories, except those that hold a granted mount (read and execute there).
        for path in &image.writable {
            rules.push(Rule {
                path: path.clone(),
                grant: Grant::ReadWriteExec,
            });
        }
        for path in &image.readable {
            rules.push(Rule {
                path: path.clone(),
                grant: Grant::ReadExec,
            });
        }
    }
    for mount in spec.mounts().into_iter().filter(|m| {
        // Inside a grant that already has its rule; landlock could not narrow it anyway.
        !matches!(m.role, MountRole::HostExecuted | MountRole::Pin)
    }) {
        let grant = match (mount.writable, mount.exec) {
            (true, true) => Grant::ReadWriteExec,
            (true, false) => Grant::ReadWrite,
            (false, true) => Grant::ReadExec,
            (false, false) => Grant::Read,
        };
        rules.push(Rule {
            path: mount.target.clone(),
            grant,
        });
    }
    rules
}

/// What [`enforce`] achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// Kernel ABI (0 = no landlock).
    pub abi: i32,
    /// How much of the policy the kernel enforces.
    pub status: LandlockStatus,
    /// Signal and abstract-socket scoping in force.
    pub scoped: bool,
}

/// Restricts the calling thread (and its future children) to `rules`. Also sets
/// `no_new_privs`.
pub fn enforce(rules: &[Rule], kernel_abi: i32) -> Result<Status, landlock::RulesetError> {
    let file_access = AccessFs::from_file(TARGET_ABI);
    let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(TARGET_ABI))?;
    let scoped = kernel_abi >= 6;
    if scoped {
        ruleset = ruleset.scope(Scope::from_all(TARGET_ABI))?;
    }
    let mut created = ruleset.create()?;
    for rule in rules {
        let Ok(fd) = PathFd::new(&rule.path) else {
            // The path does not exist in this sandbox (e.g. /dev/shm without scratch);
            // no rule means no access, which is the safe direction.
            continue;
        };
        let mut access = rule.grant.access();
        if !rule.path.is_dir() {
            access &= file_access;
        }
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = created.restrict_self()?;
    Ok(Status {
        abi: kernel_abi,
        status: match status.ruleset {
            RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
            RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
            RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
        },
        scoped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MountSpec;

    fn mount(source: &str, target: &str, writable: bool, role: MountRole) -> MountSpec {
        MountSpec {
            source: source.into(),
            target: target.into(),
            writable,
            is_dir: true,
            exec: true,
            role,
            followed_from: None,
        }
    }

    fn spec() -> Spec {
        let mut spec = crate::protocol::tests::sample_spec();
        spec.run.mounts = vec![
            mount("/home/u/out", "/out", true, MountRole::Grant),
            mount(
                "/home/u/out/.git/hooks",
                "/out/.git/hooks",
                false,
                MountRole::HostExecuted,
            ),
        ];
        spec.system_mounts = vec![mount("/usr", "/usr", false, MountRole::System)];
        spec
    }

    #[test]
    fn read_only_mounts_get_no_write_rights_and_scratch_no_exec() {
        let rules = rules(&spec());
        let grant_of = |p: &str| {
            rules
                .iter()
                .find(|r| r.path == Path::new(p))
                .map(|r| r.grant)
        };
        assert_eq!(grant_of("/usr"), Some(Grant::ReadExec));
        assert_eq!(grant_of("/out"), Some(Grant::ReadWriteExec));
        assert_eq!(grant_of("/tmp"), Some(Grant::ReadWrite));
        assert_eq!(grant_of("/proc"), Some(Grant::Read));
        assert_eq!(
            grant_of("/"),
            Some(Grant::List),
            "the root can be listed, nothing more"
        );
        assert_eq!(Grant::List.access(), make_bitflags!(AccessFs::{ReadDir}));
        assert!(!Grant::ReadExec.access().contains(AccessFs::WriteFile));
        assert!(!Grant::ReadExec.access().contains(AccessFs::Truncate));
        assert!(!Grant::ReadWrite.access().contains(AccessFs::Execute));
        assert!(!Grant::ReadWriteExec.access().contains(AccessFs::MakeChar));
        assert!(!Grant::Read.access().contains(AccessFs::Execute));
        assert_eq!(
            grant_of("/out/.git/hooks"),
            None,
            "no rule (and so no extra right) for a read-only bind inside a grant"
        );
    }
}
