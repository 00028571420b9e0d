//! The transactional workspace: a read-write grant whose writes reach the host only after
//! the caller has seen them.
//!
//! The run writes to a private copy of the grant (staged by the backend crate, e.g.
//! `sandbox_os::Workspace`). Afterwards the copy is compared with what was staged, giving a
//! [`WorkspaceDiff`]: every path added, changed or deleted, with [`Flag`]s on what deserves
//! a second look (symlinks, devices, setuid/setgid bits, the host-executed paths of
//! [`sandbox_core::grant::HOST_EXECUTED`]). The caller then commits all of it, part of it
//! ([`Selection`]), or discards it.
//!
//! This module holds the data and the pure rules; it touches no file system.
//!
//! # Commit policy
//!
//! [`plan`] decides, for each selected change, whether it is applied or refused:
//!
//! - Devices, FIFOs and sockets are **never** committed ([`Refusal::Special`]).
//! - Symlinks are committed only when the caller names them in `accept_flagged` **and**
//!   their target stays inside the grant lexically (relative, and its `..` never climbs
//!   above the grant's root). An absolute target is always outside
//!   ([`Refusal::SymlinkOutOfGrant`]), since the grant may be mounted anywhere.
//! - Host-executed paths (at or below an entry of `HOST_EXECUTED`, at any depth: a nested
//!   repository's `.git/hooks` counts) and setuid/setgid files are refused by a plain
//!   "commit all"; naming the path in `accept_flagged` commits it. Accepting means exactly
//!   that path (not what lies beneath it), and it also allows creating the directories
//!   above it that the commit needs.
//! - Setuid and setgid bits are dropped on every commit, accepted or not; other permission
//!   bits (including execute) are kept.
//!
//! The default [`CommitMode::SkipRefused`] applies everything that is not refused and lists
//! each refusal (path and [`Refusal`]) in the [`CommitReport`]: a planted `.git/hooks` file
//! never reaches the host, and the honest edits next to it still do.
//! [`CommitMode::AllOrNothing`] applies nothing when any selected change is refused.
//! Either way nothing flagged is written without being named, so the default fails closed
//! for every dangerous path. The host-side checks (a path changed on the host since the
//! workspace was staged, a symlink planted in the host grant) are made by the backend while
//! applying and reported as [`Refusal::Conflict`] and [`Refusal::HostPath`].

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_core::grant::{Expect, HOST_EXECUTED};

/// What happened to a path since the workspace was staged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// The path did not exist in the staged original.
    Added,
    /// The path existed and its content, kind or permission bits differ.
    Changed,
    /// The path existed and is gone.
    Deleted,
}

/// What a path is (after the run; before it, for [`ChangeKind::Deleted`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link and its stored target (never followed).
    Symlink {
        /// The target as stored in the link.
        target: PathBuf,
    },
    /// A character or block device.
    Device,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
}

impl Entry {
    /// Devices, FIFOs and sockets: never committed.
    pub fn is_special(&self) -> bool {
        matches!(self, Entry::Device | Entry::Fifo | Entry::Socket)
    }
}

/// Something about a change that deserves a second look. Flags marked "refused by
/// default" in [`Flag::refused_by_default`] keep the change out of a plain commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "flag", rename_all = "snake_case")]
pub enum Flag {
    /// A symbolic link (refused unless accepted).
    Symlink,
    /// A symbolic link whose target leaves the grant (absolute, or `..` above the root):
    /// never committed.
    SymlinkOutOfGrant,
    /// A character or block device: never committed.
    Device,
    /// A FIFO or socket: never committed.
    Special,
    /// A file with the setuid bit (refused unless accepted; the bit is always dropped).
    Setuid,
    /// A file with the setgid bit (refused unless accepted; the bit is always dropped).
    Setgid,
    /// At or below a path the host executes or trusts (refused unless accepted).
    HostExecuted {
        /// The matching entry of [`sandbox_core::grant::HOST_EXECUTED`], e.g. `.git/hooks`.
        entry: String,
        /// Who runs or trusts it.
        why: String,
    },
    /// The permission bits changed (informational; octal values of `mode & 0o7777`).
    ModeChanged {
        /// The staged original's bits.
        from: u32,
        /// The bits after the run.
        to: u32,
    },
}

