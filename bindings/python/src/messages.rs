//! Signed messages between agents for Python: a directory of agents and their keys, signing,
//! and a verifier per receiving agent. Every check is `strata::policy::message`'s.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use strata::policy::message::{
    audit_event, Agent, AgentKey, Directory, Message, MessageKind, PublicKey, Scheme,
    SignedMessage, Verifier,
};

use crate::convert::{json_to_py, py_to_json};
use crate::errors::IntoPyResult;
use crate::sandbox::PySandbox;

/// Text of a message body: a `str` as is, anything else as JSON.
fn body_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = obj.extract::<String>() {
        return Ok(text);
    }
    Ok(py_to_json(obj, "body")?.to_string())
}

/// `generate_agent_key()`: a new agent secret (32 random bytes, hex). Keep it secret; share
/// only `agent_public_key(key)`.
#[pyfunction]
pub fn generate_agent_key(py: Python<'_>) -> PyResult<String> {
    Ok(AgentKey::generate().py_err(py)?.to_hex())
}

/// `agent_public_key(key)`: the Ed25519 public key (hex) of an agent secret.
#[pyfunction]
pub fn agent_public_key(py: Python<'_>, key: &str) -> PyResult<String> {
    Ok(AgentKey::from_hex(key).py_err(py)?.public_key().to_hex())
}

/// The agents one party knows: names, tiers (`low` 0, `medium` 1, `high` 2, or defined with
/// `define_tier`), keys, and whom each may message.
#[pyclass(module = "strata._strata", name = "AgentDirectory")]
pub struct PyAgentDirectory {
    inner: Mutex<Directory>,
}

impl PyAgentDirectory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Directory> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl PyAgentDirectory {
    #[new]
    fn new() -> Self {
        PyAgentDirectory {
            inner: Mutex::new(Directory::new()),
        }
    }

    /// Adds a tier name with its rank (higher is more trusted).
    fn define_tier(&self, py: Python<'_>, name: String, rank: u8) -> PyResult<()> {
        self.lock().define_tier(name, rank).py_err(py)
    }

    /// Adds agent `name` under `tier`, with its secret `key` (to sign, or to verify HMAC) or
    /// only its `public_key` (to verify Ed25519); `may_message` limits whom it may message
    /// (default: any known agent).
    #[pyo3(signature = (name, tier, *, key = None, public_key = None, may_message = None))]
    fn add(
        &self,
        py: Python<'_>,
        name: String,
        tier: String,
        key: Option<String>,
        public_key: Option<String>,
        may_message: Option<Vec<String>>,
    ) -> PyResult<()> {
        let mut directory = self.lock();
        let rank = directory.tier_rank(&tier).ok_or_else(|| {
            crate::errors::to_py(
                py,
                &strata::Error::invalid(format!(
                    "unknown tier {tier:?} (define it first with define_tier)"
                )),
            )
        })?;
        let mut agent = Agent::ranked(name, tier, rank);
        if let Some(key) = key {
            agent = agent.with_key(AgentKey::from_hex(&key).py_err(py)?);
        }
        if let Some(public) = public_key {
            agent = agent.with_public_key(PublicKey::from_hex(&public).py_err(py)?);
        }
        if let Some(names) = may_message {
            agent = agent.may_message_only(names);
        }
        directory.add(agent).py_err(py)
    }

    /// Signs a message from `sender` (whose key this directory holds) to `to` and returns it
    /// as JSON text. `kind`: `"task"`, `"result"`, `"delegate"` (then `tier`, the tier the
    /// recipient should run the task under, is required) or another word; `body`: a `str`,
    /// or anything JSON-serializable (sent as JSON text). `scheme`: `"ed25519"` (default)
    /// or `"hmac-sha256"` (per-pair key).
    #[pyo3(signature = (sender, to, kind, body, *, tier = None, scheme = "ed25519"))]
    #[allow(clippy::too_many_arguments)]
    fn sign(
        &self,
        py: Python<'_>,
        sender: String,
        to: String,
        kind: &str,
        body: &Bound<'_, PyAny>,
        tier: Option<String>,
        scheme: &str,
    ) -> PyResult<String> {
        let scheme: Scheme = scheme.parse().py_err(py)?;
        let body = body_text(body)?;
        let kind: MessageKind = kind.parse().py_err(py)?;
        let message = match (kind.is_delegate(), tier) {
            (true, Some(tier)) => Message::delegate(sender, to, body, tier, strata::unix_time_ms()),
            (true, None) => Err(strata::Error::invalid(
                "a delegate message names the tier the task runs under (tier=...)",
            )),
            (false, _) => Message::new(sender, to, kind, body, strata::unix_time_ms()),
        }
        .py_err(py)?;
        self.lock()
            .sign(message, scheme)
            .py_err(py)?
            .to_json()
            .py_err(py)
    }

    /// A verifier of messages addressed to `me`, holding a copy of this directory:
    /// timestamps within `window` seconds (default 30), each nonce accepted once. With
    /// `audit`, every accepted and refused message is recorded in that sandbox's audit log.
    #[pyo3(signature = (me, *, window = 30.0, audit = None))]
    fn verifier(
        &self,
        py: Python<'_>,
        me: String,
        window: f64,
        audit: Option<Py<PySandbox>>,
    ) -> PyResult<PyMessageVerifier> {
        let window = Duration::try_from_secs_f64(window).map_err(|_| {
            crate::errors::to_py(
                py,
                &strata::Error::invalid("window must be a non-negative number of seconds"),
            )
        })?;
        let verifier = Verifier::new(self.lock().clone(), me)
            .py_err(py)?
            .with_window(window);
        Ok(PyMessageVerifier {
            inner: Mutex::new(verifier),
            audit: audit.map(|s| s.get().sandbox.clone()),
        })
    }
}

/// Checks messages addressed to one agent: signature over every field, sender and
/// recipient, timestamp window, replay, and the trust rules (who may message and delegate).
#[pyclass(module = "strata._strata", name = "MessageVerifier")]
pub struct PyMessageVerifier {
    inner: Mutex<Verifier>,
    audit: Option<strata::Sandbox>,
}

#[pymethods]
impl PyMessageVerifier {
    /// Verifies `signed` (JSON text or its dict) and returns the message as a dict
    /// (`from`, `to`, `kind`, `body`, `timestamp_ms`, `nonce`, `delegated_tier`?, plus
    /// `scheme`, `sender_tier`, `delegation`: `{"delegator", "delegate", "tier", "rank"}`
    /// or `None`). Raises DeniedError naming why a message is refused (bad signature,
    /// replayed, stale, from the future, wrong recipient, unknown agent, not permitted),
    /// InvalidRequestError when it is malformed.
    fn verify<'py>(
        &self,
        py: Python<'py>,
        signed: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let text = match signed.extract::<String>() {
            Ok(text) => text,
            Err(_) => py_to_json(signed, "message")?.to_string(),
        };
        let signed = SignedMessage::from_json(&text).py_err(py)?;
        let verified = {
            let mut verifier = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            verifier.verify(&signed, strata::unix_time_ms())
        };
        if let Some(sandbox) = &self.audit {
            sandbox.audit(audit_event(&signed, &verified)).py_err(py)?;
        }
        let verified = verified.py_err(py)?;
        json_to_py(py, &verified.to_json())
    }
}
