//! `strata start | exec | ps | logs | kill | pause | resume | cp | stop | ls`: live sandboxes (see
//! `docs/live.md`). `start` prints the id and returns; the sandbox is held by its own
//! supervisor until `stop`, its TTLs, or a stop signal to that supervisor.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use strata::live::{ExecRequest, LiveSandbox, ProcessState, StartOptions, Stream};
use strata::{BackendChoice, BackendKind, Error};

use crate::args::{ExecArgs, LiveCommand, StartArgs};
use crate::sanitize::Sanitizer;
use crate::{error_code, fail, say};

/// Runs one of the live-sandbox subcommands.
pub fn main(command: LiveCommand) -> ExitCode {
    match command {
        LiveCommand::Start(args) => start(*args),
        LiveCommand::Exec(args) => exec(args),
        LiveCommand::Ps { id, json } => ps(&id, json),
        LiveCommand::Logs { id, pid, follow } => logs(&id, pid, follow),
        LiveCommand::Kill { id, pid, signal } => kill(&id, pid, &signal),
        LiveCommand::Stop { id } => stop(&id),
        LiveCommand::Pause { id, to_disk } => match to_disk {
            true => crate::snapshots::pause_to_disk(&id),
            false => pause(&id),
        },
        LiveCommand::Snapshot {
            target,
            removed,
            name,
            json,
        } => crate::snapshots::snapshot(&target, removed.as_deref(), name.as_deref(), json),
        LiveCommand::Snapshots { json } => crate::snapshots::list(json),
        LiveCommand::Fork {
            id,
            count,
            ttl,
            idle_ttl,
            json,
        } => crate::snapshots::fork(&id, count, ttl, idle_ttl, json),
        LiveCommand::Resume { id } => resume(&id),
        LiveCommand::Cp { from, to } => copy(&from, &to),
        LiveCommand::Ls { json } => ls(json),
    }
}

fn start(args: StartArgs) -> ExitCode {
    let json = args.run.json;
    match start_sandbox(args) {
        Ok(sandbox) => {
            let mut stdout = std::io::stdout();
            let line = if json {
                serde_json::json!({
                    "id": sandbox.id(),
                    "name": sandbox.info().name,
                    "backend": sandbox.info().backend,
                    "ports": sandbox.info().ports,
                    "receipt": sandbox.info().receipt,
                })
                .to_string()
            } else {
                sandbox.id().to_string()
            };
            let _ = writeln!(stdout, "{line}");
            let _ = stdout.flush();
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, json),
    }
}

fn start_sandbox(args: StartArgs) -> strata::Result<LiveSandbox> {
    let StartArgs {
        mut run,
        ttl,
        idle_ttl,
        idle_pause,
        name,
        publish,
        from,
    } = args;
    let publish = publish
        .iter()
        .map(|text| strata::live::PublishRequest::parse(text))
        .collect::<strata::Result<Vec<_>>>()?;
    if !run.command.is_empty() {
        return Err(Error::invalid(
            "strata start takes no program: start the sandbox, then `strata exec ID -- PROGRAM`",
        ));
    }
    if run.script.is_some() || run.stdin || run.result_file.is_some() {
        return Err(Error::invalid(
            "--script, --stdin and --result-file are for strata run and strata exec, not start",
        ));
    }
    if run.risk.is_some() {
        return Err(Error::invalid(
            "--risk routes one run; a live sandbox's backend is --backend (or --image for the container backend)",
        ));
    }
    // What the supervisor keeps for any start: the name, clocks and ports.
    let mut options = StartOptions {
        name,
        ttl: seconds("ttl", ttl)?,
        idle_ttl: seconds("idle-ttl", idle_ttl)?,
        idle_pause: seconds("idle-pause", idle_pause)?,
        owned: false,
        publish,
        ..StartOptions::default()
    };
    if let Some(from) = from {
        return crate::snapshots::start_from(&from, run, options);
    }
    if run.backend == "auto" {
        // An image means the container backend (its native runtime); else the process one.
        run.backend = match run.image.is_some() {
            true => "container".into(),
            false => "process".into(),
        };
    }
    // The caps are parsed exactly as `strata run` parses them; the placeholder program is
    // only there to complete that request and never runs.
    run.command = vec!["true".into()];
    let request = run.into_request()?;
    let backend = match request.backend {
        BackendChoice::Only(kind) => kind,
        _ => BackendKind::Process,
    };
    // The policy as `strata run` applies it: the caps admitted against the tier now (with
    // the approver: a program, or this terminal), and every exec's program checked by the
    // supervisor (which can ask an approver program, not a terminal) and audited.
    let sandbox = request.sandbox_builder().build()?;
    options.strictness = request.strictness;
    options.backend = backend;
    if let Some(crate::approve::ApproverChoice::Program(program)) = &request.approver {
        options.policy.approver = Some(program.clone());
    }
    sandbox.start(&request.caps, options)
}

