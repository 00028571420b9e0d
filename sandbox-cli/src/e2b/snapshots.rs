//! Snapshots and fork of E2B sandboxes, on Strata's live snapshots
//! (`strata::live::SnapshotStore`): `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `DELETE /templates/{snapshot}`, `POST /sandboxes/{id}/fork`, and `POST /sandboxes` with a
//! snapshot as its template.
//!
//! A snapshot carries the sandbox's files (its `/tmp` and `/home/user`), caps and policy,
//! not its memory: a sandbox started from one, or forked, starts its processes anew (E2B's
//! `mode="filesystem"`; a memory snapshot, `mode="full"`, is refused by name). Each API key
//! has its own store under `--snapshot-dir`; another key's snapshots are "not found".

use std::collections::BTreeMap;
use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use strata::live::{LiveSandbox, SnapshotInfo, SnapshotStore, MAX_FORK};
use strata::{Error, Net};

use super::control::{self, Answer, NewEntry, Refusal};
use super::http;
use super::registry::{self, Entry};
use super::Server;

/// The tag of every snapshot's id (E2B's ids are `name:tag`; a snapshot here has one build).
const TAG: &str = ":default";

/// Seconds a forked sandbox lives without a `timeout` (the spec's default).
const FORK_TIMEOUT_S: u64 = 15;

#[derive(Deserialize, Default)]
struct SnapshotRequest {
    name: Option<String>,
    /// `true` asks for a memory snapshot (not built for live sandboxes' files-only
    /// snapshots); unset or `false`: the filesystem.
    memory: Option<bool>,
}

#[derive(Deserialize, Default)]
struct ForkRequest {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// A snapshot of a key, found for `POST /sandboxes`.
pub struct Found {
    pub store: SnapshotStore,
    pub name: String,
    /// Whether its caps have any network.
    pub internet: bool,
}

/// The snapshot name in a template or snapshot id: `name`, `name:default`.
fn name_of(id: &str) -> &str {
    id.strip_suffix(TAG).unwrap_or(id)
}

/// The spec's `SnapshotInfo` of `info`.
fn info_json(info: &SnapshotInfo) -> Value {
    let id = format!("{}{TAG}", info.name);
    let names: Vec<&str> = if info.name == info.id {
        Vec::new()
    } else {
        vec![id.as_str()]
    };
    json!({ "snapshotID": id, "names": names })
}

fn store_of(server: &Server, key: usize) -> Result<SnapshotStore, Refusal> {
    Ok(server.registry.snapshots(key)?)
}

fn not_found(template: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        format!(
            "template {template:?} not found: this server has the template \"base\" (the host \
             userland: bash, coreutils, python3) and this API key's snapshots (template builds \
             are not served)"
        ),
    )
}

/// Runs `work` (snapshot stores and live sandboxes block) off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, format!("a worker: {e}")))?
}

