//! Profiles: one TOML or JSON file naming what a sandbox and its runs are given, shared by
//! the CLI (`strata run --profile FILE`), the bindings and (later) `strata mcp`.
//!
//! ```toml
//! backend = "auto"        # auto (default), process, wasm, container, microvm
//! strict = true           # default true: refuse what this host cannot enforce
//! tier = "low"            # a preset (low, medium, high) or one of [[tiers]]
//! risk = "files"          # compute, files, build, untrusted: routes backend auto
//!
//! [caps]                  # exactly the shape of schema/caps.schema.json
//! mounts = [{ host = "/srv/data", guest = "/data", access = "ro" }]
//! net = "none"
//! limits = { timeout_ms = 10000, memory = "256M" }
//!
//! [session]               # optional: sessions opened under the profile
//! workdir = "/workspace"  # their directory's guest path (default /workspace)
//! max_transfer = "256M"   # most bytes one file copy moves (default 256M)
//! max_open = 16           # sessions open at once in `strata mcp` (default 16)
//!
//! [[tiers]]               # optional: tiers of your own (see strata::policy::Tier)
//! name = "reviewers"
//! rank = 1
//! paths = { within = ["/srv"] }
//! writes = false
//! network = "none"
//! programs = "any"
//! secrets = false
//! ```
//!
//! Every key is checked: unknown keys are refused naming them, and the `caps` table is
//! validated against the caps JSON Schema generated from the core types (the same schema as
//! `schema/caps.schema.json`) before it is read, so a profile means the same thing in every
//! language. A profile never holds secret values (`caps.secrets` is refused: give secrets
//! per run).

use std::path::{Path, PathBuf};

use sandbox_core::{ByteSize, Caps, Error, Result, Strictness};
use sandbox_policy::{Risk, Tier};
use serde::Deserialize;
use serde_json::Value;

use crate::sandbox::{BackendChoice, SandboxBuilder};

/// A parsed profile. Absent keys keep the defaults of [`SandboxBuilder`] and
/// [`Caps::new`].
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// The backend choice. Default: `auto`.
    pub backend: BackendChoice,
    /// Strict (default) or best effort.
    pub strictness: Strictness,
    /// The tier every run is checked against, if any.
    pub tier: Option<String>,
    /// Tiers the profile defines.
    pub tiers: Vec<Tier>,
    /// The declared risk of the profile's runs, if any.
    pub risk: Option<Risk>,
    /// The caps of the profile's runs.
    pub caps: Caps,
    /// How sessions opened under the profile are set up (`[session]`).
    pub session: SessionSettings,
}

/// The `[session]` table of a profile.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionSettings {
    /// The guest path of a session's directory. Default: `/workspace`.
    pub workdir: PathBuf,
    /// The most bytes one file copy moves. Default: 256 MiB.
    pub max_transfer: ByteSize,
    /// The most sessions open at once where a server holds them for clients (`strata
    /// mcp`). Default: 16.
    pub max_open: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            workdir: PathBuf::from("/workspace"),
            max_transfer: ByteSize::mib(256),
            max_open: 16,
        }
    }
}

/// Everything but the caps, read strictly.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    strict: Option<bool>,
    #[serde(default)]
    tier: Option<String>,
    #[serde(default)]
    tiers: Vec<Tier>,
    #[serde(default)]
    risk: Option<Risk>,
    #[serde(default)]
    session: SessionSettings,
}

impl Profile {
    /// Reads a profile file: TOML unless its name ends in `.json`.
    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(format!("profile {}: cannot read it: {e}", path.display()))
        })?;
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Profile::from_json(&text),
            _ => Profile::from_toml(&text),
        };
        parsed.map_err(|e| match e {
            Error::InvalidRequest { reason } => {
                Error::invalid(format!("profile {}: {reason}", path.display()))
            }
            other => other,
        })
    }

    /// A profile from TOML text.
    pub fn from_toml(text: &str) -> Result<Profile> {
        let value: toml::Value =
            toml::from_str(text).map_err(|e| Error::invalid(format!("not valid TOML: {e}")))?;
        let value = serde_json::to_value(value)
            .map_err(|e| Error::invalid(format!("not representable as JSON: {e}")))?;
        Profile::from_value(value)
    }

    /// A profile from JSON text (the same keys as the TOML form).
    pub fn from_json(text: &str) -> Result<Profile> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::invalid(format!("not valid JSON: {e}")))?;
        Profile::from_value(value)
    }

    fn from_value(value: Value) -> Result<Profile> {
        let Value::Object(mut object) = value else {
            return Err(Error::invalid(
                "a profile is a table (an object) of settings",
            ));
        };
        let caps = match object.remove("caps") {
            Some(caps) => caps_from(caps)?,
            None => Caps::new(),
        };
        let settings: Settings = serde_json::from_value(Value::Object(object))
            .map_err(|e| Error::invalid(e.to_string()))?;
        let backend = match settings.backend.as_deref() {
            Some(name) => name.parse()?,
            None => BackendChoice::Auto,
        };
        let strictness = match settings.strict {
            Some(false) => Strictness::BestEffort,
            _ => Strictness::Strict,
        };
        let profile = Profile {
            backend,
            strictness,
            tier: settings.tier,
            tiers: settings.tiers,
            risk: settings.risk,
            caps,
            session: settings.session,
        };
        if profile.session.max_open == 0 {
            return Err(Error::invalid("session.max_open must be at least 1"));
        }
        if let Some(name) = &profile.tier {
            let known = Tier::PRESETS.contains(&name.as_str())
                || profile.tiers.iter().any(|t| &t.name == name);
            if !known {
                return Err(Error::invalid(format!(
                    "tier {name:?} is neither a preset (low, medium, high) nor defined in [[tiers]]"
                )));
            }
        }
        Ok(profile)
    }

    /// The [`crate::SessionOptions`] of the `[session]` table.
    #[cfg(feature = "process")]
    pub fn session_options(&self) -> crate::SessionOptions {
        crate::SessionOptions {
            workdir: self.session.workdir.clone(),
            max_transfer: self.session.max_transfer,
            parent: None,
        }
    }

    /// `builder` with this profile's backend, strictness, tiers and tier.
    pub fn apply(&self, builder: SandboxBuilder) -> SandboxBuilder {
        let mut builder = builder.backend(self.backend).strictness(self.strictness);
        for tier in &self.tiers {
            builder = builder.define_tier(tier.clone());
        }
        if let Some(tier) = &self.tier {
            builder = builder.tier(tier);
        }
        builder
    }
}

