//! The container backend's native runtime: OCI images as the root of the process sandbox.
//! Real images (built from Debian packages by scripts/build-test-images.sh), real runs.

mod container_common;

use std::time::Duration;

use container_common::*;
use strata::{
    BackendKind, Capability, Caps, ContainerRuntime, ErrorKind, LimitKind, ScriptLanguage, Tool,
};

const NATIVE: ContainerRuntime = ContainerRuntime::Native;

#[test]
fn python3_runs_from_an_oci_layout() {
    let caps = caps(&images().python_oci(), NATIVE);
    let out = run(&Tool::command(["python3", "-c", "print(1)"]), &caps);
    assert_eq!(ok_stdout(&out), "1\n");
    let receipt = &out.receipt;
    assert_eq!(receipt.backend, BackendKind::Container);
    let container = receipt.container.as_ref().expect("container receipt");
    assert_eq!(container.runtime, "native");
    assert!(container.digest.starts_with("sha256:"), "{container:?}");
    assert!(receipt.has(Capability::Fs, "OCI image root"), "{receipt}");
    assert!(receipt.has(Capability::Fs, "landlock"), "{receipt}");
    assert!(receipt.has(Capability::Syscalls, "seccomp"), "{receipt}");
    assert!(
        receipt.has(Capability::Net, "empty network namespace"),
        "{receipt}"
    );
}

#[test]
fn the_same_image_as_a_docker_archive_and_a_rootfs_dir_runs_too() {
    let from_oci = run(
        &Tool::command(["python3", "-c", "print(2)"]),
        &caps(&images().python_oci(), NATIVE),
    );
    let from_archive = run(
        &Tool::command(["python3", "-c", "print(2)"]),
        &caps(&images().python_archive(), NATIVE),
    );
    assert_eq!(ok_stdout(&from_archive), "2\n");
    let digest = |o: &strata::RunOutput| o.receipt.container.clone().expect("receipt").digest;
    assert_eq!(
        digest(&from_oci),
        digest(&from_archive),
        "one image, one id, whatever the format"
    );
    let from_dir = run(
        &Tool::command(["/usr/bin/python3", "-c", "print(3)"]),
        &caps(&images().python_rootfs(), NATIVE),
    );
    assert_eq!(ok_stdout(&from_dir), "3\n");
    assert!(digest(&from_dir).starts_with("dir:"));
}

#[test]
fn scripts_run_with_the_images_interpreter() {
    let caps = caps(&images().python_oci(), NATIVE);
    let out = run(
        &Tool::script(ScriptLanguage::Python, "import sys; print(sys.executable)"),
        &caps,
    );
    assert_eq!(ok_stdout(&out), "/usr/bin/python3\n");
    let out = run(&Tool::script(ScriptLanguage::Sh, "echo $((6*7))"), &caps);
    assert_eq!(ok_stdout(&out), "42\n");
}

#[test]
fn image_whiteout_layers_are_honoured() {
    // The python image's third layer whites out /usr/share/doc.
    let caps = caps(&images().python_oci(), NATIVE);
    let out = run(
        &sh("test -e /usr/share/doc && echo present || echo gone; ls /usr/share"),
        &caps,
    );
    let text = ok_stdout(&out);
    assert!(text.starts_with("gone\n"), "{text}");
}

#[test]
fn image_env_workdir_user_and_entrypoint_are_honoured() {
    let dir = tempdir();
    let cache = tempdir();
    let image = dir.path().join("img");
    std::fs::create_dir(&image).expect("dir");
    let app = layer(&[
        Entry::Dir("app"),
        Entry::File("app/hello.txt", b"hi\n", 0o644),
    ]);
    write_oci(
        &image,
        &[busybox_layer(), app],
        &Config {
            env: &[
                "PATH=/bin:/usr/bin",
                "GREETING=from-image",
                "OVERRIDE=image",
            ],
            workdir: Some("/app"),
            user: Some("1000:1000"),
            entrypoint: Some(&["/bin/sh", "-c"]),
            cmd: Some(&["echo default-cmd"]),
        },
    );
    let image = image.display().to_string();
    let caps = caps(&image, NATIVE).env("OVERRIDE", "caps");
    let out = run_cached(
        cache.path(),
        &Tool::command(["echo $GREETING $OVERRIDE $(pwd) $(id -u):$(id -g) $(cat hello.txt)"]),
        &caps,
    )
    .expect("run");
    assert_eq!(
        ok_stdout(&out),
        "from-image caps /app 1000:1000 hi\n",
        "Env, caps env over image env, WorkingDir, User, Entrypoint"
    );
    let out = run_cached(cache.path(), &Tool::command(Vec::<String>::new()), &caps).expect("run");
    assert_eq!(
        ok_stdout(&out),
        "default-cmd\n",
        "an empty command runs Entrypoint + Cmd"
    );
}

