//! The policy layer on a live sandbox: what its supervisor applies to every exec, from
//! any client (the CLI in another shell included).
//!
//! A sandbox started under a tier had its caps admitted when it started (by the caller,
//! with the caller's approver: see `strata::Sandbox::start`); they stay fixed. Each exec is
//! then checked for what the tier says about programs ([`Tier::check_program`]): a program
//! the tier does not approve needs a grant, asked of the sandbox's approver program (the
//! supervisor cannot call back into the process that started it), else the exec is
//! refused with [`Error::Denied`]. With an audit log, every exec is recorded when it
//! starts, is refused, and ends ([`AuditEvent::Exec`]), chained with the rest of the log.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use sandbox_core::audit::{exec_command, AuditEvent, AuditLog};
use sandbox_core::{Capability, Caps, Error, Mechanism, PolicyReceipt, Receipt, Result, Tool};
use sandbox_policy::{admit_needs, Approver, Grant, GrantBook, Tier};

use crate::approver::ProgramApprover;

/// The policy a live sandbox is started with ([`crate::StartOptions::policy`]). Default:
/// none (no tier, no audit log).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LivePolicy {
    /// The tier every exec's program is checked against; its caps were checked at start.
    #[serde(default)]
    pub tier: Option<Tier>,
    /// The approver program asked about an exec beyond the tier; without one such an exec
    /// is refused.
    #[serde(default)]
    pub approver: Option<PathBuf>,
    /// The audit log (hash-chained JSON lines) every exec is recorded in.
    #[serde(default)]
    pub audit: Option<PathBuf>,
    /// What the caller's admission of the caps decided when the sandbox started (tier,
    /// elevations, grants resolved through symlinks): the sandbox's receipt states it.
    #[serde(default)]
    pub admitted: Option<PolicyReceipt>,
}

impl LivePolicy {
    /// Whether there is anything to apply.
    pub fn is_empty(&self) -> bool {
        self.tier.is_none() && self.approver.is_none() && self.audit.is_none()
    }

    /// Adds what this policy does to `receipt`: the admission's part, and a line for the
    /// tier's check of every exec and one for the audit log.
    pub fn state_in(&self, receipt: &mut Receipt) {
        if let Some(admitted) = &self.admitted {
            receipt.policy = Some(admitted.clone());
        }
        if let Some(tier) = &self.tier {
            let beyond = match &self.approver {
                Some(program) => format!("the approver program {} is asked", program.display()),
                None => "it is refused (no approver program)".into(),
            };
            receipt.enforce(
                Capability::Processes,
                Mechanism::Supervisor,
                "exec policy",
                format!(
                    "every exec's program is checked against tier {} by the supervisor; for a program beyond it {beyond}",
                    tier.name
                ),
            );
        }
        if let Some(audit) = &self.audit {
            receipt.enforce(
                Capability::Processes,
                Mechanism::Supervisor,
                "exec audit",
                format!(
                    "every exec is recorded in {} when it starts, is refused and ends (hash-chained)",
                    audit.display()
                ),
            );
        }
    }
}

/// The supervisor's side of a [`LivePolicy`].
pub(crate) struct ExecPolicy {
    sandbox: String,
    caps: Caps,
    tier: Option<Tier>,
    approver: Option<ProgramApprover>,
    audit: Option<Mutex<AuditLog>>,
    grants: Mutex<GrantBook>,
}

impl ExecPolicy {
    /// Opens the audit log (checking its chain) for sandbox `sandbox` with `caps`.
    ///
    /// # Errors
    /// The audit log cannot be opened or does not verify.
    pub(crate) fn open(policy: &LivePolicy, sandbox: &str, caps: &Caps) -> Result<ExecPolicy> {
        let audit = match &policy.audit {
            Some(path) => Some(Mutex::new(AuditLog::open(path)?)),
            None => None,
        };
        Ok(ExecPolicy {
            sandbox: sandbox.to_string(),
            caps: caps.clone(),
            tier: policy.tier.clone(),
            approver: policy.approver.as_ref().map(ProgramApprover::new),
            audit,
            grants: Mutex::new(GrantBook::default()),
        })
    }

    /// Decides whether `argv` may run: the tier's program check, grants, the approver.
    /// A refusal is recorded before it is returned. Returns the grants the exec uses.
    ///
    /// # Errors
    /// [`Error::Denied`] naming the tier and the program; the audit log failed.
    pub(crate) fn admit(&self, argv: &[String]) -> Result<Vec<Grant>> {
        let Some(tier) = &self.tier else {
            return Ok(Vec::new());
        };
        let tool = Tool::Command {
            argv: argv.to_vec(),
        };
        let needs = tier.check_program(&tool);
        let admitted = {
            let mut book = self.grants.lock().unwrap_or_else(|e| e.into_inner());
            admit_needs(
                tier,
                &tool,
                &self.caps,
                needs,
                &mut book,
                self.approver.as_ref().map(|a| a as &dyn Approver),
                now_ms(),
                &mut |event| self.record(event),
            )
        };
        match admitted {
            Ok(admission) => Ok(admission.elevations),
            Err(error) => {
                self.record(self.event(argv, None, format!("refused: {error}")))?;
                Err(error)
            }
        }
    }

    /// Records that exec `argv` started as `pid`.
    ///
    /// # Errors
    /// The audit log failed.
    pub(crate) fn started(&self, argv: &[String], pid: i32) -> Result<()> {
        self.record(self.event(argv, Some(pid), "started".into()))
    }

    /// Records that exec `argv` (`pid`) ended with `status` (`exited 0`, ...).
    pub(crate) fn ended(&self, argv: &[String], pid: i32, status: String) {
        if let Err(error) = self.record(self.event(argv, Some(pid), status)) {
            tracing::warn!(%error, "could not record an exec's end in the audit log");
        }
    }

    /// Records a step of the sandbox's life (`started`, `ended`) as a policy event of
    /// subject `live sandbox` (synced to disk before this returns).
    ///
    /// # Errors
    /// The audit log failed.
    pub(crate) fn lifecycle(&self, decision: &str, detail: String) -> Result<()> {
        if self.audit.is_none() {
            return Ok(());
        }
        self.record(AuditEvent::Policy {
            subject: "live sandbox".into(),
            decision: decision.into(),
            detail,
        })
    }

    /// Whether execs are recorded.
    pub(crate) fn audited(&self) -> bool {
        self.audit.is_some()
    }

    fn event(&self, argv: &[String], pid: Option<i32>, status: String) -> AuditEvent {
        AuditEvent::Exec {
            sandbox: self.sandbox.clone(),
            command: exec_command(argv),
            pid,
            status,
            agent: self.caps.agent.clone(),
        }
    }

    fn record(&self, event: AuditEvent) -> Result<()> {
        match &self.audit {
            Some(log) => log
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(event)
                .map(drop)
                .map_err(|e| Error::internal("write the audit log", e)),
            None => {
                sandbox_core::audit::trace(&event);
                Ok(())
            }
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
