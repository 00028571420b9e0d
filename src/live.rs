//! Live sandboxes: one sandbox that stays up for a task, its processes, and the supervisor
//! that holds it ([`sandbox_live`]; see `docs/live.md`).

pub use sandbox_live::protocol::encode as encode_bytes;
pub use sandbox_live::protocol::{
    ExecRequest, ExitInfo, ProcessInfo, ProcessState, PublishRequest, PublishedPort, SandboxInfo,
    TtySize,
};
pub use sandbox_live::watch::{ChangeKind, FileChange};
pub use sandbox_live::{
    LiveSandbox, OutputSince, PauseMethod, Pty, StartOptions, Stream, SUPERVISOR_NAME,
};
pub use sandbox_os::file_tree::DirEntry;

use sandbox_core::{Caps, Error, Result};

use crate::Sandbox;

impl Sandbox {
    /// Starts a live sandbox with `caps`, this sandbox's strictness and helper, and the rest
    /// of `options` (default: owned, so it ends when the returned handle drops or this
    /// process dies; no TTL). The backend: `options.backend`, except that caps with an
    /// image (`caps.container`), or a sandbox built for the container backend, start on the
    /// container backend (its native runtime) when `options` left the default (process).
    ///
    /// # Errors
    /// As [`LiveSandbox::start`]; [`Error::InvalidRequest`] when this sandbox has a tier,
    /// an approver or an audit log, which live sandboxes do not apply yet (refused rather
    /// than ignored).
    pub fn start(&self, caps: &Caps, options: StartOptions) -> Result<LiveSandbox> {
        if self.has_policy() {
            return Err(Error::invalid(
                "live sandboxes do not apply tiers, approvers or audit logs yet: start one from a sandbox without them",
            ));
        }
        let mut options = options;
        options.strictness = self.strictness();
        let container_asked = caps.container.is_some()
            || self.choice() == crate::BackendChoice::Only(sandbox_core::BackendKind::Container);
        if options.backend == sandbox_core::BackendKind::Process && container_asked {
            options.backend = sandbox_core::BackendKind::Container;
        }
        if options.helper.is_none() {
            options.helper = self.helper_path().map(Into::into);
        }
        LiveSandbox::start(caps, &options)
    }
}
