//! What a run executes: a module or component file, its arguments, and how to enter it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How a program is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Entry {
    /// A WASI command: `_start` of a core module, or `wasi:cli/run` of a component.
    Command,
    /// The QuickJS-NG WASI reactor: `_initialize`, then `qjs_init_argv(argc, argv)`.
    QuickJs,
}

/// A resolved program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Program {
    /// Host path of the `.wasm` or `.wat` file.
    pub module: PathBuf,
    /// The arguments the program sees, program name first.
    pub argv: Vec<String>,
    /// How to start it.
    pub entry: Entry,
}
