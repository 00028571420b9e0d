//! The policy layer for Node: an approver that is a JavaScript function, tiers and the
//! audit-log check. Decisions are the `strata` crate's; this module only carries them.
//!
//! An approver is called from the run's pool thread, while the JavaScript thread is free
//! (runs are asynchronous): the request goes to JavaScript through a weak threadsafe
//! function as `(id, requestJson)`; `index.js` calls the user's function, awaits it, and
//! answers with [`answer_elevation`]`(id, answerJson)`. The pool thread waits for that
//! answer at most [`APPROVER_DEADLINE`]; no answer refuses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use napi::bindgen_prelude::{FnArgs, Function};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::Status;
use napi_derive::napi;
use strata::policy::{Approval, Approver, ElevationRequest};

/// How long a run waits for the JavaScript approver before refusing.
pub const APPROVER_DEADLINE: Duration = Duration::from_secs(120);

type ApproverTsfn =
    ThreadsafeFunction<(f64, String), (), FnArgs<(f64, String)>, Status, false, true>;

/// Requests waiting for their answer, by id.
fn pending() -> &'static Mutex<HashMap<u64, SyncSender<String>>> {
    static PENDING: OnceLock<Mutex<HashMap<u64, SyncSender<String>>>> = OnceLock::new();
    PENDING.get_or_init(Mutex::default)
}

/// An approver whose decisions come from a JavaScript function.
pub struct NodeApprover {
    tsfn: ApproverTsfn,
}

impl NodeApprover {
    /// Wraps `function(id, requestJson)`; it must eventually call `answerElevation`.
    pub fn new(function: Function<'_, FnArgs<(f64, String)>, ()>) -> napi::Result<Self> {
        let tsfn = function
            .build_threadsafe_function::<(f64, String)>()
            .callee_handled::<false>()
            .weak::<true>()
            .build_callback(|ctx| Ok(FnArgs::from(ctx.value)))?;
        Ok(NodeApprover { tsfn })
    }
}

impl Approver for NodeApprover {
    fn decide(&self, request: &ElevationRequest) -> Approval {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let json = match serde_json::to_string(request) {
            Ok(json) => json,
            Err(e) => return Approval::deny(format!("cannot encode the request: {e}")),
        };
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock().insert(id, tx);
        let status = self
            .tsfn
            .call((id as f64, json), ThreadsafeFunctionCallMode::NonBlocking);
        let answer = if status == Status::Ok {
            rx.recv_timeout(APPROVER_DEADLINE).ok()
        } else {
            None
        };
        lock().remove(&id);
        match answer {
            Some(answer) => parse(&answer),
            None => Approval::deny(format!(
                "the approver did not answer within {} s",
                APPROVER_DEADLINE.as_secs()
            )),
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<u64, SyncSender<String>>> {
    pending()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An answer as `index.js` sends it: `{"decision": "grant", "ttl": MS, "runs": N}` or
/// `{"decision": "deny", "reason": ...}`.
fn parse(answer: &str) -> Approval {
    serde_json::from_str(answer)
        .unwrap_or_else(|e| Approval::deny(format!("the approver's answer is not understood: {e}")))
}

/// Delivers the answer to elevation request `id` (from `index.js`). Unknown ids (answered
/// after the deadline) are ignored.
#[napi]
pub fn answer_elevation(id: f64, answer_json: String) {
    if let Some(tx) = lock().remove(&(id as u64)) {
        let _ = tx.try_send(answer_json);
    }
}

/// The preset tier `name` (`low`, `medium` with `home` or `$HOME`, `high`) as JSON, or
/// `{"error": message}` for another name.
#[napi]
pub fn tier_preset_json(name: String, home: Option<String>) -> String {
    let looked_up =
        strata::policy::Tier::lookup(&name, &[], home.as_deref().map(std::path::Path::new))
            .and_then(|tier| {
                serde_json::to_value(&tier).map_err(|e| strata::Error::invalid(e.to_string()))
            });
    match looked_up {
        Ok(tier) => tier.to_string(),
        Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
    }
}

/// Checks an audit log: `{"records", "head"}` as JSON, or `{"error": message}` naming the
/// first altered, removed or reordered record (or records cut off the end, with `head`).
#[napi]
pub fn verify_audit_json(path: String, head: Option<String>) -> String {
    match strata::audit::verify_file(std::path::Path::new(&path), head.as_deref()) {
        Ok(v) => serde_json::json!({ "records": v.records, "head": v.head }).to_string(),
        Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
    }
}
