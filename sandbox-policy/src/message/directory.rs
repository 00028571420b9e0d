//! The agents one party knows ([`Directory`]): names, tiers, keys, and who may message
//! and delegate to whom.

use super::*;

// ---------------------------------------------------------------------------------------
// The directory
// ---------------------------------------------------------------------------------------

/// One agent in a [`Directory`]: its name, tier, keys and whom it may message.
#[derive(Clone, Debug)]
pub struct Agent {
    pub(super) name: String,
    pub(super) tier: String,
    pub(super) rank: u8,
    pub(super) key: Option<AgentKey>,
    pub(super) public: Option<PublicKey>,
    pub(super) may_message: Option<BTreeSet<String>>,
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
    pub(super) agents: BTreeMap<String, Agent>,
    pub(super) tiers: BTreeMap<String, u8>,
    pub(super) pairs: BTreeMap<(String, String), PairKey>,
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

    pub(super) fn delegation(
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
