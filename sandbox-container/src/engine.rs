//! The engine runtimes: the same `Tool` + `Caps` on a Docker (or Podman) engine through its
//! API, optionally with gVisor's `runsc` as the OCI runtime.
//!
//! Caps map to the engine's own mechanisms: `--network none` (an allowlist fails closed),
//! `--read-only` root, `--cap-drop ALL`, `no-new-privileges`, `--pids-limit`, memory (no
//! swap) and CPU limits, a non-root user (the image's, or `65534:65534` when the image
//! would run as root), a size-capped `noexec` tmpfs on `/tmp`, bind mounts read-only or
//! read-write, rlimits as ulimits, a private IPC namespace, and no log files
//! (`--log-driver none`; output is read from the attach stream with the caps' limit).
//! Images are never pulled: a path is loaded into the engine (`docker load`), a name must
//! already be in it. The container is always removed: after the run, on error, when the
//! caller cancels, and on panic (a drop guard). A container whose embedder was SIGKILLed
//! mid-run is removed by the next Strata process that uses the engine (see [`super::owner`]).
//! Standard input is streamed over the attach connection with bounded buffering
//! ([`sandbox_core::StdinSource`]); the timeout and cancellation act while it is open.

use sandbox_core::SetupStage;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, ImportImageOptions, KillContainerOptions,
    ListContainersOptions, RemoveContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use sandbox_core::{
    BackendKind, Capability, Caps, ContainerRuntime, ContainerSpec, EndReason, Error, ExitStatus,
    LimitKind, Mechanism, Net, ResourceUsage, Result, RunContext, RunOutput, RunSpec, Stream, Tool,
    STDIN_BUFFER,
};
use sandbox_os::backend_api::egress::{EgressHost, RunEgress};
use sandbox_os::backend_api::protocol::MountSpec;
use sandbox_os::backend_api::{plan, NonBlocking};
use tokio::io::AsyncWriteExt;

use super::engine_receipt::receipt;
use super::image::{self, Format};
use super::owner::{Owner, OWNER_LABEL};

/// The Docker engine's socket.
pub const DOCKER_SOCKET: &str = "/var/run/docker.sock";
/// Podman's Docker-compatible socket (rootful).
pub const PODMAN_SOCKET: &str = "/run/podman/podman.sock";
/// The user an engine container runs as when the image would run as root.
pub const NON_ROOT_USER: &str = "65534:65534";

/// Largest image archive loaded into the engine.
const MAX_LOAD: u64 = 8 << 30;

/// The engine socket for `runtime`.
pub fn socket(runtime: ContainerRuntime) -> &'static str {
    match runtime {
        ContainerRuntime::Podman => PODMAN_SOCKET,
        _ => DOCKER_SOCKET,
    }
}

fn engine_err(what: &str, e: bollard::errors::Error) -> Error {
    Error::Internal {
        message: format!("container engine: {what}: {e}"),
        source: None,
    }
}

/// Connects to the engine, negotiating the API version (the Debian engine speaks 1.41).
async fn connect(runtime: ContainerRuntime) -> Result<Docker> {
    let path = socket(runtime);
    if !std::path::Path::new(path).exists() {
        return Err(Error::unavailable(
            BackendKind::Container,
            format!(
                "the {runtime} runtime needs a running engine: {path} does not exist (start dockerd)"
            ),
        ));
    }
    let docker =
        Docker::connect_with_unix(path, 120, bollard::API_DEFAULT_VERSION).map_err(|e| {
            Error::unavailable(
                BackendKind::Container,
                format!("cannot connect to {path}: {e}"),
            )
        })?;
    docker.negotiate_version().await.map_err(|e| {
        Error::unavailable(
            BackendKind::Container,
            format!("the engine at {path} does not answer: {e}"),
        )
    })
}

/// The labels of a run's container: the embedding process's PID (`org.strata.run`) and
/// its full identity ([`OWNER_LABEL`]), by which abandoned containers are found.
fn labels() -> HashMap<String, String> {
    let mut labels =
        HashMap::from([("org.strata.run".to_string(), std::process::id().to_string())]);
    if let Some(owner) = Owner::current() {
        labels.insert(OWNER_LABEL.to_string(), owner.label());
    }
    labels
}

