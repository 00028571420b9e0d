//! The host side of a grant: which host path a [`Mount`] names, and which host-executed
//! paths inside a read-write grant stay read-only.
//!
//! Two rules, both decided here as pure functions over host facts that the backends supply
//! through [`HostLookup`] (an `lstat`, a `readlink`, a `realpath`):
//!
//! 1. **Grants do not follow symlinks.** A caller's host path is checked component by
//!    component; a symlink anywhere in it refuses the grant ([`resolve`]) unless that grant
//!    says [`Mount::follow_symlinks`]. Otherwise a tool that could write the parent of a
//!    granted path in an earlier run (replace `ws/src` with a link to a secret directory)
//!    would redirect a later, narrower grant. The check is lexical and racy on its own;
//!    each backend then opens the resolved path without following symlinks
//!    (`RESOLVE_NO_SYMLINKS`), so a swap between this check and the mount fails the run.
//! 2. **Host-executed files stay read-only.** Existing entries of [`HOST_EXECUTED`] inside a
//!    read-write directory grant (a repository's `.git/hooks`, an `.envrc`, editor task
//!    files) are things the host runs or trusts later, outside any sandbox. A tool that may
//!    edit the workspace must not be able to plant code there. [`host_executed`] finds
//!    them; backends bind them read-only over the writable grant and pin their parent
//!    directories (see [`HostExecutedPlan`]). Opt out with [`crate::Caps::protect_host_executed`].
//!    What this cannot stop: creating a *new* entry where none existed (a repository without
//!    `.git/hooks`, a workspace without `.envrc`), because the directory it is created in
//!    is writable. The transactional workspace of the policy layer closes that by showing
//!    the caller the diff before anything reaches the host.
//!
//! Decisions about host paths (a trust tier's "paths within /tmp") are made on the path a
//! grant binds, not the one it names: [`pin`] resolves every grant of the caps with
//! [`resolve`] and replaces it by its pinned form ([`ResolvedGrant::pinned`]: the
//! resolved path, symlinks no longer followed), so checking the pinned caps checks what a
//! backend will bind, and running them binds exactly that (a symlink swapped in later
//! fails the run). The `strata` facade does this for every run under a tier.

use std::collections::BTreeSet;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::caps::{Access, Caps, Mount};
use crate::error::{Error, Result};

/// What a host path is, without following a symlink at its last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

impl From<std::fs::FileType> for EntryKind {
    fn from(kind: std::fs::FileType) -> Self {
        if kind.is_symlink() {
            EntryKind::Symlink
        } else if kind.is_dir() {
            EntryKind::Dir
        } else if kind.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        }
    }
}

/// The host facts grant resolution needs. Implemented by each backend over the real file
/// system, and by fakes in tests.
pub trait HostLookup {
    /// What is at `path`, not following a symlink at its last component (`lstat`).
    fn entry(&self, path: &Path) -> io::Result<EntryKind>;
    /// The stored target of the symlink at `path` (`readlink`), for error messages.
    fn link_target(&self, path: &Path) -> io::Result<PathBuf>;
    /// `path` with every symlink resolved (`realpath`). Used only for grants that follow
    /// symlinks.
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf>;
}

/// The real host's file system (`lstat`, `readlink`, `realpath`), the lookup every backend
/// resolves grants against outside tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealHost;

impl HostLookup for RealHost {
    fn entry(&self, path: &Path) -> io::Result<EntryKind> {
        Ok(std::fs::symlink_metadata(path)?.file_type().into())
    }
    fn link_target(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        std::fs::canonicalize(path)
    }
}

/// A grant's host path after resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedGrant {
    /// The host path the caller gave.
    pub requested: PathBuf,
    /// The host path to mount: absolute and free of symlinks. Equal to `requested` unless
    /// symlinks were followed.
    pub resolved: PathBuf,
    /// The resolved path is a directory (otherwise a file or other non-directory).
    pub is_dir: bool,
    /// At least one symlink was followed (only possible with [`Mount::follow_symlinks`]).
    pub followed_symlinks: bool,
}

