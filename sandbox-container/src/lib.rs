//! Strata's container backend: an OCI image as the sandbox's root.
//!
//! Two kinds of runtime behind one [`ContainerBackend`], chosen per run by
//! `caps.container.runtime`:
//! - **native** (default, no daemon): the process backend's sandbox (same helper,
//!   namespaces, landlock, seccomp, cgroups, rlimits) whose root is an overlay of the
//!   unpacked image and a writable layer private to the run ([`native`]). Images come from
//!   local OCI layouts, `docker save`/OCI archives or root file system directories
//!   ([`image`]), unpacked safely ([`unpack`]) into a content-addressed cache ([`cache`]).
//! - **docker / podman / runsc**: a container engine through its API ([`engine`]).
//!
//! Images are never pulled from a registry. The engine runtimes run under Strata's
//! seccomp profile ([`seccomp_oci`]), generated from the process sandbox's table.
//!
//! Built on the process backend (`sandbox-os`): the native runtime is a process sandbox
//! whose planned spec it adjusts, and a [`ContainerBackend`] can share one
//! [`ProcessBackend`] (helper, id registry, host probe) with the embedder's process runs.

#![deny(missing_docs)]

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use sandbox_core::{
    Backend, BackendKind, BackendReport, Check, ContainerRuntime, Error, Result, RunContext,
    RunOutput, RunSpec, Tool,
};
use sandbox_os::ProcessBackend;

pub mod cache;
pub mod engine;
pub mod engine_egress;
mod engine_receipt;
pub mod image;
pub mod native;
pub mod owner;
pub mod seccomp_oci;
pub mod unpack;
pub mod user;

pub use cache::Cache;

/// Runs tools in OCI images: natively on the process sandbox, or on a container engine.
///
/// Defaults: the helper found like the process backend's ([`sandbox_os::find_helper`]), the
/// image cache in [`Cache::default_dir`], the Docker engine at
/// [`engine::DOCKER_SOCKET`]. Every run needs `caps.container` (an image); a run without
/// one is an invalid request.
///
/// Standard input ([`Caps::stdin`], then [`RunContext::stdin`]) is streamed by both
/// runtimes with bounded buffering: the native runtime through the process backend, the
/// engine runtimes over the attach connection ([`engine`]).
#[derive(Debug)]
pub struct ContainerBackend {
    process: Arc<ProcessBackend>,
    cache: Cache,
    parsed: image::Memo,
}

impl Default for ContainerBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ContainerBackend {
    /// A backend using the default helper and image cache.
    pub fn new() -> Self {
        ContainerBackend {
            process: Arc::new(ProcessBackend::new()),
            cache: Cache::new(Cache::default_dir()),
            parsed: image::Memo::default(),
        }
    }

    /// A backend whose native runtime uses `process` (its helper, id registry and probe),
    /// shared with the caller's process runs.
    pub fn with_process(process: Arc<ProcessBackend>) -> Self {
        ContainerBackend {
            process,
            cache: Cache::new(Cache::default_dir()),
            parsed: image::Memo::default(),
        }
    }

    /// Uses `cache` for unpacked images.
    pub fn with_cache(mut self, cache: Cache) -> Self {
        self.cache = cache;
        self
    }

    /// The unpacked-image cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

impl ContainerBackend {
    /// Starts a live sandbox in the image of `spec.caps.container` (planned for the
    /// container backend) on the native runtime: one process sandbox with the image as its
    /// root that every exec runs in (see [`native::start_live`]).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] without an image; [`Error::BackendUnavailable`] for the
    /// engine runtimes (Docker, Podman, runsc), which live sandboxes do not use; otherwise as
    /// [`Backend::run`] before anything runs.
    pub fn start_live(
        &self,
        spec: &RunSpec,
        ctx: &RunContext,
    ) -> Result<sandbox_os::live::LiveProcess> {
        spec.require_kind(BackendKind::Container)?;
        let caps = &spec.caps;
        let Some(container) = &caps.container else {
            return Err(Error::invalid(
                "a live container sandbox needs an image: set caps.container (CLI: --image REF)",
            ));
        };
        match container.runtime {
            ContainerRuntime::Native => {
                let image = self.parsed.open(&container.image)?;
                native::start_live(&self.process, &self.cache, &image, container, caps, ctx)
            }
            other => Err(Error::unavailable(
                BackendKind::Container,
                format!(
                    "live sandboxes run images on the native runtime, not on {other}: start it with --runtime native"
                ),
            )),
        }
    }
}

impl Backend for ContainerBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Container
    }

    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput> {
        spec.require_kind(BackendKind::Container)?;
        let caps = &spec.caps;
        let Some(container) = &caps.container else {
            return Err(Error::invalid(
                "the container backend needs an image: set caps.container (CLI: --image REF)",
            ));
        };
        match container.runtime {
            ContainerRuntime::Native => {
                let image = self.parsed.open(&container.image)?;
                native::run(
                    &self.process,
                    &self.cache,
                    &image,
                    container,
                    tool,
                    caps,
                    ctx,
                )
            }
            ContainerRuntime::Docker | ContainerRuntime::Podman | ContainerRuntime::Runsc => {
                engine::run(container, tool, spec, ctx, &self.process)
            }
            _ => Err(Error::invalid(format!(
                "unsupported container runtime {}",
                container.runtime
            ))),
        }
    }

    fn report(&self) -> BackendReport {
        let process = self.process.report();
        let mut checks = vec![Check::new(
            "native runtime",
            process.available,
            process
                .reason
                .clone()
                .unwrap_or_else(|| "process sandbox + overlayfs image root".into()),
        )];
        let overlay = std::fs::read_to_string("/proc/filesystems")
            .is_ok_and(|f| f.lines().any(|l| l.ends_with("overlay")));
        checks.push(Check::new(
            "overlayfs",
            overlay,
            if overlay {
                "available"
            } else {
                "not in /proc/filesystems (modprobe overlay)"
            },
        ));
        for (runtime, socket) in [
            ("docker", engine::DOCKER_SOCKET),
            ("podman", engine::PODMAN_SOCKET),
        ] {
            let up = Path::new(socket).exists();
            checks.push(Check::new(
                format!("{runtime} engine"),
                up,
                if up {
                    socket.to_string()
                } else {
                    format!("{socket} not found")
                },
            ));
        }
        let runsc = ["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"]
            .iter()
            .find(|p| Path::new(p).exists());
        checks.push(Check::new(
            "gVisor runsc",
            runsc.is_some(),
            runsc.map_or("not installed (Debian package runsc)".to_string(), |p| {
                p.to_string()
            }),
        ));
        let reason = match (process.available, overlay) {
            (true, true) => None,
            (false, _) => process.reason.clone(),
            (true, false) => Some("overlayfs is not available".into()),
        };
        BackendReport {
            backend: BackendKind::Container,
            available: reason.is_none(),
            reason,
            checks,
        }
    }
}

/// Normalizes an absolute image path (`/app/./x/` -> `/app/x`, `..` dropped at the root).
pub(crate) fn normalize(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}