/// Removes the containers of embedders that died mid-run on this machine (see
/// [`super::owner`]). Once per engine socket per process; failures are logged, never fatal.
async fn sweep_abandoned(docker: &Docker, socket: &'static str) {
    static SWEPT: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    {
        let mut swept = SWEPT.lock().unwrap_or_else(|p| p.into_inner());
        if swept.contains(&socket) {
            return;
        }
        swept.push(socket);
    }
    let Some(me) = Owner::current() else {
        return;
    };
    let options = ListContainersOptions {
        all: true,
        filters: Some(HashMap::from([(
            "label".to_string(),
            vec![OWNER_LABEL.to_string()],
        )])),
        ..Default::default()
    };
    let containers = match docker.list_containers(Some(options)).await {
        Ok(containers) => containers,
        Err(e) => {
            tracing::warn!(error = %e, "could not list containers to sweep abandoned runs");
            return;
        }
    };
    for container in containers {
        let abandoned = container
            .labels
            .as_ref()
            .and_then(|labels| labels.get(OWNER_LABEL))
            .and_then(|label| Owner::parse(label))
            .is_some_and(|owner| owner.is_gone(&me));
        let Some(id) = container.id.filter(|_| abandoned) else {
            continue;
        };
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match docker.remove_container(&id, Some(options)).await {
            Ok(()) => tracing::info!(container = %id, "removed a container whose embedder died"),
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "could not remove an abandoned container")
            }
        }
    }
}

/// Resolves the image to an engine image id, loading a `docker save` archive when needed.
async fn resolve_image(docker: &Docker, reference: &str) -> Result<EngineImage> {
    if std::path::Path::new(reference).exists() || reference.starts_with('/') {
        let parsed = image::open(reference)?;
        if parsed.format != Format::DockerArchive {
            return Err(Error::invalid(format!(
                "image {reference:?} is a {}: the engine runtimes load `docker save` archives or use \
                 images already in the engine; run this one with the native runtime",
                parsed.format.as_str()
            )));
        }
        if docker.inspect_image(&parsed.id).await.is_err() {
            let path = reference.to_string();
            let bytes = tokio::task::spawn_blocking(move || {
                let meta = std::fs::metadata(&path)?;
                if meta.len() > MAX_LOAD {
                    return Err(std::io::Error::other("archive larger than 8 GiB"));
                }
                std::fs::read(&path)
            })
            .await
            .map_err(|e| Error::Internal {
                message: format!("read image archive: {e}"),
                source: None,
            })?
            .map_err(|e| Error::invalid(format!("image {reference:?}: {e}")))?;
            let mut load = docker.import_image(
                ImportImageOptions {
                    quiet: true,
                    ..Default::default()
                },
                bollard::body_full(bytes.into()),
                None,
            );
            while let Some(step) = load.next().await {
                step.map_err(|e| {
                    Error::invalid(format!("image {reference:?}: the engine refused it: {e}"))
                })?;
            }
        }
        let inspect = docker.inspect_image(&parsed.id).await.map_err(|e| {
            Error::invalid(format!(
                "image {reference:?}: not in the engine after loading it: {e}"
            ))
        })?;
        return Ok(EngineImage::from_inspect(inspect, &parsed.id));
    }
    let inspect = docker.inspect_image(reference).await.map_err(|e| {
        Error::invalid(format!(
            "image {reference:?} is not in the engine and Strata never pulls from a registry \
             (load it first, e.g. `docker load -i FILE`): {e}"
        ))
    })?;
    Ok(EngineImage::from_inspect(inspect, reference))
}

/// What the engine knows about an image.
struct EngineImage {
    id: String,
    user: String,
    working_dir: Option<String>,
}

impl EngineImage {
    fn from_inspect(inspect: bollard::models::ImageInspect, fallback_id: &str) -> Self {
        let config = inspect.config.unwrap_or_default();
        EngineImage {
            id: inspect.id.unwrap_or_else(|| fallback_id.to_string()),
            user: config.user.unwrap_or_default(),
            working_dir: config.working_dir.filter(|w| !w.is_empty()),
        }
    }
}

