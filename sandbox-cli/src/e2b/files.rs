//! envd's HTTP `/files`: download (`GET`, gzip when the client accepts it) and upload
//! (`POST`: `multipart/form-data` with one part per file, or `application/octet-stream`,
//! gzip-encoded or not), and signed URLs (`signature`, `signature_expiration`) that reach a
//! sandbox without its headers: `v1_` + unpadded base64 of SHA-256 of
//! `path:operation:user:token[:expiration]`, as the SDKs make them.
//!
//! Files are read and written whole, at most [`MAX_UPLOAD`] bytes each way. `X-Metadata-*`
//! headers (user xattrs) are refused: the live sandbox's file API does not set xattrs.

use std::io::Read as _;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::filesystem::absolute;
use super::http::{self, Body, BodyError};
use super::registry::{self, Entry};
use super::Server;

/// The largest file one `/files` call reads or writes (the live sandbox's inline limit).
pub const MAX_UPLOAD: usize = 32 << 20;

/// A `/files` call routed by its sandbox's headers (the access token was checked).
pub async fn handle(
    server: Arc<Server>,
    entry: Arc<Entry>,
    request: Request<Incoming>,
) -> Response<Body> {
    let query = http::query(request.uri());
    if let Some(name) = query.get("username") {
        if let Err(error) = super::check_user(name) {
            return http::rest_error(error.code.status(), error.message);
        }
    }
    serve(server, entry, request, query).await
}

/// A `/files` call without sandbox headers: a signed URL. The signature names the sandbox
/// (its access token is the key); an expired or unknown one is refused.
pub async fn signed(server: Arc<Server>, request: Request<Incoming>) -> Response<Body> {
    let query = http::query(request.uri());
    let (Some(signature), Some(path)) = (query.get("signature"), query.get("path")) else {
        return http::rest_error(
            StatusCode::UNAUTHORIZED,
            "/files without E2b-Sandbox-Id needs a signed URL (path and signature)",
        );
    };
    let operation = if request.method() == Method::POST {
        "write"
    } else {
        "read"
    };
    let user = query.get("username").cloned().unwrap_or_default();
    let expiration = query.get("signature_expiration").cloned();
    if let Some(expiration) = &expiration {
        let Ok(at) = expiration.parse::<u64>() else {
            return http::rest_error(
                StatusCode::BAD_REQUEST,
                "signature_expiration: not a number",
            );
        };
        if at < registry::unix_seconds(std::time::SystemTime::now()) {
            return http::rest_error(StatusCode::UNAUTHORIZED, "the signed URL expired");
        }
    }
    let found = server.registry.all().into_iter().find(|entry| {
        let expected = signature_of(
            path,
            operation,
            &user,
            &entry.access_token,
            expiration.as_deref(),
        );
        bool::from(expected.as_bytes().ct_eq(signature.as_bytes()))
    });
    let Some(entry) = found else {
        return http::rest_error(
            StatusCode::UNAUTHORIZED,
            "the URL's signature matches no sandbox (wrong path, operation, user or token)",
        );
    };
    if entry.paused.load(std::sync::atomic::Ordering::SeqCst) {
        return http::rest_error(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {} is paused", entry.id),
        );
    }
    if let Err(error) = super::check_user(&user) {
        return http::rest_error(error.code.status(), error.message);
    }
    serve(server, entry, request, query).await
}

/// The SDKs' v1 file URL signature.
pub fn signature_of(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<&str>,
) -> String {
    let raw = match expiration {
        Some(at) => format!("{path}:{operation}:{user}:{token}:{at}"),
        None => format!("{path}:{operation}:{user}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

async fn serve(
    server: Arc<Server>,
    entry: Arc<Entry>,
    request: Request<Incoming>,
    query: std::collections::BTreeMap<String, String>,
) -> Response<Body> {
    if request
        .headers()
        .keys()
        .any(|name| name.as_str().starts_with("x-metadata-"))
    {
        return http::rest_error(
            StatusCode::BAD_REQUEST,
            "X-Metadata-* (file metadata as user xattrs): not supported by strata serve",
        );
    }
    match *request.method() {
        Method::GET => download(entry, &request, query.get("path")).await,
        Method::POST => upload(server, entry, request, query.get("path").cloned()).await,
        _ => http::rest_error(StatusCode::METHOD_NOT_ALLOWED, "/files: GET or POST"),
    }
}

async fn download(
    entry: Arc<Entry>,
    request: &Request<Incoming>,
    path: Option<&String>,
) -> Response<Body> {
    let Some(path) = path else {
        return http::rest_error(StatusCode::BAD_REQUEST, "path: required");
    };
    let path = match absolute(path) {
        Ok(path) => path,
        Err(error) => return http::rest_error(StatusCode::BAD_REQUEST, error.message),
    };
    let gzip = http::header(request.headers(), "accept-encoding")
        .is_some_and(|value| value.split(',').any(|part| part.trim().starts_with("gzip")));
    let reading = entry.clone();
    let asked = path.clone();
    let result = tokio::task::spawn_blocking(move || {
        let live = &reading.live;
        match live.stat(&asked) {
            Ok(found) if found.kind == strata::FileKind::Dir => Err((
                StatusCode::BAD_REQUEST,
                format!("path {asked} is a directory"),
            )),
            Ok(found) if found.size > MAX_UPLOAD as u64 => Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "{asked}: {} bytes (at most {MAX_UPLOAD} per download)",
                    found.size
                ),
            )),
            Ok(_) => live
                .read_file(&asked)
                .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
            Err(_) => Err((StatusCode::NOT_FOUND, format!("path {asked} not found"))),
        }
    })
    .await;
    let data = match result {
        Ok(Ok(data)) => data,
        Ok(Err((status, message))) => return http::rest_error(status, message),
        Err(e) => return http::rest_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if gzip {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if encoder.write_all(&data).is_ok() {
            if let Ok(compressed) = encoder.finish() {
                let mut response = http::respond(
                    StatusCode::OK,
                    "application/octet-stream",
                    http::full(compressed),
                );
                response.headers_mut().insert(
                    hyper::header::CONTENT_ENCODING,
                    hyper::header::HeaderValue::from_static("gzip"),
                );
                return response;
            }
        }
    }
    http::respond(StatusCode::OK, "application/octet-stream", http::full(data))
}

/// Decompresses a gzip body, at most [`MAX_UPLOAD`] bytes out.
fn gunzip(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_UPLOAD as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the gzip body: {e}"))?;
    if out.len() > MAX_UPLOAD {
        return Err(format!("the file is over {MAX_UPLOAD} bytes"));
    }
    Ok(out)
}

/// The files of a multipart body: each part's file name (its path when the query names
/// none) and bytes.
async fn parts(body: Bytes, boundary: String) -> Result<Vec<(Option<String>, Bytes)>, String> {
    let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut files = Vec::new();
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| format!("the multipart body: {e}"))?
    {
        let name = field.file_name().map(String::from);
        let data = field
            .bytes()
            .await
            .map_err(|e| format!("the multipart body: {e}"))?;
        files.push((name, data));
    }
    Ok(files)
}

