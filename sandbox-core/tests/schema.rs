//! The committed JSON Schemas (`schema/*.schema.json`) are what the core types generate, and
//! the table of names (`sandbox_core::names`) covers every field of the caps schema.
//!
//! Refresh the committed files after changing a schema type:
//! `STRATA_UPDATE_SCHEMA=1 cargo test --release --workspace --test schema`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_core::names::{self, VALUE_ALIASES};
use sandbox_core::{
    schema, Access, BackendKind, ContainerRuntime, ExitStatus, LimitKind, Receipt, ResourceUsage,
    RunOutput, Strictness,
};
use serde_json::Value;

const REFRESH: &str = "STRATA_UPDATE_SCHEMA=1 cargo test --release --workspace --test schema";

fn schema_dir() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("../schema")
}

fn render(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).expect("schema serializes");
    text.push('\n');
    text
}

#[test]
fn committed_schemas_are_fresh() {
    let update = std::env::var_os("STRATA_UPDATE_SCHEMA").is_some_and(|v| v != "0");
    let mut stale = Vec::new();
    for (file, generated) in [
        (schema::CAPS_FILE, schema::caps()),
        (schema::RUN_OUTPUT_FILE, schema::run_output()),
    ] {
        let path = schema_dir().join(file);
        let fresh = render(&generated);
        if update {
            std::fs::create_dir_all(schema_dir()).expect("create schema/");
            std::fs::write(&path, &fresh).expect("write schema");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == fresh => {}
            Ok(committed) => {
                let line = committed
                    .lines()
                    .zip(fresh.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| committed.lines().count().min(fresh.lines().count()));
                stale.push(format!(
                    "schema/{file} is stale (first difference at line {})",
                    line + 1
                ));
            }
            Err(e) => stale.push(format!("schema/{file} cannot be read: {e}")),
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nThe JSON Schemas are generated from the sandbox-core types; refresh them with\n    {REFRESH}\nand commit schema/.",
        stale.join("\n")
    );
}

const TABLE_BEGIN: &str = "<!-- names-table: generated from sandbox-core/src/names.rs -->\n";
const TABLE_END: &str = "<!-- /names-table -->";

#[test]
fn the_names_table_in_docs_is_fresh() {
    let path =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../docs/caps.md");
    let doc = std::fs::read_to_string(&path).expect("read docs/caps.md");
    let (before, rest) = doc
        .split_once(TABLE_BEGIN)
        .expect("docs/caps.md has the table's begin marker");
    let (table, after) = rest
        .split_once(TABLE_END)
        .expect("docs/caps.md has the table's end marker");
    let fresh = names::to_markdown();
    if std::env::var_os("STRATA_UPDATE_SCHEMA").is_some_and(|v| v != "0") {
        std::fs::write(
            &path,
            format!("{before}{TABLE_BEGIN}{fresh}{TABLE_END}{after}"),
        )
        .expect("write docs/caps.md");
        return;
    }
    assert!(
        table == fresh,
        "the table of names in docs/caps.md is stale; refresh it with\n    {REFRESH}"
    );
}

/// `schema` with a local `$ref` (or a nullable `anyOf` around one) resolved in `root`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let pointer = reference.trim_start_matches('#');
        return resolve(root, root.pointer(pointer).expect("$ref resolves"));
    }
    if let Some(Value::Array(options)) = schema.get("anyOf") {
        let non_null: Vec<&Value> = options
            .iter()
            .filter(|o| o.get("type").and_then(Value::as_str) != Some("null"))
            .collect();
        if let [only] = non_null[..] {
            return resolve(root, only);
        }
    }
    schema
}

fn properties<'a>(root: &'a Value, schema: &'a Value) -> Vec<(&'a String, &'a Value)> {
    match resolve(root, schema).get("properties") {
        Some(Value::Object(map)) => map.iter().collect(),
        _ => Vec::new(),
    }
}

/// Every field path of the caps schema: `agent`, `limits`, `limits.output`, `mounts`,
/// `mounts[].host`, `container.image`, ...
fn caps_field_paths(root: &Value) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for (key, schema) in properties(root, root) {
        paths.insert(key.clone());
        let nested = match key.as_str() {
            "limits" | "container" => properties(root, schema),
            "mounts" => {
                let items = resolve(root, schema).get("items").expect("mounts items");
                for (field, _) in properties(root, items) {
                    paths.insert(format!("mounts[].{field}"));
                }
                Vec::new()
            }
            _ => Vec::new(),
        };
        for (field, _) in nested {
            paths.insert(format!("{key}.{field}"));
        }
    }
    paths
}

