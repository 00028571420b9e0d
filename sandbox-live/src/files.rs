//! A live sandbox's files, for its clients: read, write, list, stat, mkdir, rename, remove,
//! trees copied in and out, and watches.
//!
//! The supervisor works on the sandbox's own mount tree through a descriptor of its root
//! directory that the sandbox's init handed over ([`sandbox_os::live::LiveProcess::files`]),
//! with the rules of a session's files ([`sandbox_os::file_tree`]): every path beneath that
//! root, no symlink ever followed (not even on the way), copies out of regular files and
//! directories only, copies in under a temporary name renamed into place, bounded. What the
//! host writes is given to the sandbox's user. A read-only mount inside stays read-only. No
//! exec is needed, so this works while the sandbox is paused too.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use sandbox_core::Error;
use sandbox_os::file_tree::FileTree;

use crate::protocol::{decode, encode, Reply};
use crate::server::Context;

/// Most bytes one `read` or `write` carries (they travel in one message): 32 MiB. Larger
/// files go with `upload` and `download`, file to file.
pub const MAX_INLINE: u64 = 32 << 20;

/// Most bytes one `upload` or `download` copies: 4 GiB.
pub const MAX_TRANSFER: u64 = 4 << 30;

/// A file operation on a live sandbox. Sandbox paths are absolute, or relative to the
/// sandbox's working directory; host paths (upload source, download destination) are
/// absolute paths of the host, used with the supervisor's rights (its owner's).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "file_op", rename_all = "snake_case", deny_unknown_fields)]
pub enum FileRequest {
    /// A regular file's contents (at most [`MAX_INLINE`]).
    Read {
        /// The file.
        path: String,
    },
    /// Replaces (or creates) a file with `data` (base64), making missing parents.
    Write {
        /// The file.
        path: String,
        /// Base64 of the contents.
        data: String,
    },
    /// A directory's entries.
    List {
        /// The directory.
        path: String,
    },
    /// One entry (a symlink is described, not followed).
    Stat {
        /// The entry.
        path: String,
    },
    /// Makes a directory.
    Mkdir {
        /// The directory.
        path: String,
        /// Make missing parents too; an existing directory is no error.
        #[serde(default)]
        parents: bool,
    },
    /// Renames an entry.
    Rename {
        /// The entry.
        from: String,
        /// Its new path.
        to: String,
    },
    /// Removes a file, symlink or directory tree.
    Remove {
        /// The entry.
        path: String,
    },
    /// Copies the host's file or directory `host` to `path` in the sandbox.
    Upload {
        /// Absolute host path.
        host: PathBuf,
        /// Where in the sandbox.
        path: String,
    },
    /// Copies `path` out of the sandbox to the host path `host`, which must not exist.
    Download {
        /// The entry in the sandbox.
        path: String,
        /// Absolute host path.
        host: PathBuf,
    },
    /// Streams changes under a directory until the client disconnects.
    Watch {
        /// The directory.
        path: String,
        /// Also every directory below it (and those made later).
        #[serde(default)]
        recursive: bool,
    },
}

/// Serves one file request (all but `watch`); the reply to send.
pub(crate) fn serve(context: &Context, request: FileRequest) -> Reply {
    match run(context, request) {
        Ok(reply) => reply,
        Err(error) => Reply::Error {
            error: (&error).into(),
        },
    }
}

fn run(context: &Context, request: FileRequest) -> Result<Reply, Error> {
    let workdir = workdir(context)?;
    let inside = |path: &str| relative(path, &workdir);
    let vm = context
        .sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(crate::held::Held::vm_files);
    if let Some(vm) = vm {
        return run_in_vm(&vm, request, &workdir);
    }
    match request {
        FileRequest::Read { path } => {
            let data = tree(context, MAX_INLINE)?.read_file(&inside(&path)?)?;
            Ok(Reply::FileData {
                data: encode(&data),
            })
        }
        FileRequest::Write { path, data } => {
            let bytes = decode(&data)?;
            tree(context, MAX_INLINE)?.write_file(&inside(&path)?, &bytes)?;
            Ok(Reply::Ok)
        }
        FileRequest::List { path } => Ok(Reply::Entries {
            entries: tree(context, 0)?.list(&inside(&path)?)?,
        }),
        FileRequest::Stat { path } => Ok(Reply::Entry {
            entry: tree(context, 0)?.stat(&inside(&path)?)?,
        }),
        FileRequest::Mkdir { path, parents } => {
            tree(context, 0)?.mkdir(&inside(&path)?, parents)?;
            Ok(Reply::Ok)
        }
        FileRequest::Rename { from, to } => {
            tree(context, 0)?.rename(&inside(&from)?, &inside(&to)?)?;
            Ok(Reply::Ok)
        }
        FileRequest::Remove { path } => {
            let rel = inside(&path)?;
            if rel.as_os_str().is_empty() {
                return Err(Error::invalid(
                    "remove: refusing to remove the sandbox's root",
                ));
            }
            tree(context, 0)?.remove(&rel)?;
            Ok(Reply::Ok)
        }
        FileRequest::Upload { host, path } => {
            let host = absolute_host(&host)?;
            let transfer = tree(context, MAX_TRANSFER)?.upload(&host, &inside(&path)?)?;
            Ok(Reply::Transferred { transfer })
        }
        FileRequest::Download { path, host } => {
            let host = absolute_host(&host)?;
            let transfer = tree(context, MAX_TRANSFER)?.download(&inside(&path)?, &host)?;
            Ok(Reply::Transferred { transfer })
        }
        FileRequest::Watch { .. } => Err(Error::invalid("watch is served as a stream")),
    }
}

