//! Compiled-module cache: in memory (ready-to-instantiate `InstancePre`s keyed by content
//! hash) and on disk (precompiled artifacts keyed by engine and content hash).
//!
//! A file is identified by its SHA-256. To keep warm runs cheap the hash of a path is
//! remembered with the file's identity (device, inode, size, modification and change times)
//! and recomputed when any of them changes.

use sandbox_core::SetupStage;
use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use sandbox_core::{Error, Result};
use sha2::{Digest as _, Sha256};
use wasmtime::component::Component;
use wasmtime::{Engine, ExternType, InstancePre, Module, ModuleExport};
use wasmtime_wasi::p2::bindings::CommandPre;

use crate::linkers::Linkers;
use crate::state::State;

/// SHA-256 of a module file.
pub(crate) type Digest = [u8; 32];

/// Distinct modules kept ready in memory; past it the cache forgets an arbitrary entry.
const MAX_PREPARED: usize = 256;
/// Bytes of precompiled artifacts kept on disk per engine; the oldest go first.
const MAX_DISK_BYTES: u64 = 2 << 30;

/// Where a prepared module came from on this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Already prepared in this process.
    Memory,
    /// Loaded from a precompiled artifact in the disk cache.
    Disk,
    /// Compiled now.
    Compiled,
}

/// A module or component, linked and ready to instantiate.
pub(crate) enum Prepared {
    /// A core module and its `_start` export, when it has one of type `() -> ()`.
    Module(InstancePre<State>, Option<ModuleExport>),
    /// A `wasi:cli/command` component.
    Component(CommandPre<State>),
}

impl Prepared {
    fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        match self {
            Prepared::Module(pre, _) => pre.module().serialize(),
            Prepared::Component(pre) => pre.instance_pre().component().serialize(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Prepared::Module(..) => Kind::Module,
            Prepared::Component(_) => Kind::Component,
        }
    }
}

/// A prepared program and how it was obtained.
pub(crate) struct Loaded {
    pub prepared: Arc<Prepared>,
    pub digest: Digest,
    pub origin: Origin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Module,
    Component,
}

impl Kind {
    fn suffix(self) -> &'static str {
        match self {
            Kind::Module => "module.cwasm",
            Kind::Component => "component.cwasm",
        }
    }
}

/// File identity used to skip re-hashing unchanged files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

type Slot = Arc<Mutex<Option<Arc<Prepared>>>>;

