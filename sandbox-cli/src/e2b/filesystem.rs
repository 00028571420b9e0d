//! envd's filesystem service (`filesystem.Filesystem`,
//! `../shared/e2b/envd/filesystem/filesystem.proto`) over Connect's JSON codec: Stat,
//! MakeDir, Move, ListDir (with depth), Remove, WatchDir (a stream) and the polled
//! watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher), on the live sandbox's files.
//!
//! A relative path is relative to the user's home (`/home/user`), as in envd. "Not found"
//! is decided from the parent directory's listing, never from an error's text. Live
//! sandboxes report no modification time, owner or symlink target: entries carry the
//! epoch, `user` and no target.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use strata::live::{ChangeKind, DirEntry, FileChange};
use strata::FileKind;

use super::connect::{self, Code, RpcError};
use super::http::{self, Body};
use super::registry::{self, lock, Entry, HOME, USER};
use super::{blocking, Server, MAX_BODY};

/// The most events a polled watcher keeps between two polls (older ones are dropped).
const MAX_BUFFERED: usize = 4096;
/// The most entries one ListDir answers.
const MAX_LISTED: usize = 10_000;
/// The most watchers one sandbox has.
const MAX_WATCHERS: usize = 64;

#[derive(Deserialize, Default)]
#[serde(default)]
struct PathRequest {
    path: String,
    depth: Option<u32>,
    recursive: bool,
    source: String,
    destination: String,
    #[serde(alias = "watcher_id")]
    #[serde(rename = "watcherId")]
    watcher_id: String,
}

/// A polled watcher (CreateWatcher): the events since the last GetWatcherEvents.
pub struct Watcher {
    events: Mutex<VecDeque<Value>>,
    stopped: AtomicBool,
}

/// Serves one call of the filesystem service.
pub async fn handle(
    server: Arc<Server>,
    entry: Arc<Entry>,
    request: Request<Incoming>,
) -> Response<Body> {
    let method = request
        .uri()
        .path()
        .trim_start_matches("/filesystem.Filesystem/")
        .to_string();
    let body = match http::read_body(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(e) => return e.response(),
    };
    if method == "WatchDir" {
        return match watch_dir(&entry, &body).await {
            Ok(response) => response,
            Err(error) => super::stream_failure(&error),
        };
    }
    let result = match connect::parse_unary::<PathRequest>(&body) {
        Err(error) => Err(error),
        Ok(request) => match method.as_str() {
            "Stat" => stat(&entry, &request.path)
                .await
                .map(|info| json!({ "entry": info })),
            "MakeDir" => make_dir(&server, &entry, &request.path).await,
            "Move" => rename(&server, &entry, &request.source, &request.destination).await,
            "ListDir" => list_dir(&entry, &request.path, request.depth.unwrap_or(1)).await,
            "Remove" => remove(&server, &entry, &request.path).await,
            "CreateWatcher" => create_watcher(&entry, &request.path, request.recursive).await,
            "GetWatcherEvents" => watcher_events(&entry, &request.watcher_id),
            "RemoveWatcher" => remove_watcher(&entry, &request.watcher_id),
            other => Err(RpcError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem/{other}: no such method"),
            )),
        },
    };
    super::unary_response(result)
}

/// `path` made absolute: relative ones (and `~/...`) are under the user's home.
pub fn absolute(path: &str) -> Result<String, RpcError> {
    if path.is_empty() {
        return Err(RpcError::new(Code::InvalidArgument, "path: empty"));
    }
    if path.contains('\0') {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "path: contains a NUL byte",
        ));
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else if path == "~" {
        HOME.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{HOME}/{rest}")
    } else {
        format!("{HOME}/{path}")
    };
    // Lexically clean: `.` and empty parts dropped, `..` pops (never above `/`).
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

fn parent_and_name(path: &str) -> (String, String) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/".into(), name.into()),
        Some((parent, name)) => (parent.into(), name.into()),
        None => ("/".into(), path.into()),
    }
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

