//! Shared harness of the container suites: test images (built from Debian packages by
//! scripts/build-test-images.sh, cached under .ci/cache/images), sandboxes, and image
//! fixtures written on the fly (OCI layouts with chosen configs or hostile layers).
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};
use strata::{BackendChoice, BackendKind, Caps, ContainerRuntime, RunOutput, Sandbox, Tool};

/// The test images.
pub struct Images {
    pub dir: PathBuf,
}

impl Images {
    pub fn python_oci(&self) -> String {
        self.path("python-oci")
    }
    pub fn python_archive(&self) -> String {
        self.path("python.docker.tar")
    }
    pub fn python_rootfs(&self) -> String {
        self.path("python-rootfs")
    }
    pub fn busybox_oci(&self) -> String {
        self.path("busybox-oci")
    }
    pub fn busybox_archive(&self) -> String {
        self.path("busybox.docker.tar")
    }
    pub fn busybox_rootfs(&self) -> String {
        self.path("busybox-rootfs")
    }
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn repo() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
}

fn build_images(docker: bool) -> Images {
    let mut cmd = Command::new(repo().join("scripts/build-test-images.sh"));
    if docker {
        cmd.arg("--docker");
    }
    let out = cmd.output().expect("run scripts/build-test-images.sh");
    assert!(
        out.status.success(),
        "building the test images failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = std::env::var_os("STRATA_TEST_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".ci/cache/images"));
    Images { dir }
}

/// The test images, built when missing (once per test binary).
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| build_images(false))
}

/// The test images, also loaded into the Docker engine. Panics (never skips) when the
/// engine is not running: `.ci/run` starts it with scripts/start-dockerd.sh.
pub fn engine_images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        require_dockerd();
        build_images(true)
    })
}

/// Panics with instructions when dockerd is not reachable.
pub fn require_dockerd() {
    let up = Path::new("/var/run/docker.sock").exists()
        && docker(&["version", "--format", "{{.Server.Version}}"]).0;
    assert!(
        up,
        "the engine tests need a running Docker engine: run scripts/start-dockerd.sh (as root; \
         scripts/deps.sh installs docker.io). They never pass without one."
    );
}

/// Runs the docker CLI (Debian's client when present); returns (success, stdout).
pub fn docker(args: &[&str]) -> (bool, String) {
    let bin = if Path::new("/usr/bin/docker").exists() {
        "/usr/bin/docker"
    } else {
        "docker"
    };
    match Command::new(bin).args(args).output() {
        Ok(out) => (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ),
        Err(_) => (false, String::new()),
    }
}

/// The helper binary cargo built for this test run.
pub fn helper() -> &'static str {
    env!("CARGO_BIN_EXE_strata-helper")
}

/// A container-backend sandbox using this build's helper.
pub fn sandbox() -> Sandbox {
    Sandbox::builder()
        .backend(BackendChoice::Only(BackendKind::Container))
        .helper(helper())
        .build()
        .expect("container backend is compiled in")
}

/// Caps for `image` on `runtime`.
pub fn caps(image: &str, runtime: ContainerRuntime) -> Caps {
    Caps::new().image(image).runtime(runtime)
}

/// Runs and panics on a refused run.
pub fn run(tool: &Tool, caps: &Caps) -> RunOutput {
    match sandbox().run(tool, caps) {
        Ok(out) => out,
        Err(e) => panic!("run of {} was refused: {e}", tool.describe()),
    }
}

