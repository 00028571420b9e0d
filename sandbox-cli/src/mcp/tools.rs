//! The tools `strata mcp` offers: their parameters, annotations and JSON Schemas, and the
//! instructions that describe the sandbox's caps to the model.

use super::*;

pub(super) fn annotations(
    title: &str,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    open_world: bool,
) -> ToolAnnotations {
    ToolAnnotations::with_title(title)
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        .open_world(open_world)
}

pub(super) fn schema(value: Value) -> Arc<JsonObject> {
    match value {
        Value::Object(object) => Arc::new(object),
        _ => Arc::new(JsonObject::new()),
    }
}

/// The properties naming what to run, shared by `run` and `session_run`.
pub(super) fn run_properties() -> serde_json::Map<String, Value> {
    let Value::Object(properties) = json!({
        "argv": {
            "type": "array", "items": { "type": "string" }, "minItems": 1,
            "description": "The program and its arguments, e.g. [\"ls\", \"-l\"] (no shell; for one, use [\"sh\", \"-c\", \"...\"] or code + language). Give argv, or code and language."
        },
        "code": { "type": "string", "description": "Source code to run (with language)." },
        "language": { "type": "string", "enum": ["python", "javascript", "sh"], "description": "The language of code." },
        "timeout_ms": { "type": "integer", "minimum": 1, "description": "Wall-clock timeout in milliseconds; can only lower the server's." }
    }) else {
        return serde_json::Map::new();
    };
    properties
}

pub(super) fn run_output_schema() -> Arc<JsonObject> {
    schema(json!({
        "type": "object",
        "properties": {
            "ok": { "type": "boolean", "description": "Exited with code 0." },
            "status": { "type": "object", "description": "How the run ended: {kind: exited|signaled|limit|trapped, ...}." },
            "exit_code": { "type": ["integer", "null"] },
            "signal": { "type": ["integer", "null"] },
            "timed_out": { "type": "boolean" },
            "limit": { "type": ["string", "null"], "description": "The limit that ended the run, if one did." },
            "stdout": { "type": "string" },
            "stderr": { "type": "string" },
            "stdout_truncated": { "type": "boolean" },
            "stderr_truncated": { "type": "boolean" },
            "duration_ms": { "type": "number" }
        },
        "required": ["ok", "status", "exit_code", "timed_out", "stdout", "stderr", "stdout_truncated", "stderr_truncated"]
    }))
}

/// One line on what every run may touch, for the tools' descriptions.
pub(super) fn caps_summary(caps: &Caps) -> String {
    let mounts: Vec<String> = caps
        .mounts
        .iter()
        .map(|m| {
            let access = if m.access == Access::ReadWrite {
                "rw"
            } else {
                "ro"
            };
            format!("{} ({access})", m.guest.display())
        })
        .collect();
    format!(
        "Network: {}. Mounts: {}. Timeout: {} ms.",
        caps.net,
        if mounts.is_empty() {
            "none".to_string()
        } else {
            mounts.join(", ")
        },
        caps.limits.timeout.as_millis()
    )
}

pub(super) fn instructions(caps: &Caps) -> String {
    format!(
        "Runs commands and code in Strata sandboxes with fixed capabilities. {} Use `run` for \
         one-off runs; `session_open` for a workspace whose files persist between \
         `session_run` calls (close it with `session_close`). A failed run is an error result \
         with its status, stdout and stderr.",
        caps_summary(caps)
    )
}

