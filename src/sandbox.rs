//! The `Sandbox` handle: backend choice, strictness, and the run entry points.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use sandbox_core::audit::{AuditEvent, AuditLog};
use sandbox_core::grant::RealHost;
use sandbox_core::{
    Backend, BackendKind, BackendReport, Caps, DoctorReport, Error, PolicyReceipt, Result,
    RunContext, RunOutput, RunSpec, Strictness, Tool,
};
use sandbox_policy::{self as policy, Approver, BackendOffer, GrantBook, RoutePolicy, Tier};

/// Which backend runs a tool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendChoice {
    /// Route by tool: WebAssembly modules to `wasm`, commands and scripts to `process`;
    /// caps with an image (`caps.container`) to `container`.
    #[default]
    Auto,
    /// Always this backend.
    Only(BackendKind),
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendChoice::Auto => f.write_str("auto"),
            BackendChoice::Only(kind) => write!(f, "{kind}"),
        }
    }
}

impl FromStr for BackendChoice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s == "auto" {
            Ok(BackendChoice::Auto)
        } else {
            s.parse().map(BackendChoice::Only).map_err(|_| {
                Error::invalid(format!(
                    "unknown backend {s:?} (expected auto, process, container, wasm, microvm or cluster)"
                ))
            })
        }
    }
}

/// Configures a [`Sandbox`]. Defaults: [`BackendChoice::Auto`], [`Strictness::Strict`],
/// the helper binary found next to the executable (or `$STRATA_HELPER`), no tier, no
/// approver, no audit log.
#[derive(Clone, Default)]
pub struct SandboxBuilder {
    backend: BackendChoice,
    strictness: Strictness,
    helper: Option<PathBuf>,
    warm_pool: Option<usize>,
    cache_host_probe: bool,
    #[cfg(feature = "process")]
    id_range: Option<sandbox_os::IdRange>,
    #[cfg(feature = "wasm")]
    wasm_config: Option<sandbox_wasm::WasmConfig>,
    #[cfg(feature = "wasm")]
    wasm_layered: bool,
    audit: Option<PathBuf>,
    tier: Option<String>,
    tiers: Vec<Tier>,
    approver: Option<Arc<dyn Approver>>,
    route_policy: RoutePolicy,
    cluster: Option<Arc<dyn Backend>>,
}

impl fmt::Debug for SandboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxBuilder")
            .field("backend", &self.backend)
            .field("strictness", &self.strictness)
            .field("tier", &self.tier)
            .field("approver", &self.approver.is_some())
            .field("audit", &self.audit)
            .finish_non_exhaustive()
    }
}

impl SandboxBuilder {
    /// Chooses the backend.
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// Strict (default): refuse runs whose caps cannot be enforced. Best-effort: run and
    /// list the gaps in the receipt.
    pub fn strictness(mut self, strictness: Strictness) -> Self {
        self.strictness = strictness;
        self
    }

    /// Path of the `strata-helper` binary used by the process backend.
    pub fn helper(mut self, path: impl Into<PathBuf>) -> Self {
        self.helper = Some(path.into());
        self
    }

    /// Keeps exactly up to `per_shape` process sandboxes pre-built for each caps shape
    /// already run; `0` turns the pool off. Default: adaptive
    /// ([`sandbox_os::PoolSize::default`]: as many as the shape recently had runs in
    /// flight, at most 4 per shape and 8 in all, killed after 30 s unused). A warm run skips
    /// namespace, filesystem, landlock, seccomp and cgroup setup; each pre-built sandbox is
    /// used for one run only. Container runs that keep a workspace are always built cold.
    pub fn warm_pool(mut self, per_shape: usize) -> Self {
        self.warm_pool = Some(per_shape);
        self
    }

    /// Keeps the process backend's host probe (landlock ABI, seccomp, cgroup layout) on
    /// disk across processes, in the state directory (`$STRATA_STATE_DIR`, else
    /// `/var/lib/strata` for root). Default: off (probed once per process). For short-lived
    /// processes such as the `strata` CLI. See
    /// [`sandbox_os::ProcessBackend::with_probe_cache`].
    pub fn cache_host_probe(mut self, cache: bool) -> Self {
        self.cache_host_probe = cache;
        self
    }

