//! The proxy's log in the receipt's vocabulary ([`sandbox_core::NetworkReceipt`]).

use sandbox_core::receipt::{Capability, Denial, EgressDecision, EgressRefusal, NetworkReceipt};
use sandbox_core::LimitKind;

use crate::{BudgetLimit, EgressEvent, Outcome, Refusal, RunGrant};

impl EgressEvent {
    /// This decision as a receipt entry.
    pub fn to_decision(&self) -> EgressDecision {
        let mut secrets = Vec::new();
        let (allowed, rule, refusal, limit, reason) = match &self.outcome {
            Outcome::Allowed { rule } => (true, Some(rule.clone()), None, None, None),
            Outcome::SecretsSent { env } => {
                secrets.clone_from(env);
                (true, None, None, None, None)
            }
            Outcome::Refused(why) => {
                let (family, limit) = match why {
                    Refusal::Policy(_) => (EgressRefusal::Policy, None),
                    Refusal::BadRequest(_) => (EgressRefusal::BadRequest, None),
                    Refusal::Unresolvable(_) => (EgressRefusal::Unresolvable, None),
                    Refusal::ConnectFailed(_) => (EgressRefusal::ConnectFailed, None),
                    Refusal::Budget(BudgetLimit::Bytes { .. }) => {
                        (EgressRefusal::Budget, Some(LimitKind::EgressBytes))
                    }
                    // The concurrent quota is the proxy's, not a caps limit; the closest
                    // receipt limit is still the connections one (the reason says which).
                    Refusal::Budget(
                        BudgetLimit::Connections { .. } | BudgetLimit::Concurrent { .. },
                    ) => (EgressRefusal::Budget, Some(LimitKind::EgressConnections)),
                };
                (false, None, Some(family), limit, Some(why.to_string()))
            }
        };
        EgressDecision {
            host: self.host.clone(),
            port: self.port,
            addr: self.addr,
            allowed,
            rule,
            refusal,
            limit,
            reason,
            secrets,
        }
    }
}

impl RunGrant {
    /// Drains the run's log into a receipt section. `enforcer` says where the tool reached
    /// the proxy (never the credential); `rules` is the allowlist as written.
    pub fn receipt(&self, enforcer: impl Into<String>, rules: Vec<String>) -> NetworkReceipt {
        let (events, dropped) = self.drain_log();
        NetworkReceipt {
            enforcer: enforcer.into(),
            rules,
            connections: self.connections(),
            bytes: self.bytes(),
            decisions: events.iter().map(EgressEvent::to_decision).collect(),
            dropped,
        }
    }
}

/// A [`Denial`] (capability `net`) for each refused decision of `receipt`, for the
/// receipt's `denials`. Port 0 (no port known: a name lookup, or a request without a valid
/// port) is left out of the text, and so is an empty host (a connection refused at accept,
/// before it asked for anything).
pub fn denials(receipt: &NetworkReceipt) -> Vec<Denial> {
    receipt
        .decisions
        .iter()
        .filter(|d| !d.allowed)
        .map(|d| {
            let target = match (d.host.as_str(), d.port) {
                ("", _) => "a connection".to_string(),
                (host, 0) => format!("egress to {host}"),
                (host, port) => format!("egress to {host}:{port}"),
            };
            Denial {
                capability: Capability::Net,
                detail: format!(
                    "{target} refused: {}",
                    d.reason.as_deref().unwrap_or("refused")
                ),
            }
        })
        .collect()
}