/// Serves `request` on a microVM's files (through its agent), with the same paths and
/// limits.
fn run_in_vm(
    vm: &sandbox_vm::VmFiles,
    request: FileRequest,
    workdir: &Path,
) -> Result<Reply, Error> {
    let guest = |path: &str| -> Result<String, Error> {
        Ok(format!("/{}", relative(path, workdir)?.display()))
    };
    match request {
        FileRequest::Read { path } => Ok(Reply::FileData {
            data: encode(&vm.read_file(&guest(&path)?, MAX_INLINE)?),
        }),
        FileRequest::Write { path, data } => {
            let bytes = decode(&data)?;
            if bytes.len() as u64 > MAX_INLINE {
                return Err(Error::invalid(format!(
                    "write: {} bytes, more than the {MAX_INLINE} one write carries (upload it)",
                    bytes.len()
                )));
            }
            vm.write_file(&guest(&path)?, &bytes)?;
            Ok(Reply::Ok)
        }
        FileRequest::List { path } => Ok(Reply::Entries {
            entries: vm.list(&guest(&path)?)?,
        }),
        FileRequest::Stat { path } => Ok(Reply::Entry {
            entry: vm.stat(&guest(&path)?)?,
        }),
        FileRequest::Mkdir { path, parents } => {
            vm.mkdir(&guest(&path)?, parents)?;
            Ok(Reply::Ok)
        }
        FileRequest::Rename { from, to } => {
            vm.rename(&guest(&from)?, &guest(&to)?)?;
            Ok(Reply::Ok)
        }
        FileRequest::Remove { path } => {
            let path = guest(&path)?;
            if path == "/" {
                return Err(Error::invalid(
                    "remove: refusing to remove the sandbox's root",
                ));
            }
            vm.remove(&path)?;
            Ok(Reply::Ok)
        }
        FileRequest::Upload { host, path } => {
            let host = absolute_host(&host)?;
            let transfer = vm.upload(&host, &guest(&path)?, MAX_TRANSFER)?;
            Ok(Reply::Transferred { transfer })
        }
        FileRequest::Download { path, host } => {
            let host = absolute_host(&host)?;
            let transfer = vm.download(&guest(&path)?, &host, MAX_TRANSFER)?;
            Ok(Reply::Transferred { transfer })
        }
        FileRequest::Watch { .. } => Err(Error::invalid("watch is served as a stream")),
    }
}

/// The sandbox's tree, each copy bounded by `max` bytes.
pub(crate) fn tree(context: &Context, max: u64) -> Result<FileTree, Error> {
    let guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(sandbox) => sandbox.files(max),
        None => Err(Error::invalid("the sandbox has stopped")),
    }
}

/// The sandbox's default working directory (where relative paths start).
pub(crate) fn workdir(context: &Context) -> Result<PathBuf, Error> {
    let guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(sandbox) => Ok(sandbox.workdir().to_path_buf()),
        None => Err(Error::invalid("the sandbox has stopped")),
    }
}

/// `path` inside the sandbox (absolute, or relative to `workdir`) as a path relative to its
/// root. `..` is refused (a path never climbs), so is an empty path.
pub(crate) fn relative(path: &str, workdir: &Path) -> Result<PathBuf, Error> {
    if path.is_empty() || path.contains('\0') {
        return Err(Error::invalid(format!(
            "{path:?} is not a path in the sandbox"
        )));
    }
    let full = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        workdir.join(path)
    };
    let mut out = PathBuf::new();
    for part in full.components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(Error::invalid(format!(
                    "{path:?}: a path in the sandbox may not contain '..'"
                )))
            }
        }
    }
    Ok(out)
}

fn absolute_host(host: &Path) -> Result<PathBuf, Error> {
    if host.is_absolute() {
        Ok(host.to_path_buf())
    } else {
        Err(Error::invalid(format!(
            "host path {} must be absolute (the supervisor does not share your working directory)",
            host.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_never_climb_and_relative_ones_start_at_the_workdir() {
        let work = Path::new("/work");
        assert_eq!(
            relative("/etc/hosts", work).expect("abs"),
            Path::new("etc/hosts")
        );
        assert_eq!(relative("a/b", work).expect("rel"), Path::new("work/a/b"));
        assert_eq!(relative("/", work).expect("root"), Path::new(""));
        for bad in ["", "../x", "/work/../../etc", "a/../b", "x\0y"] {
            let err = relative(bad, work).expect_err(bad);
            assert_eq!(err.kind(), sandbox_core::ErrorKind::InvalidRequest, "{bad}");
        }
    }
}
