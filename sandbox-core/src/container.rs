//! What the container backend runs a tool in: an OCI image and a runtime.
//!
//! Part of [`crate::Caps`] (`caps.container`), so the Rust API, the bindings and the CLI
//! (`--image`, `--runtime`) share one schema. Only the container backend reads it; the other
//! backends refuse caps that set it rather than silently running on the host's files.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The image and runtime of a container run.
///
/// ```
/// use sandbox_core::{Caps, ContainerRuntime};
/// let caps = Caps::new().image("/images/python.tar").runtime(ContainerRuntime::Docker);
/// let container = caps.container.as_ref().unwrap();
/// assert_eq!(container.runtime, ContainerRuntime::Docker);
/// assert!(container.workspace.is_none());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// The image. For the native runtime: a host path to an OCI image layout directory
    /// (optionally `DIR:TAG`), a `docker save` or OCI archive tar, or a root filesystem
    /// directory. For an engine runtime: the same paths (loaded into the engine), or the
    /// name or id of an image the engine already has. Nothing is ever pulled from a
    /// registry. Required.
    pub image: String,
    /// Which runtime runs the container. Default: [`ContainerRuntime::Native`].
    #[serde(default)]
    pub runtime: ContainerRuntime,
    /// A host directory that keeps the container's writable layer between runs (native
    /// runtime only). Default: `None`: every run gets a fresh, size-capped (by
    /// `limits.disk`) writable layer that is discarded when the run ends, so nothing of one
    /// run is visible to the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PathBuf>,
}

impl ContainerSpec {
    /// A spec for `image` on the native runtime, without a kept workspace.
    pub fn new(image: impl Into<String>) -> Self {
        ContainerSpec {
            image: image.into(),
            runtime: ContainerRuntime::Native,
            workspace: None,
        }
    }
}

/// Who runs a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContainerRuntime {
    /// Strata's own runtime, no daemon: the process backend's isolation (namespaces,
    /// landlock, seccomp, cgroups, rlimits) with the image as the root file system.
    #[default]
    Native,
    /// A Docker engine, through its API on `/var/run/docker.sock`.
    Docker,
    /// A Podman engine, through its Docker-compatible API (`/run/podman/podman.sock`).
    Podman,
    /// A Docker engine with gVisor's `runsc` as the OCI runtime. `gvisor` is read as a
    /// legacy spelling.
    #[serde(alias = "gvisor")]
    Runsc,
}

impl ContainerRuntime {
    /// The lowercase name used by the CLI, the bindings and receipts.
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerRuntime::Native => "native",
            ContainerRuntime::Docker => "docker",
            ContainerRuntime::Podman => "podman",
            ContainerRuntime::Runsc => "runsc",
        }
    }
}

impl fmt::Display for ContainerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContainerRuntime {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "native" => Ok(ContainerRuntime::Native),
            "docker" => Ok(ContainerRuntime::Docker),
            "podman" => Ok(ContainerRuntime::Podman),
            "runsc" | "gvisor" => Ok(ContainerRuntime::Runsc),
            other => Err(crate::Error::invalid(format!(
                "unknown container runtime {other:?} (expected native, docker, podman or runsc)"
            ))),
        }
    }
}

/// What the receipt says about a container run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ContainerReceipt {
    /// The runtime that ran it (`native`, `docker`, `podman`, `runsc`).
    pub runtime: String,
    /// The image reference as given.
    pub image: String,
    /// The image id (`sha256:` digest of its configuration), or `dir:PATH` for a root file
    /// system directory, which has no digest.
    pub digest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_spec_json_rejects_unknown_keys_and_defaults_to_native() {
        let spec: ContainerSpec = serde_json::from_str(r#"{"image":"/i.tar"}"#).expect("parse");
        assert_eq!(spec, ContainerSpec::new("/i.tar"));
        let err = serde_json::from_str::<ContainerSpec>(r#"{"image":"x","pull":true}"#)
            .expect_err("unknown key");
        assert!(err.to_string().contains("unknown field"), "{err}");
        let spec: ContainerSpec =
            serde_json::from_str(r#"{"image":"x","runtime":"runsc"}"#).expect("parse");
        assert_eq!(spec.runtime, ContainerRuntime::Runsc);
    }

    #[test]
    fn runtime_names_round_trip() {
        for rt in [
            ContainerRuntime::Native,
            ContainerRuntime::Docker,
            ContainerRuntime::Podman,
            ContainerRuntime::Runsc,
        ] {
            assert_eq!(rt.as_str().parse::<ContainerRuntime>().expect("parse"), rt);
        }
        assert!("lxc".parse::<ContainerRuntime>().is_err());
    }
}
