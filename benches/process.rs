//! Criterion benchmarks of the process backend: one run of `/bin/true`, cold and warm,
//! next to `posix_spawn` of the same binary and `bwrap --unshare-all` doing the same.
//! `benches/process_compare.rs` prints p50/p99 and the ratios, and the 10k-run load test.

use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
mod common;

use common::{bwrap, sandbox};
use strata::{Caps, Tool};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("true");
    group
        .measurement_time(Duration::from_secs(5))
        .sample_size(50);
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    let cold = sandbox(0);
    group.bench_function("strata_cold", |b| {
        b.iter(|| cold.run(&tool, &caps).expect("run"))
    });
    let warm = sandbox(1);
    warm.run(&tool, &caps).expect("prime");
    group.bench_function("strata_warm", |b| {
        b.iter(|| {
            // Give the pool a moment to refill so every iteration measures a warm run.
            std::thread::sleep(Duration::from_millis(10));
            warm.run(&tool, &caps).expect("run")
        })
    });
    group.bench_function("posix_spawn", |b| {
        b.iter(|| Command::new("/bin/true").status().expect("spawn"))
    });
    if Command::new("bwrap").arg("--version").output().is_ok() {
        group.bench_function("bwrap_unshare_all", |b| {
            b.iter(|| bwrap().status().expect("bwrap"))
        });
    } else {
        eprintln!("bwrap not installed: skipping the bwrap comparison (apt install bubblewrap)");
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
