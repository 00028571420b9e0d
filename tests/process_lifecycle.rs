//! Lifecycle of the process backend: cancellation, the warm pool, and leak accounting over
//! many runs (processes, zombies, mounts, cgroups, fds).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use strata::{BackendChoice, BackendKind, CancelToken, Caps, ErrorKind, RunContext, Sandbox, Tool};

/// Tests here count the process's children and fds, so they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn zombie_children() -> usize {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...
            let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
            let mut fields = after.split_whitespace();
            let state = fields.next().unwrap_or("");
            let ppid = fields.next().unwrap_or("");
            state == "Z" && ppid == me
        })
        .count()
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

fn mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().count())
        .unwrap_or(0)
}

#[test]
fn cancel_kills_the_running_sandbox() {
    let _serial = serial();
    let marker = "5151.5";
    let cancel = CancelToken::new();
    let ctx = RunContext {
        cancel: cancel.clone(),
        ..Default::default()
    };
    let canceller = {
        let cancel = cancel.clone();
        std::thread::spawn(move || {
            assert!(eventually(Duration::from_secs(10), || !processes_with(
                marker
            )
            .is_empty()));
            cancel.cancel();
        })
    };
    let start = Instant::now();
    let err = sandbox()
        .run_with(&sh(&format!("sleep {marker}")), &Caps::new(), &ctx)
        .expect_err("cancelled");
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    assert!(start.elapsed() < Duration::from_secs(20));
    canceller.join().expect("canceller");
    assert!(eventually(Duration::from_secs(2), || processes_with(
        marker
    )
    .is_empty()));
}

#[test]
fn streaming_sink_sees_output_in_order() {
    let _serial = serial();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        Arc::new(move |stream: strata::Stream, chunk: &[u8]| {
            if stream == strata::Stream::Stdout {
                seen.lock().expect("lock").extend_from_slice(chunk);
            }
        })
    };
    let ctx = RunContext {
        sink: Some(sink),
        ..Default::default()
    };
    let out = sandbox()
        .run_with(
            &sh("for i in 1 2 3; do echo line$i; done"),
            &Caps::new(),
            &ctx,
        )
        .expect("run");
    assert_eq!(*seen.lock().expect("lock"), out.stdout);
    assert_eq!(stdout(&out), "line1\nline2\nline3\n");
}

fn warm_sandbox() -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .warm_pool(2)
        .build()
        .expect("build")
}

