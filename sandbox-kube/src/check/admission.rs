//! A `ValidatingAdmissionPolicy` (admissionregistration.k8s.io/v1) evaluated with CEL.
//!
//! Bound as the API server binds them for a `CREATE`: `object` (the object), `oldObject`
//! (`null`), `params` (`null`: the policy has no `paramKind`), `request` (operation, kind,
//! resource, name, namespace) and `variables` (the policy's `spec.variables`, evaluated in
//! order, each seeing the ones before it). The policy's `failurePolicy` decides what an
//! expression that cannot be evaluated does: `Fail` (the default) denies.
//!
//! `authorizer` and `namespaceObject` are not bound: an expression using them fails to
//! evaluate, and under `Fail` denies; the pinned policy uses neither.

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Program, Value};

use super::cel_json::to_cel;
use super::CheckError;
use crate::crd::{Kind, VERSION};

/// A compiled admission policy.
pub struct AdmissionPolicy {
    name: String,
    fail_closed: bool,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
    rules: Vec<ResourceRule>,
}

struct Variable {
    name: String,
    program: Program,
}

/// One of the policy's `spec.validations`.
pub struct Validation {
    /// The CEL expression; the object passes when it is `true`.
    pub expression: String,
    /// The message a denial carries.
    pub message: String,
    program: Program,
}

impl Validation {
    /// The functions and operators the expression uses, sorted (`_&&_`, `has`, `all`, ...).
    pub fn functions(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .program
            .references()
            .functions()
            .into_iter()
            .map(str::to_owned)
            .collect();
        names.sort();
        names
    }
}

struct ResourceRule {
    groups: Vec<String>,
    versions: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
}

/// Why a validation did not let an object in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The index of the validation in `spec.validations` (0-based).
    pub rule: usize,
    /// Its expression.
    pub expression: String,
    /// Its message.
    pub message: String,
    /// `Some` when the expression could not be evaluated (and the policy fails closed);
    /// `None` when it was `false`.
    pub error: Option<String>,
}

impl AdmissionPolicy {
    /// Parses and compiles a policy from its YAML (or JSON) text.
    pub fn from_yaml(text: &str) -> Result<AdmissionPolicy, CheckError> {
        let doc: serde_json::Value =
            serde_norway::from_str(text).map_err(|e| CheckError::Policy {
                message: format!("not YAML: {e}"),
            })?;
        AdmissionPolicy::from_json(&doc)
    }

    /// Compiles a policy already parsed as JSON.
    pub fn from_json(doc: &serde_json::Value) -> Result<AdmissionPolicy, CheckError> {
        let bad = |message: &str| CheckError::Policy {
            message: message.to_owned(),
        };
        if doc["kind"] != "ValidatingAdmissionPolicy" {
            return Err(bad("not a ValidatingAdmissionPolicy"));
        }
        let spec = &doc["spec"];
        if !spec["paramKind"].is_null() {
            return Err(bad("policies with a paramKind are not supported"));
        }
        let fail_closed = match spec["failurePolicy"].as_str() {
            None | Some("Fail") => true,
            Some("Ignore") => false,
            Some(other) => return Err(bad(&format!("unknown failurePolicy {other}"))),
        };
        let mut variables = Vec::new();
        for v in spec["variables"].as_array().into_iter().flatten() {
            let name = v["name"]
                .as_str()
                .ok_or_else(|| bad("a variable without a name"))?;
            let expression = v["expression"]
                .as_str()
                .ok_or_else(|| bad("a variable without an expression"))?;
            variables.push(Variable {
                name: name.to_owned(),
                program: compile(expression)?,
            });
        }
        let mut validations = Vec::new();
        for v in spec["validations"].as_array().into_iter().flatten() {
            let expression = v["expression"]
                .as_str()
                .ok_or_else(|| bad("a validation without an expression"))?;
            validations.push(Validation {
                expression: expression.to_owned(),
                message: v["message"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("failed expression: {expression}")),
                program: compile(expression)?,
            });
        }
        if validations.is_empty() {
            return Err(bad("no validations"));
        }
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let rules = spec["matchConstraints"]["resourceRules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| ResourceRule {
                groups: strings(&r["apiGroups"]),
                versions: strings(&r["apiVersions"]),
                operations: strings(&r["operations"]),
                resources: strings(&r["resources"]),
            })
            .collect();
        Ok(AdmissionPolicy {
            name: doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            fail_closed,
            variables,
            validations,
            rules,
        })
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The validations, in order.
    pub fn validations(&self) -> &[Validation] {
        &self.validations
    }

