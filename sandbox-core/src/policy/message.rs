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
use crate::audit::AuditEvent;
use crate::error::{Error, Result};

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

// ---------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------

/// An agent's secret: 32 random bytes. The Ed25519 signing key and the HMAC secret are
/// derived from it (HKDF-SHA256, distinct labels). Wiped from memory on drop; `Debug` never
/// prints it. Store it with [`AgentKey::to_base64`] or [`AgentKey::to_hex`].
#[derive(Clone)]
pub struct AgentKey([u8; 32]);

impl AgentKey {
    /// A fresh key from the OS random source.
    ///
    /// # Errors
    /// [`Error::Internal`] when the OS has no randomness to give.
    pub fn generate() -> Result<AgentKey> {
        let mut bytes = [0u8; 32];
        random(&mut bytes, "agent key")?;
        let key = AgentKey(bytes);
        bytes.zeroize();
        Ok(key)
    }

    /// The key with these bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> AgentKey {
        AgentKey(bytes)
    }

    /// The raw bytes (keep them secret).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_hex(text: &str) -> Result<AgentKey> {
        unhex("agent key", text.trim()).map(AgentKey)
    }

    /// Standard base64 with padding, 44 characters.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_base64(text: &str) -> Result<AgentKey> {
        unbase64("agent key", text.trim()).map(AgentKey)
    }

    /// The Ed25519 public key others verify this agent's signatures with.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.signing_key().verifying_key())
    }

    fn signing_key(&self) -> SigningKey {
        let mut seed = hkdf(DOMAIN.as_bytes(), &[&self.0], &[b"ed25519-seed"]);
        let key = SigningKey::from_bytes(&seed);
        seed.zeroize();
        key
    }

    fn hmac_secret(&self) -> [u8; 32] {
        hkdf(DOMAIN.as_bytes(), &[&self.0], &[b"hmac-secret"])
    }
}

impl Drop for AgentKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentKey(<secret>)")
    }
}

/// An agent's Ed25519 public key. Only valid curve points that are not of small order are
/// accepted. Serialized as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// The key with these bytes (the compressed Edwards point).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when they are not a point, or a weak (small-order) one.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey> {
        let key = VerifyingKey::from_bytes(bytes)
            .map_err(|_| Error::invalid("public key: not an Ed25519 point"))?;
        if key.is_weak() {
            return Err(Error::invalid("public key: a weak (small-order) point"));
        }
        Ok(PublicKey(key))
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(self.0.as_bytes())
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input or an invalid key.
    pub fn from_hex(text: &str) -> Result<PublicKey> {
        PublicKey::from_bytes(&unhex("public key", text.trim())?)
    }

    /// Standard base64 with padding.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0.as_bytes())
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input or an invalid key.
    pub fn from_base64(text: &str) -> Result<PublicKey> {
        PublicKey::from_bytes(&unbase64("public key", text.trim())?)
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PublicKey::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// The HMAC-SHA256 key two agents share. Wiped from memory on drop; `Debug` never prints it.
#[derive(Clone)]
pub struct PairKey([u8; 32]);

impl PairKey {
    /// The pair key of agents `a` and `b` derived from their secrets: HKDF-SHA256 with salt
    /// [`DOMAIN`], input the two agents' HMAC secrets and info `hmac-pair` and both names,
    /// the pair ordered by name, so `derive(a, ka, b, kb) == derive(b, kb, a, ka)`.
    pub fn derive(a: &str, a_key: &AgentKey, b: &str, b_key: &AgentKey) -> PairKey {
        let ((lo, lo_key), (hi, hi_key)) = if a <= b {
            ((a, a_key), (b, b_key))
        } else {
            ((b, b_key), (a, a_key))
        };
        let mut lo_secret = lo_key.hmac_secret();
        let mut hi_secret = hi_key.hmac_secret();
        let mut info = b"hmac-pair".to_vec();
        put(&mut info, lo.as_bytes());
        put(&mut info, hi.as_bytes());
        let key = hkdf(DOMAIN.as_bytes(), &[&lo_secret, &hi_secret], &[&info]);
        lo_secret.zeroize();
        hi_secret.zeroize();
        PairKey(key)
    }

    /// The key with these bytes (a key agreed on elsewhere).
    pub fn from_bytes(bytes: [u8; 32]) -> PairKey {
        PairKey(bytes)
    }

    /// The raw bytes (keep them secret).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses 64 hex characters (either case).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_hex(text: &str) -> Result<PairKey> {
        unhex("pair key", text.trim()).map(PairKey)
    }

    /// Standard base64 with padding, 44 characters.
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }

    /// Parses standard base64 of 32 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for other input; the message does not repeat the input.
    pub fn from_base64(text: &str) -> Result<PairKey> {
        unbase64("pair key", text.trim()).map(PairKey)
    }
}

