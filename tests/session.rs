//! Sessions on real backends: files live across calls, processes do not; copies in and out
//! are exact and never follow what a tool planted; sessions are isolated from each other and
//! leave nothing behind.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{ok_stdout, sandbox, sh, PY};
use strata::session::{Call, FileKind, SessionOptions, NO_TIMEOUT};
use strata::{
    BackendChoice, BackendKind, CancelToken, Caps, ErrorKind, RunContext, Sandbox, ScriptLanguage,
    Tool,
};

/// Session directories under `parent`.
fn session_dirs(parent: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .expect("read parent")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("strata-session-"))
        .collect()
}

fn options(parent: &Path) -> SessionOptions {
    SessionOptions {
        parent: Some(parent.to_path_buf()),
        ..SessionOptions::default()
    }
}

#[test]
fn files_persist_across_calls_and_a_calls_processes_do_not_outlive_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    session.write_file("notes.txt", b"one\n").expect("write");
    let first = session
        .run(&sh(
            "echo two >> notes.txt; (sleep 2; echo late > late.txt) & pwd",
        ))
        .expect("first call");
    assert_eq!(ok_stdout(&first).trim(), "/workspace");
    let second = session
        .run(&sh("echo three >> /workspace/notes.txt; cat notes.txt"))
        .expect("second call");
    assert_eq!(ok_stdout(&second), "one\ntwo\nthree\n");
    std::thread::sleep(Duration::from_secs(3));
    let names: Vec<String> = session
        .list_files(".")
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(
        names,
        ["notes.txt"],
        "the background process of the first call wrote after the call ended"
    );
    session.close().expect("close");
    assert!(
        session_dirs(tmp.path()).is_empty(),
        "session directory left behind"
    );
}

#[test]
fn binary_upload_and_download_are_exact_including_nul_bytes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("data")).expect("mkdir");
    let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(src.join("data/blob.bin"), &blob).expect("blob");
    std::fs::write(src.join("nul.txt"), b"a\0b\0\0c").expect("nul");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    let up = session.upload(&src, "project").expect("upload");
    assert_eq!((up.files, up.bytes), (2, blob.len() as u64 + 6));
    let digest = session
        .run(&Tool::command([
            PY,
            "-c",
            "import hashlib,sys; d=open('project/data/blob.bin','rb').read(); print(len(d), hashlib.sha256(d).hexdigest()); open('project/out.bin','wb').write(d[::-1])",
        ]))
        .expect("hash in the sandbox");
    let expected = format!("{} {}", blob.len(), sha256_hex(&blob));
    assert_eq!(ok_stdout(&digest).trim(), expected);
    let out = tmp.path().join("out");
    session.download("project", &out).expect("download");
    let reversed: Vec<u8> = blob.iter().rev().copied().collect();
    assert_eq!(
        std::fs::read(out.join("out.bin")).expect("out.bin"),
        reversed
    );
    assert_eq!(
        std::fs::read(out.join("nul.txt")).expect("nul"),
        b"a\0b\0\0c"
    );
    assert_eq!(
        session
            .read_file("/workspace/project/nul.txt")
            .expect("read"),
        b"a\0b\0\0c"
    );
}

fn sha256_hex(data: &[u8]) -> String {
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(data)?;
            child.wait_with_output()
        })
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

#[test]
fn tool_planted_symlink_and_hard_link_are_never_followed_by_read_or_download() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    let planted = session
        .run(&sh(
            "ln -s /etc/shadow leak && ln -s / root && echo x > a && ln a hard && mkfifo pipe && echo planted",
        ))
        .expect("plant");
    assert_eq!(ok_stdout(&planted).trim(), "planted");
    for path in ["leak", "root/etc/shadow", "hard", "pipe"] {
        let err = session.read_file(path).expect_err(path);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{path}: {err}");
    }
    let out = tmp.path().join("out");
    let err = session.download(".", &out).expect_err("download");
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert!(!out.exists(), "a refused download wrote something");
    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "/workspace/../etc/passwd",
    ] {
        let err = session.read_file(path).expect_err(path);
        assert!(err.to_string().contains("invalid path"), "{path}: {err}");
    }
    session
        .write_file("leak", b"mine")
        .expect("write replaces the link");
    assert_eq!(session.read_file("leak").expect("read"), b"mine");
}

