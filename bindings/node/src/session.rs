//! Sessions for Node (`strata::Session`): the file operations run on libuv's thread pool
//! and settle a Promise; calls run through [`crate::NativeSandbox::run`] like any run.

use std::path::PathBuf;

use napi::bindgen_prelude::{AsyncTask, Buffer, Either, Either3, Unknown};
use napi::{Env, Task};
use napi_derive::napi;
use strata::session::{Session, SessionOptions};
use strata::{ByteSize, Caps};

use crate::convert::{self, NativeError, NodeCaps};
use crate::NativeSandbox;

/// A session handle (see `Session` in index.d.ts).
#[napi]
pub struct NativeSession {
    pub(crate) session: Session,
}

/// A byte size from a number or a size such as `256M`.
fn byte_size(value: Either<f64, String>, what: &str) -> strata::Result<ByteSize> {
    match value {
        Either::A(n) if n.is_finite() && n >= 0.0 => Ok(ByteSize(n as u64)),
        Either::A(n) => Err(strata::Error::invalid(format!(
            "{what} must be a non-negative number of bytes, got {n}"
        ))),
        Either::B(text) => text
            .parse::<ByteSize>()
            .map_err(|e| strata::Error::invalid(format!("{what}: {e}"))),
    }
}

#[napi]
impl NativeSandbox {
    /// Opens a session with `caps` (default: the profile's, else `{}`); `workdir` and
    /// `maxTransfer` default to the profile's `[session]` table, else `/workspace` and
    /// 256 MiB.
    #[napi]
    pub fn open_session(
        &self,
        env: Env,
        caps: Unknown<'_>,
        workdir: Option<String>,
        max_transfer: Option<Either<f64, String>>,
    ) -> Either<NativeSession, NativeError> {
        let caps: Caps = match (
            env.from_js_value::<Option<NodeCaps>, _>(caps),
            &self.profile,
        ) {
            (Ok(None), Some(profile)) => profile.caps.clone(),
            (Ok(caps), _) => caps.unwrap_or_default().into(),
            (Err(e), _) => return Either::B((&convert::invalid_argument("caps", &e)).into()),
        };
        let opened = (|| {
            let mut options = match &self.profile {
                Some(profile) => profile.session_options(),
                None => SessionOptions::default(),
            };
            if let Some(workdir) = workdir {
                options.workdir = PathBuf::from(workdir);
            }
            if let Some(limit) = max_transfer {
                options.max_transfer = byte_size(limit, "maxTransfer")?;
            }
            self.inner.session_with(&caps, options)
        })();
        match opened {
            Ok(session) => Either::A(NativeSession { session }),
            Err(e) => Either::B((&e).into()),
        }
    }
}

/// One file operation of a session.
pub enum FileOp {
    /// Write bytes to a path.
    Write(String, Vec<u8>),
    /// Read a file.
    Read(String),
    /// Copy a host path in.
    Upload(PathBuf, String),
    /// Copy out to a host path.
    Download(String, PathBuf),
    /// List a directory.
    List(String),
    /// Remove a path.
    Remove(String),
    /// Close the session.
    Close,
}

/// What a file operation gives back: bytes, or JSON text (`null` for nothing).
pub enum FileDone {
    /// File contents.
    Bytes(Vec<u8>),
    /// A JSON document.
    Json(String),
}

/// A session file operation on libuv's thread pool.
pub struct FileTask {
    session: Session,
    op: Option<FileOp>,
}

fn json<T: serde::Serialize>(value: &T) -> strata::Result<FileDone> {
    serde_json::to_string(value)
        .map(FileDone::Json)
        .map_err(|e| strata::Error::invalid(format!("not representable as JSON: {e}")))
}

impl Task for FileTask {
    type Output = strata::Result<FileDone>;
    type JsValue = Either3<Buffer, String, NativeError>;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        let s = &self.session;
        let Some(op) = self.op.take() else {
            return Ok(Err(strata::Error::invalid("this operation already ran")));
        };
        let null = || FileDone::Json("null".into());
        Ok(match op {
            FileOp::Write(path, data) => s.write_file(&path, &data).map(|()| null()),
            FileOp::Read(path) => s.read_file(&path).map(FileDone::Bytes),
            FileOp::Upload(host, path) => s.upload(&host, &path).and_then(|t| json(&t)),
            FileOp::Download(path, host) => s.download(&path, &host).and_then(|t| json(&t)),
            FileOp::List(path) => s.list_files(&path).and_then(|e| json(&e)),
            FileOp::Remove(path) => s.remove(&path).map(|()| null()),
            FileOp::Close => s.close().map(|()| null()),
        })
    }

    fn resolve(&mut self, _env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
        Ok(match output {
            Ok(FileDone::Bytes(data)) => Either3::A(Buffer::from(data)),
            Ok(FileDone::Json(text)) => Either3::B(text),
            Err(e) => Either3::C((&e).into()),
        })
    }
}

#[napi]
impl NativeSession {
    fn task(&self, op: FileOp) -> AsyncTask<FileTask> {
        AsyncTask::new(FileTask {
            session: self.session.clone(),
            op: Some(op),
        })
    }

    /// The session's id.
    #[napi(getter)]
    pub fn id(&self) -> String {
        self.session.id().to_string()
    }

    /// The guest path of the session's directory.
    #[napi(getter)]
    pub fn workdir(&self) -> String {
        self.session.workdir().to_string_lossy().into_owned()
    }

    /// Whether the session was closed.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.session.is_closed()
    }

    /// Writes `data` to `path`: resolves to `"null"` or a NativeError.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn write_file(&self, path: String, data: Buffer) -> AsyncTask<FileTask> {
        self.task(FileOp::Write(path, data.to_vec()))
    }

    /// Reads `path`: resolves to a Buffer or a NativeError.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn read_file(&self, path: String) -> AsyncTask<FileTask> {
        self.task(FileOp::Read(path))
    }

    /// Copies the host path `host` to `path`: resolves to the transfer as JSON.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn upload(&self, host: String, path: String) -> AsyncTask<FileTask> {
        self.task(FileOp::Upload(PathBuf::from(host), path))
    }

    /// Copies `path` to the new host path `host`: resolves to the transfer as JSON.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn download(&self, path: String, host: String) -> AsyncTask<FileTask> {
        self.task(FileOp::Download(path, PathBuf::from(host)))
    }

    /// Lists the directory `path`: resolves to the entries as JSON.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn list_files(&self, path: String) -> AsyncTask<FileTask> {
        self.task(FileOp::List(path))
    }

    /// Removes `path`.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn remove(&self, path: String) -> AsyncTask<FileTask> {
        self.task(FileOp::Remove(path))
    }

    /// Cancels the calls in flight and removes the session's directory.
    #[napi(ts_return_type = "Promise<Buffer | string | NativeError>")]
    pub fn close(&self) -> AsyncTask<FileTask> {
        self.task(FileOp::Close)
    }
}
