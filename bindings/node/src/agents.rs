//! Signed messages between agents for Node: a directory of agents and keys, signing, and a
//! verifier per receiving agent. Every check is `strata::policy::message`'s. Values cross as
//! JSON text; refusals come back as [`NativeError`]s (`denied`, `invalid_request`).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use napi::bindgen_prelude::Either;
use napi_derive::napi;
use strata::policy::message::{
    audit_event, Agent, AgentKey, Directory, Message, MessageKind, PublicKey, Scheme,
    SignedMessage, Verifier,
};

use crate::convert::NativeError;

fn native<T>(result: strata::Result<T>) -> Either<T, NativeError> {
    match result {
        Ok(value) => Either::A(value),
        Err(e) => Either::B((&e).into()),
    }
}

fn refusal(result: strata::Result<()>) -> Option<NativeError> {
    result.err().map(|e| (&e).into())
}

/// A new agent secret (32 random bytes, hex), or the error when the OS has no randomness.
#[napi]
pub fn generate_agent_key() -> Either<String, NativeError> {
    native(AgentKey::generate().map(|k| k.to_hex()))
}

/// The Ed25519 public key (hex) of an agent secret.
#[napi]
pub fn agent_public_key(key: String) -> Either<String, NativeError> {
    native(AgentKey::from_hex(&key).map(|k| k.public_key().to_hex()))
}

/// Options of [`NativeDirectory::add`].
#[napi(object)]
pub struct NativeAgentOptions {
    /// The agent's secret (hex): to sign, or to verify HMAC messages.
    pub key: Option<String>,
    /// The agent's Ed25519 public key (hex): to verify its messages.
    pub public_key: Option<String>,
    /// Whom it may message (default: any known agent).
    pub may_message: Option<Vec<String>>,
}

/// The agents one party knows.
#[napi]
pub struct NativeDirectory {
    inner: Mutex<Directory>,
}

impl Default for NativeDirectory {
    fn default() -> Self {
        Self::new()
    }
}

#[napi]
impl NativeDirectory {
    /// An empty directory that knows the tiers `low` (0), `medium` (1), `high` (2).
    #[napi(constructor)]
    pub fn new() -> Self {
        NativeDirectory {
            inner: Mutex::new(Directory::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Directory> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a tier name with its rank (higher is more trusted).
    #[napi]
    pub fn define_tier(&self, name: String, rank: u32) -> Option<NativeError> {
        let rank =
            u8::try_from(rank).map_err(|_| strata::Error::invalid("a tier's rank is at most 255"));
        refusal(rank.and_then(|rank| self.lock().define_tier(name, rank)))
    }

    /// Adds agent `name` under `tier`.
    #[napi]
    pub fn add(
        &self,
        name: String,
        tier: String,
        options: Option<NativeAgentOptions>,
    ) -> Option<NativeError> {
        let options = options.unwrap_or(NativeAgentOptions {
            key: None,
            public_key: None,
            may_message: None,
        });
        let mut directory = self.lock();
        let added = (|| {
            let rank = directory.tier_rank(&tier).ok_or_else(|| {
                strata::Error::invalid(format!(
                    "unknown tier {tier:?} (define it first with defineTier)"
                ))
            })?;
            let mut agent = Agent::ranked(name, tier.clone(), rank);
            if let Some(key) = &options.key {
                agent = agent.with_key(AgentKey::from_hex(key)?);
            }
            if let Some(public) = &options.public_key {
                agent = agent.with_public_key(PublicKey::from_hex(public)?);
            }
            if let Some(names) = options.may_message {
                agent = agent.may_message_only(names);
            }
            directory.add(agent)
        })();
        refusal(added)
    }

    /// Signs a message (`body` is text) and returns it as JSON text. `kind` `delegate` needs
    /// `tier`; `scheme` is `ed25519` (default) or `hmac-sha256`.
    #[napi]
    pub fn sign(
        &self,
        sender: String,
        to: String,
        kind: String,
        body: String,
        tier: Option<String>,
        scheme: Option<String>,
    ) -> Either<String, NativeError> {
        let signed = (|| {
            let scheme: Scheme = scheme.as_deref().unwrap_or("ed25519").parse()?;
            let kind: MessageKind = kind.parse()?;
            let message = match (kind.is_delegate(), tier) {
                (true, Some(tier)) => {
                    Message::delegate(sender, to, body, tier, strata::unix_time_ms())?
                }
                (true, None) => {
                    return Err(strata::Error::invalid(
                        "a delegate message names the tier the task runs under (tier)",
                    ))
                }
                (false, _) => Message::new(sender, to, kind, body, strata::unix_time_ms())?,
            };
            self.lock().sign(message, scheme)?.to_json()
        })();
        native(signed)
    }

    /// A verifier of messages addressed to `me` (a copy of this directory), accepting
    /// timestamps within `window_ms` (default 30 000) and each nonce once.
    #[napi]
    pub fn verifier(
        &self,
        me: String,
        window_ms: Option<f64>,
    ) -> Either<NativeVerifier, NativeError> {
        let window = Duration::from_millis(window_ms.unwrap_or(30_000.0).max(0.0) as u64);
        native(
            Verifier::new(self.lock().clone(), me).map(|v| NativeVerifier {
                inner: Mutex::new(v.with_window(window)),
            }),
        )
    }
}

/// Checks messages addressed to one agent.
#[napi]
pub struct NativeVerifier {
    inner: Mutex<Verifier>,
}

#[napi]
impl NativeVerifier {
    /// Verifies `signed` (JSON text): the message as JSON text with `scheme`, `sender_tier`
    /// and `delegation` added, or why it was refused. With `audit`, the outcome is recorded
    /// in that sandbox's audit log first.
    #[napi]
    pub fn verify(
        &self,
        signed: String,
        audit: Option<&crate::NativeSandbox>,
    ) -> Either<String, NativeError> {
        let result = (|| {
            let signed = SignedMessage::from_json(&signed)?;
            let verified = self
                .inner
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .verify(&signed, strata::unix_time_ms());
            if let Some(sandbox) = audit {
                sandbox.inner.audit(audit_event(&signed, &verified))?;
            }
            let verified = verified?;
            Ok(verified.to_json().to_string())
        })();
        native(result)
    }
}
