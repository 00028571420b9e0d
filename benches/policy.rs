//! What the policy layer costs (criterion), each next to what it guards:
//!
//! - `policy/tier_check`: `Tier::check` of a request with two mounts and an allowlist.
//! - `policy/admit_with_grant`: `admit` of a request beyond its tier, covered by a live grant
//!   (the check, the audit sink, the grant's use).
//! - `policy/sign_verify_ed25519`, `policy/sign_verify_hmac`: one signed message made and
//!   verified (fresh nonce each time, so the replay cache grows as in real use).
//! - `policy/caps_for_call`: caps derived from a tool's JSON schema and one call's arguments.
//! - `policy/audit_record_fsync`: one policy record appended to an audit log and `fsync`ed
//!   (the cost every elevation and refusal pays before it takes effect).
//! - `policy/run_plain` vs `policy/run_with_tier_and_audit`: a warm process-backend run of
//!   `/bin/true` without policy, and with tier `low` and an audit log: the ratio is the
//!   policy layer's share of a run.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use strata::audit::{AuditEvent, AuditLog};
use strata::policy::message::{Agent, AgentKey, Directory, Message, MessageKind, Scheme, Verifier};
use strata::policy::{admit, derive_caps, Approval, ElevationRequest, GrantBook, Tier};
use strata::{BackendChoice, BackendKind, Caps, Net, Sandbox, Tool};

fn helper() -> String {
    let exe = std::env::current_exe().expect("bench binary");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("strata-helper").display().to_string()
}

fn pure(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy");
    group.measurement_time(Duration::from_secs(3));
    let caps = Caps::new()
        .read_only("/tmp/in")
        .read_write("/home/alice/ws")
        .net(Net::Allow(vec!["pypi.org".parse().expect("rule")]));
    let tool = Tool::command(["python3", "x.py"]);
    let tier = Tier::medium("/home/alice");
    group.bench_function("tier_check", |b| b.iter(|| tier.check(&tool, &caps)));

    let low = Tier::low();
    let mut book = GrantBook::new();
    let approver = |_: &ElevationRequest| Approval::grant_for(Duration::from_secs(3600), u32::MAX);
    let mut sink = |_: AuditEvent| Ok(());
    group.bench_function("admit_with_grant", |b| {
        b.iter(|| {
            admit(
                &low,
                &tool,
                &caps,
                &mut book,
                Some(&approver),
                1_000,
                &mut sink,
            )
        })
    });

    let mut directory = Directory::new();
    directory
        .add(Agent::ranked("a", "medium", 1).with_key(AgentKey::generate().expect("key")))
        .expect("a");
    directory
        .add(Agent::ranked("b", "low", 0).with_key(AgentKey::generate().expect("key")))
        .expect("b");
    for (name, scheme) in [
        ("sign_verify_ed25519", Scheme::Ed25519),
        ("sign_verify_hmac", Scheme::HmacSha256),
    ] {
        // A fresh verifier per iteration (set up outside the timing): one verifier's replay
        // cache would fill within its window at this rate, and then refuse by design.
        group.bench_function(name, |b| {
            b.iter_batched_ref(
                || Verifier::new(directory.clone(), "b").expect("verifier"),
                |verifier| {
                    let now = strata::unix_time_ms();
                    let m =
                        Message::new("a", "b", MessageKind::Task, "ls -l", now).expect("message");
                    let signed = directory.sign(m, scheme).expect("sign");
                    verifier.verify(&signed, now).expect("verify")
                },
                BatchSize::SmallInput,
            )
        });
    }

    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "src": { "type": "string", "x-strata": "read-path" },
            "out": { "type": "string", "x-strata": "write-path" },
            "mirror": { "type": "string", "x-strata": "url" }
        }
    });
    let args = serde_json::json!({ "src": "/tmp/in", "out": "/tmp/out", "mirror": "https://pypi.org/simple" });
    group.bench_function("caps_for_call", |b| {
        b.iter(|| derive_caps(&schema, &args, &Caps::new()).expect("derive"))
    });

    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = AuditLog::open(dir.path().join("audit.jsonl")).expect("log");
    group.bench_function("audit_record_fsync", |b| {
        b.iter(|| {
            log.record(AuditEvent::Policy {
                subject: "elevation".into(),
                decision: "granted".into(),
                detail: "grant 1 of net:allow".into(),
            })
            .expect("record")
        })
    });
    group.finish();
}

fn runs(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy");
    group.measurement_time(Duration::from_secs(5));
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("sandbox");
    let guarded = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .tier("low")
        .audit(dir.path().join("audit.jsonl"))
        .build()
        .expect("sandbox");
    let tool = Tool::command(["/bin/true"]);
    let caps = Caps::new();
    group.bench_function("run_plain", |b| {
        b.iter(|| plain.run(&tool, &caps).expect("run"))
    });
    group.bench_function("run_with_tier_and_audit", |b| {
        b.iter(|| guarded.run(&tool, &caps).expect("run"))
    });
    group.finish();
}

criterion_group!(benches, pure, runs);
criterion_main!(benches);
