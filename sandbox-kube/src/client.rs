//! The cluster client (feature `client`): applies a tier's objects, claims sandboxes, waits
//! for a claim to bind and releases it, through kube-rs.
//!
//! [`Cluster`] wraps a [`kube::Client`] and one namespace. Every call names the object it
//! acted on in its [`ClusterError`], with the API server's status (conflict, not found,
//! forbidden, invalid, …), so a caller can tell an RBAC problem from a missing CRD from a
//! race.
//!
//! | call | request | idempotent |
//! |---|---|---|
//! | [`Cluster::apply_tier`] | `POST` template and warm pool; on `409 AlreadyExists`, `GET` and, when the stored spec differs, `PUT` with the stored `resourceVersion` | yes |
//! | [`Cluster::claim`] | `POST` a `SandboxClaim` (`generateName`) | no: each call is a new claim |
//! | [`Cluster::get_claim`] | `GET` a claim | yes |
//! | [`Cluster::get_warm_pool`], [`Cluster::get_template`] | `GET` a pool, a template | yes |
//! | [`Cluster::wait_ready`] | `GET` list by name, then `watch` from its `resourceVersion` (resumed from the last version or bookmark seen when the server ends it); re-list on `410 Gone` | yes |
//! | [`Cluster::release`] | `DELETE` a claim; `404` counts as done | yes |
//!
//! The four CRD structs implement [`kube::Resource`] here (namespaced, `DynamicType = ()`),
//! so they work with [`kube::Api`] directly.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::core::{NamespaceResourceScope, Status};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::crd::{Object, VERSION};
use crate::{Kind, Rendered, Sandbox, SandboxClaim, SandboxTemplate, SandboxWarmPool};

macro_rules! impl_resource {
    ($($ty:ty),*) => {$(
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$ty as Object>::KIND.name())
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$ty as Object>::KIND.group())
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$ty as Object>::KIND.plural())
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    )*};
}

impl_resource!(Sandbox, SandboxTemplate, SandboxWarmPool, SandboxClaim);

/// How long one watch request asks the server to stay open (`timeoutSeconds`) before
/// [`Cluster::wait_ready`] re-watches from the last version it saw.
pub const WATCH_SECONDS: u32 = 290;

/// How long [`Cluster::wait_ready`] pauses before re-watching after a watch the server
/// ended without any event.
pub const EMPTY_WATCH_PAUSE: Duration = Duration::from_secs(1);

/// How many `410 Gone` in a row [`Cluster::wait_ready`] re-lists after before giving up
/// with [`ClusterError::WatchExpired`] (a claim event in between resets the count).
pub const MAX_EXPIRED_WATCHES: u32 = 5;

/// The API call a [`ClusterError`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `POST`.
    Create,
    /// `GET` one object.
    Get,
    /// `GET` a list.
    List,
    /// `GET ?watch=true`.
    Watch,
    /// `PUT`.
    Replace,
    /// `DELETE`.
    Delete,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Create => "create",
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Replace => "replace",
            Verb::Delete => "delete",
        })
    }
}

/// How many times [`Cluster::apply_tier`] reads and replaces an object that keeps changing
/// under it before it returns the `409 Conflict`: 3.
pub const APPLY_ATTEMPTS: u32 = 3;