impl ResolvedGrant {
    /// `mount` (the mount this was resolved from) bound at exactly the resolved path: its
    /// host path replaced by [`ResolvedGrant::resolved`] and symlinks no longer followed.
    /// A backend resolving it again finds the same path, or refuses the run if a symlink
    /// was swapped in since: it cannot be redirected. Policy decisions on host paths
    /// (the policy crate's `Tier::check`) are made on pinned mounts, and the pinned mount is
    /// what runs, so the path decided on is the path bound.
    pub fn pinned(&self, mount: &Mount) -> Mount {
        let mut pinned = mount.clone();
        pinned.host = self.resolved.clone();
        pinned.follow_symlinks = false;
        pinned
    }
}

/// Caps whose grants were resolved on the host and pinned ([`pin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    /// The caps with every mount replaced by its pinned form ([`ResolvedGrant::pinned`]).
    pub caps: Caps,
    /// The grants that followed symlinks to get there (requested and resolved host paths),
    /// in the order of the caps' mounts.
    pub followed: Vec<ResolvedGrant>,
}

/// Resolves every grant of `caps` on `host` ([`resolve`]: a symlink refuses a grant that
/// does not follow symlinks; one that does is resolved with
/// [`HostLookup::canonicalize`]) and pins it to its resolved path. Checks that decide on
/// host paths take the pinned caps: the paths in them are the paths a backend binds (it
/// refuses, rather than follows, a symlink found there later). Errors as [`resolve`]
/// ([`Error::InvalidRequest`]: a missing path, a symlink in a grant that does not follow
/// them).
pub fn pin<H: HostLookup + ?Sized>(caps: &Caps, host: &H) -> Result<Pinned> {
    let mut pinned = caps.clone();
    let mut followed = Vec::new();
    for mount in &mut pinned.mounts {
        let grant = resolve(mount, host)?;
        *mount = grant.pinned(mount);
        if grant.followed_symlinks {
            followed.push(grant);
        }
    }
    Ok(Pinned {
        caps: pinned,
        followed,
    })
}

/// Makes a caller's host path absolute against `cwd`, lexically: `.` components and
/// repeated slashes are dropped, and `..` is refused rather than resolved (resolving it
/// needs the file system, and a symlink before it would change its meaning). `cwd` must be
/// absolute (the process's current directory). Nothing on the host is touched.
pub fn absolute(path: &Path, cwd: &Path) -> Result<PathBuf> {
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("mount host path is empty"));
    }
    if !cwd.is_absolute() {
        return Err(Error::invalid(format!(
            "cannot make {} absolute: the current directory {} is not absolute",
            path.display(),
            cwd.display()
        )));
    }
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(Error::invalid(format!(
                    "mount host path {} contains '..': it is not resolved (a symlink before it would change its meaning); give the path without '..'",
                    joined.display()
                )))
            }
        }
    }
    Ok(out)
}

/// Resolves the host path of `mount` (absolute and normalized, as `Caps::validate`
/// requires) without following symlinks: every component is looked up with
/// [`HostLookup::entry`], and a symlink refuses the grant with
/// [`Error::InvalidRequest`] naming the path and the symlink, unless the mount says
/// [`Mount::follow_symlinks`]; then the path is resolved with
/// [`HostLookup::canonicalize`] and the result says so. A missing path, or one whose
/// parent is not a directory, is an [`Error::InvalidRequest`] too.
pub fn resolve<H: HostLookup + ?Sized>(mount: &Mount, host: &H) -> Result<ResolvedGrant> {
    let requested = &mount.host;
    let not_accessible = |e: &dyn std::fmt::Display| {
        Error::invalid(format!(
            "mount source {} is not accessible: {e}",
            requested.display()
        ))
    };
    let mut prefix = PathBuf::from("/");
    let mut kind = EntryKind::Dir;
    let mut followed = false;
    let mut parts = requested
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .peekable();
    while let Some(part) = parts.next() {
        if kind != EntryKind::Dir {
            return Err(not_accessible(&format!(
                "{} is not a directory",
                prefix.display()
            )));
        }
        prefix.push(part);
        kind = host.entry(&prefix).map_err(|e| not_accessible(&e))?;
        if kind == EntryKind::Symlink {
            if !mount.follow_symlinks {
                return Err(symlink_refused(mount, &prefix, host));
            }
            followed = true;
            break;
        }
        if parts.peek().is_none() {
            break;
        }
    }
    if !followed {
        return Ok(ResolvedGrant {
            requested: requested.clone(),
            resolved: requested.clone(),
            is_dir: kind == EntryKind::Dir,
            followed_symlinks: false,
        });
    }
    let resolved = host
        .canonicalize(requested)
        .map_err(|e| not_accessible(&e))?;
    let kind = host.entry(&resolved).map_err(|e| not_accessible(&e))?;
    if kind == EntryKind::Symlink || !resolved.is_absolute() {
        return Err(not_accessible(&format!(
            "it resolved to {}, which is not a real path",
            resolved.display()
        )));
    }
    Ok(ResolvedGrant {
        requested: requested.clone(),
        resolved,
        is_dir: kind == EntryKind::Dir,
        followed_symlinks: true,
    })
}

