//! How much harm a tool could do, as the caller declares it ([`Risk`]): the input of the
//! policy layer's router, carried in a run's context.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::caps::Caps;
use crate::error::{Error, Result};
use crate::tool::Tool;

/// How much harm a tool could do, as the caller declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// Pure computation: no files beyond its inputs, no network.
    Compute,
    /// Reads and writes files of a workspace.
    Files,
    /// Builds and tests code (toolchains, many processes).
    Build,
    /// Code nobody reviewed (model-written scripts, downloaded programs).
    Untrusted,
}

impl Risk {
    /// Every risk, lowest first.
    pub const ALL: [Risk; 4] = [Risk::Compute, Risk::Files, Risk::Build, Risk::Untrusted];

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Compute => "compute",
            Risk::Files => "files",
            Risk::Build => "build",
            Risk::Untrusted => "untrusted",
        }
    }

    /// The risk of a tool nobody declared one for: WebAssembly modules are `compute`;
    /// scripts (model-written code) are `untrusted`; a command in an image is `build`;
    /// other commands are `files`.
    pub fn of(tool: &Tool, caps: &Caps) -> Risk {
        match tool {
            Tool::Wasm { .. } => Risk::Compute,
            Tool::Script { .. } => Risk::Untrusted,
            Tool::Command { .. } if caps.container.is_some() => Risk::Build,
            Tool::Command { .. } => Risk::Files,
        }
    }

    /// The backend this risk prefers.
    pub fn preferred(self) -> BackendKind {
        match self {
            Risk::Compute => BackendKind::Wasm,
            Risk::Files | Risk::Build => BackendKind::Container,
            Risk::Untrusted => BackendKind::Microvm,
        }
    }

    /// Every backend in the order this risk tries them: the preferred one, then the
    /// fallbacks (those below [`Risk::floor`] only with `RoutePolicy::allow_weaker` (the policy crate)).
    pub fn chain(self) -> &'static [BackendKind] {
        use BackendKind::{Container, Microvm, Process, Wasm};
        match self {
            Risk::Compute => &[Wasm, Process, Container, Microvm],
            Risk::Files => &[Container, Process, Microvm, Wasm],
            Risk::Build => &[Container, Microvm, Process, Wasm],
            Risk::Untrusted => &[Microvm, Container, Process, Wasm],
        }
    }

    /// The weakest boundary this risk accepts without `RoutePolicy::allow_weaker` (the policy crate).
    pub fn floor(self) -> BackendKind {
        match self {
            Risk::Compute | Risk::Files => BackendKind::Process,
            Risk::Build => BackendKind::Container,
            Risk::Untrusted => BackendKind::Microvm,
        }
    }
}

impl fmt::Display for Risk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Risk {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Risk::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown risk {s:?} (expected compute, files, build or untrusted)"
                ))
            })
    }
}
