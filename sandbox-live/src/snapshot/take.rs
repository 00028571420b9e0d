//! Taking a snapshot of a live sandbox, starting a sandbox from one, and fork (a snapshot
//! started N times at once).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sandbox_core::{BackendKind, Error, Result};
use sandbox_os::file_tree::FileKind;

use super::{manifest, Body, SnapshotInfo, SnapshotStore, Tree, Verified, FORMAT};
use crate::client::{LiveSandbox, StartOptions};
use crate::state::{self, SandboxSpec};

/// The most children one [`LiveSandbox::fork`] makes (E2B's per-call bound): a fork storm
/// asked by a tool is refused before anything starts, and each child has the parent's
/// limits.
pub const MAX_FORK: usize = 100;

/// What [`LiveSandbox::fork`] made.
#[derive(Debug)]
pub struct Forked {
    /// The children, running.
    pub children: Vec<LiveSandbox>,
    /// What each child was given: the snapshot they started from (already removed).
    pub snapshot: SnapshotInfo,
}

/// System directories: a working directory there is the host's (granted read-only), not
/// the sandbox's own.
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt", "/dev", "/proc", "/sys",
    "/run", "/var",
];

impl LiveSandbox {
    /// Snapshots this sandbox into `store` under `name` (default: the snapshot's id). The
    /// sandbox is paused while its files are copied (unless it already was) and resumed
    /// after. See [`crate::snapshot`] for what a snapshot carries.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad or taken name, or a file the snapshot cannot carry
    /// (a symlink, device, FIFO, socket or hard-linked file in the sandbox's own trees);
    /// [`Error::BackendUnavailable`] on a backend whose snapshots are not built. Nothing is
    /// left in the store on error.
    pub fn snapshot(&self, store: &SnapshotStore, name: Option<&str>) -> Result<SnapshotInfo> {
        let spec = SandboxSpec::read(self.dir())?;
        let id = super::new_id()?;
        let name = name.map_or_else(|| id.clone(), str::to_string);
        let dir = store.snapshot_dir(&name)?;
        if std::fs::symlink_metadata(&dir).is_ok() {
            return Err(Error::invalid(format!(
                "a snapshot named {name:?} exists (strata snapshot rm {name} removes it)"
            )));
        }
        let staging = store.dir().join(format!(".new-{id}"));
        let made = self
            .take_into(store, &staging, &spec, id, name.clone())
            .and_then(|body| {
                publish(&staging, &dir, &name)?;
                Ok(body.info)
            });
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        made
    }

    /// Starts a live sandbox from the snapshot `name` in `store`: the snapshot is verified
    /// first (its seal, owner and every file), then a sandbox is started with its caps on
    /// its backend (`options.backend` is not used), with its policy unless `options` names
    /// one, and its files are copied in before this returns.
    ///
    /// # Errors
    /// As [`SnapshotStore::load`] and [`LiveSandbox::start`]; when its files cannot be
    /// copied in, the new sandbox is stopped and the error returned.
    pub fn start_from(
        store: &SnapshotStore,
        name: &str,
        options: &StartOptions,
    ) -> Result<LiveSandbox> {
        store.load(name)?.start(options)
    }

