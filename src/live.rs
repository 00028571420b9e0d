//! Live sandboxes: one sandbox that stays up for a task, its processes, and the supervisor
//! that holds it ([`sandbox_live`]; see `docs/live.md`).

pub use sandbox_live::protocol::encode as encode_bytes;
pub use sandbox_live::protocol::{
    ExecRequest, ExitInfo, ProcessInfo, ProcessState, PublishRequest, PublishedPort, SandboxInfo,
    TtySize,
};
pub use sandbox_live::snapshot::{Forked, Verified as VerifiedSnapshot, MAX_FORK};
pub use sandbox_live::watch::{ChangeKind, FileChange};
pub use sandbox_live::{
    LivePolicy, LiveSandbox, OutputSince, PauseMethod, ProgramApprover, Pty, SnapshotInfo,
    SnapshotStore, StartOptions, Stream, SUPERVISOR_NAME,
};
pub use sandbox_os::file_tree::DirEntry;

use sandbox_core::{Caps, Result};

use crate::Sandbox;

impl Sandbox {
    /// Starts a live sandbox with `caps`, this sandbox's strictness and helper, and the rest
    /// of `options` (default: owned, so it ends when the returned handle drops or this
    /// process dies; no TTL). The backend: `options.backend`, except that caps with an
    /// image (`caps.container`), or a sandbox built for the container backend, start on the
    /// container backend (its native runtime) when `options` left the default (process).
    ///
    /// Under this sandbox's tier the caps are admitted first, as a run's are (grants
    /// pinned, needs beyond the tier asked of the approver, every decision audited), and
    /// the receipt's `policy` says what was decided; the supervisor then checks every
    /// exec's program against the tier (asking `options.policy.approver`, a program, about
    /// one beyond it) and records each exec in this sandbox's audit log.
    ///
    /// # Errors
    /// As [`LiveSandbox::start`]; [`Error::Denied`] when the tier does not allow the caps
    /// and no approver granted them.
    pub fn start(&self, caps: &Caps, options: StartOptions) -> Result<LiveSandbox> {
        self.start_live(caps, options, false, |caps, options| {
            LiveSandbox::start(caps, options)
        })
    }

    /// Starts a live sandbox from the snapshot `name` in `store` (see
    /// [`LiveSandbox::start_from`]): the snapshot is verified, its caps are admitted under
    /// this sandbox's tier as [`Sandbox::start`] admits caps, and it starts on the
    /// snapshot's backend with its files copied in.
    ///
    /// # Errors
    /// As [`SnapshotStore::load`] and [`Sandbox::start`].
    pub fn start_from(
        &self,
        store: &SnapshotStore,
        name: &str,
        options: StartOptions,
    ) -> Result<LiveSandbox> {
        let snapshot = store.load(name)?;
        let mut options = options;
        options.backend = snapshot.info().backend;
        self.start_live(snapshot.caps(), options, true, |caps, options| {
            snapshot.start_with(caps, options)
        })
    }

    /// Admits `caps`, completes `options` from this sandbox (strictness, helper, tier,
    /// audit log; the backend too unless `keep_backend`) and starts with `start`.
    fn start_live(
        &self,
        caps: &Caps,
        options: StartOptions,
        keep_backend: bool,
        start: impl FnOnce(&Caps, &StartOptions) -> Result<LiveSandbox>,
    ) -> Result<LiveSandbox> {
        let admitted = self.admit_live(caps)?;
        let mut options = options;
        options.strictness = self.strictness();
        let container_asked = caps.container.is_some()
            || self.choice() == crate::BackendChoice::Only(sandbox_core::BackendKind::Container);
        if options.backend == sandbox_core::BackendKind::Process && container_asked && !keep_backend
        {
            options.backend = sandbox_core::BackendKind::Container;
        }
        if options.backend == sandbox_core::BackendKind::Process
            && self.choice() == crate::BackendChoice::Only(sandbox_core::BackendKind::Microvm)
            && !keep_backend
        {
            options.backend = sandbox_core::BackendKind::Microvm;
        }
        if options.helper.is_none() {
            options.helper = self.helper_path().map(Into::into);
        }
        options.policy.tier = admitted.tier;
        options.policy.admitted = admitted.receipt;
        if options.policy.audit.is_none() {
            options.policy.audit = self.audit_path();
        }
        let started = start(&admitted.caps, &options);
        if let Err(error) = &started {
            if options.policy.audit.is_some() {
                self.audit(sandbox_core::audit::AuditEvent::Refusal {
                    tool: "live sandbox".into(),
                    error: error.kind().code().to_string(),
                    message: error.to_string(),
                })?;
            }
        }
        started
    }
}
