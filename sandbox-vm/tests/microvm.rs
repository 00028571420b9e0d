//! The microVM backend on real QEMU (TCG here), real guest kernel, real agent. No mocks.
//!
//! Cold boots are few: one test boots a handful of VMs in sequence and checks several
//! things per boot. The guest artifacts come from scripts/build-vm-guest.sh, which this
//! test runs (idempotent, cached); without QEMU or the artifacts it fails loudly.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandbox_core::{
    Backend, ByteSize, Capability, Caps, ErrorKind, ExitStatus, LimitKind, Limits, Mechanism, Net,
    RunContext, ScriptLanguage, Strictness, Tool,
};
use sandbox_vm::MicrovmBackend;

/// The guest agent built with this workspace (`sandbox-agent`'s binary, next to this test's
/// directory: `cargo test --workspace` builds it).
fn agent_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let agent = dir.join("strata-guest-agent");
    assert!(
        agent.is_file(),
        "{} is missing: build it first (cargo build -p sandbox-agent --bin strata-guest-agent, same profile; `cargo test -p sandbox-vm` alone does not build it)",
        agent.display()
    );
    agent
}

fn repo() -> PathBuf {
    Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("..")
}

fn backend() -> MicrovmBackend {
    let script = repo().join("scripts/build-vm-guest.sh");
    let out = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/build-vm-guest.sh failed (run it by hand to see why; it needs qemu-system-x86 and Debian's linux-image-cloud-amd64):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .is_ok(),
        "qemu-system-x86_64 missing: apt-get install -y --no-install-recommends qemu-system-x86"
    );
    let agent = agent_binary();
    let agent = agent.as_path();
    for tool in sandbox_vm::artifacts::INNER_TOOLS {
        let path = agent.with_file_name(tool);
        assert!(
            path.is_file(),
            "{} is missing: the layers inside the guest need it (cargo build --release --workspace --bins)",
            path.display()
        );
    }
    MicrovmBackend::new().with_agent(agent)
}

fn sh(script: &str) -> Tool {
    Tool::script(ScriptLanguage::Sh, script)
}

fn strata_vm_dirs() -> Vec<PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("strata-vm-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// QEMU processes of VMs this test process started (their private directories are in its
/// temp dir; jailed QEMUs are not its children).
fn my_qemus() -> Vec<String> {
    qemus_in(&std::env::temp_dir())
}

/// QEMU processes whose agent socket is in a `strata-vm-*` directory under `tmp` (their
/// `/proc/PID/stat` lines).
fn qemus_in(tmp: &Path) -> Vec<String> {
    let needle = format!("path={}/strata-vm-", tmp.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.starts_with("qemu-system") || !cmdline.contains(&needle) {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if !stat.contains(") Z ") {
                found.push(stat);
            }
        }
    }
    found
}

/// `/proc/PID/status` of a QEMU of this test process, waiting up to a minute for one.
fn wait_for_my_qemu() -> (String, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(stat) = my_qemus().first() {
            let pid = pid_of(stat);
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            return (pid, status);
        }
        assert!(Instant::now() < deadline, "no QEMU started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_vmm_is_jailed_and_cannot_see_host_files() {
    let _turn = turn();
    let backend = backend();
    let canary = std::env::temp_dir().join(format!("strata-vmm-canary-{}", std::process::id()));
    std::fs::write(&canary, "host secret").expect("canary");
    let run = std::thread::spawn(move || {
        backend.run_caps(
            &Tool::command(["/bin/sleep", "5"]),
            &Caps::new(),
            &RunContext::default(),
        )
    });
    let (pid, status) = wait_for_my_qemu();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("")
            .to_string()
    };
    let uid: u32 = field("Uid:").parse().unwrap_or(0);
    assert_ne!(uid, 0, "QEMU runs as root: {status}");
    assert_ne!(
        uid,
        rustix::process::getuid().as_raw(),
        "QEMU runs as the embedder"
    );
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    assert_eq!(field("Seccomp:"), "2", "{status}");
    let ns = |p: &str, kind: &str| std::fs::read_link(format!("/proc/{p}/ns/{kind}")).ok();
    for kind in ["mnt", "net", "pid", "user"] {
        assert_ne!(
            ns(&pid, kind),
            ns("self", kind),
            "QEMU shares the {kind} namespace"
        );
    }
    // Its root is the jail's: the host file is not there, nor the host's home or /etc/shadow.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    assert!(
        !inside(&canary).exists(),
        "the VMM sees {}",
        canary.display()
    );
    assert!(
        !inside(Path::new("/etc/shadow")).exists(),
        "the VMM sees /etc/shadow"
    );
    let out = run.join().expect("run thread").expect("run");
    std::fs::remove_file(&canary).ok();
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
    assert!(
        out.receipt
            .enforced_for(Capability::Processes)
            .any(|e| e.detail.contains("VMM confined")),
        "{}",
        out.receipt
    );
}