/// What went wrong talking to the cluster: the object, the call and the API status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// `409 Conflict` other than on a create (e.g. a `PUT` with a stale `resourceVersion`:
    /// someone else changed the object in between).
    #[error("{verb} {kind} {namespace}/{name}: conflict (409 {reason}): {message}")]
    Conflict {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// The API status reason (`Conflict`, `AlreadyExists`).
        reason: String,
        /// The API status message.
        message: String,
    },
    /// `404 NotFound`: no such object (or the CRD is not installed).
    #[error("{verb} {kind} {namespace}/{name}: not found (404): {message}")]
    NotFound {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// The API status message.
        message: String,
    },
    /// `403 Forbidden`: the client's identity may not do this (RBAC, or a namespace being
    /// terminated).
    #[error("{verb} {kind} {namespace}/{name}: forbidden (403): {message}")]
    Forbidden {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// The API status message.
        message: String,
    },
    /// `422 Invalid`: the object fails the CRD schema or an admission policy.
    #[error("{verb} {kind} {namespace}/{name}: invalid (422): {message}")]
    Invalid {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// The API status message.
        message: String,
    },
    /// Any other API status.
    #[error("{verb} {kind} {namespace}/{name}: API status {code} {reason}: {message}")]
    Api {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// The HTTP status code.
        code: u16,
        /// The API status reason.
        reason: String,
        /// The API status message.
        message: String,
    },
    /// The request did not get an API status: transport, decoding or request building.
    #[error("{verb} {kind} {namespace}/{name}: {source}")]
    Client {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// The object's name.
        name: String,
        /// The call.
        verb: Verb,
        /// kube-rs's error.
        #[source]
        source: kube::Error,
    },
    /// The claim did not become ready in time.
    #[error("claim {namespace}/{name} not ready after {after:?}{}", last_ready.as_deref().map(|c| format!(" (last Ready condition: {c})")).unwrap_or_default())]
    Timeout {
        /// The namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// The time waited.
        after: Duration,
        /// The claim's last `Ready` condition seen, as `status reason: message`.
        last_ready: Option<String>,
    },
    /// The watch kept expiring (`410 Gone`) faster than the claim changed.
    #[error(
        "watch of claim {namespace}/{name} expired (410 Gone) {times} times in a row: {message}"
    )]
    WatchExpired {
        /// The namespace.
        namespace: String,
        /// The claim.
        name: String,
        /// How many expiries in a row.
        times: u32,
        /// The last expiry's message.
        message: String,
    },
    /// The claim was deleted while waiting for it.
    #[error("claim {namespace}/{name} was deleted while waiting for it to be ready")]
    Deleted {
        /// The namespace.
        namespace: String,
        /// The claim.
        name: String,
    },
    /// An object to create has neither `metadata.name` nor `metadata.generateName`, or the
    /// server's answer to a create has no name.
    #[error("{kind} in {namespace}: {what}")]
    Unnamed {
        /// The kind.
        kind: Kind,
        /// The namespace.
        namespace: String,
        /// What is missing where.
        what: &'static str,
    },
    /// An object could not be turned into JSON to compare it with the stored one.
    #[error("{kind} {name}: cannot encode as JSON: {source}")]
    Encode {
        /// The kind.
        kind: Kind,
        /// The object's name.
        name: String,
        /// The encoding error.
        #[source]
        source: serde_json::Error,
    },
}

/// `error`'s message followed by each of its sources' that adds something (kube-rs wraps
/// the cause of a failed connection, such as an untrusted certificate, several levels down).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

impl ClusterError {
    /// The HTTP status code of the API status behind this error, if there was one.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClusterError::Conflict { .. } => Some(409),
            ClusterError::NotFound { .. } => Some(404),
            ClusterError::Forbidden { .. } => Some(403),
            ClusterError::Invalid { .. } => Some(422),
            ClusterError::Api { code, .. } => Some(*code),
            ClusterError::WatchExpired { .. } => Some(410),
            _ => None,
        }
    }
}

/// What [`Cluster::apply_tier`] did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It did not exist and was created.
    Created,
    /// It existed with the same spec, labels and annotations (fields the server added,
    /// such as defaults, do not count as different).
    Unchanged,
    /// It existed with a different spec, labels or annotations, and was replaced (`PUT`
    /// with the stored `resourceVersion`, so a concurrent change is a
    /// [`ClusterError::Conflict`], not lost).
    Replaced,
}

/// What [`Cluster::apply_tier`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The `SandboxTemplate`.
    pub template: Outcome,
    /// The `SandboxWarmPool`.
    pub warm_pool: Outcome,
}

/// A ready claim: [`Cluster::wait_ready`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// The claim's name.
    pub claim: String,
    /// The `Sandbox` bound to it.
    pub sandbox: String,
    /// The sandbox pod's IP addresses, as the claim reports them.
    pub pod_ips: Vec<String>,
}

/// What [`Cluster::release`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The claim was deleted (its sandbox and pod follow, by owner reference).
    Deleted,
    /// There was no such claim (already released): `404` is success.
    AlreadyGone,
}

