//! Many live sandboxes on one machine: starts `STRATA_BENCH_LIVE_N` (default 100) owned
//! live sandboxes on the process backend, execs `/bin/true` in each, and prints
//!
//! - the time to start them all and per sandbox,
//! - the memory each idle one holds on the host: the resident memory (RSS) of its
//!   supervisor, helper and init, summed, averaged over the sandboxes,
//! - one warm exec in every sandbox, per exec,
//! - the time to stop them all (nothing is left: their state directories are checked).
//!
//! Not criterion: one pass of a load shape, printed as figures (`cargo bench --bench
//! live_many`).

use std::time::{Duration, Instant};

use strata::live::{ExecRequest, LiveSandbox, StartOptions};
use strata::Caps;

fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("bench binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join(name)
}

/// RSS of `pid` and every process below it, bytes.
fn tree_rss(pid: u32) -> u64 {
    let mut total = 0;
    let mut pending = vec![pid];
    while let Some(pid) = pending.pop() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pending.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    total
}

fn main() {
    let n: usize = std::env::var("STRATA_BENCH_LIVE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let state = tempfile::tempdir().expect("state dir");
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let options = StartOptions {
        helper: Some(bin("strata-helper")),
        supervisor: Some(bin("strata-live")),
        state_dir: Some(state.path().to_path_buf()),
        ..StartOptions::default()
    };
    let started = Instant::now();
    let sandboxes: Vec<LiveSandbox> = (0..n)
        .map(|_| LiveSandbox::start(&Caps::new(), &options).expect("start"))
        .collect();
    let start_time = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let rss: u64 = sandboxes
        .iter()
        .map(|s| tree_rss(s.info().supervisor_pid))
        .sum();
    let request = ExecRequest {
        argv: vec!["/bin/true".into()],
        ..ExecRequest::default()
    };
    let execs = Instant::now();
    for sandbox in &sandboxes {
        sandbox
            .exec(request.clone(), None, |_, _| {})
            .expect("exec");
    }
    let exec_time = execs.elapsed();
    let stopping = Instant::now();
    for sandbox in sandboxes {
        sandbox.stop().expect("stop");
    }
    let stop_time = stopping.elapsed();
    let left = std::fs::read_dir(state.path())
        .expect("state")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sb-"))
        .count();
    let per = |d: Duration| d.as_secs_f64() * 1000.0 / n as f64;
    println!("live_many: {n} live sandboxes on the process backend");
    println!(
        "  start all: {:.2} s ({:.1} ms per sandbox)",
        start_time.as_secs_f64(),
        per(start_time)
    );
    println!(
        "  idle memory: {:.1} MiB RSS per sandbox (supervisor + helper + init), {:.0} MiB for all",
        rss as f64 / n as f64 / 1048576.0,
        rss as f64 / 1048576.0
    );
    println!(
        "  one warm exec of /bin/true in each: {:.2} ms per exec",
        per(exec_time)
    );
    println!(
        "  stop all: {:.2} s ({:.1} ms per sandbox); state directories left: {left}",
        stop_time.as_secs_f64(),
        per(stop_time)
    );
    assert_eq!(left, 0, "every sandbox's state is removed");
}