/// The snapshot `template` names among `key`'s, checked (seal, owner, every file).
///
/// # Errors
/// 404 when the key has none of that name; 403 when it was altered.
pub async fn find(server: &Arc<Server>, key: usize, template: &str) -> Result<Found, Refusal> {
    let server = server.clone();
    let template = template.to_string();
    blocking(move || {
        let store = store_of(&server, key)?;
        let name = name_of(&template).to_string();
        if !store.list()?.iter().any(|info| info.name == name) {
            return Err(not_found(&template));
        }
        let verified = store.load(&name)?;
        let internet = !matches!(verified.caps().net, Net::None);
        Ok(Found {
            store,
            name,
            internet,
        })
    })
    .await
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's files, caps and policy, kept in the
/// key's store until deleted (the sandbox is paused while its files are copied).
pub async fn create(server: &Arc<Server>, key: usize, id: &str, body: &[u8]) -> Answer {
    let entry = control::found(server, key, id)?;
    let asked: SnapshotRequest = control::parse(body)?;
    if asked.memory == Some(true) {
        return Err(Refusal::bad(
            "a memory snapshot (mode \"full\") is not built for this server's sandboxes: their \
             snapshots carry files, caps and policy; ask for mode=\"filesystem\"",
        ));
    }
    let name = asked.name.map(|n| name_of(&n).to_string());
    server.audit(
        "e2b.snapshot",
        "granted",
        format!(
            "sandbox {id} name {}",
            name.as_deref().unwrap_or("(its id)")
        ),
    )?;
    let taking = server.clone();
    let info = blocking(move || {
        let store = store_of(&taking, key)?;
        Ok(entry.live.snapshot(&store, name.as_deref())?)
    })
    .await?;
    Ok(http::json(StatusCode::CREATED, &info_json(&info)))
}

/// `GET /snapshots`: the key's snapshots, oldest first, filtered by `sandboxID` (the
/// sandbox they were taken of) and `name`, in pages of `limit` (default 100) after
/// `nextToken` (the last name of the previous page).
pub async fn list(server: &Arc<Server>, key: usize, query: &BTreeMap<String, String>) -> Answer {
    let listing = server.clone();
    let all = blocking(move || Ok(store_of(&listing, key)?.list()?)).await?;
    let source = query.get("sandboxID");
    let name = query.get("name").map(|n| name_of(n).to_string());
    let kept: Vec<&SnapshotInfo> = all
        .iter()
        .filter(|info| {
            source.is_none_or(|wanted| {
                server.registry.e2b_id_of(&info.source).as_ref() == Some(wanted)
            })
        })
        .filter(|info| {
            name.as_ref()
                .is_none_or(|n| n == &info.name || n == &info.id)
        })
        .collect();
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let start = query.get("nextToken").map_or(0, |token| {
        kept.iter()
            .position(|info| &info.name == token)
            .map_or(kept.len(), |i| i + 1)
    });
    let page: Vec<&SnapshotInfo> = kept.iter().skip(start).take(limit).copied().collect();
    let values: Vec<Value> = page.iter().map(|info| info_json(info)).collect();
    let mut response = http::json(StatusCode::OK, &Value::Array(values));
    if start + page.len() < kept.len() {
        if let Some(Ok(token)) = page.last().map(|info| info.name.parse()) {
            response.headers_mut().insert("x-next-token", token);
        }
    }
    Ok(response)
}

/// `DELETE /templates/{id}`: removes the key's snapshot `id` (templates proper are not
/// served here, so any other id is not found).
pub async fn delete(server: &Arc<Server>, key: usize, template: &str) -> Answer {
    let name = name_of(template).to_string();
    server.audit("e2b.snapshot.delete", "granted", format!("snapshot {name}"))?;
    let removing = server.clone();
    let template = template.to_string();
    blocking(move || {
        let store = store_of(&removing, key)?;
        if !store.list()?.iter().any(|info| info.name == name) {
            return Err(not_found(&template));
        }
        Ok(store.remove(&name)?)
    })
    .await?;
    Ok(http::empty(StatusCode::NO_CONTENT))
}

/// `POST /sandboxes/{id}/fork`: one snapshot of the sandbox (paused while its files are
/// copied, then resumed with its id and end time unchanged), `count` new sandboxes started
/// from it, each succeeding or failing on its own; the snapshot is removed after.
pub async fn fork(server: &Arc<Server>, key: usize, id: &str, body: &[u8]) -> Answer {
    let parent = control::found(server, key, id)?;
    let asked: ForkRequest = control::parse(body)?;
    let count = asked.count.unwrap_or(1);
    let count = usize::try_from(count)
        .ok()
        .filter(|n| (1..=MAX_FORK).contains(n))
        .ok_or_else(|| Refusal::bad(format!("count {count}: 1 to {MAX_FORK}")))?;
    let timeout = control::seconds("timeout", asked.timeout, FORK_TIMEOUT_S)?;
    server.audit("e2b.fork", "granted", format!("sandbox {id} count {count}"))?;
    let places: Vec<_> = (0..count).map(|_| server.registry.reserve(key)).collect();
    let granted = places.iter().filter(|place| place.is_ok()).count();
    let forking = server.clone();
    let source = parent.clone();
    let mut started = blocking(move || Ok(start_children(&forking, &source, granted)?))
        .await?
        .into_iter();
    let mut results = Vec::with_capacity(count);
    for place in &places {
        let outcome = match place {
            Err(message) => Err(Refusal::new(StatusCode::TOO_MANY_REQUESTS, message.clone())),
            Ok(_) => match started.next() {
                Some(Ok(live)) => admit_child(server, key, &parent, timeout, live),
                Some(Err(error)) => Err(Refusal::from(error)),
                None => Err(Refusal::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "a fork was not attempted",
                )),
            },
        };
        results.push(match outcome {
            Ok(entry) => json!({ "sandbox": control::created(server, &entry) }),
            Err(refusal) => json!({
                "error": { "code": refusal.status.as_u16(), "message": refusal.message }
            }),
        });
    }
    drop(places);
    Ok(http::json(StatusCode::CREATED, &Value::Array(results)))
}

/// Snapshots `parent` once into the fork store and starts `count` sandboxes from it under
/// its template's sandbox (whose tier admits the snapshot's caps again), then removes it.
fn start_children(
    server: &Server,
    parent: &Entry,
    count: usize,
) -> Result<Vec<Result<LiveSandbox, Error>>, Error> {
    let settings = &server.registry.settings;
    let template = settings
        .template(&parent.template)
        .unwrap_or_else(|| settings.base());
    let parent = &parent.live;
    let store = server.registry.fork_store()?;
    let name = format!("fork-{}", registry::random_hex(8)?);
    parent.snapshot(&store, Some(&name))?;
    let registry = &server.registry;
    let children = (0..count)
        .map(|_| {
            template
                .sandbox
                .start_from(&store, &name, registry.start_options(template))
        })
        .collect();
    if let Err(e) = store.remove(&name) {
        eprintln!("strata serve: removing fork snapshot {name}: {e}");
    }
    Ok(children)
}

/// Registers a forked child: the parent's template, metadata, network and port access,
/// its own tokens and end time.
fn admit_child(
    server: &Server,
    key: usize,
    parent: &Entry,
    timeout: std::time::Duration,
    live: LiveSandbox,
) -> Result<Arc<Entry>, Refusal> {
    let id = match control::new_id() {
        Ok(id) => id,
        Err(error) => {
            let _ = live.stop_shared();
            return Err(error.into());
        }
    };
    let entry = control::new_entry(NewEntry {
        id,
        key,
        template: parent.template.clone(),
        metadata: parent.metadata.clone(),
        idempotency: None,
        internet: parent.internet,
        auto_pause: parent.auto_pause,
        public: parent.traffic_token.is_none(),
        timeout,
        live,
    })?;
    Ok(server.registry.insert(entry))
}
