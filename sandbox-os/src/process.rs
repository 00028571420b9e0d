//! The process backend: a Linux sandbox built by the `strata-helper` binary.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use sandbox_core::{
    Backend, BackendKind, BackendReport, Capability, Error, IdentitySource, Mechanism, Net, Result,
    RunContext, RunOutput, RunSpec, SetupStage, Strictness, Tool,
};

use crate::identity::{HostIds, IdRange, Registry};

use crate::egress_transparent::{self, Transparent};
use crate::outcome::finish;
use crate::plan::{self, Facts, RealHost};
use crate::pool::{self, Pool, PoolSize, Warm};
use crate::probe::HostProbe;
use crate::protocol::{Command, Fault, FileSpec, NetMode, Spec};
use crate::supervise;
use crate::userns;
use sandbox_egress::host::{EgressHost, RunEgress};

/// File name of the helper binary.
pub const HELPER_NAME: &str = "strata-helper";

/// Finds the helper: `$STRATA_HELPER`, then next to the running executable, then one
/// directory up when the executable is a cargo test binary in `target/*/deps`
/// ([`sandbox_core::binary::locate`]).
pub fn find_helper() -> std::result::Result<PathBuf, String> {
    sandbox_core::binary::locate(
        HELPER_NAME,
        "STRATA_HELPER",
        "install it beside your program, set STRATA_HELPER, or pass its path to the builder",
    )
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
        let helper = if sandbox_core::binary::is_executable_file(&path) {
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
                    return Err(Error::unenforceable_strict(
                        "identity: per-agent host uid",
                        reason,
                    ));
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
            // Where AppArmor may hand out powerless user namespaces, only trying tells: once
            // per backend, so a refusal names them rather than a lesser gap.
            if let (None, Ok(helper)) = (&probe.namespaces, &self.helper) {
                if userns::apparmor_may_restrict(probe.ids.0) {
                    probe.namespaces = Some(crate::probe::probe_namespaces(helper));
                }
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
pub(crate) struct Preflight {
    pub(crate) facts: Facts,
    pub(crate) gaps: Vec<(Capability, String)>,
    /// The cgroup layout's name for the receipt (`cgroup v1`, `cgroup v2`).
    pub(crate) cgroup_name: &'static str,
}

fn preflight(host: &HostProbe, strictness: Strictness) -> Result<Preflight> {
    let strict = strictness == Strictness::Strict;
    let mut gaps = Vec::new();
    // First: without user namespaces nothing else here can run, whatever the strictness,
    // and the refusal must say that rather than name a lesser gap (issue 33).
    if let Some(Err(reason)) = &host.namespaces {
        return Err(Error::unenforceable(userns::GUARANTEE, reason.clone()));
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
            return Err(Error::unenforceable_strict("fs: landlock", reason));
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
            return Err(Error::unenforceable_strict(
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
        run: &RunSpec,
        ctx: &RunContext,
        adjust: &dyn Fn(&mut Spec, &mut Command) -> Result<()>,
    ) -> Result<RunOutput> {
        let caps = &run.caps;
        let Planned {
            spec,
            command,
            pre,
            identity,
            mut egress,
            transparent,
        } = self.plan_sandbox(tool, run, ctx, adjust)?;
        let host = self.host();
        let helper = self
            .helper()
            .ok_or_else(|| Error::unavailable(BackendKind::Process, "no helper"))?;
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
        attach_egress(&mut prepared, &mut egress, &transparent)?;
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
            egress_receipt(&mut output.receipt, run_egress, &transparent);
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
            Err(why) if strictness == Strictness::Strict => Err(Error::unenforceable_strict(
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

/// A sandbox planned on this host: everything decided before its helper is spawned.
struct Planned<'a> {
    spec: Spec,
    command: Command,
    pre: Preflight,
    identity: Identity,
    egress: Option<(RunEgress, &'a EgressHost)>,
    transparent: Transparent,
}

impl ProcessBackend {
    /// Plans a sandbox for `run` on this host: probes, identity, the helper's spec and the
    /// tool's command (with `adjust` applied), and the egress registration.
    fn plan_sandbox(
        &self,
        tool: &Tool,
        run: &RunSpec,
        ctx: &RunContext,
        adjust: &dyn Fn(&mut Spec, &mut Command) -> Result<()>,
    ) -> Result<Planned<'_>> {
        // The spec was validated (once) and its grants resolved before anything about this
        // host is probed: bad input is an InvalidRequest on every host.
        run.require_kind(BackendKind::Process)?;
        let caps = &run.caps;
        let run = run.detached();
        if let Some(err) = self.unavailable() {
            return Err(err);
        }
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
        let egress = self.egress_for(&mut spec, &caps.secrets, ctx.strictness, &mut pre.gaps)?;
        let transparent = match (&egress, &spec.run.net, &spec.image) {
            (Some(_), Net::Allow(rules), None) => Transparent::plan(rules),
            _ => Transparent::default(),
        };
        if let Some((run_egress, _)) = &egress {
            run_egress.set_env(&mut command.env);
            spec.files
                .extend(run_egress.trust_files().into_iter().map(|file| {
                    crate::protocol::FileSpec {
                        path: file.path,
                        contents: file.contents,
                    }
                }));
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
        Ok(Planned {
            spec,
            command,
            pre,
            identity,
            egress,
            transparent,
        })
    }

    /// Builds a live sandbox for `run` (see [`crate::live`]): planned like a run, never
    /// pooled, its helper told to keep init serving execs.
    pub(crate) fn build_live(
        &self,
        run: &RunSpec,
        ctx: &RunContext,
        adjust: &dyn Fn(&mut Spec, &mut Command) -> Result<()>,
    ) -> Result<crate::live::LiveParts> {
        // The placeholder only completes the plan: init runs what each exec asks for.
        let placeholder = Tool::Command {
            argv: vec!["true".into()],
        };
        let Planned {
            mut spec,
            command,
            pre,
            identity,
            mut egress,
            transparent,
        } = self.plan_sandbox(&placeholder, run, ctx, adjust)?;
        spec.live = true;
        let helper = self
            .helper()
            .ok_or_else(|| Error::unavailable(BackendKind::Process, "no helper"))?;
        let registry = match &identity {
            Identity::Fresh(registry) => Some(Arc::clone(registry)),
            _ => None,
        };
        let Warm {
            mut prepared,
            cgroup,
        } = pool::build(
            helper,
            &spec,
            self.host().cgroup.as_ref().ok(),
            registry.as_deref(),
        )?;
        attach_egress(&mut prepared, &mut egress, &transparent)?;
        let secrets: Vec<String> = egress
            .as_ref()
            .map(|(run_egress, _)| {
                run_egress
                    .secret_names()
                    .into_iter()
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let workdir = spec.workdir().to_path_buf();
        let strictness = ctx.strictness;
        let receipt_command = command.clone();
        let receipt = Box::new(
            move |enforced: crate::protocol::Enforced,
                  cgroup: Option<&crate::cgroup::RunCgroup>|
                  -> Result<sandbox_core::Receipt> {
                let applied = cgroup.map(|cg| cg.stats().applied).unwrap_or_default();
                let mut receipt = crate::outcome::live_receipt(
                    &enforced,
                    &spec,
                    &receipt_command,
                    &pre,
                    applied,
                    strictness,
                    identity.source(),
                )?;
                receipt.enforce(
                    Capability::Lifetime,
                    Mechanism::Supervisor,
                    "live sandbox",
                    "one sandbox for every exec; it ends (every process, also those that left with setsid) when its supervisor stops it",
                );
                egress_lines(&mut receipt, &secrets, &transparent);
                Ok(receipt)
            },
        );
        Ok(crate::live::LiveParts {
            helper: prepared,
            cgroup,
            egress: egress.map(|(run_egress, _)| run_egress),
            command,
            workdir,
            receipt,
        })
    }
}

/// Serves a run's egress listeners once its helper handed them over.
fn attach_egress(
    prepared: &mut supervise::Prepared,
    egress: &mut Option<(RunEgress, &EgressHost)>,
    transparent: &Transparent,
) -> Result<()> {
    if let Some((run_egress, host)) = egress {
        // `None`: the helper's setup failed before it got there; the run reports why.
        let listeners = prepared.take_egress_listeners(EGRESS_LISTENER_WAIT, &transparent.ports)?;
        if let Some(listeners) = listeners {
            run_egress.attach(host, listeners.proxy)?;
            run_egress.attach_transparent(host, listeners.transparent, &transparent.names)?;
        }
    }
    Ok(())
}

/// The receipt's lines for a run's egress (transparent interception, secrets) and the
/// proxy's decisions.
fn egress_receipt(
    receipt: &mut sandbox_core::Receipt,
    run_egress: RunEgress,
    transparent: &Transparent,
) {
    let secrets: Vec<String> = run_egress
        .secret_names()
        .into_iter()
        .map(String::from)
        .collect();
    egress_lines(receipt, &secrets, transparent);
    let (network, denials) = run_egress.finish();
    receipt.denials.extend(denials);
    receipt.network = Some(network);
}

/// The receipt's lines for transparent interception and secrets at egress.
fn egress_lines(
    receipt: &mut sandbox_core::Receipt,
    secrets: &[String],
    transparent: &Transparent,
) {
    if !transparent.is_empty() {
        let names: Vec<&str> = transparent.names.iter().map(|(_, n)| n.as_str()).collect();
        let ports: Vec<String> = transparent.ports.iter().map(u16::to_string).collect();
        receipt.enforce(
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
    if !secrets.is_empty() {
        receipt.enforce(
            Capability::Net,
            Mechanism::Proxy,
            "secrets at egress",
            format!(
                "{}: per-run placeholders in the sandbox; the values only in request headers to each secret's hosts (HTTPS through a per-run CA, name-constrained to those hosts, that the sandbox trusts)",
                secrets.join(",")
            ),
        );
    }
}

/// How long a run waits for its helper to hand over the egress listener (setup is
/// milliseconds; this only bounds a wedged helper).
const EGRESS_LISTENER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The allowlist as written, for the receipt.
pub(crate) fn allowlist_text(net: &Net) -> String {
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

    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput> {
        if spec.caps.container.is_some() {
            return Err(Error::invalid(
                "caps.container (an image) is only honoured by the container backend; choose it with --backend container",
            ));
        }
        self.run_adjusted(tool, spec, ctx, &|_, _| Ok(()))
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
