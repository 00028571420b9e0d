//! Criterion benchmarks of the process backend: one run of `/bin/true`, cold and warm,
//! next to `posix_spawn` of the same binary and `bwrap --unshare-all` doing the same.
//! `benches/process_compare.rs` prints p50/p99 and the ratios, and the 10k-run load test.

use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use strata::{BackendChoice, BackendKind, Caps, Sandbox, Tool};

fn helper() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let deps = exe.parent().expect("deps");
    deps.parent().expect("target").join("strata-helper")
}

fn sandbox(warm: usize) -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .warm_pool(warm)
        .build()
        .expect("sandbox")
}

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

/// `bwrap --unshare-all` with the same read-only system view Strata gives by default.
pub fn bwrap() -> Command {
    let mut cmd = Command::new("bwrap");
    cmd.args([
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    for link in ["bin", "sbin", "lib", "lib64"] {
        if let Ok(target) = std::fs::read_link(format!("/{link}")) {
            cmd.arg("--symlink").arg(target).arg(format!("/{link}"));
        }
    }
    cmd.args([
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "/bin/true",
    ]);
    cmd
}

criterion_group!(benches, bench);
criterion_main!(benches);