#[test]
fn sessions_are_isolated_from_each_other() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sb = sandbox();
    let a = sb
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("a");
    let b = sb
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("b");
    assert_ne!(a.id(), b.id());
    a.write_file("secret.txt", b"a's secret").expect("write");
    // Directory names do not carry ids: a's is the one holding its file.
    let a_dir = session_dirs(tmp.path())
        .into_iter()
        .find(|d| d.join("root/secret.txt").exists())
        .expect("a's directory");
    let probe = format!(
        "ls /workspace; cat {}/root/secret.txt 2>&1 || echo unreachable",
        a_dir.display()
    );
    let seen = b.run(&sh(&probe)).expect("b's probe");
    let text = ok_stdout(&seen);
    assert!(!text.contains("a's secret"), "{text}");
    assert!(text.contains("unreachable"), "{text}");
    assert!(b.list_files(".").expect("list").is_empty());
}

#[test]
fn per_call_timeout_ends_the_call_and_zero_means_none() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let caps = Caps::new().timeout(Duration::from_millis(500));
    let session = sandbox()
        .session_with(&caps, options(tmp.path()))
        .expect("session");
    let short = session.run(&sh("sleep 3")).expect("short");
    assert!(short.timed_out(), "{:?}", short.status);
    let none = session
        .run_with(
            &sh("sleep 1; echo done"),
            &Call {
                timeout: Some(Duration::ZERO),
                ..Call::default()
            },
        )
        .expect("no timeout");
    assert_eq!(ok_stdout(&none).trim(), "done");
    assert!(NO_TIMEOUT > Duration::from_secs(3600));
}

#[test]
fn close_cancels_calls_in_flight_removes_the_directory_and_refuses_later_calls() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    session.write_file("f", b"x").expect("write");
    let running = session.clone();
    let call = std::thread::spawn(move || {
        running.run_with(
            &sh("sleep 60"),
            &Call {
                timeout: Some(Duration::ZERO),
                ctx: RunContext {
                    cancel: CancelToken::new(),
                    ..RunContext::default()
                },
            },
        )
    });
    std::thread::sleep(Duration::from_millis(700));
    session.close().expect("close");
    let err = call.join().expect("join").expect_err("cancelled");
    assert_eq!(err.kind(), ErrorKind::Cancelled, "{err}");
    assert!(session_dirs(tmp.path()).is_empty(), "left behind");
    let err = session.run(&sh("true")).expect_err("closed");
    assert!(err.to_string().contains("is closed"), "{err}");
    session.read_file("f").expect_err("closed");
    session.close().expect("close twice");
}

#[test]
fn dropping_the_last_handle_removes_the_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    session.write_file("d/e/f", b"x").expect("write");
    assert_eq!(session_dirs(tmp.path()).len(), 1);
    drop(session);
    assert!(session_dirs(tmp.path()).is_empty());
}

#[test]
fn bad_session_requests_are_refused_before_anything_is_made() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sb = sandbox();
    for workdir in ["/", "relative", "/a/../b"] {
        let err = sb
            .session_with(
                &Caps::new(),
                SessionOptions {
                    workdir: workdir.into(),
                    ..options(tmp.path())
                },
            )
            .expect_err(workdir);
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{workdir}: {err}");
    }
    let overlapping = Caps::new().with_mount(strata::Mount::new(
        tmp.path().to_path_buf(),
        "/workspace/data".into(),
        strata::Access::ReadOnly,
    ));
    let err = sb
        .session_with(&overlapping, options(tmp.path()))
        .expect_err("overlap");
    assert!(err.to_string().contains("overlaps"), "{err}");
    assert!(session_dirs(tmp.path()).is_empty());
}