fn symlink_refused<H: HostLookup + ?Sized>(mount: &Mount, link: &Path, host: &H) -> Error {
    let target = host
        .link_target(link)
        .map(|t| format!(" (-> {})", t.display()))
        .unwrap_or_default();
    let flag = match mount.access {
        Access::ReadWrite => "--rw-follow",
        _ => "--ro-follow",
    };
    let what = if link == mount.host {
        format!("{} is a symlink{target}", link.display())
    } else {
        format!("its component {} is a symlink{target}", link.display())
    };
    Error::invalid(format!(
        "mount source {}: {what}; grants do not follow symlinks, so that a link planted by an earlier run cannot redirect a grant. Grant the real path, or opt in for this grant with follow_symlinks (CLI {flag}, Python \"follow_symlinks\": True, Node followSymlinks: true)",
        mount.host.display()
    ))
}

/// Which kind of entry a [`HostExecuted`] path must be to be protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A file or a directory, whichever exists.
    Any,
    /// Only a regular file (`.git` as a gitfile; a `.git` directory is covered by its
    /// `hooks` and `config` entries).
    File,
}

/// One path, relative to a writable grant's root, that the host executes or trusts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostExecuted {
    /// Path relative to the grant's root (`/`-separated, no `.` or `..`).
    pub path: &'static str,
    /// Which kind of entry is protected.
    pub expect: Expect,
    /// Who runs or trusts it, in one line.
    pub why: &'static str,
}

const fn entry(path: &'static str, why: &'static str) -> HostExecuted {
    HostExecuted {
        path,
        expect: Expect::Any,
        why,
    }
}

/// Paths inside a writable grant that the host later executes or trusts, reviewed one by
/// one. Existing ones are bound read-only (unless the caps opt out). Every entry applies
/// to every writable directory grant: shell start-up files are only ever found in home
/// directories, and binding a stray one read-only elsewhere costs nothing.
///
/// Deliberately left out: build files that tools edit as their normal work (`Makefile`,
/// `package.json` scripts, `build.rs`, `setup.py`, `pyproject.toml`, `Cargo.toml`,
/// `.gitattributes`). Building or testing a workspace runs its code anyway, so protecting
/// one of them would stop honest edits without making a later build safe; reviewing the
/// diff (the transactional workspace) is the defence there. Also left out: `.env` files
/// (data that applications and tools rewrite) and the rest of `.git` (objects, refs,
/// index: git inside the sandbox must still work).
pub const HOST_EXECUTED: &[HostExecuted] = &[
    entry(".git/hooks", "git runs these scripts on commit, merge, checkout and push"),
    entry(".git/config", "git runs commands it names: core.hooksPath, core.fsmonitor, core.sshCommand, filter and diff drivers, aliases"),
    HostExecuted {
        path: ".git",
        expect: Expect::File,
        why: "a gitfile (`gitdir: PATH`) points git at another repository, with its own hooks and config",
    },
    entry(".gitmodules", "git submodule commands fetch the URLs and update the paths it names"),
    entry(".husky", "husky's hook scripts, run by git through core.hooksPath"),
    entry(".pre-commit-config.yaml", "pre-commit installs and runs the hooks it lists on every commit"),
    entry(".envrc", "direnv evaluates it in the user's shell on `cd`"),
    entry(".vscode", "VS Code runs tasks (runOn: folderOpen), launch configurations and interpreter paths from it"),
    entry(".idea", "JetBrains IDEs run the run configurations and startup tasks it holds"),
    entry(".devcontainer", "dev container tools run its initializeCommand on the host"),
    entry(".github/workflows", "CI runs these workflows with the repository's secrets after a push"),
    entry(".gitlab-ci.yml", "GitLab CI runs its jobs with the project's secrets after a push"),
    entry(".cargo/config.toml", "cargo runs the runners, rustc wrappers and aliases it sets"),
    entry(".cargo/config", "cargo's older name for .cargo/config.toml"),
    entry(".npmrc", "npm reads registries, credentials and script-shell/node-options from it"),
    entry(".yarnrc.yml", "yarn runs the yarnPath script and plugins it names"),
    entry(".pypirc", "twine and setuptools send credentials to the repositories it names"),
    entry(".bashrc", "bash runs it at every interactive start (home directories)"),
    entry(".bash_profile", "bash runs it at login (home directories)"),
    entry(".bash_login", "bash runs it at login (home directories)"),
    entry(".bash_logout", "bash runs it at logout (home directories)"),
    entry(".profile", "sh and bash run it at login (home directories)"),
    entry(".zshenv", "zsh runs it at every start (home directories)"),
    entry(".zshrc", "zsh runs it at every interactive start (home directories)"),
    entry(".zprofile", "zsh runs it at login (home directories)"),
    entry(".zlogin", "zsh runs it at login (home directories)"),
    entry(".config/fish", "fish runs config.fish and conf.d at start (home directories)"),
    entry(".gitconfig", "the user's git config: hooksPath, sshCommand, credential helpers (home directories)"),
    entry(".config/git", "the user's git config and attributes (home directories)"),
    entry(".ssh", "ssh trusts authorized_keys and runs ProxyCommand from config (home directories)"),
];

