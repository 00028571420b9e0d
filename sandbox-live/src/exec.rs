//! The supervisor's requests about processes: `exec` (foreground or detached), `logs`,
//! `wait`, `kill`, `stdin`, `close_stdin` and `ps`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use sandbox_core::Error;
use sandbox_os::live::LiveCommand;

use crate::protocol::{decode, encode, ExecRequest, ExitInfo, Reply, Request, WireError};
use crate::ring::Stream;
use crate::server::{send, Context, Out};
use crate::table::Pending;

/// Most execs running at once in one sandbox: 512 (each has an output reader thread in the
/// supervisor; the cgroup's pids limit bounds what they fork).
pub const MAX_RUNNING: usize = 512;

/// How long init may take to answer an exec (it forks and executes; milliseconds).
const START_WAIT: Duration = Duration::from_secs(30);

fn reply(out: &Out, reply: &Reply) -> std::io::Result<()> {
    send(out, reply)
}

fn error_reply(out: &Out, error: &Error) -> bool {
    reply(
        out,
        &Reply::Error {
            error: WireError::from(error),
        },
    )
    .is_ok()
}

/// `exec`: starts the command; a detached one answers with its pid, a foreground one
/// streams its output and ends with how it exited, while this connection keeps taking
/// requests (its `stdin`, `close_stdin`, `kill`). Returns whether the connection goes on.
pub(crate) fn exec(
    context: &Arc<Context>,
    request: ExecRequest,
    out: &Out,
    foreground: &mut Vec<i32>,
) -> bool {
    let out = Arc::clone(out);
    let detach = request.detach;
    let pid = match start(context, request) {
        Ok(pid) => pid,
        Err(error) => return error_reply(&out, &error),
    };
    if reply(&out, &Reply::Started { pid }).is_err() {
        return false;
    }
    if detach {
        return true;
    }
    foreground.retain(|pid| {
        context
            .table
            .lock()
            .procs
            .get(pid)
            .is_some_and(|p| p.exit.is_none())
    });
    foreground.push(pid);
    let context = Arc::clone(context);
    crate::workers::run(move || {
        if follow(&context, pid, &out, true).is_err() {
            // The client went away during a foreground exec: that cancels it.
            kill_exec(&context, pid);
        }
    })
    .is_ok()
}

/// Kills exec `pid`'s process group (the sandbox may have stopped already).
fn kill_exec(context: &Context, pid: i32) {
    if let Some(sandbox) = context
        .sandbox
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        let _ = sandbox.signal(pid, libc::SIGKILL);
    }
}

/// Validates and starts an exec; returns its pid.
fn start(context: &Arc<Context>, request: ExecRequest) -> Result<i32, Error> {
    let ExecRequest {
        argv,
        env,
        workdir,
        timeout_ms,
        stdin,
        tty,
        ..
    } = request;
    let Some(program) = argv.first().cloned() else {
        return Err(Error::invalid("exec: argv is empty"));
    };
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::invalid("exec: an argument contains a NUL byte"));
    }
    check_env(&env)?;
    let workdir = match workdir {
        Some(dir) if !dir.starts_with('/') || dir.contains('\0') => {
            return Err(Error::invalid(format!(
                "exec: workdir {dir:?} must be an absolute path inside the sandbox"
            )))
        }
        Some(dir) => Some(PathBuf::from(dir)),
        None => None,
    };
    let timeout = match timeout_ms {
        Some(0) => return Err(Error::invalid("exec: timeout must be more than 0 ms")),
        other => other.map(Duration::from_millis),
    };
    // The tier decides on the program (the caps were admitted when the sandbox started);
    // a refusal is in the audit log before it is returned.
    context.policy.admit(&argv)?;
    let audited_argv = context.policy.audited().then(|| argv.clone());
    let Stdio {
        child,
        input,
        outputs,
        terminal,
    } = stdio(tty, stdin)?;
    let id = {
        let mut table = context.table.lock();
        if table.stopped {
            return Err(Error::invalid("the sandbox has stopped"));
        }
        if table.paused_since.is_some() {
            return Err(Error::invalid(
                "the sandbox is paused: resume it before starting a process",
            ));
        }
        if table.running() >= MAX_RUNNING {
            return Err(Error::invalid(format!(
                "the sandbox already runs {MAX_RUNNING} execs; wait for some to end"
            )));
        }
        let id = table.next_id();
        table.pending.insert(
            id,
            Pending {
                argv: argv.clone(),
                stdin: input,
                terminal,
                timeout,
                answer: None,
            },
        );
        id
    };
    let sent = {
        let guard = context.sandbox.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(sandbox) => {
                let mut full_env: Vec<String> = sandbox
                    .base_env()
                    .iter()
                    .filter(|entry| {
                        let key = entry.split('=').next().unwrap_or_default();
                        !env.contains_key(key)
                    })
                    .cloned()
                    .collect();
                full_env.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
                let command = LiveCommand {
                    program,
                    argv,
                    env: full_env,
                };
                let workdir = workdir.unwrap_or_else(|| sandbox.workdir().to_path_buf());
                let [stdin, stdout, stderr] = &child;
                sandbox.exec(
                    id,
                    command,
                    workdir,
                    [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
                    tty.is_some(),
                )
            }
            None => Err(Error::invalid("the sandbox has stopped")),
        }
    };
    drop(child);
    if let Err(error) = sent {
        context.table.lock().pending.remove(&id);
        return Err(error);
    }
    let deadline = Instant::now() + START_WAIT;
    let mut table = context.table.lock();
    let answer = loop {
        if let Some(answer) = table.pending.get_mut(&id).and_then(|p| p.answer.take()) {
            break answer;
        }
        if Instant::now() >= deadline {
            break Err(Error::Internal {
                message: "the live sandbox did not answer the exec".into(),
                source: None,
            });
        }
        table = context.table.wait(table, Duration::from_millis(100));
    };
    table.pending.remove(&id);
    drop(table);
    let pid = answer?;
    if let Some(argv) = audited_argv {
        // Nothing runs unrecorded: an exec whose start cannot be logged is ended.
        if let Err(error) = context.policy.started(&argv, pid) {
            kill_exec(context, pid);
            return Err(error);
        }
    }
    read_output(context, pid, outputs);
    Ok(pid)
}