#[test]
fn microvm_runs_commands_with_limits_and_leaves_nothing_behind() {
    let _turn = turn();
    let backend = backend();
    let before = strata_vm_dirs();
    let ctx = RunContext::default();

    // 1. stdout, stderr, exit code; the receipt; RNG sample one.
    let t0 = Instant::now();
    let out = backend
        .run_caps(
            &sh("echo hi; echo oops >&2; head -c 16 /dev/urandom | od -An -tx1; exit 3"),
            &Caps::new(),
            &ctx,
        )
        .expect("run 1");
    let cold = t0.elapsed();
    eprintln!(
        "cold boot to first command's exit: {cold:?}\n{}",
        out.receipt
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.starts_with("hi\n"),
        "{stdout:?} / {:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stderr, b"oops\n");
    assert_eq!(out.status, ExitStatus::Exited { code: 3 });
    let rng1 = stdout.lines().nth(1).unwrap_or_default().to_string();
    let r = &out.receipt;
    assert_eq!(r.backend, sandbox_core::BackendKind::Microvm);
    // The tool ran under the process backend's sandbox inside the guest.
    assert_eq!(
        r.layers,
        vec![
            sandbox_core::BackendKind::Microvm,
            sandbox_core::BackendKind::Process
        ],
        "{r}"
    );
    assert!(
        r.enforced_for(Capability::Pids)
            .any(|e| e.mechanism.starts_with("in the guest")),
        "processes limit not enforced inside the guest: {r}"
    );
    assert!(
        r.enforced_for(Capability::Syscalls)
            .any(|e| e.mechanism.contains("seccomp")),
        "no seccomp inside the guest: {r}"
    );
    assert!(r.has_kind(Capability::Net, Mechanism::Vm));
    assert!(
        r.has(Capability::Processes, "accel: tcg (emulated)")
            || r.has(Capability::Processes, "accel: kvm")
    );
    let kernel = std::fs::read_to_string(repo().join(".ci/cache/vm/kernel-version"))
        .expect("kernel-version");
    assert!(
        r.enforced_for(Capability::Processes)
            .any(|e| e.detail.contains(kernel.trim())),
        "{r}"
    );

    // 2. A signal exit; env; stdin; a host file is invisible; no network device;
    //    RNG sample two.
    let canary = std::env::temp_dir().join(format!("strata-vm-canary-{}", std::process::id()));
    std::fs::write(&canary, "host secret").expect("canary");
    let script = format!(
        "read line; echo \"in:$line env:$GREETING\"; \
         if cat {c} 2>/dev/null; then echo CANARY-VISIBLE; fi; \
         echo net:$(ls /sys/class/net | tr '\\n' ' '); \
         head -c 16 /dev/urandom | od -An -tx1; kill -9 $$",
        c = canary.display()
    );
    let caps = Caps::new()
        .env("GREETING", "hello")
        .stdin(b"from host\n".to_vec());
    let out = backend.run_caps(&sh(&script), &caps, &ctx).expect("run 2");
    std::fs::remove_file(&canary).ok();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status, ExitStatus::Signaled { signal: 9 }, "{stdout}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("in:from host env:hello"));
    assert!(
        !stdout.contains("CANARY-VISIBLE") && !stdout.contains("host secret"),
        "host file visible: {stdout}"
    );
    // The tool's own sandbox has no /sys (and an empty network namespace).
    assert_eq!(lines.next().map(str::trim), Some("net:"), "{stdout}");
    let rng2 = lines.next().unwrap_or_default().to_string();
    assert!(rng1.len() > 20 && rng2.len() > 20, "{rng1:?} {rng2:?}");
    assert_ne!(rng1, rng2, "two guests read the same random bytes");

    // 2b. The VM itself has no network device (seen by the guest's root, without the
    //     sandbox inside the guest).
    let direct = self::backend().layers(false);
    let out = direct
        .run_caps(&sh("ls /sys/class/net | tr '\\n' ' '"), &Caps::new(), &ctx)
        .expect("run 2b");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "lo",
        "the guest has a network device"
    );
    assert_eq!(out.receipt.layers, vec![sandbox_core::BackendKind::Microvm]);

    // 3. The wall-clock timeout ends the run with a typed limit; the VM is gone.
    let caps = Caps::new().timeout(Duration::from_secs(1));
    let t = Instant::now();
    let out = backend
        .run_caps(&Tool::command(["/bin/sleep", "60"]), &caps, &ctx)
        .expect("run 3");
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{:?}", out.status);
    assert!(out.timed_out());
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "timeout took {:?}",
        t.elapsed()
    );
    assert!(
        my_qemus().is_empty(),
        "qemu still running after the timeout: {:?}",
        my_qemus()
    );

    // 4. The output cap ends the run with a typed limit and keeps exactly the cap.
    let caps = Caps::new().limits(Limits {
        output: ByteSize::kib(4),
        ..Limits::default()
    });
    let out = backend
        .run_caps(
            &Tool::command(["/bin/sh", "-c", "while :; do echo flood; done"]),
            &caps,
            &ctx,
        )
        .expect("run 4");
    assert_eq!(out.limit(), Some(LimitKind::Output), "{:?}", out.status);
    assert_eq!(out.stdout.len(), 4096);
    assert!(out.stdout_truncated);

    // 5. A program that does not exist is an Exec error.
    let err = backend
        .run_caps(&Tool::command(["/no/such/program"]), &Caps::new(), &ctx)
        .expect_err("missing program");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");

    // Nothing left behind: no QEMU child, no private directory.
    assert!(
        my_qemus().is_empty(),
        "qemu processes left: {:?}",
        my_qemus()
    );
    let after = strata_vm_dirs();
    let leaked: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    assert!(leaked.is_empty(), "temp dirs left behind: {leaked:?}");
}

