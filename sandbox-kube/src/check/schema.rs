//! A CRD's structural schema as a JSON Schema, plus the checks JSON Schema cannot express.
//!
//! A CRD's `openAPIV3Schema` is OpenAPI 3.0 with Kubernetes extensions. [`to_json_schema`]
//! turns it into a draft 2020-12 JSON Schema that the `jsonschema` crate checks:
//!
//! | in the CRD | in the JSON Schema | why |
//! |---|---|---|
//! | `x-kubernetes-int-or-string: true` | `anyOf: [{type: integer}, {type: string}]` (kept if controller-gen already wrote it) | the extension's meaning |
//! | `format: int32` / `int64` | `minimum` / `maximum` of that type | JSON Schema has no integer formats |
//! | `nullable: true` | `type: [T, "null"]` | OpenAPI 3.0 spelling |
//! | `x-kubernetes-list-type: set` | `uniqueItems: true` | the extension's meaning |
//! | an object schema with `properties` and no `additionalProperties` (and no `x-kubernetes-preserve-unknown-fields`) | `additionalProperties: false` | the API server's strict field validation (`kubectl`'s default) rejects unknown fields instead of pruning them |
//! | `metadata: {type: object}` at the root | an `ObjectMeta` schema: `name` a DNS subdomain (or `generateName`), `namespace` a DNS label, labels Kubernetes label syntax | what the API server checks of every object's metadata |
//! | `labels` maps anywhere | label key and value syntax | as above, for the pod template's labels |
//! | `apiVersion`, `kind` at the root | `const` of the kind's values, and required | the API server routes by them |
//! | every other `x-kubernetes-*` (`list-type: atomic`, `map-type`) | removed | merge strategies for server-side apply, not validation |
//!
//! Two extensions are checked by walking the object next to the schema ([`CrdSchema::validate`]):
//! `x-kubernetes-list-type: map` (no two items share their `x-kubernetes-list-map-keys`)
//! and `x-kubernetes-validations` (CEL rules, with `self` bound to the value at that
//! node). A rule that uses `oldSelf` is a transition rule: the API server evaluates it
//! only on update, so a create-time check skips it and [`CrdSchema::transition_rules`]
//! counts it. `default` is not applied: defaults never make an object invalid.

use std::collections::BTreeMap;

use cel::{Context, Program, Value};
use serde_json::{json, Value as Json};

use super::cel_json::to_cel;
use super::{Check, CheckError, Violation};
use crate::crd::{Kind, VERSION};

/// A DNS-1123 subdomain (an object name).
const DNS_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A DNS-1123 label (a namespace).
const DNS_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A label key: an optional DNS-subdomain prefix and `/`, then a 1-63 character name.
const LABEL_KEY: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// A label value: empty, or 1-63 characters alphanumeric at both ends.
const LABEL_VALUE: &str = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";

/// The v1beta1 schema of one CRD, compiled.
pub struct CrdSchema {
    kind: Kind,
    structural: Json,
    json_schema: Json,
    validator: jsonschema::Validator,
    rules: BTreeMap<String, Vec<Rule>>,
    transition_rules: usize,
}

struct Rule {
    source: String,
    message: String,
    program: Program,
}