/// Stdout as text.
pub fn stdout(out: &RunOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok_stdout(out: &RunOutput) -> String {
    assert!(
        out.success(),
        "expected success, got {}; stdout={:?} stderr={:?}",
        out.status,
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(out)
}

/// A shell probe (busybox sh in the test images).
pub fn sh(code: &str) -> Tool {
    Tool::command(["/bin/sh", "-c", code])
}

/// Whether this test process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One entry of a hand-made layer.
pub enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    CharDevice(&'a str, u32, u32),
    /// A raw name written into the header bytes (bypasses the tar crate's own checks).
    RawFile(&'a [u8], &'a [u8]),
}

/// A tar layer from entries.
pub fn layer(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(1_700_000_000);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            Entry::Dir(name) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, name, &[][..])
                    .expect("dir");
            }
            Entry::File(name, data, mode) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, name, *data).expect("file");
            }
            Entry::Symlink(name, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder
                    .append_link(&mut header, name, target)
                    .expect("symlink");
            }
            Entry::HardLink(name, target) => {
                header.set_entry_type(tar::EntryType::Link);
                header.set_mode(0o644);
                header.set_size(0);
                set_raw_link(&mut header, target);
                set_raw_name(&mut header, name.as_bytes());
                header.set_cksum();
                builder.append(&header, &[][..]).expect("hardlink");
            }
            Entry::CharDevice(name, major, minor) => {
                header.set_entry_type(tar::EntryType::Char);
                header.set_mode(0o666);
                header.set_size(0);
                header.set_device_major(*major).expect("major");
                header.set_device_minor(*minor).expect("minor");
                builder
                    .append_data(&mut header, name, &[][..])
                    .expect("dev");
            }
            Entry::RawFile(name, data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(data.len() as u64);
                set_raw_name(&mut header, name);
                header.set_cksum();
                builder.append(&header, *data).expect("raw");
            }
        }
    }
    builder.into_inner().expect("finish tar")
}

fn set_raw_name(header: &mut tar::Header, name: &[u8]) {
    let field = &mut header.as_old_mut().name;
    field.fill(0);
    field[..name.len()].copy_from_slice(name);
}

fn set_raw_link(header: &mut tar::Header, target: &str) {
    let field = &mut header.as_old_mut().linkname;
    field.fill(0);
    field[..target.len()].copy_from_slice(target.as_bytes());
}

/// Image config fields for a fixture.
#[derive(Default)]
pub struct Config<'a> {
    pub env: &'a [&'a str],
    pub workdir: Option<&'a str>,
    pub user: Option<&'a str>,
    pub entrypoint: Option<&'a [&'a str]>,
    pub cmd: Option<&'a [&'a str]>,
}

/// Writes an OCI image layout at `dir` with `layers` (uncompressed tars, lowest first).
pub fn write_oci(dir: &Path, layers: &[Vec<u8>], config: &Config<'_>) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs");
    let put = |data: &[u8]| {
        let digest = sha_hex(data);
        std::fs::write(blobs.join(&digest), data).expect("blob");
        digest
    };
    let mut cfg = serde_json::json!({ "Env": config.env });
    if let Some(w) = config.workdir {
        cfg["WorkingDir"] = w.into();
    }
    if let Some(u) = config.user {
        cfg["User"] = u.into();
    }
    if let Some(e) = config.entrypoint {
        cfg["Entrypoint"] = e.into();
    }
    if let Some(c) = config.cmd {
        cfg["Cmd"] = c.into();
    }
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", sha_hex(l)))
        .collect();
    let config_json = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("config");
    let config_digest = put(&config_json);
    let layer_descs: Vec<_> = layers
        .iter()
        .map(|l| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{}", put(l)), "size": l.len(),
            })
        })
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config_json.len()},
        "layers": layer_descs,
    }))
    .expect("manifest");
    let manifest_digest = put(&manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{manifest_digest}"), "size": manifest.len()}],
    });
    std::fs::write(dir.join("index.json"), index.to_string()).expect("index");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("layout");
}

/// The busybox of the test images as one layer (so fixtures have a working shell).
pub fn busybox_layer() -> Vec<u8> {
    static LAYER: OnceLock<Vec<u8>> = OnceLock::new();
    LAYER
        .get_or_init(|| {
            let root = images().dir.join("busybox-rootfs");
            let mut builder = tar::Builder::new(Vec::new());
            builder.follow_symlinks(false);
            // Only what a static busybox needs (not the image's libc): smaller fixtures.
            for dir in ["bin", "etc", "home", "root", "tmp"] {
                builder
                    .append_dir_all(dir, root.join(dir))
                    .expect("tar busybox rootfs");
            }
            builder.into_inner().expect("finish")
        })
        .clone()
}

/// A temporary directory for fixtures, removed on drop.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("strata-ctr-test")
        .tempdir()
        .expect("tempdir")
}

/// A container backend with a private image cache (so a test exercises unpacking, and
/// its fixtures do not accumulate in the user's cache).
pub fn backend_with_cache(cache: &Path) -> strata::ContainerBackend {
    strata::ContainerBackend::with_process(Arc::new(strata::ProcessBackend::with_helper(helper())))
        .with_cache(sandbox_container::Cache::new(cache))
}

