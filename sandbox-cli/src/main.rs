//! `strata`: run a command, script or WebAssembly module in a sandbox, or probe the host.
//!
//! Exit codes: the tool's own code; 124 when the wall-clock timeout ended it; 137 when
//! another limit killed it; 128+N when signal N killed it; 2 for bad arguments or an
//! invalid request (nothing ran); 125 when the run was refused or the sandbox failed
//! (nothing of the tool ran).

mod args;

use std::io::Write;
use std::os::fd::AsFd;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use strata::{doctor, Error, ErrorKind, RunContext, Sandbox, StdinSource, Stream};

use args::{Cli, Command, RunArgs};

fn main() -> ExitCode {
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
            eprintln!("strata: {}", first.trim_start_matches("error: "));
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
    }
}

fn fail(err: &Error, json: bool) -> ExitCode {
    let code: u8 = if err.kind() == ErrorKind::InvalidRequest {
        2
    } else {
        125
    };
    if json {
        let value = serde_json::json!({ "error": { "kind": err.kind().code(), "message": err.to_string() } });
        let _ = writeln!(std::io::stdout(), "{value}");
    } else {
        eprintln!("strata: {err}");
    }
    ExitCode::from(code)
}

fn run(args: RunArgs) -> ExitCode {
    let json = args.json;
    let request = match args.into_request() {
        Ok(r) => r,
        Err(e) => return fail(&e, json),
    };
    let sandbox = match Sandbox::builder()
        .backend(request.backend)
        .strictness(request.strictness)
        .build()
    {
        Ok(s) => s,
        Err(e) => return fail(&e, json),
    };
    let mut ctx = RunContext::default();
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
    if !json {
        // Pass output through as it arrives.
        ctx.sink = Some(Arc::new(|stream: Stream, chunk: &[u8]| {
            let _ = match stream {
                Stream::Stdout => std::io::stdout().lock().write_all(chunk),
                Stream::Stderr => std::io::stderr().lock().write_all(chunk),
            };
        }));
    }
    match sandbox.run_with(&request.tool, &request.caps, &ctx) {
        Ok(out) => {
            if json {
                let _ = writeln!(std::io::stdout(), "{}", out.to_json());
            } else {
                let _ = std::io::stdout().flush();
                if let Some(limit) = out.limit() {
                    eprintln!("strata: run ended by the {limit} limit");
                }
            }
            ExitCode::from(u8::try_from(out.cli_exit_code().clamp(0, 255)).unwrap_or(255))
        }
        Err(e) => fail(&e, json),
    }
}