/// Whether an image `User` string means root.
fn is_root_user(user: &str) -> bool {
    let name = user.split(':').next().unwrap_or("");
    name.is_empty() || name == "root" || name == "0"
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Everything decided before the engine is asked for anything.
struct Plan {
    cmd: Option<Vec<String>>,
    entrypoint: Option<Vec<String>>,
    host: HostConfig,
    /// The bind mounts, resolved, for the receipt.
    binds: Vec<MountSpec>,
    env: Vec<String>,
    workdir: Option<String>,
    /// The run has a non-empty allowlist: its container joins a holder's namespace whose
    /// only way out is the egress proxy.
    egress: bool,
}

/// The container's shape for `tool` under `caps`, with `binds` (the run spec's resolved
/// grants) as its bind mounts. The tool was validated when the spec was planned.
fn plan(tool: &Tool, caps: &Caps, binds: &[MountSpec]) -> Result<Plan> {
    let (cmd, entrypoint) = match tool {
        Tool::Command { argv } if argv.is_empty() => (None, None),
        Tool::Command { argv } => (Some(argv.clone()), None),
        Tool::Script { language, source } => {
            let argv = plan::script_argv(*language, source);
            (Some(argv[1..].to_vec()), Some(vec![argv[0].clone()]))
        }
        Tool::Wasm { .. } => return Err(Error::invalid(
            "the container backend runs commands and scripts; run Tool::Wasm on the wasm backend",
        )),
        _ => {
            return Err(Error::invalid(
                "this tool kind is not supported by the container backend",
            ))
        }
    };
    // An allowlist starts in `none`; the run moves the container into its holder's
    // namespace (see `engine_egress`).
    let (network, egress) = match &caps.net {
        Net::None => ("none", false),
        Net::Allow(rules) => ("none", !rules.is_empty()),
        Net::Host => ("host", false),
        _ => return Err(Error::unenforceable("net", "unknown network policy")),
    };
    let limits = &caps.limits;
    // The spec resolved the grants as the process sandbox does: no symlinks unless a grant
    // follows them, host-executed paths of writable grants bound read-only with their
    // parents pinned. The engine resolves each source path itself when it mounts (it
    // cannot take an fd), so a swap between that check and the mount is not caught here:
    // see the threat model.
    let mounts = binds
        .iter()
        .map(|bind| Mount {
            target: Some(bind.target.display().to_string()),
            source: Some(bind.source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(!bind.writable),
            ..Default::default()
        })
        .collect();
    let ulimit = |name: &str, value: u64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(i64::try_from(value).unwrap_or(i64::MAX)),
        hard: Some(i64::try_from(value).unwrap_or(i64::MAX)),
    };
    let cpu_secs = limits.cpu_time.as_secs_f64().ceil().max(1.0) as u64;
    let memory = i64::try_from(limits.memory.bytes()).unwrap_or(i64::MAX);
    let host = HostConfig {
        network_mode: Some(network.to_string()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec![
            "no-new-privileges".to_string(),
            format!("seccomp={}", crate::seccomp_oci::profile()),
        ]),
        pids_limit: Some(i64::from(limits.processes)),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some((limits.cpus * 1e9) as i64),
        ipc_mode: Some("private".to_string()),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,noexec,nosuid,nodev,size={}", limits.disk.bytes()),
        )])),
        mounts: Some(mounts),
        ulimits: Some(vec![
            ulimit("nofile", u64::from(limits.open_files)),
            ulimit("fsize", limits.file_size.bytes()),
            ulimit("cpu", cpu_secs),
            ulimit("core", 0),
        ]),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        auto_remove: Some(false),
        privileged: Some(false),
        ..Default::default()
    };
    let env = caps.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(Plan {
        cmd,
        entrypoint,
        host,
        binds: binds.to_vec(),
        env,
        workdir: caps.workdir.as_ref().map(|w| w.display().to_string()),
        egress,
    })
}

/// The containers to remove (the network holder, then the tool's), shared with the drop
/// guard.
type Created = Arc<Mutex<Vec<(Docker, String)>>>;

fn remember(created: &Created, docker: &Docker, id: &str) {
    let mut guard = created.lock().unwrap_or_else(|p| p.into_inner());
    guard.push((docker.clone(), id.to_string()));
}

/// Removes the containers (force, newest first) when dropped: after the run, on error and
/// on panic.
struct RemoveOnDrop<'a> {
    rt: &'a tokio::runtime::Runtime,
    created: Created,
}

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let taken = std::mem::take(&mut *self.created.lock().unwrap_or_else(|p| p.into_inner()));
        for (docker, id) in taken.into_iter().rev() {
            let removed = self.rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(60),
                    docker.remove_container(
                        &id,
                        Some(RemoveContainerOptions {
                            force: true,
                            v: true,
                            ..Default::default()
                        }),
                    ),
                )
                .await
            });
            if !matches!(removed, Ok(Ok(()))) {
                tracing::warn!(container = %id, "could not remove the engine container");
            }
        }
    }
}

