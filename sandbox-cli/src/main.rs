//! `strata`: run a command, script or WebAssembly module in a sandbox, or probe the host.
//!
//! Exit codes: the tool's own code; 124 when the wall-clock timeout ended it; 137 when
//! another limit killed it; 128+N when signal N killed it; 2 for bad arguments or an
//! invalid request (nothing ran); 125 when the run was refused or the sandbox failed
//! (nothing of the tool ran).
//!
//! The tool's output passes through as it arrives. When stdout (or stderr) is a terminal,
//! it first goes through [`sanitize::Sanitizer`] unless `--raw-output` is given.

mod approve;
mod args;
#[cfg(feature = "e2b")]
mod e2b;
#[cfg(feature = "kube")]
mod kube;
mod live;
#[cfg(feature = "mcp")]
mod mcp;
mod sanitize;
#[cfg(any(feature = "mcp", feature = "e2b"))]
mod shutdown;
mod signals;
mod snapshots;
mod terminal;

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Parser;
use strata::{doctor, Error, ErrorKind, OutputSink, RunContext, StdinSource, Stream};

use sanitize::Sanitizer;

#[cfg(feature = "kube")]
use args::KubeCommand;
use args::{AuditCommand, Cli, Command, RunArgs};

fn main() -> ExitCode {
    // `strata --version` answers before anything else is built (clap's whole command tree
    // included): scripts and health checks call it often.
    if let Some(version) = version_only() {
        let _ = writeln!(std::io::stdout(), "{version}");
        return ExitCode::SUCCESS;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            say(first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Doctor { json } => {
            let report = doctor();
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => {
                        let _ = writeln!(std::io::stdout(), "{text}");
                    }
                    Err(e) => eprintln!("strata: {e}"),
                }
            } else {
                let _ = write!(std::io::stdout(), "{report}");
            }
            ExitCode::SUCCESS
        }
        Command::Audit(AuditCommand::Verify { file, head }) => audit_verify(&file, head.as_deref()),
        Command::Live(command) => live::main(command),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => mcp::main(args),
        #[cfg(not(feature = "mcp"))]
        Command::Mcp(_) => not_built("mcp", "strata mcp"),
        #[cfg(feature = "e2b")]
        Command::Serve(args) => e2b::main(args),
        #[cfg(not(feature = "e2b"))]
        Command::Serve(_) => not_built("e2b", "strata serve"),
        #[cfg(feature = "kube")]
        Command::Kube(KubeCommand::Render(args)) => kube::render_command(&args),
        #[cfg(feature = "kube")]
        Command::Kube(KubeCommand::Apply(args)) => kube::apply_command(&args),
        #[cfg(not(feature = "kube"))]
        Command::Kube(_) => not_built("kube", "strata kube"),
    }
}

/// `strata VERSION` when the only argument is `--version` or `-V` (what clap prints).
fn version_only() -> Option<String> {
    let mut args = std::env::args_os().skip(1);
    let only = args.next()?;
    (args.next().is_none() && (only == "--version" || only == "-V"))
        .then(|| format!("strata {}", env!("CARGO_PKG_VERSION")))
}

/// `strata audit verify`: 0 for an intact log, 1 naming the first bad record, 2 when the
/// file cannot be read.
fn audit_verify(file: &std::path::Path, head: Option<&str>) -> ExitCode {
    match strata::audit::verify_file(file, head) {
        Ok(verified) => {
            println!("ok: {} records, head {}", verified.records, verified.head);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("strata: {e}");
            match e {
                strata::audit::AuditFileError::Io { .. } => ExitCode::from(2),
                strata::audit::AuditFileError::Broken { .. } => ExitCode::from(1),
            }
        }
    }
}

/// The `{"error": {kind, message}}` object of `--json` and `--result-file`.
fn error_json(err: &Error) -> serde_json::Value {
    serde_json::json!({ "error": { "kind": err.kind().code(), "message": err.to_string() } })
}

/// Writes `value` to `--result-file` (when given), replacing the file whole.
fn write_result(file: Option<&std::path::Path>, value: &serde_json::Value) {
    let Some(file) = file else {
        return;
    };
    let partial = file.with_extension("partial");
    let written =
        std::fs::write(&partial, value.to_string()).and_then(|()| std::fs::rename(&partial, file));
    if let Err(e) = written {
        eprintln!("strata: --result-file {}: {e}", file.display());
    }
}

/// The exit code of a run that did not happen: 2 for a bad request, 125 otherwise.
fn error_code(err: &Error) -> ExitCode {
    ExitCode::from(if err.kind() == ErrorKind::InvalidRequest {
        2
    } else {
        125
    })
}

/// A subcommand (or backend) of a cargo feature this binary was built without: exit 2,
/// naming the feature.
#[cfg(any(not(feature = "mcp"), not(feature = "kube"), not(feature = "e2b")))]
fn not_built(feature: &str, what: &str) -> ExitCode {
    say(&format!(
        "{what} is not in this build of strata: rebuild sandbox-cli with the `{feature}` feature (on by default)"
    ));
    ExitCode::from(2)
}

fn fail(err: &Error, json: bool) -> ExitCode {
    if json {
        let _ = writeln!(std::io::stdout(), "{}", error_json(err));
    } else {
        say(&err.to_string());
    }
    error_code(err)
}

/// Writes `strata: MESSAGE` to stderr as one line, with every control, escape and
/// bidirectional character escaped ([`strata::policy::prompt::escape`]): messages quote
/// paths and arguments the caller (or an agent) chose, which must not act on the terminal.
fn say(message: &str) {
    eprintln!("strata: {}", strata::policy::prompt::escape(message));
}