impl Drop for PairKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey(<secret>)")
    }
}

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

// ---------------------------------------------------------------------------------------
// The directory
// ---------------------------------------------------------------------------------------

/// One agent in a [`Directory`]: its name, tier, keys and whom it may message.
#[derive(Clone, Debug)]
pub struct Agent {
    name: String,
    tier: String,
    rank: u8,
    key: Option<AgentKey>,
    public: Option<PublicKey>,
    may_message: Option<BTreeSet<String>>,
}

impl Agent {
    /// An agent under `tier` (its name and rank), without keys, allowed to message any
    /// known agent.
    pub fn new(name: impl Into<String>, tier: &Tier) -> Agent {
        Agent::ranked(name, tier.name.clone(), tier.rank)
    }

    /// An agent under the tier named `tier` with rank `rank`.
    pub fn ranked(name: impl Into<String>, tier: impl Into<String>, rank: u8) -> Agent {
        Agent {
            name: name.into(),
            tier: tier.into(),
            rank,
            key: None,
            public: None,
            may_message: None,
        }
    }

    /// With its secret: lets the directory sign for it (both schemes), derive its HMAC pair
    /// keys, and verify its Ed25519 signatures (the public key is derived).
    pub fn with_key(mut self, key: AgentKey) -> Agent {
        self.public = Some(key.public_key());
        self.key = Some(key);
        self
    }

    /// With its Ed25519 public key only: enough to verify its `ed25519` messages.
    pub fn with_public_key(mut self, public: PublicKey) -> Agent {
        self.public = Some(public);
        self
    }

    /// Restricts whom it may message to these agents (default: any known agent).
    pub fn may_message_only<I, S>(mut self, names: I) -> Agent
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.may_message = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its tier's name.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// Its tier's rank (higher is more trusted).
    pub fn rank(&self) -> u8 {
        self.rank
    }

    /// Its Ed25519 public key, if known.
    pub fn public_key(&self) -> Option<PublicKey> {
        self.public
    }

    /// Whether the directory holds its secret.
    pub fn has_secret(&self) -> bool {
        self.key.is_some()
    }

    /// Whether its entry lets it message `to` (`to` must still be a known agent).
    pub fn may_message(&self, to: &str) -> bool {
        self.may_message
            .as_ref()
            .is_none_or(|allowed| allowed.contains(to))
    }
}

/// The agents one party knows: names, tiers, keys. Tier names map to one rank each; the
/// presets `low` (0), `medium` (1) and `high` (2) are known from the start.
#[derive(Clone, Debug)]
pub struct Directory {
    agents: BTreeMap<String, Agent>,
    tiers: BTreeMap<String, u8>,
    pairs: BTreeMap<(String, String), PairKey>,
}

impl Default for Directory {
    fn default() -> Directory {
        Directory::new()
    }
}

impl Directory {
    /// A directory with no agents that knows the preset tiers.
    pub fn new() -> Directory {
        let tiers = [Tier::low(), Tier::medium("/"), Tier::high()]
            .into_iter()
            .map(|t| (t.name, t.rank))
            .collect();
        Directory {
            agents: BTreeMap::new(),
            tiers,
            pairs: BTreeMap::new(),
        }
    }

