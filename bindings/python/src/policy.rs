//! The policy layer for Python: approvers as callables, tiers as dicts, and the audit log
//! check. Every decision is made by `strata::policy`; this module only converts.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBool;
use serde_json::Value;
use strata::policy::{Approval, Approver, ElevationRequest, Tier};

use crate::convert::{json_to_py, py_to_json};
use crate::errors::to_py;

/// A Python callable deciding elevation requests: it gets the request as a dict
/// (`{"agent", "tier", "tool", "needs": [{"capability", "detail"}]}`) and returns `True`
/// (grant for one run within 10 minutes), a dict `{"ttl": seconds, "runs": n}` (grant), or
/// `False`/`None`/a dict `{"decision": "deny", "reason": ...}` (refuse). An exception
/// refuses, naming it.
pub struct PyApprover {
    callback: Py<PyAny>,
}

impl PyApprover {
    /// Wraps `callback`, which must be callable.
    pub fn new(py: Python<'_>, callback: Py<PyAny>) -> PyResult<Self> {
        if !callback.bind(py).is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "approver must be callable",
            ));
        }
        Ok(PyApprover { callback })
    }

    fn ask(&self, py: Python<'_>, request: &ElevationRequest) -> Approval {
        let request = match serde_json::to_value(request) {
            Ok(v) => v,
            Err(e) => return Approval::deny(format!("cannot encode the request: {e}")),
        };
        let answer = json_to_py(py, &request).and_then(|arg| self.callback.call1(py, (arg,)));
        let answer = match answer {
            Ok(answer) => answer.into_bound(py),
            Err(e) => return Approval::deny(format!("the approver raised {e}")),
        };
        if answer.is_none() {
            return Approval::deny("the approver refused");
        }
        if let Ok(flag) = answer.cast::<PyBool>() {
            return match flag.is_true() {
                true => Approval::grant(),
                false => Approval::deny("the approver refused"),
            };
        }
        match py_to_json(&answer, "the approver's answer") {
            Ok(Value::Object(mut object)) => {
                object
                    .entry("decision")
                    .or_insert_with(|| Value::from("grant"));
                // Seconds in Python, milliseconds in the core.
                if let Some(ttl) = object.get("ttl").and_then(Value::as_f64) {
                    object.insert("ttl".into(), Value::from((ttl * 1000.0).round() as u64));
                }
                serde_json::from_value(Value::Object(object)).unwrap_or_else(|e| {
                    Approval::deny(format!("the approver's answer is not understood: {e}"))
                })
            }
            Ok(_) => Approval::deny("the approver must return a bool, None or a dict"),
            Err(e) => Approval::deny(format!("the approver's answer is not understood: {e}")),
        }
    }
}

impl Approver for PyApprover {
    fn decide(&self, request: &ElevationRequest) -> Approval {
        Python::try_attach(|py| self.ask(py, request))
            .unwrap_or_else(|| Approval::deny("the Python interpreter is shutting down"))
    }
}

/// A tier from its dict form: `{"name", "rank", "paths": "any" | {"within": [...]},
/// "writes", "network": "none" | "allowlist" | "any", "programs": "any" | {"only": [...]},
/// "secrets"}`.
pub fn tier(obj: &Bound<'_, PyAny>) -> PyResult<Tier> {
    let value = py_to_json(obj, "tier")?;
    serde_json::from_value(value).map_err(|e| {
        to_py(
            obj.py(),
            &strata::Error::invalid(format!(
                "tier: {e} (see strata.tier_preset('medium') for the shape)"
            )),
        )
    })
}

/// `tier_preset(name, home=None)`: the preset tier `low`, `medium` (its directory `home`,
/// default `$HOME`) or `high` as a dict, to inspect or to adapt and pass to `Sandbox(tiers=[...])`.
#[pyfunction]
#[pyo3(signature = (name, home = None))]
pub fn tier_preset<'py>(
    py: Python<'py>,
    name: &str,
    home: Option<PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    let tier = Tier::lookup(name, &[], home.as_deref()).map_err(|e| to_py(py, &e))?;
    let value = serde_json::to_value(&tier)
        .map_err(|e| to_py(py, &strata::Error::invalid(e.to_string())))?;
    json_to_py(py, &value)
}

/// `verify_audit(path, head=None)`: checks an audit log's hash chain and returns
/// `{"records": n, "head": hash}`; raises InvalidRequestError naming the first altered,
/// removed or reordered record (or, with `head`, records cut off the end).
#[pyfunction]
#[pyo3(signature = (path, head = None))]
pub fn verify_audit<'py>(
    py: Python<'py>,
    path: PathBuf,
    head: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
    let verified = strata::audit::verify_file(&path, head.as_deref())
        .map_err(|e| to_py(py, &strata::Error::invalid(e.to_string())))?;
    let value = serde_json::json!({ "records": verified.records, "head": verified.head });
    json_to_py(py, &value)
}
