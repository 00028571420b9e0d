//! The controllers, standing for agent-sandbox's: warm pools keep started sandboxes, claims
//! take one (or get a new one) and report it, sandboxes get a pod, and objects whose owner
//! is gone are deleted. Level-triggered: every change to the store runs one full pass.

use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::watch;

use super::pods::Started;
use super::store::{label, metadata, name_of};
use super::{objects, Shared, CLAIM_LABEL, POOL_LABEL};
use crate::crd::{Kind, CONDITION_READY};

/// The pod address every sandbox reports.
pub(crate) const POD_IP: &str = "127.0.0.1";

/// Runs passes until `shutdown` turns true.
pub(crate) async fn run(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    loop {
        for ns in shared.store.namespaces() {
            reconcile(&shared, &ns).await;
        }
        tokio::select! {
            _ = shared.store.changed() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

async fn reconcile(shared: &Arc<Shared>, ns: &str) {
    collect_orphans(shared, ns).await;
    let (sandboxes, _) = shared.store.list(Kind::Sandbox, Some(ns), |_| true);
    for sandbox in &sandboxes {
        start(shared, ns, sandbox);
    }
    let (pools, _) = shared.store.list(Kind::SandboxWarmPool, Some(ns), |_| true);
    for pool in &pools {
        warm_pool(shared, ns, pool).await;
    }
    let (claims, _) = shared.store.list(Kind::SandboxClaim, Some(ns), |_| true);
    for claim in &claims {
        bind(shared, ns, claim);
    }
}

/// Deletes sandboxes whose claim or warm pool is gone (what owner references do).
async fn collect_orphans(shared: &Shared, ns: &str) {
    let (sandboxes, _) = shared.store.list(Kind::Sandbox, Some(ns), |_| true);
    for sandbox in sandboxes {
        let owner_gone = |kind: Kind, key: &str| {
            label(&sandbox, key).is_some_and(|owner| shared.store.get(kind, ns, owner).is_err())
        };
        let orphan = match label(&sandbox, CLAIM_LABEL) {
            Some(_) => owner_gone(Kind::SandboxClaim, CLAIM_LABEL),
            None => owner_gone(Kind::SandboxWarmPool, POOL_LABEL),
        };
        if orphan {
            let name = name_of(&sandbox);
            if shared.store.delete(Kind::Sandbox, ns, name).is_ok() {
                shared.pods.stop(ns, name).await;
            }
        }
    }
}

/// Starts the pod of a sandbox that has none yet (unless it is a warm one and warm pods
/// are not started), and records the outcome in its status.
fn start(shared: &Arc<Shared>, ns: &str, sandbox: &Value) {
    let name = name_of(sandbox).to_owned();
    let uid = sandbox
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let warm = label(sandbox, CLAIM_LABEL).is_none() && label(sandbox, POOL_LABEL).is_some();
    if warm && !shared.warm_start {
        return;
    }
    if shared.pods.outcome(ns, &name, &uid).is_some() {
        return;
    }
    let command: Option<Vec<String>> = sandbox
        .pointer("/spec/podTemplate/spec/containers/0/command")
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        });
    let command = command.unwrap_or_default();
    let on_exit = {
        let shared = shared.clone();
        Box::new(move |ns: String, name: String, how: String| {
            let _ = shared.store.modify(Kind::Sandbox, &ns, &name, |s| {
                set_ready(s, false, "ContainerExited", &how);
            });
        })
    };
    let outcome = shared
        .pods
        .start(&shared.commands, ns, &name, &uid, &command, on_exit);
    let _ = shared
        .store
        .modify(Kind::Sandbox, ns, &name, |s| match &outcome {
            Started::Running => {
                set_ready(
                    s,
                    true,
                    "DependenciesReady",
                    "Pod is Ready; the container's process runs",
                );
                s["status"]["podIPs"] = json!([POD_IP]);
            }
            Started::Failed(why) => set_ready(s, false, "PodStartFailed", why),
        });
}

/// Keeps `spec.replicas` unclaimed sandboxes of the pool; reports `status.replicas`,
/// `readyReplicas` and `selector`.
async fn warm_pool(shared: &Arc<Shared>, ns: &str, pool: &Value) {
    let name = name_of(pool).to_owned();
    let replicas = pool
        .pointer("/spec/replicas")
        .and_then(Value::as_u64)
        .map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX));
    let template = pool
        .pointer("/spec/sandboxTemplateRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let warm = |shared: &Shared| {
        shared
            .store
            .list(Kind::Sandbox, Some(ns), |s| {
                label(s, POOL_LABEL) == Some(name.as_str()) && label(s, CLAIM_LABEL).is_none()
            })
            .0
    };
    let mut have = warm(shared).len();
    while have < replicas {
        let made = new_sandbox(
            shared,
            ns,
            &template,
            &format!("{name}-"),
            (POOL_LABEL, pool),
        );
        match made {
            Ok(sandbox) => {
                start(shared, ns, &sandbox);
                have += 1;
            }
            Err(why) => {
                shared.note(format!(
                    "warm pool {ns}/{name}: cannot create a sandbox: {why}"
                ));
                break;
            }
        }
    }
    let now = warm(shared);
    for extra in now.iter().skip(replicas) {
        let _ = objects::delete(shared, Kind::Sandbox, ns, name_of(extra)).await;
    }
    let now = warm(shared);
    let ready = now.iter().filter(|s| is_ready(s)).count();
    let generation = pool
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let _ = shared.store.modify(Kind::SandboxWarmPool, ns, &name, |p| {
        p["status"] = json!({
            "replicas": now.len(),
            "readyReplicas": ready,
            "selector": format!("{POOL_LABEL}={name}"),
            "observedGeneration": generation,
        });
    });
}

