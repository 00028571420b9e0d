//! The process backend: a Linux sandbox built by the `strata-helper` binary.

use sandbox_core::SetupStage;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use sandbox_core::{
    Backend, BackendKind, BackendReport, Capability, Caps, Error, ExitStatus, IdentityReceipt,
    IdentitySource, LimitKind, Mechanism, Net, Receipt, ResourceUsage, Result, RunContext,
    RunOutput, RunSpec, Stream, Strictness, Tool,
};

use crate::identity::{HostIds, IdRange, Registry};

use crate::cgroup;
use crate::egress_host::{EgressHost, RunEgress};
use crate::egress_transparent::{self, Transparent};
use crate::plan::{self, Facts, RealHost};
use crate::pool::{self, Pool, PoolSize, Warm};
use crate::probe::HostProbe;
use crate::protocol::{
    Command, EndReason, Enforced, Event, Fault, FileSpec, LandlockStatus, MountRole, MountSpec,
    NetMode, Rlimit, Spec,
};
use crate::supervise::{self, Outcome};

/// File name of the helper binary.
pub const HELPER_NAME: &str = "strata-helper";

/// Finds the helper: `$STRATA_HELPER`, then next to the running executable, then one
/// directory up when the executable is a cargo test binary in `target/*/deps`.
pub fn find_helper() -> std::result::Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("STRATA_HELPER") {
        let path = PathBuf::from(path);
        return if is_executable_file(&path) {
            Ok(path)
        } else {
            Err(format!(
                "STRATA_HELPER={} is not an executable file",
                path.display()
            ))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the running executable: {e}"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(HELPER_NAME));
        if dir.file_name().is_some_and(|n| n == "deps") {
            if let Some(up) = dir.parent() {
                candidates.push(up.join(HELPER_NAME));
            }
        }
    }
    candidates.into_iter().find(|c| is_executable_file(c)).ok_or_else(|| {
        format!(
            "{HELPER_NAME} not found next to {} (install it beside your program, set STRATA_HELPER, or pass its path to the builder)",
            exe.display()
        )
    })
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The Linux process sandbox.
///
/// Each run spawns the helper binary (never forking the embedding process), which creates
/// user, mount, pid, network, IPC, UTS and cgroup namespaces, pivots into a fresh root
/// holding only the granted mounts, drops every capability, sets `no_new_privs`, installs
/// landlock and a seccomp allowlist, and executes the tool under rlimits and a per-run
/// cgroup. The run ends when the tool's main process exits; everything it started is
/// killed with it.
///
/// Standard input: the caps' bytes, then the context's [`sandbox_core::StdinSource`] if
/// any, both written into a pipe by the host with non-blocking writes; the stream is read
/// [`sandbox_core::STDIN_BUFFER`] bytes at a time and only once the previous read went
/// into the pipe, so the host holds at most that much and the timeout fires while the
/// stream is open.
pub struct ProcessBackend {
    helper: std::result::Result<PathBuf, String>,
    probe: OnceLock<HostProbe>,
    pool: Arc<Pool>,
    fault: Option<Fault>,
    id_range: Option<IdRange>,
    state_dir: Option<PathBuf>,
    registry: OnceLock<Option<Arc<Registry>>>,
    probe_cache: Option<PathBuf>,
    /// The egress proxy, started by the first run under an allowlist.
    egress: OnceLock<std::result::Result<EgressHost, String>>,
}

impl std::fmt::Debug for ProcessBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessBackend")
            .field("helper", &self.helper)
            .finish()
    }
}

impl Drop for ProcessBackend {
    /// Kills the idle warm sandboxes (waiting up to 2 s for those being built) and waits (up
    /// to a second) until finished runs are torn down, so a dropped backend leaves nothing
    /// behind.
    fn drop(&mut self) {
        self.close_pool();
        crate::cgroup_cleanup::flush(std::time::Duration::from_secs(1));
    }
}

impl Default for ProcessBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessBackend {
    /// A backend using the helper found by [`find_helper`]. A missing helper is reported
    /// by `run` as [`Error::BackendUnavailable`], not here.
    pub fn new() -> Self {
        ProcessBackend {
            helper: find_helper(),
            probe: OnceLock::new(),
            pool: Arc::new(Pool::new(PoolSize::default())),
            fault: None,
            id_range: None,
            state_dir: None,
            registry: OnceLock::new(),
            probe_cache: None,
            egress: OnceLock::new(),
        }
    }

    /// A backend using the helper at `path`.
    pub fn with_helper(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let helper = if is_executable_file(&path) {
            Ok(path)
        } else {
            Err(format!(
                "helper {} is not an executable file",
                path.display()
            ))
        };
        ProcessBackend {
            helper,
            probe: OnceLock::new(),
            pool: Arc::new(Pool::new(PoolSize::default())),
            fault: None,
            id_range: None,
            state_dir: None,
            registry: OnceLock::new(),
            probe_cache: None,
            egress: OnceLock::new(),
        }
    }

    /// Keeps exactly up to `per_shape` sandboxes pre-built for each caps shape this backend
    /// has run, without expiry; `0` turns the pool off (every run cold). The default is
    /// [`PoolSize::default`]: adaptive, sized by recent demand. See [`Self::with_pool_size`].
    pub fn with_warm_pool(self, per_shape: usize) -> Self {
        self.with_pool_size(PoolSize::fixed(per_shape))
    }

    /// How many sandboxes to keep pre-built ([`PoolSize`]; default adaptive: after a caps
    /// shape has run, as many as it recently had runs in flight, at most 4 per shape and 8
    /// in all, each killed after 30 s unused). A warm run only pays for `fork` and `exec`;
    /// each pre-built sandbox is used once, so no run sees another's. Idle sandboxes are two
    /// sleeping processes each (no CPU) and are killed when the backend is dropped or the
    /// embedding process exits.
    pub fn with_pool_size(mut self, size: PoolSize) -> Self {
        self.pool = Arc::new(Pool::new(size));
        self
    }

