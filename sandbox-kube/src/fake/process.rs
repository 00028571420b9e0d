//! Local processes standing for containers: the command mapping, the environment rule,
//! and process groups.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use rustix::process::{kill_process_group, set_parent_process_death_signal, Pid, Signal};
use tokio::process::{Child, Command};

/// The only environment variable a pod or exec process gets.
pub const PATH_ENV: &str = "/usr/local/bin:/usr/bin:/bin";

/// How the standard streams of a process are connected.
pub(crate) struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// Starts `command` (its first word mapped through `commands`) in `dir`, in its own
/// process group, with an empty environment but `PATH`. Unmapped streams are `/dev/null`,
/// mapped ones pipes. `Err` is the message a kubelet would give.
pub(crate) fn spawn(
    commands: &BTreeMap<String, PathBuf>,
    command: &[String],
    dir: &Path,
    streams: &Streams,
) -> Result<Child, String> {
    let Some((first, args)) = command.split_first() else {
        return Err("no command given".to_owned());
    };
    let Some(program) = commands.get(first) else {
        return Err(format!(
            "exec: \"{first}\": executable file not found (the fake API server maps no local executable to it)"
        ));
    };
    let pipe = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let mut cmd = Command::new(program);
    // SAFETY: the closure runs in the child between fork and exec and only makes one
    // prctl(2) system call (no allocation, no lock): async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // Killed if the server's thread goes without stopping it (a test binary killed
            // before its FakeApiServer is dropped): no process outlives the server.
            set_parent_process_death_signal(Some(Signal::KILL)).map_err(std::io::Error::from)
        });
    }
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", PATH_ENV)
        .stdin(pipe(streams.stdin))
        .stdout(pipe(streams.stdout))
        .stderr(pipe(streams.stderr))
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))
}

/// Sends SIGKILL to the process group led by `pid` (gone already is fine).
pub(crate) fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw)
    else {
        return;
    };
    // ESRCH (the group is gone) is what we want anyway.
    let _ = kill_process_group(pid, Signal::KILL);
}
