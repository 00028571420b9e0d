//! The CLI contract for the container backend: `strata run --backend container --image REF
//! [--runtime native|docker|podman|runsc]`. Needs the `strata` binary built next to the
//! helper (`cargo build --bins`, as .ci/run does) and, for `--runtime docker`, a running
//! Docker engine (scripts/start-dockerd.sh); both fail loudly when missing.

mod container_common;

use std::path::PathBuf;
use std::process::Command;

use container_common::*;

fn cli() -> PathBuf {
    let path = std::path::Path::new(helper())
        .parent()
        .expect("target dir")
        .join("strata");
    assert!(
        path.is_file(),
        "{} is missing: build the CLI first (cargo build --bins)",
        path.display()
    );
    path
}

fn strata(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(cli())
        .args(args)
        .env("STRATA_HELPER", helper())
        .output()
        .expect("run strata");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_runs_python3_in_the_test_image_natively() {
    let image = images().python_archive();
    let (code, stdout, stderr) = strata(&[
        "run",
        "--backend",
        "container",
        "--image",
        &image,
        "--",
        "python3",
        "-c",
        "print(1)",
    ]);
    assert_eq!((code, stdout.as_str()), (0, "1\n"), "{stderr}");
    let (code, stdout, stderr) = strata(&[
        "run",
        "--backend",
        "container",
        "--image",
        &images().python_oci(),
        "--runtime",
        "native",
        "--json",
        "--",
        "python3",
        "-c",
        "print(1)",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["stdout"], "1\n");
    assert_eq!(json["receipt"]["backend"], "container");
    assert_eq!(json["receipt"]["container"]["runtime"], "native");
}

#[test]
fn cli_runs_python3_in_the_test_image_on_the_docker_engine() {
    let images = engine_images();
    let (code, stdout, stderr) = strata(&[
        "run",
        "--backend",
        "container",
        "--image",
        &images.python_archive(),
        "--runtime",
        "docker",
        "--json",
        "--",
        "python3",
        "-c",
        "print(1)",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(json["stdout"], "1\n");
    assert_eq!(json["receipt"]["container"]["runtime"], "docker");
}

#[test]
fn cli_refuses_bad_container_arguments_with_exit_2() {
    for args in [
        &["run", "--image", "/x", "--", "true"][..],
        &["run", "--backend", "container", "--", "true"][..],
        &[
            "run",
            "--backend",
            "container",
            "--image",
            "/x",
            "--runtime",
            "lxc",
            "--",
            "true",
        ][..],
        &[
            "run",
            "--backend",
            "container",
            "--image",
            "/nonexistent/image",
            "--",
            "true",
        ][..],
    ] {
        let (code, _, stderr) = strata(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
    }
}

#[test]
fn engine_container_of_a_sigkilled_embedder_is_removed_by_the_next_run() {
    let images = engine_images();
    let image = images.python_archive();
    let marker = "sleep 3131";
    let mut embedder = Command::new(cli())
        .args(["run", "--backend", "container", "--runtime", "docker"])
        .args([
            "--image",
            &image,
            "--timeout",
            "600",
            "--",
            "sh",
            "-c",
            marker,
        ])
        .env("STRATA_HELPER", helper())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the cli");
    let label = format!("label=org.strata.run={}", embedder.id());
    let containers = || {
        let (ok, out) = docker(&["ps", "-a", "-q", "--filter", &label]);
        assert!(ok, "docker ps failed");
        out.lines().count()
    };
    assert!(
        eventually_zero(|| usize::from(containers() == 0)),
        "the embedder's container never started"
    );
    // The engine, not the embedder, is the container's parent: it survives a SIGKILL.
    embedder.kill().expect("SIGKILL the embedder");
    let _ = embedder.wait();
    assert_eq!(containers(), 1, "the container should outlive its embedder");

    // The next process that uses the engine removes it.
    let (code, _, stderr) = strata(&[
        "run",
        "--backend",
        "container",
        "--runtime",
        "docker",
        "--image",
        &image,
        "--",
        "true",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(containers(), 0, "the abandoned container was left behind");
}
