//! Grants as the tier sees them: resolved on this host before the tier decides, and pinned
//! so the run binds exactly the paths the tier checked.
//!
//! A tier limits host paths ([`sandbox_policy::Tier`]), but a grant may name one
//! place and bind another: `--ro-follow /tmp/x/link` with `link -> /etc` binds `/etc`. So
//! before a tiered run is admitted, every grant is resolved here with the resolution the
//! backends use ([`sandbox_core::grant::resolve`] over the real file system: components
//! looked up without following symlinks, `canonicalize` for a grant that follows them),
//! the tier checks the resolved paths, and the run gets the pinned grants
//! ([`sandbox_core::ResolvedGrant::pinned`]: the resolved path, symlinks no longer
//! followed). A symlink swapped in after the check then refuses the run in the backend
//! (which opens grants with `RESOLVE_NO_SYMLINKS`) instead of redirecting it. Runs without
//! a tier are not touched: their backend resolves their grants as before.

use sandbox_core::grant::{self, RealHost};
use sandbox_core::{Caps, Error, FollowedGrant, Mount, Result};

/// The caps of a tiered run with their grants pinned on the host.
pub(crate) struct PinnedRun {
    /// What the tier checks (`tier_caps` pinned).
    pub tier_caps: Caps,
    /// What runs (`caps` pinned).
    pub caps: Caps,
    /// Grants that followed symlinks, in either, once each.
    pub followed: Vec<FollowedGrant>,
}

/// Pins the grants of `tier_caps` (what the tier sees) and `caps` (what runs: the same
/// grants plus Strata's own, such as a session directory or a workspace's staging copy).
/// A mount present in both is resolved once, so the tier and the run cannot see two
/// different resolutions of it. Errors as [`grant::resolve`].
pub(crate) fn pin_for_tier(tier_caps: &Caps, caps: &Caps) -> Result<PinnedRun> {
    let mut seen: Vec<(Mount, Mount)> = Vec::new();
    let mut followed = Vec::new();
    let mut pin = |caps: &Caps| -> Result<Caps> {
        let mut pinned = caps.clone();
        for mount in &mut pinned.mounts {
            if let Some((_, done)) = seen.iter().find(|(given, _)| given == mount) {
                *mount = done.clone();
                continue;
            }
            let resolved = grant::resolve(mount, &RealHost)?;
            let done = resolved.pinned(mount);
            if resolved.followed_symlinks {
                followed.push(FollowedGrant {
                    requested: resolved.requested,
                    resolved: resolved.resolved,
                });
            }
            seen.push((mount.clone(), done.clone()));
            *mount = done;
        }
        Ok(pinned)
    };
    let tier_caps = pin(tier_caps)?;
    let caps = pin(caps)?;
    Ok(PinnedRun {
        tier_caps,
        caps,
        followed,
    })
}

/// `error` with [`explain_followed`] applied when it is a tier's refusal.
pub(crate) fn explain_denied(error: Error, followed: &[FollowedGrant]) -> Error {
    match error {
        Error::Denied { reason } => Error::Denied {
            reason: explain_followed(reason, followed),
        },
        other => other,
    }
}

/// `reason` (a tier's refusal) with the grants whose symlinks were followed, so a refusal
/// of `read:/etc` for `--ro-follow /tmp/x/link` says where `/etc` came from.
pub(crate) fn explain_followed(reason: String, followed: &[FollowedGrant]) -> String {
    if followed.is_empty() {
        return reason;
    }
    let links: Vec<String> = followed
        .iter()
        .map(|g| format!("{} -> {}", g.requested.display(), g.resolved.display()))
        .collect();
    format!(
        "{reason} (the tier checks where grants lead; followed symlinks: {})",
        links.join(", ")
    )
}