    /// The block of host ids tools run as when the embedder is root. Default: the first
    /// `/etc/subuid` and `/etc/subgid` entries of root, else [`IdRange::FIXED`].
    pub fn with_id_range(mut self, range: IdRange) -> Self {
        self.id_range = Some(range);
        self
    }

    /// Where the agent-to-id registry lives. Default: [`Registry::default_dir`]
    /// (`$STRATA_STATE_DIR`, else `/var/lib/strata` for root).
    pub fn with_state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Keeps the cheap host probe (landlock ABI, seccomp, cgroup layout) in this backend's
    /// state directory ([`Self::with_state_dir`], default `$STRATA_STATE_DIR`, else
    /// `/var/lib/strata` for root, else the XDG state directory), so short-lived embedders
    /// such as the CLI do not probe the host on every start. Default: off (probed once per
    /// process). The cache is keyed on the Strata version, boot, kernel, ids and cgroup
    /// membership; the helper still enforces and reports every mechanism, failing closed.
    pub fn with_probe_cache(mut self) -> Self {
        let dir = self
            .state_dir
            .clone()
            .unwrap_or_else(|| Registry::default_dir(crate::sys::ids().0));
        self.probe_cache = Some(dir);
        self
    }

    /// The id registry: a root embedder's range, or an unprivileged embedder's subordinate
    /// ids; `None` when this embedder has no ids to give.
    fn registry(&self) -> Option<Arc<Registry>> {
        self.registry
            .get_or_init(|| {
                let euid = self.host().ids.0;
                let range = match self.id_range {
                    Some(range) => range,
                    None if euid == 0 => IdRange::for_user("root", euid),
                    None => IdRange::subordinate(euid)?,
                };
                let dir = self
                    .state_dir
                    .clone()
                    .unwrap_or_else(|| Registry::default_dir(euid));
                Some(Arc::new(Registry::new(dir, range)))
            })
            .clone()
    }

    /// Chooses the tool's host identity: agents get their own ids and other runs fresh
    /// ones, from the root embedder's range or an unprivileged embedder's subordinate ids.
    /// An embedder with neither keeps its own uid, and a named agent then cannot get one of
    /// its own (refused when strict, a gap otherwise).
    fn identity(
        &self,
        agent: Option<&str>,
        strictness: Strictness,
        gaps: &mut Vec<(Capability, String)>,
    ) -> Result<Identity> {
        let Some(registry) = self.registry() else {
            if let Some(agent) = agent {
                let reason = format!(
                    "agent {agent} cannot get its own host uid: the embedder (uid {}) is unprivileged and has no subordinate ids (/etc/subuid and /etc/subgid entries, and newuidmap from the uidmap package); the tool runs as the embedder's uid",
                    self.host().ids.0
                );
                if strictness == Strictness::Strict {
                    return Err(Error::unenforceable("identity: per-agent host uid", reason));
                }
                gaps.push((Capability::Privileges, reason));
            }
            return Ok(Identity::Embedder);
        };
        match agent {
            Some(agent) => registry.agent(agent).map(Identity::Agent).map_err(|e| {
                Error::setup(
                    SetupStage::Identity,
                    format!("host identity of agent {agent}"),
                    e,
                )
            }),
            None => Ok(Identity::Fresh(registry)),
        }
    }

    /// Number of idle pre-built sandboxes.
    pub fn warm_idle(&self) -> usize {
        self.pool.idle()
    }

    /// Kills the idle pre-built sandboxes and stops pre-building (later runs are cold);
    /// waits up to 2 s for sandboxes being built, which are killed when done.
    pub fn close_pool(&self) {
        self.pool.clear(std::time::Duration::from_secs(2));
    }

    /// The warm pool's counters (warm and cold runs, sandboxes built, expired, evicted).
    pub fn pool_stats(&self) -> pool::PoolStats {
        self.pool.stats()
    }

    /// Simulates the failure of one layer, to test that runs fail closed. Not for production.
    #[doc(hidden)]
    pub fn inject_fault(mut self, fault: Fault) -> Self {
        self.fault = Some(fault);
        self
    }

    /// The helper binary in use.
    pub fn helper(&self) -> Option<&Path> {
        self.helper.as_deref().ok()
    }

    /// The host probe (computed once per process), with injected faults applied.
    pub(crate) fn host(&self) -> &HostProbe {
        self.probe.get_or_init(|| {
            let mut probe = match &self.probe_cache {
                Some(dir) => HostProbe::cached_in(dir),
                None => HostProbe::cached(),
            };
            if self.fault == Some(Fault::Cgroup) {
                probe.cgroup = Err("simulated: the cgroup hierarchy is not writable".into());
            }
            probe
        })
    }

    fn unavailable(&self) -> Option<Error> {
        match &self.helper {
            Err(reason) => Some(Error::unavailable(BackendKind::Process, reason.clone())),
            Ok(_) => None,
        }
    }
}

/// The host identity a run's tool gets.
enum Identity {
    /// The agent's own ids.
    Agent(HostIds),
    /// Fresh ids for each sandbox, from this registry.
    Fresh(Arc<Registry>),
    /// The embedder's own ids (unprivileged embedder).
    Embedder,
}

impl Identity {
    fn source(&self) -> IdentitySource {
        match self {
            Identity::Agent(_) => IdentitySource::Agent,
            Identity::Fresh(_) => IdentitySource::Fresh,
            Identity::Embedder => IdentitySource::Embedder,
        }
    }
}

/// Decisions taken before the run, from the caps and the host probe.
struct Preflight {
    facts: Facts,
    gaps: Vec<(Capability, String)>,
    /// The cgroup layout's name for the receipt (`cgroup v1`, `cgroup v2`).
    cgroup_name: &'static str,
}