/// Writes the container's standard input over the attach connection: `bytes`, then the
/// stream until its end of file, then a half-close. The stream is read [`STDIN_BUFFER`]
/// bytes at a time, each read waiting until the previous one was written to the engine
/// (back-pressure from the connection). The run aborts this task when the container ends.
async fn feed_stdin(
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    bytes: Vec<u8>,
    stream: Option<NonBlocking>,
) {
    if input.write_all(&bytes).await.is_err() {
        return;
    }
    drop(bytes);
    if let Some(stream) = stream {
        let mut buf = vec![0u8; STDIN_BUFFER];
        match register_readable(stream) {
            Ok(fd) => loop {
                let Ok(mut ready) = fd.readable().await else {
                    break;
                };
                match ready.try_io(|fd| read(fd.get_ref(), &mut buf)) {
                    Ok(Ok(0)) => break,
                    Ok(Ok(n)) => {
                        if input.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "reading the stdin stream failed; ending the container's input");
                        break;
                    }
                    Err(_would_block) => {}
                }
            },
            // Not pollable (a regular file): plain reads, which never wait for a producer.
            Err(stream) => loop {
                match read(&stream, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if input.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the stdin stream failed; ending the container's input");
                        break;
                    }
                }
            },
        }
    }
    let _ = input.shutdown().await;
}

/// Registers `fd` with the current tokio runtime's reactor for readiness to read, or hands
/// it back when it cannot be polled (a regular file). Must run inside a runtime.
fn register_readable(
    fd: NonBlocking,
) -> Result<tokio::io::unix::AsyncFd<NonBlocking>, NonBlocking> {
    // SAFETY: `NonBlocking` owns its descriptor, never replaces it and returns the same one
    // from every `as_raw_fd` call; it stays open until the `AsyncFd` that owns it drops.
    match unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    } {
        Ok(fd) => Ok(fd),
        Err(e) => Err(e.into_parts().0),
    }
}

/// `read` into `buf`.
fn read(fd: &NonBlocking, buf: &mut [u8]) -> std::io::Result<usize> {
    rustix::io::read(fd, buf).map_err(std::io::Error::from)
}

/// Why runsc runs with a read-write grant are refused when strict: Docker and Podman
/// containers get Strata's seccomp profile ([`crate::seccomp_oci`]), which refuses set-id
/// modes, but gVisor does not apply an OCI seccomp profile by default, so a tool (never
/// root, but some uid) could leave a setuid file of its uid in the grant on the host.
pub(crate) const SETID_GAP: &str = "the runsc runtime does not apply Strata's seccomp profile, so it cannot stop a tool from setting setuid/setgid bits on files in a read-write grant (set-id to the container's non-root uid on the host); use the docker or native runtime, or best effort to accept this gap";

