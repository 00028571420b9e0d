//! The unpacked-image cache: one flattened root file system per layer chain.
//!
//! Content-addressed: the key is the OCI *chain id* of the image's layers (a digest over
//! the ordered uncompressed layer digests), so an image read from an OCI layout and the
//! same image from a `docker save` archive share one entry. An entry is unpacked into a
//! private temporary directory, every layer's digest is checked while it streams, and the
//! finished tree is renamed into place atomically; concurrent runs that race on the same
//! image each unpack and one rename wins (the loser's copy is removed). A failed or
//! tampered unpack leaves nothing behind. Entries are only ever read afterwards: runs
//! mount them as the read-only lower layer of an overlay.

use sandbox_core::SetupStage;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use sandbox_core::{Error, Result};
use sha2::{Digest, Sha256};

use super::image::{hex, sha256_hex, Compression, Image};
use super::unpack::{self, Limits, Report};

/// Bump when the unpacked layout changes, so old entries are not reused.
const LAYOUT_VERSION: &str = "v1";

/// Temporary unpack directories older than this are from crashed runs and are removed.
const STALE: Duration = Duration::from_secs(3600);

/// An unpacked-image cache rooted at a directory.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
    limits: Limits,
}

/// A ready root file system.
#[derive(Clone, Debug)]
pub struct Rootfs {
    /// Canonical host path of the root directory.
    pub path: PathBuf,
    /// Whether this call unpacked it (false: it was cached, or is a root file system dir).
    pub unpacked: bool,
    /// What unpacking did (default when cached).
    pub report: Report,
}

impl Cache {
    /// The default location: `$STRATA_IMAGE_CACHE`, else `$XDG_CACHE_HOME/strata/images`,
    /// else `$HOME/.cache/strata/images`, else `/var/tmp/strata-images-UID`.
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("STRATA_IMAGE_CACHE") {
            return dir.into();
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return Path::new(&dir).join("strata/images");
        }
        if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            return Path::new(&home).join(".cache/strata/images");
        }
        PathBuf::from(format!(
            "/var/tmp/strata-images-{}",
            rustix::process::getuid().as_raw()
        ))
    }

    /// A cache in `dir` (created on first use, mode 0700), with the default unpack limits.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Cache {
            dir: dir.into(),
            limits: Limits::default(),
        }
    }

    /// Caps what one image may unpack to.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of an image: its layers' chain id (hex).
    pub fn key(image: &Image) -> String {
        let mut chain: Option<String> = None;
        for layer in &image.layers {
            chain = Some(match chain {
                None => layer.diff_id.clone(),
                Some(parent) => {
                    let digest = Sha256::digest(format!("{parent} {}", layer.diff_id));
                    format!("sha256:{}", hex(&digest))
                }
            });
        }
        let chain = chain.unwrap_or_default();
        sha256_hex(&chain).unwrap_or("empty").to_string()
    }

    /// Returns the image's root file system, unpacking it on first use.
    pub fn rootfs(&self, image: &Image) -> Result<Rootfs> {
        if let Some(dir) = &image.rootfs_dir {
            return Ok(Rootfs {
                path: dir.clone(),
                unpacked: false,
                report: Report::default(),
            });
        }
        let key = Cache::key(image);
        let entry = self.dir.join(LAYOUT_VERSION).join(&key);
        let root = entry.join("root");
        if entry.join("complete").is_file() {
            return Ok(Rootfs {
                path: canonical(&root)?,
                unpacked: false,
                report: Report::default(),
            });
        }
        let tmp_dir = self.dir.join("tmp");
        for dir in [&self.dir, &tmp_dir, &self.dir.join(LAYOUT_VERSION)] {
            create_private_dir(dir).map_err(|e| {
                Error::setup(
                    SetupStage::Image,
                    format!("create image cache {}", dir.display()),
                    e,
                )
            })?;
        }
        remove_stale(&tmp_dir);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let work = TempTree(tmp_dir.join(format!("{key}.{}.{nanos}", std::process::id())));
        std::fs::create_dir(&work.0)
            .and_then(|()| std::fs::create_dir(work.0.join("root")))
            .map_err(|e| Error::setup(SetupStage::Image, "create image unpack directory", e))?;
        let root_fd = rustix::fs::openat2(
            rustix::fs::CWD,
            work.0.join("root"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS,
        )
        .map_err(|e| Error::setup(SetupStage::Image, "open image unpack directory", e.into()))?;
        let mut report = Report::default();
        for (i, layer) in image.layers.iter().enumerate() {
            unpack_one(image, i, layer, &root_fd, self.limits, &mut report)?;
        }
        std::fs::write(work.0.join("complete"), image.id.as_bytes())
            .map_err(|e| Error::setup(SetupStage::Image, "finish image unpack", e))?;
        match std::fs::rename(&work.0, &entry) {
            Ok(()) => std::mem::forget(work),
            Err(_) if entry.join("complete").is_file() => {} // another run won; ours is dropped
            Err(e) => {
                return Err(Error::setup(
                    SetupStage::Image,
                    "move unpacked image into the cache",
                    e,
                ))
            }
        }
        Ok(Rootfs {
            path: canonical(&root)?,
            unpacked: true,
            report,
        })
    }
}