    /// Makes a tier known (for delegations to name it). Defining a known tier again with
    /// the same rank does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad name or a known tier with another rank.
    pub fn define_tier(&mut self, name: impl Into<String>, rank: u8) -> Result<()> {
        let name = name.into();
        check_name("tier", &name).map_err(Error::invalid)?;
        match self.tiers.get(&name) {
            Some(&known) if known != rank => Err(Error::invalid(format!(
                "tier {name} has rank {known}, not {rank}"
            ))),
            Some(_) => Ok(()),
            None => {
                self.tiers.insert(name, rank);
                Ok(())
            }
        }
    }

    /// Adds an agent (and defines its tier).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a bad or duplicate name, a tier rank that contradicts
    /// a known one, or a public key that does not match the agent's secret.
    pub fn add(&mut self, agent: Agent) -> Result<()> {
        check_name("agent", &agent.name).map_err(Error::invalid)?;
        if self.agents.contains_key(&agent.name) {
            return Err(Error::invalid(format!(
                "agent {} is already in the directory",
                agent.name
            )));
        }
        if let (Some(key), Some(public)) = (&agent.key, &agent.public) {
            if key.public_key() != *public {
                return Err(Error::invalid(format!(
                    "agent {}: the public key does not match its secret",
                    agent.name
                )));
            }
        }
        self.define_tier(agent.tier.clone(), agent.rank)?;
        self.agents.insert(agent.name.clone(), agent);
        Ok(())
    }

