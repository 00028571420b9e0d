//! The native runtime: the process backend's sandbox with an image as its root.
//!
//! Same helper, namespaces, landlock, seccomp, cgroups, rlimits and receipts as a process
//! run; the differences are all in the [`Spec`]: the root is an overlay of the unpacked
//! image (read-only) and a writable layer private to the run, no host system directories
//! are granted, and the image's `Env`, `WorkingDir`, `User` and `Entrypoint`/`Cmd` shape
//! the command. Caps still decide mounts, network and limits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sandbox_core::{
    BackendKind, Capability, Caps, ContainerReceipt, ContainerSpec, Error, Mechanism, Receipt,
    Result, RunContext, RunOutput, SystemDirs, Tool,
};
use sandbox_os::backend_api::protocol::{Command, ImageRootSpec, Spec};
use sandbox_os::backend_api::{self, plan};
use sandbox_os::live::LiveProcess;
use sandbox_os::ProcessBackend;

use super::cache::Cache;
use super::image::Image;
use super::user;

/// Top-level names of the image that the sandbox provides itself.
const RESERVED: [&str; 4] = ["dev", "proc", "tmp", "sys"];

/// The argv a tool runs as in `image`: `Entrypoint` + argv for commands (like `docker run
/// IMAGE ARGS`), `Entrypoint` + `Cmd` for an empty command, the interpreter for scripts.
pub fn argv(tool: &Tool, image: &Image) -> Result<Vec<String>> {
    let config = &image.config;
    let argv = match tool {
        Tool::Command { argv } if argv.is_empty() => {
            let mut all = config.entrypoint.clone();
            all.extend(config.cmd.iter().cloned());
            if all.is_empty() {
                return Err(Error::invalid(format!(
                    "image {:?} has no Entrypoint or Cmd; name a program to run",
                    image.reference
                )));
            }
            all
        }
        Tool::Command { argv } => {
            let mut all = config.entrypoint.clone();
            all.extend(argv.iter().cloned());
            all
        }
        Tool::Script { language, source } => plan::script_argv(*language, source),
        Tool::Wasm { .. } => return Err(Error::invalid(
            "the container backend runs commands and scripts; run Tool::Wasm on the wasm backend",
        )),
        _ => {
            return Err(Error::invalid(
                "this tool kind is not supported by the container backend",
            ))
        }
    };
    Ok(argv)
}

/// The environment: the image's `Env`, overridden by the caps' env.
pub fn env(caps: &Caps, image: &Image, home: Option<&str>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for pair in &image.config.env {
        if let Some((key, value)) = pair.split_once('=') {
            if !key.is_empty() && !pair.contains('\0') {
                env.insert(key.to_string(), value.to_string());
            }
        }
    }
    if let Some(home) = home {
        env.entry("HOME".to_string())
            .or_insert_with(|| home.to_string());
    }
    for (key, value) in &caps.env {
        env.insert(key.clone(), value.clone());
    }
    env
}

/// The working directory: the caps' workdir, else the image's `WorkingDir`, else `/tmp`.
pub fn workdir(caps: &Caps, image: &Image) -> Result<PathBuf> {
    if let Some(dir) = &caps.workdir {
        return Ok(dir.clone());
    }
    match &image.config.working_dir {
        Some(dir) if dir.starts_with('/') => Ok(crate::normalize(dir)),
        Some(dir) => Err(Error::invalid(format!(
            "image {:?}: WorkingDir {dir:?} is not absolute",
            image.reference
        ))),
        None => Ok(PathBuf::from("/tmp")),
    }
}

/// Top-level directories and files of the unpacked image, split into those landlock may
/// grant full access (no granted mount beneath) and those that hold a mount (read and
/// execute only). Symlinks are skipped: their targets are covered by the real entries.
fn top_level(root: &Path, caps: &Caps) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut writable = Vec::new();
    let mut readable = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return (writable, readable);
    };
    let mut names: Vec<_> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir() || t.is_file()))
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let Some(text) = name.to_str() else { continue };
        if RESERVED.contains(&text) {
            continue;
        }
        let path = Path::new("/").join(text);
        let holds_mount = caps.mounts.iter().any(|m| m.guest.starts_with(&path));
        if holds_mount {
            readable.push(path);
        } else {
            writable.push(path);
        }
    }
    (writable, readable)
}

/// Whether `guest` exists as a directory in the image (looked up without leaving it).
fn image_has_dir(root: &Path, guest: &Path) -> bool {
    let Ok(rel) = guest.strip_prefix("/") else {
        return false;
    };
    let Ok(dir) = rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::NO_SYMLINKS,
    ) else {
        return false;
    };
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    rustix::fs::openat2(
        &dir,
        rel,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS,
    )
    .is_ok()
}

/// What the native runtime sets up around the process backend for one image: the caps the
/// process sandbox runs with (the image's root, user, environment and working directory
/// over the caller's) and the hook that puts the image's root under the sandbox.
struct Native {
    inner: Caps,
    image_root: ImageRootSpec,
    user: user::User,
    workdir_in_image: bool,
    workspace: Option<PathBuf>,
}