fn preflight(host: &HostProbe, strictness: Strictness) -> Result<Preflight> {
    let strict = strictness == Strictness::Strict;
    let mut gaps = Vec::new();
    if let Some(Err(reason)) = &host.namespaces {
        return Err(Error::unenforceable(
            "isolation: namespaces",
            reason.clone(),
        ));
    }
    if !host.seccomp {
        return Err(Error::unenforceable(
            "syscalls: seccomp",
            "seccomp filters are not available",
        ));
    }
    if host.landlock_abi == 0 {
        let reason = "landlock is not available in this kernel; only the mount namespace would restrict files";
        if strict {
            return Err(Error::unenforceable("fs: landlock", reason));
        }
        gaps.push((Capability::Fs, reason.to_string()));
    }
    let cgroups = host.cgroup.is_ok();
    if let Err(why) = &host.cgroup {
        // rlimits are per process (RLIMIT_AS, RLIMIT_CPU) or per host uid (RLIMIT_NPROC):
        // none of them caps the run as a whole, so none may stand in for the cgroup.
        let reason = format!(
            "no writable cgroup ({why}): memory, pids and CPU time cannot be capped for the run as a whole (rlimits are per process or per uid); run as root, or give this user a delegated cgroup v2 subtree (e.g. a systemd user scope)"
        );
        if strict {
            return Err(Error::unenforceable(
                "memory, pids and cpu: no cgroup",
                reason,
            ));
        }
        for capability in [Capability::Memory, Capability::Pids, Capability::Cpu] {
            gaps.push((capability, reason.clone()));
        }
    }
    Ok(Preflight {
        facts: Facts {
            uid: host.ids.0,
            gid: host.ids.1,
            cgroup_limits: cgroups,
            mapped_identity: false,
        },
        gaps,
        cgroup_name: host
            .cgroup
            .as_ref()
            .map_or("no cgroup", |layout| layout.name()),
    })
}

impl ProcessBackend {
    /// Runs like [`Backend::run`], letting `adjust` change the planned sandbox and command
    /// before anything starts (the container backend's hook: image root, user, env).
    pub(crate) fn run_adjusted(
        &self,
        tool: &Tool,
        caps: &Caps,
        ctx: &RunContext,
        adjust: &dyn Fn(&mut Spec, &mut Command) -> Result<()>,
    ) -> Result<RunOutput> {
        // The caps are validated (once) and their grants resolved before anything about
        // this host is probed: bad input is an InvalidRequest on every host.
        tool.validate()?;
        let run = RunSpec::new(caps, &RealHost)?;
        if let Some(err) = self.unavailable() {
            return Err(err);
        }
        let helper = self
            .helper()
            .ok_or_else(|| Error::unavailable(BackendKind::Process, "no helper"))?;
        let host = self.host();
        let mut pre = preflight(host, ctx.strictness)?;
        let identity = self.identity(run.agent.as_deref(), ctx.strictness, &mut pre.gaps)?;
        pre.facts.mapped_identity = !matches!(identity, Identity::Embedder);
        let (mut spec, mut command) = plan::plan(tool, run, &pre.facts, &RealHost)?;
        match &identity {
            Identity::Agent(ids) => spec.host_ids = Some(*ids),
            Identity::Fresh(_) => spec.fresh_ids = true,
            Identity::Embedder => {}
        }
        spec.landlock = host.landlock_abi > 0;
        spec.require_landlock = ctx.strictness == Strictness::Strict;
        spec.fault = self.fault.filter(|f| *f != Fault::Cgroup);
        adjust(&mut spec, &mut command)?;
        let mut egress =
            self.egress_for(&mut spec, &caps.secrets, ctx.strictness, &mut pre.gaps)?;
        let transparent = match (&egress, &spec.run.net, &spec.image) {
            (Some(_), Net::Allow(rules), None) => Transparent::plan(rules),
            _ => Transparent::default(),
        };
        if let Some((run_egress, _)) = &egress {
            run_egress.set_env(&mut command.env);
            spec.files.extend(run_egress.trust_files());
            let etc_file_free = |spec: &Spec, path: &str| {
                !spec
                    .run
                    .mounts
                    .iter()
                    .any(|m| Path::new(path).starts_with(&m.target))
                    && !spec.files.iter().any(|f| f.path == Path::new(path))
            };
            if !transparent.is_empty() && etc_file_free(&spec, "/etc/hosts") {
                spec.files.push(FileSpec {
                    path: "/etc/hosts".into(),
                    contents: transparent.hosts_file(),
                });
                if etc_file_free(&spec, "/etc/nsswitch.conf") {
                    spec.files.push(FileSpec {
                        path: "/etc/nsswitch.conf".into(),
                        contents: egress_transparent::NSSWITCH.into(),
                    });
                }
            }
        }
        let layout = host.cgroup.as_ref().ok();
        let registry = match &identity {
            Identity::Fresh(registry) => Some(Arc::clone(registry)),
            _ => None,
        };
        let key = spec.pool_key();
        // A kept workspace takes one overlay at a time: such image roots are never pooled
        // (a pre-built sandbox would mount it while this run writes to it).
        // Runs with secrets carry their own CA in the spec: no other run has that shape.
        let pooled = caps.secrets.is_empty()
            && spec
                .image
                .as_ref()
                .is_none_or(|image| image.workspace.is_none());
        let (warm, _lease) = match pooled {
            true => {
                let (warm, lease) = self.pool.take(&key);
                (warm, Some(lease))
            }
            false => (None, None),
        };
        let warm = match warm {
            Some(warm) => warm,
            None => pool::build(helper, &spec, layout, registry.as_deref())?,
        };
        if pooled {
            self.pool.refill(
                key,
                pool::Recipe {
                    helper: helper.to_path_buf(),
                    spec: spec.clone(),
                    layout: layout.cloned(),
                    registry,
                },
            );
        }
        let Warm {
            mut prepared,
            cgroup,
        } = warm;
        if let Some((run_egress, host)) = &mut egress {
            // `None`: the helper's setup failed before it got there; the run reports why.
            let listeners =
                prepared.take_egress_listeners(EGRESS_LISTENER_WAIT, &transparent.ports)?;
            if let Some(listeners) = listeners {
                run_egress.attach(host, listeners.proxy)?;
                run_egress.attach_transparent(host, listeners.transparent, &transparent.names)?;
            }
        }
        let usage = || cgroup.as_ref().and_then(|cg| cg.cpu_usage_us());
        let limits = &spec.run.limits;
        let cpu_watch = cgroup
            .as_ref()
            .filter(|cg| cg.cpu_usage_us().is_some())
            .map(|_| supervise::CpuWatch {
                usage_us: &usage,
                limit_us: u64::try_from(limits.cpu_time.as_micros()).unwrap_or(u64::MAX),
            });
        let pressure = cgroup.as_ref().and_then(|cg| cg.memory_pressure_trigger());
        let memory_watch = pressure
            .as_ref()
            .map(|trigger| supervise::MemoryWatch { trigger });
        // Taken only now, so a request refused above leaves the stream to the caller.
        let stream = match &ctx.stdin {
            Some(source) => Some(source.take()?),
            None => None,
        };
        let input = supervise::Input {
            bytes: &caps.stdin,
            stream,
        };
        let mut outcome = supervise::run(
            prepared,
            &command,
            spec.timeout(),
            input,
            limits.output.bytes(),
            supervise::Watches {
                cpu: cpu_watch,
                memory: memory_watch,
            },
            ctx,
        )?;
        // Every process of the run is gone (the helper reported it, or was killed): read the
        // counters now, and leave reaping the helper and removing the cgroup to the cleanup
        // thread, after the caller has its result.
        let stats = cgroup.as_ref().map(|cg| cg.stats());
        let helper_process = outcome.helper.take();
        crate::cgroup_cleanup::teardown_later(move || {
            drop(helper_process);
            drop(cgroup);
        });
        let mut output = finish(
            outcome,
            &spec,
            &command,
            &pre,
            stats,
            ctx.strictness,
            identity.source(),
        )?;
        if let Some((run_egress, _)) = egress {
            if !transparent.is_empty() {
                let names: Vec<&str> = transparent.names.iter().map(|(_, n)| n.as_str()).collect();
                let ports: Vec<String> = transparent.ports.iter().map(u16::to_string).collect();
                output.receipt.enforce(
                    Capability::Net,
                    Mechanism::Proxy,
                    "transparent interception",
                    format!(
                        "for tools that ignore the proxy variables: {} resolve in the sandbox's /etc/hosts to synthetic 198.18.0.0/15 addresses whose connections on ports {} the proxy takes; the TLS server name or HTTP Host must be that name",
                        names.join(","),
                        ports.join(",")
                    ),
                );
            }
            let names = run_egress.secret_names().join(",");
            if !names.is_empty() {
                output.receipt.enforce(
                    Capability::Net,
                    Mechanism::Proxy,
                    "secrets at egress",
                    format!(
                        "{names}: per-run placeholders in the sandbox; the values only in request headers to each secret's hosts (HTTPS through a per-run CA, name-constrained to those hosts, that the sandbox trusts)"
                    ),
                );
            }
            let (network, denials) = run_egress.finish();
            output.receipt.denials.extend(denials);
            output.receipt.network = Some(network);
        }
        Ok(output)
    }

