//! The HTTP pieces every handler shares: the response body type, JSON and error answers,
//! bounded body reads, and query strings.

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

/// Every response's body.
pub type Body = BoxBody<Bytes, Infallible>;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// A body streamed from `rx` until its sender is dropped.
pub fn streamed(rx: mpsc::Receiver<Bytes>) -> Body {
    BoxBody::new(Channel { rx })
}

/// A body of the chunks a channel receives.
struct Channel {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}

/// A response with `status`, `content_type` and `body`.
pub fn respond(status: StatusCode, content_type: &str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// JSON of `value` with `status`.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    respond(status, "application/json", full(value.to_string()))
}

/// No content.
pub fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// E2B's REST error: `{code, message}` with the HTTP status as the code.
pub fn rest_error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json(
        status,
        &serde_json::json!({ "code": status.as_u16(), "message": message.into() }),
    )
}

/// Why a body could not be read.
pub enum BodyError {
    /// Larger than the limit.
    TooLarge(usize),
    /// The connection failed.
    Broken(String),
}

impl BodyError {
    /// As a REST error.
    pub fn response(&self) -> Response<Body> {
        match self {
            BodyError::TooLarge(limit) => rest_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {limit} bytes"),
            ),
            BodyError::Broken(why) => rest_error(
                StatusCode::BAD_REQUEST,
                format!("reading the request: {why}"),
            ),
        }
    }
}

/// The whole body, at most `limit` bytes.
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, BodyError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => {
            if error.is::<http_body_util::LengthLimitError>() {
                Err(BodyError::TooLarge(limit))
            } else {
                Err(BodyError::Broken(error.to_string()))
            }
        }
    }
}

/// A query string's parameters (percent-decoded; `+` is a space; the first value of a
/// repeated key wins).
pub fn query(uri: &hyper::Uri) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in pairs(uri.query().unwrap_or("")) {
        out.entry(key).or_insert(value);
    }
    out
}

/// `a=1&b=2` as decoded pairs, in order.
pub fn pairs(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// Percent-decoding (invalid escapes are kept as they are).
pub fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(byte: u8) -> Option<u8> {
    (byte as char)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// A header's value as text, if present and visible ASCII.
pub fn header<'a>(headers: &'a hyper::HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        assert_eq!(decode("a%20b+c%2Fd"), "a b c/d");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz"), "%zz");
        let uri: hyper::Uri = "/x?path=%2Fhome%2Fuser&path=second&flag"
            .parse()
            .expect("uri");
        let q = query(&uri);
        assert_eq!(q.get("path").map(String::as_str), Some("/home/user"));
        assert_eq!(q.get("flag").map(String::as_str), Some(""));
    }
}
