//! The object store: every object of the four kinds, one global `resourceVersion` counter,
//! and the last events for watches (what etcd and the watch cache are to an API server).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Map, Value};
use tokio::sync::{broadcast, Notify};

use crate::crd::Kind;

/// An API error, answered as a `metav1.Status` body.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(kind: Kind, name: &str) -> ApiError {
        let mut e = ApiError::new(
            404,
            "NotFound",
            format!("{}.{} \"{name}\" not found", kind.plural(), kind.group()),
        );
        e.details = Some(details(kind, name));
        e
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// The `metav1.Status` JSON.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}

/// `details` of a Status about one object.
pub(crate) fn details(kind: Kind, name: &str) -> Value {
    json!({"name": name, "group": kind.group(), "kind": kind.plural()})
}

/// A watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change to the store.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub kind: Kind,
    pub namespace: String,
    pub type_: EventType,
    pub object: Arc<Value>,
}

type Key = (Kind, String, String);

struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Event>,
    /// The highest version whose event was dropped from `history` (0: none dropped yet).
    compacted: u64,
    max_history: usize,
}

/// The store. Writes bump the global version, append to the history, wake the controller
/// and reach every open watch.
pub(crate) struct Store {
    inner: Mutex<Inner>,
    live: broadcast::Sender<Event>,
    changed: Notify,
}

/// The capacity of the live event channel: a watch that falls this far behind gets a
/// `410 Gone` and must re-list, as with a real server's watch cache.
const LIVE_CAPACITY: usize = 4096;

impl Store {
    pub fn new(max_history: usize) -> Store {
        let (live, _) = broadcast::channel(LIVE_CAPACITY);
        Store {
            inner: Mutex::new(Inner {
                rv: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                max_history: max_history.max(1),
            }),
            live,
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every write is one
        // insert), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until something changed since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        self.lock().rv
    }

    fn record(&self, inner: &mut Inner, kind: Kind, ns: &str, type_: EventType, object: &Value) {
        let event = Event {
            rv: inner.rv,
            kind,
            namespace: ns.to_owned(),
            type_,
            object: Arc::new(object.clone()),
        };
        inner.history.push_back(event.clone());
        while inner.history.len() > inner.max_history {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.live.send(event);
        self.changed.notify_one();
    }

    /// Stores a new object (its `metadata.name` set); sets the server's metadata.
    pub fn create(&self, kind: Kind, ns: &str, mut object: Value) -> Result<Value, ApiError> {
        let name = name_of(&object).to_owned();
        let mut inner = self.lock();
        let key = (kind, ns.to_owned(), name.clone());
        if inner.objects.contains_key(&key) {
            let mut e = ApiError::new(
                409,
                "AlreadyExists",
                format!(
                    "{}.{} \"{name}\" already exists",
                    kind.plural(),
                    kind.group()
                ),
            );
            e.details = Some(details(kind, &name));
            return Err(e);
        }
        inner.rv += 1;
        let rv = inner.rv;
        let meta = metadata(&mut object);
        meta.insert("namespace".into(), json!(ns));
        meta.insert("uid".into(), json!(super::random::uid()));
        meta.insert("creationTimestamp".into(), json!(super::random::now()));
        meta.insert("generation".into(), json!(1));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.remove("generateName");
        inner.objects.insert(key, object.clone());
        self.record(&mut inner, kind, ns, EventType::Added, &object);
        Ok(object)
    }

    /// One object.
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&(kind, ns.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Replaces an object (`PUT`): its `metadata.resourceVersion` must be the stored one;
    /// `status` and the server's metadata are kept; `generation` grows when `spec` changes.
    pub fn replace(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        let Some(stored) = inner.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(kind, name));
        };
        let given = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let have = stored
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if given.is_empty() {
            let mut e = ApiError::new(
                422,
                "Invalid",
                format!(
                    "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    kind.name()
                ),
            );
            e.details = Some(details(kind, name));
            return Err(e);
        }
        if given != have {
            let mut e = ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {}.{} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    kind.plural(),
                    kind.group()
                ),
            );
            e.details = Some(details(kind, name));
            return Err(e);
        }
        let generation = stored
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if stored.get("spec") == object.get("spec") {
            generation
        } else {
            generation + 1
        };
        inner.rv += 1;
        let rv = inner.rv;
        if let Some(status) = stored.get("status") {
            object["status"] = status.clone();
        } else if let Some(o) = object.as_object_mut() {
            o.remove("status");
        }
        let meta = metadata(&mut object);
        for field in ["uid", "creationTimestamp", "namespace", "name"] {
            if let Some(v) = stored.pointer(&format!("/metadata/{field}")) {
                meta.insert(field.into(), v.clone());
            }
        }
        meta.insert("generation".into(), json!(generation));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        inner.objects.insert(key, object.clone());
        self.record(&mut inner, kind, ns, EventType::Modified, &object);
        Ok(object)
    }

    /// Changes a stored object in place (the controllers' writes: status, labels, owners).
    /// Nothing is written, and no event sent, when `change` leaves the object as it was.
    pub fn modify(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let key = (kind, ns.to_owned(), name.to_owned());
        let Some(stored) = inner.objects.get(&key) else {
            return Err(ApiError::not_found(kind, name));
        };
        let mut object = stored.clone();
        change(&mut object);
        if &object == stored {
            return Ok(object);
        }
        inner.rv += 1;
        let rv = inner.rv;
        metadata(&mut object).insert("resourceVersion".into(), json!(rv.to_string()));
        inner.objects.insert(key, object.clone());
        self.record(&mut inner, kind, ns, EventType::Modified, &object);
        Ok(object)
    }

    /// Deletes an object; the answer is the object as deleted (with a new version).
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let Some(mut object) = inner
            .objects
            .remove(&(kind, ns.to_owned(), name.to_owned()))
        else {
            return Err(ApiError::not_found(kind, name));
        };
        inner.rv += 1;
        let rv = inner.rv;
        metadata(&mut object).insert("resourceVersion".into(), json!(rv.to_string()));
        self.record(&mut inner, kind, ns, EventType::Deleted, &object);
        Ok(object)
    }

    /// The objects of `kind` in `ns` (every namespace when `None`) that `keep` accepts,
    /// and the version the list is at.
    pub fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        keep: impl Fn(&Value) -> bool,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == kind && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
            .filter(|v| keep(v))
            .cloned()
            .collect();
        (items, inner.rv)
    }

    /// The namespaces that hold any object.
    pub fn namespaces(&self) -> Vec<String> {
        let inner = self.lock();
        let mut out: Vec<String> = inner.objects.keys().map(|(_, n, _)| n.clone()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// The events after version `since` still in the history, and a receiver of the live
    /// ones after them; `Err(oldest)` when events after `since` were already dropped.
    pub fn subscribe(&self, since: u64) -> Result<(Vec<Event>, broadcast::Receiver<Event>), u64> {
        let inner = self.lock();
        if since < inner.compacted {
            return Err(inner.compacted + 1);
        }
        let replay = inner
            .history
            .iter()
            .filter(|e| e.rv > since)
            .cloned()
            .collect();
        Ok((replay, self.live.subscribe()))
    }
}

/// `metadata.name` (empty when absent).
pub(crate) fn name_of(object: &Value) -> &str {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// `metadata` as a map, made one if it is absent or not an object.
pub(crate) fn metadata(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

/// `metadata.labels[key]`.
pub(crate) fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object.get("metadata")?.get("labels")?.get(key)?.as_str()
}