/// A `--ttl`-style flag's value: at least a second.
pub(crate) fn seconds(flag: &str, value: Option<f64>) -> strata::Result<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if (1.0..1e9).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Error::invalid(format!(
            "--{flag} must be at least 1 second, got {s}"
        ))),
    }
}

fn exec(args: ExecArgs) -> ExitCode {
    let json = args.json;
    let sandbox = match LiveSandbox::attach(&args.id) {
        Ok(sandbox) => sandbox,
        Err(e) => return fail(&e, json),
    };
    let mut env = std::collections::BTreeMap::new();
    for pair in &args.env {
        match pair.split_once('=') {
            Some((key, value)) => {
                env.insert(key.to_string(), value.to_string());
            }
            None => {
                return fail(
                    &Error::invalid(format!("--env {pair:?}: expected KEY=VALUE")),
                    json,
                )
            }
        }
    }
    let timeout_ms = match args.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t < 1e9 => Some((t * 1000.0).ceil() as u64),
        Some(t) => {
            return fail(
                &Error::invalid(format!(
                    "--timeout must be a positive number of seconds, got {t}"
                )),
                json,
            )
        }
    };
    if args.tty && (json || args.stdin) {
        return fail(
            &Error::invalid(
                "--tty takes no --json or --stdin: the terminal carries the input and output",
            ),
            json,
        );
    }
    let request = ExecRequest {
        argv: args.command,
        env,
        workdir: args.workdir,
        timeout_ms,
        stdin: args.stdin,
        detach: args.detach,
        tty: args.tty.then(crate::terminal::size),
    };
    if args.tty && !args.detach {
        return exec_on_terminal(&sandbox, request);
    }
    if args.detach {
        return match sandbox.spawn(request) {
            Ok(pid) => {
                let _ = writeln!(std::io::stdout(), "{pid}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e, json),
        };
    }
    let stdin: Option<Box<dyn Read + Send>> = args
        .stdin
        .then(|| Box::new(std::io::stdin()) as Box<dyn Read + Send>);
    let mut out = Output::new(json);
    match sandbox.exec(request, stdin, |stream, bytes| out.write(stream, bytes)) {
        Ok(exit) => {
            if json {
                let value = serde_json::json!({
                    "pid": exit.pid,
                    "exit_code": exit.exit_code,
                    "signal": exit.signal,
                    "timed_out": exit.timed_out,
                    "stdout": String::from_utf8_lossy(&out.stdout),
                    "stderr": String::from_utf8_lossy(&out.stderr),
                });
                let _ = writeln!(std::io::stdout(), "{value}");
            }
            ExitCode::from(u8::try_from(exit.shell_code()).unwrap_or(1))
        }
        Err(e) => fail(&e, json),
    }
}

/// `exec --tty` in the foreground: the program's terminal follows this one's size, this
/// terminal is raw while it runs, keystrokes go to it and its output comes back as is.
fn exec_on_terminal(sandbox: &LiveSandbox, request: ExecRequest) -> ExitCode {
    let pid = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let raw = crate::terminal::Raw::enter();
    let (socket_sandbox, resize_pid) = (sandbox.id().to_string(), std::sync::Arc::clone(&pid));
    // Before any thread starts: they all inherit the blocked signals.
    crate::terminal::watch_signals(
        move || {
            let pid = resize_pid.load(std::sync::atomic::Ordering::SeqCst);
            if pid > 0 {
                if let Ok(sandbox) = LiveSandbox::attach(&socket_sandbox) {
                    let _ = sandbox.resize(pid, crate::terminal::size());
                }
            }
        },
        raw.restorer(),
    );
    let input: Box<dyn Read + Send> = Box::new(std::io::stdin());
    let mut stdout = std::io::stdout();
    let result = sandbox.exec_started(
        request,
        Some(input),
        |started| pid.store(started, std::sync::atomic::Ordering::SeqCst),
        |_, bytes| {
            let _ = stdout.write_all(bytes);
            let _ = stdout.flush();
        },
    );
    drop(raw);
    match result {
        Ok(exit) => ExitCode::from(u8::try_from(exit.shell_code()).unwrap_or(1)),
        Err(e) => fail(&e, false),
    }
}

/// Where an exec's or a log's output goes: through, sanitised on a terminal, or kept for
/// `--json`.
struct Output {
    json: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    out_tty: Option<Sanitizer>,
    err_tty: Option<Sanitizer>,
}

impl Output {
    fn new(json: bool) -> Output {
        Output {
            json,
            stdout: Vec::new(),
            stderr: Vec::new(),
            out_tty: std::io::stdout().is_terminal().then(Sanitizer::new),
            err_tty: std::io::stderr().is_terminal().then(Sanitizer::new),
        }
    }

    fn write(&mut self, stream: Stream, bytes: &[u8]) {
        if self.json {
            match stream {
                Stream::Stdout => self.stdout.extend_from_slice(bytes),
                Stream::Stderr => self.stderr.extend_from_slice(bytes),
            }
            return;
        }
        let (sanitizer, mut sink): (&mut Option<Sanitizer>, Box<dyn Write>) = match stream {
            Stream::Stdout => (&mut self.out_tty, Box::new(std::io::stdout())),
            Stream::Stderr => (&mut self.err_tty, Box::new(std::io::stderr())),
        };
        let _ = match sanitizer {
            Some(s) => {
                let mut clean = Vec::with_capacity(bytes.len());
                s.push(bytes, &mut clean);
                sink.write_all(&clean)
            }
            None => sink.write_all(bytes),
        };
        let _ = sink.flush();
    }
}

fn ps(id: &str, json: bool) -> ExitCode {
    let processes = match LiveSandbox::attach(id).and_then(|s| s.ps()) {
        Ok(processes) => processes,
        Err(e) => return fail(&e, json),
    };
    let mut stdout = std::io::stdout();
    if json {
        let _ = writeln!(
            stdout,
            "{}",
            serde_json::Value::from(
                processes
                    .iter()
                    .map(|p| serde_json::json!({
                        "pid": p.pid,
                        "argv": p.argv,
                        "state": p.state,
                        "exit_code": p.exit_code,
                        "signal": p.signal,
                        "timed_out": p.timed_out,
                    }))
                    .collect::<Vec<_>>(),
            )
        );
        return ExitCode::SUCCESS;
    }
    let _ = writeln!(stdout, "STATE    EXIT  COMMAND  PID");
    for p in processes {
        let state = match p.state {
            ProcessState::Running => "running",
            ProcessState::Exited => "exited",
        };
        let exit = match (p.exit_code, p.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(signal)) => format!("sig{signal}"),
            (None, None) => "-".into(),
        };
        let command = strata::policy::prompt::escape(&p.argv.join(" "));
        // The pid is the last word, so scripts take it with `awk '{print $NF}'`.
        let _ = writeln!(stdout, "{state:<8} {exit:<5} {command}  {}", p.pid);
    }
    ExitCode::SUCCESS
}

