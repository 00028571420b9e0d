//! What a sandbox runs.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What to run inside a sandbox.
///
/// A tool is never a shell string: [`Tool::Command`] is an argv executed directly, and a
/// shell is only involved when asked for explicitly with [`ScriptLanguage::Sh`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Tool {
    /// Execute a program. `argv[0]` is a path inside the sandbox, or a name looked up in
    /// the sandbox's `PATH`.
    Command {
        /// Program and arguments; must not be empty.
        argv: Vec<String>,
    },
    /// Run source code with an interpreter chosen by the backend (for example
    /// `python3 -c` in the process backend, a WASI build of CPython in the wasm backend).
    Script {
        /// The language of `source`.
        language: ScriptLanguage,
        /// The program text.
        source: String,
    },
    /// Run a WebAssembly module or component (WASI preview 1 or 2).
    Wasm {
        /// Host path of the `.wasm` (or `.wat`) file.
        module: PathBuf,
        /// Arguments passed after the program name.
        #[serde(default)]
        args: Vec<String>,
    },
}

impl Tool {
    /// A command from anything that yields strings: `Tool::command(["ls", "-l"])`.
    pub fn command<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Tool::Command {
            argv: argv.into_iter().map(Into::into).collect(),
        }
    }

    /// A script in `language`.
    pub fn script(language: ScriptLanguage, source: impl Into<String>) -> Self {
        Tool::Script {
            language,
            source: source.into(),
        }
    }

    /// A WebAssembly module with arguments.
    pub fn wasm<I, S>(module: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Tool::Wasm {
            module: module.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// A short human description for logs and errors (never the whole script).
    pub fn describe(&self) -> String {
        match self {
            Tool::Command { argv } => argv.first().cloned().unwrap_or_default(),
            Tool::Script { language, source } => {
                format!("{language} script ({} bytes)", source.len())
            }
            Tool::Wasm { module, .. } => module.display().to_string(),
        }
    }
}

/// Languages a [`Tool::Script`] may be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ScriptLanguage {
    /// Python 3.
    Python,
    /// JavaScript (Node.js in the process backend, QuickJS in the wasm backend).
    #[serde(alias = "js")]
    Javascript,
    /// POSIX shell (`/bin/sh -c`).
    Sh,
}

impl ScriptLanguage {
    /// The lowercase name used in the CLI and the bindings.
    pub fn as_str(self) -> &'static str {
        match self {
            ScriptLanguage::Python => "python",
            ScriptLanguage::Javascript => "javascript",
            ScriptLanguage::Sh => "sh",
        }
    }
}

impl fmt::Display for ScriptLanguage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ScriptLanguage {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "python" | "python3" | "py" => Ok(ScriptLanguage::Python),
            "javascript" | "js" | "node" => Ok(ScriptLanguage::Javascript),
            "sh" | "shell" => Ok(ScriptLanguage::Sh),
            other => Err(crate::Error::invalid(format!(
                "unknown script language {other:?} (expected python, javascript or sh)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_json_shape_is_tagged_by_kind() {
        let tool = Tool::command(["ls", "-l"]);
        let json = serde_json::to_string(&tool).expect("serialize");
        assert_eq!(json, r#"{"kind":"command","argv":["ls","-l"]}"#);
        let script: Tool =
            serde_json::from_str(r#"{"kind":"script","language":"js","source":"1"}"#)
                .expect("parse");
        assert_eq!(script, Tool::script(ScriptLanguage::Javascript, "1"));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<Tool>(r#"{"kind":"command","argv":["x"],"shell":true}"#)
            .expect_err("must reject");
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