#[test]
fn microvm_refuses_what_it_cannot_enforce() {
    let _turn = turn();
    let backend = backend();
    let ctx = RunContext::default();
    let err = backend
        .run_caps(
            &Tool::script(ScriptLanguage::Javascript, "console.log(1)"),
            &Caps::new(),
            &ctx,
        )
        .expect_err("javascript");
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.to_string().contains("root file system"), "{err}");

    let err = backend
        .run_caps(&Tool::command(["true"]), &Caps::new().net(Net::Host), &ctx)
        .expect_err("net host");
    assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");

    // A file grant (grants are directories here) and too many grants: refused before
    // anything boots.
    let err = backend
        .run_caps(
            &Tool::command(["true"]),
            &Caps::new().read_only("/etc/hostname"),
            &ctx,
        )
        .expect_err("file grant");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("directories"), "{err}");
    let mut many = Caps::new();
    for i in 0..=sandbox_vm::grants::MAX_GRANTS {
        many.mounts.push(sandbox_core::Mount::new(
            "/etc".into(),
            format!("/g{i}").into(),
            sandbox_core::Access::ReadOnly,
        ));
    }
    let err = backend
        .run_caps(&Tool::command(["true"]), &many, &ctx)
        .expect_err("too many grants");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");

    let accel = backend.accel().expect("probe");
    eprintln!("accel: {} ({})", accel.accel.describe(), accel.reason);
    if accel.accel == sandbox_vm::Accel::Tcg {
        let strict = MicrovmBackend::new()
            .with_agent(agent_binary())
            .require_hardware_virtualization(true);
        let err = strict
            .run_caps(&Tool::command(["true"]), &Caps::new(), &ctx)
            .expect_err("hardware required");
        assert_eq!(err.kind(), ErrorKind::Unenforceable, "{err}");
        assert!(err.to_string().contains("tcg (emulated)"), "{err}");
    }
    let _ = Strictness::BestEffort;
}