    /// The block of host ids the process and container backends give tools when the
    /// embedder is root. Default: root's first `/etc/subuid` and `/etc/subgid` entries,
    /// else [`IdRange::FIXED`](sandbox_os::IdRange::FIXED). The agent registry lives in
    /// `$STRATA_STATE_DIR` (default `/var/lib/strata` for root).
    #[cfg(feature = "process")]
    pub fn id_range(mut self, range: sandbox_os::IdRange) -> Self {
        self.id_range = Some(range);
        self
    }

    /// Configures the wasm backend: module cache directory, interpreter directory, pool
    /// size, fuel. Default: [`sandbox_wasm::WasmConfig::default`].
    #[cfg(feature = "wasm")]
    pub fn wasm_config(mut self, config: sandbox_wasm::WasmConfig) -> Self {
        self.wasm_config = Some(config);
        self
    }

    /// Runs the wasm engine inside the process sandbox (through the `strata-wasm-host`
    /// binary), so an engine escape still meets namespaces, landlock and seccomp; the
    /// receipt lists both layers. Default: off.
    #[cfg(feature = "wasm")]
    pub fn wasm_in_process_sandbox(mut self, layered: bool) -> Self {
        self.wasm_layered = layered;
        self
    }

    /// Records every run and refusal in the audit log at `path` (JSON lines chained by
    /// SHA-256, see [`sandbox_core::audit`]); refusals are `fsync`ed before the error is
    /// returned. Default: no audit log. [`SandboxBuilder::build`] refuses a log that does
    /// not verify.
    pub fn audit(mut self, path: impl Into<PathBuf>) -> Self {
        self.audit = Some(path.into());
        self
    }

    /// Checks every run against the tier named `name` (a preset `low`, `medium`, `high`, or
    /// one added with [`SandboxBuilder::define_tier`]); a run's [`RunContext::tier`]
    /// overrides it. A request beyond the tier is refused with [`Error::Denied`] naming the
    /// tier and the capability, unless an approver grants it. The tier decides on the host
    /// paths grants bind: each is resolved on the host first (a symlink it follows, to
    /// where it leads) and the run binds exactly the path checked. Default: no tier (only
    /// the caps apply). `medium`'s directory is `$HOME`.
    pub fn tier(mut self, name: impl Into<String>) -> Self {
        self.tier = Some(name.into());
        self
    }

    /// Adds (or replaces, by name) a tier runs may name.
    pub fn define_tier(mut self, tier: Tier) -> Self {
        self.tiers.retain(|t| t.name != tier.name);
        self.tiers.push(tier);
        self
    }

    /// Who decides requests beyond the tier (see [`sandbox_policy::elevation`]).
    /// Default: none, so such requests are refused.
    pub fn approver(mut self, approver: impl Approver + 'static) -> Self {
        self.approver = Some(Arc::new(approver));
        self
    }

    /// What the risk router may choose from (runs that declare a [`RunContext::risk`]).
    /// Default: every backend, never one below the risk's floor.
    pub fn route_policy(mut self, policy: RoutePolicy) -> Self {
        self.route_policy = policy;
        self
    }

    /// The cluster to run on when [`BackendKind::Cluster`] is asked for (by name: the router
    /// never picks it), e.g. a `sandbox_kube::backend::ClusterBackend` connected to a
    /// cluster running agent-sandbox. Default: none, and cluster runs are refused as
    /// unavailable. Its runs go through this sandbox's validation, tiers and audit log like
    /// any other.
    pub fn cluster(mut self, backend: Arc<dyn Backend>) -> Self {
        self.cluster = Some(backend);
        self
    }