fn logs(id: &str, pid: i32, follow: bool) -> ExitCode {
    let sandbox = match LiveSandbox::attach(id) {
        Ok(sandbox) => sandbox,
        Err(e) => return fail(&e, false),
    };
    let mut out = Output::new(false);
    match sandbox.logs(pid, follow, |stream, bytes| out.write(stream, bytes)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e, false),
    }
}

fn kill(id: &str, pid: i32, signal: &str) -> ExitCode {
    let number = match signal_number(signal) {
        Some(n) => n,
        None => {
            return fail(
                &Error::invalid(format!(
                    "--signal {signal:?}: a number or a name like TERM, KILL, INT, HUP"
                )),
                false,
            )
        }
    };
    match LiveSandbox::attach(id).and_then(|s| s.kill(pid, number)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, false),
    }
}

/// `TERM`, `SIGTERM`, `15`.
fn signal_number(text: &str) -> Option<i32> {
    if let Ok(n) = text.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = text
        .strip_prefix("SIG")
        .unwrap_or(text)
        .to_ascii_uppercase();
    Some(match name.as_str() {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        _ => return None,
    })
}

fn stop(id: &str) -> ExitCode {
    match LiveSandbox::attach(id).and_then(LiveSandbox::stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say(&e.to_string());
            error_code(&e)
        }
    }
}

