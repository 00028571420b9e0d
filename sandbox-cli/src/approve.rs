//! Approvers of the CLI: a program (`--approver PROGRAM`) or the terminal
//! (`--approve-interactive`).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use strata::policy::{Approval, Approver, ElevationRequest};

/// Who decides elevations for `strata run`.
#[derive(Clone, Debug)]
pub enum ApproverChoice {
    /// A program: the request as JSON on its stdin; exit 0 grants.
    Program(PathBuf),
    /// A prompt on the controlling terminal.
    Terminal,
}

impl ApproverChoice {
    /// The approver as the sandbox calls it.
    pub fn approver(&self) -> impl Approver + 'static {
        let choice = self.clone();
        move |request: &ElevationRequest| match &choice {
            ApproverChoice::Program(program) => {
                strata::live::ProgramApprover::new(program).decide(request)
            }
            ApproverChoice::Terminal => ask_terminal(request),
        }
    }
}

/// Asks on `/dev/tty`; only `y` or `yes` grants (default lifetime and one run). The
/// request is shown as [`ElevationRequest::prompt`] renders it: what would run and with
/// which caps, every part that came from the request escaped, so a path or an argument
/// holding escape sequences cannot rewrite the question. (The output filter of
/// [`crate::sanitize`] is not used here: it keeps newlines and colours, which a prompt
/// line must not carry.)
fn ask_terminal(request: &ElevationRequest) -> Approval {
    let tty = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    {
        Ok(tty) => tty,
        Err(e) => return Approval::deny(format!("no terminal to ask on: {e}")),
    };
    let mut out = &tty;
    let _ = out.write_all(request.prompt().as_bytes());
    let _ = write!(out, "grant for one run? [y/N] ");
    let _ = out.flush();
    let mut line = String::new();
    if std::io::BufReader::new(&tty).read_line(&mut line).is_err() {
        return Approval::deny("could not read the answer");
    }
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Approval::grant(),
        _ => Approval::deny("refused on the terminal"),
    }
}