    /// Builds the sandbox. Fails when the chosen backend is not compiled in, when the
    /// default tier is unknown, or when the audit log does not verify; host capabilities
    /// are checked per run (and by [`doctor`]).
    pub fn build(self) -> Result<Sandbox> {
        if let BackendChoice::Only(kind) = self.backend {
            if kind == BackendKind::Cluster && self.cluster.is_none() {
                return Err(Error::unavailable(kind, NO_CLUSTER));
            }
            if !compiled_in(kind) {
                return Err(Error::unavailable(kind, not_built_reason(kind)));
            }
        }
        let tiers = TierTable::new(self.tiers);
        if let Some(name) = &self.tier {
            tiers.get(name)?;
        }
        let audit = match &self.audit {
            Some(path) => Some(std::sync::Mutex::new(AuditLog::open(path)?)),
            None => None,
        };
        Ok(Sandbox {
            inner: Arc::new(Inner {
                audit,
                tier: self.tier,
                tiers,
                approver: self.approver,
                route_policy: self.route_policy,
                grants: std::sync::Mutex::new(GrantBook::new()),
                offers: std::sync::Mutex::new(Vec::new()),
                choice: self.backend,
                strictness: self.strictness,
                helper: self.helper,
                warm_pool: self.warm_pool,
                cache_host_probe: self.cache_host_probe,
                #[cfg(feature = "process")]
                id_range: self.id_range,
                #[cfg(feature = "wasm")]
                wasm_config: self.wasm_config,
                #[cfg(feature = "wasm")]
                wasm_layered: self.wasm_layered,
                #[cfg(feature = "process")]
                process: OnceLock::new(),
                #[cfg(feature = "wasm")]
                wasm: OnceLock::new(),
                #[cfg(feature = "container")]
                container: OnceLock::new(),
                microvm: OnceLock::new(),
                cluster: self.cluster,
            }),
        })
    }
}

/// Why a sandbox without a cluster cannot run on one.
const NO_CLUSTER: &str =
    "no cluster configured (give the sandbox one: SandboxBuilder::cluster, or the CLI's --kubeconfig with --warm-pool)";

fn compiled_in(kind: BackendKind) -> bool {
    (kind == BackendKind::Process && cfg!(feature = "process"))
        || (kind == BackendKind::Container && cfg!(feature = "container"))
        || (kind == BackendKind::Wasm && cfg!(feature = "wasm"))
        || kind == BackendKind::Microvm
        || kind == BackendKind::Cluster
}

fn not_built_reason(kind: BackendKind) -> String {
    match kind {
        BackendKind::Process | BackendKind::Container | BackendKind::Wasm => {
            format!("the {kind} backend is not compiled in (enable the `{kind}` cargo feature)")
        }
        _ => format!("the {kind} backend is not implemented in this version of strata"),
    }
}

/// What [`Sandbox::admit_live`] decided: the caps to start with (grants pinned), the
/// receipt's policy part, and the tier the supervisor checks each exec against.
#[cfg(feature = "process")]
pub(crate) struct LiveAdmission {
    pub(crate) caps: Caps,
    pub(crate) receipt: Option<PolicyReceipt>,
    pub(crate) tier: Option<Tier>,
}

/// The tiers a sandbox knows: the presets and the embedder's own (which win by name).
#[derive(Clone, Debug)]
struct TierTable {
    defined: Vec<Tier>,
    home: PathBuf,
}

impl TierTable {
    fn new(defined: Vec<Tier>) -> TierTable {
        TierTable {
            defined,
            home: Tier::default_home(),
        }
    }

    fn get(&self, name: &str) -> Result<Tier> {
        Tier::lookup(name, &self.defined, Some(&self.home))
    }
}

struct Inner {
    /// The audit log every run and refusal is recorded in, if any.
    audit: Option<std::sync::Mutex<AuditLog>>,
    /// The default tier's name.
    tier: Option<String>,
    tiers: TierTable,
    approver: Option<Arc<dyn Approver>>,
    route_policy: RoutePolicy,
    /// Live elevations of this sandbox.
    grants: std::sync::Mutex<GrantBook>,
    /// Backend availability, probed once per backend for the router.
    offers: std::sync::Mutex<Vec<(BackendKind, BackendOffer)>>,
    choice: BackendChoice,
    strictness: Strictness,
    helper: Option<PathBuf>,
    warm_pool: Option<usize>,
    cache_host_probe: bool,
    #[cfg(feature = "process")]
    id_range: Option<sandbox_os::IdRange>,
    #[cfg(feature = "wasm")]
    wasm_config: Option<sandbox_wasm::WasmConfig>,
    #[cfg(feature = "wasm")]
    wasm_layered: bool,
    /// The one process backend: process runs, the container backend's native runtime and
    /// the layered wasm engine share its helper, id registry and host probe (its warm pool
    /// serves runs without an image root).
    #[cfg(feature = "process")]
    process: OnceLock<Arc<sandbox_os::ProcessBackend>>,
    #[cfg(feature = "wasm")]
    wasm: OnceLock<Arc<dyn Backend>>,
    #[cfg(feature = "container")]
    container: OnceLock<Arc<dyn Backend>>,
    microvm: OnceLock<Arc<dyn Backend>>,
    cluster: Option<Arc<dyn Backend>>,
}

