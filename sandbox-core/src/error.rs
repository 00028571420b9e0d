//! The error tree. Callers branch on [`Error::kind`]; messages name the problem.

use std::io;

use crate::backend::BackendKind;
use crate::output::LimitKind;
use crate::report::SetupStage;

/// Result alias used across Strata.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a run was refused or failed. A run that *happened* (even one that exited non-zero or
/// hit a limit) is a [`crate::RunOutput`], not an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request is malformed (bad caps, empty argv, missing mount source). Nothing ran.
    #[error("invalid request: {reason}")]
    InvalidRequest {
        /// What is wrong, naming the offending field or value.
        reason: String,
    },
    /// A policy (tier, approval) refused the request. Nothing ran.
    #[error("denied by policy: {reason}")]
    Denied {
        /// Which policy refused and why.
        reason: String,
    },
    /// The backend cannot run on this host or is not built in. Nothing ran.
    #[error("backend {backend} unavailable: {reason}")]
    BackendUnavailable {
        /// The backend asked for.
        backend: BackendKind,
        /// What is missing.
        reason: String,
    },
    /// A guarantee the caps need cannot be enforced here. Nothing ran. The message says
    /// that best-effort strictness would run without it only when that is so
    /// (`best_effort_runs`): some guarantees (the process backend's namespaces, seccomp) have
    /// no weaker form, and refuse under either strictness.
    #[error(
        "cannot enforce {guarantee}: {reason}; refusing to run{}",
        if *.best_effort_runs { " (best-effort strictness would run without it)" } else { "" }
    )]
    Unenforceable {
        /// The guarantee, e.g. `"fs: landlock"`.
        guarantee: String,
        /// Why it is unavailable.
        reason: String,
        /// Whether a best-effort run would go ahead without it (and list the gap in its
        /// receipt); `false` when it is refused whatever the strictness.
        best_effort_runs: bool,
    },
    /// The sandbox was built but the program could not be started in it (not found, not
    /// executable). Nothing of the tool ran.
    #[error("cannot execute {program:?} in the sandbox: {source}")]
    Exec {
        /// The program as given.
        program: String,
        /// The OS error from `execve`.
        #[source]
        source: io::Error,
    },
    /// Building the sandbox failed at `stage`. Nothing of the tool ran.
    #[error("sandbox setup failed at {stage}: {source}")]
    Setup {
        /// Which part of building the sandbox failed, typed for callers that branch on it.
        at: SetupStage,
        /// The step that failed, in words (e.g. `"mount /data"`, `"seccomp"`).
        stage: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A limit ended the run; produced by [`crate::RunOutput::check`], never by `run`.
    #[error("run ended by the {limit} limit")]
    LimitExceeded {
        /// Which limit.
        limit: LimitKind,
    },
    /// The run exited unsuccessfully; produced by [`crate::RunOutput::check`], never by `run`.
    #[error("tool failed: {status}")]
    ToolFailed {
        /// Exit code or signal, as text.
        status: String,
    },
    /// The caller cancelled the run; everything it started was killed.
    #[error("run cancelled; the sandbox was killed")]
    Cancelled,
    /// A bug or an unexpected host failure.
    #[error("internal failure: {message}")]
    Internal {
        /// What went wrong.
        message: String,
        /// The OS error, when there is one.
        #[source]
        source: Option<io::Error>,
    },
}

/// The category of an [`Error`]; stable for bindings (`code()` strings never change).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::InvalidRequest`] and [`Error::Exec`].
    InvalidRequest,
    /// [`Error::Denied`].
    Denied,
    /// [`Error::BackendUnavailable`].
    Unavailable,
    /// [`Error::Unenforceable`].
    Unenforceable,
    /// [`Error::LimitExceeded`].
    LimitExceeded,
    /// [`Error::ToolFailed`].
    ToolFailed,
    /// [`Error::Cancelled`].
    Cancelled,
    /// [`Error::Setup`].
    SetupFailed,
    /// [`Error::Internal`].
    Internal,
}