impl Flag {
    /// Whether this flag keeps the change out of a commit unless the caller accepts the path
    /// by name. Informational flags ([`Flag::ModeChanged`]) do not.
    pub fn refused_by_default(&self) -> bool {
        !matches!(self, Flag::ModeChanged { .. })
    }
}

/// One added, changed or deleted path of a [`WorkspaceDiff`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Change {
    /// The path relative to the grant's root: plain components, no `.`, `..` or `/` prefix.
    pub path: PathBuf,
    /// Added, changed or deleted.
    pub kind: ChangeKind,
    /// What the path is after the run (for a deletion: what it was).
    pub entry: Entry,
    /// Bytes: a file's length, a symlink target's length, otherwise 0.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`) after the run (for a deletion: before).
    pub mode: u32,
    /// What deserves a second look; see [`flags`].
    pub flags: Vec<Flag>,
}

impl Change {
    /// Whether any flag keeps this change out of a commit that does not name it.
    pub fn needs_acceptance(&self) -> bool {
        self.flags.iter().any(Flag::refused_by_default)
    }
}

/// Everything a run changed in a transactional grant, ordered by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkspaceDiff {
    /// The changes, sorted by path (parents before children).
    pub changes: Vec<Change>,
    /// Bytes the commit would write: added and changed regular files plus symlink targets
    /// (the "upper layer" counted against the run's disk limit).
    pub upper_bytes: u64,
    /// The limit `upper_bytes` is held to (the run's `Limits::disk`).
    pub limit: u64,
    /// `upper_bytes > limit`: such a diff cannot be committed at all.
    pub over_limit: bool,
}

impl WorkspaceDiff {
    /// A diff of `changes` (sorted here) held to `limit` bytes; `upper_bytes` and
    /// `over_limit` are computed.
    pub fn new(mut changes: Vec<Change>, limit: u64) -> Self {
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        let upper_bytes = changes
            .iter()
            .filter(|c| c.kind != ChangeKind::Deleted)
            .filter(|c| matches!(c.entry, Entry::File | Entry::Symlink { .. }))
            .fold(0u64, |sum, c| sum.saturating_add(c.size));
        WorkspaceDiff {
            changes,
            upper_bytes,
            limit,
            over_limit: upper_bytes > limit,
        }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The change at `path`, if any.
    pub fn get(&self, path: &Path) -> Option<&Change> {
        self.changes.iter().find(|c| c.path == path)
    }
}

/// The flags of a change at `path` (relative to the grant), being `entry` with permission
/// bits `mode`, whose staged original had bits `before_mode` (`None` when added).
/// `grant_root` is the grant's host path: a host-executed path is matched anywhere in
/// `grant_root/path` as long as it lies at or below the grant's root (granting `.git/hooks`
/// itself is the caller's explicit choice, as in [`sandbox_core::grant::host_executed`]).
pub fn flags(
    grant_root: &Path,
    path: &Path,
    entry: &Entry,
    mode: u32,
    before_mode: Option<u32>,
) -> Vec<Flag> {
    let mut out = Vec::new();
    match entry {
        Entry::Symlink { target } => {
            out.push(Flag::Symlink);
            if !symlink_stays_inside(path, target) {
                out.push(Flag::SymlinkOutOfGrant);
            }
        }
        Entry::Device => out.push(Flag::Device),
        Entry::Fifo | Entry::Socket => out.push(Flag::Special),
        Entry::File | Entry::Dir => {}
    }
    if *entry == Entry::File && mode & 0o4000 != 0 {
        out.push(Flag::Setuid);
    }
    if *entry == Entry::File && mode & 0o2000 != 0 {
        out.push(Flag::Setgid);
    }
    if let Some(hit) = host_executed_match(grant_root, path, entry) {
        out.push(Flag::HostExecuted {
            entry: hit.path.to_string(),
            why: hit.why.to_string(),
        });
    }
    if let Some(before) = before_mode {
        if before & 0o7777 != mode & 0o7777 {
            out.push(Flag::ModeChanged {
                from: before & 0o7777,
                to: mode & 0o7777,
            });
        }
    }
    out
}

fn names(path: &Path) -> Vec<&std::ffi::OsStr> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect()
}

