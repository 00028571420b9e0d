//! Reading images from the host: OCI image layouts (directories or tar archives),
//! `docker save` archives, and plain root file system directories.
//!
//! Nothing here trusts the image: blob names are only ever looked up as
//! `blobs/sha256/<64 hex digits>`, member names of an archive only through a map built
//! from the archive's own index, JSON documents are size-capped, and every digest is
//! checked (manifests and configs here, layers while they are unpacked, see `cache`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use sandbox_core::{Error, Result};
use sha2::{Digest, Sha256};

/// Largest manifest, index or configuration accepted.
const MAX_JSON: u64 = 4 << 20;

/// What the image asks for at run time (OCI image config `config` object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunConfig {
    /// `Env`, as `KEY=VALUE`.
    pub env: Vec<String>,
    /// `WorkingDir`.
    pub working_dir: Option<String>,
    /// `User` (`uid`, `uid:gid`, `name`, `name:group`).
    pub user: Option<String>,
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
}

/// How a layer's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip.
    Gzip,
}

/// Where a blob's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blob {
    /// A whole file.
    File(PathBuf),
    /// A byte range of an archive file.
    Member {
        /// The archive.
        archive: PathBuf,
        /// Offset of the data.
        offset: u64,
        /// Length of the data.
        size: u64,
    },
}

impl Blob {
    /// Opens the blob's bytes.
    pub fn open(&self) -> io::Result<Box<dyn Read + Send>> {
        match self {
            Blob::File(path) => Ok(Box::new(File::open(path)?)),
            Blob::Member {
                archive,
                offset,
                size,
            } => {
                let mut file = File::open(archive)?;
                file.seek(SeekFrom::Start(*offset))?;
                Ok(Box::new(file.take(*size)))
            }
        }
    }
}

/// One layer of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// Its bytes.
    pub blob: Blob,
    /// How they are compressed (`None` means: detect from the bytes).
    pub compression: Option<Compression>,
    /// `sha256:` digest of the stored bytes, when the format names one (OCI descriptors).
    pub digest: Option<String>,
    /// `sha256:` digest of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: String,
}

/// The formats [`open`] understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An OCI image layout directory.
    OciLayout,
    /// A tar of an OCI image layout.
    OciArchive,
    /// A `docker save` tar.
    DockerArchive,
    /// A root file system directory (no layers, no configuration).
    RootfsDir,
}

impl Format {
    /// A short name for messages and receipts.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::OciLayout => "oci-layout",
            Format::OciArchive => "oci-archive",
            Format::DockerArchive => "docker-archive",
            Format::RootfsDir => "rootfs-dir",
        }
    }
}

/// A parsed image.
#[derive(Clone, Debug)]
pub struct Image {
    /// The reference as given.
    pub reference: String,
    /// Its format.
    pub format: Format,
    /// `sha256:` digest of the configuration (the image id), or `dir:PATH`.
    pub id: String,
    /// The run-time configuration.
    pub config: RunConfig,
    /// Layers, lowest first (empty for a root file system directory).
    pub layers: Vec<Layer>,
    /// The root file system directory, for [`Format::RootfsDir`].
    pub rootfs_dir: Option<PathBuf>,
}

/// Parsed images, keyed by reference and the identity (device, inode, size, mtime) of the
/// file that describes them (the archive, or an OCI layout's `index.json`), so repeated
/// runs of one image skip parsing. Layer digests are still checked on every unpack.
#[derive(Debug, Default)]
pub struct Memo {
    parsed: std::sync::Mutex<HashMap<String, (Identity, Image)>>,
}

type Identity = (u64, u64, u64, i64, i64);

fn identity(reference: &str) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let (path, _) = split_reference(reference)?;
    let meta = std::fs::metadata(&path).ok()?;
    let meta = if meta.is_dir() {
        std::fs::metadata(path.join("index.json")).unwrap_or(meta)
    } else {
        meta
    };
    Some((
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
    ))
}

impl Memo {
    /// Like [`open`], reusing an earlier parse of the same unchanged image.
    pub fn open(&self, reference: &str) -> Result<Image> {
        let id = identity(reference);
        let mut parsed = match self.parsed.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let (Some(id), Some((seen, image))) = (id, parsed.get(reference)) {
            if *seen == id && image.format != Format::RootfsDir {
                return Ok(image.clone());
            }
        }
        let image = open(reference)?;
        if let Some(id) = id {
            if parsed.len() > 256 {
                parsed.clear();
            }
            parsed.insert(reference.to_string(), (id, image.clone()));
        }
        Ok(image)
    }
}

fn bad(reference: &str, why: impl std::fmt::Display) -> Error {
    Error::invalid(format!("image {reference:?}: {why}"))
}