    /// Starts `count` copies of this sandbox (1 to [`MAX_FORK`]), each from one snapshot of
    /// it taken now: every child gets its own copy of the files, the parent's caps, policy
    /// and helper, and `options`' TTLs, owner and state directory. The snapshot is removed
    /// once the children have started. On error every child started is stopped.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a count out of range; as [`LiveSandbox::snapshot`] and
    /// [`LiveSandbox::start`].
    pub fn fork(
        &self,
        store: &SnapshotStore,
        count: usize,
        options: &StartOptions,
    ) -> Result<Forked> {
        if !(1..=MAX_FORK).contains(&count) {
            return Err(Error::invalid(format!(
                "fork makes 1 to {MAX_FORK} children, not {count}"
            )));
        }
        let spec = SandboxSpec::read(self.dir())?;
        let id = super::new_id()?;
        let staging = store.dir().join(format!(".fork-{id}"));
        let forked = self
            .take_into(store, &staging, &spec, id.clone(), id)
            .and_then(|body| {
                let verified = Verified {
                    dir: staging.clone(),
                    body,
                };
                let mut options = options.clone();
                options.name = None;
                if options.helper.is_none() {
                    options.helper.clone_from(&spec.helper);
                }
                if options.supervisor.is_none() {
                    options.supervisor.clone_from(&spec.supervisor);
                }
                if options.state_dir.is_none() {
                    options.state_dir = self.dir().parent().map(Path::to_path_buf);
                }
                let mut children = Vec::with_capacity(count);
                for _ in 0..count {
                    match verified.start(&options) {
                        Ok(child) => children.push(child),
                        Err(error) => {
                            for child in children {
                                let _ = child.stop();
                            }
                            return Err(error);
                        }
                    }
                }
                Ok(Forked {
                    children,
                    snapshot: verified.body.info,
                })
            });
        let _ = std::fs::remove_dir_all(&staging);
        forked
    }

    /// Copies this sandbox's own trees into `staging` and seals them.
    fn take_into(
        &self,
        store: &SnapshotStore,
        staging: &Path,
        spec: &SandboxSpec,
        id: String,
        name: String,
    ) -> Result<Body> {
        if spec.backend == BackendKind::Microvm {
            return Err(Error::unavailable(
                BackendKind::Microvm,
                "snapshots of a live microVM (its memory, devices and disks) are not built yet; the process and container backends snapshot their files",
            ));
        }
        state::private_dir(staging)?;
        let files = SnapshotStore::files_of(staging);
        state::private_dir(&files)?;
        let grants: Vec<PathBuf> = spec.caps.mounts.iter().map(|m| m.guest.clone()).collect();
        let mut skipped = Vec::new();
        let mut trees = Vec::new();
        let paused_here = !self.refresh()?.paused;
        if paused_here {
            self.pause()?;
        }
        let copied: Result<()> =
            own_trees(spec)
                .into_iter()
                .enumerate()
                .try_for_each(|(i, inside)| {
                    let stored = format!("t{i}");
                    self.copy_tree(&inside, &files.join(&stored), &grants, &mut skipped)?;
                    trees.push(Tree { inside, stored });
                    Ok(())
                });
        if paused_here {
            let resumed = self.resume();
            copied?;
            resumed?;
        } else {
            copied?;
        }
        let manifest = manifest::seal_tree(&files)?;
        let mut carries: Vec<String> = trees
            .iter()
            .map(|t| format!("files:{}", t.inside.display()))
            .collect();
        carries.extend(["caps".to_string(), "policy".to_string()]);
        let mut not_carried = vec![
            "processes and memory (the process and container backends carry files only)"
                .to_string(),
            "granted host paths (they stay on the host and are granted again at start)".to_string(),
            "group and other permission bits (the snapshot's files are owner-only)".to_string(),
        ];
        if spec.backend == BackendKind::Container {
            not_carried
                .push("changes to the image's files outside /tmp and the working directory".into());
        }
        not_carried.extend(
            skipped
                .iter()
                .map(|p: &PathBuf| format!("{} (a grant inside a carried tree)", p.display())),
        );
        let info = SnapshotInfo {
            id,
            name,
            backend: spec.backend,
            source: self.id().to_string(),
            created_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            carries,
            not_carried,
            files: manifest.iter().filter(|e| !e.dir).count() as u64,
            bytes: manifest.iter().map(|e| e.size).sum(),
        };
        let body = Body {
            format: FORMAT,
            owner_uid: state::uid(),
            info,
            caps: spec.caps.clone(),
            strictness: spec.strictness,
            policy: spec.policy.clone(),
            trees,
            manifest,
        };
        store.write_body(staging, &body)?;
        Ok(body)
    }