/// The cache.
pub(crate) struct ModuleCache {
    stamps: Mutex<HashMap<PathBuf, (Stamp, Digest)>>,
    slots: Mutex<HashMap<Digest, Slot>>,
    disk: Option<DiskCache>,
    disk_status: String,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

pub(crate) fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl ModuleCache {
    pub(crate) fn new(dir: Option<&Path>, engine: &Engine) -> Self {
        let (disk, disk_status) = match dir {
            None => (None, "off (memory only)".to_string()),
            Some(dir) => match DiskCache::open(dir, engine) {
                Ok(d) => {
                    let status = d.dir.display().to_string();
                    (Some(d), status)
                }
                Err(why) => {
                    tracing::warn!(dir = %dir.display(), %why, "wasm disk cache disabled");
                    (None, format!("disabled: {why}"))
                }
            },
        };
        ModuleCache {
            stamps: Mutex::default(),
            slots: Mutex::default(),
            disk,
            disk_status,
        }
    }

    /// A description of the disk cache for reports.
    pub(crate) fn disk_status(&self) -> &str {
        &self.disk_status
    }

    /// Returns `path` ready to instantiate.
    pub(crate) fn load(&self, path: &Path, linkers: &Linkers) -> Result<Loaded> {
        let meta = fs::metadata(path).map_err(|e| {
            Error::invalid(format!(
                "wasm module {} cannot be read: {e}",
                path.display()
            ))
        })?;
        if !meta.is_file() {
            return Err(Error::invalid(format!(
                "wasm module {} is not a regular file",
                path.display()
            )));
        }
        let stamp = Stamp::of(&meta);
        let known = lock(&self.stamps)
            .get(path)
            .filter(|(s, _)| *s == stamp)
            .map(|(_, d)| *d);
        let (digest, mut bytes) = match known {
            Some(d) => (d, None),
            None => {
                let bytes = read(path)?;
                let digest: Digest = Sha256::digest(&bytes).into();
                lock(&self.stamps).insert(path.to_path_buf(), (stamp, digest));
                (digest, Some(bytes))
            }
        };
        let slot = {
            let mut slots = lock(&self.slots);
            if !slots.contains_key(&digest) && slots.len() >= MAX_PREPARED {
                if let Some(victim) = slots.keys().next().copied() {
                    slots.remove(&victim);
                }
            }
            Arc::clone(slots.entry(digest).or_default())
        };
        let mut slot = lock(&slot);
        if let Some(prepared) = slot.as_ref() {
            return Ok(Loaded {
                prepared: Arc::clone(prepared),
                digest,
                origin: Origin::Memory,
            });
        }
        let (prepared, origin) = match self.disk.as_ref().and_then(|d| d.get(&digest, linkers)) {
            Some(p) => (p, Origin::Disk),
            None => {
                let bytes = match bytes.take() {
                    Some(b) => b,
                    None => read(path)?,
                };
                let prepared = compile(&bytes, path, linkers)?;
                if let Some(disk) = &self.disk {
                    match prepared.serialize() {
                        Ok(artifact) => disk.put(&digest, prepared.kind(), &artifact),
                        Err(e) => tracing::warn!(error = %e, "cannot serialize compiled module"),
                    }
                }
                (prepared, Origin::Compiled)
            }
        };
        let prepared = Arc::new(prepared);
        *slot = Some(Arc::clone(&prepared));
        Ok(Loaded {
            prepared,
            digest,
            origin,
        })
    }

    /// A precompiled artifact of `loaded` on disk (written now if needed), for loading in
    /// another process with the same engine settings. Without a disk cache the artifact is
    /// written to `fallback_dir`.
    pub(crate) fn artifact(&self, loaded: &Loaded, fallback_dir: &Path) -> Result<PathBuf> {
        let kind = loaded.prepared.kind();
        if let Some(disk) = &self.disk {
            let path = disk.path(&loaded.digest, kind);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && trusted(&m)) {
                return Ok(path);
            }
        }
        let artifact = loaded.prepared.serialize().map_err(|e| Error::Internal {
            message: format!("cannot serialize compiled module: {e}"),
            source: None,
        })?;
        if let Some(disk) = &self.disk {
            disk.put(&loaded.digest, kind, &artifact);
            let path = disk.path(&loaded.digest, kind);
            if path.is_file() {
                return Ok(path);
            }
        }
        let path = fallback_dir.join(format!("{}.{}", hex(&loaded.digest), kind.suffix()));
        write_private(&path, &artifact)
            .map_err(|e| Error::setup(SetupStage::Host, "write precompiled module", e))?;
        Ok(path)
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| {
        Error::invalid(format!(
            "wasm module {} cannot be read: {e}",
            path.display()
        ))
    })
}

fn is_component(bytes: &[u8]) -> bool {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', _, _, layer, _]) => *layer == 1,
        _ => {
            // Text: the first form decides.
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]);
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with(";;"))
                .is_some_and(|l| l.starts_with("(component"))
        }
    }
}

fn compile(bytes: &[u8], path: &Path, linkers: &Linkers) -> Result<Prepared> {
    if Engine::detect_precompiled(bytes).is_some() {
        return Err(Error::invalid(format!(
            "{} is a precompiled wasmtime artifact; pass the .wasm file (precompiled code is only loaded from Strata's own cache)",
            path.display()
        )));
    }
    let invalid = |e: wasmtime::Error| {
        Error::invalid(format!(
            "{} is not a valid WebAssembly module or component: {e:#}",
            path.display()
        ))
    };
    let unlinkable = |e: wasmtime::Error| {
        Error::invalid(format!(
            "{} needs imports the wasm backend does not provide (it offers WASI preview 1 and 2): {e:#}",
            path.display()
        ))
    };
    if is_component(bytes) {
        let component = Component::new(&linkers.engine, bytes).map_err(invalid)?;
        prepare_component(&component, linkers).map_err(unlinkable)
    } else {
        let module = Module::new(&linkers.engine, bytes).map_err(invalid)?;
        prepare_module(&module, linkers).map_err(unlinkable)
    }
}