#[test]
fn a_low_tier_session_runs_its_workspace_calls() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sb = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(common::helper())
        .tier("low")
        .build()
        .expect("sandbox");
    let session = sb
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    let out = session
        .run(&sh("echo hi > f; cat f"))
        .expect("low tier call");
    assert_eq!(ok_stdout(&out).trim(), "hi");
    let listed = session.list_files("/workspace").expect("list");
    assert_eq!(listed[0].path, "/workspace/f");
    assert_eq!(
        session.list_files("./.").expect("list")[0].path,
        "/workspace/f"
    );
    assert_eq!(listed[0].kind, FileKind::File);
}

#[test]
fn wasm_session_keeps_files_between_python_calls() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sb = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Wasm))
        .build()
        .expect("wasm backend");
    let session = sb
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    session
        .write_file("in.txt", b"from the host")
        .expect("write");
    let first = session
        .run(&Tool::script(
            ScriptLanguage::Python,
            "open('/workspace/out.txt','w').write(open('/workspace/in.txt').read().upper())",
        ))
        .unwrap_or_else(|e| panic!("wasm python call (interpreters fetched by scripts/fetch-wasm-interpreters.sh?): {e}"));
    assert!(
        first.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = session
        .run(&Tool::script(
            ScriptLanguage::Python,
            "print(open('/workspace/out.txt').read())",
        ))
        .expect("second call");
    assert_eq!(ok_stdout(&second).trim(), "FROM THE HOST");
    assert_eq!(second.receipt.backend, BackendKind::Wasm);
    assert_eq!(
        session.read_file("out.txt").expect("read"),
        b"FROM THE HOST"
    );
    session.close().expect("close");
    assert!(session_dirs(tmp.path()).is_empty());
}

#[test]
fn microvm_session_keeps_files_between_calls_in_fresh_guests() {
    let script =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("scripts/build-vm-guest.sh");
    let built = std::process::Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        built.status.success(),
        "scripts/build-vm-guest.sh failed (it needs qemu-system-x86 and linux-image-cloud-amd64):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let sb = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Microvm))
        .build()
        .expect("microvm backend");
    let session = sb
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    session.write_file("in.txt", b"a\0b").expect("write");
    let first = session
        .run(&sh(
            "cat in.txt | od -An -c | tr -s ' ' > seen.txt; uname -r > kernel.txt",
        ))
        .expect("first call");
    assert!(
        first.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.receipt.backend, BackendKind::Microvm);
    let second = session
        .run(&sh("cat seen.txt; echo more >> seen.txt"))
        .expect("second call");
    assert_eq!(ok_stdout(&second).trim(), "a \\0 b");
    assert_eq!(
        session.read_file("seen.txt").expect("read"),
        b" a \\0 b\nmore\n"
    );
    session.close().expect("close");
    assert!(session_dirs(tmp.path()).is_empty());
}

/// Round 3: the session id is the only handle (`strata mcp --http` gives it out); the
/// directory's name must not reveal it to a local user listing `$TMPDIR`, and the
/// directory and its owner file are the embedder's alone.
#[test]
fn session_ids_cannot_be_listed_from_the_parent_directory() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let session = sandbox()
        .session_with(&Caps::new(), options(tmp.path()))
        .expect("session");
    let hex = session.id().trim_start_matches("s-").to_string();
    assert_eq!(hex.len(), 32, "{}", session.id());
    let dirs = session_dirs(tmp.path());
    assert_eq!(dirs.len(), 1);
    for dir in &dirs {
        let name = dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(!name.contains(&hex), "{name} names the session id {hex}");
        assert!(
            !name.contains(&hex[..8]),
            "{name} shares a prefix with the id"
        );
        let mode = std::fs::metadata(dir).expect("meta").mode() & 0o777;
        assert_eq!(mode, 0o700, "{} is {mode:o}", dir.display());
        let owner = std::fs::metadata(dir.join("owner")).expect("owner").mode() & 0o777;
        assert_eq!(owner, 0o600, "the owner file is {owner:o}");
    }
    if common::is_root() {
        // Another local user cannot enter it.
        let listed = std::process::Command::new("ls")
            .arg(&dirs[0])
            .uid(65534)
            .gid(65534)
            .output()
            .expect("ls as nobody");
        assert!(
            !listed.status.success(),
            "nobody listed the session directory"
        );
    } else {
        eprintln!("NOTE: not root: the check from another uid is skipped (modes checked)");
    }
    session.close().expect("close");
}