/// Whether `s` names a sha256 blob: `sha256:` and 64 lowercase hex digits.
pub fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

/// `sha256:` + hex digest of `data`.
pub fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where an image's files are: a directory or the members of a tar archive.
enum Store {
    Dir(PathBuf),
    Archive {
        path: PathBuf,
        members: HashMap<String, (u64, u64)>,
    },
}

impl Store {
    fn archive(path: &Path) -> io::Result<Store> {
        let file = File::open(path)?;
        let mut archive = tar::Archive::new(io::BufReader::new(file));
        let mut members = HashMap::new();
        // Seek over member data instead of reading it: an index of a large archive costs
        // one read per header.
        for entry in archive.entries_with_seek()? {
            let entry = entry?;
            if !matches!(
                entry.header().entry_type(),
                tar::EntryType::Regular | tar::EntryType::Continuous
            ) {
                continue;
            }
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let name = name.trim_start_matches("./").to_string();
            members.insert(name, (entry.raw_file_position(), entry.size()));
        }
        Ok(Store::Archive {
            path: path.to_path_buf(),
            members,
        })
    }

    fn has(&self, name: &str) -> bool {
        match self {
            Store::Dir(dir) => dir.join(name).is_file(),
            Store::Archive { members, .. } => members.contains_key(name),
        }
    }

    fn blob(&self, name: &str) -> Option<Blob> {
        match self {
            Store::Dir(dir) => {
                let path = dir.join(name);
                path.is_file().then_some(Blob::File(path))
            }
            Store::Archive { path, members } => {
                members.get(name).map(|&(offset, size)| Blob::Member {
                    archive: path.clone(),
                    offset,
                    size,
                })
            }
        }
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let blob = self
            .blob(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{name} is missing")))?;
        let mut data = Vec::new();
        blob.open()?.take(MAX_JSON + 1).read_to_end(&mut data)?;
        if data.len() as u64 > MAX_JSON {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{name} is larger than {MAX_JSON} bytes"),
            ));
        }
        Ok(data)
    }
}

/// Opens `reference`: a path to an OCI layout directory (optionally `DIR:TAG`), an OCI or
/// `docker save` archive (optionally `FILE:TAG`), or a root file system directory.
/// Errors are [`Error::InvalidRequest`] naming the problem; nothing is unpacked here.
pub fn open(reference: &str) -> Result<Image> {
    let (path, tag) = split_reference(reference).ok_or_else(|| {
        bad(
            reference,
            "no such file or directory (the native runtime takes a local OCI image layout, an \
             image archive made by `docker save`, or a root file system directory; it never \
             pulls from a registry)",
        )
    })?;
    let meta = std::fs::metadata(&path).map_err(|e| bad(reference, e))?;
    if meta.is_dir() {
        if path.join("oci-layout").is_file() {
            let store = Store::Dir(path.clone());
            return open_oci(reference, &store, tag.as_deref(), Format::OciLayout);
        }
        if tag.is_some() {
            return Err(bad(
                reference,
                "a tag was given but the directory is not an OCI image layout",
            ));
        }
        let dir = std::fs::canonicalize(&path).map_err(|e| bad(reference, e))?;
        if std::fs::read_dir(&dir)
            .map_err(|e| bad(reference, e))?
            .next()
            .is_none()
        {
            return Err(bad(reference, "the root file system directory is empty"));
        }
        return Ok(Image {
            reference: reference.to_string(),
            format: Format::RootfsDir,
            id: format!("dir:{}", dir.display()),
            config: RunConfig::default(),
            layers: Vec::new(),
            rootfs_dir: Some(dir),
        });
    }
    if !meta.is_file() {
        return Err(bad(reference, "not a directory or a regular file"));
    }
    let mut magic = [0u8; 2];
    let _ = File::open(&path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| bad(reference, e))?;
    if magic == [0x1f, 0x8b] {
        return Err(bad(
            reference,
            "compressed image archives are not supported; decompress it first (gunzip)",
        ));
    }
    let store = Store::archive(&path).map_err(|e| {
        bad(
            reference,
            format!("not a readable image archive (tar): {e}"),
        )
    })?;
    if store.has("manifest.json") {
        return open_docker(reference, &store, tag.as_deref());
    }
    if store.has("index.json") && store.has("oci-layout") {
        return open_oci(reference, &store, tag.as_deref(), Format::OciArchive);
    }
    Err(bad(
        reference,
        "the archive is neither a `docker save` archive (manifest.json) nor an OCI archive \
         (oci-layout, index.json)",
    ))
}