/// The caps table: validated against the generated caps JSON Schema, then read.
fn caps_from(value: Value) -> Result<Caps> {
    if value.get("secrets").is_some() {
        return Err(Error::invalid(
            "caps.secrets: a profile never holds secret values; give secrets per run",
        ));
    }
    let schema = sandbox_core::schema::caps();
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| Error::invalid(format!("the caps JSON Schema does not compile: {e}")))?;
    let problems: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| {
            let at = e.instance_path().to_string();
            let at = if at.is_empty() {
                "caps".to_string()
            } else {
                format!("caps{at}")
            };
            format!("{at}: {e}")
        })
        .collect();
    if !problems.is_empty() {
        return Err(Error::invalid(format!(
            "does not match the caps schema: {}",
            problems.join("; ")
        )));
    }
    Caps::from_json(&value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_profile_sets_backend_tier_risk_and_caps() {
        let profile = Profile::from_toml(
            r#"
backend = "process"
tier = "reviewers"
risk = "files"
[caps]
mounts = [{ host = "/srv/data", guest = "/data", access = "ro" }]
limits = { timeout_ms = 10000, memory = "256M" }
[[tiers]]
name = "reviewers"
rank = 1
paths = { within = ["/srv"] }
writes = false
network = "none"
programs = "any"
secrets = false
"#,
        )
        .expect("profile");
        assert_eq!(
            profile.backend,
            BackendChoice::Only(sandbox_core::BackendKind::Process)
        );
        assert_eq!(profile.risk, Some(Risk::Files));
        assert_eq!(profile.caps.mounts.len(), 1);
        assert_eq!(profile.caps.limits.timeout.as_millis(), 10_000);
        assert_eq!(profile.tiers[0].name, "reviewers");
    }

    #[test]
    fn the_session_table_sets_workdir_transfer_and_open_limits() {
        let profile = Profile::from_toml(
            "[session]\nworkdir = \"/work\"\nmax_transfer = \"1M\"\nmax_open = 2\n",
        )
        .expect("profile");
        assert_eq!(profile.session.workdir, PathBuf::from("/work"));
        assert_eq!(profile.session.max_transfer, ByteSize::mib(1));
        assert_eq!(profile.session.max_open, 2);
        assert_eq!(
            Profile::from_toml("").expect("empty").session,
            SessionSettings::default()
        );
        assert!(Profile::from_toml("[session]\nworkdri = \"/x\"\n").is_err());
        assert!(Profile::from_toml("[session]\nmax_open = 0\n").is_err());
    }

    #[test]
    fn json_and_toml_profiles_mean_the_same() {
        let toml = Profile::from_toml("tier = \"low\"\n[caps]\nnet = \"none\"\n").expect("toml");
        let json = Profile::from_json(r#"{"tier": "low", "caps": {"net": "none"}}"#).expect("json");
        assert_eq!(toml.caps, json.caps);
        assert_eq!(toml.tier, json.tier);
    }

    #[test]
    fn caps_that_do_not_match_the_schema_are_refused_naming_where() {
        let err = Profile::from_toml("[caps]\nlimits = { timeout_ms = \"soon\" }\n")
            .expect_err("bad type");
        assert!(err.to_string().contains("caps/limits/timeout_ms"), "{err}");
        let err = Profile::from_toml("[caps]\nmounts = [{ host = \"/a\", acces = \"ro\" }]\n")
            .expect_err("typo");
        assert!(err.to_string().contains("acces"), "{err}");
    }

    #[test]
    fn unknown_settings_secrets_and_unknown_tiers_are_refused() {
        assert!(Profile::from_toml("bakend = \"process\"\n")
            .expect_err("typo")
            .to_string()
            .contains("bakend"));
        let secrets = "[caps]\nsecrets = [{ env = \"T\", value = \"v\", hosts = [\"x.com\"] }]\n";
        assert!(Profile::from_toml(secrets).is_err());
        assert!(Profile::from_toml("tier = \"root\"\n").is_err());
        assert!(Profile::from_toml("backend = \"cloud\"\n").is_err());
        assert!(Profile::from_toml("not toml [").is_err());
    }
}
