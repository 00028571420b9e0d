//! The API server's object semantics shared by HTTP requests and the controllers: what a
//! create and a replace check, and what a delete takes with it.

use serde_json::{json, Value};

use super::store::{details, label, metadata, name_of, ApiError};
use super::{Shared, CLAIM_LABEL, POOL_LABEL};
use crate::check::Violation;
use crate::crd::Kind;

/// Creates an object as a `POST` does: the body's kind and namespace must match, the name
/// comes from `metadata.name` or `generateName`, a written `status` is dropped, and the
/// object must pass [`crate::check::Pinned::check_object`] (schema, and for kinds the
/// admission policy matches, the policy).
pub(crate) fn create(
    shared: &Shared,
    kind: Kind,
    ns: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    check_type(kind, ns, &body)?;
    let meta = metadata(&mut body);
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        let prefix = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if prefix.is_empty() {
            return Err(invalid(
                kind,
                "",
                "metadata.name: Required value: name or generateName is required".to_owned(),
                vec![
                    json!({"reason": "FieldValueRequired", "message": "Required value: name or generateName is required", "field": "metadata.name"}),
                ],
            ));
        }
        meta.insert(
            "name".into(),
            json!(format!("{prefix}{}", super::random::suffix())),
        );
    }
    meta.insert("namespace".into(), json!(ns));
    let name = name_of(&body).to_owned();
    check_name(kind, &name)?;
    if let Some(o) = body.as_object_mut() {
        // The kinds have a status subresource: a status written with the object is not kept.
        o.remove("status");
    }
    let violations = shared.pinned.check_object(kind, &body);
    if !violations.is_empty() {
        return Err(rejected(kind, &name, &violations));
    }
    shared.store.create(kind, ns, body)
}

/// Replaces an object as a `PUT` does: the body's kind, namespace and name must match, it
/// must pass the kind's CRD schema (admission policies here match only `CREATE`), and its
/// `metadata.resourceVersion` must be the stored one.
pub(crate) fn replace(
    shared: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    check_type(kind, ns, &body)?;
    let given = name_of(&body).to_owned();
    if given != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given}) does not match the name on the URL ({name})"
        )));
    }
    metadata(&mut body).insert("namespace".into(), json!(ns));
    let mut violations = shared
        .pinned
        .schema(kind)
        .map(|s| s.validate(&body))
        .unwrap_or_default();
    if shared.pinned.policy().matches(kind, "UPDATE") {
        if let Err(denials) = shared.pinned.policy().admit(kind, &body) {
            violations.extend(denials.into_iter().map(|d| Violation {
                kind,
                check: crate::check::Check::Admission { rule: d.rule },
                path: String::new(),
                message: d.message,
            }));
        }
    }
    if !violations.is_empty() {
        return Err(rejected(kind, name, &violations));
    }
    shared.store.replace(kind, ns, name, body)
}

/// Deletes an object and, synchronously, what it owns: a claim's sandbox, a warm pool's
/// unclaimed sandboxes, a sandbox's pod (process group killed and reaped, directory
/// removed). The answer is the deleted object.
pub(crate) async fn delete(
    shared: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let object = shared.store.delete(kind, ns, name)?;
    delete_dependents(shared, kind, ns, name).await;
    Ok(object)
}

/// What goes with the deleted `kind` `ns/name` (garbage collection, done at once).
pub(crate) async fn delete_dependents(shared: &Shared, kind: Kind, ns: &str, name: &str) {
    let owned: Vec<String> = match kind {
        Kind::SandboxClaim => {
            shared
                .store
                .list(Kind::Sandbox, Some(ns), |s| {
                    label(s, CLAIM_LABEL) == Some(name)
                })
                .0
        }
        Kind::SandboxWarmPool => {
            shared
                .store
                .list(Kind::Sandbox, Some(ns), |s| {
                    label(s, POOL_LABEL) == Some(name) && label(s, CLAIM_LABEL).is_none()
                })
                .0
        }
        Kind::Sandbox => {
            shared.pods.stop(ns, name).await;
            Vec::new()
        }
        Kind::SandboxTemplate => Vec::new(),
    }
    .iter()
    .map(|s| name_of(s).to_owned())
    .collect();
    for sandbox in owned {
        if shared.store.delete(Kind::Sandbox, ns, &sandbox).is_ok() {
            shared.pods.stop(ns, &sandbox).await;
        }
    }
}

fn check_type(kind: Kind, ns: &str, body: &Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    let api_version = body.get("apiVersion").and_then(Value::as_str);
    let body_kind = body.get("kind").and_then(Value::as_str);
    if api_version.is_some_and(|v| v != kind.api_version())
        || body_kind.is_some_and(|k| k != kind.name())
    {
        return Err(ApiError::bad_request(format!(
            "the body is a {} {}, the URL is for {} {}",
            api_version.unwrap_or_default(),
            body_kind.unwrap_or_default(),
            kind.api_version(),
            kind.name()
        )));
    }
    let body_ns = body.pointer("/metadata/namespace").and_then(Value::as_str);
    if body_ns.is_some_and(|n| !n.is_empty() && n != ns) {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain: what the API server takes as a custom object's name.
fn check_name(kind: Kind, name: &str) -> Result<(), ApiError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    let message = format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character");
    Err(invalid(
        kind,
        name,
        format!("metadata.name: {message}"),
        vec![json!({"reason": "FieldValueInvalid", "message": message, "field": "metadata.name"})],
    ))
}

/// `422 Invalid` listing every violation in `details.causes` (`field`: the JSON pointer).
fn rejected(kind: Kind, name: &str, violations: &[Violation]) -> ApiError {
    let causes = violations
        .iter()
        .map(|v| {
            json!({
                "reason": match v.check {
                    crate::check::Check::Admission { .. } => "FieldValueForbidden",
                    _ => "FieldValueInvalid",
                },
                "message": v.message,
                "field": v.path,
            })
        })
        .collect();
    let summary: Vec<String> = violations
        .iter()
        .map(|v| {
            if v.path.is_empty() {
                v.message.clone()
            } else {
                format!("{}: {}", v.path, v.message)
            }
        })
        .collect();
    invalid(kind, name, format!("[{}]", summary.join(", ")), causes)
}

fn invalid(kind: Kind, name: &str, what: String, causes: Vec<Value>) -> ApiError {
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!(
            "{}.{} \"{name}\" is invalid: {what}",
            kind.name(),
            kind.group()
        ),
    );
    let mut d = details(kind, name);
    d["causes"] = Value::Array(causes);
    e.details = Some(d);
    e
}
