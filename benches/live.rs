//! What a live sandbox costs (criterion), next to what it replaces, in the same run:
//!
//! - `live/posix_spawn_true`: `/bin/true` spawned directly on the host (std's `Command`,
//!   which uses `posix_spawn`): the floor.
//! - `live/exec_true`: `/bin/true` exec'd in the foreground into a warm live sandbox on the
//!   process backend (client connection, request, fork and exec by the sandbox's init,
//!   exit report): the target is at most 1.5x the floor.
//! - `live/exec_detached_true`: the same, detached (answer at start, no output stream).
//! - `live/one_shot_run_true`: a warm one-shot run of `/bin/true` (`Sandbox::run`, pooled).
//! - `live/start_stop`: starting an owned live sandbox and stopping it.
//!
//! Ratios: `benches/ratios.sh` style, or read them off criterion's report.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use strata::live::{ExecRequest, LiveSandbox, StartOptions};
use strata::{BackendChoice, BackendKind, Caps, Sandbox, Tool};

fn bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("bench binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join(name)
}

fn options(state: &std::path::Path) -> StartOptions {
    StartOptions {
        helper: Some(bin("strata-helper")),
        supervisor: Some(bin("strata-live")),
        state_dir: Some(state.to_path_buf()),
        ..StartOptions::default()
    }
}

fn live(c: &mut Criterion) {
    let mut group = c.benchmark_group("live");
    group.measurement_time(Duration::from_secs(5));
    let state = tempfile::tempdir().expect("state dir");
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let request = ExecRequest {
        argv: vec!["/bin/true".into()],
        ..ExecRequest::default()
    };
    group.bench_function("posix_spawn_true", |b| {
        b.iter(|| {
            std::process::Command::new("/bin/true")
                .status()
                .expect("spawn")
        })
    });
    let sandbox = LiveSandbox::start(&Caps::new(), &options(state.path())).expect("start");
    group.bench_function("exec_true", |b| {
        b.iter(|| {
            sandbox
                .exec(request.clone(), None, |_, _| {})
                .expect("exec")
        })
    });
    group.bench_function("exec_detached_true", |b| {
        b.iter(|| sandbox.spawn(request.clone()).expect("spawn"))
    });
    drop(sandbox);
    let oneshot = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(bin("strata-helper").display().to_string())
        .build()
        .expect("sandbox");
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    group.bench_function("one_shot_run_true", |b| {
        b.iter(|| oneshot.run(&tool, &caps).expect("run"))
    });
    group.sample_size(10);
    group.bench_function("start_stop", |b| {
        b.iter(|| {
            LiveSandbox::start(&Caps::new(), &options(state.path()))
                .expect("start")
                .stop()
                .expect("stop")
        })
    });
    group.finish();
}

criterion_group!(benches, live);
criterion_main!(benches);