/// envd's `EntryInfo` of `entry` at `path`.
fn entry_info(path: &str, entry: &DirEntry) -> Value {
    let kind = match entry.kind {
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    // Go's FileMode: the directory bit (1 << 31) over the permission bits.
    let mode = match entry.kind {
        FileKind::Dir => entry.mode | (1 << 31),
        FileKind::Symlink => entry.mode | (1 << 27),
        _ => entry.mode,
    };
    json!({
        "name": entry.name,
        "type": kind,
        "path": path,
        "size": entry.size.to_string(),
        "mode": mode,
        "permissions": permissions(entry.kind, entry.mode),
        "owner": USER,
        "group": USER,
        "modifiedTime": "1970-01-01T00:00:00Z",
    })
}

/// Whether `path` exists, from its parent's listing (so a failed call is told apart from a
/// missing entry without reading error text).
fn exists(live: &strata::live::LiveSandbox, path: &str) -> bool {
    if path == "/" {
        return true;
    }
    let (parent, name) = parent_and_name(path);
    live.list_dir(&parent)
        .map(|entries| entries.iter().any(|e| e.name == name))
        .unwrap_or(false)
}

fn not_found(path: &str) -> RpcError {
    RpcError::new(Code::NotFound, format!("path {path} not found"))
}

/// A failed call on `path`: NOT_FOUND when it does not exist, else the error itself.
fn failed(live: &strata::live::LiveSandbox, path: &str, error: strata::Error) -> RpcError {
    if exists(live, path) {
        RpcError::from(error)
    } else {
        not_found(path)
    }
}

async fn stat(entry: &Arc<Entry>, path: &str) -> Result<Value, RpcError> {
    let path = absolute(path)?;
    let asking = entry.clone();
    blocking(move || {
        let live = &asking.live;
        match live.stat(&path) {
            Ok(found) => Ok(entry_info(&path, &found)),
            Err(e) => Err(failed(live, &path, e)),
        }
    })
    .await
}

async fn make_dir(server: &Server, entry: &Arc<Entry>, path: &str) -> Result<Value, RpcError> {
    let path = absolute(path)?;
    server
        .audit(
            "e2b.files.mkdir",
            "granted",
            format!("sandbox {} {path}", entry.id),
        )
        .map_err(RpcError::from)?;
    let making = entry.clone();
    blocking(move || {
        let live = &making.live;
        if exists(live, &path) {
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!("directory {path} already exists"),
            ));
        }
        live.mkdir(&path, true).map_err(RpcError::from)?;
        let made = live.stat(&path).map_err(RpcError::from)?;
        Ok(json!({ "entry": entry_info(&path, &made) }))
    })
    .await
}

async fn rename(
    server: &Server,
    entry: &Arc<Entry>,
    source: &str,
    destination: &str,
) -> Result<Value, RpcError> {
    let source = absolute(source)?;
    let destination = absolute(destination)?;
    server
        .audit(
            "e2b.files.move",
            "granted",
            format!("sandbox {} {source} -> {destination}", entry.id),
        )
        .map_err(RpcError::from)?;
    let moving = entry.clone();
    blocking(move || {
        let live = &moving.live;
        if let Err(e) = live.rename(&source, &destination) {
            if !exists(live, &source) {
                return Err(not_found(&source));
            }
            // The file API renames within one of the sandbox's directory trees (its home,
            // /tmp, a mount); across two, the sandbox's own `mv` moves it.
            move_across(live, &source, &destination).map_err(|why| {
                RpcError::new(
                    Code::InvalidArgument,
                    format!("move {source}: {e}; mv: {why}"),
                )
            })?;
        }
        let moved = live.stat(&destination).map_err(RpcError::from)?;
        Ok(json!({ "entry": entry_info(&destination, &moved) }))
    })
    .await
}

