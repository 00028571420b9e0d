//! Connect-RPC with the JSON codec, as E2B's SDKs speak it to envd: unary calls
//! (`application/json` in and out, an error as an HTTP status and `{code, message}`) and
//! streams (`application/connect+json`: each message a 5-byte envelope, its flags and its
//! big-endian length, then JSON; the server's last message, flagged `0x02`, ends the stream
//! with an error or none).
//!
//! Written here rather than taken from a crate: the Rust Connect implementations
//! (connectrpc, tonic-web) generate code from the `.proto` files and bring their own server
//! stacks; the two services need only this framing, on the server's hyper.

use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use strata::{Error, ErrorKind};

/// Envelope flag of a stream's last message (its end, with or without an error).
const END_STREAM: u8 = 0x02;
/// Envelope flag of a compressed message (refused: compression is never negotiated).
const COMPRESSED: u8 = 0x01;
/// The largest message a client may send in one envelope.
pub const MAX_MESSAGE: usize = 4 << 20;

/// A Connect error code (the subset envd answers with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Canceled,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the Connect protocol's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC's failure: its code and a message naming the problem.
#[derive(Clone, Debug)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// The error as Connect's JSON `{code, message}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.name(), "message": self.message })
    }
}

impl From<Error> for RpcError {
    fn from(error: Error) -> RpcError {
        let code = match error.kind() {
            ErrorKind::InvalidRequest => Code::InvalidArgument,
            ErrorKind::Denied => Code::PermissionDenied,
            ErrorKind::Unavailable => Code::Unavailable,
            ErrorKind::Unenforceable => Code::FailedPrecondition,
            ErrorKind::LimitExceeded => Code::ResourceExhausted,
            _ => Code::Internal,
        };
        RpcError::new(code, error.to_string())
    }
}

/// Parses a unary request's JSON body (an empty body is the empty message).
pub fn parse_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("the request: {e}")))
}

/// JSON of a unary answer.
pub fn unary_json<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()))
}

/// One message in its envelope.
pub fn envelope<T: Serialize>(value: &T) -> Bytes {
    frame(
        0,
        &serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// A stream's end: `{}`, or `{"error": {code, message}}`.
pub fn end_of_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(error) => serde_json::json!({ "error": error.json() }),
        None => serde_json::json!({}),
    };
    frame(END_STREAM, body.to_string().as_bytes())
}

fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(json);
    Bytes::from(out)
}

/// Reads enveloped messages out of a request body as its bytes arrive.
#[derive(Default)]
pub struct Envelopes {
    buffer: Vec<u8>,
}

impl Envelopes {
    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), RpcError> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() > MAX_MESSAGE + 5 {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("a message over {MAX_MESSAGE} bytes"),
            ));
        }
        Ok(())
    }

    /// The next whole message, if one has arrived: its flags and JSON.
    pub fn next_message(&mut self) -> Result<Option<(u8, Vec<u8>)>, RpcError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let flags = self.buffer[0];
        let len = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if len > MAX_MESSAGE {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("a message of {len} bytes (at most {MAX_MESSAGE})"),
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Unimplemented,
                "compressed messages (no compression is negotiated)",
            ));
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let message = self.buffer[5..5 + len].to_vec();
        self.buffer.drain(..5 + len);
        Ok(Some((flags, message)))
    }
}

/// The single request message of a server-streaming call.
pub fn stream_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    let mut envelopes = Envelopes::default();
    envelopes.push(body)?;
    match envelopes.next_message()? {
        Some((_, message)) => parse_unary(&message),
        None => Err(RpcError::new(
            Code::InvalidArgument,
            "a streaming call without its request message",
        )),
    }
}

/// The call's deadline from `Connect-Timeout-Ms` (none when absent; a bad value is an error).
pub fn timeout(headers: &hyper::HeaderMap) -> Result<Option<Duration>, RpcError> {
    match headers.get("connect-timeout-ms") {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .filter(|ms| *ms > 0 && ms.to_string().len() <= 10)
            .map(|ms| Some(Duration::from_millis(ms)))
            .ok_or_else(|| {
                RpcError::new(
                    Code::InvalidArgument,
                    "Connect-Timeout-Ms: 1 to 10 digits of milliseconds",
                )
            }),
    }
}

/// How often to send a keepalive on a stream (`Keepalive-Ping-Interval`, seconds; default
/// 50, at least 1).
pub fn keepalive(headers: &hyper::HeaderMap) -> Duration {
    let seconds = headers
        .get("keepalive-ping-interval")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok())
        .unwrap_or(50)
        .clamp(1, 3600);
    Duration::from_secs(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_split_and_join_across_reads() {
        let one = envelope(&serde_json::json!({"a": 1}));
        let two = end_of_stream(None);
        let mut all = one.to_vec();
        all.extend_from_slice(&two);
        let mut reader = Envelopes::default();
        reader.push(&all[..3]).expect("push");
        assert!(reader.next_message().expect("ok").is_none());
        reader.push(&all[3..]).expect("push");
        let (flags, json) = reader.next_message().expect("ok").expect("first");
        assert_eq!((flags, json.as_slice()), (0, br#"{"a":1}"#.as_slice()));
        let (flags, json) = reader.next_message().expect("ok").expect("second");
        assert_eq!((flags, json.as_slice()), (END_STREAM, b"{}".as_slice()));
        assert!(reader.next_message().expect("ok").is_none());
    }

    #[test]
    fn an_oversized_or_compressed_message_is_refused() {
        let mut reader = Envelopes::default();
        let mut big = vec![0u8];
        big.extend_from_slice(&u32::MAX.to_be_bytes());
        reader.push(&big).expect("push");
        assert_eq!(
            reader.next_message().expect_err("too big").code,
            Code::ResourceExhausted
        );
        let mut reader = Envelopes::default();
        reader
            .push(&[COMPRESSED, 0, 0, 0, 2, b'{', b'}'])
            .expect("push");
        assert_eq!(
            reader.next_message().expect_err("compressed").code,
            Code::Unimplemented
        );
    }

    #[test]
    fn a_bad_timeout_header_is_an_error() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("connect-timeout-ms", "abc".parse().expect("value"));
        assert!(timeout(&headers).is_err());
        headers.insert("connect-timeout-ms", "1500".parse().expect("value"));
        assert_eq!(
            timeout(&headers).expect("ok"),
            Some(Duration::from_millis(1500))
        );
    }
}