    /// The agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name)
    }

    /// All agents, by name.
    pub fn agents(&self) -> impl Iterator<Item = &Agent> {
        self.agents.values()
    }

    /// The rank of the tier named `name`, if known.
    pub fn tier_rank(&self, name: &str) -> Option<u8> {
        self.tiers.get(name).copied()
    }

    /// Sets the HMAC key of agents `a` and `b` (either order); it takes precedence over one
    /// derived from their secrets.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when either agent is unknown.
    pub fn set_pair_key(&mut self, a: &str, b: &str, key: PairKey) -> Result<()> {
        for name in [a, b] {
            if !self.agents.contains_key(name) {
                return Err(Error::invalid(format!("unknown agent {:?}", clip(name))));
            }
        }
        self.pairs.insert(pair(a, b), key);
        Ok(())
    }

    /// The HMAC key of `a` and `b`: the one set for the pair, else one derived from both
    /// secrets; `None` when neither is available.
    pub fn pair_key(&self, a: &str, b: &str) -> Option<PairKey> {
        if let Some(key) = self.pairs.get(&pair(a, b)) {
            return Some(key.clone());
        }
        let a_key = self.agents.get(a)?.key.as_ref()?;
        let b_key = self.agents.get(b)?.key.as_ref()?;
        Some(PairKey::derive(a, a_key, b, b_key))
    }

    /// Whether `from` may message `to`: both known and `from`'s entry allows it.
    pub fn may_message(&self, from: &str, to: &str) -> bool {
        self.agents.contains_key(to) && self.agents.get(from).is_some_and(|a| a.may_message(to))
    }

    /// Whether `delegator` may delegate to `delegate` under `tier` (the rules are in the
    /// module docs); senders can ask before sending.
    ///
    /// # Errors
    /// [`Error::Denied`] naming the rule broken.
    pub fn check_delegation(
        &self,
        delegator: &str,
        delegate: &str,
        tier: &str,
    ) -> Result<Delegation> {
        self.delegation(delegator, delegate, tier)
            .map_err(Error::from)
    }

    fn delegation(
        &self,
        delegator: &str,
        delegate: &str,
        tier: &str,
    ) -> std::result::Result<Delegation, MessageRefusal> {
        let unknown = |name: &str| MessageRefusal::UnknownAgent { name: clip(name) };
        let from = self
            .agents
            .get(delegator)
            .ok_or_else(|| unknown(delegator))?;
        let to = self.agents.get(delegate).ok_or_else(|| unknown(delegate))?;
        let not_permitted = |why: String| MessageRefusal::NotPermitted { why };
        if to.rank > from.rank {
            return Err(not_permitted(format!(
                "delegation to a higher tier: {} (tier {}, rank {}) may not delegate to {} \
                 (tier {}, rank {})",
                from.name, from.tier, from.rank, to.name, to.tier, to.rank
            )));
        }
        let rank = self.tiers.get(tier).copied().ok_or_else(|| {
            not_permitted(format!("delegation under unknown tier {:?}", clip(tier)))
        })?;
        for (whose, agent) in [("delegate", to), ("delegator", from)] {
            let at_most = tier == agent.tier || rank < agent.rank;
            if !at_most {
                return Err(not_permitted(format!(
                    "tier {tier} (rank {rank}) is not at most the {whose} {}'s own tier {} \
                     (rank {})",
                    agent.name, agent.tier, agent.rank
                )));
            }
        }
        Ok(Delegation {
            delegator: from.name.clone(),
            delegate: to.name.clone(),
            tier: tier.to_string(),
            rank,
        })
    }

    /// Validates `message` and signs it as its sender under `scheme`: `ed25519` needs the
    /// sender's secret, `hmac-sha256` the pair's key (set, or derived from both secrets).
    /// Signing checks no trust rules; the recipient's verifier does.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a malformed message, an unknown sender or missing keys.
    pub fn sign(&self, message: Message, scheme: Scheme) -> Result<SignedMessage> {
        message.validate()?;
        let from = &message.from;
        let sender = self
            .agents
            .get(from)
            .ok_or_else(|| Error::invalid(format!("unknown sender {from}")))?;
        match scheme {
            Scheme::Ed25519 => {
                let key = sender.key.as_ref().ok_or_else(|| {
                    Error::invalid(format!("no secret key for {from} to sign with"))
                })?;
                Ok(message.sign_ed25519(key))
            }
            Scheme::HmacSha256 => {
                let key = self.pair_key(from, &message.to).ok_or_else(|| {
                    Error::invalid(format!("no hmac-sha256 key for {from} and {}", message.to))
                })?;
                Ok(message.sign_hmac(&key))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Verification
// ---------------------------------------------------------------------------------------

/// Why a message was refused. Names are repeated clipped to 128 characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageRefusal {
    /// The sender or the recipient is not in the directory.
    UnknownAgent {
        /// The unknown name.
        name: String,
    },
    /// The message is for another agent than the verifier's.
    WrongRecipient {
        /// Whom it is addressed to.
        to: String,
        /// The verifier's own agent.
        verifier: String,
    },
    /// The signature does not verify, is malformed, or no key can check it.
    BadSignature {
        /// The claimed scheme.
        scheme: Scheme,
        /// Which of those.
        why: String,
    },
    /// The message is authentic but malformed (bad names or kind, a tier where none
    /// belongs). Becomes [`Error::InvalidRequest`].
    Malformed {
        /// What is wrong.
        why: String,
    },
    /// The timestamp is older than the window.
    Stale {
        /// How old it is, in milliseconds.
        age_ms: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// The timestamp is further ahead than the window.
    Future {
        /// How far ahead it is, in milliseconds.
        ahead_ms: u64,
        /// The window, in milliseconds.
        window_ms: u64,
    },
    /// The sender's nonce was already accepted: a replay.
    Replayed {
        /// The nonce, hex.
        nonce: String,
    },
    /// Trust rules do not allow it (messaging restrictions, delegation rules).
    NotPermitted {
        /// The rule broken.
        why: String,
    },
    /// The replay cache holds its maximum of unexpired nonces; the message is refused
    /// rather than a nonce forgotten early. Retry later.
    CacheFull {
        /// The cache's bound.
        capacity: usize,
    },
}

impl MessageRefusal {
    /// A stable snake_case code: `unknown_agent`, `wrong_recipient`, `bad_signature`,
    /// `malformed`, `stale`, `future`, `replayed`, `not_permitted`, `cache_full`.
    pub fn code(&self) -> &'static str {
        match self {
            MessageRefusal::UnknownAgent { .. } => "unknown_agent",
            MessageRefusal::WrongRecipient { .. } => "wrong_recipient",
            MessageRefusal::BadSignature { .. } => "bad_signature",
            MessageRefusal::Malformed { .. } => "malformed",
            MessageRefusal::Stale { .. } => "stale",
            MessageRefusal::Future { .. } => "future",
            MessageRefusal::Replayed { .. } => "replayed",
            MessageRefusal::NotPermitted { .. } => "not_permitted",
            MessageRefusal::CacheFull { .. } => "cache_full",
        }
    }
}

impl fmt::Display for MessageRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageRefusal::UnknownAgent { name } => write!(f, "unknown agent {name:?}"),
            MessageRefusal::WrongRecipient { to, verifier } => {
                write!(f, "addressed to {to:?}, not to this agent ({verifier:?})")
            }
            MessageRefusal::BadSignature { scheme, why } => {
                write!(f, "bad {scheme} signature: {why}")
            }
            MessageRefusal::Malformed { why } => write!(f, "malformed: {why}"),
            MessageRefusal::Stale { age_ms, window_ms } => write!(
                f,
                "stale: sent {age_ms} ms ago, beyond the {window_ms} ms window"
            ),
            MessageRefusal::Future {
                ahead_ms,
                window_ms,
            } => write!(
                f,
                "from the future: {ahead_ms} ms ahead, beyond the {window_ms} ms window"
            ),
            MessageRefusal::Replayed { nonce } => {
                write!(f, "replayed: nonce {nonce} was already accepted")
            }
            MessageRefusal::NotPermitted { why } => write!(f, "not permitted: {why}"),
            MessageRefusal::CacheFull { capacity } => write!(
                f,
                "replay cache full ({capacity} unexpired nonces); retry later"
            ),
        }
    }
}

