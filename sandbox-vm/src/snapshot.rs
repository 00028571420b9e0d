//! Saved VMs: boot once, save the state after the agent is up, restore it for each run.
//!
//! A snapshot is a directory under the state directory (`<state>/microvm-snapshots/<key>`)
//! holding the VMM's saved state (`state`) and an empty sparse placeholder disk (`empty.img`, [`crate::grants::SLOT_CAPACITY`] bytes) for grant
//! slots a run does not use. The key names the guest RAM, vCPUs and accelerator and hashes
//! what the state depends on (kernel, initramfs, agent, root image and VMM binary: size,
//! modification time, inode), so a rebuilt agent or guest gets a fresh snapshot and stale
//! snapshots of the same shape are removed. Creation is serialized by a lock file and
//! published by renaming a finished directory, so concurrent embedders boot at most once
//! each and never read a half-written snapshot.
//!
//! Every VM restored from one snapshot starts with the same memory, RNG state included; the
//! agent reseeds the guest RNG from host randomness and sets the guest clock before each
//! tool starts. The guest kernel's address-space layout (KASLR) is shared by every VM of a
//! snapshot.

use sandbox_core::SetupStage;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sandbox_core::{Error, Result};

use crate::vmm::Accel;

/// One saved VM, ready to restore.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The snapshot's directory.
    pub dir: PathBuf,
    /// The saved VM state.
    pub state: PathBuf,
    /// The empty placeholder disk for unused grant slots.
    pub placeholder: PathBuf,
}

impl Snapshot {
    fn at(dir: PathBuf) -> Snapshot {
        Snapshot {
            state: dir.join("state"),
            placeholder: dir.join("empty.img"),
            dir,
        }
    }

    /// Whether every file of the snapshot is there.
    pub fn complete(&self) -> bool {
        [&self.state, &self.placeholder].iter().all(|p| p.is_file())
    }

    /// Removes the snapshot (after a restore from it failed), so the next run makes a new
    /// one.
    pub fn discard(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shape of the VMs a snapshot serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Guest RAM in MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Accelerator.
    pub accel: Accel,
    /// With a network device (whose only peer is the egress proxy).
    pub network: bool,
}

impl Shape {
    fn prefix(&self) -> String {
        let net = if self.network { "-net" } else { "" };
        format!("m{}-c{}-{}{net}-", self.memory_mib, self.vcpus, self.accel)
    }
}

/// The key of a snapshot of `shape` built from `inputs` (files whose size, modification
/// time and inode are hashed) and `extra` (protocol version, kernel arguments, ...).
pub fn key(shape: Shape, inputs: &[&Path], extra: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    extra.hash(&mut hasher);
    for input in inputs {
        input.hash(&mut hasher);
        if let Ok(meta) = std::fs::metadata(input) {
            use std::os::unix::fs::MetadataExt;
            (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).hash(&mut hasher);
        }
    }
    format!("{}{:016x}", shape.prefix(), hasher.finish())
}

/// The snapshot `key` under `store`, made by `make` (which fills the directory it is given:
/// `state`; `empty.img` is made before) when it does not exist yet.
///
/// # Errors
/// When the store cannot be created or `make` fails (nothing is published then).
pub fn get_or_make(
    store: &Path,
    key: &str,
    shape: Shape,
    make: impl FnOnce(&Snapshot) -> Result<()>,
) -> Result<Snapshot> {
    let done = Snapshot::at(store.join(key));
    if done.complete() {
        return Ok(done);
    }
    sandbox_os::private::create_dir_all(store)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: snapshot store", e))?;
    let lock = sandbox_os::private::create(&store.join(format!("{key}.lock")))
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: snapshot lock", e))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: snapshot lock", e.into()))?;
    if done.complete() {
        return Ok(done);
    }
    let _ = std::fs::remove_dir_all(&done.dir);
    let building = Snapshot::at(store.join(format!("{key}.building")));
    let _ = std::fs::remove_dir_all(&building.dir);
    sandbox_os::private::create_dir_all(&building.dir)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: snapshot directory", e))?;
    let placeholder = sandbox_os::private::create(&building.placeholder)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: placeholder disk", e))?;
    placeholder
        .set_len(crate::grants::SLOT_CAPACITY)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: placeholder disk", e))?;
    drop(placeholder);
    if let Err(e) = make(&building) {
        let _ = std::fs::remove_dir_all(&building.dir);
        return Err(e);
    }
    std::fs::rename(&building.dir, &done.dir)
        .map_err(|e| Error::setup(SetupStage::Snapshot, "microvm: publishing the snapshot", e))?;
    remove_stale(store, key, shape);
    Ok(done)
}

/// Removes other snapshots of the same shape (built from older guests or agents).
fn remove_stale(store: &Path, key: &str, shape: Shape) {
    let prefix = shape.prefix();
    let Ok(entries) = std::fs::read_dir(store) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name != key && !name.ends_with(".building") {
            if name.ends_with(".lock") {
                let _ = std::fs::remove_file(entry.path());
            } else {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_shape_and_inputs() {
        let shape = Shape {
            memory_mib: 512,
            vcpus: 1,
            accel: Accel::Tcg,
            network: false,
        };
        let a = key(shape, &[Path::new("/bin/sh")], "v2");
        assert!(a.starts_with("m512-c1-tcg-"), "{a}");
        assert_eq!(a, key(shape, &[Path::new("/bin/sh")], "v2"));
        assert_ne!(a, key(shape, &[Path::new("/bin/sh")], "v3"));
        let bigger = Shape {
            memory_mib: 1024,
            ..shape
        };
        assert_ne!(a, key(bigger, &[Path::new("/bin/sh")], "v2"));
    }
}
