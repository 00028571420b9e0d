//! Live sandboxes on the microVM backend through the CLI (`strata start --backend microvm`):
//! one VM that every exec runs in, held by the supervisor. Named after what they stop: a
//! process that outlives its sandbox (the VM must go with it), a paused VM that still
//! runs, state that does not carry from one exec to the next (a VM per exec in disguise),
//! and a feature this backend lacks that silently does something else.
//! Needs QEMU and the guest (`scripts/build-vm-guest.sh`, run here), and `strata-helper`,
//! `strata-live` and `strata-guest-agent` next to `strata`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{exe, text, wait_until, Live};

fn build_guest() {
    let repo =
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("..");
    let built = Command::new(repo.join("scripts/build-vm-guest.sh"))
        .output()
        .expect("scripts/build-vm-guest.sh");
    assert!(
        built.status.success(),
        "build-vm-guest (needs qemu-system-x86 and linux-image-cloud-amd64): {}",
        text(&built.stderr)
    );
    let agent = exe().with_file_name("strata-guest-agent");
    assert!(agent.exists(), "{} is missing", agent.display());
}

/// Host processes whose parent chain reaches `ancestor`.
fn descendants_of(ancestor: u32) -> Vec<(u32, String)> {
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let mut at = pid;
        for _ in 0..64 {
            match parent(at) {
                Some(p) if p == ancestor => {
                    let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                    found.push((pid, text(&cmd).replace('\0', " ")));
                    break;
                }
                Some(p) if p > 1 => at = p,
                _ => break,
            }
        }
    }
    found
}

/// The `ls --json` entry of sandbox `id`.
fn listed(live: &Live, id: &str) -> serde_json::Value {
    let out = live.strata(&["ls", "--json"]);
    assert!(out.status.success(), "ls: {}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ls json");
    list.as_array()
        .expect("array")
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} listed: {list}"))
        .clone()
}

/// A shell loop that burns CPU and prints a counter now and then.
const BUSY: &str = "i=0; while :; do i=$((i+1)); [ $((i % 2000)) = 0 ] && echo $i; done";

