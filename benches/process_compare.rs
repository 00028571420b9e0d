//! The process backend's figures in one run, as ratios (DESIGN.md targets):
//! - cold and warm runs of `/bin/true` (p50, p99), against `posix_spawn` of the same binary
//!   and `bwrap --unshare-all` doing the same, measured interleaved in the same process;
//! - a concurrent load test (both cores busy, 10,000 runs by default) with p50/p99, runs/s
//!   and a count of leaked processes, zombies, fds, mounts and cgroups (must be 0);
//! - host-side memory per idle warm sandbox.
//!
//! `cargo bench --bench process_compare` (env STRATA_BENCH_RUNS, STRATA_BENCH_LOAD to size it).

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{bwrap, default_sandbox, sandbox};
use strata::{BackendKind, Caps, Tool};

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Series {
    name: &'static str,
    samples: Vec<f64>,
}

impl Series {
    fn p50(&self) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        pct(&s, 0.5)
    }
    fn p99(&self) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(f64::total_cmp);
        pct(&s, 0.99)
    }
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

fn children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
            after.split_whitespace().nth(1) == Some(me.as_str())
        })
        .count()
}

fn mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().count())
        .unwrap_or(0)
}

fn run_cgroups() -> usize {
    let prefix = format!("run-{}-", std::process::id());
    let mut n = 0;
    for base in [
        "/sys/fs/cgroup/strata",
        "/sys/fs/cgroup/pids/strata",
        "/sys/fs/cgroup/cpuacct/strata",
    ] {
        n += std::fs::read_dir(base)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count();
    }
    n
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("process_compare: bench");
        return;
    }
    let runs: usize = std::env::var("STRATA_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let load: usize = std::env::var("STRATA_BENCH_LOAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    let cold_sb = sandbox(0);
    let warm_sb = sandbox(1);
    let default_sb = default_sandbox();
    cold_sb.run(&tool, &caps).expect("cold warm-up");
    warm_sb.run(&tool, &caps).expect("warm warm-up");
    default_sb.run(&tool, &caps).expect("default warm-up");
    let has_bwrap = bwrap().status().is_ok_and(|s| s.success());

    let mut cold = Series {
        name: "strata cold",
        samples: vec![],
    };
    let mut warm = Series {
        name: "strata warm",
        samples: vec![],
    };
    let mut steady = Series {
        name: "strata default config (steady state)",
        samples: vec![],
    };
    let mut spawn = Series {
        name: "posix_spawn /bin/true",
        samples: vec![],
    };
    let mut bw = Series {
        name: "bwrap --unshare-all",
        samples: vec![],
    };
    // Interleave the variants so machine noise hits them alike.
    for _ in 0..runs {
        let t = Instant::now();
        let out = cold_sb.run(&tool, &caps).expect("cold");
        cold.samples.push(ms(t.elapsed()));
        assert!(out.success());

        std::thread::sleep(Duration::from_millis(5));
        let t = Instant::now();
        let out = warm_sb.run(&tool, &caps).expect("warm");
        warm.samples.push(ms(t.elapsed()));
        assert!(out.success());

        std::thread::sleep(Duration::from_millis(5));
        let t = Instant::now();
        let out = default_sb.run(&tool, &caps).expect("default");
        steady.samples.push(ms(t.elapsed()));
        assert!(out.success());

        let t = Instant::now();
        Command::new("/bin/true").status().expect("spawn");
        spawn.samples.push(ms(t.elapsed()));

        if has_bwrap {
            let t = Instant::now();
            bwrap().status().expect("bwrap");
            bw.samples.push(ms(t.elapsed()));
        }
    }
    println!("## process backend: {runs} runs of /bin/true each, interleaved, same process\n");
    println!("| variant | p50 ms | p99 ms |");
    println!("|---|---|---|");
    for s in [&cold, &warm, &steady, &spawn, &bw] {
        if !s.samples.is_empty() {
            println!("| {} | {:.3} | {:.3} |", s.name, s.p50(), s.p99());
        }
    }
    println!();
    if has_bwrap {
        println!(
            "cold vs bwrap: strata is {:.2}x faster (p50; target >= 4x)",
            bw.p50() / cold.p50()
        );
        println!(
            "warm vs bwrap: strata is {:.2}x faster (p50)",
            bw.p50() / warm.p50()
        );
        println!(
            "default config, steady state: {:.2}x bwrap --unshare-all (p50; target <= 0.33x)",
            steady.p50() / bw.p50()
        );
    } else {
        println!("bwrap not installed: no bwrap ratio (apt install bubblewrap)");
    }
    println!(
        "cold vs posix_spawn: {:.2}x the cost of a bare spawn (p50)",
        cold.p50() / spawn.p50()
    );
    println!(
        "warm vs posix_spawn: {:.2}x the cost of a bare spawn (p50)",
        warm.p50() / spawn.p50()
    );
    println!(
        "default config, steady state vs posix_spawn: {:.2}x the cost of a bare spawn (p50)",
        steady.p50() / spawn.p50()
    );
    println!("targets: cold <= 1.5 ms p50, warm <= 0.3 ms p50");

    // The warm sandbox keeps a pre-built sandbox idle: end both before counting anything.
    drop(cold_sb);
    drop(warm_sb);
    drop(default_sb);

    // Host-side memory per idle warm sandbox.
    let before = rss_kib();
    let pool_sb = sandbox(16);
    pool_sb.run(&tool, &caps).expect("prime pool");
    let backend = pool_sb.backend(BackendKind::Process).expect("backend");
    let end = Instant::now() + Duration::from_secs(20);
    while children() < 16 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let idle = children();
    let after = rss_kib();
    println!(
        "\nidle warm sandboxes: {idle}; embedding-process RSS grew {} KiB ({:.1} KiB per idle sandbox; target <= 512 KiB)",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / idle.max(1) as f64
    );
    drop(backend);
    drop(pool_sb);
    std::thread::sleep(Duration::from_millis(200));

    // Concurrent load: one worker per core, `load` runs in total.
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let (fds0, mounts0) = (count_dir("/proc/self/fd"), mounts());
    let shared = Arc::new(sandbox(0));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let sb = Arc::clone(&shared);
            let tool = tool.clone();
            let caps = caps.clone();
            let share = load / workers + usize::from(w < load % workers);
            std::thread::spawn(move || {
                let mut lat = Vec::with_capacity(share);
                let mut failures = 0usize;
                for _ in 0..share {
                    let t = Instant::now();
                    match sb.run(&tool, &caps) {
                        Ok(out) if out.success() => {}
                        _ => failures += 1,
                    }
                    lat.push(ms(t.elapsed()));
                }
                (lat, failures)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(load);
    let mut failures = 0;
    for h in handles {
        let (lat, f) = h.join().expect("worker");
        all.extend(lat);
        failures += f;
    }
    let wall = t0.elapsed();
    all.sort_by(f64::total_cmp);
    std::thread::sleep(Duration::from_millis(100));
    let leaked_children = children();
    let leaked_fds = count_dir("/proc/self/fd").saturating_sub(fds0);
    let leaked_mounts = mounts().saturating_sub(mounts0);
    let leaked_cgroups = run_cgroups();
    println!("\n## load: {load} cold runs on {workers} threads");
    println!(
        "p50 {:.3} ms, p99 {:.3} ms, {:.0} runs/s, {failures} failed",
        pct(&all, 0.5),
        pct(&all, 0.99),
        load as f64 / wall.as_secs_f64()
    );
    println!(
        "leaks: {leaked_children} processes/zombies, {leaked_fds} fds, {leaked_mounts} mounts, {leaked_cgroups} cgroups (total {})",
        leaked_children + leaked_fds + leaked_mounts + leaked_cgroups
    );
}