#[test]
fn warm_pool_runs_are_isolated_from_each_other() {
    let _serial = serial();
    let sb = warm_sandbox();
    let caps = Caps::new();
    for i in 0..6 {
        let out = sb
            .run(
                &sh(&format!("ls /tmp; echo run{i} > /tmp/state; ps -e | wc -l")),
                &caps,
            )
            .expect("run");
        let text = ok_stdout(&out);
        assert!(
            !text.contains("state"),
            "run {i} saw a previous run's file: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn warm_pool_sandboxes_die_with_the_sandbox_handle() {
    let _serial = serial();
    let before = children();
    let sb = warm_sandbox();
    let caps = Caps::new();
    sb.run(&Tool::command(["/bin/true"]), &caps).expect("run");
    let backend = sb.backend(BackendKind::Process).expect("backend");
    assert!(
        eventually(Duration::from_secs(10), || children() >= before + 2),
        "pool refilled"
    );
    drop(backend);
    drop(sb);
    assert!(
        eventually(Duration::from_secs(5), || children() <= before),
        "idle warm sandboxes outlived their handle: {} > {before}",
        children()
    );
}

fn pooled_backend(size: strata::PoolSize) -> strata::ProcessBackend {
    strata::ProcessBackend::with_helper(helper()).with_pool_size(size)
}

#[test]
fn default_pool_makes_the_second_run_of_a_shape_warm_and_only_that_shape() {
    use strata::Backend;
    let _serial = serial();
    let backend = strata::ProcessBackend::with_helper(helper());
    let (tool, ctx) = (Tool::command(["/bin/true"]), RunContext::default());
    let caps = Caps::new();
    backend.run_caps(&tool, &caps, &ctx).expect("first run");
    assert!(
        eventually(Duration::from_secs(10), || backend.warm_idle() == 1),
        "one sandbox built for the shape after its first run, got {}",
        backend.warm_idle()
    );
    backend.run_caps(&tool, &caps, &ctx).expect("second run");
    let stats = backend.pool_stats();
    assert_eq!((stats.cold_runs, stats.warm_runs), (1, 1), "{stats:?}");
    // Another CPU quota is another shape: a pooled sandbox of the first must not serve it.
    let mut other = Caps::new();
    other.limits.cpus = 0.5;
    backend.run_caps(&tool, &other, &ctx).expect("other shape");
    let stats = backend.pool_stats();
    assert_eq!((stats.cold_runs, stats.warm_runs), (2, 1), "{stats:?}");
}

/// Issue 26: on a loaded host, back-to-back runs outpaced the refill each run starts, so
/// runs found the pool empty and built a second sandbox while the first was still being
/// built, the two competing for the CPU. A run now takes the sandbox being built: every
/// run after the first is warm.
#[test]
fn back_to_back_runs_take_the_sandbox_being_built_instead_of_building_another() {
    use strata::Backend;
    let _serial = serial();
    let backend = strata::ProcessBackend::with_helper(helper());
    let (tool, ctx, caps) = (
        Tool::command(["/bin/true"]),
        RunContext::default(),
        Caps::new(),
    );
    for _ in 0..20 {
        backend.run_caps(&tool, &caps, &ctx).expect("run");
    }
    let stats = backend.pool_stats();
    assert_eq!((stats.cold_runs, stats.warm_runs), (1, 19), "{stats:?}");
}

#[test]
fn idle_warm_sandboxes_expire_and_leave_no_processes() {
    use strata::Backend;
    let _serial = serial();
    let before = children();
    let backend = pooled_backend(strata::PoolSize::Adaptive {
        per_shape: 2,
        total: 4,
        idle_ttl: Duration::from_millis(300),
    });
    let ctx = RunContext::default();
    backend
        .run_caps(&Tool::command(["/bin/true"]), &Caps::new(), &ctx)
        .expect("run");
    assert!(
        eventually(Duration::from_secs(10), || backend.pool_stats().built == 1),
        "refilled"
    );
    assert!(
        eventually(Duration::from_secs(10), || backend.pool_stats().expired
            == 1
            && backend.warm_idle() == 0),
        "the idle sandbox expired: {:?}",
        backend.pool_stats()
    );
    assert!(
        eventually(Duration::from_secs(5), || children() <= before),
        "an expired sandbox left processes: {} > {before}",
        children()
    );
}

#[test]
fn pool_holds_at_most_its_total_and_evicts_the_oldest() {
    use strata::Backend;
    let _serial = serial();
    let backend = pooled_backend(strata::PoolSize::Adaptive {
        per_shape: 2,
        total: 2,
        idle_ttl: Duration::from_secs(60),
    });
    let ctx = RunContext::default();
    let tool = Tool::command(["/bin/true"]);
    let shape = |n: u64| Caps::new().timeout(Duration::from_secs(10 + n));
    for n in 0..4 {
        backend.run_caps(&tool, &shape(n), &ctx).expect("run");
        assert!(
            eventually(Duration::from_secs(10), || backend.pool_stats().built
                == n + 1),
            "shape {n} refilled: {:?}",
            backend.pool_stats()
        );
        assert!(backend.warm_idle() <= 2, "over the total");
    }
    assert_eq!(
        backend.pool_stats().evicted,
        2,
        "{:?}",
        backend.pool_stats()
    );
    backend
        .run_caps(&tool, &shape(3), &ctx)
        .expect("newest shape");
    assert_eq!(
        backend.pool_stats().warm_runs,
        1,
        "the newest shape stayed warm"
    );
    backend
        .run_caps(&tool, &shape(0), &ctx)
        .expect("oldest shape");
    assert_eq!(
        backend.pool_stats().warm_runs,
        1,
        "the oldest shape was evicted"
    );
}

#[test]
fn thousand_runs_leak_no_processes_zombies_mounts_cgroups_or_fds() {
    let _serial = serial();
    let (fds, mounts) = (fd_count(), mount_count());
    let sb = sandbox();
    let caps = Caps::new();
    let tool = Tool::command(["/bin/true"]);
    let timeout_caps = Caps::new().timeout(Duration::from_millis(50));
    let mut output_caps = Caps::new();
    output_caps.limits.output = strata::ByteSize(1024);
    for i in 0..1000 {
        let out = match i % 100 {
            7 => sb.run(&sh("sleep 5 & sleep 5"), &timeout_caps),
            8 => sb.run(&Tool::command(["yes"]), &output_caps),
            9 => sb
                .run(&Tool::command(["no-such-binary"]), &caps)
                .or_else(|e| {
                    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
                    sb.run(&tool, &caps)
                }),
            _ => sb.run(&tool, &caps),
        }
        .expect("run");
        assert!(
            out.success() || out.limit().is_some(),
            "run {i}: {}",
            out.status
        );
    }
    // Dropping the handle waits for the cgroups of finished runs to be removed.
    drop(sb);
    assert_eq!(zombie_children(), 0, "zombies");
    assert_eq!(children(), 0, "leftover child processes");
    assert_eq!(fd_count(), fds, "leaked fds");
    assert_eq!(mount_count(), mounts, "leaked mounts in the host namespace");
    if is_root() {
        assert_eq!(run_cgroups_of(std::process::id()), 0, "leaked run cgroups");
    }
}
