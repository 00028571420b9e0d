//! `strata mcp`: a Model Context Protocol server (the official Rust SDK, `rmcp`) that runs
//! AI agents' tools in sandboxes, over stdio (default) or streamable HTTP (`--http ADDR`,
//! path `/mcp`). It serves protocol revisions 2026-07-28 (`server/discover`, per-request
//! metadata, no MCP session) and 2025-11-25 (the `initialize` handshake); a client asking
//! `initialize` for an older revision is offered 2025-11-25.
//!
//! Tools: `run` (one run in a fresh sandbox: `argv`, or `code` + `language`), and
//! `session_open`, `session_run`, `session_write_file`, `session_read_file`,
//! `session_list_files`, `session_close` (a [`strata::Session`]: files that persist between
//! runs in a private directory mounted at its workdir).
//!
//! Every run and session gets the caps of the profile chosen when the server starts
//! (`--profile FILE`; default: the default caps, no mounts and no network). Nothing a client
//! sends widens them: the only knob is `timeout_ms`, which can only lower the profile's
//! timeout. The tools' annotations follow from the caps: `readOnlyHint` when no mount is
//! writable, `destructiveHint` when a host directory is mounted read-write, `openWorldHint`
//! when the network is not `none`.
//!
//! A run that ends any other way than exit code 0 is an `isError` result carrying its
//! status, stdout and stderr; a request that could not run (bad arguments, a refusal, an
//! unknown or closed session) is an `isError` result `{"error": {kind, message}}`. Only an
//! unknown tool name is a JSON-RPC error.
//!
//! Sessions are kept by id (at most `--max-sessions`, default the profile's
//! `session.max_open`, 16) and shared by every client of this server (with 2026-07-28 there
//! is no MCP session to tie them to); the id is the capability. All are closed when the server stops (end of stdin, SIGINT or SIGTERM).

use std::borrow::Cow;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool as McpTool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use strata::{
    Access, CancelToken, Caps, Error, Net, Profile, RunContext, RunOutput, Sandbox, ScriptLanguage,
    Session, SessionOptions, Tool,
};
use tokio_util::sync::CancellationToken;

use crate::args::McpArgs;

/// The protocol revisions served, oldest first (advertised by `server/discover`; bounds
/// what `initialize` agrees to).
const PROTOCOL_VERSIONS: &[ProtocolVersion] =
    &[ProtocolVersion::V_2025_11_25, ProtocolVersion::V_2026_07_28];

/// The most file bytes one `session_read_file` or `session_write_file` moves (the content
/// travels in a JSON message; bigger files are for `upload`/`download` of the library).
const MAX_FILE_BYTES: usize = 16 << 20;

/// How many `session_read_file` calls hold file contents in memory at once (each at most
/// [`MAX_FILE_BYTES`] and its encoding); more wait their turn.
const MAX_READS_AT_ONCE: usize = 4;

mod tools;

use tools::*;

/// `strata mcp`: serves until the client goes away or a signal stops it. Exit 0 then; 2 for
/// a bad profile or address, 125 when the sandbox or the server cannot start.
pub fn main(args: McpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-mcp")
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("strata mcp: cannot start the async runtime: {e}");
            return ExitCode::from(125);
        }
    };
    let result = runtime.block_on(serve(args));
    // A blocking stdin read may still be pending (stdio): do not wait for it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strata mcp: {e}");
            crate::error_code(&e)
        }
    }
}

async fn serve(args: McpArgs) -> strata::Result<()> {
    let profile = match &args.profile {
        Some(path) => Profile::load(path)?,
        None => Profile::default(),
    };
    profile.caps.validate()?;
    let sandbox = profile.apply(Sandbox::builder()).build()?;
    let max_sessions = args
        .max_sessions
        .map_or(profile.session.max_open, |n| n as usize);
    let server = StrataMcp::new(sandbox, &profile, max_sessions);
    let stopped = CancellationToken::new();
    let result = match &args.http {
        Some(addr) => serve_http(server.clone(), addr, &args.allow_host, stopped.clone()).await,
        None => serve_stdio(server.clone(), stopped.clone()).await,
    };
    stopped.cancel();
    server.shutdown().await;
    result
}