/// A handle that runs tools in sandboxes. Cheap to clone and safe to share across threads;
/// backends are created on first use and reused (warm caches, probes).
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("backend", &self.inner.choice)
            .field("strictness", &self.inner.strictness)
            .finish()
    }
}

impl Sandbox {
    /// A builder with the defaults.
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// The configured backend choice.
    pub fn choice(&self) -> BackendChoice {
        self.inner.choice
    }

    /// The helper given to the builder, if any.
    #[cfg(feature = "process")]
    pub(crate) fn helper_path(&self) -> Option<&std::path::Path> {
        self.inner.helper.as_deref()
    }

    /// The configured strictness.
    pub fn strictness(&self) -> Strictness {
        self.inner.strictness
    }

    /// Which backend would run `tool`.
    pub fn route(&self, tool: &Tool) -> BackendKind {
        match self.inner.choice {
            BackendChoice::Only(kind) => kind,
            BackendChoice::Auto => match tool {
                Tool::Wasm { .. } => BackendKind::Wasm,
                _ => BackendKind::Process,
            },
        }
    }

    /// The process backend as configured (helper, id range, warm pool), created on first
    /// use and shared by every backend that runs on it.
    #[cfg(feature = "process")]
    fn process_backend(&self) -> Arc<sandbox_os::ProcessBackend> {
        Arc::clone(self.inner.process.get_or_init(|| {
            let backend = self.configured_process();
            Arc::new(match self.inner.warm_pool {
                Some(per_shape) => backend.with_warm_pool(per_shape),
                None => backend,
            })
        }))
    }

    /// A process backend with this sandbox's helper, id range and probe cache (no warm
    /// pool setting).
    #[cfg(feature = "process")]
    fn configured_process(&self) -> sandbox_os::ProcessBackend {
        let backend = match &self.inner.helper {
            Some(path) => sandbox_os::ProcessBackend::with_helper(path),
            None => sandbox_os::ProcessBackend::new(),
        };
        let backend = match self.inner.id_range {
            Some(range) => backend.with_id_range(range),
            None => backend,
        };
        match self.inner.cache_host_probe {
            true => backend.with_probe_cache(),
            false => backend,
        }
    }

    /// The backend instance for `kind`.
    pub fn backend(&self, kind: BackendKind) -> Result<Arc<dyn Backend>> {
        match kind {
            #[cfg(feature = "process")]
            BackendKind::Process => Ok(self.process_backend()),
            #[cfg(feature = "wasm")]
            BackendKind::Wasm => {
                if let Some(b) = self.inner.wasm.get() {
                    return Ok(Arc::clone(b));
                }
                let mut config = self.inner.wasm_config.clone().unwrap_or_default();
                if self.inner.wasm_layered {
                    let outer = self.backend(BackendKind::Process)?;
                    let layering = sandbox_wasm::Layering::new(outer)
                        .map_err(|why| Error::unavailable(BackendKind::Wasm, why))?;
                    config.layered = Some(layering);
                }
                let backend: Arc<dyn Backend> =
                    Arc::new(sandbox_wasm::WasmBackend::with_config(config)?);
                Ok(Arc::clone(self.inner.wasm.get_or_init(|| backend)))
            }
            #[cfg(feature = "container")]
            BackendKind::Container => Ok(Arc::clone(self.inner.container.get_or_init(|| {
                Arc::new(sandbox_container::ContainerBackend::with_process(
                    self.process_backend(),
                ))
            }))),
            BackendKind::Microvm => Ok(Arc::clone(self.inner.microvm.get_or_init(|| {
                let vm = sandbox_vm::MicrovmBackend::new();
                // QEMU's jail uses this sandbox's helper and id range (an embedder such as
                // a Python or Node process has no helper next to its executable).
                #[cfg(feature = "process")]
                let vm = vm.jailed_in(Arc::new(self.configured_process().with_warm_pool(0)));
                Arc::new(vm)
            }))),
            BackendKind::Cluster => self
                .inner
                .cluster
                .clone()
                .ok_or_else(|| Error::unavailable(BackendKind::Cluster, NO_CLUSTER)),
            other => Err(Error::unavailable(other, not_built_reason(other))),
        }
    }