fn pause(id: &str) -> ExitCode {
    match LiveSandbox::attach(id).and_then(|sandbox| sandbox.pause()) {
        Ok(method) => {
            if method == strata::live::PauseMethod::Signals {
                say(&format!("paused with stop signals ({})", method.describe()));
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, false),
    }
}

fn resume(id: &str) -> ExitCode {
    match LiveSandbox::attach(id).and_then(|sandbox| sandbox.resume()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, false),
    }
}

/// `ID:PATH`: a sandbox's id or name (no `/` in it), a colon, a path in it.
fn sandbox_path(text: &str) -> Option<(&str, &str)> {
    let (id, path) = text.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && !path.is_empty()).then_some((id, path))
}

fn copy(from: &str, to: &str) -> ExitCode {
    let done = match (sandbox_path(from), sandbox_path(to)) {
        (Some((id, path)), None) => copy_out(id, path, std::path::Path::new(to)),
        (None, Some((id, path))) => copy_in(std::path::Path::new(from), id, path),
        _ => Err(Error::invalid(
            "strata cp copies between a sandbox and the host: one of ID:PATH and a host path each (write ./NAME for a host path with a colon)",
        )),
    };
    match done {
        Ok(transfer) => {
            say(&format!(
                "copied {} files, {} directories, {} bytes",
                transfer.files, transfer.dirs, transfer.bytes
            ));
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, false),
    }
}

/// Out of the sandbox; into `host` (which must not exist), or into the directory `host`
/// under the entry's own name.
fn copy_out(id: &str, path: &str, host: &std::path::Path) -> strata::Result<strata::Transfer> {
    let sandbox = LiveSandbox::attach(id)?;
    let host = if host.is_dir() {
        let name = std::path::Path::new(path)
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{path:?} names no entry to copy")))?;
        host.join(name)
    } else {
        host.to_path_buf()
    };
    sandbox.download(path, &host)
}

/// Into the sandbox; into `path`, or into the directory `path` under the source's name.
fn copy_in(host: &std::path::Path, id: &str, path: &str) -> strata::Result<strata::Transfer> {
    let sandbox = LiveSandbox::attach(id)?;
    let into_dir = sandbox
        .stat(path)
        .is_ok_and(|entry| entry.kind == strata::FileKind::Dir);
    let target = match (into_dir, host.file_name()) {
        (true, Some(name)) => format!("{}/{}", path.trim_end_matches('/'), name.to_string_lossy()),
        _ => path.to_string(),
    };
    sandbox.upload(host, &target)
}

fn ls(json: bool) -> ExitCode {
    let list = match LiveSandbox::list() {
        Ok(list) => list,
        Err(e) => return fail(&e, json),
    };
    let mut stdout = std::io::stdout();
    if json {
        let value: Vec<_> = list
            .iter()
            .map(|info| {
                serde_json::json!({
                    "id": info.id,
                    "name": info.name,
                    "backend": info.backend,
                    "started_at": info.started_at,
                    "ttl_s": info.ttl_s,
                    "idle_ttl_s": info.idle_ttl_s,
                    "state": if info.paused { "paused" } else { "running" },
                    "ports": info.ports,
                    "cpu_us": info.cpu_us,
                })
            })
            .collect();
        let _ = writeln!(stdout, "{}", serde_json::Value::from(value));
        return ExitCode::SUCCESS;
    }
    for info in list {
        let ports: Vec<String> = info
            .ports
            .iter()
            .map(|p| format!("{}:{}->{}", p.host_ip, p.host_port, p.guest_port))
            .collect();
        let _ = writeln!(
            stdout,
            "{}  {}  {}  {}  {}",
            info.id,
            info.backend,
            if info.paused { "paused" } else { "running" },
            if ports.is_empty() {
                "-".to_string()
            } else {
                ports.join(",")
            },
            info.name.as_deref().unwrap_or("-")
        );
    }
    ExitCode::SUCCESS
}
