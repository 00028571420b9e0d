//! Agents that trust each other by proof: signed messages between named agents, checked
//! against a [`Directory`] of keys and trust ranks.
//!
//! An agent is a name, a tier (name and rank, as [`Tier`]; a higher rank is more trusted)
//! and key material. A [`Message`] (`task`, `result`, `delegate`, ...) is signed by its sender
//! into a [`SignedMessage`], which crosses process boundaries as JSON; the recipient's
//! [`Verifier`] checks it and returns a [`VerifiedMessage`], or refuses it with a
//! [`MessageRefusal`] naming the problem.
//!
//! # Schemes
//!
//! - **`ed25519`**: the sender signs with its Ed25519 key; a verifier needs only the sender's
//!   [`PublicKey`]. Verification is strict (`verify_strict`: no malleable signatures, no
//!   small-order keys). Use it when agents must not be able to forge each other's messages.
//! - **`hmac-sha256`**: a MAC under a key shared by the pair of agents ([`PairKey`]). Either
//!   set explicitly per pair ([`Directory::set_pair_key`]) or derived, deterministically and
//!   symmetrically, from both agents' secrets with HKDF-SHA256. Whoever holds a pair key can
//!   write messages in either direction of that pair, so a directory holding every agent's
//!   secret (a broker) can forge any HMAC message; give each agent only its own pair keys
//!   when that matters, or use Ed25519.
//!
//! One [`AgentKey`] (32 random bytes) serves both: Strata derives from it, with HKDF-SHA256
//! and distinct labels, the Ed25519 signing seed and the HMAC secret, so the same bytes are
//! never used by two algorithms.
//!
//! # What is signed
//!
//! Every field of the message and the scheme, in this byte encoding (`lp(x)` is the length
//! of `x` as a big-endian `u64` followed by `x`; strings are their UTF-8 bytes):
//!
//! ```text
//! lp("strata-msg-v1") lp(scheme) lp(from) lp(to) lp(kind) lp(body)
//! timestamp_ms (u64, big-endian) nonce (16 bytes)
//! 0x00 (no delegated tier) | 0x01 lp(delegated_tier)
//! ```
//!
//! The domain prefix [`DOMAIN`] keeps these signatures from being valid for anything else.
//! The JSON form refuses unknown fields, so nothing travels that the signature does not
//! cover. The body is a string (structured payloads travel as JSON text, see
//! [`Message::body_json`]), so the signed bytes never depend on how a JSON library orders
//! or formats values.
//!
//! # Checks, in order
//!
//! [`Verifier::check`] refuses, with the first reason that applies: an unknown sender or
//! recipient ([`MessageRefusal::UnknownAgent`]); a message addressed to another agent than
//! the verifier's ([`MessageRefusal::WrongRecipient`]); a bad signature, compared in constant
//! time ([`MessageRefusal::BadSignature`]); a malformed message
//! ([`MessageRefusal::Malformed`]); a timestamp outside the window, default ±30 s
//! ([`MessageRefusal::Stale`], [`MessageRefusal::Future`]); a nonce already accepted
//! ([`MessageRefusal::Replayed`]); a full replay cache ([`MessageRefusal::CacheFull`]); and
//! what trust does not permit ([`MessageRefusal::NotPermitted`]).
//!
//! # Trust
//!
//! - **Messaging**: any known agent may message any known agent, unless the sender's entry
//!   restricts whom it may message ([`Agent::may_message_only`]). A message carries no
//!   authority by itself: work a `task` asks for should run under at most the sender's tier
//!   ([`VerifiedMessage::sender_tier`]).
//! - **Delegation**: a `delegate` message names the tier the recipient should run the task
//!   under. It is permitted only to an agent of the same or a lower rank, and only with a
//!   tier that is at most both the delegate's own tier and the delegator's. "At most" means
//!   the same tier, or one of a strictly lower rank: two different tiers of equal rank are
//!   not comparable, so neither can be delegated for the other. A delegation never raises
//!   the delegate's tier; [`Delegation::tier`] is the tier to use.
//!
//! Every outcome should be logged: [`audit_event`] turns one into an
//! [`AuditEvent::Policy`] (`subject: "message"`), and [`Verifier::verify_audited`] hands it
//! to the caller's sink before the message is acted on.
//!
//! Like the rest of the policy layer this is pure: no clocks are read (callers pass
//! `now_ms`, milliseconds since the Unix epoch) and only key and nonce generation touch the
//! OS (its random source).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::tier::Tier;
use sandbox_core::audit::AuditEvent;
use sandbox_core::error::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// The domain-separation prefix of every signed encoding (see the module docs).
pub const DOMAIN: &str = "strata-msg-v1";
/// Default timestamp window of a [`Verifier`]: a message is accepted from 30 s before to
/// 30 s after the verifier's `now_ms`.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);
/// Default bound of a [`Verifier`]'s replay cache: 100 000 unexpired nonces (about 10 MB at
/// most; entries are fixed-size).
pub const DEFAULT_NONCE_CAPACITY: usize = 100_000;
/// Longest agent or tier name, in bytes.
pub const MAX_NAME_LEN: usize = 128;
/// Longest message kind, in bytes.
pub const MAX_KIND_LEN: usize = 64;

