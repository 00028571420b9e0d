//! What the cluster backend adds (criterion), measured against the in-process fake API server
//! (sandbox-kube's `fake`: real HTTP, real watches, real exec websockets, pods as local
//! processes running the real guest agent), next to a warm process-backend run:
//!
//! - `cluster/claim_ready`: a `SandboxClaim` created and watched until it is bound to a warm
//!   sandbox (the latency a claim adds; upstream agent-sandbox's own target is a claim p99
//!   of at most 500 ms), then released (release not timed).
//! - `cluster/run_true`: a whole `/bin/true` run on the cluster backend: claim, bind, exec
//!   the agent's `serve`, the agent protocol, release.
//! - `cluster/process_true`: the same tool on the process backend, warm, for the ratio.
//!
//! The fake server answers on loopback with no etcd, scheduler or kubelet behind it: these
//! are the floor of what Strata's side adds, not a real cluster's latency. `claim_ready`
//! also prints its p50 and p99 over every sample criterion took.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use sandbox_kube::backend::{apply, claim_on, ClusterBackend, ClusterOptions};
use sandbox_kube::check::Pinned;
use sandbox_kube::fake::{FakeApiServer, FakeOptions};
use sandbox_kube::render::AGENT_PATH;
use sandbox_kube::{render, Boundary, RenderInput};
use sandbox_policy::Tier;
use strata::{Backend, BackendChoice, BackendKind, Caps, RunContext, Sandbox, Tool};

const NS: &str = "bench";

fn target_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("bench binary");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf()
}

fn cluster(c: &mut Criterion) {
    let pinned = Pinned::load(
        std::path::Path::new(
            &std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        )
        .join("tests/data/agent-sandbox"),
    )
    .expect("pinned data");
    let server = FakeApiServer::start(
        FakeOptions::new(pinned).command(AGENT_PATH, target_dir().join("strata-guest-agent")),
    )
    .expect("fake API server");
    let kubeconfig = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(kubeconfig.path(), server.kubeconfig(NS)).expect("kubeconfig");
    let rendered = render(
        &RenderInput::for_tier(&Tier::low(), "strata-tools:1", Boundary::Gvisor)
            .with_namespace(NS)
            .with_warm_pool(4),
    )
    .expect("render");
    apply(Some(kubeconfig.path()), NS, &rendered).expect("apply");
    let backend = ClusterBackend::connect(
        Some(kubeconfig.path()),
        ClusterOptions::new(NS, "strata-low"),
    )
    .expect("connect");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let api = runtime
        .block_on(async { server.cluster(NS) })
        .expect("client");

    let mut group = c.benchmark_group("cluster");
    group.measurement_time(Duration::from_secs(8));
    let mut samples = Vec::new();
    group.bench_function("claim_ready", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let name = runtime
                    .block_on(api.claim(&claim_on("strata-low")))
                    .expect("claim");
                runtime
                    .block_on(api.wait_ready(&name, Duration::from_secs(30)))
                    .expect("ready");
                let took = started.elapsed();
                samples.push(took);
                total += took;
                runtime.block_on(api.release(&name)).expect("release");
            }
            total
        })
    });
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    let ctx = RunContext::default();
    group.bench_function("run_true", |b| {
        b.iter(|| backend.run_caps(&tool, &caps, &ctx).expect("cluster run"))
    });
    let sandbox = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(target_dir().join("strata-helper"))
        .build()
        .expect("sandbox");
    group.bench_function("process_true", |b| {
        b.iter(|| sandbox.run(&tool, &caps).expect("process run"))
    });
    group.finish();
    samples.sort();
    if !samples.is_empty() {
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        eprintln!(
            "cluster/claim_ready over {} claims: p50 {:.2} ms, p99 {:.2} ms",
            samples.len(),
            at(0.50).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3
        );
    }
}

criterion_group!(benches, cluster);
criterion_main!(benches);