    /// The egress proxy of this backend, started on first use; `Err` says why it could
    /// not start (then every later call says the same).
    pub(crate) fn egress_host(&self) -> std::result::Result<&EgressHost, String> {
        self.egress
            .get_or_init(|| EgressHost::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// For a run under a non-empty allowlist: registers it with the egress proxy (started
    /// on first use). If the proxy cannot start, a strict run is refused; a best-effort run
    /// gets no network at all (an empty allowlist) and the gap is listed.
    fn egress_for(
        &self,
        spec: &mut Spec,
        secrets: &[sandbox_core::caps::Secret],
        strictness: Strictness,
        gaps: &mut Vec<(Capability, String)>,
    ) -> Result<Option<(RunEgress, &EgressHost)>> {
        if spec.net() != NetMode::Egress {
            return Ok(None);
        }
        match self.egress_host() {
            Ok(host) => {
                let run = RunEgress::register_with_secrets(
                    host,
                    &spec.run.net,
                    &spec.run.limits,
                    secrets,
                )?;
                Ok(Some((run, host)))
            }
            Err(why) if strictness == Strictness::Strict => Err(Error::unenforceable(
                "net: allowlist",
                format!("the egress proxy could not start: {why}"),
            )),
            Err(why) => {
                gaps.push((
                    Capability::Net,
                    format!("egress proxy unavailable ({why}): the run has no network at all"),
                ));
                spec.run.net = Net::Allow(Vec::new());
                Ok(None)
            }
        }
    }
}

/// How long a run waits for its helper to hand over the egress listener (setup is
/// milliseconds; this only bounds a wedged helper).
const EGRESS_LISTENER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The allowlist as written, for the receipt.
fn allowlist_text(net: &Net) -> String {
    match net {
        Net::Allow(rules) => rules
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

impl Backend for ProcessBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }

    fn run(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        if caps.container.is_some() {
            return Err(Error::invalid(
                "caps.container (an image) is only honoured by the container backend; choose it with --backend container",
            ));
        }
        self.run_adjusted(tool, caps, ctx, &|_, _| Ok(()))
    }

    fn report(&self) -> BackendReport {
        let helper_check = match &self.helper {
            Ok(path) => sandbox_core::Check::new("helper", true, path.display().to_string()),
            Err(reason) => sandbox_core::Check::new("helper", false, reason.clone()),
        };
        let host = HostProbe::run(self.helper());
        let host = &host;
        let mut checks = vec![helper_check];
        checks.extend(host.checks());
        let reason = match (&self.helper, preflight(host, Strictness::Strict)) {
            (Err(reason), _) => Some(reason.clone()),
            (Ok(_), Err(e)) => Some(e.to_string()),
            (Ok(_), Ok(_)) => None,
        };
        BackendReport {
            backend: BackendKind::Process,
            available: reason.is_none(),
            reason,
            checks,
        }
    }
}

fn os_error(errno: i32, message: &str) -> io::Error {
    if errno > 0 {
        io::Error::from_raw_os_error(errno)
    } else {
        io::Error::other(message.to_string())
    }
}

fn finish(
    outcome: Outcome,
    spec: &Spec,
    command: &Command,
    pre: &Preflight,
    stats: Option<cgroup::Stats>,
    strictness: Strictness,
    identity: IdentitySource,
) -> Result<RunOutput> {
    let mut enforced: Option<Enforced> = None;
    let mut started = false;
    let mut exited = None;
    for event in outcome.events {
        match event {
            Event::SetupFailed {
                stage,
                step,
                errno,
                message,
                unenforceable,
            } => {
                return Err(match unenforceable {
                    Some(guarantee) => {
                        Error::unenforceable(guarantee, format!("{stage}: {step}: {message}"))
                    }
                    None => Error::setup(stage, step, os_error(errno, &message)),
                })
            }
            Event::ExecFailed { program, errno } => {
                return Err(Error::Exec {
                    program,
                    source: io::Error::from_raw_os_error(errno),
                })
            }
            Event::Ready { enforced: e } => enforced = Some(*e),
            Event::Started => started = true,
            exit @ Event::Exited { .. } => exited = Some(exit),
        }
    }
    if outcome.cancelled {
        return Err(Error::Cancelled);
    }
    let killed_reason = match &exited {
        Some(Event::Exited { killed, .. }) => *killed,
        _ => None,
    };
    // The tool ran if it was executed, or if it produced the output that got it killed.
    let ran = started || killed_reason == Some(EndReason::Output);
    let Some(enforced) = enforced.filter(|_| ran) else {
        return Err(match killed_reason {
            Some(EndReason::SetupTimeout) => Error::setup(
                SetupStage::Processes,
                "build sandbox",
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "building the sandbox took too long",
                ),
            ),
            Some(reason) => Error::Internal {
                message: format!("the sandbox was killed before the tool started ({reason})"),
                source: None,
            },
            None => Error::Internal {
                message: "the helper ended before starting the tool".into(),
                source: None,
            },
        });
    };
    check_enforced(&enforced, spec)?;
    let stats = stats.unwrap_or_default();
    let (wait_status, killed, user_us, system_us, max_rss, scratch_full) = match exited {
        Some(Event::Exited {
            wait_status,
            killed,
            user_cpu_us,
            system_cpu_us,
            max_rss_bytes,
            scratch_full,
        }) => (
            wait_status,
            killed,
            user_cpu_us,
            system_cpu_us,
            max_rss_bytes,
            scratch_full,
        ),
        _ if outcome.backstop_killed => (None, Some(EndReason::Wall), 0, 0, 0, false),
        // The helper itself was killed: at the memory limit (kernel buffers are charged to
        // the run too), that is the limit, not an internal failure.
        _ if stats.oom_kills > 0 => (None, Some(EndReason::Memory), 0, 0, 0, false),
        _ => {
            return Err(Error::Internal {
                message: "the helper ended without reporting how the tool exited".into(),
                source: None,
            })
        }
    };
    let (code, signal) = match wait_status {
        Some(s) if libc::WIFEXITED(s) => (Some(libc::WEXITSTATUS(s)), None),
        Some(s) if libc::WIFSIGNALED(s) => (None, Some(libc::WTERMSIG(s))),
        _ => (None, Some(libc::SIGKILL)),
    };
    let limits = &spec.run.limits;
    let cpu_used_us = stats.cpu_us.unwrap_or(user_us + system_us);
    let cpu_limit_us = u64::try_from(limits.cpu_time.as_micros()).unwrap_or(u64::MAX);
    let failed = code != Some(0);
    let limit = match killed {
        None | Some(EndReason::Cancelled) => None,
        Some(EndReason::InitDied) if stats.oom_kills > 0 => Some(LimitKind::Memory),
        Some(reason) => match reason.limit() {
            Some(limit) => Some(limit),
            None => {
                return Err(Error::Internal {
                    message: format!("the sandbox was killed unexpectedly ({reason})"),
                    source: None,
                })
            }
        },
    }
    .or_else(|| {
        if stats.oom_kills > 0 {
            Some(LimitKind::Memory)
        } else if signal == Some(libc::SIGXCPU)
            || (signal == Some(libc::SIGKILL) && cpu_used_us >= cpu_limit_us)
        {
            Some(LimitKind::Cpu)
        } else if signal == Some(libc::SIGXFSZ) {
            Some(LimitKind::FileSize)
        } else if failed && stats.pids_refused > 0 {
            Some(LimitKind::Pids)
        } else if failed && scratch_full {
            Some(LimitKind::Disk)
        } else {
            None
        }
    });
    let status = match (limit, code, signal) {
        (Some(limit), _, signal) => ExitStatus::Limit { limit, signal },
        (None, Some(code), _) => ExitStatus::Exited { code },
        (None, None, Some(signal)) => ExitStatus::Signaled { signal },
        (None, None, None) => ExitStatus::Signaled {
            signal: libc::SIGKILL,
        },
    };

    let applied = stats.applied;
    let mut receipt = receipt(spec, command, &enforced, pre, applied, strictness);
    receipt.identity = identity_receipt(&enforced, spec.run.agent.as_deref(), identity);
    if stats.cpu_us.is_some() {
        receipt.enforce(
            Capability::Cpu,
            Mechanism::Cgroup,
            "cgroup cpu accounting",
            format!(
                "{:?} for the whole sandbox, checked every 100 ms",
                limits.cpu_time
            ),
        );
    }
    if outcome.stdout_truncated {
        receipt.record_output_cut(Stream::Stdout, limits);
    }
    if outcome.stderr_truncated {
        receipt.record_output_cut(Stream::Stderr, limits);
    }
    if outcome.memory_watched {
        receipt.enforce(
            Capability::Memory,
            Mechanism::Cgroup,
            "cgroup v2 memory pressure watch",
            format!(
                "a run whose every task stalls on memory for {:?} within {:?} (thrashing at the limit) ends as the memory limit",
                cgroup::THRASH_STALL,
                cgroup::THRASH_WINDOW
            ),
        );
    }
    if outcome.thrashed {
        receipt.deny(
            Capability::Memory,
            format!(
                "thrashing at the {} memory limit: every task stalled on memory; the run was ended",
                sandbox_core::ByteSize(applied.memory_bytes)
            ),
        );
    }
    if stats.oom_kills > 0 {
        receipt.deny(
            Capability::Memory,
            format!(
                "{} process(es) killed at the {} memory limit",
                stats.oom_kills,
                sandbox_core::ByteSize(applied.memory_bytes)
            ),
        );
    }
    if stats.pids_refused > 0 {
        receipt.deny(
            Capability::Pids,
            format!(
                "{} fork(s) refused at the {} process limit",
                stats.pids_refused, applied.pids
            ),
        );
    }
    if scratch_full {
        receipt.deny(
            Capability::Disk,
            format!(
                "scratch space full at {}",
                sandbox_core::ByteSize(enforced.scratch_bytes)
            ),
        );
    }
    match limit {
        Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => receipt.record_end(kind, limits),
        Some(LimitKind::FileSize) => receipt.deny(
            Capability::FileSize,
            format!("a file reached {}", limits.file_size),
        ),
        _ => {}
    }

    let (stdout, stderr) = (outcome.stdout, outcome.stderr);
    Ok(RunOutput {
        status,
        stdout,
        stderr,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        duration: outcome.duration,
        usage: ResourceUsage {
            user_cpu_us: user_us,
            system_cpu_us: system_us,
            peak_memory_bytes: if stats.peak_memory > 0 {
                stats.peak_memory
            } else {
                max_rss
            },
        },
        receipt,
    })
}

/// The namespaces every process sandbox has (plus `net` unless the host network is shared).
const NAMESPACES: [&str; 6] = ["user", "mount", "pid", "ipc", "uts", "cgroup"];

/// Refuses a run whose helper reports less than the spec demands (fail closed: the receipt
/// is built from this report, so it must cover everything).
fn check_enforced(enforced: &Enforced, spec: &Spec) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::unenforceable(
            "helper report",
            format!("the helper reports {what}; the run's result is withheld"),
        ))
    };
    if enforced.net != spec.net() {
        return refuse(format!(
            "network mode {:?} where the spec asks for {:?}",
            enforced.net,
            spec.net()
        ));
    }
    let net = spec.net() != NetMode::Host;
    let wanted = NAMESPACES.iter().copied().chain(net.then_some("net"));
    for ns in wanted {
        if !enforced.namespaces.iter().any(|n| n == ns) {
            return refuse(format!("no {ns} namespace"));
        }
    }
    if enforced.net != spec.net() {
        return refuse(format!("network {:?}, not {:?}", enforced.net, spec.net()));
    }
    if !enforced.no_new_privs {
        return refuse("no_new_privs unset".into());
    }
    if !enforced.fds_closed {
        return refuse("inherited fds left open".into());
    }
    if enforced.seccomp_allowed == 0 {
        return refuse("no seccomp filter".into());
    }
    if enforced.uid_map.is_empty() || enforced.gid_map.is_empty() {
        return refuse("no uid or gid map".into());
    }
    let planned: Vec<&MountSpec> = spec.mounts();
    let made: Vec<&MountSpec> = enforced.mounts.iter().collect();
    if planned != made {
        return refuse(format!(
            "{} mounts where {} were planned",
            made.len(),
            planned.len()
        ));
    }
    if enforced.rlimits != spec.rlimits() {
        return refuse("other rlimits than planned".into());
    }
    Ok(())
}

