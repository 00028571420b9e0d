//! An approver that is a program: the elevation request as JSON on its stdin, its exit
//! status the answer. The CLI's `--approver PROGRAM`, and the approver a live sandbox's
//! supervisor asks about each exec beyond its tier (the supervisor cannot call back into
//! the process that started it).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_policy::{Approval, Approver, ElevationRequest};

/// How long an approver program may take before the request is refused.
const PROGRAM_DEADLINE: Duration = Duration::from_secs(120);
/// At most this much of an approver program's output is read.
const MAX_ANSWER: u64 = 64 * 1024;

/// An approver program ([`ProgramApprover::decide`] runs it once per request).
#[derive(Clone, Debug)]
pub struct ProgramApprover {
    program: PathBuf,
}

impl ProgramApprover {
    /// Asks `program` (run without a shell).
    pub fn new(program: impl Into<PathBuf>) -> ProgramApprover {
        ProgramApprover {
            program: program.into(),
        }
    }

    /// The program.
    pub fn program(&self) -> &Path {
        &self.program
    }
}

impl Approver for ProgramApprover {
    fn decide(&self, request: &ElevationRequest) -> Approval {
        ask_program(&self.program, request)
    }
}

/// Runs `program` (no shell) with the request on stdin: the JSON of [`ElevationRequest`],
/// which carries the whole argv or script and the caps. Exit 0 grants (with the `ttl` and
/// `runs` of a JSON object it prints, if any); another exit, a crash or the deadline
/// refuses, with the first line of its stderr as the reason.
fn ask_program(program: &Path, request: &ElevationRequest) -> Approval {
    let json = match serde_json::to_vec(request) {
        Ok(json) => json,
        Err(e) => return Approval::deny(format!("cannot encode the request: {e}")),
    };
    let mut child = match Command::new(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            return Approval::deny(format!(
                "approver {} failed to start: {e}",
                program.display()
            ))
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A program that exits without reading refuses by its exit status.
        let _ = stdin.write_all(&json);
    }
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        if let Some(s) = stdout {
            let _ = s.take(MAX_ANSWER).read_to_string(&mut out);
        }
        if let Some(s) = stderr {
            let _ = s.take(MAX_ANSWER).read_to_string(&mut err);
        }
        (out, err)
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > PROGRAM_DEADLINE => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    let (out, err) = reader.join().unwrap_or_default();
    match status {
        Some(status) if status.success() => {
            let answer = out.trim();
            if answer.is_empty() {
                return Approval::grant();
            }
            let mut value: serde_json::Value = match serde_json::from_str(answer) {
                Ok(v) => v,
                Err(e) => {
                    return Approval::deny(format!(
                        "approver printed something that is not JSON: {e}"
                    ))
                }
            };
            if let Some(object) = value.as_object_mut() {
                object.entry("decision").or_insert_with(|| "grant".into());
            }
            serde_json::from_value(value)
                .unwrap_or_else(|e| Approval::deny(format!("approver answer not understood: {e}")))
        }
        Some(status) => {
            let why = err.lines().next().unwrap_or_default().trim().to_string();
            Approval::deny(match why.is_empty() {
                true => format!("approver {} refused ({status})", program.display()),
                false => format!("approver {} refused: {why}", program.display()),
            })
        }
        None => Approval::deny(format!(
            "approver {} did not answer within {} s",
            program.display(),
            PROGRAM_DEADLINE.as_secs()
        )),
    }
}
