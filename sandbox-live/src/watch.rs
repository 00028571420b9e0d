//! Watching a live sandbox's directory: the supervisor's inotify (tools in the sandbox
//! cannot use inotify: seccomp refuses it) on directories opened beneath the sandbox's
//! root, never following a symlink. Events stream to the client until it disconnects or
//! the sandbox stops.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use serde::{Deserialize, Serialize};

use sandbox_core::Error;
use sandbox_os::file_tree::{FileKind, FileTree};

use crate::protocol::Reply;
use crate::server::{send, Context, Out};

/// Most directories one watch follows: 4096.
pub const MAX_WATCHED_DIRS: usize = 4096;

/// What changed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// An entry was made (or moved in).
    Create,
    /// A file was written (reported when it is closed after writing, or modified).
    Write,
    /// An entry was removed (or moved out).
    Remove,
    /// Its permissions or owner changed.
    Chmod,
}

/// One change under a watched directory.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileChange {
    /// What happened.
    pub kind: ChangeKind,
    /// The entry's absolute path in the sandbox.
    pub path: String,
    /// Whether it is a directory.
    pub dir: bool,
}

const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::ONLYDIR);

/// The watched directories: inotify's watch descriptors and the sandbox paths they are.
struct Watches {
    inotify: OwnedFd,
    tree: FileTree,
    dirs: HashMap<i32, PathBuf>,
}

impl Watches {
    /// Watches the directory `rel` (relative to the sandbox's root); with `recursive`, its
    /// subdirectories too.
    fn add(&mut self, rel: &Path, recursive: bool) -> Result<(), Error> {
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Err(Error::invalid(format!(
                "watch: more than {MAX_WATCHED_DIRS} directories"
            )));
        }
        let dir = self.tree.open_dir(rel)?;
        // The watch is added through the descriptor's /proc link (followed on purpose: it
        // is the directory opened above, beneath the root with no symlink on the way).
        let by_fd = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = inotify::add_watch(&self.inotify, by_fd.as_str(), MASK)
            .map_err(|e| Error::internal("watch a directory", e.into()))?;
        self.dirs.insert(wd, rel.to_path_buf());
        if recursive {
            for entry in self.tree.list(rel)? {
                if entry.kind == FileKind::Dir {
                    self.add(&rel.join(&entry.name), true)?;
                }
            }
        }
        Ok(())
    }
}

/// Serves `watch`: sends `ok` once the watches are set, then a `file_event` per change,
/// until the client goes away or the sandbox stops. Returns whether the connection goes
/// on (it does not: a watch ends its connection).
pub(crate) fn watch(context: &Context, rel: &Path, recursive: bool, out: &Out) -> bool {
    let setup = || -> Result<Watches, Error> {
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Error::internal("start a watch", e.into()))?;
        let mut watches = Watches {
            inotify,
            tree: crate::files::tree(context, 0)?,
            dirs: HashMap::new(),
        };
        watches.add(rel, recursive)?;
        Ok(watches)
    };
    let mut watches = match setup() {
        Ok(watches) => watches,
        Err(error) => {
            let _ = send(
                out,
                &Reply::Error {
                    error: (&error).into(),
                },
            );
            return true;
        }
    };
    if send(out, &Reply::Ok).is_err() {
        return false;
    }
    context.table.lock().attached += 1;
    stream(context, &mut watches, recursive, out);
    context.table.lock().attached -= 1;
    false
}

fn stream(context: &Context, watches: &mut Watches, recursive: bool, out: &Out) {
    let client = match out.lock().unwrap_or_else(|e| e.into_inner()).try_clone() {
        Ok(stream) => stream,
        Err(_) => return,
    };
    let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
    loop {
        if context.table.lock().stopped {
            return;
        }
        let mut fds = [
            PollFd::new(&watches.inotify, PollFlags::IN),
            PollFd::new(&client, PollFlags::RDHUP),
        ];
        let second = rustix::time::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        if rustix::event::poll(&mut fds, Some(&second)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let hung_up = !fds[1].revents().is_empty();
        let ready = !fds[0].revents().is_empty();
        if hung_up {
            return;
        }
        if !ready {
            continue;
        }
        let mut changes = Vec::new();
        let mut new_dirs = Vec::new();
        {
            let mut reader = inotify::Reader::new(watches.inotify.as_fd(), &mut buf);
            while let Ok(event) = reader.next() {
                let Some(dir) = watches.dirs.get(&event.wd()) else {
                    continue;
                };
                let flags = event.events();
                let Some(name) = event.file_name() else {
                    continue;
                };
                let rel = dir.join(OsStr::from_bytes(name.to_bytes()));
                let is_dir = flags.contains(ReadFlags::ISDIR);
                let kind = if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
                    if is_dir && recursive {
                        new_dirs.push(rel.clone());
                    }
                    ChangeKind::Create
                } else if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                    ChangeKind::Remove
                } else if flags.intersects(ReadFlags::CLOSE_WRITE | ReadFlags::MODIFY) {
                    ChangeKind::Write
                } else if flags.contains(ReadFlags::ATTRIB) {
                    ChangeKind::Chmod
                } else {
                    continue;
                };
                changes.push(FileChange {
                    kind,
                    path: format!("/{}", rel.display()),
                    dir: is_dir,
                });
            }
        }
        for dir in new_dirs {
            // A directory made under a recursive watch is watched too (best effort: it may
            // be gone already, or the watch may be full).
            let _ = watches.add(&dir, true);
        }
        for change in changes {
            if send(out, &Reply::FileEvent { change }).is_err() {
                return;
            }
        }
    }
}
