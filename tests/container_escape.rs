//! Escape tests of the container backend's native runtime, named after the attack they
//! stop (SECURITY.md classes A–K where they apply to images). Hostile layers are generated
//! here with the `tar` crate; the host side checks its canaries.

#[path = "common/mod.rs"]
mod common;
mod container_common;

use std::path::Path;
use std::sync::Arc;

use container_common::*;
use strata::{Caps, ContainerRuntime, ErrorKind, LimitKind, Tool};

const NATIVE: ContainerRuntime = ContainerRuntime::Native;
const SECRET: &str = "canary-container-do-not-leak";

/// A host directory with a secret file.
struct Canary {
    dir: tempfile::TempDir,
}

impl Canary {
    fn new() -> Self {
        let dir = tempdir();
        std::fs::write(dir.path().join("secret.txt"), SECRET).expect("canary");
        Canary { dir }
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn secret(&self) -> String {
        self.dir.path().join("secret.txt").display().to_string()
    }
    fn intact(&self) -> bool {
        std::fs::read_to_string(self.dir.path().join("secret.txt")).is_ok_and(|s| s == SECRET)
            && std::fs::read_dir(self.dir.path()).map_or(0, |d| d.count()) == 1
    }
}

/// An OCI image of busybox plus `extra` layers, in a temp dir.
struct Fixture {
    _dir: tempfile::TempDir,
    cache: tempfile::TempDir,
    image: String,
}

impl Fixture {
    fn new(extra: Vec<Vec<u8>>, config: Config<'_>) -> Self {
        let dir = tempdir();
        let image = dir.path().join("img");
        std::fs::create_dir(&image).expect("img");
        let mut layers = vec![busybox_layer()];
        layers.extend(extra);
        write_oci(&image, &layers, &config);
        Fixture {
            _dir: dir,
            cache: tempdir(),
            image: image.display().to_string(),
        }
    }
    fn with_layers(extra: Vec<Vec<u8>>) -> Self {
        Fixture::new(
            extra,
            Config {
                env: &["PATH=/bin"],
                ..Config::default()
            },
        )
    }
    fn caps(&self) -> Caps {
        caps(&self.image, NATIVE)
    }
    fn run(&self, tool: &Tool) -> strata::Result<strata::RunOutput> {
        run_cached(self.cache.path(), tool, &self.caps())
    }
    /// Files left in the cache's unpack area (must be none after any run, good or bad).
    fn leftovers(&self) -> usize {
        std::fs::read_dir(self.cache.path().join("tmp")).map_or(0, |d| d.count())
    }
    /// Whether the cache holds a finished entry.
    fn cached_roots(&self) -> Vec<std::path::PathBuf> {
        std::fs::read_dir(self.cache.path().join("v1"))
            .map(|d| d.flatten().map(|e| e.path().join("root")).collect())
            .unwrap_or_default()
    }
}

fn refused(fixture: &Fixture, what: &str) -> strata::Error {
    let err = fixture
        .run(&sh("echo ran"))
        .expect_err(&format!("{what} must be refused"));
    assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{what}: {err}");
    assert_eq!(fixture.leftovers(), 0, "{what}: unpack leftovers");
    assert!(
        fixture.cached_roots().is_empty(),
        "{what}: a refused image must not be cached"
    );
    err
}

// ---- A/G: hostile layers at unpack ----

#[test]
fn layer_entry_with_dotdot_name_is_refused_at_unpack() {
    let canary = Canary::new();
    let escape = format!("../../../../../..{}/escaped", canary.path().display());
    let fixture = Fixture::with_layers(vec![layer(&[Entry::RawFile(escape.as_bytes(), b"pwned")])]);
    let err = refused(&fixture, "a ../ entry");
    assert!(err.to_string().contains(".."), "{err}");
    assert!(canary.intact());
}

#[test]
fn layer_entry_with_absolute_name_is_refused_at_unpack() {
    let canary = Canary::new();
    let abs = format!("{}/escaped", canary.path().display());
    let fixture = Fixture::with_layers(vec![layer(&[Entry::RawFile(abs.as_bytes(), b"pwned")])]);
    let err = refused(&fixture, "an absolute entry");
    assert!(err.to_string().contains("absolute"), "{err}");
    assert!(canary.intact());
}

#[test]
fn absolute_symlink_then_file_write_through_it_stays_in_the_image() {
    let canary = Canary::new();
    // A symlink to the host's secret, then a file of the same name: the file replaces the
    // link, nothing is written through it.
    let fixture = Fixture::with_layers(vec![
        layer(&[Entry::Symlink("etc/evil", &canary.secret())]),
        layer(&[Entry::File("etc/evil", b"pwned-file", 0o644)]),
    ]);
    let out = fixture
        .run(&sh("cat /etc/evil"))
        .expect("a contained symlink is fine");
    assert_eq!(ok_stdout(&out), "pwned-file");
    assert!(
        canary.intact(),
        "nothing written through the symlink on the host"
    );
}

#[test]
fn file_under_a_symlink_to_a_host_directory_is_refused_or_stays_in_the_image() {
    let canary = Canary::new();
    let fixture = Fixture::with_layers(vec![
        layer(&[Entry::Symlink(
            "hostdir",
            &canary.path().display().to_string(),
        )]),
        layer(&[Entry::File("hostdir/planted", b"pwned-dir", 0o644)]),
    ]);
    // The link resolves inside the image (where that directory does not exist): refused.
    refused(&fixture, "a file beneath a symlink to a host directory");
    assert!(canary.intact(), "nothing planted in the host directory");
}

#[test]
fn absolute_symlink_in_the_image_resolves_inside_the_image_at_run_time() {
    let canary = Canary::new();
    let fixture =
        Fixture::with_layers(vec![layer(&[Entry::Symlink("etc/leak", &canary.secret())])]);
    let out = fixture
        .run(&sh(
            "cat /etc/leak 2>&1; echo x > /etc/leak 2>&1; echo rc=$?",
        ))
        .expect("run");
    let text = stdout(&out);
    assert!(!text.contains(SECRET), "{text}");
    assert!(canary.intact());
}

#[test]
fn hard_link_to_a_host_file_is_refused_at_unpack() {
    for target in [
        "/etc/shadow",
        "../../../../etc/shadow",
        "etc/not-in-the-image",
    ] {
        let fixture = Fixture::with_layers(vec![layer(&[Entry::HardLink("stolen", target)])]);
        let err = refused(&fixture, &format!("a hard link to {target}"));
        assert!(err.to_string().contains("hard link"), "{target}: {err}");
    }
}

#[test]
fn hard_link_through_a_symlinked_parent_stays_in_the_image() {
    let canary = Canary::new();
    let fixture = Fixture::with_layers(vec![layer(&[
        Entry::Symlink("hostdir", &canary.path().display().to_string()),
        Entry::HardLink("stolen", "hostdir/secret.txt"),
    ])]);
    // The parent resolves inside the image, where there is no secret: refused.
    refused(
        &fixture,
        "a hard link through a symlink to a host directory",
    );
    assert!(canary.intact());
}

#[test]
fn device_nodes_in_layers_are_not_created() {
    let fixture = Fixture::with_layers(vec![layer(&[
        Entry::CharDevice("evil-mem", 1, 1),
        Entry::CharDevice("evil-null", 1, 3),
        Entry::File("marker", b"ok", 0o644),
    ])]);
    let out = fixture
        .run(&sh(
            "cat /marker; test -e /evil-mem && echo mem; test -e /evil-null && echo null; true",
        ))
        .expect("run");
    assert_eq!(ok_stdout(&out), "ok");
    for root in fixture.cached_roots() {
        assert!(!root.join("evil-mem").exists() && !root.join("evil-null").exists());
    }
}

#[test]
fn whiteout_of_a_path_outside_the_layer_is_refused_or_contained() {
    let canary = Canary::new();
    let dotdot = format!("../../../../..{}/.wh.secret.txt", canary.path().display());
    let fixture = Fixture::with_layers(vec![layer(&[Entry::RawFile(dotdot.as_bytes(), b"")])]);
    refused(&fixture, "a whiteout with ..");
    assert!(canary.intact());
    // Through a symlink to the host directory: resolved inside the image.
    let fixture = Fixture::with_layers(vec![
        layer(&[Entry::Symlink(
            "hostdir",
            &canary.path().display().to_string(),
        )]),
        layer(&[Entry::File("hostdir/.wh.secret.txt", b"", 0o644)]),
    ]);
    let _ = fixture.run(&sh("true"));
    assert!(canary.intact(), "a whiteout never deletes a host file");
}

#[test]
fn setuid_bits_in_layers_are_dropped() {
    let fixture = Fixture::with_layers(vec![layer(&[Entry::File(
        "suid-sh",
        b"#!/bin/sh\nid -u\n",
        0o4755,
    )])]);
    let out = fixture.run(&sh("stat -c %a /suid-sh")).expect("run");
    assert_eq!(ok_stdout(&out), "755\n");
}

#[test]
fn tampered_layer_is_refused_by_its_digest() {
    let fixture = Fixture::with_layers(vec![layer(&[Entry::File("f", b"original", 0o644)])]);
    // Flip a byte of the last layer blob (the largest is busybox; find the small one).
    let blobs = Path::new(&fixture.image).join("blobs/sha256");
    let mut tampered = false;
    for entry in std::fs::read_dir(&blobs).expect("blobs").flatten() {
        let mut data = std::fs::read(entry.path()).expect("blob");
        if let Some(pos) = data.windows(8).position(|w| w == b"original") {
            data[pos] = b'O';
            std::fs::write(entry.path(), data).expect("write");
            tampered = true;
        }
    }
    assert!(tampered);
    let err = refused(&fixture, "a tampered layer");
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn corrupt_layer_stream_is_refused_and_leaves_nothing() {
    let mut bad = layer(&[Entry::File("f", &[7u8; 4096], 0o644)]);
    bad.truncate(700);
    let fixture = Fixture::with_layers(vec![bad]);
    refused(&fixture, "a truncated layer");
}

// ---- A/I: the image's own /dev, /proc, /tmp ----

#[test]
fn image_dev_null_and_proc_symlinks_do_not_redirect_writes() {
    let fixture = Fixture::with_layers(vec![layer(&[
        Entry::Dir("dev"),
        Entry::Symlink("dev/null", "/etc/captured"),
        Entry::Symlink("proc", "/etc/fakeproc"),
        Entry::Symlink("tmp", "/etc"),
        Entry::Dir("etc/fakeproc"),
    ])]);
    let out = fixture
        .run(&sh(
            "echo secret > /dev/null; test -e /etc/captured && echo captured; \
             test -c /dev/null && echo chardev; test -L /proc && echo proclink; \
             test -e /proc/self/status && echo realproc; touch /tmp/x && test ! -e /etc/x && echo tmpok",
        ))
        .expect("run");
    assert_eq!(ok_stdout(&out), "chardev\nrealproc\ntmpok\n");
}

#[test]
fn image_dev_as_a_symlink_is_replaced_by_strata_dev() {
    let fixture = Fixture::with_layers(vec![layer(&[
        Entry::Dir("hostish"),
        Entry::Symlink("dev", "/hostish"),
    ])]);
    let out = fixture
        .run(&sh("ls /dev | tr '\\n' ' '; ls /hostish | wc -l"))
        .expect("run");
    let text = ok_stdout(&out);
    assert!(text.contains("null") && text.contains("urandom"), "{text}");
    assert!(
        text.trim_end().ends_with('0'),
        "nothing created through the link: {text}"
    );
}

#[test]
fn proc_is_masked_and_sys_is_empty_in_the_image() {
    let out = run(
        &sh("for f in kcore keys timer_list sched_debug kallsyms; do test -e /proc/$f && \
             echo $f=$(cat /proc/$f 2>/dev/null | wc -c); done; \
             echo x > /proc/sys/kernel/hostname 2>/dev/null || echo sys-ro; echo sys=$(ls /sys | wc -l)"),
        &caps(&images().python_oci(), NATIVE),
    );
    let text = ok_stdout(&out);
    for line in text.lines() {
        if let Some((name, bytes)) = line.split_once('=') {
            assert_eq!(bytes, "0", "/proc/{name} or /sys is not empty: {text}");
        }
    }
    assert!(text.contains("sys-ro\n"), "{text}");
}

// ---- B: docker.sock and the network ----

#[test]
fn docker_socket_is_never_visible_inside() {
    // Even when the image itself carries a docker.sock symlink to the host's socket path.
    let fixture = Fixture::with_layers(vec![layer(&[
        Entry::Dir("var"),
        Entry::Dir("var/run"),
        Entry::Symlink("var/run/docker.sock", "/run/docker.sock"),
    ])]);
    let out = fixture
        .run(&sh(
            "for p in /var/run/docker.sock /run/docker.sock /run/podman/podman.sock; do \
             test -S $p && echo visible $p; done; echo done",
        ))
        .expect("run");
    assert_eq!(ok_stdout(&out), "done\n");
    let out = run(
        &Tool::command([
            "python3",
            "-c",
            "import socket\nfor p in ['/var/run/docker.sock','/run/docker.sock']:\n  s=socket.socket(socket.AF_UNIX)\n  try:\n    s.connect(p); print('connected', p)\n  except OSError as e:\n    print('refused', e.errno)",
        ]),
        &caps(&images().python_oci(), NATIVE),
    );
    assert_eq!(ok_stdout(&out), "refused 2\nrefused 2\n");
}

#[test]
fn cannot_connect_to_host_loopback_listener_from_a_container() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let out = run(
        &Tool::command([
            "python3",
            "-c",
            &format!("import socket\ntry:\n  socket.create_connection(('127.0.0.1',{port}),timeout=2); print('connected')\nexcept OSError as e:\n  print('refused')"),
        ]),
        &caps(&images().python_oci(), NATIVE),
    );
    assert_eq!(ok_stdout(&out), "refused\n");
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
}

// ---- E: persistence across runs ----

#[test]
fn overlay_upper_dir_of_one_run_is_never_visible_to_the_next() {
    let fixture = Fixture::with_layers(vec![layer(&[Entry::Dir("usr")])]);
    let out = fixture
        .run(&sh(
            "echo one > /etc/marker && mkdir -p /usr/new && echo one > /usr/new/f && \
             echo one > /tmp/t && rm /bin/ls && echo wrote",
        ))
        .expect("run 1");
    assert_eq!(ok_stdout(&out), "wrote\n");
    let out = fixture
        .run(&sh(
            "ls /etc/marker /usr/new /tmp/t 2>/dev/null; test -e /bin/ls && echo ls-back",
        ))
        .expect("run 2");
    assert_eq!(ok_stdout(&out), "ls-back\n");
    for root in fixture.cached_roots() {
        assert!(
            !root.join("etc/marker").exists(),
            "the cached image was written"
        );
        assert!(root.join("bin/ls").exists() || root.join("bin/ls").is_symlink());
    }
}

#[test]
fn kept_workspace_persists_the_writable_layer_between_runs() {
    let fixture = Fixture::with_layers(vec![]);
    let workspace = tempdir();
    let mut caps = fixture.caps();
    if let Some(c) = caps.container.as_mut() {
        c.workspace = Some(workspace.path().to_path_buf());
    }
    let first = run_cached(fixture.cache.path(), &sh("echo kept > /etc/kept"), &caps).expect("1");
    ok_stdout(&first);
    let second = run_cached(fixture.cache.path(), &sh("cat /etc/kept"), &caps).expect("2");
    assert_eq!(ok_stdout(&second), "kept\n");
    assert!(workspace.path().join("upper/etc/kept").is_file());
    // Without the workspace, the next run starts clean.
    let clean = fixture
        .run(&sh("cat /etc/kept 2>/dev/null || echo clean"))
        .expect("3");
    assert_eq!(ok_stdout(&clean), "clean\n");
}

#[test]
fn kept_workspace_runs_on_a_shared_process_backend_are_never_prebuilt_by_its_warm_pool() {
    // A pre-built sandbox of a kept workspace would mount its overlay while the run before
    // it still writes there: such image roots are always built cold, even when the process
    // backend they share keeps a warm pool.
    let fixture = Fixture::with_layers(vec![]);
    let workspace = tempdir();
    let mut caps = fixture.caps();
    if let Some(c) = caps.container.as_mut() {
        c.workspace = Some(workspace.path().to_path_buf());
    }
    let process = Arc::new(strata::ProcessBackend::with_helper(helper()).with_warm_pool(2));
    let backend = strata::ContainerBackend::with_process(Arc::clone(&process))
        .with_cache(sandbox_container::Cache::new(fixture.cache.path()));
    let ctx = strata::RunContext::default();
    let first = strata::Backend::run_caps(&backend, &sh("echo kept > /etc/kept"), &caps, &ctx);
    ok_stdout(&first.expect("1"));
    let second = strata::Backend::run_caps(&backend, &sh("cat /etc/kept"), &caps, &ctx);
    assert_eq!(ok_stdout(&second.expect("2")), "kept\n");
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(
        process.warm_idle(),
        0,
        "no sandbox of a kept workspace was pre-built"
    );
}

// ---- D: exhaustion through the image's writable layer ----

#[test]
fn writes_to_the_image_root_stop_at_the_disk_limit() {
    let mut caps = caps(&images().python_oci(), NATIVE);
    caps.limits.disk = "8M".parse().expect("size");
    let out = run(
        &sh("dd if=/dev/zero of=/usr/fill bs=1M count=64 2>/dev/null; ls -l /usr/fill | awk '{print $5}'"),
        &caps,
    );
    let size: u64 = stdout(&out).trim().parse().unwrap_or(u64::MAX);
    assert!(size <= 8 << 20, "wrote {size} bytes past an 8M disk limit");
}

// ---- I/J/K: posture, secrets and lifecycle ----

#[test]
fn container_posture_matches_the_process_sandbox() {
    let out = run(
        &sh("grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t' ' '"),
        &caps(&images().python_oci(), NATIVE),
    );
    let text = ok_stdout(&out);
    // Under its own host identity (a root embedder) the tool keeps CAP_DAC_OVERRIDE and
    // CAP_FOWNER in its own user namespace, as in the process sandbox; otherwise nothing.
    let kept = if is_root() {
        "000000000000000a"
    } else {
        "0000000000000000"
    };
    let (eff, bnd) = (format!("CapEff: {kept}"), format!("CapBnd: {kept}"));
    for want in [eff.as_str(), bnd.as_str(), "NoNewPrivs: 1", "Seccomp: 2"] {
        assert!(text.contains(want), "{want} missing in {text}");
    }
}

#[test]
fn host_environment_secret_is_invisible_in_a_container() {
    std::env::set_var("STRATA_CONTAINER_TEST_SECRET", SECRET);
    let out = run(&sh("env"), &caps(&images().python_oci(), NATIVE));
    assert!(!ok_stdout(&out).contains(SECRET));
}

#[test]
fn timeout_kills_the_whole_container_tree() {
    let marker = "strata-ctr-sleeper-7d1e";
    let caps = caps(&images().python_oci(), NATIVE).timeout(std::time::Duration::from_millis(800));
    let out = run(
        &sh(&format!(
            "(sleep 60; echo {marker}) & setsid sleep 61 & sleep 62"
        )),
        &caps,
    );
    assert_eq!(out.limit(), Some(LimitKind::Wall));
    // Nothing of the previous run is in a fresh sandbox: only its own shell and ls.
    let again = run(&sh("ls -d /proc/[0-9]* | wc -l"), &caps);
    assert!(ok_stdout(&again).trim().parse::<u32>().unwrap_or(99) <= 4);
    assert!(
        !std::fs::read_dir("/proc")
            .expect("proc")
            .flatten()
            .any(|e| std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))),
        "a background process of the timed-out run survived"
    );
}

#[test]
fn many_container_runs_leak_no_mounts_cgroups_processes_or_temp_dirs() {
    let fixture = Fixture::with_layers(vec![]);
    let mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|m| {
                m.lines()
                    .filter(|l| l.contains("overlay") || l.contains("strata"))
                    .count()
            })
            .unwrap_or(0)
    };
    let before = mounts();
    for i in 0..30 {
        let out = fixture
            .run(&sh(&format!(
                "echo {i} > /etc/run-{i}; sleep 0.01 & echo ok"
            )))
            .expect("run");
        assert_eq!(ok_stdout(&out), "ok\n");
    }
    assert_eq!(
        mounts(),
        before,
        "overlay or strata mounts leaked into the host"
    );
    assert_eq!(fixture.leftovers(), 0, "unpack temp dirs left");
    assert!(
        container_common::eventually_zero(|| common::run_cgroups_of(std::process::id())),
        "run cgroups left behind"
    );
    for root in fixture.cached_roots() {
        assert!(!root.join("etc/run-0").exists());
    }
}