/// Splits `PATH[:TAG]`: the whole reference when it exists, else the part before the
/// last `:` when that exists.
fn split_reference(reference: &str) -> Option<(PathBuf, Option<String>)> {
    if Path::new(reference).exists() {
        return Some((PathBuf::from(reference), None));
    }
    let (path, tag) = reference.rsplit_once(':')?;
    (!tag.is_empty() && !tag.contains('/') && Path::new(path).exists())
        .then(|| (PathBuf::from(path), Some(tag.to_string())))
}

fn verified(reference: &str, store: &Store, digest: &str) -> Result<Vec<u8>> {
    let hex = sha256_hex(digest).ok_or_else(|| {
        bad(
            reference,
            format!("unsupported digest {digest:?} (sha256 only)"),
        )
    })?;
    let data = store
        .read(&format!("blobs/sha256/{hex}"))
        .map_err(|e| bad(reference, e))?;
    if digest_of(&data) != digest {
        return Err(bad(
            reference,
            format!("blob {digest} does not match its digest (corrupt or tampered image)"),
        ));
    }
    Ok(data)
}

fn open_oci(reference: &str, store: &Store, tag: Option<&str>, format: Format) -> Result<Image> {
    let index_bytes = store.read("index.json").map_err(|e| bad(reference, e))?;
    let index = ImageIndex::from_reader(&index_bytes[..])
        .map_err(|e| bad(reference, format!("invalid index.json: {e}")))?;
    let manifests = index.manifests();
    let chosen = match tag {
        Some(tag) => manifests.iter().find(|m| {
            m.annotations().as_ref().is_some_and(|a| {
                a.get("org.opencontainers.image.ref.name")
                    .is_some_and(|n| n == tag)
                    || a.get("io.containerd.image.name")
                        .is_some_and(|n| n.rsplit_once(':').is_some_and(|(_, t)| t == tag))
            })
        }),
        None if manifests.len() == 1 => manifests.first(),
        None => manifests.iter().find(|m| {
            m.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
            })
        }),
    }
    .ok_or_else(|| {
        bad(
            reference,
            match tag {
                Some(tag) => format!("no manifest tagged {tag:?} in index.json"),
                None => format!(
                    "index.json lists {} manifests; name one as PATH:TAG",
                    manifests.len()
                ),
            },
        )
    })?;
    let mut descriptor = chosen.clone();
    // A nested index (multi-platform image): take its linux/amd64 manifest.
    if *descriptor.media_type() == MediaType::ImageIndex {
        let nested = verified(reference, store, descriptor.digest().as_ref())?;
        let nested = ImageIndex::from_reader(&nested[..])
            .map_err(|e| bad(reference, format!("invalid nested index: {e}")))?;
        descriptor = nested
            .manifests()
            .iter()
            .find(|m| {
                m.platform().as_ref().is_some_and(|p| {
                    p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
                })
            })
            .cloned()
            .ok_or_else(|| bad(reference, "no linux/amd64 manifest in the image index"))?;
    }
    let manifest_bytes = verified(reference, store, descriptor.digest().as_ref())?;
    let manifest = ImageManifest::from_reader(&manifest_bytes[..])
        .map_err(|e| bad(reference, format!("invalid manifest: {e}")))?;
    let config_digest = manifest.config().digest().to_string();
    let config_bytes = verified(reference, store, &config_digest)?;
    let (config, diff_ids) = parse_config(reference, &config_bytes)?;
    if diff_ids.len() != manifest.layers().len() {
        return Err(bad(
            reference,
            format!(
                "the manifest has {} layers but the configuration names {}",
                manifest.layers().len(),
                diff_ids.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    for (layer, diff_id) in manifest.layers().iter().zip(diff_ids) {
        let digest = layer.digest().to_string();
        let hex = sha256_hex(&digest)
            .ok_or_else(|| bad(reference, format!("unsupported layer digest {digest:?}")))?;
        let compression = match layer.media_type() {
            MediaType::ImageLayer | MediaType::ImageLayerNonDistributable => Compression::None,
            MediaType::ImageLayerGzip | MediaType::ImageLayerNonDistributableGzip => {
                Compression::Gzip
            }
            MediaType::Other(t) if t.ends_with("tar.gzip") || t.ends_with("tar+gzip") => {
                Compression::Gzip
            }
            MediaType::Other(t) if t.ends_with(".tar") || t.ends_with("diff.tar") => {
                Compression::None
            }
            other => {
                return Err(bad(
                    reference,
                    format!("unsupported layer media type {other} (plain or gzip tar only)"),
                ))
            }
        };
        let blob = store
            .blob(&format!("blobs/sha256/{hex}"))
            .ok_or_else(|| bad(reference, format!("layer {digest} is missing")))?;
        layers.push(Layer {
            blob,
            compression: Some(compression),
            digest: Some(digest),
            diff_id,
        });
    }
    Ok(Image {
        reference: reference.to_string(),
        format,
        id: config_digest,
        config,
        layers,
        rootfs_dir: None,
    })
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn open_docker(reference: &str, store: &Store, tag: Option<&str>) -> Result<Image> {
    let bytes = store.read("manifest.json").map_err(|e| bad(reference, e))?;
    let manifests: Vec<DockerManifest> = serde_json::from_slice(&bytes)
        .map_err(|e| bad(reference, format!("invalid manifest.json: {e}")))?;
    let chosen = match tag {
        Some(tag) => manifests.iter().find(|m| {
            m.repo_tags.as_ref().is_some_and(|tags| {
                tags.iter()
                    .any(|t| t == tag || t.rsplit_once(':').is_some_and(|(_, x)| x == tag))
            })
        }),
        None if manifests.len() == 1 => manifests.first(),
        None => None,
    }
    .ok_or_else(|| {
        bad(
            reference,
            format!(
                "manifest.json lists {} images; name one as FILE:TAG",
                manifests.len()
            ),
        )
    })?;
    let config_name = chosen.config.trim_start_matches("./");
    let config_bytes = store.read(config_name).map_err(|e| bad(reference, e))?;
    let id = digest_of(&config_bytes);
    // The config's name is its digest (`HEX.json` or `blobs/sha256/HEX`).
    let named_hex = config_name
        .trim_start_matches("blobs/sha256/")
        .trim_end_matches(".json");
    if sha256_hex(&format!("sha256:{named_hex}")).is_some() && id != format!("sha256:{named_hex}") {
        return Err(bad(
            reference,
            "the image configuration does not match its digest (corrupt or tampered image)",
        ));
    }
    let (config, diff_ids) = parse_config(reference, &config_bytes)?;
    if diff_ids.len() != chosen.layers.len() {
        return Err(bad(
            reference,
            format!(
                "manifest.json lists {} layers but the configuration names {}",
                chosen.layers.len(),
                diff_ids.len()
            ),
        ));
    }
    let mut layers = Vec::new();
    for (name, diff_id) in chosen.layers.iter().zip(diff_ids) {
        let name = name.trim_start_matches("./");
        let blob = store.blob(name).ok_or_else(|| {
            bad(
                reference,
                format!("layer {name} is missing from the archive"),
            )
        })?;
        layers.push(Layer {
            blob,
            compression: None,
            digest: None,
            diff_id,
        });
    }
    Ok(Image {
        reference: reference.to_string(),
        format: Format::DockerArchive,
        id,
        config,
        layers,
        rootfs_dir: None,
    })
}

fn parse_config(reference: &str, bytes: &[u8]) -> Result<(RunConfig, Vec<String>)> {
    let config = ImageConfiguration::from_reader(bytes)
        .map_err(|e| bad(reference, format!("invalid image configuration: {e}")))?;
    let os = config.os().to_string();
    let arch = config.architecture().to_string();
    if os != "linux" || arch != std::env::consts::ARCH.replace("x86_64", "amd64") {
        return Err(bad(
            reference,
            format!("the image is for {os}/{arch}; this host runs linux/amd64"),
        ));
    }
    let diff_ids = config.rootfs().diff_ids().clone();
    for id in &diff_ids {
        if sha256_hex(id).is_none() {
            return Err(bad(reference, format!("unsupported layer diff id {id:?}")));
        }
    }
    let run = config.config().as_ref();
    let run = RunConfig {
        env: run.and_then(|c| c.env().clone()).unwrap_or_default(),
        working_dir: run
            .and_then(|c| c.working_dir().clone())
            .filter(|w| !w.is_empty()),
        user: run.and_then(|c| c.user().clone()).filter(|u| !u.is_empty()),
        entrypoint: run.and_then(|c| c.entrypoint().clone()).unwrap_or_default(),
        cmd: run.and_then(|c| c.cmd().clone()).unwrap_or_default(),
    };
    Ok((run, diff_ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_must_be_sha256_hex() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert!(sha256_hex(&good).is_some());
        assert!(sha256_hex(&format!("sha256:../../{}", "a".repeat(58))).is_none());
        assert!(sha256_hex(&format!("sha512:{}", "a".repeat(64))).is_none());
        assert!(sha256_hex("sha256:ABC").is_none());
    }

    #[test]
    fn unknown_references_are_invalid_requests() {
        let err = open("/nonexistent/strata-image").expect_err("missing");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("never pulls"), "{err}");
    }
}
