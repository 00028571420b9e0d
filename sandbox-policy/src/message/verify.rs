//! Verification: a [`Verifier`] checks signatures, timestamps, nonces and the trust rules;
//! what it accepts is a [`VerifiedMessage`], what it refuses a [`MessageRefusal`]; and
//! the audit events of both.

use super::*;

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
    pub(super) message: Message,
    pub(super) scheme: Scheme,
    pub(super) sender_tier: String,
    pub(super) sender_rank: u8,
    pub(super) delegation: Option<Delegation>,
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

    /// The message's fields with `scheme`, `sender_tier` and `delegation` (`null` unless a
    /// permitted delegation) added: what the Python and Node bindings return.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(&self.message).unwrap_or(serde_json::Value::Null);
        if let serde_json::Value::Object(object) = &mut value {
            object.insert("scheme".into(), self.scheme.as_str().into());
            object.insert("sender_tier".into(), self.sender_tier.clone().into());
            object.insert(
                "delegation".into(),
                serde_json::to_value(&self.delegation).unwrap_or(serde_json::Value::Null),
            );
        }
        value
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
    pub(super) directory: Directory,
    pub(super) me: String,
    pub(super) window_ms: u64,
    pub(super) capacity: usize,
    pub(super) latest_ms: u64,
    pub(super) seen: HashSet<[u8; 32]>,
    pub(super) by_time: BTreeSet<(u64, [u8; 32])>,
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

    pub(super) fn check_signature(
        &self,
        signed: &SignedMessage,
    ) -> std::result::Result<(), MessageRefusal> {
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

    pub(super) fn forget_expired(&mut self, now: u64) {
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

pub(super) fn describe(message: &Message, scheme: Scheme) -> String {
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

pub(super) fn message_event(decision: &str, detail: String) -> AuditEvent {
    AuditEvent::Policy {
        subject: "message".into(),
        decision: decision.into(),
        detail,
    }
}
