//! The workspace's file-system primitives: walking, opening beneath a root without following
//! symlinks, copying and hashing, replacing entries, and clearing directories.

use super::*;

/// Every entry beneath `root`, sorted by path (parents first). Directories are opened one
/// at a time beneath `root` without following symlinks; entries that vanish are left out.
pub(super) fn walk(root: &OwnedFd) -> io::Result<Vec<Found>> {
    let mut out = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = open_dir(root, &rel).map_err(|e| at(&rel, e))?;
        for name in list(&dir).map_err(|e| at(&rel, e))? {
            let path = rel.join(&name);
            let Some(stat) = lstat_at(&dir, &name).map_err(|e| at(&path, e))? else {
                continue;
            };
            let found = Found::new(&dir, path, stat).map_err(|e| at(&rel.join(&name), e))?;
            if found.entry == Entry::Dir {
                pending.push(found.path.clone());
            }
            out.push(found);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

pub(super) fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// Opens the directory `rel` beneath `root` (`""` for `root` itself), never following a
/// symlink and never leaving `root`.
pub(crate) fn open_dir(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )?)
}

/// Opens the regular file `rel` beneath `root` for reading, never following a symlink.
pub(crate) fn open_beneath(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        beneath(),
    )?)
}

pub(crate) fn open_file_at(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens an absolute directory path with no symlink in any component.
pub(super) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Opens a directory of the staging area: the embedder's `$TMPDIR` may be reached through
/// symlinks, the last component (ours) must not be one.
pub(crate) fn open_private(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

pub(super) fn open_grant(grant_dir: &Path) -> Result<OwnedFd> {
    open_dir_path(grant_dir).map_err(|e| {
        let why = if e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) {
            "a symlink in its path (grants do not follow symlinks; give the real path)".to_string()
        } else {
            e.to_string()
        };
        Error::invalid(format!(
            "workspace grant {} cannot be staged: {why}",
            grant_dir.display()
        ))
    })
}

/// Creates `parent/strata-ws-XXXXXXXXXXXX` with mode 0700. `mkdir` never follows or
/// reuses an existing entry, so a name taken by someone else is simply skipped.
pub(super) fn private_dir(parent: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = io::Error::other("no free name");
    for _ in 0..16 {
        let path = parent.join(format!("strata-ws-{}", &random_hex()[..12]));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => {
                last = e;
                break;
            }
        }
    }
    Err(Error::internal(
        format!("creating a workspace directory in {}", parent.display()),
        last,
    ))
}

/// 16 hex digits from std's randomly seeded hasher, the time and the process id.
pub(crate) fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    hasher.write_u128(nanos);
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

pub(super) fn temp_name() -> String {
    format!(".strata-ws-{}.tmp", random_hex())
}

/// The names in `dir`, without `.` and `..`, sorted.
pub(crate) fn list(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = OsStr::from_bytes(entry?.file_name().to_bytes()).to_os_string();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// `lstat` of `name` in `dir`, `None` when it does not exist.
pub(crate) fn lstat_at(dir: &OwnedFd, name: &OsStr) -> io::Result<Option<Stat>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `path`'s parent (`""` at the top) and last component.
pub(crate) fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no file name", path.display())))?;
    Ok((path.parent().unwrap_or(Path::new("")), name))
}

pub(crate) fn names(path: &Path) -> impl Iterator<Item = &OsStr> {
    path.components().filter_map(|c| match c {
        Component::Normal(part) => Some(part),
        _ => None,
    })
}

pub(crate) fn bits(stat: &Stat) -> u32 {
    stat.st_mode & 0o7777
}

pub(crate) fn size(stat: &Stat) -> u64 {
    u64::try_from(stat.st_size).unwrap_or(0)
}

pub(crate) fn times(stat: &Stat) -> Timestamps {
    let mtime = Timespec {
        tv_sec: stat.st_mtime as _,
        tv_nsec: stat.st_mtime_nsec as _,
    };
    Timestamps {
        last_access: mtime,
        last_modification: mtime,
    }
}

/// Copies the regular file `src_name` in `src` to a new file `dst_name` in `dst` with the
/// same permission bits (minus setuid/setgid) and times; returns its hash.
pub(super) fn copy_file(
    src: &OwnedFd,
    src_name: &OsStr,
    dst: &OwnedFd,
    dst_name: &OsStr,
) -> io::Result<Hash> {
    let input = open_file_at(src, src_name)?;
    let stat = rustix::fs::fstat(&input)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("no longer a regular file"));
    }
    let output = rustix::fs::openat(
        dst,
        dst_name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let hash = copy_hashing(input, &output, u64::MAX)?.0;
    rustix::fs::fchmod(&output, Mode::from_raw_mode(bits(&stat) & 0o777))?;
    rustix::fs::futimens(&output, &times(&stat))?;
    Ok(hash)
}

