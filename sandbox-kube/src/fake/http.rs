//! HTTP/1 on 127.0.0.1: routing, bodies, and `metav1.Status` errors.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::store::{label, ApiError};
use super::{exec, objects, watch, RequestRecord, Shared};
use crate::crd::{Kind, VERSION};

/// A response body: whole, or streamed (watches).
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The largest request body taken (the API server's limit is 3 MiB too).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// A JSON response.
pub(crate) fn json_response(code: u16, value: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed_unsync());
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A `metav1.Status` error response.
pub(crate) fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.to_status())
}

/// The query's pairs, percent-decoded, in order.
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The first value of `key`.
pub(crate) fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Serves one request; records it in the request log.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let authorized = shared.authorization.as_deref().is_none_or(|expected| {
        request
            .headers()
            .get(::http::header::AUTHORIZATION)
            .is_some_and(|given| given.as_bytes() == expected.as_bytes())
    });
    let response = if authorized {
        route(&shared, request).await
    } else {
        error_response(&ApiError::new(401, "Unauthorized", "Unauthorized"))
    };
    shared.record(RequestRecord {
        method: method.to_string(),
        path,
        query,
        status: response.status().as_u16(),
    });
    Ok(response)
}

async fn route(shared: &Arc<Shared>, request: Request<Incoming>) -> Response<Body> {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", pod, "exec"] => {
            let (ns, pod) = ((*ns).to_owned(), (*pod).to_owned());
            exec::serve(shared.clone(), request, &ns, &pod).await
        }
        ["apis", group, version, "namespaces", ns, plural, rest @ ..]
            if *version == VERSION && rest.len() <= 1 =>
        {
            let Some(kind) = Kind::ALL
                .into_iter()
                .find(|k| k.group() == *group && k.plural() == *plural)
            else {
                return not_found(&path);
            };
            let (ns, name) = ((*ns).to_owned(), rest.first().map(|n| (*n).to_owned()));
            match objects_route(shared, request, kind, &ns, name.as_deref()).await {
                Ok(response) => response,
                Err(e) => error_response(&e),
            }
        }
        _ => not_found(&path),
    }
}

fn not_found(path: &str) -> Response<Body> {
    error_response(&ApiError::new(
        404,
        "NotFound",
        format!("the server could not find the requested resource ({path})"),
    ))
}

async fn objects_route(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
    kind: Kind,
    ns: &str,
    name: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let pairs = query_pairs(request.uri().query().unwrap_or_default());
    let method = request.method().clone();
    match (method, name) {
        (Method::GET, None) if param(&pairs, "watch").is_some_and(|w| w == "true" || w == "1") => {
            let filter = Filter::parse(&pairs)?;
            watch::serve(shared.clone(), kind, ns, &pairs, filter)
        }
        (Method::GET, None) => {
            let filter = Filter::parse(&pairs)?;
            let (items, rv) = shared.store.list(kind, Some(ns), |o| filter.matches(o));
            Ok(json_response(
                200,
                &json!({
                    "apiVersion": kind.api_version(),
                    "kind": format!("{}List", kind.name()),
                    "metadata": {"resourceVersion": rv.to_string()},
                    "items": items,
                }),
            ))
        }
        (Method::POST, None) => {
            let body = read_json(request).await?;
            let created = objects::create(shared, kind, ns, body)?;
            Ok(json_response(201, &created))
        }
        (Method::GET, Some(name)) => Ok(json_response(200, &shared.store.get(kind, ns, name)?)),
        (Method::PUT, Some(name)) => {
            let body = read_json(request).await?;
            Ok(json_response(
                200,
                &objects::replace(shared, kind, ns, name, body)?,
            ))
        }
        (Method::DELETE, Some(name)) => Ok(json_response(
            200,
            &objects::delete(shared, kind, ns, name).await?,
        )),
        (method, _) => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported on this path by the fake API server"),
        )),
    }
}

async fn read_json(request: Request<Incoming>) -> Result<Value, ApiError> {
    let body = Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("cannot read the body: {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

/// `fieldSelector` (`metadata.name`, `metadata.namespace`) and `labelSelector` (`k=v`,
/// `k==v`, `k!=v`, `k`, `!k`), comma-separated terms all of which must hold.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    fields: Vec<(String, String, bool)>,
    labels: Vec<(String, Option<String>, bool)>,
}

impl Filter {
    pub fn parse(pairs: &[(String, String)]) -> Result<Filter, ApiError> {
        let mut filter = Filter::default();
        for term in param(pairs, "fieldSelector")
            .unwrap_or_default()
            .split(',')
            .filter(|t| !t.is_empty())
        {
            let (key, value, equal) = split_term(term).ok_or_else(|| {
                ApiError::bad_request(format!("invalid field selector term {term:?}"))
            })?;
            if key != "metadata.name" && key != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key} (the fake API server takes metadata.name and metadata.namespace)"
                )));
            }
            filter.fields.push((key, value, equal));
        }
        for term in param(pairs, "labelSelector")
            .unwrap_or_default()
            .split(',')
            .filter(|t| !t.is_empty())
        {
            match split_term(term) {
                Some((key, value, equal)) => filter.labels.push((key, Some(value), equal)),
                None if term.starts_with('!') => filter.labels.push((term[1..].trim().to_owned(), None, false)),
                None if !term.contains([' ', '(', ')']) => filter.labels.push((term.trim().to_owned(), None, true)),
                None => {
                    return Err(ApiError::bad_request(format!(
                        "label selector term {term:?} is not supported by the fake API server (k=v, k!=v, k, !k)"
                    )))
                }
            }
        }
        Ok(filter)
    }

    pub fn matches(&self, object: &Value) -> bool {
        let fields = self.fields.iter().all(|(key, want, equal)| {
            let have = object
                .pointer(&format!("/{}", key.replace('.', "/")))
                .and_then(Value::as_str)
                .unwrap_or_default();
            (have == want) == *equal
        });
        let labels = self.labels.iter().all(|(key, want, equal)| match want {
            Some(want) => (label(object, key) == Some(want.as_str())) == *equal,
            None => label(object, key).is_some() == *equal,
        });
        fields && labels
    }
}

fn split_term(term: &str) -> Option<(String, String, bool)> {
    let (key, value, equal) = if let Some((k, v)) = term.split_once("!=") {
        (k, v, false)
    } else if let Some((k, v)) = term.split_once("==") {
        (k, v, true)
    } else {
        let (k, v) = term.split_once('=')?;
        (k, v, true)
    };
    Some((key.trim().to_owned(), value.trim().to_owned(), equal))
}