/// The first field of a `/proc/PID/stat` line.
fn pid_of(stat: &str) -> String {
    stat.split(' ').next().unwrap_or_default().to_string()
}

#[test]
fn qemu_of_a_sigkilled_embedder_dies_with_it() {
    let _turn = turn();
    backend();
    // The killed embedder cannot remove its VM's temp dir: keep it out of the shared one.
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut inner = Command::new(std::env::current_exe().expect("exe"))
        .env("TMPDIR", tmp.path())
        .args([
            "--exact",
            "sigkilled_embedder_inner",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the embedder");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut qemus = Vec::new();
    while qemus.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        qemus = qemus_in(tmp.path());
    }
    assert!(!qemus.is_empty(), "the embedder never started QEMU");
    let pids: Vec<String> = qemus.iter().map(|s| pid_of(s)).collect();
    inner.kill().expect("SIGKILL the embedder");
    inner.wait().expect("reap the embedder");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("strata-vm-"))
        .collect();
    assert!(
        !left.is_empty(),
        "the killed embedder had no private directory"
    );
    // The next process's first run sweeps what the dead embedder left.
    assert!(sandbox_vm::leftovers::sweep(tmp.path()) >= 1);
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("tmp")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("strata-vm-"))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let gone = |pid: &String| {
        !Path::new("/proc").join(pid).exists()
            || std::fs::read_to_string(Path::new("/proc").join(pid).join("stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(gone) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        pids.iter().all(gone),
        "QEMU {pids:?} outlived its SIGKILLed embedder"
    );
}

#[test]
#[ignore = "the embedder that qemu_of_a_sigkilled_embedder_dies_with_it kills"]
fn sigkilled_embedder_inner() {
    let _ = backend().run_caps(&sh("sleep 600"), &Caps::new(), &RunContext::default());
}

#[test]
fn microvm_runs_python_and_no_run_sees_an_earlier_runs_writes() {
    let _turn = turn();
    let ctx = RunContext::default();
    let script = "import sys, time, os\n\
        print(sys.version_info[0], int(time.time()))\n\
        print('seen' if os.path.exists('/usr/planted') else 'clean')\n\
        try:\n    open('/usr/planted', 'w').write('x'); print('wrote')\n\
        except OSError as e:\n    print('refused', e.errno)";
    // Layered (the process backend's sandbox inside the guest): /usr is read-only. Direct
    // (the guest's root, writes land in the guest's RAM overlay): the next VM, restored
    // from the same snapshot, does not see them.
    let mut seen = Vec::new();
    for (backend, expect) in [
        (backend(), "refused 30"),
        (backend().layers(false), "wrote"),
        (backend().layers(false), "wrote"),
    ] {
        let out = backend
            .run_caps(
                &Tool::script(ScriptLanguage::Python, script),
                &Caps::new(),
                &ctx,
            )
            .expect("python");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status,
            ExitStatus::Exited { code: 0 },
            "{stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines = stdout.lines();
        let mut first = lines.next().unwrap_or_default().split(' ');
        assert_eq!(first.next(), Some("3"), "{stdout}");
        // A restored guest's clock is the host's, not the snapshot's.
        let guest_now: i64 = first.next().unwrap_or("0").parse().unwrap_or(0);
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        assert!(
            (host_now - guest_now).abs() < 600,
            "guest clock {guest_now}, host {host_now}"
        );
        seen.push(lines.next().unwrap_or_default().to_string());
        assert_eq!(lines.next(), Some(expect), "{stdout}");
        assert!(
            detail_has(&out.receipt, Capability::Fs, "python3="),
            "{}",
            out.receipt
        );
        assert!(
            detail_has(
                &out.receipt,
                Capability::Processes,
                "restored from a snapshot"
            ),
            "{}",
            out.receipt
        );
    }
    assert_eq!(seen, vec!["clean", "clean", "clean"]);
}

/// Whether an enforcement of `capability` mentions `text` in its detail.
fn detail_has(receipt: &sandbox_core::Receipt, capability: Capability, text: &str) -> bool {
    receipt
        .enforced_for(capability)
        .any(|e| e.detail.contains(text))
}

/// VM tests take turns: two TCG guests on two shared cores slow each other, and each test
/// checks that it left no QEMU behind.
static ONE_VM_TEST_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_VM_TEST_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A private directory for a grant test.
fn grant_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("strata-grant-{name}-"))
        .tempdir()
        .expect("grant dir")
}

