//! Host identities of tools: each agent gets its own unprivileged host uid and gid, stable
//! across runs; a run without an agent gets a fresh one; host root never runs a tool.
//!
//! The ids come from a range Strata owns ([`IdRange`]): the first `/etc/subuid` and
//! `/etc/subgid` entries of the embedding user when both exist, otherwise
//! [`IdRange::FIXED`]. The lower half of the range holds agents (offset 1, 2, ... in the
//! order they were first seen), the upper half is cycled through for fresh ids. Which agent
//! has which offset, and the next fresh offset, live in a small registry file per range
//! under the state directory ([`Registry`]), updated under an exclusive `flock` so
//! concurrent embedders agree.
//!
//! A root embedder's helper writes the user namespace's maps itself, from the initial
//! namespace. An unprivileged embedder with subordinate ids (`/etc/subuid` and
//! `/etc/subgid` entries, and shadow's `newuidmap`/`newgidmap`) gets them mapped the way
//! rootless container engines do; without them it keeps its own uid inside the sandbox and
//! the receipt says so ([`sandbox_core::IdentitySource::Embedder`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The setuid helper (shadow's `uidmap` package) that maps an unprivileged user's
/// subordinate uids into a user namespace.
pub const NEWUIDMAP: &str = "/usr/bin/newuidmap";
/// The same for gids.
pub const NEWGIDMAP: &str = "/usr/bin/newgidmap";

/// The id at which the embedder's own uid and gid appear inside a sandbox whose tool runs
/// under another host identity (so the tool can use the embedder's files in its grants).
pub const EMBEDDER_INSIDE_ID: u32 = 65533;

/// A block of host uids and gids Strata may give to tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdRange {
    /// First host uid of the block.
    pub uid_base: u32,
    /// First host gid of the block.
    pub gid_base: u32,
    /// Number of ids (at least 4).
    pub count: u32,
}

impl IdRange {
    /// The documented fixed block used when `/etc/subuid` has no entry for the embedder:
    /// host ids 1879048192 (0x70000000) to 1895825407, above systemd's container range
    /// (524288–1879048191) and below 2^31, which some tools mishandle.
    pub const FIXED: IdRange = IdRange {
        uid_base: 0x7000_0000,
        gid_base: 0x7000_0000,
        count: 0x0100_0000,
    };

    /// The block for `user`: its first entries in `subuid` and `subgid` (the contents of
    /// `/etc/subuid` and `/etc/subgid`), or `None` when either has none.
    pub fn from_subid(user: &str, uid: u32, subuid: &str, subgid: &str) -> Option<IdRange> {
        let first = |table: &str| -> Option<(u32, u32)> {
            table.lines().find_map(|line| {
                let mut parts = line.trim().split(':');
                let (who, base, count) = (parts.next()?, parts.next()?, parts.next()?);
                if who != user && who != uid.to_string() {
                    return None;
                }
                Some((base.parse().ok()?, count.parse().ok()?))
            })
        };
        let (uid_base, uid_count) = first(subuid)?;
        let (gid_base, gid_count) = first(subgid)?;
        let range = IdRange {
            uid_base,
            gid_base,
            count: uid_count.min(gid_count),
        };
        range.valid().then_some(range)
    }

    /// The block for the current embedder (`/etc/subuid` entry of `user`, else
    /// [`IdRange::FIXED`]).
    pub fn for_user(user: &str, uid: u32) -> IdRange {
        let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
        IdRange::from_subid(user, uid, &read("/etc/subuid"), &read("/etc/subgid"))
            .unwrap_or(IdRange::FIXED)
    }

