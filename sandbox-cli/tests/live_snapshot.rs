//! Snapshots and fork of live sandboxes through the CLI (`strata snapshot | snapshots |
//! start --from | fork | snapshot rm`) on the process backend, named after the attacks they
//! stop: a child reading another's writes, children sharing randomness, a snapshot edited
//! on disk, another user's snapshot, leftovers, fork storms, a grant carried into a
//! snapshot. Each test has its own state directory and snapshot store.

use std::path::Path;
use std::process::Command;

mod common;

use common::{exe, nix_root, text, Live};

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Runs `script` in sandbox `id` and returns its stdout.
fn sh(live: &Live, id: &str, script: &str) -> String {
    let out = live.strata(&["exec", id, "--", "sh", "-c", script]);
    assert!(
        out.status.success(),
        "{script}: {} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Entries of the snapshot store besides its key.
fn store_entries(live: &Live) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(live.snapshot_dir())
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".key")
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn fork(live: &Live, id: &str, count: usize) -> Vec<String> {
    let out = json(&live.strata(&["fork", id, "--count", &count.to_string(), "--json"]));
    out["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().expect("id").to_string())
        .collect()
}

#[test]
fn snapshot_and_start_from_carry_the_sandboxs_files_and_say_what_they_carry() {
    let live = Live::new();
    let id = live.start(&["--workdir", "/work", "--env", "COLOR=teal"]);
    sh(
        &live,
        &id,
        "mkdir -p /tmp/deep/er && echo one > /tmp/deep/er/a.txt && echo two > b.txt && chmod 755 b.txt",
    );
    let made = json(&live.strata(&["snapshot", &id, "--name", "base", "--json"]));
    assert!(
        made["id"].as_str().expect("id").starts_with("snap-"),
        "{made}"
    );
    assert_eq!(made["name"], "base");
    assert_eq!(made["backend"], "process");
    let carries: Vec<&str> = made["carries"]
        .as_array()
        .expect("carries")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(carries.contains(&"files:/tmp"), "{carries:?}");
    assert!(carries.contains(&"files:/work"), "{carries:?}");
    assert!(carries.contains(&"caps"), "{carries:?}");
    assert!(
        made["not_carried"].to_string().contains("processes"),
        "{made}"
    );
    // The snapshot's files are owner-only on the host.
    let store = live.snapshot_dir().join("base");
    for entry in walk(&store) {
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::symlink_metadata(&entry)
                .expect("meta")
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", entry.display());
    }
    let listed = json(&live.strata(&["snapshots", "--json"]));
    assert_eq!(listed.as_array().expect("list").len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "base");

    // The source goes on (it was resumed after the copy).
    assert_eq!(sh(&live, &id, "cat b.txt"), "two\n");
    let out = live.strata(&["start", "--from", "base", "--json"]);
    let started = json(&out);
    let copy = started["id"].as_str().expect("id").to_string();
    assert_ne!(copy, id);
    assert!(
        started["receipt"]
            .to_string()
            .contains("started from snapshot base"),
        "{started}"
    );
    assert_eq!(
        sh(&live, &copy, "cat /tmp/deep/er/a.txt b.txt"),
        "one\ntwo\n"
    );
    assert_eq!(sh(&live, &copy, "pwd; echo $COLOR"), "/work\nteal\n");
    // The owner's bits come back (execute included); group and other bits are not carried.
    assert_eq!(sh(&live, &copy, "stat -c %a b.txt"), "700\n");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if entry.file_type().expect("type").is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_child_cannot_read_another_childs_or_the_parents_later_writes() {
    let live = Live::new();
    let parent = live.start(&[]);
    sh(&live, &parent, "echo shared > /tmp/before");
    let children = fork(&live, &parent, 2);
    assert_eq!(children.len(), 2);
    sh(&live, &parent, "echo parent > /tmp/later");
    sh(
        &live,
        &children[0],
        "echo first > /tmp/later; echo mine > /tmp/before",
    );
    assert_eq!(
        sh(&live, &children[1], "cat /tmp/before; ls /tmp"),
        "shared\nbefore\n"
    );
    assert_eq!(
        sh(&live, &parent, "cat /tmp/before /tmp/later"),
        "shared\nparent\n"
    );
    // The fork's snapshot is gone once the children run.
    assert!(
        store_entries(&live).is_empty(),
        "{:?}",
        store_entries(&live)
    );
    assert_eq!(live.ids().len(), 3);
}

#[test]
fn two_children_never_share_rng_output() {
    let live = Live::new();
    let parent = live.start(&[]);
    let children = fork(&live, &parent, 2);
    let random = |id: &str| sh(&live, id, "head -c 16 /dev/urandom | od -An -tx1");
    let (a, b) = (random(&children[0]), random(&children[1]));
    assert_eq!(a.split_whitespace().count(), 16, "{a}");
    assert_ne!(a, b, "two children read the same random bytes");
    assert_ne!(random(&parent), a);
}

#[test]
fn a_snapshot_file_edited_on_disk_is_refused() {
    let live = Live::new();
    let id = live.start(&[]);
    sh(&live, &id, "echo original > /tmp/a.txt");
    assert!(live
        .strata(&["snapshot", &id, "--name", "s"])
        .status
        .success());
    live.strata(&["stop", &id]);
    let file = live.snapshot_dir().join("s/files/t0/a.txt");
    assert_eq!(
        std::fs::read_to_string(&file).expect("stored"),
        "original\n"
    );
    // Same size, other contents: only the hash tells.
    std::fs::write(&file, "tampered\n").expect("edit");
    let out = live.strata(&["start", "--from", "s"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("altered"),
        "{}",
        text(&out.stderr)
    );
    assert!(live.ids().is_empty(), "nothing started");
    std::fs::write(&file, "original\n").expect("restore");
    // The metadata is sealed too: widening the caps in snapshot.json is refused.
    let body = live.snapshot_dir().join("s/snapshot.json");
    let text_body = std::fs::read_to_string(&body).expect("body");
    std::fs::write(&body, format!("{text_body} ")).expect("edit body");
    let out = live.strata(&["start", "--from", "s"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("seal"), "{}", text(&out.stderr));
    std::fs::write(&body, text_body).expect("restore body");
    let out = live.strata(&["start", "--from", "s"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // A planted symlink is refused, not followed.
    live.strata(&["stop", text(&out.stdout).trim()]);
    std::fs::remove_file(&file).expect("rm");
    std::os::unix::fs::symlink("/etc/hostname", &file).expect("symlink");
    let out = live.strata(&["start", "--from", "s"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(live.ids().is_empty());
}

#[test]
fn another_users_snapshot_is_refused() {
    if !nix_root() {
        eprintln!("SKIPPED another_users_snapshot_is_refused: needs root");
        return;
    }
    let live = Live::new();
    let id = live.start(&[]);
    sh(&live, &id, "echo secret > /tmp/s.txt");
    assert!(live
        .strata(&["snapshot", &id, "--name", "mine"])
        .status
        .success());
    assert!(live
        .strata(&["snapshot", &id, "--name", "given"])
        .status
        .success());
    // A snapshot handed to another uid is not used, even by root.
    let given = live.snapshot_dir().join("given");
    for entry in walk(&given) {
        std::os::unix::fs::lchown(&entry, Some(65534), Some(65534)).expect("chown");
    }
    let out = live.strata(&["start", "--from", "given"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("uid 65534"),
        "{}",
        text(&out.stderr)
    );
    // Another user pointed at this user's store gets nothing of it.
    let bins = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        bins.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let cli = bins.path().join("strata");
    std::fs::copy(exe(), &cli).expect("copy");
    for args in [
        vec!["start", "--from", "mine"],
        vec!["snapshots"],
        vec!["snapshot", "rm", "mine"],
    ] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&cli)
            .args(&args)
            .env("STRATA_SNAPSHOT_DIR", live.snapshot_dir())
            .env("STRATA_STATE_DIR", bins.path().join("state"))
            .current_dir("/")
            .output()
            .expect("setpriv");
        assert!(!out.status.success(), "{args:?} as nobody succeeded");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
    assert!(live.snapshot_dir().join("mine/snapshot.json").exists());
}

#[test]
fn removing_a_snapshot_leaves_nothing() {
    let live = Live::new();
    let id = live.start(&[]);
    sh(
        &live,
        &id,
        "mkdir -p /tmp/d && head -c 100000 /dev/zero > /tmp/d/big",
    );
    assert!(live
        .strata(&["snapshot", &id, "--name", "gone"])
        .status
        .success());
    assert_eq!(store_entries(&live), vec!["gone".to_string()]);
    let out = live.strata(&["snapshot", "rm", "gone"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        store_entries(&live).is_empty(),
        "{:?}",
        store_entries(&live)
    );
    let out = live.strata(&["snapshot", "rm", "gone"]);
    assert_eq!(out.status.code(), Some(2), "removing it twice");
    // A snapshot that cannot be taken leaves nothing either: a symlink in /tmp.
    sh(&live, &id, "ln -s /etc/passwd /tmp/link");
    let out = live.strata(&["snapshot", &id, "--name", "bad"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("symlink"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        store_entries(&live).is_empty(),
        "{:?}",
        store_entries(&live)
    );
    // And the sandbox was resumed after the failed copy.
    assert_eq!(sh(&live, &id, "echo alive"), "alive\n");
}

#[test]
fn a_fork_storm_is_bounded_and_starts_nothing() {
    let live = Live::new();
    let id = live.start(&[]);
    for count in ["0", "101", "100000"] {
        let out = live.strata(&["fork", &id, "--count", count]);
        assert_eq!(out.status.code(), Some(2), "--count {count}");
        assert!(
            text(&out.stderr).contains("1 to 100"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(live.ids(), vec![id.clone()]);
    assert!(store_entries(&live).is_empty());
}

#[test]
fn a_grant_inside_tmp_is_never_carried_into_a_snapshot() {
    let live = Live::new();
    let host = tempfile::tempdir().expect("host dir");
    std::fs::write(host.path().join("host.txt"), "host file\n").expect("write");
    let grant = format!("{}:/tmp/grant", host.path().display());
    let id = live.start(&["--rw", &grant]);
    sh(
        &live,
        &id,
        "echo mine > /tmp/own.txt; echo tool > /tmp/grant/tool.txt",
    );
    let made = json(&live.strata(&["snapshot", &id, "--name", "g", "--json"]));
    assert!(
        made["not_carried"].to_string().contains("/tmp/grant"),
        "{made}"
    );
    let stored = live.snapshot_dir().join("g/files/t0");
    assert!(stored.join("own.txt").exists());
    assert!(!stored.join("grant").exists(), "the grant was copied");
    // Started again, the grant is the host's directory, not a copy.
    live.strata(&["stop", &id]);
    std::fs::write(host.path().join("after.txt"), "later\n").expect("write");
    let copy = text(&live.strata(&["start", "--from", "g"]).stdout)
        .trim()
        .to_string();
    assert_eq!(
        sh(&live, &copy, "cat /tmp/own.txt /tmp/grant/after.txt"),
        "mine\nlater\n"
    );
}

#[test]
fn start_from_refuses_caps_flags_and_pause_to_disk_says_why() {
    let live = Live::new();
    let id = live.start(&[]);
    assert!(live
        .strata(&["snapshot", &id, "--name", "c"])
        .status
        .success());
    for flags in [
        vec!["--net", "host"],
        vec!["--rw", "/etc"],
        vec!["--backend", "microvm"],
    ] {
        let mut args = vec!["start", "--from", "c"];
        args.extend(flags.iter());
        let out = live.strata(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flags:?}: {}",
            text(&out.stderr)
        );
    }
    let out = live.strata(&["start", "--from", "missing"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no snapshot"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(live.ids(), vec![id.clone()]);
    let out = live.strata(&["pause", "--to-disk", &id]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("cannot save processes"),
        "{}",
        text(&out.stderr)
    );
    let out = live.strata(&["snapshot", &id, "--name", "c"]);
    assert_eq!(out.status.code(), Some(2), "a taken name");
}
