//! Container backend: cold runs of a trivial command (`true`) in the same image, measured
//! in one process on one machine:
//!
//! - native: Strata's native runtime (process sandbox + overlay image root), image cached;
//! - process: the process backend running the host's `/bin/true` (the floor);
//! - engine: Strata's Docker runtime (the same caps through the engine API);
//! - docker run: `docker run --rm --network none IMAGE true` (the CLI, as users run it);
//! - bwrap: `bwrap --unshare-all` with the image's root file system bind-mounted read-only.
//!
//! Prints p50/p90 per variant and the ratios (target: native >= 30x faster than docker
//! run). Runs: `cargo bench --bench container_compare` (STRATA_BENCH_RUNS sets the native
//! and bwrap sample count, default 40; engine variants use a quarter of it). Needs the test
//! images (built on demand) and, for the engine variants, a running dockerd
//! (scripts/start-dockerd.sh); without one those rows say why they are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use strata::{BackendChoice, BackendKind, Caps, ContainerRuntime, Sandbox, Tool};

fn repo() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
}

fn docker_bin() -> &'static str {
    if Path::new("/usr/bin/docker").exists() {
        "/usr/bin/docker"
    } else {
        "docker"
    }
}

fn dockerd_up() -> bool {
    Path::new("/var/run/docker.sock").exists()
        && Command::new(docker_bin())
            .args(["version", "--format", "{{.Server.Version}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

fn helper() -> PathBuf {
    // The bench binary lives in target/<profile>/deps; the helper one level up.
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join("strata-helper");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "strata-helper not found next to {}; run `cargo build --release --bins` first",
        exe.display()
    );
}

struct Stats {
    name: &'static str,
    p50: Duration,
    p90: Duration,
    n: usize,
}

fn measure(name: &'static str, n: usize, mut f: impl FnMut()) -> Stats {
    f(); // warm-up: caches, image unpack, engine image load
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    Stats {
        name,
        p50: samples[n / 2],
        p90: samples[(n * 9 / 10).min(n - 1)],
        n,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs us with no work to do.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runs: usize = std::env::var("STRATA_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
        .max(4);
    let engine = dockerd_up();
    let mut build = Command::new(repo().join("scripts/build-test-images.sh"));
    if engine {
        build.arg("--docker");
    }
    let status = build.status().expect("build test images");
    assert!(status.success(), "scripts/build-test-images.sh failed");
    let images = std::env::var_os("STRATA_TEST_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".ci/cache/images"));
    let archive = images.join("python.docker.tar").display().to_string();
    let rootfs = images.join("python-rootfs").display().to_string();

    let sandbox = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Container))
        .helper(helper())
        .build()
        .expect("container backend");
    let tool = Tool::command(["true"]);
    let native_caps = Caps::new().image(&archive);
    let mut rows = Vec::new();
    rows.push(measure("native (strata, cold sandbox)", runs, || {
        let out = sandbox.run(&tool, &native_caps).expect("native run");
        assert!(out.success());
    }));
    let process = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("process backend");
    let host_true = Tool::command(["/bin/true"]);
    rows.push(measure("process backend (host /bin/true)", runs, || {
        let out = process.run(&host_true, &Caps::new()).expect("process run");
        assert!(out.success());
    }));
    if engine {
        let engine_caps = Caps::new()
            .image(&archive)
            .runtime(ContainerRuntime::Docker);
        rows.push(measure(
            "engine (strata --runtime docker)",
            runs / 4,
            || {
                let out = sandbox.run(&tool, &engine_caps).expect("engine run");
                assert!(out.success());
            },
        ));
        rows.push(measure("docker run --rm", runs / 4, || {
            let status = Command::new(docker_bin())
                .args([
                    "run",
                    "--rm",
                    "--network",
                    "none",
                    "strata-test/python:1",
                    "true",
                ])
                .stdout(Stdio::null())
                .status()
                .expect("docker run");
            assert!(status.success());
        }));
    } else {
        println!("engine rows skipped: no Docker engine (run scripts/start-dockerd.sh)");
    }
    let bwrap = Path::new("/usr/bin/bwrap").exists();
    if bwrap {
        rows.push(measure("bwrap --unshare-all", runs, || {
            let status = Command::new("/usr/bin/bwrap")
                .args([
                    "--unshare-all",
                    "--die-with-parent",
                    "--ro-bind",
                    &rootfs,
                    "/",
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--tmpfs",
                    "/tmp",
                    "/bin/true",
                ])
                .status()
                .expect("bwrap");
            assert!(status.success());
        }));
    } else {
        println!("bwrap row skipped: /usr/bin/bwrap not installed (Debian package bubblewrap)");
    }

    println!("\ncontainer cold run of `true` in {archive}");
    println!(
        "{:<36} {:>5} {:>10} {:>10}",
        "variant", "runs", "p50 ms", "p90 ms"
    );
    for r in &rows {
        println!(
            "{:<36} {:>5} {:>10.2} {:>10.2}",
            r.name,
            r.n,
            ms(r.p50),
            ms(r.p90)
        );
    }
    let native = &rows[0];
    println!();
    for r in &rows[1..] {
        println!(
            "ratio {} / native: {:.1}x",
            r.name,
            ms(r.p50) / ms(native.p50)
        );
    }
    if let Some(docker_run) = rows.iter().find(|r| r.name == "docker run --rm") {
        let ratio = ms(docker_run.p50) / ms(native.p50);
        println!(
            "target native >= 30x faster than docker run: {} ({ratio:.1}x)",
            if ratio >= 30.0 { "met" } else { "MISSED" }
        );
    }
}