impl std::error::Error for MessageRefusal {}

impl From<MessageRefusal> for Error {
    /// [`MessageRefusal::Malformed`] becomes [`Error::InvalidRequest`], every other refusal
    /// [`Error::Denied`] with the reason `message refused: <refusal>`.
    fn from(refusal: MessageRefusal) -> Error {
        match refusal {
            MessageRefusal::Malformed { why } => Error::invalid(format!("message: {why}")),
            other => Error::Denied {
                reason: format!("message refused: {other}"),
            },
        }
    }
}

/// A permitted delegation: the delegate runs the task under `tier`, never above its own tier
/// nor the delegator's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// Who delegates.
    pub delegator: String,
    /// Who runs the task.
    pub delegate: String,
    /// The tier to run it under (the effective tier).
    pub tier: String,
    /// That tier's rank.
    pub rank: u8,
}

/// A message that passed every check. Only a [`Verifier`] makes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedMessage {
    message: Message,
    scheme: Scheme,
    sender_tier: String,
    sender_rank: u8,
    delegation: Option<Delegation>,
}

impl VerifiedMessage {
    /// The message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The message, owned.
    pub fn into_message(self) -> Message {
        self.message
    }

    /// The scheme it was signed with.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The sender's tier: the most work this message asks for should run under.
    pub fn sender_tier(&self) -> &str {
        &self.sender_tier
    }

    /// The rank of the sender's tier.
    pub fn sender_rank(&self) -> u8 {
        self.sender_rank
    }

    /// For a `delegate` message: the permitted delegation and its effective tier.
    pub fn delegation(&self) -> Option<&Delegation> {
        self.delegation.as_ref()
    }
}