/// Guest root remounts a read-only grant read-write, writes a file and the raw device, and
/// syncs: nothing is durable (the VMM opened the image readonly=on) and the host directory is
/// unchanged.
const REMOUNT_AND_WRITE: &str = r#"
import os, subprocess
print(open("/data/keep.txt").read())
r = subprocess.run(["mount", "-o", "remount,rw", "/data"], capture_output=True)
print("remount", r.returncode)
try:
    fd = os.open("/data/planted.txt", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"planted")
    os.fsync(fd)
    print("FILE-WRITE-DURABLE")
except OSError as e:
    print("file write failed", e.errno)
dev = None
for d in os.listdir("/sys/block"):
    try:
        if open(f"/sys/block/{d}/serial").read().strip() == "strata-g0":
            dev = "/dev/" + d
    except OSError:
        pass
try:
    fd = os.open(dev, os.O_WRONLY)
    os.write(fd, b"\0" * 4096)
    os.fsync(fd)
    print("DEVICE-WRITE-DURABLE")
except OSError as e:
    print("device write failed", e.errno)
"#;

#[test]
fn read_only_grant_survives_guest_root_remounting_it_read_write() {
    let _turn = turn();
    let backend = backend();
    let ctx = RunContext::default();
    let data = grant_dir("ro");
    std::fs::write(data.path().join("keep.txt"), "original").expect("write");
    let caps = Caps::new().mount(data.path(), "/data", sandbox_core::Access::ReadOnly);
    for (name, backend) in [
        ("restored", backend),
        ("cold", self::backend().snapshots(false)),
    ] {
        let out = backend
            .run_caps(
                &Tool::script(ScriptLanguage::Python, REMOUNT_AND_WRITE),
                &caps,
                &ctx,
            )
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        eprintln!("{name}: {stdout}");
        assert!(
            !stdout.contains("DURABLE"),
            "{name}: a write to a read-only grant was durable: {stdout}"
        );
        assert!(
            stdout.contains("original"),
            "{name}: {stdout} {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            detail_has(&out.receipt, Capability::Fs, "readonly=on"),
            "{}",
            out.receipt
        );
        let names: Vec<_> = std::fs::read_dir(data.path())
            .expect("read")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["keep.txt"],
            "{name}: the host directory changed"
        );
        assert_eq!(
            std::fs::read_to_string(data.path().join("keep.txt")).expect("read"),
            "original"
        );
    }
}

