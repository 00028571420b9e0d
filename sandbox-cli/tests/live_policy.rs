//! The policy layer on live sandboxes through the CLI (`strata start --tier --approver
//! --audit`): caps beyond the tier refuse the start, a program beyond it refuses the exec
//! (from any client), an approver program decides, and every exec is in the audit log,
//! whose chain still verifies. Named after what they stop.

use std::path::{Path, PathBuf};

mod common;

use common::{text, Live};

/// The records of the audit log at `path`, as JSON.
fn records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("audit log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect()
}

/// The `event` of every record whose `event.kind` is `kind`.
fn events(path: &Path, kind: &str) -> Vec<serde_json::Value> {
    records(path)
        .into_iter()
        .map(|r| r["event"].clone())
        .filter(|e| e["kind"] == kind)
        .collect()
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path
}

#[test]
fn a_program_beyond_the_tier_is_refused_in_a_live_sandbox_and_every_exec_is_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.to_str().expect("utf-8");
    let live = Live::new();
    let out = live.strata(&["start", "--tier", "medium", "--audit", audit_arg, "--json"]);
    assert!(out.status.success(), "start: {}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let id = started["id"].as_str().expect("id").to_string();
    assert_eq!(started["receipt"]["policy"]["tier"], "medium", "{started}");
    let enforced = started["receipt"]["enforced"].to_string();
    assert!(enforced.contains("exec policy"), "{enforced}");
    assert!(enforced.contains("exec audit"), "{enforced}");
    // A program the tier approves runs.
    let out = live.strata(&["exec", &id, "--", "echo", "approved"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "approved\n");
    // One it does not: refused, naming the tier and the program, and nothing ran.
    let out = live.strata(&["exec", &id, "--", "/bin/uname", "-a"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let why = text(&out.stderr);
    assert!(
        why.contains("tier medium") && why.contains("program:uname"),
        "{why}"
    );
    assert!(out.stdout.is_empty(), "nothing ran");
    // Detached execs are checked and recorded too.
    let out = live.strata(&["exec", &id, "--detach", "--", "uname"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--detach", "--", "sh", "-c", "exit 7"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = text(&out.stdout).trim().to_string();
    let out = live.strata(&["logs", &id, &pid, "--follow"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(live.strata(&["stop", &id]).status.success());

    let verified = live.strata(&["audit", "verify", audit_arg]);
    assert!(
        verified.status.success(),
        "the chain verifies: {}",
        text(&verified.stdout)
    );
    let execs = events(&audit, "exec");
    let statuses: Vec<(String, String)> = execs
        .iter()
        .map(|e| {
            assert_eq!(e["sandbox"], id.as_str(), "{e}");
            (
                e["command"].as_str().unwrap_or_default().to_string(),
                e["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for (command, status) in [
        ("echo approved", "started"),
        ("echo approved", "exited 0"),
        ("sh -c exit 7", "started"),
        ("sh -c exit 7", "exited 7"),
    ] {
        assert!(
            statuses.contains(&(command.to_string(), status.to_string())),
            "{command}: {status} in {statuses:?}"
        );
    }
    let refused: Vec<_> = statuses
        .iter()
        .filter(|(c, s)| c.starts_with("/bin/uname") && s.starts_with("refused"))
        .collect();
    assert_eq!(refused.len(), 1, "{statuses:?}");
    assert!(
        !statuses
            .iter()
            .any(|(c, s)| c.starts_with("uname") && s == "started"),
        "a refused exec never started: {statuses:?}"
    );
    let lifecycle: Vec<String> = events(&audit, "policy")
        .iter()
        .filter(|e| e["subject"] == "live sandbox")
        .map(|e| e["decision"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(lifecycle, ["started", "ended"], "{lifecycle:?}");
}

#[test]
fn an_approver_program_decides_an_exec_beyond_the_tier_with_its_whole_argv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let request = dir.path().join("request.json");
    let grant = script(
        dir.path(),
        "grant.sh",
        &format!("cat > {}\necho '{{\"runs\": 1}}'", request.display()),
    );
    let deny = script(dir.path(), "deny.sh", "echo 'not that program' >&2\nexit 3");
    let live = Live::new();
    let id = live.start(&[
        "--tier",
        "medium",
        "--approver",
        grant.to_str().expect("utf-8"),
    ]);
    let out = live.strata(&["exec", &id, "--", "uname", "-s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "Linux\n");
    let asked: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&request).expect("asked")).expect("json");
    assert_eq!(asked["tier"], "medium", "{asked}");
    assert_eq!(asked["argv"], serde_json::json!(["uname", "-s"]), "{asked}");
    assert_eq!(asked["needs"][0]["capability"], "program:uname", "{asked}");
    assert!(live.strata(&["stop", &id]).status.success());

    let id = live.start(&[
        "--tier",
        "medium",
        "--approver",
        deny.to_str().expect("utf-8"),
    ]);
    let out = live.strata(&["exec", &id, "--", "uname", "-s"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not that program"),
        "the approver's reason reaches the caller: {}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing ran");
    assert!(live.strata(&["stop", &id]).status.success());
}

#[test]
fn caps_beyond_the_tier_refuse_the_start_and_nothing_starts() {
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let audit_arg = audit.to_str().expect("utf-8");
    let grant = dir.path().to_str().expect("utf-8");
    let live = Live::new();
    // The low tier grants read-only paths within /tmp: a read-write grant is beyond it.
    let out = live.strata(&[
        "start", "--tier", "low", "--rw", grant, "--audit", audit_arg,
    ]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let why = text(&out.stderr);
    assert!(why.contains("tier low") && why.contains("write:"), "{why}");
    assert!(live.sandbox_dirs().is_empty(), "nothing started");
    let refusals = events(&audit, "refusal");
    assert!(
        refusals.iter().any(|e| e["tool"] == "live sandbox"),
        "{refusals:?}"
    );
    assert!(live
        .strata(&["audit", "verify", audit_arg])
        .status
        .success());
    // Within the tier it starts.
    let id = live.start(&["--tier", "low", "--ro", grant]);
    assert!(live.strata(&["stop", &id]).status.success());
}