    /// The subordinate ids of the unprivileged user `uid` (its `/etc/subuid` and
    /// `/etc/subgid` entries, by name or number), when `newuidmap` and `newgidmap` are
    /// installed to map them. `None` otherwise: the embedder keeps its own uid.
    pub fn subordinate(uid: u32) -> Option<IdRange> {
        if !(Path::new(NEWUIDMAP).exists() && Path::new(NEWGIDMAP).exists()) {
            return None;
        }
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        let name = passwd
            .lines()
            .find_map(|line| {
                let mut fields = line.split(':');
                let name = fields.next()?;
                (fields.nth(1)? == uid.to_string()).then(|| name.to_string())
            })
            .unwrap_or_default();
        let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
        IdRange::from_subid(&name, uid, &read("/etc/subuid"), &read("/etc/subgid"))
    }

    /// At least 4 ids, none of them 0, and no overflow.
    pub fn valid(&self) -> bool {
        self.count >= 4
            && self.uid_base > 0
            && self.gid_base > 0
            && self.uid_base.checked_add(self.count).is_some()
            && self.gid_base.checked_add(self.count).is_some()
    }

    fn half(&self) -> u32 {
        self.count / 2
    }

    fn ids(&self, offset: u32) -> HostIds {
        HostIds {
            uid: self.uid_base + offset,
            gid: self.gid_base + offset,
        }
    }
}

/// A host uid and gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostIds {
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
}

/// The registry file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// The range the offsets refer to; a registry made for another range is refused.
    range: Option<IdRange>,
    /// Agent name -> offset in the lower half.
    agents: std::collections::BTreeMap<String, u32>,
    /// Next offset in the upper half to hand out as a fresh id.
    next_fresh: u32,
}

/// The persistent map of agents to host ids, and the fresh-id counter.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    range: IdRange,
}

impl Registry {
    /// Default state directory: `$STRATA_STATE_DIR`, else `/var/lib/strata` for root, else
    /// `$XDG_STATE_HOME/strata` or `~/.local/state/strata`.
    pub fn default_dir(euid: u32) -> PathBuf {
        if let Some(dir) = std::env::var_os("STRATA_STATE_DIR") {
            return PathBuf::from(dir);
        }
        if euid == 0 {
            return PathBuf::from("/var/lib/strata");
        }
        if let Some(state) = std::env::var_os("XDG_STATE_HOME") {
            return PathBuf::from(state).join("strata");
        }
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/nonexistent".into());
        PathBuf::from(home).join(".local/state/strata")
    }

    /// A registry of `range` kept in `dir` (created, mode 0700, on first use).
    pub fn new(dir: impl Into<PathBuf>, range: IdRange) -> Self {
        Registry {
            dir: dir.into(),
            range,
        }
    }

    /// The registry file: one per range, so embedders configured with different ranges
    /// never mix offsets.
    pub fn path(&self) -> PathBuf {
        let r = self.range;
        self.dir.join(format!(
            "identities-{}-{}-{}.json",
            r.uid_base, r.gid_base, r.count
        ))
    }

    /// The ids of `agent`, assigning the next free ones the first time it is seen. Fails
    /// when the agents' half of the range is full.
    pub fn agent(&self, agent: &str) -> io::Result<HostIds> {
        self.update(true, |state, range| {
            if let Some(offset) = state.agents.get(agent) {
                return Ok(range.ids(*offset));
            }
            let offset = u32::try_from(state.agents.len())
                .ok()
                .and_then(|n| n.checked_add(1))
                .filter(|o| *o < range.half())
                .ok_or_else(|| {
                    io::Error::other(format!(
                        "the agents' half of the id range ({} ids) is full",
                        range.half()
                    ))
                })?;
            state.agents.insert(agent.to_string(), offset);
            Ok(range.ids(offset))
        })
    }

    /// Fresh ids for one sandbox: the next offset of the upper half, cycling. An id comes
    /// back only after `count / 2` other fresh ids.
    pub fn fresh(&self) -> io::Result<HostIds> {
        // Not synced: losing the last step of the counter in a crash only means the next
        // id comes again, after the sandboxes that had it died with the host.
        self.update(false, |state, range| {
            let span = range.count - range.half();
            let offset = range.half() + state.next_fresh % span;
            state.next_fresh = (state.next_fresh + 1) % span;
            Ok(range.ids(offset))
        })
    }