/// Fills the new file `out` from `src` (exactly `stat`'s length), sets `mode` and the
/// times, and syncs it.
pub(super) fn fill(out: OwnedFd, src: OwnedFd, stat: &Stat, mode: u32) -> io::Result<Hash> {
    let (hash, count) = copy_hashing(src, &out, size(stat).saturating_add(1))?;
    if count != size(stat) {
        return Err(io::Error::other("it changed during the commit"));
    }
    rustix::fs::fchmod(&out, Mode::from_raw_mode(mode))?;
    rustix::fs::futimens(&out, &times(stat))?;
    rustix::fs::fsync(&out)?;
    Ok(hash)
}

/// Copies at most `max` bytes of `input` to `output`; returns their hash and count.
pub(super) fn copy_hashing(input: OwnedFd, output: &OwnedFd, max: u64) -> io::Result<(Hash, u64)> {
    let mut reader = std::fs::File::from(input).take(max);
    let mut writer = std::fs::File::from(output.try_clone()?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut count = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = buf.get(..n).unwrap_or_default();
        hasher.update(chunk);
        writer.write_all(chunk)?;
        count += n as u64;
    }
    Ok((hasher.finalize().into(), count))
}

/// The content hash and length of the regular file `rel` beneath `root`.
pub(super) fn hash_beneath(root: &OwnedFd, rel: &Path) -> io::Result<(Hash, u64)> {
    hash_file(open_beneath(root, rel)?)
}

pub(super) fn hash_file(file: OwnedFd) -> io::Result<(Hash, u64)> {
    let stat = rustix::fs::fstat(&file)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(io::Error::other("not a regular file"));
    }
    let mut reader = std::fs::File::from(file);
    let mut hasher = Sha256::new();
    let count = io::copy(&mut reader, &mut HashWriter(&mut hasher))?;
    Ok((hasher.finalize().into(), count))
}

pub(super) struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Renames `tmp` over `name` in `dir`; an (empty) directory at `name` is removed first.
/// For an addition (`added`) nothing may have appeared at `name` since the host check:
/// `RENAME_NOREPLACE` fails with `AlreadyExists` (plain rename where the file system
/// lacks it).
pub(crate) fn replace(dir: &OwnedFd, tmp: &str, name: &OsStr, added: bool) -> io::Result<()> {
    if added {
        match rustix::fs::renameat_with(dir, tmp, dir, name, RenameFlags::NOREPLACE) {
            Err(Errno::INVAL) | Err(Errno::NOSYS) => {}
            other => return Ok(other?),
        }
    }
    if let Some(stat) = lstat_at(dir, name)? {
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?;
        }
    }
    rustix::fs::renameat(dir, tmp, dir, name)?;
    Ok(())
}

/// Makes `name` in `dir` a directory (mode 0700 until the commit sets its bits),
/// replacing a file or symlink there.
pub(super) fn put_dir(dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match lstat_at(dir, name)? {
        Some(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => return Ok(()),
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty())?,
        None => {}
    }
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?;
    Ok(())
}

pub(super) fn put_link(dir: &OwnedFd, name: &OsStr, target: &Path, added: bool) -> io::Result<()> {
    let tmp = temp_name();
    rustix::fs::symlinkat(target, dir, tmp.as_str())?;
    let done = replace(dir, &tmp, name, added);
    if done.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    done
}

/// Removes everything in `dir`, making directories the run left unwritable writable first.
/// Never follows a symlink.
pub(crate) fn clear_dir(dir: &OwnedFd) -> io::Result<()> {
    let _ = rustix::fs::fchmod(dir, Mode::from_raw_mode(0o700));
    for name in list(dir)? {
        let Some(stat) = lstat_at(dir, &name)? else {
            continue;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
            rustix::fs::unlinkat(dir, &name, AtFlags::empty())?;
            continue;
        }
        let sub = match open_dir(dir, Path::new(&name)) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                rustix::fs::chmodat(dir, &name, Mode::from_raw_mode(0o700), AtFlags::empty())?;
                open_dir(dir, Path::new(&name))?
            }
            other => other?,
        };
        clear_dir(&sub)?;
        drop(sub);
        rustix::fs::unlinkat(dir, &name, AtFlags::REMOVEDIR)?;
    }
    Ok(())
}