/// Gives a claim its sandbox (an adopted warm one, else a new one from the pool's
/// template) and reports it in the claim's status.
fn bind(shared: &Arc<Shared>, ns: &str, claim: &Value) {
    let name = name_of(claim).to_owned();
    let pool_name = claim
        .pointer("/spec/warmPoolRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mine = |shared: &Shared| {
        shared
            .store
            .list(Kind::Sandbox, Some(ns), |s| {
                label(s, CLAIM_LABEL) == Some(name.as_str())
            })
            .0
            .into_iter()
            .next()
    };
    let sandbox = match mine(shared) {
        Some(s) => s,
        None => match adopt_or_create(shared, ns, claim, &pool_name) {
            Ok(s) => s,
            Err((reason, message)) => {
                let _ = shared.store.modify(Kind::SandboxClaim, ns, &name, |c| {
                    set_ready(c, false, reason, &message);
                });
                return;
            }
        },
    };
    let sandbox_name = name_of(&sandbox).to_owned();
    let current = shared
        .store
        .get(Kind::Sandbox, ns, &sandbox_name)
        .unwrap_or(sandbox);
    let _ = shared.store.modify(Kind::SandboxClaim, ns, &name, |c| {
        if is_ready(&current) {
            set_ready(c, true, "SandboxReady", "the claim's sandbox is ready");
            c["status"]["sandbox"] = json!({"name": sandbox_name, "podIPs": [POD_IP]});
        } else {
            let why = condition(&current, CONDITION_READY)
                .and_then(|r| r.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("the sandbox's pod is not started yet")
                .to_owned();
            set_ready(c, false, "SandboxNotReady", &why);
            c["status"]["sandbox"] = json!({"name": sandbox_name});
        }
    });
}

fn adopt_or_create(
    shared: &Arc<Shared>,
    ns: &str,
    claim: &Value,
    pool_name: &str,
) -> Result<Value, (&'static str, String)> {
    let claim_name = name_of(claim);
    let mut warm = shared
        .store
        .list(Kind::Sandbox, Some(ns), |s| {
            label(s, POOL_LABEL) == Some(pool_name) && label(s, CLAIM_LABEL).is_none()
        })
        .0;
    // Ready ones first; never one whose pod failed to start.
    warm.sort_by_key(|s| !is_ready(s));
    let usable = warm.into_iter().find(|s| {
        is_ready(s)
            || condition(s, CONDITION_READY)
                .and_then(|c| c.get("reason"))
                .and_then(Value::as_str)
                != Some("PodStartFailed")
    });
    if let Some(sandbox) = usable {
        let owner = owner_ref(claim);
        let adopted = shared
            .store
            .modify(Kind::Sandbox, ns, name_of(&sandbox), |s| {
                let meta = metadata(s);
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.remove(POOL_LABEL);
                    labels.insert(CLAIM_LABEL.into(), json!(claim_name));
                }
                meta.insert("ownerReferences".into(), json!([owner]));
            })
            .map_err(|e| ("SandboxAdoptionFailed", e.message))?;
        start(shared, ns, &adopted);
        return Ok(adopted);
    }
    let pool = shared
        .store
        .get(Kind::SandboxWarmPool, ns, pool_name)
        .map_err(|e| ("WarmPoolNotFound", e.message))?;
    let template = pool
        .pointer("/spec/sandboxTemplateRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let created = new_sandbox(
        shared,
        ns,
        template,
        &format!("{claim_name}-"),
        (CLAIM_LABEL, claim),
    )
    .map_err(|why| ("SandboxCreationFailed", why))?;
    start(shared, ns, &created);
    Ok(created)
}