/// One namespace of a cluster running agent-sandbox.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    namespace: String,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster reached through `client`, every object in `namespace` (whatever the
    /// objects' own `metadata.namespace` says).
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> Cluster {
        Cluster {
            client,
            namespace: namespace.into(),
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The kube-rs client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Creates the tier's `SandboxTemplate`, then its `SandboxWarmPool` (the pool refers
    /// to the template). Idempotent: an object that already exists (`409 AlreadyExists`)
    /// is read back and, when its spec, labels or annotations differ from `rendered`'s,
    /// replaced (`PUT` with the stored `resourceVersion`; a `409 Conflict` there, from a
    /// concurrent writer, reads it again, at most [`APPLY_ATTEMPTS`] times); see
    /// [`Outcome`].
    pub async fn apply_tier(&self, rendered: &Rendered) -> Result<Applied, ClusterError> {
        let template = self.apply(&rendered.template).await?;
        let warm_pool = self.apply(&rendered.warm_pool).await?;
        Ok(Applied {
            template,
            warm_pool,
        })
    }

    async fn apply<K>(&self, desired: &K) -> Result<Outcome, ClusterError>
    where
        K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
            + Object
            + Clone
            + fmt::Debug
            + DeserializeOwned,
    {
        let mut object = desired.clone();
        object.meta_mut().namespace = Some(self.namespace.clone());
        let Some(name) = object.meta().name.clone() else {
            return Err(ClusterError::Unnamed {
                kind: K::KIND,
                namespace: self.namespace.clone(),
                what: "no metadata.name to apply",
            });
        };
        let api = self.api::<K>();
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(Outcome::Created),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(self.error(e, K::KIND, &name, Verb::Create)),
        }
        // Someone else (a controller writing the status) may change the object between the
        // read and the replace: read again and retry, as client-go's RetryOnConflict does.
        let mut attempt = 1;
        loop {
            let stored = api
                .get(&name)
                .await
                .map_err(|e| self.error(e, K::KIND, &name, Verb::Get))?;
            if self.covers_object(&stored, &object, &name)? {
                return Ok(Outcome::Unchanged);
            }
            object.meta_mut().resource_version = stored.meta().resource_version.clone();
            match api.replace(&name, &PostParams::default(), &object).await {
                Ok(_) => return Ok(Outcome::Replaced),
                Err(kube::Error::Api(status)) if status.code == 409 && attempt < APPLY_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(self.error(e, K::KIND, &name, Verb::Replace)),
            }
        }
    }

    /// Whether `stored` has everything `desired` sets in its spec, labels and annotations.
    fn covers_object<K: Object>(
        &self,
        stored: &K,
        desired: &K,
        name: &str,
    ) -> Result<bool, ClusterError> {
        let encode = |o: &K| {
            serde_json::to_value(o).map_err(|source| ClusterError::Encode {
                kind: K::KIND,
                name: name.to_owned(),
                source,
            })
        };
        let (stored, desired) = (encode(stored)?, encode(desired)?);
        Ok(["/spec", "/metadata/labels", "/metadata/annotations"]
            .iter()
            .all(|path| match desired.pointer(path) {
                None => true,
                Some(want) => stored.pointer(path).is_some_and(|have| covers(have, want)),
            }))
    }

    /// Creates a claim (normally with `metadata.generateName`, as [`crate::render()`]
    /// writes it) and returns the name the server gave it.
    pub async fn claim(&self, claim: &SandboxClaim) -> Result<String, ClusterError> {
        let mut object = claim.clone();
        object.metadata.namespace = Some(self.namespace.clone());
        object.status = None;
        let shown = match (&object.metadata.name, &object.metadata.generate_name) {
            (Some(name), _) => name.clone(),
            (None, Some(prefix)) => format!("{prefix}*"),
            (None, None) => {
                return Err(ClusterError::Unnamed {
                    kind: Kind::SandboxClaim,
                    namespace: self.namespace.clone(),
                    what: "neither metadata.name nor metadata.generateName to create",
                })
            }
        };
        let created = self
            .api::<SandboxClaim>()
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| self.error(e, Kind::SandboxClaim, &shown, Verb::Create))?;
        created
            .metadata
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ClusterError::Unnamed {
                kind: Kind::SandboxClaim,
                namespace: self.namespace.clone(),
                what: "the created claim came back without a name",
            })
    }

    /// Reads a claim.
    pub async fn get_claim(&self, name: &str) -> Result<SandboxClaim, ClusterError> {
        self.api::<SandboxClaim>()
            .get(name)
            .await
            .map_err(|e| self.error(e, Kind::SandboxClaim, name, Verb::Get))
    }

    /// Reads a warm pool.
    pub async fn get_warm_pool(&self, name: &str) -> Result<SandboxWarmPool, ClusterError> {
        self.api::<SandboxWarmPool>()
            .get(name)
            .await
            .map_err(|e| self.error(e, Kind::SandboxWarmPool, name, Verb::Get))
    }

    /// Reads a template.
    pub async fn get_template(&self, name: &str) -> Result<SandboxTemplate, ClusterError> {
        self.api::<SandboxTemplate>()
            .get(name)
            .await
            .map_err(|e| self.error(e, Kind::SandboxTemplate, name, Verb::Get))
    }

    /// Waits until the claim `name` is ready: its `Ready` condition is `True` and
    /// `status.sandbox.name` names its sandbox.
    ///
    /// Lists the claim (by field selector) and watches it from the list's
    /// `resourceVersion`; a watch the server ends is resumed from the last version seen;
    /// an expired one (`410 Gone`, as an `ERROR` event or as the watch request's status)
    /// starts over with a new list. Fails with [`ClusterError::Timeout`] after `timeout`,
    /// [`ClusterError::NotFound`] if there is no such claim, [`ClusterError::Deleted`] if
    /// it goes away, and [`ClusterError::WatchExpired`] after
    /// [`MAX_EXPIRED_WATCHES`] expiries in a row.
    pub async fn wait_ready(&self, name: &str, timeout: Duration) -> Result<Bound, ClusterError> {
        let mut last_ready = None;
        let waited = tokio::time::timeout(timeout, self.watch_ready(name, &mut last_ready)).await;
        match waited {
            Ok(result) => result,
            Err(_) => Err(ClusterError::Timeout {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                after: timeout,
                last_ready,
            }),
        }
    }

    async fn watch_ready(
        &self,
        name: &str,
        last_ready: &mut Option<String>,
    ) -> Result<Bound, ClusterError> {
        let api = self.api::<SandboxClaim>();
        let fields = format!("metadata.name={name}");
        let mut expired = 0u32;
        'list: loop {
            let list = api
                .list(&ListParams::default().fields(&fields))
                .await
                .map_err(|e| self.error(e, Kind::SandboxClaim, name, Verb::List))?;
            let Some(claim) = list
                .items
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
            else {
                return Err(ClusterError::NotFound {
                    kind: Kind::SandboxClaim,
                    namespace: self.namespace.clone(),
                    name: name.to_owned(),
                    verb: Verb::List,
                    message: "no claim of that name".to_owned(),
                });
            };
            if let Some(bound) = ready(claim, last_ready) {
                return Ok(bound);
            }
            let mut version = list
                .metadata
                .resource_version
                .clone()
                .or_else(|| claim.metadata.resource_version.clone())
                .unwrap_or_default();
            loop {
                let params = WatchParams::default()
                    .fields(&fields)
                    .timeout(WATCH_SECONDS);
                let mut events = match api.watch(&params, &version).await {
                    Ok(events) => events.boxed(),
                    Err(kube::Error::Api(status)) if status.code == 410 => {
                        self.expired(name, &mut expired, &status)?;
                        continue 'list;
                    }
                    Err(e) => return Err(self.error(e, Kind::SandboxClaim, name, Verb::Watch)),
                };
                let mut seen_any = false;
                while let Some(event) = events.next().await {
                    seen_any = true;
                    let event = match event {
                        Ok(event) => event,
                        Err(kube::Error::Api(status)) if status.code == 410 => {
                            self.expired(name, &mut expired, &status)?;
                            continue 'list;
                        }
                        Err(e) => return Err(self.error(e, Kind::SandboxClaim, name, Verb::Watch)),
                    };
                    match event {
                        WatchEvent::Added(claim) | WatchEvent::Modified(claim) => {
                            if claim.metadata.name.as_deref() != Some(name) {
                                continue;
                            }
                            expired = 0;
                            if let Some(v) = &claim.metadata.resource_version {
                                version.clone_from(v);
                            }
                            if let Some(bound) = ready(&claim, last_ready) {
                                return Ok(bound);
                            }
                        }
                        WatchEvent::Deleted(claim) => {
                            if claim.metadata.name.as_deref() == Some(name) {
                                return Err(ClusterError::Deleted {
                                    namespace: self.namespace.clone(),
                                    name: name.to_owned(),
                                });
                            }
                        }
                        WatchEvent::Bookmark(bookmark) => {
                            version = bookmark.metadata.resource_version;
                        }
                        WatchEvent::Error(status) if status.code == 410 => {
                            self.expired(name, &mut expired, &status)?;
                            continue 'list;
                        }
                        WatchEvent::Error(status) => {
                            return Err(self.status_error(
                                &status,
                                Kind::SandboxClaim,
                                name,
                                Verb::Watch,
                            ))
                        }
                    }
                }
                // The server ended the watch (its timeout): resume from the last version,
                // after a pause if it ended without a single event (no busy loop against a
                // server that closes watches at once).
                if !seen_any {
                    tokio::time::sleep(EMPTY_WATCH_PAUSE).await;
                }
            }
        }
    }

    /// Counts one `410 Gone`; an error once there were too many in a row.
    fn expired(&self, name: &str, expired: &mut u32, status: &Status) -> Result<(), ClusterError> {
        *expired += 1;
        if *expired >= MAX_EXPIRED_WATCHES {
            return Err(ClusterError::WatchExpired {
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                times: *expired,
                message: status.message.clone(),
            });
        }
        Ok(())
    }

    /// Deletes the claim `name` (its sandbox and pod follow). Idempotent: a claim that is
    /// already gone (`404`) is [`Released::AlreadyGone`], not an error.
    pub async fn release(&self, name: &str) -> Result<Released, ClusterError> {
        match self
            .api::<SandboxClaim>()
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(Released::Deleted),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Released::AlreadyGone),
            Err(e) => Err(self.error(e, Kind::SandboxClaim, name, Verb::Delete)),
        }
    }

    fn error(&self, error: kube::Error, kind: Kind, name: &str, verb: Verb) -> ClusterError {
        match error {
            kube::Error::Api(status) => self.status_error(&status, kind, name, verb),
            source => ClusterError::Client {
                kind,
                namespace: self.namespace.clone(),
                name: name.to_owned(),
                verb,
                source,
            },
        }
    }

    fn status_error(&self, status: &Status, kind: Kind, name: &str, verb: Verb) -> ClusterError {
        let (namespace, name, message) = (
            self.namespace.clone(),
            name.to_owned(),
            status.message.clone(),
        );
        match status.code {
            409 => ClusterError::Conflict {
                kind,
                namespace,
                name,
                verb,
                reason: status.reason.clone(),
                message,
            },
            404 => ClusterError::NotFound {
                kind,
                namespace,
                name,
                verb,
                message,
            },
            403 => ClusterError::Forbidden {
                kind,
                namespace,
                name,
                verb,
                message,
            },
            422 => ClusterError::Invalid {
                kind,
                namespace,
                name,
                verb,
                message,
            },
            code => ClusterError::Api {
                kind,
                namespace,
                name,
                verb,
                code,
                reason: status.reason.clone(),
                message,
            },
        }
    }
}