/// An exec's descriptors.
struct Stdio {
    /// The exec's stdin, stdout and stderr.
    child: [OwnedFd; 3],
    /// The supervisor's end of its stdin, when kept open.
    input: Option<File>,
    /// The supervisor's ends of its output, with the stream each is.
    outputs: Vec<(OwnedFd, Stream)>,
    /// The terminal's master, for a `tty` exec.
    terminal: Option<OwnedFd>,
}

/// Pipes, or (`tty`) one pseudo-terminal whose slave is all three of the exec's stdio.
fn stdio(tty: Option<crate::protocol::TtySize>, stdin: bool) -> Result<Stdio, Error> {
    let pipe = || {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| Error::internal("exec: make a pipe", e.into()))
    };
    let copy = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| Error::internal("exec: copy a descriptor", e))
    };
    if let Some(size) = tty {
        let pair = crate::pty::open(size)?;
        return Ok(Stdio {
            child: [copy(&pair.slave)?, copy(&pair.slave)?, pair.slave],
            input: Some(File::from(copy(&pair.master)?)),
            outputs: vec![(copy(&pair.master)?, Stream::Stdout)],
            terminal: Some(pair.master),
        });
    }
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    Ok(Stdio {
        child: [stdin_r, stdout_w, stderr_w],
        input: stdin.then(|| File::from(stdin_w)),
        outputs: vec![(stdout_r, Stream::Stdout), (stderr_r, Stream::Stderr)],
        terminal: None,
    })
}