async fn upload(
    server: Arc<Server>,
    entry: Arc<Entry>,
    request: Request<Incoming>,
    path: Option<String>,
) -> Response<Body> {
    let content_type = http::header(request.headers(), "content-type")
        .unwrap_or("")
        .to_string();
    let gzip = http::header(request.headers(), "content-encoding") == Some("gzip");
    let body = match http::read_body(request.into_body(), MAX_UPLOAD + (1 << 20)).await {
        Ok(body) => body,
        Err(BodyError::TooLarge(_)) => {
            return http::rest_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("an upload over {MAX_UPLOAD} bytes"),
            )
        }
        Err(e) => return e.response(),
    };
    let files: Vec<(String, Vec<u8>)> = if content_type.starts_with("multipart/form-data") {
        let boundary = match multer::parse_boundary(&content_type) {
            Ok(boundary) => boundary,
            Err(e) => {
                return http::rest_error(StatusCode::BAD_REQUEST, format!("Content-Type: {e}"))
            }
        };
        let found = match parts(body, boundary).await {
            Ok(found) => found,
            Err(message) => return http::rest_error(StatusCode::BAD_REQUEST, message),
        };
        let single = found.len() == 1;
        let mut files = Vec::new();
        for (name, data) in found {
            let target = match (&path, name) {
                (Some(path), _) if single => path.clone(),
                (_, Some(name)) => name,
                (_, None) => {
                    return http::rest_error(
                        StatusCode::BAD_REQUEST,
                        "a multipart file without a file name (and no path)",
                    )
                }
            };
            files.push((target, data.to_vec()));
        }
        files
    } else {
        let Some(path) = path else {
            return http::rest_error(StatusCode::BAD_REQUEST, "path: required");
        };
        let data = if gzip {
            match gunzip(&body) {
                Ok(data) => data,
                Err(message) => return http::rest_error(StatusCode::BAD_REQUEST, message),
            }
        } else {
            body.to_vec()
        };
        vec![(path, data)]
    };
    let mut targets = Vec::new();
    for (path, data) in files {
        match absolute(&path) {
            Ok(path) => targets.push((path, data)),
            Err(error) => return http::rest_error(StatusCode::BAD_REQUEST, error.message),
        }
    }
    let names: Vec<String> = targets.iter().map(|(path, _)| path.clone()).collect();
    if let Err(e) = server.audit(
        "e2b.files.write",
        "granted",
        format!("sandbox {} {names:?}", entry.id),
    ) {
        return http::rest_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    let writing = entry.clone();
    let result = tokio::task::spawn_blocking(move || {
        let live = &writing.live;
        let mut written = Vec::new();
        for (path, data) in targets {
            if let Some((parent, _)) = path.rsplit_once('/') {
                if !parent.is_empty() {
                    live.mkdir(parent, true).map_err(|e| e.to_string())?;
                }
            }
            live.write_file(&path, &data).map_err(|e| e.to_string())?;
            let name = path.rsplit('/').next().unwrap_or("").to_string();
            written.push(json!({ "name": name, "type": "file", "path": path }));
        }
        Ok::<_, String>(written)
    })
    .await;
    match result {
        Ok(Ok(written)) => http::json(StatusCode::OK, &serde_json::Value::Array(written)),
        Ok(Err(message)) => http::rest_error(StatusCode::BAD_REQUEST, message),
        Err(e) => http::rest_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdks() {
        // python3 -c 'import hashlib,base64;print(base64.b64encode(hashlib.sha256(
        //   b"/home/user/a.txt:read::tok").digest()).rstrip(b"=").decode())'
        assert_eq!(
            signature_of("/home/user/a.txt", "read", "", "tok", None),
            "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"
        );
    }
}
