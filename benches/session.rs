//! What a session costs (criterion), next to what it replaces:
//!
//! - `session/run_plain` vs `session/call`: a warm process-backend run of `/bin/true`, and
//!   the same as a call of a session (its directory mounted at `/workspace`, its agent
//!   identity): the ratio is the session's share of a call.
//! - `session/open_close`: opening a session and closing it (its directory made and removed).
//! - `session/write_read_1mib`: one 1 MiB file written into the session and read back
//!   (host-side copies through `openat2`, no run).
//! - `session/upload_100_files`: a directory of 100 files of 4 KiB copied in (checked
//!   whole first), then removed.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use strata::{BackendChoice, BackendKind, Caps, Sandbox, Tool};

fn helper() -> String {
    let exe = std::env::current_exe().expect("bench binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("strata-helper").display().to_string()
}

fn sessions(c: &mut Criterion) {
    let mut group = c.benchmark_group("session");
    group.measurement_time(Duration::from_secs(5));
    let sandbox = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("sandbox");
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    let session = sandbox.session(&caps).expect("session");
    group.bench_function("run_plain", |b| {
        b.iter(|| sandbox.run(&tool, &caps).expect("run"))
    });
    group.bench_function("call", |b| b.iter(|| session.run(&tool).expect("call")));
    group.bench_function("open_close", |b| {
        b.iter(|| {
            sandbox
                .session(&caps)
                .expect("open")
                .close()
                .expect("close")
        })
    });
    let data = vec![7u8; 1 << 20];
    group.bench_function("write_read_1mib", |b| {
        b.iter(|| {
            session.write_file("blob.bin", &data).expect("write");
            session.read_file("blob.bin").expect("read")
        })
    });
    let src = tempfile::tempdir().expect("tempdir");
    for i in 0..100 {
        std::fs::write(src.path().join(format!("f{i}.txt")), [b'x'; 4096]).expect("file");
    }
    group.bench_function("upload_100_files", |b| {
        b.iter(|| {
            session.upload(src.path(), "tree").expect("upload");
            session.remove("tree").expect("remove")
        })
    });
    group.finish();
    session.close().expect("close");
}

criterion_group!(benches, sessions);
criterion_main!(benches);
