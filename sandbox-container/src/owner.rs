//! Who owns an engine container: a label naming the embedding process precisely enough
//! that a later Strata process can tell whether that owner is gone.
//!
//! An engine container outlives its embedder if the embedder is SIGKILLed mid-run (the
//! engine, not the embedder, is its parent). Each container carries
//! `org.strata.owner = BOOT_ID/PIDNS/PID/STARTTIME`; when a Strata process first talks to an
//! engine, it removes the containers whose owner ran on this boot, in this PID namespace,
//! and no longer exists (no such PID, or the PID was reused: another start time). Containers
//! of other machines, other boots or other PID namespaces sharing the engine are never
//! touched.

use std::fs;

/// The label holding the owner.
pub const OWNER_LABEL: &str = "org.strata.owner";

/// The owner of a container, as stored in [`OWNER_LABEL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Inode of `/proc/self/ns/pid`.
    pub pid_ns: u64,
    /// The embedding process.
    pub pid: u32,
    /// Its start time (clock ticks after boot, `/proc/PID/stat` field 22).
    pub start_time: u64,
}

impl Owner {
    /// This process, or `None` if /proc does not say.
    pub fn current() -> Option<Owner> {
        let pid = std::process::id();
        Some(Owner {
            boot_id: boot_id()?,
            pid_ns: pid_ns()?,
            pid,
            start_time: start_time(pid)?,
        })
    }

    /// The label value.
    pub fn label(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.boot_id, self.pid_ns, self.pid, self.start_time
        )
    }

    /// Parses a label value.
    pub fn parse(label: &str) -> Option<Owner> {
        let mut parts = label.split('/');
        let owner = Owner {
            boot_id: parts.next()?.to_string(),
            pid_ns: parts.next()?.parse().ok()?,
            pid: parts.next()?.parse().ok()?,
            start_time: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && !owner.boot_id.is_empty()).then_some(owner)
    }

    /// Whether `self` ran where `current` runs (same boot and PID namespace) and is gone.
    pub fn is_gone(&self, current: &Owner) -> bool {
        self.boot_id == current.boot_id
            && self.pid_ns == current.pid_ns
            && self.pid != current.pid
            && start_time(self.pid) != Some(self.start_time)
    }
}

fn boot_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty() && !id.contains('/')).then(|| id.to_string())
}

fn pid_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let (_, rest) = stat.rsplit_once(") ")?;
    // `rest` starts at field 3 (state); the start time is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_junk_is_refused() {
        let me = Owner::current().expect("this process has an owner identity");
        assert_eq!(Owner::parse(&me.label()), Some(me));
        for junk in ["", "a/b/c", "x/1/2/3/4", "/1/2/3", "b/ns/2/3"] {
            assert_eq!(Owner::parse(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn only_a_vanished_owner_on_this_boot_and_pid_namespace_is_gone() {
        let me = Owner::current().expect("owner");
        assert!(!me.is_gone(&me), "this process is alive");
        let parent = std::os::unix::process::parent_id();
        let alive = Owner {
            pid: parent,
            start_time: start_time(parent).expect("parent's start time"),
            ..me.clone()
        };
        assert!(!alive.is_gone(&me));
        let reused = Owner {
            start_time: alive.start_time + 1,
            ..alive.clone()
        };
        assert!(reused.is_gone(&me), "a reused PID is not the owner");
        let dead = Owner {
            pid: 4_194_304, // above the kernel's PID limit: never a live process
            ..me.clone()
        };
        assert!(dead.is_gone(&me));
        let other_boot = Owner {
            boot_id: "another-boot".into(),
            ..dead.clone()
        };
        assert!(!other_boot.is_gone(&me));
        let other_ns = Owner {
            pid_ns: me.pid_ns + 1,
            ..dead
        };
        assert!(!other_ns.is_gone(&me));
    }
}