fn prepare_module(module: &Module, linkers: &Linkers) -> wasmtime::Result<Prepared> {
    let start = match module.get_export("_start") {
        Some(ExternType::Func(ty)) if ty.params().len() == 0 && ty.results().len() == 0 => {
            module.get_export_index("_start")
        }
        _ => None,
    };
    Ok(Prepared::Module(
        linkers.core()?.instantiate_pre(module)?,
        start,
    ))
}

fn prepare_component(component: &Component, linkers: &Linkers) -> wasmtime::Result<Prepared> {
    let pre = linkers.component()?.instantiate_pre(component)?;
    Ok(Prepared::Component(CommandPre::new(pre)?))
}

/// Whether a cache file or directory may be trusted: owned by this user, not writable by
/// group or others.
fn trusted(meta: &Metadata) -> bool {
    meta.uid() == rustix::process::geteuid().as_raw() && meta.mode() & 0o022 == 0
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)
}

/// Precompiled artifacts under `<root>/<engine hash>/<sha256>.<kind>.cwasm`.
struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    fn open(root: &Path, engine: &Engine) -> std::result::Result<Self, String> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let dir = root.join(format!("engine-{:016x}", hasher.finish()));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for d in [root, dir.as_path()] {
            let meta = fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
            if !trusted(&meta) {
                return Err(format!(
                    "{} is not owned by this user or is writable by others; precompiled code there cannot be trusted",
                    d.display()
                ));
            }
        }
        Ok(DiskCache { dir })
    }

    fn path(&self, digest: &Digest, kind: Kind) -> PathBuf {
        self.dir.join(format!("{}.{}", hex(digest), kind.suffix()))
    }

    fn get(&self, digest: &Digest, linkers: &Linkers) -> Option<Prepared> {
        for kind in [Kind::Module, Kind::Component] {
            let path = self.path(digest, kind);
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() || !trusted(&meta) {
                tracing::warn!(path = %path.display(), "ignoring untrusted cache file");
                continue;
            }
            match load_artifact(&path, kind, linkers) {
                Ok(p) => return Some(p),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "dropping unusable cache file");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        None
    }

    fn put(&self, digest: &Digest, kind: Kind, artifact: &[u8]) {
        if let Err(e) = write_private(&self.path(digest, kind), artifact) {
            tracing::warn!(error = %e, "cannot write the wasm disk cache");
        }
        self.trim();
    }

    /// Keeps the directory under [`MAX_DISK_BYTES`] by removing the least recently
    /// written artifacts.
    fn trim(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= MAX_DISK_BYTES {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total = total.saturating_sub(len);
            }
        }
    }
}

/// Loads a precompiled artifact written by this cache (or by the outer layer).
pub(crate) fn load_precompiled(path: &Path, linkers: &Linkers) -> Result<Prepared> {
    let name = path.to_string_lossy();
    let kind = if name.ends_with(Kind::Component.suffix()) {
        Kind::Component
    } else {
        Kind::Module
    };
    load_artifact(path, kind, linkers).map_err(|e| Error::Internal {
        message: format!("cannot load precompiled module {}: {e:#}", path.display()),
        source: None,
    })
}

#[allow(unsafe_code)]
fn load_artifact(path: &Path, kind: Kind, linkers: &Linkers) -> wasmtime::Result<Prepared> {
    match kind {
        Kind::Module => {
            // SAFETY: `path` is an artifact this crate wrote with wasmtime's `serialize`, in a
            // cache directory checked by `trusted` (owned by this user, not writable by
            // others) or mounted read-only by the outer layer that wrote it; the engine
            // checks the artifact's compatibility header and refuses a mismatch.
            let module = unsafe { Module::deserialize_file(&linkers.engine, path)? };
            prepare_module(&module, linkers)
        }
        Kind::Component => {
            // SAFETY: as above, for a component artifact.
            let component = unsafe { Component::deserialize_file(&linkers.engine, path)? };
            prepare_component(&component, linkers)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_detection_reads_the_header_or_first_form() {
        assert!(is_component(b"\0asm\x0d\x00\x01\x00"));
        assert!(!is_component(b"\0asm\x01\x00\x00\x00"));
        assert!(is_component(b";; comment\n(component)"));
        assert!(!is_component(b"(module)"));
    }

    #[test]
    fn hex_is_lowercase_and_padded() {
        assert_eq!(hex(&[0, 10, 255]), "000aff");
    }
}