/// The longest unauthenticated value repeated in refusals and audit details, in characters.
const CLIP: usize = 128;

mod crypto;
mod directory;
mod keys;
mod verify;

use crypto::*;
pub use directory::*;
pub use keys::*;
pub use verify::*;

// ---------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------

/// What a message is. Serialized as its name: `task`, `result`, `delegate`, or another name
/// of 1 to [`MAX_KIND_LEN`] characters from `a-z`, `0-9`, `_`, `-`, `.`. Kinds compare by
/// name, so `Other("task")` is [`MessageKind::Task`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum MessageKind {
    /// Asks the recipient to do something.
    Task,
    /// Answers a task.
    Result,
    /// Hands a task to the recipient to run under [`Message::delegated_tier`]; the only
    /// kind that names a tier, and the only one [`Delegation`] rules apply to.
    Delegate,
    /// Any other kind, by name.
    Other(String),
}

impl MessageKind {
    /// The name.
    pub fn as_str(&self) -> &str {
        match self {
            MessageKind::Task => "task",
            MessageKind::Result => "result",
            MessageKind::Delegate => "delegate",
            MessageKind::Other(name) => name,
        }
    }

    /// Whether this is a delegation.
    pub fn is_delegate(&self) -> bool {
        self.as_str() == "delegate"
    }

    fn check(&self) -> std::result::Result<(), String> {
        let name = self.as_str();
        let fits = !name.is_empty()
            && name.len() <= MAX_KIND_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b));
        if fits {
            Ok(())
        } else {
            Err(format!(
                "kind {:?} is not 1 to {MAX_KIND_LEN} characters of a-z, 0-9, _, -, .",
                clip(name)
            ))
        }
    }
}

impl PartialEq for MessageKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for MessageKind {}

impl std::hash::Hash for MessageKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MessageKind {
    type Err = Error;

    /// Parses a kind name.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a name outside the allowed characters or length.
    fn from_str(name: &str) -> Result<MessageKind> {
        let kind = match name {
            "task" => MessageKind::Task,
            "result" => MessageKind::Result,
            "delegate" => MessageKind::Delegate,
            other => MessageKind::Other(other.to_string()),
        };
        kind.check().map_err(Error::invalid)?;
        Ok(kind)
    }
}

impl TryFrom<String> for MessageKind {
    type Error = Error;

    fn try_from(name: String) -> Result<MessageKind> {
        name.parse()
    }
}

impl From<MessageKind> for String {
    fn from(kind: MessageKind) -> String {
        match kind {
            MessageKind::Other(name) => name,
            known => known.as_str().to_string(),
        }
    }
}

/// A message's one-time number: 16 random bytes, serialized as 32 hex characters. A
/// [`Verifier`] accepts each (sender, nonce) once.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Nonce([u8; 16]);

impl Nonce {
    /// A fresh nonce from the OS random source.
    ///
    /// # Errors
    /// [`Error::Internal`] when the OS has no randomness to give.
    pub fn generate() -> Result<Nonce> {
        let mut bytes = [0u8; 16];
        random(&mut bytes, "nonce")?;
        Ok(Nonce(bytes))
    }