    /// Kills the process backend's pre-built (idle) sandboxes and stops building new ones;
    /// later runs are built cold. Waits up to 2 s for sandboxes being built. Bindings call
    /// it when their sandbox is closed, so nothing of it outlives `close()`. A no-op before
    /// the first process run.
    pub fn close_warm_pool(&self) {
        #[cfg(feature = "process")]
        if let Some(process) = self.inner.process.get() {
            process.close_pool();
        }
    }

    /// Probes this host for every backend as this sandbox would use it (its helper binary
    /// included): which backends and guarantees are available, and why not.
    pub fn doctor(&self) -> DoctorReport {
        let backends = BackendKind::ALL
            .into_iter()
            .map(|kind| match self.backend(kind) {
                Ok(backend) => backend.report(),
                Err(e) => BackendReport::unavailable(kind, e.to_string()),
            })
            .collect();
        DoctorReport { backends }
    }

    /// Runs `tool` with `caps`, blocking until the run and everything it started are gone.
    pub fn run(&self, tool: &Tool, caps: &Caps) -> Result<RunOutput> {
        self.run_with(tool, caps, &RunContext::default())
    }

    /// Like [`Sandbox::run`], with cancellation and streaming from `ctx`. The sandbox's
    /// strictness overrides `ctx.strictness` only when `ctx` leaves it at the default and
    /// the sandbox is best-effort.
    ///
    /// Before anything runs: the caps are validated; under a tier (`ctx.tier`, else the
    /// sandbox's), the grants are resolved on the host and pinned (a grant that follows
    /// symlinks is checked, and bound, where they lead: see [`sandbox_core::grant::pin`]),
    /// the tier is checked and elevations asked for; with backend `auto` and a declared
    /// `ctx.risk`, the router picks the backend (asking each backend whether it can run
    /// this tool, [`Backend::supports`]). Every refusal and policy decision is in
    /// the audit log (when configured) before this returns.
    pub fn run_with(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        self.run_audited(tool, caps, caps, ctx)
    }