/// The identity the helper mapped (its first map lines are the tool's ids).
fn identity_receipt(
    enforced: &Enforced,
    agent: Option<&str>,
    source: IdentitySource,
) -> Option<IdentityReceipt> {
    let (uid, host_uid, _) = *enforced.uid_map.first()?;
    let (gid, host_gid, _) = *enforced.gid_map.first()?;
    Some(IdentityReceipt {
        agent: agent.map(str::to_string),
        source,
        host_uid,
        host_gid,
        uid,
        gid,
    })
}

/// What the receipt says about host-executed paths inside writable grants.
pub fn host_executed_receipt(r: &mut Receipt, mounts: &[MountSpec], protect: bool) {
    let writable_dirs = mounts
        .iter()
        .any(|m| m.role == MountRole::Grant && m.writable && m.is_dir);
    if !writable_dirs {
        return;
    }
    if !protect {
        r.gap_by_request(
            Capability::Fs,
            "host-executed paths in writable grants (.git/hooks, .envrc, ...) are writable (protect_host_executed: false, by request)",
        );
        return;
    }
    let protected: Vec<String> = mounts
        .iter()
        .filter(|m| m.role == MountRole::HostExecuted)
        .map(|m| m.target.display().to_string())
        .collect();
    r.enforce(
        Capability::Fs, Mechanism::Mounts,
        "read-only binds over writable grants",
        if protected.is_empty() {
            "host-executed paths read-only: none present; a tool can still create one where none existed".to_string()
        } else {
            format!(
                "host-executed paths read-only: {}; their parent directories pinned (cannot be renamed or removed); a tool can still create one where none existed",
                protected.join(", ")
            )
        },
    );
}