/// The host-executed paths of one writable directory grant, relative to its root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostExecutedPlan {
    /// Existing entries to bind read-only: relative path and whether it is a directory.
    /// None lies beneath another.
    pub read_only: Vec<(PathBuf, bool)>,
    /// Directories between the grant's root and a read-only entry (`.git` for
    /// `.git/hooks`), parents first. Backends bind each onto itself, still writable: a
    /// mount point cannot be renamed or removed, so the tool cannot move `.git` aside and
    /// put a directory of its own making in its place.
    pub pins: Vec<PathBuf>,
    /// Paths (relative to the root) in the way of an entry that exists but cannot be
    /// protected, with the reason: a symlink at or above it, which cannot be bound
    /// read-only and could simply be replaced.
    pub unprotectable: Vec<(PathBuf, String)>,
}

impl HostExecutedPlan {
    /// Whether nothing is protected and nothing is in the way.
    pub fn is_empty(&self) -> bool {
        self.read_only.is_empty() && self.unprotectable.is_empty()
    }

    /// The refusal of a run whose writable grant at host path `grant` holds unprotectable
    /// host-executed paths ([`Error::InvalidRequest`], naming each and the ways out), or
    /// `None` when everything found can be protected.
    pub fn refusal(&self, grant: &Path) -> Option<Error> {
        if self.unprotectable.is_empty() {
            return None;
        }
        let found: Vec<String> = self
            .unprotectable
            .iter()
            .map(|(path, why)| format!("{} is {why}", grant.join(path).display()))
            .collect();
        Some(Error::invalid(format!(
            "cannot keep the host-executed paths of the writable grant {} read-only: {}. Replace the symlink with what it points to, grant {} read-only, or let the tool write host-executed paths (protect_host_executed: false; CLI --allow-host-executed-writes)",
            grant.display(),
            found.join("; "),
            grant.display()
        )))
    }
}