    /// Copies the tree `inside` to the new host directory `host`, leaving out grants in it
    /// (recorded in `skipped`): a grant is the host's, never a snapshot's.
    fn copy_tree(
        &self,
        inside: &Path,
        host: &Path,
        grants: &[PathBuf],
        skipped: &mut Vec<PathBuf>,
    ) -> Result<()> {
        if !grants.iter().any(|g| g.starts_with(inside) && g != inside) {
            self.download(&inside.to_string_lossy(), host)?;
            return Ok(());
        }
        state::private_dir(host)?;
        for entry in self.list_dir(&inside.to_string_lossy())? {
            let child = inside.join(&entry.name);
            if grants.iter().any(|g| g == &child) {
                skipped.push(child);
            } else if entry.kind == FileKind::Dir || entry.kind == FileKind::File {
                self.copy_tree(&child, &host.join(&entry.name), grants, skipped)?;
            } else {
                return Err(Error::invalid(format!(
                    "{} is not a regular file or directory: a snapshot carries neither symlinks nor devices",
                    child.display()
                )));
            }
        }
        Ok(())
    }
}

impl Verified {
    /// Starts a live sandbox from this snapshot (see [`LiveSandbox::start_from`]).
    ///
    /// # Errors
    /// As [`LiveSandbox::start_from`].
    pub fn start(&self, options: &StartOptions) -> Result<LiveSandbox> {
        self.start_with(&self.body.caps, options)
    }

    /// [`Verified::start`] with `caps` instead of the snapshot's own: the caller admitted
    /// the snapshot's caps under its policy (`strata::Sandbox::start_from`), which may pin
    /// or resolve its grants.
    ///
    /// # Errors
    /// As [`LiveSandbox::start_from`].
    pub fn start_with(
        &self,
        caps: &sandbox_core::Caps,
        options: &StartOptions,
    ) -> Result<LiveSandbox> {
        let mut options = options.clone();
        options.backend = self.body.info.backend;
        options.strictness = self.body.strictness;
        if options.policy.is_empty() && options.policy.admitted.is_none() {
            options.policy = self.body.policy.clone();
        }
        options.origin = Some(format!(
            "started from snapshot {} ({}, of {}): {}; not carried: {}",
            self.body.info.name,
            self.body.info.id,
            self.body.info.source,
            self.body.info.carries.join(", "),
            self.body.info.not_carried.join("; ")
        ));
        let sandbox = LiveSandbox::start(caps, &options)?;
        let files = SnapshotStore::files_of(&self.dir);
        let restored = self.body.trees.iter().try_for_each(|tree| {
            sandbox
                .upload(&files.join(&tree.stored), &tree.inside.to_string_lossy())
                .map(drop)
        });
        match restored {
            Ok(()) => Ok(sandbox),
            Err(error) => {
                let _ = sandbox.stop();
                Err(error)
            }
        }
    }
}

/// The sandbox's own trees: its scratch `/tmp`, and its working directory when that is
/// neither in `/tmp`, nor granted, nor a system directory.
fn own_trees(spec: &SandboxSpec) -> Vec<PathBuf> {
    let tmp = PathBuf::from("/tmp");
    let mut trees = vec![tmp.clone()];
    let workdir = &spec.workdir;
    let granted = spec
        .caps
        .mounts
        .iter()
        .any(|m| workdir.starts_with(&m.guest));
    let system = SYSTEM.iter().any(|s| workdir.starts_with(s));
    if workdir.is_absolute()
        && workdir != Path::new("/")
        && !workdir.starts_with(&tmp)
        && !granted
        && !system
    {
        trees.push(workdir.clone());
    }
    trees
}

/// Renames the finished `staging` to `dir`, never over an existing entry.
fn publish(staging: &Path, dir: &Path, name: &str) -> Result<()> {
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        staging,
        rustix::fs::CWD,
        dir,
        rustix::fs::RenameFlags::NOREPLACE,
    )
    .map_err(|e| match e {
        rustix::io::Errno::EXIST => Error::invalid(format!("a snapshot named {name:?} exists")),
        e => Error::internal(format!("publish snapshot {}", dir.display()), e.into()),
    })
}