/// The value of one rlimit the helper set, if it set it.
fn rlimit(enforced: &Enforced, resource: Rlimit) -> Option<u64> {
    enforced
        .rlimits
        .iter()
        .find(|r| r.resource == resource)
        .map(|r| r.soft)
}

/// The receipt, from what the helper reports it enforced and what the cgroup holds; the
/// request only for what the host enforces itself (the output cap).
fn receipt(
    spec: &Spec,
    command: &Command,
    enforced: &Enforced,
    pre: &Preflight,
    applied: cgroup::Applied,
    strictness: Strictness,
) -> Receipt {
    let mut r = Receipt::new(BackendKind::Process, strictness);
    // System directories by their path; every grant as GUEST=RESOLVED_HOST_PATH.
    let list = |writable: bool| {
        enforced
            .mounts
            .iter()
            .filter(|m| m.writable == writable)
            .filter_map(|m| match (m.role, &m.followed_from) {
                (MountRole::System, _) if m.source == m.target => {
                    Some(m.target.display().to_string())
                }
                (MountRole::System | MountRole::Grant, Some(from)) => Some(format!(
                    "{}={} (symlinks followed from {})",
                    m.target.display(),
                    m.source.display(),
                    from.display()
                )),
                (MountRole::System | MountRole::Grant, None) => {
                    Some(format!("{}={}", m.target.display(), m.source.display()))
                }
                (MountRole::HostExecuted | MountRole::Pin, _) => None,
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let ro = list(false);
    let rw = list(true);
    r.enforce(
        Capability::Fs,
        Mechanism::Namespace,
        "mount namespace + pivot_root",
        format!(
            "ro: {}; rw: {}; private /tmp, /dev (null, zero, full, random, urandom), /proc",
            if ro.is_empty() { "none" } else { &ro },
            if rw.is_empty() { "none" } else { &rw }
        ),
    );
    match enforced.landlock_status {
        LandlockStatus::NotEnforced => r.gap(
            Capability::Fs,
            "landlock not enforced: only the mount namespace restricts files",
        ),
        status => {
            // Landlock is the second wall: the rights an older ABI lacks (refer: 2, truncate:
            // 3, device ioctls: 5) each guard something the mount layer or the seccomp filter
            // already holds, so a partial ruleset is stated, not a missing guarantee (and a
            // strict run is neither refused for it nor carries a gap).
            let detail = if status == LandlockStatus::PartiallyEnforced {
                format!(
                    "partially enforced: this kernel's ABI {} lacks some of the rights of ABI {} (renames across directories, truncate, device ioctls); read-only bind mounts (no write, truncate or rename) and the seccomp filter (ioctls) hold those",
                    enforced.landlock_abi,
                    crate::fs_policy::TARGET_ABI as i32
                )
            } else {
                status.describe().to_string()
            };
            r.enforce(
                Capability::Fs,
                Mechanism::Landlock,
                format!("landlock ABI {}", enforced.landlock_abi),
                detail,
            );
        }
    }
    r.enforce(
        Capability::Fs, Mechanism::Mounts,
        "recursive read-only, nosuid, nodev bind mounts",
        "read-only grants cannot be written, truncated, chmodded, renamed or linked; grants resolved on the host without following symlinks (unless a grant asked) and opened with RESOLVE_NO_SYMLINKS",
    );
    host_executed_receipt(&mut r, &enforced.mounts, spec.run.protect_host_executed);
    if enforced.memfd_noexec {
        r.enforce(
            Capability::Fs,
            Mechanism::Sysctl,
            "vm.memfd_noexec=2",
            "fileless exec from memfd refused",
        );
    }
    match enforced.net {
        NetMode::Isolated => r.enforce(
            Capability::Net,
            Mechanism::Namespace,
            "empty network namespace",
            "loopback only",
        ),
        NetMode::Host => r.gap_by_request(
            Capability::Net,
            "host network shared (net: host, unrestricted by request)",
        ),
        NetMode::Egress => {
            r.enforce(
                Capability::Net,
                Mechanism::Namespace,
                "empty network namespace",
                "loopback only: no other interface, no route, no resolver",
            );
            r.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "egress proxy",
                format!(
                    "the only way out is the host's proxy at {} inside the sandbox (HTTP CONNECT, plain HTTP, SOCKS5h), with the run's own credential; names resolved by the host and pinned per connection; always-denied ranges refused; allowlist: {}",
                    crate::egress_link::proxy_addr(),
                    allowlist_text(&spec.run.net),
                ),
            );
        }
    }
    let keys: Vec<&str> = command
        .env
        .iter()
        .filter_map(|e| e.split('=').next())
        .collect();
    r.enforce(
        Capability::Env,
        Mechanism::Environment,
        "explicit environment",
        format!("host environment not inherited; set: {}", keys.join(",")),
    );
    let mut processes = "pid namespace".to_string();
    if enforced.landlock_scoped {
        processes.push_str(" + landlock signal scope");
    }
    r.enforce(
        Capability::Processes,
        Mechanism::Namespace,
        processes,
        "host processes invisible and unsignalable; ptrace denied",
    );
    r.enforce(
        Capability::Ipc,
        Mechanism::Namespace,
        "ipc namespace",
        "private SysV IPC and POSIX queues",
    );
    if enforced.landlock_scoped {
        r.enforce(
            Capability::Ipc,
            Mechanism::Landlock,
            "landlock abstract-socket scope",
            "host abstract unix sockets unreachable",
        );
    }
    r.enforce(
        Capability::Uts,
        Mechanism::Namespace,
        "uts namespace",
        "hostname strata",
    );
    r.enforce(
        Capability::Syscalls,
        Mechanism::Seccomp,
        "seccomp-bpf",
        format!(
            "x86_64 only (other ABIs killed); {} allowed, {} denied with EPERM, others ENOSYS",
            enforced.seccomp_allowed, enforced.seccomp_denied
        ),
    );
    let first = |map: &[(u32, u32, u32)]| map.first().copied().unwrap_or_default();
    let ((uid, host_uid, _), (gid, host_gid, _)) =
        (first(&enforced.uid_map), first(&enforced.gid_map));
    let caps_state = if enforced.caps_dropped {
        "all capabilities dropped".to_string()
    } else {
        format!(
            "only {} kept, in its own user namespace (over files of its own and the embedder's ids)",
            enforced.caps_kept.join(" and ")
        )
    };
    r.enforce(
        Capability::Privileges, Mechanism::Namespace,
        "user namespace",
        format!(
            "uid {uid} gid {gid} inside = host uid {host_uid} gid {host_gid}; {caps_state}; no_new_privs; securebits locked"
        ),
    );
    r.enforce(
        Capability::Privileges,
        Mechanism::Seccomp,
        "seccomp mode rules + nosuid mounts",
        "no setuid/setgid files, device nodes or file capabilities can be created",
    );
    r.enforce(
        Capability::Fds,
        Mechanism::Descriptors,
        "close_range",
        "only stdin, stdout, stderr inherited",
    );
    r.enforce(
        Capability::Lifetime,
        Mechanism::Supervisor,
        "pid namespace init + parent-death signal",
        "every process ends with the run, or when the embedding process dies",
    );
    if spec.cgroup_limits {
        let name = pre.cgroup_name;
        r.enforce(
            Capability::Memory,
            Mechanism::Cgroup,
            format!("{name} memory"),
            sandbox_core::ByteSize(applied.memory_bytes).to_string(),
        );
        r.enforce(
            Capability::Pids,
            Mechanism::Cgroup,
            format!("{name} pids"),
            applied.pids.to_string(),
        );
        if let Some(cpus) = applied.cpus() {
            r.enforce(
                Capability::Cpu,
                Mechanism::Cgroup,
                "cgroup cpu quota",
                format!("{cpus} core(s) of bandwidth"),
            );
        }
    } else {
        // Not the run's limits (the gaps say so): what each process is held to.
        if let Some(bytes) = rlimit(enforced, Rlimit::As) {
            r.enforce(
                Capability::Memory,
                Mechanism::Rlimit,
                "RLIMIT_AS (no writable cgroup)",
                format!(
                    "{} per process, not for the run",
                    sandbox_core::ByteSize(bytes)
                ),
            );
        }
        if let Some(n) = rlimit(enforced, Rlimit::Nproc) {
            r.enforce(
                Capability::Pids,
                Mechanism::Rlimit,
                "RLIMIT_NPROC (no writable cgroup)",
                format!("{n} processes of the tool's host uid, not for the run"),
            );
        }
    }
    if let (true, Some(bytes)) = (spec.cgroup_limits, rlimit(enforced, Rlimit::As)) {
        r.enforce(
            Capability::Memory,
            Mechanism::Rlimit,
            "RLIMIT_AS",
            sandbox_core::ByteSize(bytes).to_string(),
        );
    }
    if let Some(secs) = rlimit(enforced, Rlimit::Cpu) {
        r.enforce(
            Capability::Cpu,
            Mechanism::Rlimit,
            "RLIMIT_CPU",
            format!("{secs}s per process"),
        );
    }
    r.enforce(
        Capability::Wall,
        Mechanism::Supervisor,
        "helper deadline",
        format!(
            "{:?}; kills the whole pid namespace",
            std::time::Duration::from_millis(enforced.timeout_ms)
        ),
    );
    r.enforce(
        Capability::Output,
        Mechanism::Host,
        "host-side cap",
        format!(
            "{} per stream; the run is killed past it",
            spec.run.limits.output
        ),
    );
    let host_writable: Vec<String> = enforced
        .mounts
        .iter()
        .filter(|m| m.writable && m.role == MountRole::Grant)
        .map(|m| m.target.display().to_string())
        .collect();
    r.enforce(
        Capability::Disk,
        Mechanism::Tmpfs,
        "tmpfs size",
        if host_writable.is_empty() {
            format!(
                "{} shared by /tmp, /dev/shm and the workdir",
                sandbox_core::ByteSize(enforced.scratch_bytes)
            )
        } else {
            format!(
                "{} shared by /tmp, /dev/shm and the workdir; the read-write grants ({}) are the host's own directories, written in place and bounded by the host's file system (and each file by the file-size limit), not by this size",
                sandbox_core::ByteSize(enforced.scratch_bytes),
                host_writable.join(", ")
            )
        },
    );
    if let Some(bytes) = rlimit(enforced, Rlimit::Fsize) {
        r.enforce(
            Capability::FileSize,
            Mechanism::Rlimit,
            "RLIMIT_FSIZE",
            sandbox_core::ByteSize(bytes).to_string(),
        );
    }
    if let Some(n) = rlimit(enforced, Rlimit::Nofile) {
        r.enforce(
            Capability::OpenFiles,
            Mechanism::Rlimit,
            "RLIMIT_NOFILE",
            n.to_string(),
        );
    }
    for (capability, reason) in &pre.gaps {
        r.gap(*capability, reason.clone());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tests::sample_spec;

    /// What an honest helper reports for `spec`.
    fn honest(spec: &Spec) -> Enforced {
        Enforced {
            namespaces: NAMESPACES
                .iter()
                .chain(&["net"])
                .map(|s| s.to_string())
                .collect(),
            landlock_abi: 7,
            landlock_status: LandlockStatus::FullyEnforced,
            seccomp_allowed: 300,
            no_new_privs: true,
            uid_map: vec![(1000, 1000, 1)],
            gid_map: vec![(1000, 1000, 1)],
            fds_closed: true,
            mounts: spec.mounts().into_iter().cloned().collect(),
            net: spec.net(),
            rlimits: spec.rlimits(),
            ..Enforced::default()
        }
    }

    #[test]
    fn a_helper_report_missing_a_guarantee_withholds_the_result() {
        let mut spec = sample_spec();
        spec.run.mounts.push(MountSpec {
            source: "/data".into(),
            target: "/data".into(),
            writable: false,
            is_dir: true,
            exec: true,
            role: MountRole::Grant,
            followed_from: None,
        });
        assert!(check_enforced(&honest(&spec), &spec).is_ok());
        type Tamper = fn(&mut Enforced);
        let tampered: [(&str, Tamper); 7] = [
            ("no pid namespace", |e| e.namespaces.retain(|n| n != "pid")),
            ("no net namespace", |e| e.namespaces.retain(|n| n != "net")),
            ("host network", |e| e.net = NetMode::Host),
            ("no no_new_privs", |e| e.no_new_privs = false),
            ("fds open", |e| e.fds_closed = false),
            ("a mount missing", |e| {
                e.mounts.pop();
            }),
            ("other rlimits", |e| e.rlimits.clear()),
        ];
        for (what, tamper) in tampered {
            let mut report = honest(&spec);
            tamper(&mut report);
            let err = check_enforced(&report, &spec).expect_err(what);
            assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable, "{what}");
        }
    }
}