    /// Whether the policy's `matchConstraints.resourceRules` select `operation` (`CREATE`,
    /// `UPDATE`, ...) on `kind`.
    pub fn matches(&self, kind: Kind, operation: &str) -> bool {
        let any = |list: &[String], want: &str| list.iter().any(|s| s == "*" || s == want);
        self.rules.iter().any(|r| {
            any(&r.groups, kind.group())
                && any(&r.versions, VERSION)
                && any(&r.operations, operation)
                && any(&r.resources, kind.plural())
        })
    }

    /// Evaluates every validation against `object` as the API server would on `CREATE`.
    /// `Ok` when all pass; else every denial, in rule order.
    pub fn admit(&self, kind: Kind, object: &serde_json::Value) -> Result<(), Vec<Denial>> {
        let mut context = Context::default();
        context.add_variable_from_value("object", to_cel(object));
        context.add_variable_from_value("oldObject", Value::Null);
        context.add_variable_from_value("params", Value::Null);
        context.add_variable_from_value("request", to_cel(&request(kind, object)));
        let mut values: HashMap<Key, Value> = HashMap::new();
        let mut variable_errors = Vec::new();
        for variable in &self.variables {
            context.add_variable_from_value(
                "variables",
                Value::Map(Map {
                    map: Arc::new(values.clone()),
                }),
            );
            match variable.program.execute(&context) {
                Ok(value) => {
                    values.insert(Key::String(Arc::new(variable.name.clone())), value);
                }
                Err(e) => variable_errors.push(format!("variable {}: {e}", variable.name)),
            }
        }
        context.add_variable_from_value(
            "variables",
            Value::Map(Map {
                map: Arc::new(values),
            }),
        );

        let mut denials = Vec::new();
        for (rule, validation) in self.validations.iter().enumerate() {
            let error = if !variable_errors.is_empty()
                && validation.program.references().has_variable("variables")
            {
                Some(variable_errors.join("; "))
            } else {
                match validation.program.execute(&context) {
                    Ok(Value::Bool(true)) => continue,
                    Ok(Value::Bool(false)) => None,
                    Ok(other) => Some(format!("the expression gave {other:?}, not a bool")),
                    Err(e) => Some(e.to_string()),
                }
            };
            if error.is_some() && !self.fail_closed {
                continue;
            }
            denials.push(Denial {
                rule,
                expression: validation.expression.clone(),
                message: validation.message.clone(),
                error,
            });
        }
        if denials.is_empty() {
            Ok(())
        } else {
            Err(denials)
        }
    }
}

fn compile(expression: &str) -> Result<Program, CheckError> {
    Program::compile(expression).map_err(|e| CheckError::Cel {
        expression: expression.to_owned(),
        message: e.to_string(),
    })
}

/// The `request` an API server builds for a `CREATE` of `object`.
fn request(kind: Kind, object: &serde_json::Value) -> serde_json::Value {
    let meta = &object["metadata"];
    serde_json::json!({
        "operation": "CREATE",
        "kind": { "group": kind.group(), "version": VERSION, "kind": kind.name() },
        "resource": { "group": kind.group(), "version": VERSION, "resource": kind.plural() },
        "name": meta["name"].as_str().unwrap_or_default(),
        "namespace": meta["namespace"].as_str().unwrap_or_default(),
        "dryRun": false,
    })
}