#[test]
fn a_live_microvm_keeps_one_vm_for_every_exec_pauses_it_and_leaves_nothing_after_stop() {
    build_guest();
    let live = Live::new();
    let out = live.strata(&[
        "start",
        "--backend",
        "microvm",
        "--publish",
        "8000",
        "--json",
    ]);
    assert!(out.status.success(), "start: {}", text(&out.stderr));
    let started: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(started["backend"], "microvm", "{started}");
    let id = started["id"].as_str().expect("id").to_string();
    let enforced = started["receipt"]["enforced"].to_string();
    for line in [
        "live VM",
        "VM switched off",
        "guest RAM",
        "RLIMIT_NOFILE in the guest",
    ] {
        assert!(enforced.contains(line), "{line} in {enforced}");
    }
    assert!(
        !enforced.contains("host deadline"),
        "no one-run deadline is claimed: {enforced}"
    );
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(live.state_dir().join(&id).join("info.json")).expect("info.json"),
    )
    .expect("info json");
    let supervisor = info["supervisor_pid"].as_u64().expect("supervisor pid") as u32;
    let vmms: Vec<(u32, String)> = descendants_of(supervisor)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("qemu-system"))
        .collect();
    assert_eq!(vmms.len(), 1, "one VMM for the sandbox: {vmms:?}");

    // One VM: what one exec leaves, the next sees, in the same boot.
    let script = "echo kept > /tmp/note; cat /proc/sys/kernel/random/boot_id";
    let first = live.strata(&["exec", &id, "--", "sh", "-c", script]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let second = live.strata(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "cat /tmp/note /proc/sys/kernel/random/boot_id",
    ]);
    assert_eq!(
        text(&second.stdout),
        format!("kept\n{}", text(&first.stdout)),
        "{}",
        text(&second.stderr)
    );
    // Exit codes, the environment and the working directory pass through.
    let out = live.strata(&[
        "exec",
        &id,
        "--env",
        "GREETING=hi",
        "--workdir",
        "/proc",
        "--",
        "sh",
        "-c",
        "echo $GREETING $(pwd) >&2; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("hi /proc"),
        "{}",
        text(&out.stderr)
    );
    // Stdin streams in and is ended.
    let mut child = Command::new(exe())
        .args(["exec", &id, "--stdin", "--", "sh", "-c", "wc -c; echo done"])
        .env("STRATA_STATE_DIR", live.state_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exec --stdin");
    let input = vec![b'x'; 700 * 1024];
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("write stdin");
    let out = child.wait_with_output().expect("exec --stdin");
    assert_eq!(
        text(&out.stdout).split_whitespace().collect::<Vec<_>>(),
        [input.len().to_string().as_str(), "done"],
        "{}",
        text(&out.stderr)
    );
    // A program that is not there: typed, nothing runs.
    let out = live.strata(&["exec", &id, "--", "/no/such/program"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("/no/such/program"),
        "{}",
        text(&out.stderr)
    );

    // Detached: ps, logs, kill.
    let out = live.strata(&["exec", &id, "--detach", "--", "sh", "-c", BUSY]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pid = text(&out.stdout).trim().to_string();
    let logs = |live: &Live| text(&live.strata(&["logs", &id, &pid]).stdout);
    wait_until("the loop prints", Duration::from_secs(60), || {
        !logs(&live).is_empty()
    });
    let out = live.strata(&["ps", &id]);
    assert!(
        text(&out.stdout)
            .lines()
            .any(|l| l.starts_with("running") && l.ends_with(&format!(" {pid}"))),
        "{}",
        text(&out.stdout)
    );

    // Paused: the VMM's CPU time stands still, no output, logs still readable.
    let out = live.strata(&["pause", &id]);
    assert!(out.status.success(), "pause: {}", text(&out.stderr));
    assert_eq!(listed(&live, &id)["state"], "paused");
    std::thread::sleep(Duration::from_millis(300));
    let (cpu_before, logs_before) = (listed(&live, &id)["cpu_us"].as_u64(), logs(&live));
    std::thread::sleep(Duration::from_secs(1));
    let (cpu_after, logs_after) = (listed(&live, &id)["cpu_us"].as_u64(), logs(&live));
    let (before, after) = (cpu_before.expect("cpu_us"), cpu_after.expect("cpu_us"));
    assert_eq!(logs_before, logs_after, "no output while paused");
    assert!(
        after - before < 100_000,
        "a stopped VM used {} µs of CPU in a second (a running one uses about 1,000,000 here)",
        after - before
    );
    let out = live.strata(&["resume", &id]);
    assert!(out.status.success(), "resume: {}", text(&out.stderr));
    wait_until("the loop prints again", Duration::from_secs(60), || {
        logs(&live).len() > logs_after.len()
    });
    let cpu = listed(&live, &id)["cpu_us"].as_u64().expect("cpu_us");
    assert!(cpu > after, "it runs again");
    // The guest clock is the host's again after the pause.
    let out = live.strata(&["exec", &id, "--", "date", "+%s"]);
    let guest_now: i64 = text(&out.stdout).trim().parse().expect("date");
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(
        (guest_now - host_now).abs() <= 5,
        "guest {guest_now}, host {host_now}"
    );
    let out = live.strata(&["kill", &id, &pid, "--signal", "KILL"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["logs", &id, &pid, "--follow"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // A published port reaches a server in the guest.
    let host_port = started["ports"][0]["host_port"]
        .as_u64()
        .unwrap_or_else(|| panic!("a published port: {started}")) as u16;
    let server =
        "cd /tmp && echo served > index.txt && exec python3 -m http.server 8000 --bind 127.0.0.1";
    let out = live.strata(&["exec", &id, "--detach", "--", "sh", "-c", server]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut body = String::new();
    wait_until("the guest server answers", Duration::from_secs(60), || {
        body = fetch(host_port, "/index.txt");
        body.contains("served")
    });
    assert!(body.starts_with("HTTP/1.0 200"), "{body}");
    // A body larger than the window many times over arrives whole.
    let big = live.strata(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "head -c 3000000 /dev/zero | tr '\\0' a > /tmp/big.txt",
    ]);
    assert!(big.status.success(), "{}", text(&big.stderr));
    let response = fetch(host_port, "/big.txt");
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    assert_eq!(body.len(), 3_000_000, "the whole body");
    assert!(body.bytes().all(|b| b == b'a'), "the body unchanged");

    // Files in and out: a file, and a tree whose symlink is not followed out.
    let out = live.strata(&["cp", "/etc/hostname", &format!("{id}:/tmp/host-name")]);
    assert!(out.status.success(), "cp in: {}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--", "cat", "/tmp/host-name"]);
    assert_eq!(
        out.stdout,
        std::fs::read("/etc/hostname").expect("hostname"),
        "{}",
        text(&out.stderr)
    );
    let tree = "mkdir -p /tmp/t/sub && echo one > /tmp/t/a && echo two > /tmp/t/sub/b && ln -s /etc/passwd /tmp/t/link";
    let out = live.strata(&["exec", &id, "--", "sh", "-c", tree]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let host = tempfile::tempdir().expect("tempdir");
    let copy = host.path().join("out");
    let out = live.strata(&["cp", &format!("{id}:/tmp/t"), copy.to_str().expect("utf-8")]);
    assert!(out.status.success(), "cp out: {}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(copy.join("a")).expect("a"), "one\n");
    assert_eq!(
        std::fs::read_to_string(copy.join("sub/b")).expect("sub/b"),
        "two\n"
    );
    assert!(
        std::fs::symlink_metadata(copy.join("link")).is_err(),
        "a guest symlink is not copied out"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(copy.join("a"))
        .expect("a")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "what Strata makes on the host is owner-only"
    );
    let out = live.strata(&["cp", &format!("{id}:/no/such"), "./x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    // A process that left its session still ends with the VM at stop.
    let out = live.strata(&[
        "exec",
        &id,
        "--detach",
        "--",
        "sh",
        "-c",
        "setsid sleep 1000 & echo escaped",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    for (pid, cmd) in &vmms {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the VMM {pid} ({cmd}) outlived stop"
        );
    }
    assert!(
        !Path::new(&format!("/proc/{supervisor}")).exists()
            || std::fs::read_to_string(format!("/proc/{supervisor}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "the supervisor ended"
    );
    assert!(live.sandbox_dirs().is_empty(), "no sandbox state left");
}

/// An HTTP/1.0 GET of `path` on the host's loopback `port`: the whole response.
fn fetch(port: u16, path: &str) -> String {
    use std::io::Read;
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = write!(stream, "GET {path} HTTP/1.0\r\n\r\n");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    text(&response)
}

/// File grants are disks: a read-only one is readable and not writable in the guest; a
/// read-write one is a private copy, so the host directory is unchanged until the sandbox
/// stops, and then holds what the guest wrote (a symlink the guest planted is refused by the
/// write-back filter).
#[test]
fn a_live_microvm_writes_a_read_write_grant_back_only_at_stop() {
    build_guest();
    let host = tempfile::tempdir().expect("tempdir");
    let (ro, rw) = (host.path().join("ro"), host.path().join("rw"));
    for dir in [&ro, &rw] {
        std::fs::create_dir(dir).expect("mkdir");
    }
    std::fs::write(ro.join("input.txt"), "read me\n").expect("write");
    std::fs::write(rw.join("old.txt"), "old\n").expect("write");
    let live = Live::new();
    let ro_arg = format!("{}:/data", ro.display());
    let rw_arg = format!("{}:/work", rw.display());
    let audit = host.path().join("audit.jsonl");
    let audit_arg = audit.to_str().expect("utf-8");
    let id = live.start(&[
        "--backend",
        "microvm",
        "--ro",
        &ro_arg,
        "--rw",
        &rw_arg,
        "--audit",
        audit_arg,
    ]);
    let out = live.strata(&["exec", &id, "--", "cat", "/data/input.txt"]);
    assert_eq!(text(&out.stdout), "read me\n", "{}", text(&out.stderr));
    let out = live.strata(&["exec", &id, "--", "sh", "-c", "echo x > /data/new.txt"]);
    assert!(!out.status.success(), "a read-only grant is not writable");
    let script =
        "echo new > /work/new.txt && echo changed > /work/old.txt && ln -s /etc/passwd /work/link";
    let out = live.strata(&["exec", &id, "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !rw.join("new.txt").exists(),
        "nothing comes back before stop"
    );
    assert_eq!(
        std::fs::read_to_string(rw.join("old.txt")).expect("old"),
        "old\n"
    );
    let out = live.strata(&["stop", &id]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(rw.join("new.txt")).expect("new"),
        "new\n"
    );
    assert_eq!(
        std::fs::read_to_string(rw.join("old.txt")).expect("old"),
        "changed\n"
    );
    assert!(
        std::fs::symlink_metadata(rw.join("link")).is_err(),
        "a planted symlink is not written back"
    );
    assert!(!ro.join("new.txt").exists());
    assert!(live.sandbox_dirs().is_empty(), "nothing left");
    // The write-back is in the sandbox's audit log, naming the host directory.
    let log = std::fs::read_to_string(&audit).expect("audit log");
    let line = log
        .lines()
        .find(|l| l.contains("written back"))
        .unwrap_or_else(|| panic!("a write-back record in {log}"));
    assert!(line.contains(&rw.display().to_string()), "{line}");
    assert!(
        line.contains("refused"),
        "the planted symlink is named: {line}"
    );
}