/// The [`HOST_EXECUTED`] entries that exist inside the writable directory grant whose
/// (resolved, symlink-free) host path is `root`. Entries are matched relative to `root`
/// and relative to each of its ancestors, so a grant of `ws/.git` protects its `hooks`;
/// an entry that *is* the grant's root is the caller's explicit choice and not protected.
/// Each entry is looked up component by component without following symlinks: a missing
/// component means there is nothing to protect; a symlink in the way makes the entry
/// unprotectable.
pub fn host_executed<H: HostLookup + ?Sized>(root: &Path, host: &H) -> HostExecutedPlan {
    let mut candidates: BTreeSet<PathBuf> = BTreeSet::new();
    let mut wanted: Vec<(PathBuf, Expect)> = Vec::new();
    for base in root.ancestors() {
        for item in HOST_EXECUTED {
            let full = base.join(item.path);
            let Ok(rel) = full.strip_prefix(root) else {
                continue;
            };
            if rel.as_os_str().is_empty() || !candidates.insert(rel.to_path_buf()) {
                continue;
            }
            wanted.push((rel.to_path_buf(), item.expect));
        }
    }
    let mut plan = HostExecutedPlan::default();
    for (rel, expect) in wanted {
        let mut path = root.to_path_buf();
        let mut found = None;
        for part in rel.components() {
            path.push(part);
            match host.entry(&path) {
                Ok(EntryKind::Dir) => found = Some(true),
                Ok(EntryKind::File) | Ok(EntryKind::Other) => found = Some(false),
                Ok(EntryKind::Symlink) => {
                    let link = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                    if !plan.unprotectable.iter().any(|(p, _)| *p == link) {
                        plan.unprotectable.push((
                            link,
                            "a symlink, which cannot be bound read-only (the tool could replace it)"
                                .to_string(),
                        ));
                    }
                    found = None;
                    break;
                }
                Err(e) if is_absent(&e) => {
                    found = None;
                    break;
                }
                Err(e) => {
                    plan.unprotectable
                        .push((rel.clone(), format!("cannot look it up: {e}")));
                    found = None;
                    break;
                }
            }
            if path.strip_prefix(root).is_ok_and(|p| p != rel) && found == Some(false) {
                // A file where a directory was expected (a gitfile `.git`): nothing beneath.
                found = None;
                break;
            }
        }
        match (found, expect) {
            (Some(is_dir), Expect::Any) => plan.read_only.push((rel, is_dir)),
            (Some(false), Expect::File) => plan.read_only.push((rel, false)),
            _ => {}
        }
    }
    // Drop entries beneath another read-only directory: its bind already covers them.
    let dirs: Vec<PathBuf> = plan
        .read_only
        .iter()
        .filter(|(_, is_dir)| *is_dir)
        .map(|(p, _)| p.clone())
        .collect();
    plan.read_only
        .retain(|(p, _)| !dirs.iter().any(|d| p != d && p.starts_with(d)));
    plan.read_only
        .sort_by(|a, b| depth(&a.0).cmp(&depth(&b.0)).then(a.0.cmp(&b.0)));
    let protected: Vec<&PathBuf> = plan.read_only.iter().map(|(p, _)| p).collect();
    let mut pins = BTreeSet::new();
    for path in &protected {
        for parent in path.ancestors().skip(1) {
            if !parent.as_os_str().is_empty() && !protected.contains(&&parent.to_path_buf()) {
                pins.insert(parent.to_path_buf());
            }
        }
    }
    plan.pins = pins.into_iter().collect();
    plan.pins
        .sort_by(|a, b| depth(a).cmp(&depth(b)).then(a.cmp(b)));
    plan
}

