//! Private directories of embedders that died without removing them (SIGKILL): each run's
//! directory (`$TMPDIR/strata-vm-*`) names its owner (`owner`: process id and start time),
//! and the first run of a process removes the directories whose owner is gone. Their QEMU
//! is already gone (it dies with its embedder); the disk images and sockets are not.

use std::path::Path;

/// The file in a run's private directory naming the process that made it.
pub const OWNER_FILE: &str = "owner";

/// `pid starttime` of this process (`/proc/self/stat` field 22).
pub fn this_process() -> String {
    let pid = std::process::id();
    format!("{pid} {}", start_time(pid).unwrap_or_default())
}

fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split(' ').nth(19).map(str::to_string)
}

/// Whether the process an owner file names still exists (the same process: its start time
/// matches, so a reused pid is not mistaken for it).
fn alive(owner: &str) -> bool {
    let mut parts = owner.split_whitespace();
    let (Some(pid), Some(start)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    start_time(pid).is_some_and(|s| s == start)
}

/// A new private run directory `$TMPDIR/strata-vm-*` (0700) naming this process as its
/// owner (in an owner-only file).
///
/// # Errors
/// When it cannot be made.
pub fn run_dir() -> std::io::Result<sandbox_os::private::PrivateDir> {
    let dir = sandbox_os::private::PrivateDir::new("strata-vm-")?;
    sandbox_os::private::write(&dir.path().join(OWNER_FILE), this_process())?;
    Ok(dir)
}

/// Removes the `strata-vm-*` directories under `tmp` whose owner is gone; returns how many.
/// Directories without an owner file (another user's, or being created) are left alone.
pub fn sweep(tmp: &Path) -> usize {
    sweep_prefix(tmp, "strata-vm-")
}

/// Like [`sweep`], for the directories whose name starts with `prefix` (sessions use
/// `strata-session-`).
pub fn sweep_prefix(tmp: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(prefix) {
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(entry.path().join(OWNER_FILE)) else {
            continue;
        };
        if alive(&owner) || !ours(&entry.path()) {
            continue;
        }
        unmount_beneath(&entry.path());
        if std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether `dir` is a real directory of this user's.
fn ours(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.file_type().is_dir() && m.uid() == rustix::process::geteuid().as_raw())
}

/// Unmounts what a dead embedder mounted on the directories directly in `dir` (a
/// session's size-limited tmpfs on `root`), so removing `dir` cannot fail on a busy mount.
fn unmount_beneath(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.file_type().is_dir() && meta.dev() != top.dev() {
            let _ = rustix::mount::unmount(
                entry.path().as_path(),
                rustix::mount::UnmountFlags::DETACH | rustix::mount::UnmountFlags::NOFOLLOW,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        assert!(alive(&this_process()));
        assert!(!alive("999999999 1"));
        let pid = std::process::id();
        assert!(!alive(&format!("{pid} 1")), "a reused pid is not the owner");
    }
}