/// The claim's binding if it is ready; records its `Ready` condition in `last_ready`.
fn ready(claim: &SandboxClaim, last_ready: &mut Option<String>) -> Option<Bound> {
    let status = claim.status.as_ref()?;
    if let Some(c) = status.condition(crate::crd::CONDITION_READY) {
        *last_ready = Some(format!("{} {}: {}", c.status, c.reason, c.message));
    }
    let sandbox = status.ready_sandbox()?;
    Some(Bound {
        claim: claim.metadata.name.clone().unwrap_or_default(),
        sandbox: sandbox.name.clone(),
        pod_ips: sandbox.pod_ips.clone(),
    })
}

/// Whether `have` (as stored) has every field `want` sets, with the same value: objects
/// may have more keys (server defaults), lists must match element by element, and a
/// `null` in `want` is met by an absent field.
fn covers(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (_, Value::Null) => true,
        (Value::Object(have), Value::Object(want)) => want.iter().all(|(k, w)| match have.get(k) {
            Some(h) => covers(h, w),
            None => w.is_null(),
        }),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| covers(h, w))
        }
        (have, want) => have == want,
    }
}

#[cfg(test)]
mod tests {
    use super::covers;
    use serde_json::json;

    #[test]
    fn covers_ignores_server_defaults_but_not_changes() {
        let want = json!({"a": 1, "b": {"c": [1, {"d": "x"}]}, "n": null});
        assert!(covers(
            &json!({"a": 1, "b": {"c": [1, {"d": "x", "default": true}]}, "z": 0}),
            &want
        ));
        assert!(!covers(
            &json!({"a": 2, "b": {"c": [1, {"d": "x"}]}}),
            &want
        ));
        assert!(!covers(&json!({"a": 1, "b": {"c": [1]}}), &want));
        assert!(!covers(&json!({"a": 1}), &want));
    }
}