#[test]
fn read_write_grant_comes_back_through_the_filter() {
    use std::os::unix::fs::PermissionsExt;
    let _turn = turn();
    // The guest's root itself (no sandbox inside the guest, which refuses mknod and setuid
    // bits): the filter must hold against a compromised guest.
    let backend = backend().layers(false);
    let ctx = RunContext::default();
    let work = grant_dir("rw");
    let root = work.path();
    std::fs::write(root.join("edit.txt"), "before").expect("write");
    std::fs::write(root.join("delete.txt"), "bye").expect("write");
    std::fs::create_dir(root.join("olddir")).expect("mkdir");
    std::fs::write(root.join("olddir/inner.txt"), "x").expect("write");
    std::os::unix::fs::symlink("edit.txt", root.join("kept-link")).expect("symlink");
    let script = "set -e; cd /work; \
        printf 'after\\0bin' > edit.txt; rm delete.txt; rm -r olddir; \
        mkdir -p new/deep; echo made > new/deep/file.txt; \
        ln new/deep/file.txt hard.txt; \
        ln -s /etc/passwd escape-link; ln -sfn /etc kept-link2; \
        mkfifo fifo; \
        echo s > suid; chmod 4755 suid; \
        echo done";
    let caps = Caps::new().mount(root, "/work", sandbox_core::Access::ReadWrite);
    let out = backend
        .run_caps(&Tool::command(["/bin/sh", "-c", script]), &caps, &ctx)
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status,
        ExitStatus::Exited { code: 0 },
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", out.receipt);
    assert_eq!(
        std::fs::read(root.join("edit.txt")).expect("edit"),
        b"after\0bin",
        "binary-exact write back"
    );
    assert!(!root.join("delete.txt").exists(), "deletion not applied");
    assert!(
        !root.join("olddir").exists(),
        "directory deletion not applied"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("new/deep/file.txt")).expect("new"),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("hard.txt")).expect("hard link"),
        "made\n"
    );
    // The symbolic link the host already had is kept; new ones, the FIFO and the device
    // are refused; the setuid bit is dropped.
    assert_eq!(
        std::fs::read_link(root.join("kept-link")).expect("kept"),
        Path::new("edit.txt")
    );
    for refused in ["escape-link", "kept-link2", "fifo", "dev"] {
        assert!(
            std::fs::symlink_metadata(root.join(refused)).is_err(),
            "{refused} was written back"
        );
        assert!(
            out.receipt
                .denials
                .iter()
                .any(|d| d.detail.contains(refused)),
            "{refused} not listed as refused: {}",
            out.receipt
        );
    }
    let mode = std::fs::metadata(root.join("suid"))
        .expect("suid")
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "setuid bit kept: {mode:o}");

    // Through the sandbox inside the guest too: the grant is bound at the same path there.
    let out = self::backend()
        .run_caps(
            &Tool::command(["/bin/sh", "-c", "echo layered > /work/layered.txt"]),
            &caps,
            &ctx,
        )
        .expect("layered run");
    assert_eq!(
        out.status,
        ExitStatus::Exited { code: 0 },
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("layered.txt")).expect("layered"),
        "layered\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("new/deep/file.txt")).expect("kept"),
        "made\n",
        "a later run deleted what it did not touch"
    );
    assert!(
        out.receipt.has(Capability::Fs, "written back"),
        "{}",
        out.receipt
    );
    assert!(
        detail_has(&out.receipt, Capability::Fs, "refused"),
        "{}",
        out.receipt
    );
}

#[test]
fn grant_behind_a_planted_symlink_is_refused() {
    let _turn = turn();
    let backend = backend();
    let base = grant_dir("link");
    std::fs::create_dir(base.path().join("real")).expect("mkdir");
    std::os::unix::fs::symlink(base.path().join("real"), base.path().join("ws")).expect("symlink");
    let err = backend
        .run_caps(
            &Tool::command(["true"]),
            &Caps::new().mount(
                base.path().join("ws"),
                "/work",
                sandbox_core::Access::ReadWrite,
            ),
            &RunContext::default(),
        )
        .expect_err("symlinked grant");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{err}");
    assert!(err.to_string().contains("symbolic link"), "{err}");
}