    /// Read-modify-write under an exclusive `flock`; `durable` syncs the file before the
    /// ids are used (an agent's assignment must survive a crash).
    fn update<T>(
        &self,
        durable: bool,
        change: impl FnOnce(&mut State, IdRange) -> io::Result<T>,
    ) -> io::Result<T> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.path())?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        let mut state = read_state(&mut file, &self.path())?;
        if let Some(recorded) = state.range {
            if recorded != self.range {
                return Err(io::Error::other(format!(
                    "{} was made for another id range ({recorded:?}, now {:?}); move it away to start over",
                    self.path().display(),
                    self.range
                )));
            }
        }
        state.range = Some(self.range);
        let value = change(&mut state, self.range)?;
        let bytes = serde_json::to_vec_pretty(&state).map_err(io::Error::other)?;
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(&bytes)?;
        if durable {
            file.sync_data()?;
        }
        Ok(value)
    }
}

fn read_state(file: &mut File, path: &Path) -> io::Result<State> {
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    if text.trim().is_empty() {
        return Ok(State::default());
    }
    serde_json::from_str(&text).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a valid identity registry: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> IdRange {
        IdRange {
            uid_base: 100_000,
            gid_base: 200_000,
            count: 8,
        }
    }

    #[test]
    fn agents_keep_their_ids_and_never_share_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::new(dir.path(), small());
        let alice = registry.agent("alice").expect("alice");
        let bob = registry.agent("bob").expect("bob");
        assert_ne!(alice, bob);
        assert_eq!(registry.agent("alice").expect("again"), alice);
        // A second registry on the same directory (another embedder) agrees.
        let other = Registry::new(dir.path(), small());
        assert_eq!(other.agent("bob").expect("bob"), bob);
        assert_eq!(alice.uid, 100_001);
        assert_eq!(alice.gid, 200_001);
    }

    #[test]
    fn agents_half_full_is_an_error_not_a_shared_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::new(dir.path(), small());
        for name in ["a", "b", "c"] {
            registry.agent(name).expect(name);
        }
        let err = registry.agent("d").expect_err("full");
        assert!(err.to_string().contains("full"), "{err}");
    }

    #[test]
    fn fresh_ids_cycle_through_the_upper_half_and_never_hit_an_agent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let registry = Registry::new(dir.path(), small());
        let agent = registry.agent("a").expect("agent");
        let fresh: Vec<u32> = (0..8)
            .map(|_| registry.fresh().expect("fresh").uid)
            .collect();
        assert_eq!(
            fresh,
            [100_004, 100_005, 100_006, 100_007, 100_004, 100_005, 100_006, 100_007]
        );
        assert!(!fresh.contains(&agent.uid));
    }

    #[test]
    fn ranges_keep_separate_registries_and_a_mismatched_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Registry::new(dir.path(), small()).agent("a").expect("a");
        let b = Registry::new(dir.path(), IdRange::FIXED)
            .agent("a")
            .expect("a");
        assert_ne!(a, b);
        // A registry file whose recorded range is not its own is refused, not reused.
        let fixed = Registry::new(dir.path(), IdRange::FIXED);
        std::fs::copy(Registry::new(dir.path(), small()).path(), fixed.path()).expect("copy");
        let err = fixed.agent("a").expect_err("other range");
        assert!(err.to_string().contains("another id range"), "{err}");
    }

    #[test]
    fn subid_entries_are_read_for_the_user_or_its_uid() {
        let subuid = "someone:1:2\nroot:100000:65536\n";
        let subgid = "0:300000:65536\n";
        assert_eq!(
            IdRange::from_subid("root", 0, subuid, subgid),
            Some(IdRange {
                uid_base: 100_000,
                gid_base: 300_000,
                count: 65_536
            })
        );
        assert_eq!(IdRange::from_subid("nobody", 65534, subuid, subgid), None);
        assert!(IdRange::FIXED.valid());
    }
}