/// The tools, their schemas and annotations, for these caps.
pub(super) fn tools(caps: &Caps) -> Vec<McpTool> {
    let reach = Reach::of(caps);
    let summary = caps_summary(caps);
    let session_id = json!({ "type": "string", "description": "The id session_open returned." });
    let encoding = json!({ "type": "string", "enum": ["utf8", "base64"], "description": "utf8 (default) or base64 for binary content." });

    let run_schema = schema(json!({
        "type": "object",
        "properties": run_properties(),
        "additionalProperties": false
    }));
    let mut session_run_properties = run_properties();
    session_run_properties.insert("session_id".into(), session_id.clone());

    vec![
        McpTool::new(
            "run",
            format!(
                "Run a program (argv) or source code (code + language) in a fresh sandbox; \
                 nothing is kept afterwards. {summary}"
            ),
            run_schema,
        )
        .with_raw_output_schema(run_output_schema())
        .with_annotations(annotations(
            "Run in a sandbox",
            !reach.writes_host,
            reach.writes_host,
            false,
            reach.open_world,
        )),
        McpTool::new(
            "session_open",
            format!(
                "Open a session: a private workspace directory (the working directory of its \
                 runs) whose files persist between session_run calls. Returns session_id. \
                 {summary}"
            ),
            schema(json!({ "type": "object", "properties": {}, "additionalProperties": false })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "properties": { "session_id": { "type": "string" }, "workdir": { "type": "string" } },
            "required": ["session_id", "workdir"]
        })))
        .with_annotations(annotations("Open a session", false, false, false, false)),
        McpTool::new(
            "session_run",
            format!(
                "Run a program (argv) or source code (code + language) in a session, in its \
                 workspace. Processes end with the run; files stay. {summary}"
            ),
            schema(json!({
                "type": "object",
                "properties": session_run_properties,
                "required": ["session_id"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(run_output_schema())
        .with_annotations(annotations(
            "Run in a session",
            false,
            reach.writes_host,
            false,
            reach.open_world,
        )),
        McpTool::new(
            "session_write_file",
            "Write a file in a session's workspace (parent directories are made). path is \
             relative to the workspace, or absolute inside it.",
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": session_id,
                    "path": { "type": "string" },
                    "content": { "type": "string" },
                    "encoding": encoding
                },
                "required": ["session_id", "path", "content"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "properties": { "path": { "type": "string" }, "bytes": { "type": "integer" } },
            "required": ["path", "bytes"]
        })))
        .with_annotations(annotations("Write a session file", false, false, true, false)),
        McpTool::new(
            "session_read_file",
            "Read a file of a session's workspace.",
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": session_id,
                    "path": { "type": "string" },
                    "encoding": encoding
                },
                "required": ["session_id", "path"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "properties": {
                "path": { "type": "string" },
                "bytes": { "type": "integer" },
                "encoding": { "type": "string" },
                "content": { "type": "string" }
            },
            "required": ["path", "bytes", "encoding", "content"]
        })))
        .with_annotations(annotations("Read a session file", true, false, true, false)),
        McpTool::new(
            "session_list_files",
            "List one directory of a session's workspace (default: the workspace itself).",
            schema(json!({
                "type": "object",
                "properties": {
                    "session_id": session_id,
                    "path": { "type": "string", "description": "Default \".\"." }
                },
                "required": ["session_id"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "properties": {
                "path": { "type": "string" },
                "entries": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "path": { "type": "string" },
                            "name": { "type": "string" },
                            "kind": { "type": "string", "enum": ["file", "dir", "symlink", "other"] },
                            "size": { "type": "integer" },
                            "mode": { "type": "integer" }
                        }
                    }
                }
            },
            "required": ["path", "entries"]
        })))
        .with_annotations(annotations("List session files", true, false, true, false)),
        McpTool::new(
            "session_close",
            "Close a session and delete its workspace.",
            schema(json!({
                "type": "object",
                "properties": { "session_id": session_id },
                "required": ["session_id"],
                "additionalProperties": false
            })),
        )
        .with_raw_output_schema(schema(json!({
            "type": "object",
            "properties": { "session_id": { "type": "string" }, "closed": { "type": "boolean" } },
            "required": ["session_id", "closed"]
        })))
        .with_annotations(annotations("Close a session", false, true, true, false)),
    ]
}
