//! The microVM backend's figures in one run (issue 12's targets), under the accelerator
//! this host gives guests (TCG here: every guest instruction emulated):
//! - cold boot to the first command's exit (`snapshots(false)`), a few runs;
//! - restore from the snapshot to the first command's exit;
//! - a pooled run (a VM restored ahead of time) against a process-backend run of the same
//!   command in the same process, with the layers inside the guest and without;
//! - host memory (VmRSS of the QEMU process) per idle pooled VM.
//!
//! `cargo bench --bench microvm_compare` (env STRATA_BENCH_RUNS, default 10). Needs the
//! guest (scripts/build-vm-guest.sh) and the binaries (`cargo build --release --workspace
//! --bins`) next to the bench executable's directory.

use std::time::{Duration, Instant};

mod common;

use strata::{Backend, Caps, MicrovmBackend, RunContext, Tool};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

fn time_runs(backend: &dyn Backend, tool: &Tool, runs: usize) -> Vec<f64> {
    let ctx = RunContext::default();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = backend.run_caps(tool, &Caps::new(), &ctx).expect("run");
            assert_eq!(
                out.stdout,
                b"hi\n",
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            ms(t.elapsed())
        })
        .collect()
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("STRATA_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let tool = Tool::command(["/bin/echo", "hi"]);
    let probe = MicrovmBackend::new();
    let accel = probe
        .accel()
        .expect("guest and accelerator (scripts/build-vm-guest.sh)");
    println!(
        "microvm under {} ({})",
        accel.accel.describe(),
        accel.reason
    );

    // Snapshot made outside the measurements.
    let restored = MicrovmBackend::new();
    time_runs(&restored, &tool, 1);
    let direct = MicrovmBackend::new().layers(false);
    time_runs(&direct, &tool, 1);

    let cold = MicrovmBackend::new().snapshots(false).layers(false);
    let cold_ms = p50(time_runs(&cold, &tool, 3.min(runs)));
    let restore_direct = p50(time_runs(&direct, &tool, runs));
    let restore_layered = p50(time_runs(&restored, &tool, runs));

    let pooled = MicrovmBackend::new().pool_size(1);
    let pooled_direct = MicrovmBackend::new().pool_size(1).layers(false);
    let process = common::sandbox(0);
    let ctx = RunContext::default();
    let mut pool_layered = Vec::new();
    let mut pool_direct = Vec::new();
    let mut process_ms = Vec::new();
    for _ in 0..runs {
        for (backend, samples) in [
            (&pooled, &mut pool_layered),
            (&pooled_direct, &mut pool_direct),
        ] {
            backend.prewarm(&Caps::new()).expect("prewarm");
            samples.extend(time_runs(backend, &tool, 1));
        }
        let t = Instant::now();
        let out = process.run(&tool, &Caps::new()).expect("process run");
        assert_eq!(out.stdout, b"hi\n");
        process_ms.push(ms(t.elapsed()));
    }
    let _ = ctx;
    let process_p50 = p50(process_ms);
    let pool_layered = p50(pool_layered);
    let pool_direct = p50(pool_direct);

    let idle = MicrovmBackend::new().pool_size(3).layers(false);
    idle.prewarm(&Caps::new()).expect("prewarm 3");
    std::thread::sleep(Duration::from_secs(2));
    let rss: Vec<u64> = idle
        .idle_vmm_pids()
        .into_iter()
        .filter_map(rss_kib)
        .collect();
    let rss_mib = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64 / 1024.0;

    println!(
        "cold boot to first command (p50 of {}):    {cold_ms:8.1} ms",
        3.min(runs)
    );
    println!("restore to first command, direct (p50):     {restore_direct:8.1} ms   (target <= 300 ms under TCG)");
    println!("restore to first command, layered (p50):    {restore_layered:8.1} ms   (process backend inside the guest)");
    println!("pooled run, direct (p50):                   {pool_direct:8.1} ms   = process backend + {:.1} ms", pool_direct - process_p50);
    println!("pooled run, layered (p50):                  {pool_layered:8.1} ms   = process backend + {:.1} ms", pool_layered - process_p50);
    println!("process backend run, same process (p50):    {process_p50:8.1} ms");
    println!(
        "ratios: restore/cold {:.3}x, pooled direct/process {:.1}x (target: +1 ms where KVM works)",
        restore_direct / cold_ms,
        pool_direct / process_p50
    );
    println!("host memory per idle pooled VM (VmRSS, {} VMs, 512 MiB guests): {rss_mib:.1} MiB   (target <= 64 MiB)", rss.len());
}