impl ErrorKind {
    /// A stable snake_case code, used as `error.code` in Node and in JSON.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::Denied => "denied",
            ErrorKind::Unavailable => "backend_unavailable",
            ErrorKind::Unenforceable => "unenforceable",
            ErrorKind::LimitExceeded => "limit_exceeded",
            ErrorKind::ToolFailed => "tool_failed",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::SetupFailed => "setup_failed",
            ErrorKind::Internal => "internal",
        }
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidRequest`].
    pub fn invalid(reason: impl Into<String>) -> Self {
        Error::InvalidRequest {
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::BackendUnavailable`].
    pub fn unavailable(backend: BackendKind, reason: impl Into<String>) -> Self {
        Error::BackendUnavailable {
            backend,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Unenforceable`] of a guarantee refused whatever the
    /// strictness (its message promises no best-effort run).
    pub fn unenforceable(guarantee: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unenforceable {
            guarantee: guarantee.into(),
            reason: reason.into(),
            best_effort_runs: false,
        }
    }

    /// Shorthand for [`Error::Unenforceable`] of a guarantee a strict run refuses and a
    /// best-effort run would go without (its message says so).
    pub fn unenforceable_strict(guarantee: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unenforceable {
            guarantee: guarantee.into(),
            reason: reason.into(),
            best_effort_runs: true,
        }
    }

    /// Shorthand for [`Error::Setup`]: `at` is the typed part, `stage` the step in words.
    pub fn setup(at: SetupStage, stage: impl Into<String>, source: io::Error) -> Self {
        Error::Setup {
            at,
            stage: stage.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Internal`] with an OS cause.
    pub fn internal(message: impl Into<String>, source: io::Error) -> Self {
        Error::Internal {
            message: message.into(),
            source: Some(source),
        }
    }

    /// The category callers branch on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidRequest { .. } | Error::Exec { .. } => ErrorKind::InvalidRequest,
            Error::Denied { .. } => ErrorKind::Denied,
            Error::BackendUnavailable { .. } => ErrorKind::Unavailable,
            Error::Unenforceable { .. } => ErrorKind::Unenforceable,
            Error::LimitExceeded { .. } => ErrorKind::LimitExceeded,
            Error::ToolFailed { .. } => ErrorKind::ToolFailed,
            Error::Cancelled => ErrorKind::Cancelled,
            Error::Setup { .. } => ErrorKind::SetupFailed,
            Error::Internal { .. } => ErrorKind::Internal,
        }
    }

    /// The typed stage of a setup failure; `None` for every other error.
    pub fn setup_stage(&self) -> Option<SetupStage> {
        match self {
            Error::Setup { at, .. } => Some(*at),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_have_stable_codes_and_messages_name_the_problem() {
        let err = Error::unenforceable_strict("fs: landlock", "kernel has no landlock");
        assert_eq!(err.kind().code(), "unenforceable");
        assert!(err.to_string().contains("fs: landlock"));
        assert!(err
            .to_string()
            .ends_with("(best-effort strictness would run without it)"));
        let err = Error::Exec {
            program: "nope".into(),
            source: io::Error::from_raw_os_error(libc_enoent()),
        };
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(
            std::error::Error::source(&err).is_some(),
            "OS cause is kept"
        );
    }

    /// Issue 33: a refusal that best effort shares must not tell the caller best effort
    /// would run (it said so for missing user namespaces, and then refused that too).
    #[test]
    fn a_refusal_of_every_strictness_promises_no_best_effort_run() {
        let err = Error::unenforceable("isolation: namespaces", "no user namespaces");
        assert_eq!(err.kind(), ErrorKind::Unenforceable);
        assert!(!err.to_string().contains("best-effort"), "{err}");
        assert!(err.to_string().ends_with("refusing to run"), "{err}");
    }

    fn libc_enoent() -> i32 {
        2
    }
}