/// The variables an exec may set: names of `[A-Za-z_][A-Za-z0-9_]*`, no NUL in values.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
    for (key, value) in env {
        let mut bytes = key.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(Error::invalid(format!(
                "exec: {key:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        if value.contains('\0') {
            return Err(Error::invalid(format!(
                "exec: the value of {key} contains a NUL byte"
            )));
        }
    }
    Ok(())
}

/// Reads an exec's outputs into its ring until all close (a terminal's master reads an
/// error once no process holds its slave: that is its end).
fn read_output(context: &Arc<Context>, pid: i32, outputs: Vec<(OwnedFd, Stream)>) {
    let context = Arc::clone(context);
    let spawned = crate::workers::run(move || {
        let streams: Vec<Stream> = outputs.iter().map(|(_, stream)| *stream).collect();
        let mut open: Vec<Option<File>> = outputs
            .into_iter()
            .map(|(fd, _)| Some(File::from(fd)))
            .collect();
        let mut buf = vec![0u8; 64 * 1024];
        while open.iter().any(Option::is_some) {
            let mut fds: Vec<PollFd<'_>> = open
                .iter()
                .flatten()
                .map(|f| PollFd::new(f, PollFlags::IN))
                .collect();
            if rustix::event::poll(&mut fds, None).is_err() {
                continue;
            }
            drop(fds);
            for (slot, stream) in open.iter_mut().zip(streams.iter().copied()) {
                let Some(file) = slot.as_mut() else { continue };
                let mut probe = [PollFd::new(&*file, PollFlags::IN)];
                let zero = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                if !matches!(rustix::event::poll(&mut probe, Some(&zero)), Ok(n) if n > 0) {
                    continue;
                }
                match file.read(&mut buf) {
                    Ok(0) | Err(_) => *slot = None,
                    Ok(n) => {
                        let mut table = context.table.lock();
                        if let Some(proc) = table.procs.get_mut(&pid) {
                            proc.ring.push(stream, &buf[..n]);
                        }
                        drop(table);
                        context.table.notify();
                    }
                }
            }
        }
        if let Some(proc) = context.table.lock().procs.get_mut(&pid) {
            proc.output_open = false;
        }
        context.table.notify();
    });
    if spawned.is_err() {
        tracing::warn!("no thread to read the output of pid {pid}");
    }
}

/// Streams `pid`'s output from what the ring holds; with `follow`, until it exits (then
/// sends how). Without, ends with `exited` or `ok` (still running).
fn follow(context: &Context, pid: i32, out: &Out, follow: bool) -> std::io::Result<()> {
    context.table.lock().attached += 1;
    let result = stream(context, pid, out, follow);
    context.table.lock().attached -= 1;
    result
}

fn stream(context: &Context, pid: i32, out: &Out, follow: bool) -> std::io::Result<()> {
    let mut offset = 0u64;
    loop {
        let mut table = context.table.lock();
        let Some(proc) = table.procs.get(&pid) else {
            drop(table);
            let error = Error::invalid(format!("no process {pid} in this sandbox"));
            reply(
                out,
                &Reply::Error {
                    error: WireError::from(&error),
                },
            )?;
            return Ok(());
        };
        let read = proc.ring.read_from(offset);
        let done = proc.finished();
        let exit = proc.exit;
        if read.chunks.is_empty() && read.missed == 0 && !done && follow && !table.stopped {
            table = context.table.wait(table, Duration::from_millis(50));
            drop(table);
            continue;
        }
        drop(table);
        if read.missed > 0 {
            reply(out, &Reply::Missed { bytes: read.missed })?;
        }
        for (stream, data) in read.chunks {
            reply(
                out,
                &Reply::Output {
                    stream,
                    data: encode(&data),
                },
            )?;
        }
        offset = read.next;
        match exit {
            Some(exit) if done => return reply(out, &Reply::Exited { exit }),
            _ if !follow => return reply(out, &Reply::Ok),
            _ => {}
        }
    }
}

/// `ps`, `logs`, `wait`, `kill`, `stdin`, `close_stdin`. Returns whether the connection
/// goes on.
pub(crate) fn control(context: &Arc<Context>, request: Request, out: &Out) -> bool {
    let result = match request {
        Request::Ps => {
            let processes = context.table.lock().list();
            reply(out, &Reply::Processes { processes })
        }
        Request::Logs { pid, follow: f } => follow(context, pid, out, f),
        Request::LogsSince {
            pid,
            offset,
            wait_ms,
        } => logs_since(context, pid, offset, wait_ms, out),
        Request::Wait { pid } => wait(context, pid, out),
        Request::Kill { pid, signal } => kill(context, pid, signal, out),
        Request::Stdin { pid, data } => write_stdin(context, pid, &data, out),
        Request::CloseStdin { pid } => {
            let known = match context.table.lock().procs.get_mut(&pid) {
                Some(proc) => {
                    proc.stdin = None;
                    true
                }
                None => false,
            };
            if known {
                reply(out, &Reply::Ok)
            } else {
                no_process(out, pid)
            }
        }
        Request::Resize { pid, size } => {
            let resized = context
                .table
                .lock()
                .procs
                .get(&pid)
                .map(|proc| match &proc.terminal {
                    Some(master) => crate::pty::resize(master, size),
                    None => Err(Error::invalid(format!(
                        "process {pid} has no terminal (start it with tty)"
                    ))),
                });
            let resized = match resized {
                Some(Ok(())) => Some(
                    context
                        .sandbox
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .map_or(Ok(()), |sandbox| sandbox.resized(pid, size.rows, size.cols)),
                ),
                other => other,
            };
            match resized {
                None => no_process(out, pid),
                Some(Ok(())) => reply(out, &Reply::Ok),
                Some(Err(error)) => reply(
                    out,
                    &Reply::Error {
                        error: WireError::from(&error),
                    },
                ),
            }
        }
        Request::Info
        | Request::Exec(_)
        | Request::Stop
        | Request::Pause
        | Request::Resume
        | Request::Publish(_)
        | Request::Files(_) => Ok(()),
    };
    result.is_ok()
}

/// Longest a `logs_since` waits: 30 s.
const MAX_LONG_POLL: Duration = Duration::from_secs(30);

fn logs_since(
    context: &Context,
    pid: i32,
    offset: u64,
    wait_ms: u64,
    out: &Out,
) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(wait_ms).min(MAX_LONG_POLL);
    let mut table = context.table.lock();
    table.attached += 1;
    let answer = loop {
        let Some(proc) = table.procs.get(&pid) else {
            break None;
        };
        let read = proc.ring.read_from(offset);
        let done = proc.finished();
        if !read.chunks.is_empty()
            || read.missed > 0
            || done
            || table.stopped
            || Instant::now() >= deadline
        {
            let exit = if done { proc.exit } else { None };
            break Some(Reply::Since {
                chunks: read
                    .chunks
                    .into_iter()
                    .map(|(stream, data)| (stream, encode(&data)))
                    .collect(),
                missed: read.missed,
                next: read.next,
                exit,
            });
        }
        table = context.table.wait(table, Duration::from_millis(50));
    };
    table.attached -= 1;
    drop(table);
    match answer {
        Some(reply) => send(out, &reply),
        None => no_process(out, pid),
    }
}