/// Checks the messages addressed to one agent: signatures against its [`Directory`],
/// timestamps against a window (default [`DEFAULT_WINDOW`], ±30 s), nonces against a replay
/// cache (default bound [`DEFAULT_NONCE_CAPACITY`]), and the trust rules.
///
/// Nonces are remembered until their message's timestamp leaves the window (after that the
/// message is refused as stale anyway); expired ones are forgotten before a new one is
/// counted against the bound, and a cache full of unexpired nonces refuses new messages
/// rather than forget one. The verifier's clock never runs backwards: a `now_ms` below the
/// latest one seen counts as the latest, so stepping the clock back cannot revive a
/// forgotten nonce.
#[derive(Debug)]
pub struct Verifier {
    directory: Directory,
    me: String,
    window_ms: u64,
    capacity: usize,
    latest_ms: u64,
    seen: HashSet<[u8; 32]>,
    by_time: BTreeSet<(u64, [u8; 32])>,
}

impl Verifier {
    /// A verifier for the agent `me` (which must be in `directory`), with the default window
    /// and cache bound.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when `me` is not in the directory.
    pub fn new(directory: Directory, me: impl Into<String>) -> Result<Verifier> {
        let me = me.into();
        if directory.agent(&me).is_none() {
            return Err(Error::invalid(format!(
                "verifier for {:?}: not in the directory",
                clip(&me)
            )));
        }
        Ok(Verifier {
            directory,
            me,
            window_ms: millis(DEFAULT_WINDOW),
            capacity: DEFAULT_NONCE_CAPACITY,
            latest_ms: 0,
            seen: HashSet::new(),
            by_time: BTreeSet::new(),
        })
    }

    /// With a timestamp window of ±`window` (millisecond precision; default 30 s).
    pub fn with_window(mut self, window: Duration) -> Verifier {
        self.window_ms = millis(window);
        self
    }

    /// With a replay cache of at most `capacity` nonces (at least 1; default 100 000).
    pub fn with_capacity(mut self, capacity: usize) -> Verifier {
        self.capacity = capacity.max(1);
        self
    }

    /// The agent this verifier accepts messages for.
    pub fn identity(&self) -> &str {
        &self.me
    }

    /// The directory.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// The directory, to add agents or keys.
    pub fn directory_mut(&mut self) -> &mut Directory {
        &mut self.directory
    }