/// The entry of `HOST_EXECUTED` that `grant_root/path` lies at or below, matched anywhere
/// in the path but ending inside the grant.
fn host_executed_match(
    grant_root: &Path,
    path: &Path,
    entry: &Entry,
) -> Option<&'static sandbox_core::grant::HostExecuted> {
    let root = names(grant_root);
    let rel = names(path);
    let full: Vec<&std::ffi::OsStr> = root.iter().chain(rel.iter()).copied().collect();
    HOST_EXECUTED.iter().find(|item| {
        let want = names(Path::new(item.path));
        (0..full.len()).any(|start| {
            let end = start + want.len();
            end <= full.len()
                && end > root.len()
                && full[start..end] == want[..]
                && (item.expect == Expect::Any || (end == full.len() && *entry != Entry::Dir))
        })
    })
}

/// Whether a symlink at `path` (relative to the grant) with `target` resolves, lexically,
/// inside the grant: the target is relative and its `..` never climbs above the root.
/// An absolute target is outside (the grant's mount point is not known here).
pub fn symlink_stays_inside(path: &Path, target: &Path) -> bool {
    if target.as_os_str().is_empty() || target.is_absolute() {
        return false;
    }
    let mut depth = names(path).len().saturating_sub(1) as i64;
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Which changes a commit takes. Default: [`Selection::All`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Every change of the diff.
    #[default]
    All,
    /// The changes at these paths (relative to the grant) and below them. A path with no
    /// change at or below it is reported as [`Refusal::NoSuchChange`].
    Paths(Vec<PathBuf>),
}

impl Selection {
    /// Whether the change at `path` is selected.
    pub fn selects(&self, path: &Path) -> bool {
        match self {
            Selection::All => true,
            Selection::Paths(paths) => paths.iter().any(|p| path.starts_with(p)),
        }
    }
}

/// What a commit does when some selected changes are refused. Default:
/// [`CommitMode::SkipRefused`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CommitMode {
    /// Apply what is not refused; list each refusal in the report. Flagged paths are never
    /// written unless named, so this fails closed for them.
    #[default]
    SkipRefused,
    /// Apply nothing if any selected change is refused (all refusals, including the host
    /// checks made before writing, are decided before the first write). An I/O error while
    /// writing can still leave part of the commit applied; the report says which.
    AllOrNothing,
}

/// Why a change was not committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// A device, FIFO or socket: never committed.
    Special,
    /// A symlink whose target leaves the grant: never committed.
    SymlinkOutOfGrant {
        /// The stored target.
        target: PathBuf,
    },
    /// A flagged change (symlink, setuid/setgid, host-executed) not named in
    /// `accept_flagged`.
    NotAccepted {
        /// The flags that need acceptance.
        flags: Vec<Flag>,
    },
    /// A selected path with no change at or below it.
    NoSuchChange,
    /// The host's path changed since the workspace was staged.
    Conflict {
        /// What differs.
        detail: String,
    },
    /// The host grant has a symlink or a non-directory in the way: the commit does not
    /// follow or replace it.
    HostPath {
        /// What is in the way.
        detail: String,
    },
    /// Writing failed.
    Failed {
        /// The error.
        detail: String,
    },
    /// Not applied because another selected change was refused
    /// ([`CommitMode::AllOrNothing`]).
    AllOrNothing,
}

/// One refused path and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Refused {
    /// The path relative to the grant.
    pub path: PathBuf,
    /// Why.
    pub reason: Refusal,
}

/// The policy's verdict before any host check: which changes to apply, which are refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitPlan {
    /// The changes to apply, in the diff's order.
    pub apply: Vec<Change>,
    /// The refused ones.
    pub refused: Vec<Refused>,
    /// How many changes were not selected.
    pub unselected: usize,
}