/// Moves `source` to `destination` with `mv` inside the sandbox (at most 60 s).
fn move_across(
    live: &strata::live::LiveSandbox,
    source: &str,
    destination: &str,
) -> Result<(), String> {
    let request = strata::live::ExecRequest {
        argv: ["mv", "-T", "--", source, destination]
            .iter()
            .map(|part| part.to_string())
            .collect(),
        env: Default::default(),
        workdir: None,
        timeout_ms: Some(60_000),
        stdin: false,
        detach: false,
        tty: None,
    };
    let mut stderr = Vec::new();
    let exit = live
        .exec(request, None, |stream, bytes| {
            if matches!(stream, strata::live::Stream::Stderr) && stderr.len() < 4096 {
                stderr.extend_from_slice(bytes);
            }
        })
        .map_err(|e| e.to_string())?;
    if exit.exit_code == Some(0) {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&stderr).trim().to_string())
    }
}

async fn list_dir(entry: &Arc<Entry>, path: &str, depth: u32) -> Result<Value, RpcError> {
    let root = absolute(path)?;
    let depth = depth.clamp(1, 64);
    let asking = entry.clone();
    blocking(move || {
        let live = &asking.live;
        let mut out = Vec::new();
        let mut pending = vec![(root.clone(), 1u32)];
        while let Some((dir, level)) = pending.pop() {
            let entries = match live.list_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if dir == root => return Err(failed(live, &root, e)),
                // A subdirectory that went away (or cannot be read) while listing.
                Err(_) => continue,
            };
            for found in entries {
                let full = if dir == "/" {
                    format!("/{}", found.name)
                } else {
                    format!("{dir}/{}", found.name)
                };
                if found.kind == FileKind::Dir && level < depth {
                    pending.push((full.clone(), level + 1));
                }
                out.push(entry_info(&full, &found));
                if out.len() >= MAX_LISTED {
                    return Err(RpcError::new(
                        Code::ResourceExhausted,
                        format!(
                            "{root}: more than {MAX_LISTED} entries; list with a smaller depth"
                        ),
                    ));
                }
            }
        }
        Ok(json!({ "entries": out }))
    })
    .await
}

async fn remove(server: &Server, entry: &Arc<Entry>, path: &str) -> Result<Value, RpcError> {
    let path = absolute(path)?;
    server
        .audit(
            "e2b.files.remove",
            "granted",
            format!("sandbox {} {path}", entry.id),
        )
        .map_err(RpcError::from)?;
    let removing = entry.clone();
    blocking(move || {
        let live = &removing.live;
        match live.remove(&path) {
            Ok(()) => Ok(json!({})),
            Err(e) => Err(failed(live, &path, e)),
        }
    })
    .await
}

/// Whether `change` is of a file Strata's own upload writes first and renames into place
/// (`.strata-upload-*.tmp`): a client never made it and would see it as noise.
fn is_upload_temp(change: &FileChange) -> bool {
    let name = change.path.rsplit('/').next().unwrap_or("");
    name.starts_with(".strata-upload-") && name.ends_with(".tmp")
}

