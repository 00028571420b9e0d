//! Live sandboxes in OCI images through the CLI (`strata start --image REF`): the container
//! backend's native runtime, one process sandbox with the image as its root that every exec
//! runs in. Named after what they stop: a process that outlives its sandbox, a layer or
//! mount left behind, an engine runtime silently standing in.
//! Needs the test images (`scripts/build-test-images.sh`, run here) and `strata-helper` and
//! `strata-live` next to `strata`.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::{marker, processes_with, text, wait_until, Live};

fn images() -> PathBuf {
    let repo =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("..");
    let built = std::process::Command::new(repo.join("scripts/build-test-images.sh"))
        .output()
        .expect("scripts/build-test-images.sh");
    assert!(
        built.status.success(),
        "build-test-images: {}",
        text(&built.stderr)
    );
    std::env::var_os("STRATA_TEST_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".ci/cache/images"))
}

/// The run cgroups that process `pid` made (`run-PID-N`), wherever they are below
/// /sys/fs/cgroup (cgroup v1 has one hierarchy per controller).
fn cgroups_made_by(pid: u64) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, depth: usize, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                found.push(path);
            } else if depth > 0 {
                walk(&path, prefix, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(
        Path::new("/sys/fs/cgroup"),
        &format!("run-{pid}-"),
        6,
        &mut found,
    );
    found
}

#[test]
fn a_live_container_runs_every_exec_in_the_image_and_keeps_its_layer_until_stop() {
    let image = images().join("python-oci");
    let image = image.to_str().expect("utf-8");
    let live = Live::new();
    let out = live.strata(&["start", "--image", image, "--json"]);
    assert!(out.status.success(), "start: {}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(started["backend"], "container", "{started}");
    let id = started["id"].as_str().expect("id").to_string();
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(live.state_dir().join(&id).join("info.json")).expect("info.json"),
    )
    .expect("info json");
    let supervisor = info["supervisor_pid"].as_u64().expect("supervisor pid");
    let receipt = &started["receipt"];
    assert_eq!(receipt["container"]["runtime"], "native", "{receipt}");
    let enforced = receipt["enforced"].to_string();
    for line in [
        "OCI image root (overlayfs)",
        "when the live sandbox stops",
        "image user",
        "live sandbox",
        "\"seccomp\"",
    ] {
        assert!(enforced.contains(line), "{line}: {enforced}");
    }
    // The image's own root: its interpreter, and the whiteout of its top layer applied.
    let out = live.strata(&["exec", &id, "--", "python3", "-c", "print(6 * 7)"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42\n");
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "test ! -e /usr/share/doc"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the whiteout hides /usr/share/doc: {}",
        text(&out.stderr)
    );
    // The writable layer lasts as long as the sandbox: one exec writes into the image's
    // tree, the next reads it.
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "echo kept > /usr/note"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--", "cat", "/usr/note"]);
    assert_eq!(text(&out.stdout), "kept\n", "{}", text(&out.stderr));
    let mark = marker();
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        &format!("setsid sleep {mark} & sleep {mark}"),
    ]);
    assert!(out.status.success(), "detach: {}", text(&out.stderr));
    wait_until(
        "the detached processes run",
        Duration::from_secs(10),
        || processes_with(&mark).len() >= 2,
    );
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    assert!(
        processes_with(&mark).is_empty(),
        "nothing survives stop, also what left with setsid"
    );
    assert!(live.sandbox_dirs().is_empty(), "no state left");
    wait_until(
        "the sandbox's cgroups are removed",
        Duration::from_secs(15),
        || cgroups_made_by(supervisor).is_empty(),
    );
}

#[test]
fn a_live_container_on_an_engine_runtime_is_refused_and_nothing_starts() {
    let image = images().join("busybox-oci");
    let image = image.to_str().expect("utf-8");
    let live = Live::new();
    for runtime in ["docker", "runsc"] {
        let out = live.strata(&["start", "--image", image, "--runtime", runtime]);
        assert!(
            matches!(out.status.code(), Some(2) | Some(125)),
            "{runtime}: {:?} {}",
            out.status.code(),
            text(&out.stderr)
        );
        let why = text(&out.stderr);
        assert!(why.contains("native"), "names the runtime that can: {why}");
    }
    assert!(live.sandbox_dirs().is_empty(), "nothing started");
}

#[test]
fn a_live_container_takes_execs_as_the_images_user_with_its_environment() {
    let image = images().join("busybox-oci");
    let image = image.to_str().expect("utf-8");
    let live = Live::new();
    let id = live.start(&["--image", image, "--env", "FROM_CAPS=yes"]);
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "echo $FROM_CAPS; id -u; pwd"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    assert_eq!(lines.first().map(String::as_str), Some("yes"), "{lines:?}");
    // The image's root is the sandbox's: nothing of the host's /usr is there.
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "test ! -e /usr/bin/python3"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the host's tree is not visible: {}",
        text(&out.stderr)
    );
    assert!(live.strata(&["stop", &id]).status.success());
}