    /// The timestamp window, in milliseconds either side of now.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// How many nonces the replay cache holds (some may have expired since the last check).
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }

    /// Checks `signed` at `now_ms` (see the module docs for the order of the checks). The
    /// nonce of an authentic, fresh message is remembered once it passes the replay check,
    /// even if the trust rules then refuse the message.
    ///
    /// # Errors
    /// The first [`MessageRefusal`] that applies.
    pub fn check(
        &mut self,
        signed: &SignedMessage,
        now_ms: u64,
    ) -> std::result::Result<VerifiedMessage, MessageRefusal> {
        let message = &signed.message;
        let unknown = |name: &str| MessageRefusal::UnknownAgent { name: clip(name) };
        let sender = self
            .directory
            .agents
            .get(&message.from)
            .ok_or_else(|| unknown(&message.from))?;
        let may_message = sender.may_message(&message.to);
        let sender_tier = sender.tier.clone();
        let sender_rank = sender.rank;
        if !self.directory.agents.contains_key(&message.to) {
            return Err(unknown(&message.to));
        }
        if message.to != self.me {
            return Err(MessageRefusal::WrongRecipient {
                to: clip(&message.to),
                verifier: clip(&self.me),
            });
        }
        self.check_signature(signed)?;
        if let Some(why) = message.problem() {
            return Err(MessageRefusal::Malformed { why });
        }

        let now = now_ms.max(self.latest_ms);
        self.latest_ms = now;
        let ts = message.timestamp_ms;
        if ts.saturating_add(self.window_ms) < now {
            return Err(MessageRefusal::Stale {
                age_ms: now - ts,
                window_ms: self.window_ms,
            });
        }
        if ts > now.saturating_add(self.window_ms) {
            return Err(MessageRefusal::Future {
                ahead_ms: ts - now,
                window_ms: self.window_ms,
            });
        }

        let id = nonce_id(&message.from, &message.nonce);
        self.forget_expired(now);
        if self.seen.contains(&id) {
            return Err(MessageRefusal::Replayed {
                nonce: message.nonce.to_hex(),
            });
        }
        if self.seen.len() >= self.capacity {
            return Err(MessageRefusal::CacheFull {
                capacity: self.capacity,
            });
        }
        self.seen.insert(id);
        self.by_time.insert((ts, id));

        if !may_message {
            return Err(MessageRefusal::NotPermitted {
                why: format!("{} may not message {}", message.from, message.to),
            });
        }
        let delegation = match &message.delegated_tier {
            Some(tier) if message.kind.is_delegate() => Some(self.directory.delegation(
                &message.from,
                &message.to,
                tier,
            )?),
            _ => None,
        };
        Ok(VerifiedMessage {
            message: message.clone(),
            scheme: signed.scheme,
            sender_tier,
            sender_rank,
            delegation,
        })
    }

    /// [`Verifier::check`], with refusals as [`Error::Denied`] (malformed messages as
    /// [`Error::InvalidRequest`]).
    ///
    /// # Errors
    /// As above.
    pub fn verify(&mut self, signed: &SignedMessage, now_ms: u64) -> Result<VerifiedMessage> {
        self.check(signed, now_ms).map_err(Error::from)
    }

    /// [`Verifier::verify`], handing the outcome to `audit` (see [`audit_event`]) before
    /// returning it. A failing sink refuses the message (its nonce stays used).
    ///
    /// # Errors
    /// The refusal, or the sink's error.
    pub fn verify_audited(
        &mut self,
        signed: &SignedMessage,
        now_ms: u64,
        audit: &mut dyn FnMut(AuditEvent) -> Result<()>,
    ) -> Result<VerifiedMessage> {
        let outcome = self.verify(signed, now_ms);
        audit(audit_event(signed, &outcome))?;
        outcome
    }

    fn check_signature(&self, signed: &SignedMessage) -> std::result::Result<(), MessageRefusal> {
        let message = &signed.message;
        let bad = |why: String| MessageRefusal::BadSignature {
            scheme: signed.scheme,
            why,
        };
        let bytes = message.signing_bytes(signed.scheme);
        match signed.scheme {
            Scheme::HmacSha256 => {
                let key = self
                    .directory
                    .pair_key(&message.from, &message.to)
                    .ok_or_else(|| {
                        bad(format!(
                            "no key for the pair {} and {}",
                            message.from, message.to
                        ))
                    })?;
                let tag: [u8; 32] = unhex("signature", &signed.signature)
                    .map_err(|_| bad("not 64 hex characters".into()))?;
                keyed(&key.0)
                    .chain_update(&bytes)
                    .verify_slice(&tag)
                    .map_err(|_| bad("does not verify".into()))
            }
            Scheme::Ed25519 => {
                let public = self
                    .directory
                    .agents
                    .get(&message.from)
                    .and_then(|a| a.public)
                    .ok_or_else(|| bad(format!("no public key for {}", message.from)))?;
                let raw: [u8; 64] = unhex("signature", &signed.signature)
                    .map_err(|_| bad("not 128 hex characters".into()))?;
                public
                    .0
                    .verify_strict(&bytes, &Signature::from_bytes(&raw))
                    .map_err(|_| bad("does not verify".into()))
            }
        }
    }

    fn forget_expired(&mut self, now: u64) {
        while let Some(&(ts, id)) = self.by_time.first() {
            if ts.saturating_add(self.window_ms) >= now {
                break;
            }
            self.by_time.pop_first();
            self.seen.remove(&id);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Audit
// ---------------------------------------------------------------------------------------

/// The audit record of one verification: [`AuditEvent::Policy`] with subject `message`,
/// decision `accepted` or `refused`, and a detail naming kind, sender, recipient, nonce and
/// scheme, then the delegated tier or the reason. For refused messages these are what the
/// message *claims*, clipped to 128 characters.
pub fn audit_event(signed: &SignedMessage, outcome: &Result<VerifiedMessage>) -> AuditEvent {
    match outcome {
        Ok(verified) => accepted_event(verified),
        Err(err) => refused_event(signed, err),
    }
}

/// The `accepted` record of a verified message (see [`audit_event`]).
pub fn accepted_event(verified: &VerifiedMessage) -> AuditEvent {
    let mut detail = describe(&verified.message, verified.scheme);
    if let Some(d) = &verified.delegation {
        detail.push_str(&format!("; delegated under tier {}", d.tier));
    }
    message_event("accepted", detail)
}

/// The `refused` record of a message and why (see [`audit_event`]).
pub fn refused_event(signed: &SignedMessage, reason: &dyn fmt::Display) -> AuditEvent {
    let detail = format!("{}: {reason}", describe(&signed.message, signed.scheme));
    message_event("refused", detail)
}

fn describe(message: &Message, scheme: Scheme) -> String {
    let mut text = format!(
        "{} from {} to {} (nonce {}, {scheme})",
        clip(message.kind.as_str()),
        clip(&message.from),
        clip(&message.to),
        message.nonce
    );
    if let Some(tier) = &message.delegated_tier {
        text.push_str(&format!(", asking for tier {}", clip(tier)));
    }
    text
}

fn message_event(decision: &str, detail: String) -> AuditEvent {
    AuditEvent::Policy {
        subject: "message".into(),
        decision: decision.into(),
        detail,
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn random(buf: &mut [u8], what: &str) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::Internal {
        message: format!("no OS randomness for a {what}: {e}"),
        source: None,
    })
}

/// HMAC-SHA256 keyed with `key` of any length, without the fallible constructor: HMAC pads
/// a key up to the block (64 bytes) with zeros and hashes a longer one first (RFC 2104), so
/// doing that here gives the same MAC.
fn keyed(key: &[u8]) -> HmacSha256 {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mac = <HmacSha256 as KeyInit>::new(&block.into());
    block.zeroize();
    mac
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = keyed(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// HKDF-SHA256 (RFC 5869) with 32 bytes of output (one expand block); `ikm` and `info` are
/// the concatenation of their parts.
fn hkdf(salt: &[u8], ikm: &[&[u8]], info: &[&[u8]]) -> [u8; 32] {
    let mut prk = hmac_sha256(salt, ikm);
    let mut parts: Vec<&[u8]> = info.to_vec();
    parts.push(&[1]);
    let okm = hmac_sha256(&prk, &parts);
    prk.zeroize();
    okm
}

/// Appends `bytes` with its length as a big-endian `u64`.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// A fixed-size replay-cache key for (sender, nonce).
fn nonce_id(from: &str, nonce: &Nonce) -> [u8; 32] {
    let mut bytes = Vec::with_capacity(24 + from.len());
    put(&mut bytes, from.as_bytes());
    bytes.extend_from_slice(&nonce.0);
    Sha256::digest(&bytes).into()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn check_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} name {:?} is longer than {MAX_NAME_LEN} bytes",
            clip(name)
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "{what} name {:?} contains control characters",
            clip(name)
        ));
    }
    Ok(())
}

fn clip(text: &str) -> String {
    match text.char_indices().nth(CLIP) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

fn unhex<const N: usize>(what: &str, text: &str) -> Result<[u8; N]> {
    let wrong = || Error::invalid(format!("{what}: expected {} hex characters", N * 2));
    let digits = text.as_bytes();
    if digits.len() != N * 2 {
        return Err(wrong());
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let hi = hex_digit(pair[0]).ok_or_else(wrong)?;
        let lo = hex_digit(pair[1]).ok_or_else(wrong)?;
        *byte = (hi << 4) | lo;
    }
    Ok(out)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn unbase64<const N: usize>(what: &str, text: &str) -> Result<[u8; N]> {
    let wrong = || Error::invalid(format!("{what}: expected base64 of {N} bytes"));
    let mut bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| wrong())?;
    let out = <[u8; N]>::try_from(bytes.as_slice()).map_err(|_| wrong());
    bytes.zeroize();
    out
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
