//! The image's `User`: `uid`, `uid:gid`, `name` or `name:group`, resolved against the
//! image's own `/etc/passwd` and `/etc/group`, read with `RESOLVE_IN_ROOT` so a symlinked
//! `/etc/passwd` in the image resolves inside the image, never on the host.

use std::io::Read;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use sandbox_core::{Error, Result};

/// Largest passwd or group file read.
const MAX_FILE: u64 = 1 << 20;

/// A resolved user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// Uid inside the sandbox.
    pub uid: u32,
    /// Gid inside the sandbox.
    pub gid: u32,
    /// Home directory from `/etc/passwd`, when the user is listed there.
    pub home: Option<String>,
}

/// Reads `/etc/<name>` of the image at `root` (empty when missing).
fn read_etc(root: &Path, name: &str) -> String {
    let Ok(dir) = rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    ) else {
        return String::new();
    };
    let Ok(fd) = rustix::fs::openat2(
        &dir,
        Path::new("etc").join(name),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    ) else {
        return String::new();
    };
    let mut text = String::new();
    let _ = std::fs::File::from(fd)
        .take(MAX_FILE)
        .read_to_string(&mut text);
    text
}

/// Parses a passwd/group file into its fields.
fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| f.len() >= 3)
}

/// Resolves the image's `User` (`None` or empty: root, uid 0 gid 0).
pub fn resolve(root: &Path, user: Option<&str>) -> Result<User> {
    let spec = user.unwrap_or("").trim();
    let (name, group) = match spec.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (spec, None),
    };
    let passwd = read_etc(root, "passwd");
    let entry = |pred: &dyn Fn(&[&str]) -> bool| {
        records(&passwd)
            .find(|f| pred(f))
            .map(|f| f.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    let (uid, mut gid, home) = if name.is_empty() {
        let found = entry(&|f| f[2] == "0");
        (0, 0, found.and_then(|f| f.get(5).cloned()))
    } else if let Ok(uid) = name.parse::<u32>() {
        let found = entry(&|f| f[2] == name);
        let gid = found
            .as_ref()
            .and_then(|f| f.get(3))
            .and_then(|g| g.parse().ok())
            .unwrap_or(uid);
        (uid, gid, found.and_then(|f| f.get(5).cloned()))
    } else {
        let found = entry(&|f| f[0] == name).ok_or_else(|| {
            Error::invalid(format!(
                "image user {name:?} is not in the image's /etc/passwd"
            ))
        })?;
        let uid = found[2]
            .parse()
            .map_err(|_| Error::invalid(format!("image user {name:?} has an invalid uid")))?;
        let gid = found.get(3).and_then(|g| g.parse().ok()).unwrap_or(uid);
        (uid, gid, found.get(5).cloned())
    };
    if let Some(group) = group.filter(|g| !g.is_empty()) {
        gid = match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => records(&read_etc(root, "group"))
                .find(|f| f[0] == group)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "image group {group:?} is not in the image's /etc/group"
                    ))
                })?,
        };
    }
    if uid == u32::MAX || gid == u32::MAX {
        return Err(Error::invalid("image user: uid/gid 4294967295 is invalid"));
    }
    Ok(User {
        uid,
        gid,
        home: home.filter(|h| h.starts_with('/')),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_and_named_users_resolve_against_the_image() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .expect("passwd");
        std::fs::write(root.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").expect("group");
        let user = |u: &str| resolve(root.path(), Some(u));
        assert_eq!(user("").expect("root").uid, 0);
        let app = user("app").expect("app");
        assert_eq!((app.uid, app.gid), (1000, 1001));
        assert_eq!(app.home.as_deref(), Some("/home/app"));
        assert_eq!(user("app:staff").expect("group").gid, 50);
        assert_eq!(user("1234:5").expect("numeric").uid, 1234);
        assert_eq!(user("1000").expect("listed").gid, 1001);
        assert!(user("ghost").is_err());
        assert!(user("app:nogroup").is_err());
    }

    #[test]
    fn symlinked_passwd_resolves_inside_the_image() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("etc")).expect("etc");
        // An absolute symlink must not read the host's /etc/passwd.
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("etc/passwd")).expect("symlink");
        assert!(resolve(root.path(), Some("root")).is_err());
    }
}