fn canonical(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).map_err(|e| Error::setup(SetupStage::Image, "open cached image", e))
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes unpack directories left by crashed runs.
fn remove_stale(tmp_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE);
        if old {
            let _ = remove_tree(&entry.path());
        }
    }
}

/// Removes a tree that may contain directories without write permission.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let Some(name) = path.file_name() else {
        return Ok(());
    };
    let dir = rustix::fs::openat2(
        rustix::fs::CWD,
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::empty(),
    )?;
    unpack::remove_at(&dir, Path::new(name))
}

/// A temporary unpack directory, removed on drop unless forgotten.
struct TempTree(PathBuf);

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = remove_tree(&self.0);
    }
}

/// Hashes everything read through it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn unpack_one(
    image: &Image,
    index: usize,
    layer: &super::image::Layer,
    root: &OwnedFd,
    limits: Limits,
    report: &mut Report,
) -> Result<()> {
    let refuse = |why: String| {
        Error::invalid(format!(
            "image {:?}: layer {} ({}): {why}",
            image.reference,
            index + 1,
            layer.diff_id
        ))
    };
    let raw = layer
        .blob
        .open()
        .map_err(|e| refuse(format!("cannot read: {e}")))?;
    let mut stored = Hashing {
        inner: io::BufReader::with_capacity(256 << 10, raw),
        hasher: Sha256::new(),
    };
    let compression = match layer.compression {
        Some(c) => c,
        None => {
            use std::io::BufRead;
            let head = stored
                .inner
                .fill_buf()
                .map_err(|e| refuse(format!("cannot read: {e}")))?;
            if head.starts_with(&[0x1f, 0x8b]) {
                Compression::Gzip
            } else {
                Compression::None
            }
        }
    };
    let diff_hex = {
        let mut plain: Hashing<Box<dyn Read + '_>> = Hashing {
            inner: match compression {
                Compression::None => Box::new(&mut stored),
                Compression::Gzip => Box::new(flate2::read::GzDecoder::new(&mut stored)),
            },
            hasher: Sha256::new(),
        };
        unpack::unpack_layer(root, &mut plain, limits, report)
            .map_err(|e| refuse(e.to_string()))?;
        // The digest covers the whole stream, including the tar's end padding.
        io::copy(&mut plain, &mut io::sink()).map_err(|e| refuse(format!("corrupt: {e}")))?;
        hex(&plain.hasher.finalize())
    };
    io::copy(&mut stored, &mut io::sink()).map_err(|e| refuse(format!("corrupt: {e}")))?;
    if format!("sha256:{diff_hex}") != layer.diff_id {
        return Err(refuse(
            "its content does not match the configuration's diff id (corrupt or tampered image)"
                .into(),
        ));
    }
    if let Some(digest) = &layer.digest {
        let stored_hex = hex(&stored.hasher.finalize());
        if format!("sha256:{stored_hex}") != *digest {
            return Err(refuse(
                "its bytes do not match the manifest's digest (corrupt or tampered image)".into(),
            ));
        }
    }
    Ok(())
}