/// Runs `tool` with `caps` in `container` on its engine runtime. With runsc, read-write
/// grants are refused when strict ([`SETID_GAP`]).
///
/// Under a non-empty allowlist the run's only way out is `process`'s egress proxy (see
/// [`crate::engine_egress`]); if the proxy cannot start, a strict run is refused and a
/// best-effort run gets no network at all (the gap is listed).
pub fn run(
    container: &ContainerSpec,
    tool: &Tool,
    spec: &RunSpec,
    ctx: &RunContext,
    process: &sandbox_os::ProcessBackend,
) -> Result<RunOutput> {
    let caps = &spec.caps;
    if container.workspace.is_some() {
        return Err(Error::invalid(
            "a kept container workspace is only supported by the native runtime",
        ));
    }
    let plan = plan(tool, caps, &spec.mounts)?;
    let mut egress_gap = None;
    let egress = match plan.egress {
        false => None,
        true => {
            crate::engine_egress::check_supported(container.runtime)?;
            match sandbox_os::backend_api::egress_host(process) {
                Ok(host) => Some(host),
                Err(why) if ctx.strictness == sandbox_core::Strictness::Strict => {
                    return Err(Error::unenforceable_strict(
                        "net: allowlist",
                        format!("the egress proxy could not start: {why}"),
                    ))
                }
                Err(why) => {
                    egress_gap = Some(format!(
                        "egress proxy unavailable ({why}): the run has no network at all"
                    ));
                    None
                }
            }
        }
    };
    let writable_grant = caps
        .mounts
        .iter()
        .any(|m| m.access == sandbox_core::Access::ReadWrite);
    if let (Some(agent), sandbox_core::Strictness::Strict) = (&caps.agent, ctx.strictness) {
        return Err(Error::unenforceable_strict(
            "identity: per-agent host uid",
            format!(
                "the engine runtime runs the image's user with the engine's uid handling, not agent {agent}'s own host uid; use the native runtime, or best effort"
            ),
        ));
    }
    if writable_grant
        && container.runtime == ContainerRuntime::Runsc
        && ctx.strictness == sandbox_core::Strictness::Strict
    {
        return Err(Error::unenforceable_strict(
            "privileges: no set-id files in read-write grants",
            SETID_GAP,
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::internal("start the engine client", e))?;
    let created: Created = Arc::new(Mutex::new(Vec::new()));
    let guard = RemoveOnDrop {
        rt: &rt,
        created: Arc::clone(&created),
    };
    let result = rt.block_on(run_async(container, plan, caps, ctx, &created, egress));
    drop(guard);
    let mut output = result?;
    if let Some(gap) = egress_gap {
        output.receipt.gap(Capability::Net, gap);
    }
    Ok(output)
}

async fn run_async(
    container: &ContainerSpec,
    plan: Plan,
    caps: &Caps,
    ctx: &RunContext,
    created: &Created,
    egress: Option<&EgressHost>,
) -> Result<RunOutput> {
    let start = Instant::now();
    let runtime = container.runtime;
    let docker = connect(runtime).await?;
    sweep_abandoned(&docker, socket(runtime)).await;
    let engine_image = resolve_image(&docker, &container.image).await?;
    let image_id = engine_image.id.clone();
    let user = if is_root_user(&engine_image.user) {
        NON_ROOT_USER.to_string()
    } else {
        engine_image.user.clone()
    };
    let mut host = plan.host;
    if runtime == ContainerRuntime::Runsc {
        host.runtime = Some("runsc".to_string());
    }
    let workdir = plan
        .workdir
        .clone()
        .or(engine_image.working_dir.clone())
        .unwrap_or_else(|| "/tmp".to_string());
    // Taken once the engine and the image are known to be there, so a request refused
    // before leaves the stream to the caller.
    let stream = match &ctx.stdin {
        Some(source) => Some(
            NonBlocking::new(source.take()?)
                .map_err(|e| Error::invalid(format!("the stdin stream cannot be read: {e}")))?,
        ),
        None => None,
    };
    let name = format!(
        "strata-{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        start.elapsed().as_nanos() % 1_000_000
    );
    let mut env = plan.env.clone();
    // Holds the run's CA files (with secrets) until the container is gone.
    let mut _trust_dir = None;
    let run_egress = match egress {
        None => None,
        Some(proxy) => {
            let mut run_egress =
                RunEgress::register_with_secrets(proxy, &caps.net, &caps.limits, &caps.secrets)?;
            let files = run_egress.trust_files();
            if !files.is_empty() {
                let (dir, mount) = trust_mount(&files)?;
                host.mounts.get_or_insert_with(Vec::new).push(mount);
                _trust_dir = Some(dir);
            }
            let holder = crate::engine_egress::start_holder(
                &docker,
                &format!("{name}-net"),
                labels(),
                |id| remember(created, &docker, id),
            )
            .await?;
            run_egress.attach(proxy, holder.listener)?;
            run_egress.set_env(&mut env);
            host.network_mode = Some(format!("container:{}", holder.id));
            Some(run_egress)
        }
    };
    let body = ContainerCreateBody {
        image: Some(image_id.clone()),
        cmd: plan.cmd.clone(),
        entrypoint: plan.entrypoint.clone(),
        env: Some(env),
        user: Some(user.clone()),
        working_dir: Some(workdir.clone()),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(host.network_mode.as_deref() == Some("none")),
        labels: Some(labels()),
        host_config: Some(host.clone()),
        ..Default::default()
    };
    let response = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| match e {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 400..=499,
                ref message,
            } => Error::invalid(format!("the engine refused the container: {message}")),
            other => engine_err("create container", other),
        })?;
    let id = response.id;
    remember(created, &docker, &id);
    let mut attached = docker
        .attach_container(
            &id,
            Some(AttachContainerOptions {
                stdin: true,
                stdout: true,
                stderr: true,
                stream: true,
                logs: false,
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| engine_err("attach", e))?;
    docker
        .start_container(
            &id,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| match e {
            bollard::errors::Error::DockerResponseServerError { ref message, .. }
                if message.contains("executable file not found")
                    || message.contains("no such file or directory") =>
            {
                Error::Exec {
                    program: plan
                        .entrypoint
                        .as_ref()
                        .or(plan.cmd.as_ref())
                        .and_then(|a| a.first().cloned())
                        .unwrap_or_default(),
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                }
            }
            other => engine_err("start container", other),
        })?;
    let feeder = tokio::spawn(feed_stdin(attached.input, caps.stdin.clone(), stream));

    let cancel = Arc::new(tokio::sync::Notify::new());
    let waker = Arc::clone(&cancel);
    let _registration = ctx.cancel.on_cancel(move || waker.notify_one());
    let limit = usize::try_from(caps.limits.output.bytes()).unwrap_or(usize::MAX);
    let deadline = tokio::time::Instant::now() + caps.limits.timeout;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (mut out_cut, mut err_cut) = (false, false);
    let mut killed: Option<EndReason> = None;
    let kill = |docker: Docker, id: String| async move {
        let _ = docker
            .kill_container(
                &id,
                Some(KillContainerOptions {
                    signal: "SIGKILL".to_string(),
                }),
            )
            .await;
    };
    loop {
        tokio::select! {
            chunk = attached.output.next() => {
                let Some(chunk) = chunk else { break };
                let Ok(chunk) = chunk else { break };
                let (which, buf, cut, bytes) = match chunk {
                    bollard::container::LogOutput::StdOut { message } => (Stream::Stdout, &mut stdout, &mut out_cut, message),
                    bollard::container::LogOutput::StdErr { message } => (Stream::Stderr, &mut stderr, &mut err_cut, message),
                    bollard::container::LogOutput::Console { message } => (Stream::Stdout, &mut stdout, &mut out_cut, message),
                    bollard::container::LogOutput::StdIn { .. } => continue,
                };
                let room = limit.saturating_sub(buf.len());
                let keep = bytes.len().min(room);
                if keep > 0 {
                    buf.extend_from_slice(&bytes[..keep]);
                    if let Some(sink) = &ctx.sink {
                        sink.on_output(which, &bytes[..keep]);
                    }
                }
                if keep < bytes.len() && !*cut {
                    *cut = true;
                    if killed.is_none() {
                        killed = Some(EndReason::Output);
                        kill(docker.clone(), id.clone()).await;
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline), if killed.is_none() => {
                killed = Some(EndReason::Wall);
                kill(docker.clone(), id.clone()).await;
            }
            _ = cancel.notified(), if killed.is_none() => {
                killed = Some(EndReason::Cancelled);
                kill(docker.clone(), id.clone()).await;
            }
        }
    }
    feeder.abort();
    if killed == Some(EndReason::Cancelled) || ctx.cancel.is_cancelled() {
        return Err(Error::Cancelled);
    }
    let mut wait = docker.wait_container(
        &id,
        Some(WaitContainerOptions {
            condition: "not-running".to_string(),
        }),
    );
    let code = match tokio::time::timeout(Duration::from_secs(30), wait.next()).await {
        Ok(Some(Ok(response))) => response.status_code,
        Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. }))) => code,
        Ok(Some(Err(e))) => return Err(engine_err("wait", e)),
        Ok(None) | Err(_) => {
            return Err(Error::Internal {
                message: "container engine: the container did not stop".into(),
                source: None,
            })
        }
    };
    let oom = docker
        .inspect_container(
            &id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.oom_killed)
        .unwrap_or(false);
    let code = i32::try_from(code).unwrap_or(-1);
    let limit_hit = match killed.and_then(EndReason::limit) {
        Some(limit) => Some(limit),
        _ if oom => Some(LimitKind::Memory),
        _ if code == 128 + libc::SIGXCPU => Some(LimitKind::Cpu),
        _ if code == 128 + libc::SIGXFSZ => Some(LimitKind::FileSize),
        _ => None,
    };
    let status = match limit_hit {
        Some(limit) => ExitStatus::Limit {
            limit,
            signal: (code > 128).then_some(code - 128),
        },
        None => ExitStatus::Exited { code },
    };
    let mut receipt = receipt(
        container,
        caps,
        ctx,
        &image_id,
        &user,
        &host,
        &plan.binds,
        &workdir,
    );
    if out_cut {
        receipt.record_output_cut(Stream::Stdout, &caps.limits);
    }
    if err_cut {
        receipt.record_output_cut(Stream::Stderr, &caps.limits);
    }
    match limit_hit {
        Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => receipt.record_end(kind, &caps.limits),
        Some(LimitKind::Memory) => receipt.deny(
            Capability::Memory,
            format!("killed at the {} memory limit", caps.limits.memory),
        ),
        _ => {}
    }
    if let Some(run_egress) = run_egress {
        let names = run_egress.secret_names().join(",");
        if !names.is_empty() {
            receipt.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "secrets at egress",
                format!(
                    "{names}: per-run placeholders in the container; the values only in request headers to each secret's hosts (HTTPS through a per-run CA, name-constrained to those hosts, mounted read-only at /etc/strata)"
                ),
            );
        }
        let (network, denials) = run_egress.finish();
        receipt.denials.extend(denials);
        receipt.network = Some(network);
    }
    Ok(RunOutput {
        status,
        stdout,
        stderr,
        stdout_truncated: out_cut,
        stderr_truncated: err_cut,
        duration: start.elapsed(),
        usage: ResourceUsage::default(),
        receipt,
    })
}