#[test]
fn microvm_runs_an_oci_image_with_the_native_runtime_inside_the_guest() {
    let _turn = turn();
    let backend = backend();
    let script = repo().join("scripts/build-test-images.sh");
    let out = Command::new(&script)
        .output()
        .expect("build-test-images.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let image = repo().join(".ci/cache/images/busybox-oci");
    let caps = Caps::new().image(image.to_string_lossy());
    let out = backend
        .run_caps(
            &Tool::command([
                "/bin/sh",
                "-c",
                "echo from-image; ls /run/strata 2>&1 | head -1",
            ]),
            &caps,
            &RunContext::default(),
        )
        .expect("image run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status,
        ExitStatus::Exited { code: 0 },
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("from-image\n"), "{stdout}");
    // The guest's own files (the tools disk) are not in the container.
    assert!(!stdout.contains("tools"), "{stdout}");
    let r = &out.receipt;
    assert_eq!(
        r.layers,
        vec![
            sandbox_core::BackendKind::Microvm,
            sandbox_core::BackendKind::Container
        ],
        "{r}"
    );
    let seen = r.container.as_ref().expect("container receipt");
    assert_eq!(seen.image, image.to_string_lossy());
    assert!(seen.digest.starts_with("sha256:"), "{}", seen.digest);
}

#[test]
fn microvm_runs_wasm_in_the_wasm_backend_inside_the_guest() {
    let _turn = turn();
    let backend = backend();
    let module = repo().join("sandbox-wasm/tests/fixtures/hello.wat");
    let out = backend
        .run_caps(
            &Tool::wasm(&module, Vec::<String>::new()),
            &Caps::new(),
            &RunContext::default(),
        )
        .expect("wasm run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from wasm\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.receipt.layers,
        vec![
            sandbox_core::BackendKind::Microvm,
            sandbox_core::BackendKind::Wasm
        ]
    );
}

#[test]
fn pooled_vms_serve_one_run_each_and_leave_nothing_behind() {
    let _turn = turn();
    let before = strata_vm_dirs();
    {
        let backend = backend().pool_size(1).layers(false);
        assert_eq!(backend.prewarm(&Caps::new()).expect("prewarm"), 1);
        assert_eq!(backend.idle_vmm_pids().len(), 1);
        let mut seen = Vec::new();
        for _ in 0..2 {
            // Wait for the background refill, so the run takes a pooled VM.
            let deadline = Instant::now() + Duration::from_secs(60);
            while backend.idle_vmm_pids().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let out = backend
                .run_caps(
                    &sh("cat /tmp/mark 2>/dev/null; echo used > /tmp/mark; head -c 16 /dev/urandom | od -An -tx1"),
                    &Caps::new(),
                    &RunContext::default(),
                )
                .expect("pooled run");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(!stdout.contains("used"), "a pooled VM was reused: {stdout}");
            assert!(
                detail_has(&out.receipt, Capability::Processes, "ahead of the run"),
                "{}",
                out.receipt
            );
            seen.push(stdout);
        }
        assert_ne!(
            seen[0], seen[1],
            "two pooled VMs read the same random bytes"
        );
    }
    // The backend is gone: its idle VMs with it (the refill thread may finish one first).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !my_qemus().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(my_qemus().is_empty(), "pooled QEMU left: {:?}", my_qemus());
    let leaked: Vec<_> = strata_vm_dirs()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(leaked.is_empty(), "temp dirs left behind: {leaked:?}");
}

#[test]
fn streamed_stdin_reaches_the_tool_while_it_runs() {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    let _turn = turn();
    let backend = backend();
    let (reader, writer) = std::io::pipe().expect("pipe");
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let sink_seen = Arc::clone(&seen);
    let ctx = RunContext {
        stdin: Some(Arc::new(sandbox_core::StdinSource::from_fd(
            std::os::fd::OwnedFd::from(reader),
        ))),
        sink: Some(Arc::new(move |_: sandbox_core::Stream, chunk: &[u8]| {
            sink_seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(chunk)
        })),
        ..RunContext::default()
    };
    // The second line is written only after the tool has answered the first: a backend
    // that read stdin whole before starting the tool would never finish.
    let feeder = std::thread::spawn(move || {
        let mut writer = writer;
        writer.write_all(b"first\n").expect("write");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !String::from_utf8_lossy(&seen.lock().unwrap_or_else(|p| p.into_inner()))
            .contains("got first")
        {
            assert!(
                Instant::now() < deadline,
                "the tool never answered the first line"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        writer.write_all(b"second\n").expect("write");
    });
    let out = backend
        .run_caps(
            &sh("while read l; do echo \"got $l\"; done"),
            &Caps::new(),
            &ctx,
        )
        .expect("run");
    feeder.join().expect("feeder");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got first\ngot second\n"
    );
    assert_eq!(out.status, ExitStatus::Exited { code: 0 });
}

/// The run directories of this process (their owner file names it).
fn my_run_dirs() -> Vec<PathBuf> {
    let me = sandbox_vm::leftovers::this_process();
    strata_vm_dirs()
        .into_iter()
        .filter(|d| std::fs::read_to_string(d.join("owner")).is_ok_and(|o| o == me))
        .collect()
}

/// Round 3: `$TMPDIR/strata-vm-*` was 0755 and the grant images in it 0644, so any local
/// user could read a root-only granted folder's contents while a run went on. Every run
/// directory is 0700 and everything in it 0600; another uid cannot read a grant's image.
#[test]
fn microvm_run_files_are_private_to_the_embedder() {
    use std::os::unix::process::CommandExt;
    let _turn = turn();
    let backend = backend();
    let ro = grant_dir("private-ro");
    std::fs::write(ro.path().join("secret.txt"), "root-only-contents").expect("write");
    let rw = grant_dir("private-rw");
    let caps = Caps::new()
        .mount(ro.path(), "/ro", sandbox_core::Access::ReadOnly)
        .mount(rw.path(), "/rw", sandbox_core::Access::ReadWrite);
    let runner = std::thread::spawn(move || {
        backend.run_caps(
            &sh("cat /ro/secret.txt; echo out > /rw/out.txt; sleep 4"),
            &caps,
            &RunContext::default(),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut checked = 0;
    while Instant::now() < deadline && !runner.is_finished() {
        for dir in my_run_dirs() {
            let images: Vec<PathBuf> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ext4"))
                .collect();
            if images.is_empty() {
                continue;
            }
            let wide = sandbox_os::private::wider_than_private(&dir).unwrap_or_default();
            assert!(wide.is_empty(), "wider than private: {wide:?}");
            if is_root() {
                for image in &images {
                    let out = Command::new("cat")
                        .arg(image)
                        .uid(65534)
                        .gid(65534)
                        .output()
                        .expect("cat as nobody");
                    assert!(!out.status.success(), "nobody read {}", image.display());
                }
            }
            checked += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = runner.join().expect("runner").expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "root-only-contents");
    assert!(
        checked > 0,
        "no run directory with images was seen while the run went on"
    );
    if !is_root() {
        eprintln!("NOTE: not root: modes checked, the read from another uid is skipped");
    }
    assert!(my_run_dirs().is_empty(), "left behind: {:?}", my_run_dirs());
}

/// Round 3: a concurrent run with the same folder read-write swaps a file of a read-only
/// grant for a symlink to a root-only host file while the grant's image is built; the VM
/// must never see that file's contents (the image is built from a private copy made
/// through descriptors, so at worst it holds the link itself).
#[test]
fn a_grant_file_swapped_for_a_link_to_a_root_only_file_never_reaches_the_guest() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let _turn = turn();
    let backend = backend();
    let secret_dir = grant_dir("secret");
    let secret = secret_dir.path().join("shadow");
    std::fs::write(&secret, "TOP-SECRET-CANARY").expect("write");
    let grant = grant_dir("swapped");
    let root = grant.path().to_path_buf();
    std::fs::write(root.join("f"), "plain").expect("write");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, root, secret) = (stop.clone(), root.clone(), secret.clone());
        std::thread::spawn(move || {
            let mut linked = false;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(root.join("f"));
                if linked {
                    let _ = std::fs::write(root.join("f"), "plain");
                } else {
                    let _ = std::os::unix::fs::symlink(&secret, root.join("f"));
                }
                linked = !linked;
            }
        })
    };
    let caps = Caps::new().mount(&root, "/data", sandbox_core::Access::ReadOnly);
    for _ in 0..4 {
        let out = backend
            .run_caps(&sh("cat /data/f 2>&1; true"), &caps, &RunContext::default())
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("TOP-SECRET"), "the guest read {stdout}");
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Round 3: a tool past `--memory 256M` ended as `internal: the sandbox inside the guest
/// reported nothing` (exit 125): the guest's OOM killer took the layer inside. The agent
/// and the layer inside are never its first pick, and the run ends with the typed memory
/// limit, with and without the layer inside.
#[test]
fn a_memory_bomb_in_the_guest_ends_at_the_memory_limit() {
    let _turn = turn();
    let bomb = "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n";
    for (name, backend) in [("layered", backend()), ("plain", backend().layers(false))] {
        let mut caps = Caps::new();
        caps.limits.memory = ByteSize::mib(256);
        // The memory limit must end the run, not the clock: on a loaded host an emulated
        // guest can take longer than the 30 s default to fill 256 MiB.
        caps.limits.timeout = std::time::Duration::from_secs(300);
        let out = backend
            .run_caps(
                &Tool::script(ScriptLanguage::Python, bomb),
                &caps,
                &RunContext::default(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            out.limit(),
            Some(LimitKind::Memory),
            "{name}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.cli_exit_code(), 137, "{name}");
        assert!(
            out.receipt
                .denials
                .iter()
                .any(|d| d.capability == Capability::Memory),
            "{name}: {}",
            out.receipt
        );
    }
}