/// Creates a sandbox from template `template` through the same checks as a `POST`
/// (schema and admission policy), owned by `owner` (a pool or a claim, labelled `key`).
fn new_sandbox(
    shared: &Shared,
    ns: &str,
    template: &str,
    prefix: &str,
    (key, owner): (&str, &Value),
) -> Result<Value, String> {
    let template = shared
        .store
        .get(Kind::SandboxTemplate, ns, template)
        .map_err(|e| e.message)?;
    let pod_template = template
        .pointer("/spec/podTemplate")
        .cloned()
        .unwrap_or(Value::Null);
    let mut labels = owner
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or_else(|| json!({}));
    labels[key] = json!(name_of(owner));
    let sandbox = json!({
        "apiVersion": Kind::Sandbox.api_version(),
        "kind": Kind::Sandbox.name(),
        "metadata": {
            "generateName": prefix,
            "namespace": ns,
            "labels": labels,
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {"podTemplate": pod_template},
    });
    objects::create(shared, Kind::Sandbox, ns, sandbox).map_err(|e| {
        let causes: Vec<String> = e
            .details
            .as_ref()
            .and_then(|d| d.get("causes"))
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .filter_map(|c| c.get("message").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if causes.is_empty() {
            e.message
        } else {
            format!("admission denied the Sandbox: {}", causes.join("; "))
        }
    })
}

fn owner_ref(owner: &Value) -> Value {
    json!({
        "apiVersion": owner.get("apiVersion").cloned().unwrap_or(Value::Null),
        "kind": owner.get("kind").cloned().unwrap_or(Value::Null),
        "name": name_of(owner),
        "uid": owner.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

fn is_ready(object: &Value) -> bool {
    condition(object, CONDITION_READY)
        .and_then(|c| c.get("status"))
        .and_then(Value::as_str)
        == Some("True")
}

/// Sets the `Ready` condition (its `lastTransitionTime` kept while its status stays).
fn set_ready(object: &mut Value, ready: bool, reason: &str, message: &str) {
    let status = if ready { "True" } else { "False" };
    let generation = object
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let since = condition(object, CONDITION_READY)
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(super::random::now()));
    if !object["status"].is_object() {
        object["status"] = json!({});
    }
    object["status"]["conditions"] = json!([{
        "type": CONDITION_READY,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }]);
}