/// Decides which changes of `diff` a commit of `selection` applies: see the module docs.
/// `accept_flagged` names paths (exactly) whose refused-by-default flags the caller
/// accepts. Under [`CommitMode::AllOrNothing`] any refusal turns every other selected
/// change into [`Refusal::AllOrNothing`]. The over-limit check is the caller's (a diff
/// over its limit is refused whole, not planned).
pub fn plan(
    diff: &WorkspaceDiff,
    selection: &Selection,
    accept_flagged: &[PathBuf],
    mode: CommitMode,
) -> CommitPlan {
    let mut out = CommitPlan::default();
    for change in &diff.changes {
        if !selection.selects(&change.path) {
            out.unselected += 1;
            continue;
        }
        let accepted = accept_flagged.iter().any(|p| p == &change.path);
        match verdict(change, accepted) {
            Some(reason) => out.refused.push(Refused {
                path: change.path.clone(),
                reason,
            }),
            None => out.apply.push(change.clone()),
        }
    }
    if let Selection::Paths(paths) = selection {
        for path in paths {
            if !diff.changes.iter().any(|c| c.path.starts_with(path)) {
                out.refused.push(Refused {
                    path: path.clone(),
                    reason: Refusal::NoSuchChange,
                });
            }
        }
    }
    if mode == CommitMode::AllOrNothing && !out.refused.is_empty() {
        out.refuse_all();
    }
    out
}

impl CommitPlan {
    /// Moves every change still to apply into `refused` as [`Refusal::AllOrNothing`].
    pub fn refuse_all(&mut self) {
        for change in self.apply.drain(..) {
            self.refused.push(Refused {
                path: change.path,
                reason: Refusal::AllOrNothing,
            });
        }
    }
}

/// Why `change` may not be committed (given whether its path was accepted), or `None`.
pub fn verdict(change: &Change, accepted: bool) -> Option<Refusal> {
    if change.kind != ChangeKind::Deleted {
        if change.entry.is_special() {
            return Some(Refusal::Special);
        }
        if let Entry::Symlink { target } = &change.entry {
            if !symlink_stays_inside(&change.path, target) {
                return Some(Refusal::SymlinkOutOfGrant {
                    target: target.clone(),
                });
            }
        }
    }
    let flags: Vec<Flag> = change
        .flags
        .iter()
        .filter(|f| f.refused_by_default())
        .filter(|f| change.kind != ChangeKind::Deleted || matches!(f, Flag::HostExecuted { .. }))
        .cloned()
        .collect();
    if flags.is_empty() || accepted {
        return None;
    }
    Some(Refusal::NotAccepted { flags })
}

/// What a commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CommitReport {
    /// Paths written to (or deleted from) the host grant, in the order applied.
    pub applied: Vec<PathBuf>,
    /// Paths not committed, each with its reason.
    pub refused: Vec<Refused>,
    /// Committed files whose setuid/setgid bits were dropped.
    pub dropped_bits: Vec<PathBuf>,
    /// How many changes of the diff were not selected (left uncommitted, not refused).
    pub unselected: usize,
}

impl CommitReport {
    /// Whether every selected change was applied.
    pub fn is_complete(&self) -> bool {
        self.refused.is_empty()
    }