/// Writes a run's CA files (all in one directory inside the container) to a private host
/// directory and returns it with its read-only bind mount.
fn trust_mount(
    files: &[sandbox_os::backend_api::egress::TrustFile],
) -> Result<(tempfile::TempDir, Mount)> {
    use std::os::unix::fs::PermissionsExt;
    let setup = |e: std::io::Error| Error::setup(SetupStage::Egress, "write the run's CA files", e);
    let dir = tempfile::Builder::new()
        .prefix("strata-trust")
        .tempdir()
        .map_err(setup)?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(setup)?;
    let mut target = None;
    for file in files {
        let (Some(parent), Some(name)) = (file.path.parent(), file.path.file_name()) else {
            continue;
        };
        target.get_or_insert_with(|| parent.display().to_string());
        let path = dir.path().join(name);
        std::fs::write(&path, &file.contents).map_err(setup)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).map_err(setup)?;
    }
    let mount = Mount {
        target,
        source: Some(dir.path().display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    };
    Ok((dir, mount))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_map_to_a_locked_down_host_config() {
        let caps = Caps::new().timeout(Duration::from_secs(5));
        let plan = plan(&Tool::command(["true"]), &caps, &[]).expect("plan");
        let host = plan.host;
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_string()]));
        let opts = host.security_opt.clone().unwrap_or_default();
        assert_eq!(opts.len(), 2, "{opts:?}");
        assert_eq!(opts[0], "no-new-privileges");
        assert!(opts[1].starts_with("seccomp={"), "Strata's own profile");
        assert_eq!(host.pids_limit, Some(128));
        assert_eq!(host.memory, host.memory_swap);
        assert!(host
            .tmpfs
            .as_ref()
            .and_then(|t| t.get("/tmp"))
            .is_some_and(|o| o.contains("noexec") && o.contains("size=")));
    }

    #[test]
    fn allowlists_start_without_a_network_and_are_marked_for_the_proxy() {
        let caps = Caps::new().net("allow:example.com:443".parse().expect("net"));
        let plan = plan(&Tool::command(["true"]), &caps, &[]).expect("plan");
        assert!(plan.egress);
        assert_eq!(plan.host.network_mode.as_deref(), Some("none"));
        let empty = Caps::new().net("allow:".parse().expect("net"));
        let plan = super::plan(&Tool::command(["true"]), &empty, &[]).expect("plan");
        assert!(!plan.egress, "an empty allowlist is no network at all");
    }

    #[test]
    fn root_image_users_are_replaced() {
        assert!(is_root_user(""));
        assert!(is_root_user("root"));
        assert!(is_root_user("0:0"));
        assert!(!is_root_user("app"));
        assert!(!is_root_user("1000:1000"));
    }
}