/// Round 3: a profile with `disk = "1M"` let a session call write 300 MiB into the session
/// directory. As root the directory is a size-limited tmpfs: a call's writes and the host
/// side's writes stop at the limit, the receipt says so, and closing leaves no mount. An
/// unprivileged embedder cannot mount one: the receipt states the gap.
#[test]
fn a_session_call_cannot_write_past_the_disk_limit() {
    use strata::Capability;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut caps = Caps::new();
    caps.limits.disk = strata::ByteSize::mib(1);
    let session = sandbox()
        .session_with(&caps, options(tmp.path()))
        .expect("session");
    let out = session
        .run(&sh(
            "dd if=/dev/zero of=big bs=64k count=64 2>&1; ls -l big",
        ))
        .expect("call");
    let dir = session_dirs(tmp.path()).remove(0);
    if common::is_root() {
        let size = std::fs::metadata(dir.join("root/big"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(size <= 1 << 20, "the call wrote {size} bytes past 1 MiB");
        assert!(
            out.receipt.has(
                Capability::Disk,
                "session directory on a size-limited tmpfs"
            ),
            "{:?}",
            out.receipt
        );
        assert!(
            out.receipt
                .denials
                .iter()
                .any(|d| d.detail.contains("session directory is full")),
            "{:?}",
            out.receipt.denials
        );
        let err = session
            .write_file("more.bin", &vec![0u8; 2 << 20])
            .expect_err("a host-side write past the limit");
        assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
        session.close().expect("close");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mounts.contains(&dir.to_string_lossy().to_string()),
            "the session's tmpfs is still mounted"
        );
        assert!(!dir.exists(), "{} left behind", dir.display());
    } else {
        assert!(
            out.receipt.gaps.iter().any(|g| g.capability == Capability::Disk
                && g.reason.contains("session directory")),
            "{:?}",
            out.receipt.gaps
        );
        eprintln!("NOTE: not root: the session directory cannot be size-limited (gap checked)");
    }
}

/// The disk-limit test as an unprivileged embedder (uid 65534): it cannot mount a
/// size-limited directory, and every call's receipt says so.
#[test]
fn a_session_call_cannot_write_past_the_disk_limit_unprivileged() {
    if !common::require_root("a_session_call_cannot_write_past_the_disk_limit_unprivileged") {
        return;
    }
    common::run_inner_as("session_disk_inner", (65534, 65534), &[]);
}

#[test]
#[ignore = "runs as uid 65534 under a_session_call_cannot_write_past_the_disk_limit_unprivileged"]
fn session_disk_inner() {
    use strata::Capability;
    assert!(!common::is_root(), "must run unprivileged");
    let helper = std::env::var("STRATA_INNER_HELPER").expect("run by its outer test");
    let scratch = PathBuf::from(std::env::var("STRATA_INNER_SCRATCH").expect("scratch"));
    let sandbox = Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Process))
        .helper(&helper)
        .strictness(strata::Strictness::BestEffort)
        .build()
        .expect("sandbox");
    let mut caps = Caps::new();
    caps.limits.disk = strata::ByteSize::mib(1);
    let session = sandbox
        .session_with(&caps, options(&scratch))
        .expect("session");
    let out = session.run(&sh("echo hi > f; cat f")).expect("call");
    assert_eq!(ok_stdout(&out), "hi\n");
    assert!(
        out.receipt
            .gaps
            .iter()
            .any(|g| g.capability == Capability::Disk && g.reason.contains("session directory")),
        "{:?}",
        out.receipt.gaps
    );
    let dirs = session_dirs(&scratch);
    assert!(!dirs[0]
        .file_name()
        .expect("name")
        .to_string_lossy()
        .contains(session.id().trim_start_matches("s-")));
    session.close().expect("close");
    assert!(session_dirs(&scratch).is_empty());
}
