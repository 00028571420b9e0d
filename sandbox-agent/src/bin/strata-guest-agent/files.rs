//! File operations in a live guest ([`GuestFileOp`]), each on a thread of its own so a
//! slow one holds up no exec. In the VM the agent is root and the guest is the sandbox:
//! the host's no-follow rules are kept for the last component (`lstat`, `O_NOFOLLOW`), and
//! the host never follows what it gets back.

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::thread;

use sandbox_agent::protocol::{AgentMsg, GuestEntry, GuestFileOp, GuestFileResult, CHUNK};

use crate::{send, Port};

/// Most bytes one read returns.
const MAX_READ: u64 = (CHUNK as u64) * 2;

/// Runs `op` on a thread of its own and answers [`AgentMsg::FileDone`].
pub(crate) fn serve(port: &Port, id: u64, op: GuestFileOp) {
    let port = Arc::clone(port);
    thread::spawn(move || {
        let result = run(op).unwrap_or_else(|e| GuestFileResult::Failed {
            errno: e.raw_os_error().unwrap_or(libc::EIO),
            message: e.to_string(),
        });
        send(&port, &AgentMsg::FileDone { id, result });
    });
}

fn run(op: GuestFileOp) -> std::io::Result<GuestFileResult> {
    match op {
        GuestFileOp::Read { path, offset, len } => {
            let mut file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)?;
            if !file.metadata()?.is_file() {
                return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
            }
            file.seek(SeekFrom::Start(offset))?;
            let mut data = Vec::new();
            file.take(len.min(MAX_READ)).read_to_end(&mut data)?;
            Ok(GuestFileResult::Data { data })
        }
        GuestFileOp::Write {
            path,
            offset,
            data,
            mode,
        } => {
            let path = Path::new(&path);
            if offset == 0 {
                if let Some(parent) = path.parent() {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(parent)?;
                }
            }
            let mut file = OpenOptions::new()
                .write(true)
                .create(offset == 0)
                .truncate(offset == 0)
                .mode(if mode == 0 { 0o644 } else { mode & 0o7777 })
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?;
            file.seek(SeekFrom::Start(offset))?;
            file.write_all(&data)?;
            Ok(GuestFileResult::Ok)
        }
        GuestFileOp::List { path } => {
            let meta = fs::symlink_metadata(&path)?;
            if !meta.is_dir() {
                return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            let mut entries = Vec::new();
            for entry in fs::read_dir(&path)? {
                let entry = entry?;
                let meta = fs::symlink_metadata(entry.path())?;
                entries.push(describe(
                    entry.file_name().to_string_lossy().into_owned(),
                    &meta,
                ));
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(GuestFileResult::Entries { entries })
        }
        GuestFileOp::Stat { path } => {
            let meta = fs::symlink_metadata(&path)?;
            let name = Path::new(&path)
                .file_name()
                .map_or_else(|| "/".into(), |n| n.to_string_lossy().into_owned());
            Ok(GuestFileResult::Entry {
                entry: describe(name, &meta),
            })
        }
        GuestFileOp::Mkdir {
            path,
            parents,
            mode,
        } => {
            fs::DirBuilder::new()
                .recursive(parents)
                .mode(if mode == 0 { 0o755 } else { mode & 0o7777 })
                .create(&path)?;
            Ok(GuestFileResult::Ok)
        }
        GuestFileOp::Rename { from, to } => {
            fs::rename(from, to)?;
            Ok(GuestFileResult::Ok)
        }
        GuestFileOp::Remove { path } => {
            let meta = fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
            Ok(GuestFileResult::Ok)
        }
    }
}

fn describe(name: String, meta: &fs::Metadata) -> GuestEntry {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else {
        "other"
    };
    GuestEntry {
        name,
        kind: kind.into(),
        size: meta.size(),
        mode: meta.mode() & 0o7777,
    }
}
