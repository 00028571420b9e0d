//! Host probe results: which backends and guarantees are available here, and why not.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;

/// One probed fact about the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// What was probed (e.g. `"landlock"`, `"cgroup"`).
    pub name: String,
    /// Whether it is usable.
    pub ok: bool,
    /// What was found (version, path) or why it is unusable.
    pub detail: String,
}

impl Check {
    /// A check result.
    pub fn new(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Self {
        Check {
            name: name.into(),
            ok,
            detail: detail.into(),
        }
    }
}

/// Availability of one backend on this host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendReport {
    /// The backend.
    pub backend: BackendKind,
    /// Whether it can run tools here with its full guarantees.
    pub available: bool,
    /// Why not, when unavailable.
    pub reason: Option<String>,
    /// Each guarantee it relies on.
    pub checks: Vec<Check>,
}

impl BackendReport {
    /// A report for a backend that is not usable, with the reason.
    pub fn unavailable(backend: BackendKind, reason: impl Into<String>) -> Self {
        BackendReport {
            backend,
            available: false,
            reason: Some(reason.into()),
            checks: Vec::new(),
        }
    }
}

/// Everything `strata doctor` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    /// One entry per backend.
    pub backends: Vec<BackendReport>,
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for report in &self.backends {
            let state = if report.available {
                "available"
            } else {
                "UNAVAILABLE"
            };
            write!(f, "{:<10} {state}", report.backend.as_str())?;
            if let Some(reason) = &report.reason {
                write!(f, ": {reason}")?;
            }
            writeln!(f)?;
            for check in &report.checks {
                let mark = if check.ok { "ok " } else { "no " };
                writeln!(f, "    {mark} {:<22} {}", check.name, check.detail)?;
            }
        }
        Ok(())
    }
}