/// Serves one client on stdin/stdout until it closes stdin or a signal arrives.
async fn serve_stdio(server: StrataMcp, stopped: CancellationToken) -> strata::Result<()> {
    let ct = stopped.child_token();
    let serve = async {
        // Waits for the client's first request (initialize, or one carrying 2026-07-28 metadata).
        let running = server
            .serve_with_ct(rmcp::transport::stdio_pipes(), ct.clone())
            .await
            .map_err(|e| Error::invalid(format!("MCP over stdio: {e}")))?;
        running
            .waiting()
            .await
            .map_err(|e| internal(format!("MCP service task: {e}")))?;
        Ok(())
    };
    tokio::select! {
        result = serve => result,
        () = crate::shutdown::terminated() => {
            ct.cancel();
            Ok(())
        }
    }
}

/// Serves streamable HTTP at `addr`, path `/mcp`, statelessly (no `Mcp-Session-Id`: every
/// request stands alone, as 2026-07-28 requires; 2025-11-25 clients work the same way).
async fn serve_http(
    server: StrataMcp,
    addr: &str,
    allow_hosts: &[String],
    stopped: CancellationToken,
) -> strata::Result<()> {
    use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    use tower_service::Service as _;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::invalid(format!("--http {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::invalid(format!("--http {addr}: {e}")))?;
    if !local.ip().is_loopback() && allow_hosts.is_empty() {
        return Err(Error::invalid(format!(
            "--http {addr}: {} is not a loopback address; anyone who reaches it can run tools \
             with the profile's caps (there is no authentication). Name the host clients use \
             with --allow-host HOST to serve it anyway",
            local.ip()
        )));
    }
    // Host: loopback names always, more only when asked (DNS rebinding). Origin: none at
    // all; agents' clients send none, and a browser page must not drive the sandbox.
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    hosts.extend(allow_hosts.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .enforce_origin_validation()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_cancellation_token(stopped.child_token());
    let service: StreamableHttpService<StrataMcp, NeverSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    // The address on stdout (a test or a supervisor reads it, e.g. after port 0).
    println!("http://{local}/mcp");
    eprintln!("strata mcp: serving streamable HTTP at http://{local}/mcp");
    crate::shutdown::serve_http1(listener, "strata mcp", stopped, move || {
        let service = service.clone();
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let mut service = service.clone();
            async move {
                if request.uri().path() != "/mcp" {
                    return Ok(not_found());
                }
                service.call(request).await
            }
        })
    })
    .await;
    Ok(())
}

type HttpBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

fn not_found() -> hyper::Response<HttpBody> {
    use http_body_util::BodyExt as _;
    let body = http_body_util::Full::new(bytes::Bytes::from_static(
        b"not found: the MCP endpoint is /mcp\n",
    ))
    .boxed();
    let mut response = hyper::Response::new(body);
    *response.status_mut() = hyper::StatusCode::NOT_FOUND;
    response
}

/// The MCP server: cheap to clone (the HTTP transport makes one per request).
#[derive(Clone)]
pub struct StrataMcp {
    inner: Arc<Inner>,
}

struct Inner {
    sandbox: Sandbox,
    /// The profile's caps: every run and session gets exactly these.
    caps: Caps,
    /// The profile's risk, declared on every run.
    risk: Option<strata::policy::Risk>,
    session_options: SessionOptions,
    max_sessions: usize,
    sessions: Mutex<HashMap<String, Session>>,
    /// Slots for file reads held in memory ([`MAX_READS_AT_ONCE`]).
    reads: tokio::sync::Semaphore,
    tools: Vec<McpTool>,
    /// Cancelled when the server stops: every run still going is killed.
    stopping: CancellationToken,
}

impl StrataMcp {
    pub fn new(sandbox: Sandbox, profile: &Profile, max_sessions: usize) -> Self {
        StrataMcp {
            inner: Arc::new(Inner {
                sandbox,
                caps: profile.caps.clone(),
                risk: profile.risk,
                session_options: profile.session_options(),
                max_sessions,
                sessions: Mutex::new(HashMap::new()),
                reads: tokio::sync::Semaphore::new(MAX_READS_AT_ONCE),
                tools: tools(&profile.caps),
                stopping: CancellationToken::new(),
            }),
        }
    }

    /// Kills the runs still going and closes every session.
    async fn shutdown(&self) {
        self.inner.stopping.cancel();
        let sessions: Vec<Session> = self.sessions().drain().map(|(_, s)| s).collect();
        let closing = tokio::task::spawn_blocking(move || {
            for session in sessions {
                if let Err(e) = session.close() {
                    eprintln!("strata mcp: closing session {}: {e}", session.id());
                }
            }
        });
        let _ = closing.await;
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Session>> {
        match self.inner.sessions.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The open session whose id is `id`: ids are compared in constant time (the id is the
    /// capability), never by a lookup that stops at the first differing byte.
    fn session(&self, id: &str) -> strata::Result<Session> {
        let sessions = self.sessions();
        let found = sessions
            .iter()
            .find(|(known, _)| strata::token::same(id.as_bytes(), known.as_bytes()))
            .map(|(_, session)| session.clone());
        found.ok_or_else(|| {
            Error::invalid(format!(
                "no open session {id:?} (session_open makes one; session_close or a server restart ends it)"
            ))
        })
    }

    async fn call(
        &self,
        name: &str,
        args: JsonObject,
        cancelled: CancellationToken,
    ) -> Option<strata::Result<CallToolResult>> {
        Some(match name {
            "run" => self.run(args, cancelled).await,
            "session_open" => self.session_open(args).await,
            "session_run" => self.session_run(args, cancelled).await,
            "session_write_file" => self.session_write_file(args).await,
            "session_read_file" => self.session_read_file(args).await,
            "session_list_files" => self.session_list_files(args).await,
            "session_close" => self.session_close(args).await,
            _ => return None,
        })
    }

    async fn run(
        &self,
        args: JsonObject,
        cancelled: CancellationToken,
    ) -> strata::Result<CallToolResult> {
        let params: RunParams = params(args)?;
        let tool = params.tool()?;
        let mut caps = self.inner.caps.clone();
        if let Some(timeout) = lowered_timeout(caps.limits.timeout, params.timeout_ms)? {
            caps.limits.timeout = timeout;
        }
        let ctx = self.run_context();
        let sandbox = self.inner.sandbox.clone();
        let cancel = ctx.cancel.clone();
        let out = self
            .blocking_run(cancelled, cancel, move || {
                sandbox.run_with(&tool, &caps, &ctx)
            })
            .await?;
        Ok(run_result(&out))
    }

    async fn session_open(&self, args: JsonObject) -> strata::Result<CallToolResult> {
        let _: NoParams = params(args)?;
        let this = self.clone();
        let session = blocking(move || {
            // Held while the session is made, so two opens cannot both take the last place.
            let mut sessions = this.sessions();
            if this.inner.stopping.is_cancelled() {
                return Err(Error::invalid("the server is stopping"));
            }
            if sessions.len() >= this.inner.max_sessions {
                return Err(Error::invalid(format!(
                    "{} sessions are open, the most this server allows; close one with session_close",
                    sessions.len()
                )));
            }
            let session = this
                .inner
                .sandbox
                .session_with(&this.inner.caps, this.inner.session_options.clone())?;
            sessions.insert(session.id().to_string(), session.clone());
            Ok(session)
        })
        .await?;
        Ok(CallToolResult::structured(json!({
            "session_id": session.id(),
            "workdir": session.workdir().to_string_lossy(),
        })))
    }

    async fn session_run(
        &self,
        args: JsonObject,
        cancelled: CancellationToken,
    ) -> strata::Result<CallToolResult> {
        let params: SessionRunParams = params(args)?;
        let session = self.session(&params.session_id)?;
        let run = params.run();
        let tool = run.tool()?;
        let call = strata::Call {
            timeout: lowered_timeout(session.caps().limits.timeout, run.timeout_ms)?,
            ctx: self.run_context(),
        };
        let cancel = call.ctx.cancel.clone();
        let out = self
            .blocking_run(cancelled, cancel, move || session.run_with(&tool, &call))
            .await?;
        Ok(run_result(&out))
    }

    async fn session_write_file(&self, args: JsonObject) -> strata::Result<CallToolResult> {
        let params: WriteParams = params(args)?;
        let session = self.session(&params.session_id)?;
        let data = match params.encoding.unwrap_or_default() {
            Encoding::Utf8 => params.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(params.content.as_bytes())
                .map_err(|e| Error::invalid(format!("content: not valid base64: {e}")))?,
        };
        if data.len() > MAX_FILE_BYTES {
            return Err(Error::invalid(format!(
                "content: {} bytes, more than the {MAX_FILE_BYTES} one call may write",
                data.len()
            )));
        }
        let bytes = data.len();
        let path = params.path;
        let written = path.clone();
        blocking(move || session.write_file(&written, &data)).await?;
        Ok(CallToolResult::structured(
            json!({ "path": path, "bytes": bytes }),
        ))
    }

    async fn session_read_file(&self, args: JsonObject) -> strata::Result<CallToolResult> {
        let params: ReadParams = params(args)?;
        let session = self.session(&params.session_id)?;
        let path = params.path.clone();
        // Reads at once are bounded (each holds its file and its encoding in memory), and
        // each checks the file's size before reading any of it.
        let _slot = self
            .inner
            .reads
            .acquire()
            .await
            .map_err(|_| internal("the server is stopping".into()))?;
        let data =
            blocking(move || session.read_file_at_most(&path, MAX_FILE_BYTES as u64)).await?;
        let bytes = data.len();
        let encoding = params.encoding.unwrap_or_default();
        let content = match encoding {
            Encoding::Utf8 => String::from_utf8(data).map_err(|_| {
                Error::invalid(format!(
                    "{}: not UTF-8 text; read it with encoding \"base64\"",
                    params.path
                ))
            })?,
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(&data),
        };
        Ok(CallToolResult::structured(json!({
            "path": params.path,
            "bytes": bytes,
            "encoding": encoding,
            "content": content,
        })))
    }

    async fn session_list_files(&self, args: JsonObject) -> strata::Result<CallToolResult> {
        let params: ListParams = params(args)?;
        let session = self.session(&params.session_id)?;
        let path = params.path.unwrap_or_else(|| ".".to_string());
        let listed = path.clone();
        let entries = blocking(move || session.list_files(&listed)).await?;
        let entries = serde_json::to_value(&entries)
            .map_err(|e| internal(format!("listing as JSON: {e}")))?;
        Ok(CallToolResult::structured(
            json!({ "path": path, "entries": entries }),
        ))
    }

    async fn session_close(&self, args: JsonObject) -> strata::Result<CallToolResult> {
        let params: SessionParams = params(args)?;
        let session = {
            let mut sessions = self.sessions();
            let key = sessions
                .keys()
                .find(|known| strata::token::same(params.session_id.as_bytes(), known.as_bytes()))
                .cloned();
            key.and_then(|key| sessions.remove(&key))
        }
        .ok_or_else(|| Error::invalid(format!("no open session {:?}", params.session_id)))?;
        blocking(move || session.close()).await?;
        Ok(CallToolResult::structured(
            json!({ "session_id": params.session_id, "closed": true }),
        ))
    }

    /// A fresh context: the profile's risk, and a cancel token of this run alone.
    fn run_context(&self) -> RunContext {
        RunContext {
            risk: self.inner.risk,
            cancel: CancelToken::new(),
            ..RunContext::default()
        }
    }

    /// Runs `run` on the blocking pool; the request's cancellation (the client cancelled,
    /// or disconnected) and the server's stop kill it through `cancel`.
    async fn blocking_run(
        &self,
        cancelled: CancellationToken,
        cancel: CancelToken,
        run: impl FnOnce() -> strata::Result<RunOutput> + Send + 'static,
    ) -> strata::Result<RunOutput> {
        let job = tokio::task::spawn_blocking(run);
        tokio::pin!(job);
        tokio::select! {
            done = &mut job => return joined(done),
            () = cancelled.cancelled() => {}
            () = self.inner.stopping.cancelled() => {}
        }
        cancel.cancel();
        joined(job.await)
    }
}

fn internal(message: String) -> Error {
    Error::Internal {
        message,
        source: None,
    }
}

/// Runs a blocking session operation off the async threads.
async fn blocking<T: Send + 'static>(
    op: impl FnOnce() -> strata::Result<T> + Send + 'static,
) -> strata::Result<T> {
    joined(tokio::task::spawn_blocking(op).await)
}

fn joined<T>(
    result: std::result::Result<strata::Result<T>, tokio::task::JoinError>,
) -> strata::Result<T> {
    result.unwrap_or_else(|e| Err(internal(format!("the call's task: {e}"))))
}

impl ServerHandler for StrataMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("strata", env!("CARGO_PKG_VERSION")).with_title("Strata"),
            )
            .with_instructions(instructions(&self.inner.caps))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(PROTOCOL_VERSIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<McpTool> {
        self.inner.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        match self.call(&request.name, args, context.ct.clone()).await {
            Some(Ok(result)) => Ok(result.into()),
            Some(Err(e)) => Ok(error_result(&e).into()),
            None => Err(McpError::invalid_params(
                format!("unknown tool {:?}", request.name),
                None,
            )),
        }
    }
}

/// The result of a run: structured JSON (also as text), `isError` unless it exited 0.
fn run_result(out: &RunOutput) -> CallToolResult {
    let value = json!({
        "ok": out.success(),
        "status": out.status,
        "exit_code": out.exit_code(),
        "signal": out.signal(),
        "timed_out": out.timed_out(),
        "limit": out.limit(),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        "stdout_truncated": out.stdout_truncated,
        "stderr_truncated": out.stderr_truncated,
        "duration_ms": out.duration.as_secs_f64() * 1000.0,
    });
    if out.success() {
        CallToolResult::structured(value)
    } else {
        CallToolResult::structured_error(value)
    }
}

/// A request that did not run: `isError` with `{"error": {kind, message}}` (the kinds of
/// `strata run --json`).
fn error_result(err: &Error) -> CallToolResult {
    CallToolResult::structured_error(crate::error_json(err))
}

fn params<T: DeserializeOwned>(args: JsonObject) -> strata::Result<T> {
    serde_json::from_value(Value::Object(args))
        .map_err(|e| Error::invalid(format!("arguments: {e}")))
}

/// `timeout_ms` of a call: at most the caps' timeout (it can only lower it). `None` keeps
/// the caps' timeout.
fn lowered_timeout(caps: Duration, requested_ms: Option<u64>) -> strata::Result<Option<Duration>> {
    match requested_ms {
        None => Ok(None),
        Some(0) => Err(Error::invalid(
            "timeout_ms: at least 1 (it can lower the server's timeout, never lift it)",
        )),
        Some(ms) => {
            let requested = Duration::from_millis(ms);
            Ok(Some(if caps.is_zero() {
                requested
            } else {
                requested.min(caps)
            }))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoParams {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunParams {
    argv: Option<Vec<String>>,
    code: Option<String>,
    language: Option<String>,
    timeout_ms: Option<u64>,
}

impl RunParams {
    fn tool(&self) -> strata::Result<Tool> {
        match (&self.argv, &self.code, &self.language) {
            (Some(argv), None, None) if !argv.is_empty() => Ok(Tool::command(argv.iter().cloned())),
            (Some(_), None, None) => Err(Error::invalid(
                "argv: the program and its arguments, at least one string",
            )),
            (None, Some(code), Some(language)) => {
                let language: ScriptLanguage = language.parse()?;
                Ok(Tool::script(language, code.clone()))
            }
            (None, Some(_), None) => Err(Error::invalid(
                "code needs language: python, javascript or sh",
            )),
            (None, None, Some(_)) => Err(Error::invalid("language needs code")),
            (None, None, None) => Err(Error::invalid("give argv, or code and language")),
            _ => Err(Error::invalid("give argv, or code and language, not both")),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRunParams {
    session_id: String,
    argv: Option<Vec<String>>,
    code: Option<String>,
    language: Option<String>,
    timeout_ms: Option<u64>,
}

impl SessionRunParams {
    fn run(&self) -> RunParams {
        RunParams {
            argv: self.argv.clone(),
            code: self.code.clone(),
            language: self.language.clone(),
            timeout_ms: self.timeout_ms,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionParams {
    session_id: String,
}

#[derive(Clone, Copy, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Encoding {
    #[default]
    #[serde(alias = "utf-8")]
    Utf8,
    Base64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteParams {
    session_id: String,
    path: String,
    content: String,
    encoding: Option<Encoding>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadParams {
    session_id: String,
    path: String,
    encoding: Option<Encoding>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListParams {
    session_id: String,
    path: Option<String>,
}

/// What the caps allow, as the tool annotations see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reach {
    /// A host directory is mounted read-write: a run can change or delete host files.
    writes_host: bool,
    /// The network is not `none` (an empty allowlist counts as none).
    open_world: bool,
}

impl Reach {
    fn of(caps: &Caps) -> Reach {
        Reach {
            writes_host: caps.mounts.iter().any(|m| m.access == Access::ReadWrite),
            open_world: match &caps.net {
                Net::None => false,
                Net::Allow(rules) => !rules.is_empty(),
                // Host, and whatever a later version adds: assume it reaches out.
                _ => true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool<'a>(tools: &'a [McpTool], name: &str) -> &'a ToolAnnotations {
        tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.annotations.as_ref())
            .expect("annotated tool")
    }

    #[test]
    fn annotations_follow_the_caps() {
        let tools_default = tools(&Caps::new());
        let run = tool(&tools_default, "run");
        assert_eq!(run.read_only_hint, Some(true));
        assert_eq!(run.destructive_hint, Some(false));
        assert_eq!(run.open_world_hint, Some(false));
        assert_eq!(
            tool(&tools_default, "session_write_file").read_only_hint,
            Some(false)
        );
        assert_eq!(
            tool(&tools_default, "session_run").read_only_hint,
            Some(false)
        );

        let mut caps = Caps::new().with_mount(strata::Mount::new(
            "/srv".into(),
            "/srv".into(),
            Access::ReadWrite,
        ));
        caps.net = Net::Host;
        let wide = tools(&caps);
        let run = tool(&wide, "run");
        assert_eq!(run.read_only_hint, Some(false));
        assert_eq!(run.destructive_hint, Some(true));
        assert_eq!(run.open_world_hint, Some(true));
        assert_eq!(
            tool(&wide, "session_read_file").open_world_hint,
            Some(false)
        );

        caps.net = Net::Allow(Vec::new());
        assert!(
            !Reach::of(&caps).open_world,
            "an empty allowlist reaches nothing"
        );
    }

    #[test]
    fn every_tool_has_an_object_schema_and_annotations() {
        let all = tools(&Caps::new());
        let names: Vec<&str> = all.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(
            names,
            [
                "run",
                "session_open",
                "session_run",
                "session_write_file",
                "session_read_file",
                "session_list_files",
                "session_close"
            ]
        );
        for t in &all {
            assert_eq!(
                t.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                t.name
            );
            assert!(
                t.annotations.is_some() && t.output_schema.is_some(),
                "{}",
                t.name
            );
        }
    }

    #[test]
    fn timeout_ms_only_lowers() {
        let caps = Duration::from_secs(30);
        assert_eq!(lowered_timeout(caps, None).expect("none"), None);
        assert_eq!(
            lowered_timeout(caps, Some(1000)).expect("lower"),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            lowered_timeout(caps, Some(3_600_000)).expect("higher"),
            Some(caps)
        );
        assert!(lowered_timeout(caps, Some(0)).is_err());
    }

    #[test]
    fn run_arguments_name_argv_or_code_and_language() {
        let parse = |v: Value| {
            let Value::Object(args) = v else {
                panic!("object")
            };
            params::<RunParams>(args).and_then(|p| p.tool())
        };
        assert!(parse(json!({ "argv": ["true"] })).is_ok());
        assert!(parse(json!({ "code": "print(1)", "language": "python" })).is_ok());
        for bad in [
            json!({}),
            json!({ "argv": [] }),
            json!({ "code": "x" }),
            json!({ "language": "sh" }),
            json!({ "argv": ["true"], "code": "x", "language": "sh" }),
            json!({ "code": "x", "language": "cobol" }),
            json!({ "argv": ["true"], "caps": { "net": "host" } }),
        ] {
            let err = parse(bad.clone()).expect_err(&bad.to_string());
            assert_eq!(err.kind(), strata::ErrorKind::InvalidRequest, "{bad}");
        }
    }
}