fn run(args: RunArgs) -> ExitCode {
    // Before anything starts a thread: SIGINT, SIGTERM and SIGHUP cancel the run, so what
    // it made (cgroups, mounts, a VM's private directory) is removed before the CLI exits.
    let cancel = strata::CancelToken::new();
    let stopped = signals::cancel_on_stop(cancel.clone());
    let json = args.json;
    let result_file = args.result_file.clone();
    let request = match args.into_request() {
        Ok(r) => r,
        Err(e) => {
            write_result(result_file.as_deref(), &error_json(&e));
            return if result_file.is_some() {
                // The caller reads the error from the result file.
                error_code(&e)
            } else {
                fail(&e, json)
            };
        }
    };
    let mut builder = request.sandbox_builder();
    #[cfg(not(feature = "kube"))]
    if request.cluster.is_some() {
        return not_built("kube", "--backend cluster");
    }
    #[cfg(feature = "kube")]
    if let Some(target) = &request.cluster {
        let mut options =
            sandbox_kube::backend::ClusterOptions::new(&target.namespace, &target.warm_pool);
        options.inner_cli.clone_from(&target.inner_cli);
        options.egress_listen = target.egress_listen;
        match sandbox_kube::backend::ClusterBackend::connect(target.kubeconfig.as_deref(), options)
        {
            Ok(cluster) => builder = builder.cluster(Arc::new(cluster)),
            Err(e) => return fail(&e, json),
        }
    }
    if request.allow_weaker {
        builder = builder.route_policy(strata::policy::RoutePolicy {
            allow_weaker: true,
            ..strata::policy::RoutePolicy::default()
        });
    }
    let sandbox = match builder.build() {
        Ok(s) => s,
        Err(e) => return fail(&e, json),
    };
    let mut ctx = RunContext {
        risk: request.risk,
        cancel,
        ..RunContext::default()
    };
    if request.stdin {
        // A duplicate of fd 0, streamed by the backend; this process never reads it.
        match std::io::stdin().as_fd().try_clone_to_owned() {
            Ok(fd) => ctx.stdin = Some(Arc::new(StdinSource::from_fd(fd))),
            Err(e) => {
                return fail(
                    &Error::invalid(format!("--stdin: cannot use standard input: {e}")),
                    json,
                )
            }
        }
    }
    let passthrough = (!json).then(|| Arc::new(Passthrough::new(request.raw_output)));
    if let Some(sink) = &passthrough {
        ctx.sink = Some(Arc::clone(sink) as Arc<dyn OutputSink>);
    }
    let result = sandbox.run_with(&request.tool, &request.caps, &ctx);
    if let Some(sink) = &passthrough {
        sink.finish();
    }
    if let (Err(Error::Cancelled), Some(signal)) =
        (&result, stopped.as_ref().and_then(|s| s.signal()))
    {
        write_result(
            request.result_file.as_deref(),
            &error_json(&Error::Cancelled),
        );
        if json {
            let _ = writeln!(std::io::stdout(), "{}", error_json(&Error::Cancelled));
        }
        say(&format!(
            "stopped by signal {signal}: the run was cancelled and everything it started removed"
        ));
        return ExitCode::from(u8::try_from(128 + signal).unwrap_or(255));
    }
    match &result {
        Ok(out) => {
            let mut value = out.to_json();
            if let Some(object) = value.as_object_mut() {
                object.remove("stdout");
                object.remove("stderr");
            }
            write_result(request.result_file.as_deref(), &value);
        }
        Err(e) => write_result(request.result_file.as_deref(), &error_json(e)),
    }
    match result {
        Ok(out) => {
            if json {
                let _ = writeln!(std::io::stdout(), "{}", out.to_json());
            } else {
                let _ = std::io::stdout().flush();
                if let (Some(limit), None) = (out.limit(), &request.result_file) {
                    eprintln!("strata: run ended by the {limit} limit");
                }
            }
            ExitCode::from(u8::try_from(out.cli_exit_code().clamp(0, 255)).unwrap_or(255))
        }
        Err(e) if request.result_file.is_some() => error_code(&e),
        Err(e) => fail(&e, json),
    }
}

/// Writes the tool's output to ours as it arrives, through a [`Sanitizer`] for each of our
/// streams that is a terminal (unless `--raw-output`).
struct Passthrough {
    stdout: Option<Mutex<Sanitizer>>,
    stderr: Option<Mutex<Sanitizer>>,
}

impl Passthrough {
    fn new(raw_output: bool) -> Self {
        let filter = |tty: bool| (tty && !raw_output).then(|| Mutex::new(Sanitizer::new()));
        Passthrough {
            stdout: filter(std::io::stdout().is_terminal()),
            stderr: filter(std::io::stderr().is_terminal()),
        }
    }

    fn write(stream: Stream, bytes: &[u8]) {
        let _ = match stream {
            Stream::Stdout => std::io::stdout().lock().write_all(bytes),
            Stream::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }

    fn filter(&self, stream: Stream) -> Option<&Mutex<Sanitizer>> {
        match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        }
    }

    /// Flushes what the filters still hold (an unfinished sequence, escaped).
    fn finish(&self) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if let Some(filter) = self.filter(stream) {
                let mut out = Vec::new();
                lock(filter).finish(&mut out);
                Self::write(stream, &out);
            }
        }
    }
}

impl OutputSink for Passthrough {
    fn on_output(&self, stream: Stream, chunk: &[u8]) {
        match self.filter(stream) {
            Some(filter) => {
                let mut out = Vec::with_capacity(chunk.len());
                lock(filter).push(chunk, &mut out);
                Self::write(stream, &out);
            }
            None => Self::write(stream, chunk),
        }
    }
}

fn lock(filter: &Mutex<Sanitizer>) -> std::sync::MutexGuard<'_, Sanitizer> {
    match filter.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