#[test]
fn named_image_user_is_resolved_in_the_images_passwd() {
    let dir = tempdir();
    let cache = tempdir();
    let image = dir.path().join("img");
    std::fs::create_dir(&image).expect("dir");
    write_oci(
        &image,
        &[busybox_layer()],
        &Config {
            env: &["PATH=/bin"],
            user: Some("app"),
            ..Config::default()
        },
    );
    let caps = caps(&image.display().to_string(), NATIVE);
    let out = run_cached(cache.path(), &sh("id -u; echo $HOME"), &caps).expect("run");
    assert_eq!(ok_stdout(&out), "1000\n/home/app\n");
}

#[test]
fn caps_still_decide_mounts_network_and_limits() {
    let data = tempdir();
    std::fs::write(data.path().join("in.txt"), "input").expect("write");
    let out_dir = tempdir();
    let caps = caps(&images().python_oci(), NATIVE)
        .mount(data.path(), "/data", strata::Access::ReadOnly)
        .mount(out_dir.path(), "/out", strata::Access::ReadWrite);
    let out = run(
        &Tool::command([
            "python3",
            "-c",
            "open('/out/o.txt','w').write(open('/data/in.txt').read().upper())\n\
             try:\n    open('/data/x','w')\nexcept OSError as e:\n    print('ro', e.errno)",
        ]),
        &caps,
    );
    assert_eq!(ok_stdout(&out), "ro 30\n");
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("o.txt")).expect("out"),
        "INPUT"
    );

    let caps = caps_timeout(&images().python_oci(), Duration::from_millis(500));
    let out = run(&Tool::command(["sleep", "10"]), &caps);
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
}

fn caps_timeout(image: &str, timeout: Duration) -> Caps {
    caps(image, NATIVE).timeout(timeout)
}

#[test]
fn an_image_without_python3_is_a_clear_error_and_nothing_runs() {
    let err = sandbox()
        .run(
            &Tool::command(["python3", "-c", "print(1)"]),
            &caps(&images().busybox_oci(), NATIVE),
        )
        .expect_err("busybox has no python3");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("python3"), "{err}");
}

#[test]
fn unknown_or_corrupt_images_are_invalid_requests() {
    for image in [
        "/nonexistent/image.tar",
        "registry.example.com/library/python:3",
    ] {
        let err = sandbox()
            .run(&Tool::command(["true"]), &caps(image, NATIVE))
            .expect_err("unknown image");
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
        assert!(err.to_string().contains("never pulls"), "{err}");
    }
    let dir = tempdir();
    let corrupt = dir.path().join("corrupt.tar");
    write_file(&corrupt, b"this is not a tar archive at all, just bytes");
    let err = sandbox()
        .run(
            &Tool::command(["true"]),
            &caps(&corrupt.display().to_string(), NATIVE),
        )
        .expect_err("corrupt");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    let err = sandbox()
        .run(&Tool::command(["true"]), &Caps::new())
        .expect_err("no image");
    assert!(err.to_string().contains("needs an image"), "{err}");
}

#[test]
fn process_backend_refuses_caps_with_an_image() {
    let sandbox = strata::Sandbox::builder()
        .backend(strata::BackendChoice::Only(BackendKind::Process))
        .helper(helper())
        .build()
        .expect("process");
    let err = sandbox
        .run(
            &Tool::command(["true"]),
            &caps(&images().python_oci(), NATIVE),
        )
        .expect_err("process backend must not ignore an image");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

#[test]
fn native_grant_does_not_follow_a_planted_symlink() {
    let secret = tempdir();
    std::fs::write(secret.path().join("secret.txt"), "secret").expect("write");
    let ws = tempdir();
    let src = ws.path().join("src");
    std::os::unix::fs::symlink(secret.path(), &src).expect("symlink");
    let err = sandbox()
        .run(
            &sh(&format!("cat {}/secret.txt", src.display())),
            &caps(&images().busybox_oci(), NATIVE).read_only(&src),
        )
        .expect_err("planted symlink");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{} is a symlink", src.display())),
        "{err}"
    );
}

#[test]
fn native_git_hook_and_envrc_in_rw_grant_cannot_be_written() {
    let repo = Repo::new();
    let caps = caps(&images().busybox_oci(), NATIVE).mount(
        repo.dir.path(),
        "/ws",
        strata::Access::ReadWrite,
    );
    let out = run(&sh(REPO_ATTACKS), &caps);
    assert_repo_attacks_denied(&ok_stdout(&out));
    repo.assert_untouched();
    assert_eq!(
        std::fs::read_to_string(repo.dir.path().join("src/main.rs")).expect("src"),
        "edited\n"
    );
    let receipt = out.receipt.to_string();
    assert!(
        receipt
            .contains("host-executed paths read-only: /ws/.envrc, /ws/.git/config, /ws/.git/hooks"),
        "{receipt}"
    );
}