    /// The nonce with these bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Nonce {
        Nonce(bytes)
    }

    /// The 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lowercase hex, 32 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 32 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input.
    pub fn from_hex(text: &str) -> Result<Nonce> {
        unhex("nonce", text).map(Nonce)
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", self.to_hex())
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for Nonce {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Nonce {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Nonce::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// A message from one agent to another. Every field is signed (see the module docs).
/// Agent and tier names are 1 to [`MAX_NAME_LEN`] bytes without control characters; the
/// body has no length limit here (bound it where messages are received).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// The sender's name.
    pub from: String,
    /// The recipient's name.
    pub to: String,
    /// What the message is.
    pub kind: MessageKind,
    /// The payload; structured payloads as JSON text.
    pub body: String,
    /// When it was sent, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Its one-time number.
    pub nonce: Nonce,
    /// For `delegate` only (required there): the tier the recipient should run the task
    /// under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegated_tier: Option<String>,
}

impl Message {
    /// A message sent at `now_ms` with a fresh nonce. Not for `delegate` (use
    /// [`Message::delegate`]).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name or kind, or a `delegate` kind;
    /// [`Error::Internal`] when the OS has no randomness.
    pub fn new(
        from: impl Into<String>,
        to: impl Into<String>,
        kind: MessageKind,
        body: impl Into<String>,
        now_ms: u64,
    ) -> Result<Message> {
        let message = Message {
            from: from.into(),
            to: to.into(),
            kind,
            body: body.into(),
            timestamp_ms: now_ms,
            nonce: Nonce::generate()?,
            delegated_tier: None,
        };
        message.validate()?;
        Ok(message)
    }

    /// A `delegate` message sent at `now_ms` with a fresh nonce: `task` for `to` to run under
    /// `tier`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name; [`Error::Internal`] when the OS has no
    /// randomness.
    pub fn delegate(
        from: impl Into<String>,
        to: impl Into<String>,
        task: impl Into<String>,
        tier: impl Into<String>,
        now_ms: u64,
    ) -> Result<Message> {
        let message = Message {
            from: from.into(),
            to: to.into(),
            kind: MessageKind::Delegate,
            body: task.into(),
            timestamp_ms: now_ms,
            nonce: Nonce::generate()?,
            delegated_tier: Some(tier.into()),
        };
        message.validate()?;
        Ok(message)
    }

    /// Checks names, the kind, and that a tier is named exactly when the kind is `delegate`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        self.problem()
            .map_or(Ok(()), |why| Err(Error::invalid(why)))
    }

    fn problem(&self) -> Option<String> {
        if let Err(why) = check_name("sender", &self.from) {
            return Some(why);
        }
        if let Err(why) = check_name("recipient", &self.to) {
            return Some(why);
        }
        if let Err(why) = self.kind.check() {
            return Some(why);
        }
        match (&self.delegated_tier, self.kind.is_delegate()) {
            (Some(tier), true) => check_name("delegated tier", tier).err(),
            (None, true) => Some("a delegate message must name a delegated tier".into()),
            (Some(_), false) => Some(format!(
                "a {} message names a delegated tier; only delegate messages may",
                self.kind
            )),
            (None, false) => None,
        }
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when it is not JSON.
    pub fn body_json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body).map_err(|e| Error::invalid(format!("message body: {e}")))
    }

    /// The bytes a signature under `scheme` covers (encoding in the module docs).
    pub fn signing_bytes(&self, scheme: Scheme) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.body.len());
        put(&mut out, DOMAIN.as_bytes());
        put(&mut out, scheme.as_str().as_bytes());
        put(&mut out, self.from.as_bytes());
        put(&mut out, self.to.as_bytes());
        put(&mut out, self.kind.as_str().as_bytes());
        put(&mut out, self.body.as_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_be_bytes());
        out.extend_from_slice(&self.nonce.0);
        match &self.delegated_tier {
            None => out.push(0),
            Some(tier) => {
                out.push(1);
                put(&mut out, tier.as_bytes());
            }
        }
        out
    }

    /// Signs with the pair key of `from` and `to`. Does not validate (the verifier does).
    pub fn sign_hmac(self, key: &PairKey) -> SignedMessage {
        let signature = hmac_sha256(&key.0, &[&self.signing_bytes(Scheme::HmacSha256)]);
        SignedMessage {
            message: self,
            scheme: Scheme::HmacSha256,
            signature: hex(&signature),
        }
    }

    /// Signs with the sender's key (Ed25519). Does not validate (the verifier does).
    pub fn sign_ed25519(self, key: &AgentKey) -> SignedMessage {
        let signature = key.signing_key().sign(&self.signing_bytes(Scheme::Ed25519));
        SignedMessage {
            message: self,
            scheme: Scheme::Ed25519,
            signature: hex(&signature.to_bytes()),
        }
    }
}

/// A signature scheme. Serialized as `hmac-sha256` or `ed25519`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scheme {
    /// HMAC-SHA256 under the pair's [`PairKey`]; signatures are 64 hex characters.
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    /// Ed25519 by the sender's key; signatures are 128 hex characters.
    #[serde(rename = "ed25519")]
    Ed25519,
}

impl Scheme {
    /// Both schemes.
    pub const ALL: [Scheme; 2] = [Scheme::HmacSha256, Scheme::Ed25519];

    /// The name: `hmac-sha256` or `ed25519`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::HmacSha256 => "hmac-sha256",
            Scheme::Ed25519 => "ed25519",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scheme {
    type Err = Error;

    /// `ed25519` or `hmac-sha256`.
    fn from_str(s: &str) -> Result<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|scheme| scheme.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown scheme {s:?} (expected ed25519 or hmac-sha256)"
                ))
            })
    }
}

/// A message with its signature, as it crosses process boundaries (JSON:
/// `{"message": {...}, "scheme": "ed25519", "signature": "<hex>"}`; unknown fields are
/// refused).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedMessage {
    /// The message.
    pub message: Message,
    /// How it is signed.
    pub scheme: Scheme,
    /// The signature or MAC, lowercase hex.
    pub signature: String,
}