impl Native {
    fn plan(
        cache: &Cache,
        image: &Image,
        container: &ContainerSpec,
        caps: &Caps,
    ) -> Result<Native> {
        let workspace = match &container.workspace {
            None => None,
            Some(dir) => Some(std::fs::canonicalize(dir).map_err(|e| {
                Error::invalid(format!(
                    "container workspace {} is not accessible: {e}",
                    dir.display()
                ))
            })?),
        };
        if let Some(dir) = &workspace {
            if !dir.is_dir() {
                return Err(Error::invalid(format!(
                    "container workspace {} is not a directory",
                    dir.display()
                )));
            }
        }
        let rootfs = cache.rootfs(image)?;
        let user = user::resolve(&rootfs.path, image.config.user.as_deref())?;
        let workdir = workdir(caps, image)?;

        let mut inner = caps.clone();
        inner.container = None;
        inner.system = SystemDirs::None;
        inner.env = env(caps, image, user.home.as_deref());
        inner.workdir = Some(workdir.clone());
        let (writable, readable) = top_level(&rootfs.path, caps);
        let workdir_in_image = image_has_dir(&rootfs.path, &workdir)
            && !RESERVED
                .iter()
                .any(|r| workdir.starts_with(Path::new("/").join(r)));
        let image_root = ImageRootSpec {
            lower: rootfs.path.clone(),
            workspace: workspace.clone(),
            writable,
            readable,
        };
        Ok(Native {
            inner,
            image_root,
            user,
            workdir_in_image,
            workspace,
        })
    }

    /// The process backend's hook: the image's root, user and working directory.
    fn adjust(&self, spec: &mut Spec, _command: &mut Command) -> Result<()> {
        // The image brings its own /etc: no synthesized passwd or group files.
        spec.files.clear();
        spec.links.clear();
        spec.uid = self.user.uid;
        spec.gid = self.user.gid;
        if self.workdir_in_image {
            spec.workdir_is_scratch = false;
        }
        spec.image = Some(self.image_root.clone());
        Ok(())
    }

    /// The inner caps planned for the process backend that runs them: Strata's (the
    /// image's root, user and environment over the caller's, whose own were validated when
    /// the run was planned).
    fn spec(&self, tool: &Tool) -> Result<sandbox_core::RunSpec> {
        sandbox_core::RunSpec::plan(BackendKind::Process, tool, &self.inner, &plan::RealHost)
    }

    /// The container's lines of the receipt: backend, image, root and user (of a run, or
    /// of a `live` sandbox).
    fn receipt(&self, receipt: &mut Receipt, image: &Image, caps: &Caps, live: bool) {
        let (owner, ends) = match live {
            false => ("run's", "after the run"),
            true => ("live sandbox's", "when the live sandbox stops"),
        };
        receipt.backend = BackendKind::Container;
        receipt.layers = vec![BackendKind::Container];
        receipt.container = Some(ContainerReceipt {
            runtime: "native".into(),
            image: image.reference.clone(),
            digest: image.id.clone(),
        });
        let layer = match &self.workspace {
            Some(dir) => format!("writable layer kept in the workspace {}", dir.display()),
            None => format!(
                "private writable layer on the {owner} {} scratch tmpfs, discarded {ends}",
                caps.limits.disk
            ),
        };
        receipt.enforce(
            Capability::Fs,
            Mechanism::Image,
            "OCI image root (overlayfs)",
            format!(
                "{} {} as the read-only lower layer; {layer}; the image's /dev, /proc and /tmp covered",
                image.format.as_str(),
                image.id
            ),
        );
        let host = receipt.identity.as_ref().map_or_else(
            || "an unreported host id".to_string(),
            |id| {
                format!(
                    "host uid {} gid {} ({})",
                    id.host_uid,
                    id.host_gid,
                    id.source.as_str()
                )
            },
        );
        receipt.enforce(
            Capability::Privileges,
            Mechanism::Image,
            "image user",
            format!(
                "uid {} gid {} (image User {:?}) mapped to {host}",
                self.user.uid,
                self.user.gid,
                image.config.user.as_deref().unwrap_or("")
            ),
        );
    }
}

/// Runs `tool` in `image` (parsed from `container.image`) with `caps`.
pub fn run(
    process: &ProcessBackend,
    cache: &Cache,
    image: &Image,
    container: &ContainerSpec,
    tool: &Tool,
    caps: &Caps,
    ctx: &RunContext,
) -> Result<RunOutput> {
    let argv = argv(tool, image)?;
    let native = Native::plan(cache, image, container, caps)?;
    let command = Tool::command(argv);
    let spec = native.spec(&command)?;
    let mut out = backend_api::run_adjusted(process, &command, &spec, ctx, &|spec, command| {
        native.adjust(spec, command)
    })?;
    native.receipt(&mut out.receipt, image, caps, false);
    Ok(out)
}

/// Starts a live sandbox in `image` with `caps`: the process backend's live sandbox with
/// the image as its root, user, environment and working directory (see
/// [`sandbox_os::live`]). Every exec runs in the same root; its writable layer lives as long
/// as the sandbox (or in the container workspace, when one is given).
///
/// # Errors
/// As [`run`] before anything runs.
pub fn start_live(
    process: &ProcessBackend,
    cache: &Cache,
    image: &Image,
    container: &ContainerSpec,
    caps: &Caps,
    ctx: &RunContext,
) -> Result<LiveProcess> {
    let native = Native::plan(cache, image, container, caps)?;
    let spec = native.spec(&Tool::command(["true"]))?;
    let mut live = backend_api::start_live_adjusted(process, &spec, ctx, &|spec, command| {
        native.adjust(spec, command)
    })?;
    native.receipt(live.receipt_mut(), image, caps, true);
    Ok(live)
}
