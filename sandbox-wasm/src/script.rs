//! Tools as programs: WebAssembly files run as WASI commands; Python and JavaScript scripts
//! run in interpreters compiled to WASI, installed by `scripts/fetch-wasm-interpreters.sh`:
//!
//! | language | file | what it is | from |
//! |---|---|---|---|
//! | Python | `python.wasm` | a `wasi:cli/command` component embedding CPython 3.14, built by `componentize-py` around a small runner that executes `-c CODE` | PyPI `componentize-py` 0.25.1 |
//! | JavaScript | `qjs.wasm` | QuickJS-NG as a WASI reactor module | PyPI `qjs-wasi-reactor.wasm` 0.17.0 |
//!
//! A missing interpreter is a `BackendUnavailable` error naming the script to run.

use std::path::{Path, PathBuf};

use sandbox_core::{BackendKind, Error, Result, ScriptLanguage, Tool};
use wasmtime::{Instance, Store};

use crate::program::{Entry, Program};
use crate::state::State;

/// File name of the Python interpreter component.
pub const PYTHON_FILE: &str = "python.wasm";
/// File name of the QuickJS reactor module.
pub const QUICKJS_FILE: &str = "qjs.wasm";
/// The script that installs the interpreters.
pub const FETCH_SCRIPT: &str = "scripts/fetch-wasm-interpreters.sh";

/// Runs the user's code as a module so top-level `await` and promise jobs complete, while
/// the code itself is evaluated as a sloppy-mode global script (indirect eval), like
/// `node -e`. A returned promise is awaited.
const JS_WRAPPER: &str =
    "const r = (0, eval)(scriptArgs[0]); if (r && typeof r.then === 'function') await r;";

/// Resolves what `tool` runs in this backend.
pub(crate) fn resolve(tool: &Tool, interpreter_dir: Option<&Path>) -> Result<Program> {
    match tool {
        Tool::Wasm { module, args } => {
            let name = module
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| module.display().to_string());
            let mut argv = Vec::with_capacity(args.len() + 1);
            argv.push(name);
            argv.extend(args.iter().cloned());
            Ok(Program {
                module: module.clone(),
                argv,
                entry: Entry::Command,
            })
        }
        Tool::Script { language, source } => match language {
            ScriptLanguage::Python => Ok(Program {
                module: interpreter(interpreter_dir, PYTHON_FILE, "Python")?,
                argv: vec!["python".into(), "-c".into(), source.clone()],
                entry: Entry::Command,
            }),
            ScriptLanguage::Javascript => Ok(Program {
                module: interpreter(interpreter_dir, QUICKJS_FILE, "JavaScript")?,
                argv: vec![
                    "qjs".into(),
                    "--std".into(),
                    "-m".into(),
                    "-e".into(),
                    JS_WRAPPER.into(),
                    "--".into(),
                    source.clone(),
                ],
                entry: Entry::QuickJs,
            }),
            other => Err(Error::unavailable(
                BackendKind::Wasm,
                format!("no WASI interpreter for {other} scripts; run them with the process backend"),
            )),
        },
        Tool::Command { argv } => Err(Error::invalid(format!(
            "the wasm backend runs WebAssembly modules and Python/JavaScript scripts, not host commands ({}); use the process backend",
            argv.first().map(String::as_str).unwrap_or("")
        ))),
        // Tool is non-exhaustive.
        #[allow(unreachable_patterns)]
        other => Err(Error::invalid(format!(
            "the wasm backend cannot run {}",
            other.describe()
        ))),
    }
}

fn interpreter(dir: Option<&Path>, file: &str, language: &str) -> Result<PathBuf> {
    let Some(dir) = dir else {
        return Err(Error::unavailable(
            BackendKind::Wasm,
            format!(
                "no interpreter directory for {language} (set {} or HOME, or configure interpreter_dir); install the interpreters with {FETCH_SCRIPT}",
                crate::config::INTERPRETERS_ENV
            ),
        ));
    };
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::unavailable(
            BackendKind::Wasm,
            format!(
                "the {language} interpreter {} is missing: run {FETCH_SCRIPT} (or point {} at a directory holding {file})",
                path.display(),
                crate::config::INTERPRETERS_ENV
            ),
        ))
    }
}

/// Starts the QuickJS-NG reactor: `_initialize`, then `qjs_init_argv(argc, argv)` with the
/// arguments copied into guest memory. `Ok(0)` when the script ran without an uncaught
/// exception, `Ok(1)` otherwise (QuickJS has printed it to stderr).
pub(crate) async fn drive_quickjs(
    store: &mut Store<State>,
    instance: &Instance,
    argv: &[String],
) -> wasmtime::Result<i32> {
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut *store, "_initialize") {
        init.call_async(&mut *store, ()).await?;
    }
    let malloc = instance.get_typed_func::<i32, i32>(&mut *store, "malloc")?;
    let memory = instance
        .get_memory(&mut *store, "memory")
        .ok_or_else(|| wasmtime::format_err!("the QuickJS module exports no memory"))?;
    let alloc = async |store: &mut Store<State>, bytes: &[u8]| -> wasmtime::Result<u32> {
        let len = i32::try_from(bytes.len())
            .map_err(|_| wasmtime::format_err!("script argument too large"))?;
        let ptr = malloc.call_async(&mut *store, len).await?;
        if ptr == 0 {
            wasmtime::bail!("QuickJS ran out of memory copying its arguments");
        }
        memory.write(&mut *store, ptr as u32 as usize, bytes)?;
        Ok(ptr as u32)
    };
    let mut pointers = Vec::with_capacity(argv.len() + 1);
    for arg in argv {
        let mut bytes = Vec::with_capacity(arg.len() + 1);
        bytes.extend_from_slice(arg.as_bytes());
        bytes.push(0);
        pointers.push(alloc(store, &bytes).await?);
    }
    pointers.push(0);
    let table: Vec<u8> = pointers.iter().flat_map(|p| p.to_le_bytes()).collect();
    let table_ptr = alloc(store, &table).await?;
    let run = instance.get_typed_func::<(i32, i32), i32>(&mut *store, "qjs_init_argv")?;
    let argc = i32::try_from(argv.len()).unwrap_or(i32::MAX);
    let rc = run
        .call_async(&mut *store, (argc, table_ptr as i32))
        .await?;
    Ok(if rc == 0 { 0 } else { 1 })
}