/// envd's `FilesystemEvent` of `change` under the watched directory `root`.
fn event_of(root: &str, change: &FileChange) -> Value {
    let name = change
        .path
        .strip_prefix(root)
        .map(|rest| rest.trim_start_matches('/'))
        .unwrap_or(&change.path);
    let kind = match change.kind {
        ChangeKind::Create => "EVENT_TYPE_CREATE",
        ChangeKind::Write => "EVENT_TYPE_WRITE",
        ChangeKind::Remove => "EVENT_TYPE_REMOVE",
        ChangeKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    json!({ "name": name, "type": kind })
}

/// Checks that `path` is a directory that exists (before a watch starts on it).
fn watchable(live: &strata::live::LiveSandbox, path: &str) -> Result<(), RpcError> {
    match live.stat(path) {
        Ok(found) if found.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(RpcError::new(
            Code::InvalidArgument,
            format!("path {path} is not a directory"),
        )),
        Err(e) => Err(failed(live, path, e)),
    }
}

async fn watch_dir(entry: &Arc<Entry>, body: &[u8]) -> Result<Response<Body>, RpcError> {
    let request: PathRequest = connect::stream_request(body)?;
    let root = absolute(&request.path)?;
    let permit = entry
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| RpcError::new(Code::ResourceExhausted, "too many streams open"))?;
    let checking = entry.clone();
    let checked = root.clone();
    blocking(move || watchable(&checking.live, &checked)).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let watching = entry.clone();
    let recursive = request.recursive;
    std::thread::spawn(move || {
        let _permit = permit;
        let start = connect::envelope(&json!({ "start": {} }));
        if tx.blocking_send(start).is_err() {
            return;
        }
        let result = watching.live.watch(&root, recursive, |change| {
            if is_upload_temp(change) {
                return !tx.is_closed();
            }
            let message = connect::envelope(&json!({ "filesystem": event_of(&root, change) }));
            tx.blocking_send(message).is_ok()
        });
        let error = result.err().map(RpcError::from);
        let _ = tx.blocking_send(connect::end_of_stream(error.as_ref()));
    });
    Ok(super::stream_response(rx))
}

async fn create_watcher(
    entry: &Arc<Entry>,
    path: &str,
    recursive: bool,
) -> Result<Value, RpcError> {
    let root = absolute(path)?;
    if lock(&entry.watchers).len() >= MAX_WATCHERS {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("{MAX_WATCHERS} watchers open in this sandbox: remove one first"),
        ));
    }
    let checking = entry.clone();
    let checked = root.clone();
    blocking(move || watchable(&checking.live, &checked)).await?;
    let id = registry::random_hex(12).map_err(RpcError::from)?;
    let watcher = Arc::new(Watcher {
        events: Mutex::new(VecDeque::new()),
        stopped: AtomicBool::new(false),
    });
    lock(&entry.watchers).insert(id.clone(), watcher.clone());
    let watching = entry.clone();
    std::thread::spawn(move || {
        let _ = watching.live.watch(&root, recursive, |change| {
            if watcher.stopped.load(Ordering::SeqCst) {
                return false;
            }
            if is_upload_temp(change) {
                return true;
            }
            let mut events = lock(&watcher.events);
            if events.len() >= MAX_BUFFERED {
                events.pop_front();
            }
            events.push_back(event_of(&root, change));
            true
        });
    });
    // The watch is registered by the time the supervisor answered its start; give the
    // inotify setup of a recursive watch a moment, as envd does before it answers.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(json!({ "watcherId": id }))
}

fn watcher_events(entry: &Entry, id: &str) -> Result<Value, RpcError> {
    let watcher = lock(&entry.watchers)
        .get(id)
        .cloned()
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id:?} not found")))?;
    let events: Vec<Value> = lock(&watcher.events).drain(..).collect();
    Ok(json!({ "events": events }))
}

fn remove_watcher(entry: &Entry, id: &str) -> Result<Value, RpcError> {
    let watcher = lock(&entry.watchers)
        .remove(id)
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("watcher {id:?} not found")))?;
    watcher.stopped.store(true, Ordering::SeqCst);
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_the_home_and_cleaned() {
        assert_eq!(absolute("a/b.txt").expect("ok"), "/home/user/a/b.txt");
        assert_eq!(absolute("~/x").expect("ok"), "/home/user/x");
        assert_eq!(absolute("/tmp/./a/../b").expect("ok"), "/tmp/b");
        assert_eq!(absolute("/../../etc").expect("ok"), "/etc");
        assert!(absolute("").is_err());
    }

    #[test]
    fn permissions_read_as_ls_does() {
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileKind::File, 0o640), "-rw-r-----");
    }
}