    /// Admits and runs (see `admit_and_run`) with the sandbox's strictness, then records
    /// the run or its refusal in the audit log.
    pub(crate) fn run_audited(
        &self,
        tool: &Tool,
        tier_caps: &Caps,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<RunOutput> {
        let mut ctx = ctx.clone();
        if self.inner.strictness == Strictness::BestEffort {
            ctx.strictness = Strictness::BestEffort;
        }
        let result = self.admit_and_run(tool, tier_caps, caps, &ctx);
        if let Some(audit) = &self.inner.audit {
            let event = AuditEvent::of_run(tool, &result, caps.agent.clone());
            let mut log = match audit.lock() {
                Ok(log) => log,
                Err(poisoned) => poisoned.into_inner(),
            };
            log.record(event)
                .map_err(|e| Error::internal("writing the audit log", e))?;
        }
        result
    }

    /// Revokes every elevation granted so far (the return to the sandbox after an escape
    /// hatch); later runs beyond their tier ask the approver again.
    pub fn revoke_elevations(&self) {
        self.grants().revoke_all();
    }

    /// Records a policy event (an agent message accepted or refused, a decision of the
    /// embedder's own) in this sandbox's audit log, `fsync`ed before this returns; without
    /// a log the event is only traced (target `strata::audit`).
    pub fn audit(&self, event: AuditEvent) -> Result<()> {
        self.audit_policy(event)
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, GrantBook> {
        match self.inner.grants.lock() {
            Ok(book) => book,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records a policy event before it takes effect (the audit log `fsync`s it), or only
    /// traces it when the sandbox has no log.
    fn audit_policy(&self, event: AuditEvent) -> Result<()> {
        match &self.inner.audit {
            Some(audit) => {
                let mut log = match audit.lock() {
                    Ok(log) => log,
                    Err(poisoned) => poisoned.into_inner(),
                };
                log.record(event)
                    .map(drop)
                    .map_err(|e| Error::internal("writing the audit log", e))
            }
            None => {
                sandbox_core::audit::trace(&event);
                Ok(())
            }
        }
    }

    /// Runs `tool` with `caps` plus `workspace`'s staging copy mounted read-write at `guest`
    /// (default: the workspace's source path), so the tool sees the source's files and
    /// its writes stay in the copy until the caller commits some of them
    /// ([`Sandbox::commit_workspace`]) after reading [`Workspace::diff`]. The tier sees the
    /// workspace as a read of its source: nothing reaches the source without the caller's
    /// commit. Otherwise as [`Sandbox::run_with`].
    #[cfg(feature = "process")]
    pub fn run_in_workspace(
        &self,
        workspace: &sandbox_os::Workspace,
        guest: Option<&std::path::Path>,
        tool: &Tool,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<RunOutput> {
        use sandbox_core::{Access, Mount};
        let guest = guest.unwrap_or_else(|| workspace.grant_dir()).to_path_buf();
        let seen = caps.clone().with_mount(Mount::new(
            workspace.grant_dir().to_path_buf(),
            guest.clone(),
            Access::ReadOnly,
        ));
        let run = caps.clone().with_mount(Mount::new(
            workspace.path().to_path_buf(),
            guest,
            Access::ReadWrite,
        ));
        self.run_audited(tool, &seen, &run, ctx)
    }

    /// Commits the `selection` of `workspace`'s changes to its source (see
    /// [`Workspace::commit`]: flagged paths only when named in `accept_flagged`; devices and
    /// symlinks out of the grant never) and records the outcome in the audit log (`fsync`ed
    /// before this returns). The report lists every refused path and why.
    #[cfg(feature = "process")]
    pub fn commit_workspace(
        &self,
        workspace: &mut sandbox_os::Workspace,
        selection: &sandbox_policy::workspace::Selection,
        accept_flagged: &[PathBuf],
        mode: sandbox_policy::workspace::CommitMode,
    ) -> Result<sandbox_policy::workspace::CommitReport> {
        let result = workspace.commit(selection, accept_flagged, mode);
        let detail = match &result {
            Ok(report) => format!(
                "{}: {} applied, {} refused{}",
                workspace.grant_dir().display(),
                report.applied.len(),
                report.refused.len(),
                report
                    .refused
                    .iter()
                    .map(|r| format!("; {}: {:?}", r.path.display(), r.reason))
                    .collect::<String>()
            ),
            Err(e) => format!("{}: {e}", workspace.grant_dir().display()),
        };
        let decision = match &result {
            Ok(report) if report.refused.is_empty() => "committed",
            Ok(_) => "committed_in_part",
            Err(_) => "refused",
        };
        self.audit_policy(AuditEvent::Policy {
            subject: "workspace".into(),
            decision: decision.into(),
            detail,
        })?;
        result
    }

    /// `tier_caps` is what the tier sees, `caps` what runs (they differ for a workspace,
    /// whose staging copy the tier sees as a read of its source, and a session, whose
    /// directory is Strata's own). Under a tier, both have their grants resolved on the
    /// host and pinned first (see [`crate::grants`]): the tier decides on the paths the
    /// grants bind, and the pinned grants are what runs.
    fn admit_and_run(
        &self,
        tool: &Tool,
        tier_caps: &Caps,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<RunOutput> {
        // Bad input is refused before policy and routing look at it (the spec planned for
        // the chosen backend below checks it again with that backend's rules; no backend
        // validates on its own).
        caps.validate()?;
        tier_caps.validate()?;
        let mut receipt = PolicyReceipt::default();
        let mut pinned_caps = None;
        let tier_name = ctx.tier.as_ref().or(self.inner.tier.as_ref());
        if let Some(name) = tier_name {
            let tier = self.inner.tiers.get(name)?;
            let pinned = crate::grants::pin_for_tier(tier_caps, caps)?;
            let now_ms = unix_time_ms();
            let admission = {
                let mut book = self.grants();
                policy::admit(
                    &tier,
                    tool,
                    &pinned.tier_caps,
                    &mut book,
                    self.inner.approver.as_deref(),
                    now_ms,
                    &mut |event| self.audit_policy(event),
                )
            };
            let admission =
                admission.map_err(|e| crate::grants::explain_denied(e, &pinned.followed))?;
            receipt.tier = Some(tier.name);
            receipt.elevations = admission.elevations;
            receipt.followed = pinned.followed;
            pinned_caps = Some(pinned.caps);
        }
        let caps = pinned_caps.as_ref().unwrap_or(caps);
        let kind = self.choose_backend(tool, caps, ctx, &mut receipt)?;
        let spec = RunSpec::plan(kind, tool, caps, &RealHost)?;
        let backend = self.backend(kind)?;
        let span =
            tracing::info_span!("strata.run", backend = %backend.kind(), tool = %tool.describe());
        let _enter = span.enter();
        let result = backend.run(tool, &spec, ctx);
        match &result {
            Ok(out) => tracing::info!(
                status = %out.status,
                duration_ms = out.duration.as_secs_f64() * 1000.0,
                denials = out.receipt.denials.len(),
                "run finished"
            ),
            Err(e) => tracing::warn!(error = %e, kind = e.kind().code(), "run refused or failed"),
        }
        let mut out = result?;
        if receipt != PolicyReceipt::default() {
            out.receipt.policy = Some(receipt);
        }
        Ok(out)
    }

    /// Admits `caps` for a live sandbox under this sandbox's tier, if it has one: the
    /// grants resolved on the host and pinned, the caps' needs beyond the tier
    /// ([`Tier::check_caps`]) covered by grants or asked of the approver, every decision in
    /// the audit log (a refusal too) before this returns. Each exec's program is the
    /// supervisor's to check ([`sandbox_live::LivePolicy`]).
    ///
    /// # Errors
    /// [`Error::Denied`] naming the tier and what it does not allow; invalid caps.
    #[cfg(feature = "process")]
    pub(crate) fn admit_live(&self, caps: &Caps) -> Result<LiveAdmission> {
        caps.validate()?;
        let Some(name) = self.inner.tier.as_ref() else {
            return Ok(LiveAdmission {
                caps: caps.clone(),
                receipt: None,
                tier: None,
            });
        };
        let admitted: Result<LiveAdmission> = (|| {
            let tier = self.inner.tiers.get(name)?;
            let pinned = crate::grants::pin_for_tier(caps, caps)?;
            let needs = tier.check_caps(&pinned.tier_caps);
            // No program runs at start: the request names none (each exec is checked when
            // it starts).
            let start = Tool::Command { argv: Vec::new() };
            let admission = {
                let mut book = self.grants();
                policy::admit_needs(
                    &tier,
                    &start,
                    &pinned.tier_caps,
                    needs,
                    &mut book,
                    self.inner.approver.as_deref(),
                    unix_time_ms(),
                    &mut |event| self.audit_policy(event),
                )
            };
            let admission =
                admission.map_err(|e| crate::grants::explain_denied(e, &pinned.followed))?;
            let receipt = PolicyReceipt {
                tier: Some(tier.name.clone()),
                elevations: admission.elevations,
                followed: pinned.followed,
                ..PolicyReceipt::default()
            };
            Ok(LiveAdmission {
                caps: pinned.caps,
                receipt: Some(receipt),
                tier: Some(tier),
            })
        })();
        if let Err(error) = &admitted {
            self.audit_policy(AuditEvent::Refusal {
                tool: "live sandbox".into(),
                error: error.kind().code().to_string(),
                message: error.to_string(),
            })?;
        }
        admitted
    }

    /// Where this sandbox's audit log is, if it has one.
    pub(crate) fn audit_path(&self) -> Option<PathBuf> {
        self.inner.audit.as_ref().map(|log| {
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .path()
                .to_path_buf()
        })
    }

    /// The backend for this run: the configured one, or with `auto` the router's choice
    /// when a risk is declared (recorded in `receipt`), else by the tool's kind. A fixed
    /// backend with a declared risk must still meet the risk's floor.
    fn choose_backend(
        &self,
        tool: &Tool,
        caps: &Caps,
        ctx: &RunContext,
        receipt: &mut PolicyReceipt,
    ) -> Result<BackendKind> {
        let Some(risk) = ctx.risk else {
            return Ok(match self.inner.choice {
                BackendChoice::Auto if caps.container.is_some() => BackendKind::Container,
                _ => self.route(tool),
            });
        };
        let mut policy = self.inner.route_policy.clone();
        if let BackendChoice::Only(kind) = self.inner.choice {
            policy.allowed.retain(|k| *k == kind);
        }
        let route = policy::route(tool, caps, Some(risk), &policy, |kind| {
            self.offer_for(kind, tool)
        })?;
        self.audit_policy(AuditEvent::Policy {
            subject: "route".into(),
            decision: route.backend.to_string(),
            detail: route.reason.clone(),
        })?;
        let kind = route.backend;
        receipt.route = Some(route);
        Ok(kind)
    }

    /// Whether `kind` can run `tool` here: the backend's host probe (once per sandbox),
    /// then what this tool needs of it ([`Backend::supports`]: the wasm backend runs a
    /// Python or JavaScript script only with its WASI interpreter installed).
    fn offer_for(&self, kind: BackendKind, tool: &Tool) -> BackendOffer {
        let offer = self.offer(kind);
        if offer != BackendOffer::Available {
            return offer;
        }
        match self
            .backend(kind)
            .and_then(|backend| backend.supports(tool))
        {
            Ok(()) => BackendOffer::Available,
            Err(Error::BackendUnavailable { reason, .. }) => BackendOffer::Unavailable(reason),
            Err(e) => BackendOffer::Unavailable(e.to_string()),
        }
    }

    /// Whether `kind` can run tools here, probed once per sandbox.
    fn offer(&self, kind: BackendKind) -> BackendOffer {
        let mut offers = match self.inner.offers.lock() {
            Ok(o) => o,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some((_, offer)) = offers.iter().find(|(k, _)| *k == kind) {
            return offer.clone();
        }
        let offer = match self.backend(kind) {
            Ok(backend) => {
                let report = backend.report();
                match report.available {
                    true => BackendOffer::Available,
                    false => BackendOffer::Unavailable(
                        report.reason.unwrap_or_else(|| "not usable here".into()),
                    ),
                }
            }
            Err(e) => BackendOffer::Unavailable(e.to_string()),
        };
        offers.push((kind, offer.clone()));
        offer
    }

    /// Runs on tokio's blocking pool. Dropping the future cancels the run and kills the
    /// sandbox.
    #[cfg(feature = "tokio")]
    pub async fn run_async(&self, tool: Tool, caps: Caps) -> Result<RunOutput> {
        let ctx = RunContext::default();
        self.run_async_with(tool, caps, ctx).await
    }

    /// [`Sandbox::run_async`] with a context (its cancel token also cancels the run).
    #[cfg(feature = "tokio")]
    pub async fn run_async_with(
        &self,
        tool: Tool,
        caps: Caps,
        ctx: RunContext,
    ) -> Result<RunOutput> {
        struct CancelOnDrop(sandbox_core::CancelToken, bool);
        impl Drop for CancelOnDrop {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.cancel();
                }
            }
        }
        let mut guard = CancelOnDrop(ctx.cancel.clone(), false);
        let sandbox = self.clone();
        let handle = tokio::task::spawn_blocking(move || sandbox.run_with(&tool, &caps, &ctx));
        let result = handle.await.map_err(|e| Error::Internal {
            message: format!("run task failed: {e}"),
            source: None,
        })?;
        guard.1 = true;
        result
    }
}

/// Milliseconds since the Unix epoch now: the `now_ms` the policy layer's pure functions
/// take (grants, message windows). 0 if the clock is before 1970.
pub fn unix_time_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Probes this host once per backend: which backends and guarantees are available, and why
/// not.
pub fn doctor() -> DoctorReport {
    match Sandbox::builder().build() {
        Ok(sandbox) => sandbox.doctor(),
        Err(e) => DoctorReport {
            backends: vec![BackendReport::unavailable(
                BackendKind::Process,
                e.to_string(),
            )],
        },
    }
}