impl CrdSchema {
    /// Compiles the `v1beta1` schema of a CRD (parsed from its YAML), checking that the CRD
    /// is `kind`'s.
    pub fn from_crd(kind: Kind, crd: &Json) -> Result<CrdSchema, CheckError> {
        let bad = |message: String| CheckError::Crd { kind, message };
        if crd["kind"] != "CustomResourceDefinition" {
            return Err(bad("not a CustomResourceDefinition".into()));
        }
        if crd["spec"]["group"] != kind.group() || crd["spec"]["names"]["kind"] != kind.name() {
            return Err(bad(format!(
                "the CRD is for {}/{}",
                crd["spec"]["group"], crd["spec"]["names"]["kind"]
            )));
        }
        let version = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == VERSION)
            .ok_or_else(|| bad(format!("no version {VERSION}")))?;
        let structural = version["schema"]["openAPIV3Schema"].clone();
        if !structural.is_object() {
            return Err(bad(format!("version {VERSION} has no openAPIV3Schema")));
        }
        let json_schema = to_json_schema(kind, &structural);
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&json_schema)
            .map_err(|e| bad(format!("the translated schema does not compile: {e}")))?;
        let mut rules = BTreeMap::new();
        let mut transition_rules = 0;
        collect_rules(
            &structural,
            String::new(),
            &mut rules,
            &mut transition_rules,
        )
        .map_err(bad)?;
        Ok(CrdSchema {
            kind,
            structural,
            json_schema,
            validator,
            rules,
            transition_rules,
        })
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The CRD's `openAPIV3Schema`, as pinned.
    pub fn structural(&self) -> &Json {
        &self.structural
    }

    /// The JSON Schema it was translated to.
    pub fn json_schema(&self) -> &Json {
        &self.json_schema
    }

    /// `x-kubernetes-validations` rules checked on create.
    pub fn create_rules(&self) -> usize {
        self.rules.values().map(Vec::len).sum()
    }

    /// `x-kubernetes-validations` rules that use `oldSelf` (update only, not checked).
    pub fn transition_rules(&self) -> usize {
        self.transition_rules
    }

    /// Everything wrong with `object` as a create of this kind: JSON Schema errors, then
    /// duplicate list-map keys and failed CEL rules. Empty when the API server would take it.
    pub fn validate(&self, object: &Json) -> Vec<Violation> {
        let mut out: Vec<Violation> = self
            .validator
            .iter_errors(object)
            .map(|e| Violation {
                kind: self.kind,
                check: Check::Schema,
                path: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect();
        self.walk(&self.structural, "", object, "", &mut out);
        out
    }

    fn walk(
        &self,
        schema: &Json,
        pointer: &str,
        value: &Json,
        path: &str,
        out: &mut Vec<Violation>,
    ) {
        for rule in self.rules.get(pointer).into_iter().flatten() {
            let mut context = Context::default();
            context.add_variable_from_value("self", to_cel(value));
            let failure = match rule.program.execute(&context) {
                Ok(Value::Bool(true)) => None,
                Ok(Value::Bool(false)) => Some(rule.message.clone()),
                Ok(other) => Some(format!("rule {} gave {other:?}, not a bool", rule.source)),
                Err(e) => Some(format!("rule {} failed: {e}", rule.source)),
            };
            if let Some(message) = failure {
                out.push(Violation {
                    kind: self.kind,
                    check: Check::CrdRule,
                    path: path.to_owned(),
                    message,
                });
            }
        }
        match value {
            Json::Object(fields) => {
                for (key, child) in fields {
                    let escaped = key.replace('~', "~0").replace('/', "~1");
                    let child_path = format!("{path}/{escaped}");
                    if let Some(sub) = schema["properties"].get(key) {
                        let p = format!("{pointer}/properties/{escaped}");
                        self.walk(sub, &p, child, &child_path, out);
                    } else if schema["additionalProperties"].is_object() {
                        let p = format!("{pointer}/additionalProperties");
                        self.walk(&schema["additionalProperties"], &p, child, &child_path, out);
                    }
                }
            }
            Json::Array(items) => {
                if schema["x-kubernetes-list-type"] == "map" {
                    let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Json::as_str)
                        .collect();
                    let mut seen = Vec::new();
                    for item in items {
                        let tuple: Vec<&Json> = keys.iter().map(|k| &item[*k]).collect();
                        if seen.contains(&tuple) {
                            out.push(Violation {
                                kind: self.kind,
                                check: Check::Schema,
                                path: path.to_owned(),
                                message: format!(
                                    "duplicate entry for list-map keys {keys:?}: {tuple:?}"
                                ),
                            });
                        }
                        seen.push(tuple);
                    }
                }
                if schema["items"].is_object() {
                    let p = format!("{pointer}/items");
                    for (i, item) in items.iter().enumerate() {
                        self.walk(&schema["items"], &p, item, &format!("{path}/{i}"), out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn collect_rules(
    schema: &Json,
    pointer: String,
    rules: &mut BTreeMap<String, Vec<Rule>>,
    transition: &mut usize,
) -> Result<(), String> {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let source = rule["rule"]
            .as_str()
            .ok_or_else(|| format!("a rule without `rule` at {pointer}"))?;
        let program = Program::compile(source).map_err(|e| format!("rule {source}: {e}"))?;
        if program.references().has_variable("oldSelf") {
            *transition += 1;
            continue;
        }
        let message = rule["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("failed rule: {source}"));
        rules.entry(pointer.clone()).or_default().push(Rule {
            source: source.to_owned(),
            message,
            program,
        });
    }
    if let Some(props) = schema["properties"].as_object() {
        for (key, sub) in props {
            let escaped = key.replace('~', "~0").replace('/', "~1");
            collect_rules(
                sub,
                format!("{pointer}/properties/{escaped}"),
                rules,
                transition,
            )?;
        }
    }
    for key in ["items", "additionalProperties"] {
        if schema[key].is_object() {
            collect_rules(&schema[key], format!("{pointer}/{key}"), rules, transition)?;
        }
    }
    Ok(())
}

/// Translates a CRD's structural `openAPIV3Schema` for `kind` into a draft 2020-12 JSON
/// Schema (see the module docs for each rule).
pub fn to_json_schema(kind: Kind, structural: &Json) -> Json {
    let mut schema = structural.clone();
    translate(&mut schema);
    if let Some(root) = schema.as_object_mut() {
        root.insert("type".into(), json!("object"));
        let props = root.entry("properties").or_insert_with(|| json!({}));
        if let Some(props) = props.as_object_mut() {
            props.insert("apiVersion".into(), json!({ "const": kind.api_version() }));
            props.insert("kind".into(), json!({ "const": kind.name() }));
            props.insert("metadata".into(), object_meta());
        }
        let required = root.entry("required").or_insert_with(|| json!([]));
        if let Some(list) = required.as_array_mut() {
            for field in ["apiVersion", "kind", "metadata"] {
                if !list.iter().any(|f| f == field) {
                    list.push(json!(field));
                }
            }
        }
    }
    schema
}

fn labels_schema() -> Json {
    json!({
        "type": "object",
        "propertyNames": { "pattern": LABEL_KEY },
        "additionalProperties": { "type": "string", "pattern": LABEL_VALUE },
    })
}

/// What the API server checks of an object's metadata (fields the server sets itself are
/// left open, so objects read back from it still pass).
fn object_meta() -> Json {
    json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN },
            "generateName": { "type": "string", "maxLength": 248, "pattern": r"^[a-z0-9]([-a-z0-9.]*)?$" },
            "namespace": { "type": "string", "maxLength": 63, "pattern": DNS_LABEL },
            "labels": labels_schema(),
            "annotations": { "type": "object", "additionalProperties": { "type": "string" } },
        },
        "anyOf": [ { "required": ["name"] }, { "required": ["generateName"] } ],
    })
}

fn translate(node: &mut Json) {
    let Some(map) = node.as_object_mut() else {
        return;
    };
    if let Some(Json::Object(props)) = map.get_mut("properties") {
        for (key, sub) in props.iter_mut() {
            translate(sub);
            if key == "labels" && sub["additionalProperties"]["type"] == "string" {
                *sub = labels_schema();
            }
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = map.get_mut(key) {
            translate(sub);
        }
    }
    for key in ["anyOf", "allOf", "oneOf"] {
        if let Some(Json::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(translate);
        }
    }
    if map.get("x-kubernetes-int-or-string") == Some(&Json::Bool(true)) {
        map.remove("type");
        map.entry("anyOf")
            .or_insert_with(|| json!([{ "type": "integer" }, { "type": "string" }]));
    }
    let bounds = match map.get("format").and_then(Json::as_str) {
        Some("int32") => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
        Some("int64") => Some((i64::MIN, i64::MAX)),
        _ => None,
    };
    if let Some((low, high)) = bounds {
        map.remove("format");
        let min = map
            .get("minimum")
            .and_then(Json::as_i64)
            .map_or(low, |m| m.max(low));
        let max = map
            .get("maximum")
            .and_then(Json::as_i64)
            .map_or(high, |m| m.min(high));
        map.insert("minimum".into(), json!(min));
        map.insert("maximum".into(), json!(max));
    }
    if map.remove("nullable") == Some(Json::Bool(true)) {
        if let Some(Json::String(t)) = map.get("type").cloned() {
            map.insert("type".into(), json!([t, "null"]));
        }
    }
    if map.get("x-kubernetes-list-type").and_then(Json::as_str) == Some("set") {
        map.insert("uniqueItems".into(), Json::Bool(true));
    }
    let preserve = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Json::Bool(true));
    if map.contains_key("properties") && !map.contains_key("additionalProperties") && !preserve {
        map.insert("additionalProperties".into(), Json::Bool(false));
    }
    map.retain(|k, _| !k.starts_with("x-kubernetes-"));
}