impl SignedMessage {
    /// The JSON text.
    ///
    /// # Errors
    /// [`Error::Internal`] if serialization fails (it does not for these types).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::Internal {
            message: format!("serializing a signed message: {e}"),
            source: None,
        })
    }

    /// Parses the JSON text.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for malformed JSON, unknown fields, a bad nonce or kind.
    pub fn from_json(text: &str) -> Result<SignedMessage> {
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("signed message: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn key(n: u8) -> AgentKey {
        AgentKey::from_bytes([n; 32])
    }

    /// boss (high), worker (medium), intern (low), mallory (medium), all with secrets.
    fn directory() -> Directory {
        let mut dir = Directory::new();
        for (name, tier, n) in [
            ("boss", Tier::high(), 1),
            ("worker", Tier::medium("/home/w"), 2),
            ("intern", Tier::low(), 3),
            ("mallory", Tier::medium("/home/m"), 4),
        ] {
            dir.add(Agent::new(name, &tier).with_key(key(n)))
                .expect("add");
        }
        dir
    }

    fn verifier(me: &str) -> Verifier {
        Verifier::new(directory(), me).expect("verifier")
    }

    fn message(from: &str, to: &str, kind: MessageKind, ts: u64, n: u8) -> Message {
        Message {
            from: from.into(),
            to: to.into(),
            kind,
            body: r#"{"run":"ls"}"#.into(),
            timestamp_ms: ts,
            nonce: Nonce::from_bytes([n; 16]),
            delegated_tier: None,
        }
    }

    fn task(ts: u64, n: u8) -> Message {
        message("boss", "worker", MessageKind::Task, ts, n)
    }

    fn delegation(from: &str, to: &str, tier: &str, n: u8) -> Message {
        Message {
            delegated_tier: Some(tier.into()),
            ..message(from, to, MessageKind::Delegate, T0, n)
        }
    }

    fn sign(message: Message, scheme: Scheme) -> SignedMessage {
        directory().sign(message, scheme).expect("sign")
    }

    fn refusal(v: &mut Verifier, signed: &SignedMessage, now: u64) -> MessageRefusal {
        v.check(signed, now).expect_err("refused")
    }

    #[test]
    fn a_signed_task_is_accepted_under_both_schemes() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let ok = v
                .check(&sign(task(T0, 1), scheme), T0 + 5)
                .expect("accepted");
            assert_eq!(ok.message(), &task(T0, 1));
            assert_eq!(ok.scheme(), scheme);
            assert_eq!((ok.sender_tier(), ok.sender_rank()), ("high", 2));
            assert!(ok.delegation().is_none());
        }
    }

    #[test]
    fn replayed_message_is_refused() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let signed = sign(task(T0, 1), scheme);
            v.verify(&signed, T0).expect("first time");
            let again = refusal(&mut v, &signed, T0 + 1_000);
            assert!(matches!(again, MessageRefusal::Replayed { .. }), "{again}");
            let err = v.verify(&signed, T0 + 2_000).expect_err("replay");
            assert!(matches!(err, Error::Denied { .. }));
            assert!(err.to_string().contains("replayed"), "{err}");
        }
    }

    #[test]
    fn expired_message_is_refused() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let signed = sign(task(T0, 1), scheme);
            let stale = refusal(&mut v, &signed, T0 + 30_001);
            assert_eq!(
                stale,
                MessageRefusal::Stale {
                    age_ms: 30_001,
                    window_ms: 30_000
                }
            );
            let mut v = verifier("worker");
            v.check(&signed, T0 + 30_000).expect("at the edge");
        }
    }

    #[test]
    fn message_from_the_future_is_refused() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let signed = sign(task(T0 + 30_001, 1), scheme);
            let future = refusal(&mut v, &signed, T0);
            assert_eq!(future.code(), "future", "{future}");
            let mut v = verifier("worker").with_window(Duration::from_secs(60));
            v.check(&signed, T0).expect("within a wider window");
        }
    }

    /// Signs a message, changes it with `tamper`, and presents it to `me`.
    fn assert_tamper_refused(original: Message, me: &str, tamper: impl Fn(&mut Message)) {
        for scheme in Scheme::ALL {
            let mut signed = sign(original.clone(), scheme);
            verifier(me)
                .check(&signed, T0)
                .expect("the untampered message is accepted");
            tamper(&mut signed.message);
            let mut v = verifier(me);
            let refused = refusal(&mut v, &signed, T0);
            assert!(
                matches!(refused, MessageRefusal::BadSignature { .. }),
                "{scheme}: {refused}"
            );
        }
    }

    #[test]
    fn tampered_body_is_refused() {
        assert_tamper_refused(task(T0, 1), "worker", |m| {
            m.body = r#"{"run":"rm -rf /"}"#.into()
        });
    }

    #[test]
    fn tampered_sender_is_refused() {
        assert_tamper_refused(task(T0, 1), "worker", |m| m.from = "intern".into());
    }

    #[test]
    fn tampered_recipient_is_refused() {
        let original = message("boss", "worker", MessageKind::Task, T0, 1);
        for scheme in Scheme::ALL {
            let mut signed = sign(original.clone(), scheme);
            signed.message.to = "intern".into();
            let refused = refusal(&mut verifier("intern"), &signed, T0);
            assert_eq!(refused.code(), "bad_signature", "{scheme}: {refused}");
        }
    }

    #[test]
    fn tampered_kind_is_refused() {
        assert_tamper_refused(task(T0, 1), "worker", |m| m.kind = MessageKind::Result);
        assert_tamper_refused(task(T0, 1), "worker", |m| {
            m.kind = MessageKind::Delegate;
            m.delegated_tier = Some("medium".into());
        });
    }

    #[test]
    fn tampered_timestamp_is_refused() {
        assert_tamper_refused(task(T0, 1), "worker", |m| m.timestamp_ms += 1);
    }

    #[test]
    fn tampered_nonce_is_refused() {
        assert_tamper_refused(task(T0, 1), "worker", |m| {
            m.nonce = Nonce::from_bytes([2; 16])
        });
    }

    #[test]
    fn tampered_delegated_tier_is_refused() {
        let original = delegation("boss", "worker", "low", 1);
        assert_tamper_refused(original.clone(), "worker", |m| {
            m.delegated_tier = Some("medium".into())
        });
        assert_tamper_refused(original, "worker", |m| {
            m.kind = MessageKind::Task;
            m.delegated_tier = None;
        });
    }

    #[test]
    fn tampered_signature_or_scheme_is_refused() {
        for scheme in Scheme::ALL {
            let mut signed = sign(task(T0, 1), scheme);
            let flipped = if signed.signature.starts_with('0') {
                "1"
            } else {
                "0"
            };
            signed.signature.replace_range(0..1, flipped);
            assert_eq!(
                refusal(&mut verifier("worker"), &signed, T0).code(),
                "bad_signature"
            );
            let mut signed = sign(task(T0, 1), scheme);
            signed.scheme = match scheme {
                Scheme::Ed25519 => Scheme::HmacSha256,
                Scheme::HmacSha256 => Scheme::Ed25519,
            };
            assert_eq!(
                refusal(&mut verifier("worker"), &signed, T0).code(),
                "bad_signature"
            );
        }
    }

    #[test]
    fn message_for_another_agent_is_refused() {
        for scheme in Scheme::ALL {
            let signed = sign(task(T0, 1), scheme);
            let refused = refusal(&mut verifier("intern"), &signed, T0);
            assert_eq!(
                refused,
                MessageRefusal::WrongRecipient {
                    to: "worker".into(),
                    verifier: "intern".into()
                }
            );
        }
    }

    #[test]
    fn unknown_sender_or_recipient_is_refused() {
        for scheme in Scheme::ALL {
            let mut stranger = task(T0, 1);
            stranger.from = "stranger".into();
            let signed = stranger.sign_ed25519(&key(9));
            let signed = SignedMessage { scheme, ..signed };
            let refused = refusal(&mut verifier("worker"), &signed, T0);
            assert_eq!(
                refused,
                MessageRefusal::UnknownAgent {
                    name: "stranger".into()
                }
            );
            let mut lost = task(T0, 1);
            lost.to = "nobody".into();
            let refused = refusal(&mut verifier("worker"), &lost.sign_ed25519(&key(1)), T0);
            assert_eq!(refused.code(), "unknown_agent");
        }
    }

    #[test]
    fn signature_by_another_agents_key_is_refused() {
        // Ed25519: mallory signs a message claiming to be from boss.
        let forged = task(T0, 1).sign_ed25519(&key(4));
        let refused = refusal(&mut verifier("worker"), &forged, T0);
        assert_eq!(refused.code(), "bad_signature", "{refused}");
        // HMAC: mallory uses her own pair key with worker for a message claiming boss.
        let mallorys = PairKey::derive("mallory", &key(4), "worker", &key(2));
        let forged = task(T0, 1).sign_hmac(&mallorys);
        let refused = refusal(&mut verifier("worker"), &forged, T0);
        assert_eq!(refused.code(), "bad_signature", "{refused}");
        // Nor does a key from outside the directory.
        let forged = task(T0, 1).sign_hmac(&PairKey::from_bytes([7; 32]));
        assert_eq!(
            refusal(&mut verifier("worker"), &forged, T0).code(),
            "bad_signature"
        );
    }

    #[test]
    fn delegation_within_the_tiers_names_the_effective_tier() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let ok = v
                .check(&sign(delegation("boss", "worker", "low", 1), scheme), T0)
                .expect("accepted");
            let d = ok.delegation().expect("a delegation");
            assert_eq!(
                (
                    d.delegator.as_str(),
                    d.delegate.as_str(),
                    d.tier.as_str(),
                    d.rank
                ),
                ("boss", "worker", "low", 0)
            );
            let ok = v
                .check(&sign(delegation("boss", "worker", "medium", 2), scheme), T0)
                .expect("its own tier");
            assert_eq!(ok.delegation().map(|d| d.tier.as_str()), Some("medium"));
            // Same rank: mallory (medium) may delegate to worker (medium).
            v.check(&sign(delegation("mallory", "worker", "low", 3), scheme), T0)
                .expect("same rank");
        }
    }

    #[test]
    fn delegation_to_a_higher_tier_is_refused() {
        for scheme in Scheme::ALL {
            let mut v = verifier("boss");
            let refused = refusal(
                &mut v,
                &sign(delegation("intern", "boss", "low", 1), scheme),
                T0,
            );
            assert_eq!(refused.code(), "not_permitted");
            assert!(refused.to_string().contains("higher tier"), "{refused}");
            let mut v = verifier("worker");
            let refused = refusal(
                &mut v,
                &sign(delegation("intern", "worker", "low", 1), scheme),
                T0,
            );
            assert_eq!(refused.code(), "not_permitted", "{refused}");
        }
        let err = directory()
            .check_delegation("intern", "boss", "low")
            .expect_err("refused");
        assert!(matches!(err, Error::Denied { .. }));
    }

    #[test]
    fn delegation_cannot_raise_the_delegates_tier() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let refused = refusal(
                &mut v,
                &sign(delegation("boss", "worker", "high", 1), scheme),
                T0,
            );
            assert_eq!(refused.code(), "not_permitted");
            assert!(refused.to_string().contains("delegate worker"), "{refused}");
        }
        let dir = directory();
        // Nor above the delegator's, nor sideways to another tier of the same rank.
        let mut dir2 = dir.clone();
        dir2.define_tier("medium-net", 1).expect("tier");
        let err = dir2
            .check_delegation("mallory", "worker", "medium-net")
            .expect_err("sideways");
        assert!(err.to_string().contains("not at most"), "{err}");
        assert!(dir.check_delegation("boss", "worker", "root").is_err());
        assert!(dir.check_delegation("worker", "intern", "medium").is_err());
        let ok = dir
            .check_delegation("worker", "intern", "low")
            .expect("low");
        assert_eq!(ok.tier, "low");
    }

    #[test]
    fn delegation_must_name_a_tier_and_only_delegation_may() {
        for scheme in Scheme::ALL {
            let mut no_tier = delegation("boss", "worker", "low", 1);
            no_tier.delegated_tier = None;
            let signed = no_tier.sign_ed25519(&key(1));
            let signed = if scheme == Scheme::HmacSha256 {
                signed
                    .message
                    .sign_hmac(&directory().pair_key("boss", "worker").expect("pair"))
            } else {
                signed
            };
            let refused = refusal(&mut verifier("worker"), &signed, T0);
            assert_eq!(refused.code(), "malformed", "{refused}");
            let err = verifier("worker")
                .verify(&signed, T0)
                .expect_err("malformed");
            assert!(matches!(err, Error::InvalidRequest { .. }), "{err}");
        }
        let mut task_with_tier = task(T0, 1);
        task_with_tier.delegated_tier = Some("high".into());
        assert!(directory().sign(task_with_tier, Scheme::Ed25519).is_err());
    }

    #[test]
    fn messaging_restrictions_are_enforced() {
        let mut dir = Directory::new();
        dir.add(
            Agent::new("a", &Tier::low())
                .with_key(key(1))
                .may_message_only(["b"]),
        )
        .expect("a");
        dir.add(Agent::new("b", &Tier::low()).with_key(key(2)))
            .expect("b");
        dir.add(Agent::new("c", &Tier::low()).with_key(key(3)))
            .expect("c");
        assert!(dir.may_message("a", "b") && !dir.may_message("a", "c"));
        assert!(dir.may_message("c", "a") && !dir.may_message("c", "nobody"));
        let to_c = dir
            .sign(message("a", "c", MessageKind::Task, T0, 1), Scheme::Ed25519)
            .expect("sign");
        let mut v = Verifier::new(dir.clone(), "c").expect("verifier");
        let refused = refusal(&mut v, &to_c, T0);
        assert_eq!(refused.code(), "not_permitted", "{refused}");
        let to_b = dir
            .sign(message("a", "b", MessageKind::Task, T0, 1), Scheme::Ed25519)
            .expect("sign");
        Verifier::new(dir, "b")
            .expect("verifier")
            .check(&to_b, T0)
            .expect("allowed");
    }

    #[test]
    fn nonce_cache_forgets_only_expired_nonces() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker");
            let first = sign(task(T0, 1), scheme);
            let second = sign(task(T0 + 20_000, 2), scheme);
            v.check(&first, T0).expect("first");
            v.check(&second, T0 + 20_000).expect("second");
            assert_eq!(v.remembered(), 2);
            // At T0 + 30 001 the first has left the window; the second has not.
            let third = sign(task(T0 + 30_001, 3), scheme);
            v.check(&third, T0 + 30_001).expect("third");
            assert_eq!(v.remembered(), 2, "the first nonce is forgotten");
            assert_eq!(refusal(&mut v, &second, T0 + 30_001).code(), "replayed");
            assert_eq!(refusal(&mut v, &first, T0 + 30_001).code(), "stale");
        }
    }

    #[test]
    fn full_cache_refuses_rather_than_forgets() {
        for scheme in Scheme::ALL {
            let mut v = verifier("worker").with_capacity(2);
            v.check(&sign(task(T0, 1), scheme), T0).expect("1");
            v.check(&sign(task(T0, 2), scheme), T0).expect("2");
            let full = refusal(&mut v, &sign(task(T0, 3), scheme), T0 + 1);
            assert_eq!(full, MessageRefusal::CacheFull { capacity: 2 });
            // Both remembered nonces are still refused as replays.
            assert_eq!(
                refusal(&mut v, &sign(task(T0, 1), scheme), T0 + 2).code(),
                "replayed"
            );
            // Once the first two expire, there is room again.
            let later = T0 + 30_001;
            v.check(&sign(task(later, 3), scheme), later).expect("room");
            assert_eq!(v.remembered(), 1);
        }
    }

    #[test]
    fn clock_stepping_back_does_not_revive_forgotten_nonces() {
        let mut v = verifier("worker");
        let old = sign(task(T0, 1), Scheme::Ed25519);
        v.check(&old, T0).expect("first");
        v.check(&sign(task(T0 + 40_000, 2), Scheme::Ed25519), T0 + 40_000)
            .expect("later");
        assert_eq!(v.remembered(), 1, "the first nonce expired");
        // The caller's clock steps back to T0: the old message is still stale.
        assert_eq!(refusal(&mut v, &old, T0).code(), "stale");
    }

    #[test]
    fn signed_message_survives_a_json_round_trip() {
        for scheme in Scheme::ALL {
            let signed = sign(delegation("boss", "worker", "low", 1), scheme);
            let text = signed.to_json().expect("json");
            assert!(text.contains(&format!(r#""scheme":"{scheme}""#)), "{text}");
            assert!(
                text.contains(r#""nonce":"01010101010101010101010101010101""#),
                "{text}"
            );
            assert!(text.contains(r#""kind":"delegate""#), "{text}");
            let back = SignedMessage::from_json(&text).expect("parse");
            assert_eq!(back, signed);
            verifier("worker").check(&back, T0).expect("still verifies");
        }
        let fresh = Message::new("boss", "worker", "review".parse().expect("kind"), "{}", T0)
            .expect("message");
        let signed = directory().sign(fresh, Scheme::HmacSha256).expect("sign");
        let back = SignedMessage::from_json(&signed.to_json().expect("json")).expect("parse");
        assert_eq!(back.message.kind, MessageKind::Other("review".into()));
        verifier("worker").check(&back, T0).expect("verifies");
        assert_eq!(
            back.message.body_json().expect("json body"),
            serde_json::json!({})
        );
    }

    #[test]
    fn unsigned_extra_fields_and_bad_values_do_not_parse() {
        let signed = sign(task(T0, 1), Scheme::Ed25519);
        let mut value = serde_json::to_value(&signed).expect("value");
        value["message"]["admin"] = serde_json::json!(true);
        assert!(SignedMessage::from_json(&value.to_string()).is_err());
        let mut value = serde_json::to_value(&signed).expect("value");
        value["message"]["nonce"] = serde_json::json!("xyz");
        assert!(SignedMessage::from_json(&value.to_string()).is_err());
        let mut value = serde_json::to_value(&signed).expect("value");
        value["message"]["kind"] = serde_json::json!("Task!");
        assert!(SignedMessage::from_json(&value.to_string()).is_err());
        let mut value = serde_json::to_value(&signed).expect("value");
        value["scheme"] = serde_json::json!("none");
        assert!(SignedMessage::from_json(&value.to_string()).is_err());
    }

    #[test]
    fn ed25519_needs_only_the_senders_public_key() {
        let boss_key = AgentKey::generate().expect("random");
        let mut sender = Directory::new();
        sender
            .add(Agent::new("boss", &Tier::high()).with_key(boss_key.clone()))
            .expect("boss");
        sender
            .add(Agent::new("worker", &Tier::low()))
            .expect("worker");
        let signed = sender.sign(task(T0, 1), Scheme::Ed25519).expect("sign");
        assert!(
            sender.sign(task(T0, 1), Scheme::HmacSha256).is_err(),
            "no pair key"
        );

        let public = PublicKey::from_hex(&boss_key.public_key().to_hex()).expect("hex");
        let mut receiver = Directory::new();
        receiver
            .add(Agent::new("boss", &Tier::high()).with_public_key(public))
            .expect("boss");
        receiver
            .add(Agent::new("worker", &Tier::low()))
            .expect("worker");
        let mut v = Verifier::new(receiver, "worker").expect("verifier");
        v.check(&signed, T0)
            .expect("verified with the public key alone");
        let hmac = task(T0, 2).sign_hmac(&PairKey::from_bytes([0; 32]));
        let refused = refusal(&mut v, &hmac, T0);
        assert!(
            refused.to_string().contains("no key for the pair"),
            "{refused}"
        );
    }

    #[test]
    fn an_explicit_pair_key_verifies_without_agent_secrets() {
        let shared = PairKey::from_base64(&PairKey::from_bytes([5; 32]).to_base64()).expect("b64");
        let mut dir = Directory::new();
        dir.add(Agent::new("boss", &Tier::high())).expect("boss");
        dir.add(Agent::new("worker", &Tier::medium("/w")))
            .expect("worker");
        dir.set_pair_key("worker", "boss", shared).expect("pair");
        assert!(dir
            .set_pair_key("worker", "nobody", PairKey::from_bytes([0; 32]))
            .is_err());
        let signed = dir.sign(task(T0, 1), Scheme::HmacSha256).expect("sign");
        Verifier::new(dir, "worker")
            .expect("verifier")
            .check(&signed, T0)
            .expect("verified");
    }

    #[test]
    fn pair_keys_are_symmetric_and_distinct_per_pair() {
        let ab = PairKey::derive("a", &key(1), "b", &key(2));
        let ba = PairKey::derive("b", &key(2), "a", &key(1));
        assert_eq!(ab.as_bytes(), ba.as_bytes());
        let ac = PairKey::derive("a", &key(1), "c", &key(3));
        assert_ne!(ab.as_bytes(), ac.as_bytes());
        // The names are bound in: the same secrets under other names give another key.
        let renamed = PairKey::derive("x", &key(1), "b", &key(2));
        assert_ne!(ab.as_bytes(), renamed.as_bytes());
        // And the pair key is neither agent's secret nor its HMAC secret.
        assert_ne!(ab.as_bytes(), key(1).as_bytes());
        assert_ne!(&key(1).hmac_secret(), key(1).signing_key().as_bytes());
    }

    #[test]
    fn keys_round_trip_and_never_print() {
        let k = AgentKey::generate().expect("random");
        assert_ne!(
            k.as_bytes(),
            AgentKey::generate().expect("random").as_bytes()
        );
        assert_eq!(
            AgentKey::from_hex(&k.to_hex()).expect("hex").as_bytes(),
            k.as_bytes()
        );
        assert_eq!(
            AgentKey::from_base64(&k.to_base64())
                .expect("b64")
                .as_bytes(),
            k.as_bytes()
        );
        assert_eq!(
            AgentKey::from_hex(&k.to_hex().to_uppercase())
                .expect("HEX")
                .as_bytes(),
            k.as_bytes()
        );
        assert!(AgentKey::from_hex("abcd").is_err());
        assert!(AgentKey::from_base64("AAAA").is_err());
        let printed = format!(
            "{k:?} {:?}",
            Agent::new("a", &Tier::low()).with_key(k.clone())
        );
        assert!(!printed.contains(&k.to_hex()), "{printed}");
        assert!(!printed.contains(&k.to_base64()), "{printed}");
        let pair = PairKey::derive("a", &k, "b", &key(2));
        assert!(!format!("{pair:?}").contains(&pair.to_hex()));
        let public = k.public_key();
        assert_eq!(
            PublicKey::from_base64(&public.to_base64()).expect("b64"),
            public
        );
        let text = serde_json::to_string(&public).expect("json");
        assert_eq!(
            serde_json::from_str::<PublicKey>(&text).expect("parse"),
            public
        );
        // The identity point is a weak key.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(PublicKey::from_bytes(&identity).is_err());
    }

    #[test]
    fn directory_refuses_contradictions() {
        let mut dir = directory();
        assert!(
            dir.add(Agent::new("boss", &Tier::high())).is_err(),
            "duplicate"
        );
        assert!(
            dir.add(Agent::ranked("x", "low", 5)).is_err(),
            "low is rank 0"
        );
        assert!(dir.add(Agent::ranked("", "low", 0)).is_err(), "empty name");
        assert!(
            dir.add(Agent::ranked("a\nb", "low", 0)).is_err(),
            "control character"
        );
        let mismatched = Agent::new("y", &Tier::low())
            .with_key(key(8))
            .with_public_key(key(9).public_key());
        assert!(dir.add(mismatched).is_err());
        assert!(Verifier::new(directory(), "nobody").is_err());
        assert_eq!(dir.tier_rank("medium"), Some(1));
    }

    #[test]
    fn audit_events_name_the_message_and_the_reason() {
        let mut v = verifier("worker");
        let mut events = Vec::new();
        let mut sink = |e: AuditEvent| {
            events.push(e);
            Ok(())
        };
        let signed = sign(delegation("boss", "worker", "low", 1), Scheme::Ed25519);
        v.verify_audited(&signed, T0, &mut sink).expect("accepted");
        v.verify_audited(&signed, T0, &mut sink)
            .expect_err("replay");
        let records: Vec<(String, String, String)> = events
            .into_iter()
            .filter_map(|e| match e {
                AuditEvent::Policy {
                    subject,
                    decision,
                    detail,
                } => Some((subject, decision, detail)),
                _ => None,
            })
            .collect();
        assert_eq!(records.len(), 2);
        assert!(records.iter().all(|(s, _, _)| s == "message"));
        assert_eq!(records[0].1, "accepted");
        assert!(
            records[0].2.contains("delegate from boss to worker")
                && records[0].2.contains("delegated under tier low"),
            "{}",
            records[0].2
        );
        assert_eq!(records[1].1, "refused");
        assert!(records[1].2.contains("replayed"), "{}", records[1].2);
    }

    #[test]
    fn a_failing_audit_sink_refuses_the_message() {
        let mut v = verifier("worker");
        let mut sink = |_: AuditEvent| Err(Error::invalid("disk full"));
        let signed = sign(task(T0, 1), Scheme::HmacSha256);
        assert!(v.verify_audited(&signed, T0, &mut sink).is_err());
    }

    #[test]
    fn hkdf_matches_rfc5869_and_hmac_matches_rfc4231() {
        // RFC 5869 test case 1 (first 32 bytes of the OKM).
        let ikm = [0x0b; 22];
        let salt: Vec<u8> = (0x00..=0x0c).collect();
        let info: Vec<u8> = (0xf0..=0xf9).collect();
        assert_eq!(
            hex(&hkdf(&salt, &[&ikm], &[&info])),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
        );
        // RFC 4231 test cases 1 and 6 (a key longer than the block).
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn signing_bytes_separate_fields_and_schemes() {
        let m = task(T0, 1);
        assert!(m
            .signing_bytes(Scheme::Ed25519)
            .starts_with(b"\0\0\0\0\0\0\0\x0dstrata-msg-v1"));
        assert_ne!(
            m.signing_bytes(Scheme::Ed25519),
            m.signing_bytes(Scheme::HmacSha256)
        );
        // Moving a byte between adjacent fields changes the encoding.
        let mut a = m.clone();
        a.from = "bo".into();
        a.to = "ssworker".into();
        let mut b = m;
        b.from = "boss".into();
        b.to = "worker".into();
        assert_ne!(
            a.signing_bytes(Scheme::Ed25519),
            b.signing_bytes(Scheme::Ed25519)
        );
    }
}