    /// The refusal of `path`, if it was refused.
    pub fn refusal(&self, path: &Path) -> Option<&Refusal> {
        self.refused
            .iter()
            .find(|r| r.path == path)
            .map(|r| &r.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str, kind: ChangeKind, entry: Entry, mode: u32) -> Change {
        let flags = flags(Path::new("/ws"), Path::new(path), &entry, mode, None);
        Change {
            path: path.into(),
            kind,
            entry,
            size: 1,
            mode,
            flags,
        }
    }

    fn added(path: &str) -> Change {
        change(path, ChangeKind::Added, Entry::File, 0o644)
    }

    fn link(path: &str, target: &str) -> Entry {
        let _ = path;
        Entry::Symlink {
            target: target.into(),
        }
    }

    #[test]
    fn host_executed_paths_are_flagged_at_any_depth_inside_the_grant() {
        let root = Path::new("/ws");
        let hit = |p: &str, e: Entry| {
            flags(root, Path::new(p), &e, 0o644, None)
                .iter()
                .any(|f| matches!(f, Flag::HostExecuted { .. }))
        };
        assert!(hit(".git/hooks/pre-commit", Entry::File));
        assert!(hit(".git/hooks", Entry::Dir));
        assert!(hit(".git/config", Entry::File));
        assert!(hit("vendor/lib/.git/hooks/post-checkout", Entry::File));
        assert!(hit(".envrc", Entry::File));
        assert!(hit(".vscode/tasks.json", Entry::File));
        assert!(hit(".git", Entry::File), "a gitfile");
        assert!(
            !hit(".git", Entry::Dir),
            "a .git directory is not flagged whole"
        );
        assert!(!hit(".git/objects/ab/cdef", Entry::File));
        assert!(!hit("src/main.rs", Entry::File));
        assert!(!hit("src/.git-hooks", Entry::File));
        // A grant inside a repository: the hooks below it are host-executed.
        let flagged = flags(
            Path::new("/ws/.git"),
            Path::new("hooks/pre-push"),
            &Entry::File,
            0o755,
            None,
        );
        assert!(flagged
            .iter()
            .any(|f| matches!(f, Flag::HostExecuted { entry, .. } if entry == ".git/hooks")));
        // Granting the hooks directory itself is the caller's explicit choice.
        let flagged = flags(
            Path::new("/ws/.git/hooks"),
            Path::new("pre-push"),
            &Entry::File,
            0o755,
            None,
        );
        assert!(flagged.is_empty(), "{flagged:?}");
    }

    #[test]
    fn symlink_targets_are_judged_lexically() {
        let inside = |p: &str, t: &str| symlink_stays_inside(Path::new(p), Path::new(t));
        assert!(inside("a/b", "c"));
        assert!(inside("a/b", "../x"));
        assert!(inside("a/b/c", "../../x/./y"));
        assert!(!inside("a/b", "../../x"));
        assert!(!inside("top", "../x"));
        assert!(!inside("a", "/etc"));
        assert!(!inside("a", ""));
        assert!(!inside("a/b", "x/../../../y"));
    }

    #[test]
    fn commit_all_refuses_every_flag_and_applies_the_rest() {
        let diff = WorkspaceDiff::new(
            vec![
                added("src/main.rs"),
                added(".git/hooks/pre-commit"),
                change("run.sh", ChangeKind::Added, Entry::File, 0o4755),
                change("inside", ChangeKind::Added, link("inside", "src"), 0o777),
                change("escape", ChangeKind::Added, link("escape", "/etc"), 0o777),
                change("pipe", ChangeKind::Added, Entry::Fifo, 0o644),
                change("dev", ChangeKind::Added, Entry::Device, 0o644),
            ],
            1 << 20,
        );
        let plan = plan(&diff, &Selection::All, &[], CommitMode::SkipRefused);
        let applied: Vec<&Path> = plan.apply.iter().map(|c| c.path.as_path()).collect();
        assert_eq!(applied, [Path::new("src/main.rs")]);
        let reason = |p: &str| {
            plan.refused
                .iter()
                .find(|r| r.path == Path::new(p))
                .map(|r| r.reason.clone())
        };
        assert!(matches!(
            reason(".git/hooks/pre-commit"),
            Some(Refusal::NotAccepted { .. })
        ));
        assert!(matches!(
            reason("run.sh"),
            Some(Refusal::NotAccepted { .. })
        ));
        assert!(matches!(
            reason("inside"),
            Some(Refusal::NotAccepted { .. })
        ));
        assert!(matches!(
            reason("escape"),
            Some(Refusal::SymlinkOutOfGrant { .. })
        ));
        assert_eq!(reason("pipe"), Some(Refusal::Special));
        assert_eq!(reason("dev"), Some(Refusal::Special));
    }

    #[test]
    fn accepting_by_name_admits_flagged_but_never_special_or_escaping() {
        let diff = WorkspaceDiff::new(
            vec![
                added(".git/hooks/pre-commit"),
                change("inside", ChangeKind::Added, link("inside", "src"), 0o777),
                change("escape", ChangeKind::Added, link("escape", "../x"), 0o777),
                change("pipe", ChangeKind::Added, Entry::Fifo, 0o644),
            ],
            1 << 20,
        );
        let accept: Vec<PathBuf> = ["inside", "escape", "pipe", ".git/hooks/pre-commit"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let plan = plan(&diff, &Selection::All, &accept, CommitMode::SkipRefused);
        let applied: Vec<&Path> = plan.apply.iter().map(|c| c.path.as_path()).collect();
        assert_eq!(
            applied,
            [Path::new(".git/hooks/pre-commit"), Path::new("inside")]
        );
        assert_eq!(plan.refused.len(), 2);
        // Accepting a directory does not accept what lies beneath it.
        let plan_dir = super::plan(
            &diff,
            &Selection::All,
            &[PathBuf::from(".git/hooks")],
            CommitMode::SkipRefused,
        );
        assert!(plan_dir.apply.is_empty());
    }

    #[test]
    fn selection_takes_paths_and_below_and_reports_unknown_paths() {
        let diff = WorkspaceDiff::new(
            vec![added("src/a.rs"), added("src/b.rs"), added("docs/x.md")],
            1 << 20,
        );
        let selection = Selection::Paths(vec!["src".into(), "nope".into()]);
        let plan = plan(&diff, &selection, &[], CommitMode::SkipRefused);
        assert_eq!(plan.apply.len(), 2);
        assert_eq!(plan.unselected, 1);
        assert_eq!(
            plan.refused,
            [Refused {
                path: "nope".into(),
                reason: Refusal::NoSuchChange
            }]
        );
    }

    #[test]
    fn all_or_nothing_refuses_everything_when_anything_is_refused() {
        let diff = WorkspaceDiff::new(vec![added("ok.txt"), added(".envrc")], 1 << 20);
        let plan = plan(&diff, &Selection::All, &[], CommitMode::AllOrNothing);
        assert!(plan.apply.is_empty());
        assert_eq!(plan.refused.len(), 2);
        assert!(plan
            .refused
            .iter()
            .any(|r| r.path == Path::new("ok.txt") && r.reason == Refusal::AllOrNothing));
    }

    #[test]
    fn deleting_a_host_executed_path_needs_acceptance_but_deleting_a_symlink_does_not() {
        let mut gone = change(
            "old-link",
            ChangeKind::Deleted,
            link("old-link", "/etc"),
            0o777,
        );
        gone.kind = ChangeKind::Deleted;
        assert_eq!(verdict(&gone, false), None);
        let hook = change(
            ".git/hooks/pre-push",
            ChangeKind::Deleted,
            Entry::File,
            0o755,
        );
        assert!(matches!(
            verdict(&hook, false),
            Some(Refusal::NotAccepted { .. })
        ));
        assert_eq!(verdict(&hook, true), None);
    }

    #[test]
    fn upper_bytes_count_added_and_changed_files_against_the_limit() {
        let mut big = added("big");
        big.size = 100;
        let mut gone = added("gone");
        gone.kind = ChangeKind::Deleted;
        gone.size = 1000;
        let diff = WorkspaceDiff::new(vec![big.clone(), gone.clone()], 99);
        assert_eq!(diff.upper_bytes, 100);
        assert!(diff.over_limit);
        assert!(!WorkspaceDiff::new(vec![big, gone], 100).over_limit);
    }

    #[test]
    fn the_diff_round_trips_through_json() {
        let diff = WorkspaceDiff::new(
            vec![
                added(".git/hooks/pre-commit"),
                change("l", ChangeKind::Added, link("l", "/etc"), 0o777),
            ],
            64,
        );
        let text = serde_json::to_string(&diff).expect("serialize");
        assert!(text.contains("\"host_executed\""), "{text}");
        assert!(text.contains("\"symlink_out_of_grant\""), "{text}");
        let back: WorkspaceDiff = serde_json::from_str(&text).expect("deserialize");
        assert_eq!(back, diff);
    }
}