fn no_process(out: &Out, pid: i32) -> std::io::Result<()> {
    let error = Error::invalid(format!("no process {pid} in this sandbox"));
    reply(
        out,
        &Reply::Error {
            error: WireError::from(&error),
        },
    )
}

fn wait(context: &Context, pid: i32, out: &Out) -> std::io::Result<()> {
    let mut table = context.table.lock();
    table.attached += 1;
    let exit: Option<ExitInfo> = loop {
        match table.procs.get(&pid) {
            None => break None,
            Some(proc) if proc.exit.is_some() => break proc.exit,
            Some(_) if table.stopped => break None,
            Some(_) => table = context.table.wait(table, Duration::from_millis(100)),
        }
    };
    table.attached -= 1;
    drop(table);
    match exit {
        Some(exit) => reply(out, &Reply::Exited { exit }),
        None => no_process(out, pid),
    }
}

fn kill(context: &Context, pid: i32, signal: i32, out: &Out) -> std::io::Result<()> {
    if !(1..=64).contains(&signal) {
        let error = Error::invalid(format!("{signal} is not a signal number (1-64)"));
        return reply(
            out,
            &Reply::Error {
                error: WireError::from(&error),
            },
        );
    }
    let running = context
        .table
        .lock()
        .procs
        .get(&pid)
        .map(|p| p.exit.is_none());
    match running {
        None => no_process(out, pid),
        Some(false) => reply(out, &Reply::Ok),
        Some(true) => {
            let sent = match context
                .sandbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                Some(sandbox) => sandbox.signal(pid, signal),
                None => Err(Error::invalid("the sandbox has stopped")),
            };
            match sent {
                Ok(()) => reply(out, &Reply::Ok),
                Err(error) => reply(
                    out,
                    &Reply::Error {
                        error: WireError::from(&error),
                    },
                ),
            }
        }
    }
}

fn write_stdin(context: &Context, pid: i32, data: &str, out: &Out) -> std::io::Result<()> {
    let bytes = match decode(data) {
        Ok(bytes) => bytes,
        Err(error) => {
            return reply(
                out,
                &Reply::Error {
                    error: WireError::from(&error),
                },
            )
        }
    };
    // A copy of the pipe, written outside the lock: a process that does not read must not
    // stall the supervisor.
    let pipe = match context.table.lock().procs.get(&pid) {
        None => return no_process(out, pid),
        Some(proc) => proc.stdin.as_ref().map(File::try_clone),
    };
    match pipe {
        Some(Ok(mut pipe)) => match pipe.write_all(&bytes) {
            Ok(()) => reply(out, &Reply::Ok),
            Err(e) => {
                let error = Error::invalid(format!("process {pid} no longer reads its stdin: {e}"));
                reply(
                    out,
                    &Reply::Error {
                        error: WireError::from(&error),
                    },
                )
            }
        },
        _ => {
            let error = Error::invalid(format!(
                "process {pid} has no open stdin (start it with stdin, and before close_stdin)"
            ));
            reply(
                out,
                &Reply::Error {
                    error: WireError::from(&error),
                },
            )
        }
    }
}