/// Runs on a backend with a private cache.
pub fn run_cached(cache: &Path, tool: &Tool, caps: &Caps) -> strata::Result<RunOutput> {
    use strata::Backend;
    backend_with_cache(cache).run_caps(tool, caps, &strata::RunContext::default())
}

/// Writes `data` to a new file.
pub fn write_file(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(data).expect("write");
}

/// Waits (up to 5 s) for `count` to reach zero.
pub fn eventually_zero(count: impl Fn() -> usize) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < end {
        if count() == 0 {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    count() == 0
}

/// The hook a [`Repo`] starts with.
pub const REPO_HOOK: &str = "#!/bin/sh\necho original hook\n";
/// The git config a [`Repo`] starts with.
pub const REPO_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n";
/// The `.envrc` a [`Repo`] starts with.
pub const REPO_ENVRC: &str = "export ORIGINAL=1\n";

/// A repository-shaped workspace for the host-executed-path tests: a hook, a git config,
/// an `.envrc` and a source file, all world-writable on the host, so that only the sandbox
/// stands between any container user and them.
pub struct Repo {
    pub dir: tempfile::TempDir,
}

impl Repo {
    pub fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempdir();
        let root = dir.path();
        for sub in ["", ".git", ".git/hooks", ".git/objects", "src"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir");
            std::fs::set_permissions(root.join(sub), std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
        }
        for (rel, data, mode) in [
            (".git/hooks/pre-commit", REPO_HOOK, 0o777),
            (".git/config", REPO_CONFIG, 0o666),
            (".envrc", REPO_ENVRC, 0o666),
            ("src/main.rs", "fn main() {}\n", 0o666),
        ] {
            std::fs::write(root.join(rel), data).expect("write");
            std::fs::set_permissions(root.join(rel), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
        }
        Repo { dir }
    }

    /// The host-side evidence: every protected file exactly as planted.
    pub fn assert_untouched(&self) {
        use std::os::unix::fs::PermissionsExt;
        let root = self.dir.path();
        let read = |rel: &str| std::fs::read_to_string(root.join(rel)).expect(rel);
        assert_eq!(read(".git/hooks/pre-commit"), REPO_HOOK);
        assert_eq!(read(".git/config"), REPO_CONFIG);
        assert_eq!(read(".envrc"), REPO_ENVRC);
        let mode = std::fs::metadata(root.join(".git/hooks/pre-commit"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o777);
        let names = |rel: &str| {
            let mut names: Vec<String> = std::fs::read_dir(root.join(rel))
                .expect("read_dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(".git/hooks"), ["pre-commit"]);
        assert!(!names(".").iter().any(|n| n.starts_with(".git.")));
    }
}

/// A shell script (busybox) that attacks the [`Repo`] mounted at `/ws`: one line per
/// attack, `NAME:ALLOWED` or `NAME:denied`, then `honest:ok` after an ordinary edit.
pub const REPO_ATTACKS: &str = r#"
t() { name=$1; shift; if ( "$@" ) 2>/dev/null; then echo "$name:ALLOWED"; else echo "$name:denied"; fi; }
t overwrite_hook sh -c 'echo evil > /ws/.git/hooks/pre-commit'
t chmod_hook chmod 4777 /ws/.git/hooks/pre-commit
t new_hook sh -c 'echo evil > /ws/.git/hooks/post-checkout'
t delete_hook rm -f /ws/.git/hooks/pre-commit
t rename_hooks_away mv /ws/.git/hooks /ws/.git/hooks.old
t rename_git_aside mv /ws/.git /ws/.git.old
t write_config sh -c 'echo "[core] hooksPath = /tmp" >> /ws/.git/config'
t replace_config sh -c 'echo x > /ws/.git/config.new && mv /ws/.git/config.new /ws/.git/config'
t write_envrc sh -c 'echo evil > /ws/.envrc'
t delete_envrc rm -f /ws/.envrc
echo edited > /ws/src/main.rs && echo honest:ok
"#;

/// Asserts every attack of [`REPO_ATTACKS`] was denied and the honest edit worked.
pub fn assert_repo_attacks_denied(report: &str) {
    assert_eq!(report.lines().count(), 11, "{report}");
    assert!(!report.contains("ALLOWED"), "{report}");
    assert!(report.ends_with("honest:ok\n"), "{report}");
}