fn depth(path: &Path) -> usize {
    path.components().count()
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::ErrorKind;

    /// A fake host: a map from absolute path to what is there (and a symlink's target).
    #[derive(Default)]
    struct Fake {
        entries: HashMap<PathBuf, (EntryKind, Option<PathBuf>)>,
    }

    impl Fake {
        fn dir(mut self, path: &str) -> Self {
            for ancestor in Path::new(path).ancestors() {
                self.entries
                    .entry(ancestor.to_path_buf())
                    .or_insert((EntryKind::Dir, None));
            }
            self
        }
        fn file(mut self, path: &str) -> Self {
            let path = Path::new(path);
            if let Some(parent) = path.parent() {
                self = self.dir(&parent.display().to_string());
            }
            self.entries
                .insert(path.to_path_buf(), (EntryKind::File, None));
            self
        }
        fn link(mut self, path: &str, target: &str) -> Self {
            let path = Path::new(path);
            if let Some(parent) = path.parent() {
                self = self.dir(&parent.display().to_string());
            }
            self.entries.insert(
                path.to_path_buf(),
                (EntryKind::Symlink, Some(target.into())),
            );
            self
        }
    }

    impl HostLookup for Fake {
        fn entry(&self, path: &Path) -> io::Result<EntryKind> {
            self.entries
                .get(path)
                .map(|(kind, _)| *kind)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
        fn link_target(&self, path: &Path) -> io::Result<PathBuf> {
            self.entries
                .get(path)
                .and_then(|(_, target)| target.clone())
                .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))
        }
        fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
            // Resolve absolute link targets, component by component.
            let mut out = PathBuf::from("/");
            for part in path.components().skip(1) {
                out.push(part);
                for _ in 0..8 {
                    match self.entries.get(&out) {
                        Some((EntryKind::Symlink, Some(target))) => out = target.clone(),
                        Some(_) => break,
                        None => return Err(io::Error::from(io::ErrorKind::NotFound)),
                    }
                }
            }
            Ok(out)
        }
    }

    fn ro(host: &str) -> Mount {
        Mount::new(host.into(), host.into(), Access::ReadOnly)
    }

    #[test]
    fn relative_paths_are_made_absolute_lexically() {
        let cwd = Path::new("/home/u/project");
        let cases = [
            ("ws/src", "/home/u/project/ws/src"),
            ("./ws//src/.", "/home/u/project/ws/src"),
            ("/abs/./path/", "/abs/path"),
            (".", "/home/u/project"),
        ];
        for (input, expected) in cases {
            assert_eq!(
                absolute(Path::new(input), cwd).expect(input),
                PathBuf::from(expected),
                "{input}"
            );
        }
        for bad in ["../secret", "ws/../../etc", "/a/../b", ""] {
            let err = absolute(Path::new(bad), cwd).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{bad}");
        }
        assert!(absolute(Path::new("x"), Path::new("rel")).is_err());
    }

    #[test]
    fn a_real_path_resolves_to_itself() {
        let host = Fake::default().dir("/ws/src").file("/ws/notes.txt");
        let grant = resolve(&ro("/ws/src"), &host).expect("resolve");
        assert_eq!(grant.resolved, PathBuf::from("/ws/src"));
        assert!(grant.is_dir && !grant.followed_symlinks);
        let file = resolve(&ro("/ws/notes.txt"), &host).expect("file");
        assert!(!file.is_dir);
    }

    #[test]
    fn a_symlink_in_any_component_is_refused_by_name() {
        let host = Fake::default()
            .dir("/secret")
            .link("/ws/src", "/secret")
            .link("/data", "/ws")
            .dir("/ws/real");
        for (path, component) in [("/ws/src", "/ws/src"), ("/data/real", "/data")] {
            let err = resolve(&ro(path), &host).expect_err(path);
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            let text = err.to_string();
            assert!(text.contains(path), "{text}");
            assert!(
                text.contains(&format!("{component} is a symlink")),
                "{text}"
            );
            assert!(
                text.contains("follow_symlinks"),
                "says how to opt in: {text}"
            );
        }
    }

    #[test]
    fn following_symlinks_is_per_grant_and_reported() {
        let host = Fake::default().dir("/secret/x").link("/ws/src", "/secret");
        let mut mount = ro("/ws/src/x");
        mount.follow_symlinks = true;
        let grant = resolve(&mount, &host).expect("follow");
        assert_eq!(grant.resolved, PathBuf::from("/secret/x"));
        assert!(grant.followed_symlinks && grant.is_dir);
        assert_eq!(grant.requested, PathBuf::from("/ws/src/x"));
    }

    #[test]
    fn missing_sources_and_files_as_directories_are_invalid() {
        let host = Fake::default().file("/ws/file");
        for path in ["/nope", "/ws/file/below"] {
            let err = resolve(&ro(path), &host).expect_err(path);
            assert_eq!(err.kind(), ErrorKind::InvalidRequest);
            assert!(err.to_string().contains("not accessible"), "{err}");
        }
    }

    #[test]
    fn host_executed_list_is_reviewed_data() {
        let mut seen = BTreeSet::new();
        for item in HOST_EXECUTED {
            assert!(seen.insert(item.path), "duplicate {}", item.path);
            assert!(!item.why.is_empty(), "{} says why", item.path);
            let path = Path::new(item.path);
            assert!(
                path.is_relative() && path.components().all(|c| matches!(c, Component::Normal(_))),
                "{} is a clean relative path",
                item.path
            );
        }
        for required in [
            ".git/hooks",
            ".git/config",
            ".gitmodules",
            ".envrc",
            ".vscode",
            ".idea",
            ".devcontainer",
            ".github/workflows",
            ".cargo/config.toml",
            ".pre-commit-config.yaml",
            ".husky",
            ".npmrc",
            ".bashrc",
        ] {
            assert!(seen.contains(required), "{required} is listed");
        }
        for left_out in ["Makefile", "package.json", ".env", ".git/objects"] {
            assert!(
                !seen.contains(left_out),
                "{left_out} is deliberately not listed"
            );
        }
    }

    #[test]
    fn existing_host_executed_paths_are_found_and_their_parents_pinned() {
        let host = Fake::default()
            .file("/ws/.git/hooks/pre-commit")
            .file("/ws/.git/config")
            .dir("/ws/.git/objects")
            .file("/ws/.envrc")
            .file("/ws/.github/workflows/ci.yml")
            .file("/ws/Makefile")
            .file("/ws/src/main.rs");
        let plan = host_executed(Path::new("/ws"), &host);
        let ro: Vec<(String, bool)> = plan
            .read_only
            .iter()
            .map(|(p, d)| (p.display().to_string(), *d))
            .collect();
        assert_eq!(
            ro,
            [
                (".envrc".to_string(), false),
                (".git/config".to_string(), false),
                (".git/hooks".to_string(), true),
                (".github/workflows".to_string(), true),
            ]
        );
        let pins: Vec<String> = plan.pins.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(pins, [".git", ".github"]);
        assert!(plan.unprotectable.is_empty());
    }

    #[test]
    fn a_gitfile_is_protected_but_a_git_directory_is_not_whole() {
        let host = Fake::default().file("/wt/.git");
        let plan = host_executed(Path::new("/wt"), &host);
        assert_eq!(plan.read_only, [(PathBuf::from(".git"), false)]);
        assert!(plan.pins.is_empty());
        let host = Fake::default().dir("/ws/.git/objects");
        assert!(host_executed(Path::new("/ws"), &host).is_empty());
    }

    #[test]
    fn a_grant_inside_a_repository_protects_what_lies_beneath_it() {
        let host = Fake::default()
            .file("/ws/.git/hooks/pre-push")
            .file("/ws/.git/config");
        let plan = host_executed(Path::new("/ws/.git"), &host);
        let ro: Vec<PathBuf> = plan.read_only.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(ro, [PathBuf::from("config"), PathBuf::from("hooks")]);
        assert!(plan.pins.is_empty());
        // Granting the hooks directory itself read-write is the caller's explicit choice.
        let plan = host_executed(Path::new("/ws/.git/hooks"), &host);
        assert!(plan.is_empty(), "{plan:?}");
    }

    #[test]
    fn symlinked_host_executed_paths_are_unprotectable() {
        let host = Fake::default()
            .link("/home/u/.bashrc", "/home/u/dotfiles/bashrc")
            .file("/home/u/dotfiles/bashrc")
            .link("/home/u/.git", "/elsewhere");
        let plan = host_executed(Path::new("/home/u"), &host);
        let names: Vec<String> = plan
            .unprotectable
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        assert!(names.contains(&".bashrc".to_string()), "{names:?}");
        assert!(names.contains(&".git".to_string()), "{names:?}");
        assert_eq!(names.len(), 2, "each symlink is named once: {names:?}");
        assert!(plan
            .unprotectable
            .iter()
            .all(|(_, why)| why.contains("symlink")));
        assert!(plan.read_only.is_empty());
        let err = plan.refusal(Path::new("/home/u")).expect("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
        let text = err.to_string();
        assert!(text.contains("/home/u/.bashrc is a symlink"), "{text}");
        assert!(text.contains("protect_host_executed: false"), "{text}");
    }

    #[test]
    fn nothing_to_protect_in_a_plain_directory() {
        let host = Fake::default().file("/out/result.txt");
        let plan = host_executed(Path::new("/out"), &host);
        assert!(plan.is_empty() && plan.pins.is_empty());
        assert!(plan.refusal(Path::new("/out")).is_none());
    }
}