#[test]
fn the_names_table_covers_every_caps_field_and_nothing_else() {
    let caps = schema::caps();
    let in_schema = caps_field_paths(&caps);
    assert!(in_schema.contains("limits.open_files") && in_schema.contains("mounts[].guest"));
    let mut in_table = BTreeSet::new();
    for json in names::CAPS
        .iter()
        .filter_map(|n| n.json)
        .chain(names::MOUNT.iter().filter_map(|n| n.json))
    {
        assert!(in_table.insert(json.to_string()), "{json} is in two rows");
    }
    let missing: Vec<_> = in_schema.difference(&in_table).collect();
    let extra: Vec<_> = in_table.difference(&in_schema).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "sandbox-core/src/names.rs is out of step with the caps schema: fields without a row: \
         {missing:?}; rows without a field: {extra:?}"
    );
    // Every field has a name in Python and Node, directly or through its schema-form parent.
    for name in names::CAPS {
        let parent = name.json.and_then(|p| p.split_once('.')).map(|(p, _)| p);
        let parent_python = parent.is_some_and(|p| {
            names::CAPS
                .iter()
                .any(|n| n.json == Some(p) && n.python.is_some())
        });
        assert!(
            name.python.is_some() || parent_python,
            "{:?} has no Python spelling",
            name.field
        );
        assert!(
            name.node.is_some() || name.json.is_some_and(|j| j == "limits" || j == "container"),
            "{:?} has no Node spelling",
            name.field
        );
    }
    assert_eq!(caps["x-strata-names"], names::to_json());
}

/// The string values of a schema definition that is an enum of strings.
fn enum_values(root: &Value, def: &str) -> Vec<String> {
    let schema = &root["$defs"][def];
    if let Some(Value::Array(values)) = schema.get("enum") {
        return values
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
    }
    schema["oneOf"]
        .as_array()
        .expect("enum or oneOf")
        .iter()
        .filter_map(|v| {
            v.get("const")
                .or_else(|| v.get("enum").and_then(|e| e.get(0)))
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect()
}

#[test]
fn legacy_value_spellings_are_read_but_only_canonical_values_are_in_the_schema() {
    let caps = schema::caps();
    let output = schema::run_output();
    for alias in VALUE_ALIASES {
        let root = if caps["$defs"].get(alias.schema).is_some() {
            &caps
        } else {
            &output
        };
        let values = enum_values(root, alias.schema);
        assert!(values.iter().any(|v| v == alias.value), "{alias:?}");
        assert!(!values.iter().any(|v| v == alias.alias), "{alias:?}");
        let same = |canonical: &str, legacy: &str| -> bool {
            fn both<T: serde::de::DeserializeOwned + PartialEq>(a: &str, b: &str) -> bool {
                let a: Option<T> = serde_json::from_value(Value::from(a)).ok();
                let b: Option<T> = serde_json::from_value(Value::from(b)).ok();
                a.is_some() && a == b
            }
            match alias.schema {
                "Strictness" => both::<Strictness>(canonical, legacy),
                "Access" => both::<Access>(canonical, legacy),
                "ContainerRuntime" => {
                    both::<ContainerRuntime>(canonical, legacy)
                        && legacy.parse::<ContainerRuntime>().ok()
                            == canonical.parse::<ContainerRuntime>().ok()
                }
                other => panic!("no reader known for {other}"),
            }
        };
        assert!(same(alias.value, alias.alias), "{alias:?} is not read");
    }
    assert_eq!(Strictness::BestEffort.to_string(), "best_effort");
}

#[test]
fn the_run_output_json_has_exactly_the_schema_fields() {
    let output = schema::run_output();
    let required: BTreeSet<&str> = output["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let declared: BTreeSet<&str> = output["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(required, declared, "every field is always written");
    let run = RunOutput {
        status: ExitStatus::Limit {
            limit: LimitKind::OpenFiles,
            signal: None,
        },
        stdout: b"out".to_vec(),
        stderr: Vec::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration: Duration::from_millis(5),
        usage: ResourceUsage::default(),
        receipt: Receipt::new(BackendKind::Wasm, Strictness::BestEffort),
    };
    let json = run.to_json();
    let written: BTreeSet<&str> = json
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(written, declared);
    assert_eq!(json["limit"], "open_files");
    assert_eq!(json["receipt"]["strictness"], "best_effort");
    let limits = enum_values(&output, "LimitKind");
    assert!(limits.contains(&"open_files".to_string()), "{limits:?}");
    let statuses: Vec<&str> = output["$defs"]["ExitStatus"]["oneOf"]
        .as_array()
        .expect("ExitStatus is in $defs")
        .iter()
        .filter_map(|v| v["properties"]["kind"]["const"].as_str())
        .collect();
    assert_eq!(statuses, ["exited", "signaled", "limit", "trapped"]);
}
