//! Checks of rendered objects against upstream's own data: the CRDs' v1beta1 schemas and
//! the `secure-sandbox-policy` admission policy, read from a directory holding
//! kubernetes-sigs/agent-sandbox's files as published (see [`Pinned::load`]).

pub mod admission;
mod cel_json;
pub mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

pub use admission::{AdmissionPolicy, Denial, Validation};
pub use schema::CrdSchema;

use crate::crd::Kind;
use crate::render::{RenderError, Rendered};

/// The environment variable that names the directory of the pinned agent-sandbox files.
pub const DIR_ENV: &str = "STRATA_AGENT_SANDBOX_DIR";
/// The admission policy's file name in that directory.
pub const POLICY_FILE: &str = "secure-sandbox-policy.yaml";

/// The pinned agent-sandbox data: the four CRD schemas and the admission policy.
pub struct Pinned {
    dir: PathBuf,
    schemas: BTreeMap<Kind, CrdSchema>,
    policy: AdmissionPolicy,
}

/// Which check an object failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The CRD's schema (JSON Schema, or a list-map key repeated).
    Schema,
    /// One of the CRD's `x-kubernetes-validations` CEL rules.
    CrdRule,
    /// A validation of the admission policy (its index in `spec.validations`).
    Admission {
        /// The validation's index.
        rule: usize,
    },
}

/// One thing wrong with one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The object's kind.
    pub kind: Kind,
    /// The check that failed.
    pub check: Check,
    /// A JSON pointer into the object (empty for the whole object).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let check = match self.check {
            Check::Schema => "schema".to_owned(),
            Check::CrdRule => "CRD rule".to_owned(),
            Check::Admission { rule } => format!("admission rule {}", rule + 1),
        };
        write!(
            f,
            "{} {check} at {:?}: {}",
            self.kind, self.path, self.message
        )
    }
}

/// Why the pinned data could not be loaded, or objects not checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not YAML.
    #[error("{path} is not YAML: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A CRD is not the expected one or its schema does not compile.
    #[error("CRD of {kind}: {message}")]
    Crd {
        /// The kind.
        kind: Kind,
        /// What is wrong.
        message: String,
    },
    /// The admission policy is not usable.
    #[error("admission policy: {message}")]
    Policy {
        /// What is wrong.
        message: String,
    },
    /// A CEL expression does not compile.
    #[error("CEL expression {expression:?}: {message}")]
    Cel {
        /// The expression.
        expression: String,
        /// The parser's message.
        message: String,
    },
    /// The objects could not be turned into JSON.
    #[error(transparent)]
    Render(#[from] RenderError),
}

impl Pinned {
    /// Loads the four CRDs (`<group>_<plural>.yaml`, as upstream names them) and
    /// [`POLICY_FILE`] from `dir`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Pinned, CheckError> {
        let dir = dir.as_ref().to_path_buf();
        let mut schemas = BTreeMap::new();
        for kind in Kind::ALL {
            let crd = read_yaml(&dir.join(kind.crd_file()))?;
            schemas.insert(kind, CrdSchema::from_crd(kind, &crd)?);
        }
        let policy = AdmissionPolicy::from_json(&read_yaml(&dir.join(POLICY_FILE))?)?;
        if !policy.matches(Kind::Sandbox, "CREATE") {
            return Err(CheckError::Policy {
                message: "the policy does not match the creation of sandboxes".into(),
            });
        }
        Ok(Pinned {
            dir,
            schemas,
            policy,
        })
    }

    /// The directory the data came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compiled schema of `kind`.
    pub fn schema(&self, kind: Kind) -> Option<&CrdSchema> {
        self.schemas.get(&kind)
    }

    /// The admission policy.
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// Checks one object: its kind's schema, then, when the policy matches creating it,
    /// the admission policy.
    pub fn check_object(&self, kind: Kind, object: &serde_json::Value) -> Vec<Violation> {
        let mut out = self
            .schema(kind)
            .map(|s| s.validate(object))
            .unwrap_or_default();
        if self.policy.matches(kind, "CREATE") {
            if let Err(denials) = self.policy.admit(kind, object) {
                out.extend(denials.into_iter().map(|d| Violation {
                    kind,
                    check: Check::Admission { rule: d.rule },
                    path: String::new(),
                    message: match d.error {
                        Some(error) => format!("{} (evaluation error: {error})", d.message),
                        None => d.message,
                    },
                }));
            }
        }
        out
    }

    /// Checks the four rendered objects. Empty when the API server, with the policy
    /// installed, would take every one.
    pub fn check(&self, rendered: &Rendered) -> Result<Vec<Violation>, CheckError> {
        Ok(rendered
            .to_json()?
            .iter()
            .flat_map(|(kind, object)| self.check_object(*kind, object))
            .collect())
    }
}

fn read_yaml(path: &Path) -> Result<serde_json::Value, CheckError> {
    let text = std::fs::read_to_string(path).map_err(|source| CheckError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_norway::from_str(&text).map_err(|e| CheckError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
