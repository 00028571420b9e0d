//! The cluster backend (feature `backend`): runs a tool in a pod claimed from a warm pool of
//! agent-sandbox, through Strata's agent channel.
//!
//! One run:
//! 1. the run spec (planned for the cluster by the caller, [`sandbox_core::RunSpec::plan`])
//!    is checked against what a pod can honour (below), before anything is claimed;
//! 2. a `SandboxClaim` on the configured warm pool ([`Cluster::claim`]), then
//!    [`Cluster::wait_ready`] until the claim controller binds a ready sandbox;
//! 3. `strata-guest-agent serve` ([`AGENT_SERVE`]) is exec'd in the sandbox's pod through
//!    the API server (kube-rs `exec`, a websocket); the exec stream's standard input and
//!    output are the agent channel (the pod's [`sandbox_agent::Carrier`]), driven by the same
//!    run driver as a microVM's agent ([`sandbox_agent::driver`], every message worded for the
//!    pod); the run request carries argv, env, limits; the agent enforces the wall clock, the
//!    output cap and the rlimits, and kills the tool if the stream breaks;
//! 4. the claim is deleted on every path (its sandbox and pod follow; a used pod is never
//!    handed to another run).
//!
//! What a pod cannot honour is refused with a typed error, nothing claimed: grants of the
//! embedder's directories (a pod cannot see them; a session's upload is the way in), an
//! image in the caps (the pod's image is the template's), `net: host`, secrets, and wasm
//! tools.
//!
//! An egress allowlist runs through Strata's egress proxy, served by this process at the
//! one address the template's NetworkPolicy lets pods reach (`egress`): the run registers
//! its rules and budget there and the tool gets the proxy URL with the run's credential in
//! its environment. A template whose egress goes elsewhere (proxy pods in the cluster)
//! cannot apply the run's rules: refused when strict, a gap when best-effort.
//!
//! [`ClusterBackend::session`] holds one claimed pod across calls ([`ClusterSession`]: runs,
//! file writes and reads over the same channel, the claim deleted on close).
//!
//! With [`ClusterOptions::inner_cli`] (the `strata` CLI in the pool's image) the agent runs
//! the tool through that CLI under Strata's process backend inside the pod, as the microVM
//! backend does in its guest ([`sandbox_agent::inner`]); the inner receipt is merged.
//!
//! The receipt states what the cluster enforced, read from the pool's `SandboxTemplate`
//! (runtime class, security context, resource limits, NetworkPolicy), what the agent (or the
//! inner layer) enforced, and what nothing enforced (without the inner layer: no landlock or
//! seccomp of Strata's inside the pod; gVisor implements no landlock either way).

mod channel;
mod egress;
mod pod_session;
mod template;

use sandbox_core::SetupStage;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use sandbox_agent::applied;
use sandbox_agent::driver::{self as session, AgentRun, Ending, Greeting, RunPlan};
use sandbox_agent::inner::{self, InnerPaths, InnerRun};
use sandbox_agent::protocol::{GuestExit, RunRequest};
use sandbox_agent::request::{self, Base};
use sandbox_agent::{Carrier, Place};
use sandbox_core::{
    Backend, BackendKind, BackendReport, Capability, Caps, Check, Error, LimitKind, Mechanism, Net,
    Receipt, ResourceUsage, Result, RunContext, RunOutput, RunSpec, Strictness, Tool,
};

use crate::client::{error_chain, Cluster, ClusterError};
use crate::crd::{ClaimLifecycle, NameRef, SandboxClaimSpec, ShutdownPolicy};
use crate::render::{AGENT_SERVE, CONTAINER_NAME, MANAGED_BY, MANAGED_BY_LABEL};
use crate::{Kind, SandboxClaim};

pub use pod_session::{ClusterSession, MAX_READ, MAX_WRITE};
pub use template::TemplateSeen;

/// How long a claim may take to bind a ready sandbox by default: 60 s (a cold pod pulls its
/// image; a warm one binds in well under a second).
pub const DEFAULT_CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the exec'd agent may take to say it is ready by default: 30 s.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment every run starts from in the pod (the caps' `env` is laid over it).
const POD_ENV: [(&str, &str); 3] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", crate::render::WORKSPACE),
    ("LANG", "C.UTF-8"),
];

/// Where the backend finds its cluster and which warm pool it claims from.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The namespace of the warm pool and the claims.
    pub namespace: String,
    /// The `SandboxWarmPool` to claim from (`strata kube apply` names it `strata-TIER`).
    pub warm_pool: String,
    /// How long a claim may take to bind. Default [`DEFAULT_CLAIM_TIMEOUT`].
    pub claim_timeout: Duration,
    /// How long the exec'd agent may take to answer. Default [`DEFAULT_AGENT_TIMEOUT`].
    pub agent_timeout: Duration,
    /// The `strata` CLI in the pool's image (e.g. `/strata/strata`). With it, the agent runs
    /// the tool through that CLI under Strata's process backend inside the pod (namespaces,
    /// seccomp, landlock where the runtime has it, cgroups), as the microVM backend does in
    /// its guest, and the receipt lists that layer too. Default: none (the agent runs the
    /// tool itself; the runtime class is the only boundary).
    pub inner_cli: Option<String>,
    /// Where this process serves the egress proxy for allowlist runs. Default: the address
    /// the pool's template lets pods reach (`strata kube apply --egress-proxy IP:PORT`),
    /// which must then be one of this machine's; set it when this machine has that address
    /// under another one (NAT, a load balancer). The proxy starts on the first allowlist
    /// run and is shared by every backend of this process listening there.
    pub egress_listen: Option<SocketAddr>,
}

impl ClusterOptions {
    /// Claims from `warm_pool` in `namespace`, with the default timeouts.
    pub fn new(namespace: impl Into<String>, warm_pool: impl Into<String>) -> ClusterOptions {
        ClusterOptions {
            namespace: namespace.into(),
            warm_pool: warm_pool.into(),
            claim_timeout: DEFAULT_CLAIM_TIMEOUT,
            agent_timeout: DEFAULT_AGENT_TIMEOUT,
            inner_cli: None,
            egress_listen: None,
        }
    }
}

/// A cluster running agent-sandbox, as a [`Backend`]. Owns a small tokio runtime for the
/// API calls, so it can be called from synchronous code (and from inside another runtime).
pub struct ClusterBackend {
    runtime: tokio::runtime::Runtime,
    cluster: Cluster,
    options: ClusterOptions,
    template: OnceLock<TemplateSeen>,
    /// The egress proxy, once an allowlist run started it (kept for later runs).
    egress_proxy: Mutex<Option<Arc<egress::HostProxy>>>,
}

impl std::fmt::Debug for ClusterBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBackend")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ClusterBackend {
    /// Connects to the cluster of a kubeconfig file (its current context; `None`: the
    /// `KUBECONFIG` variable, else `~/.kube/config`). Nothing is sent to the cluster yet.
    /// An `https` server is verified against the kubeconfig's `certificate-authority(-data)`
    /// (else the system's roots), over rustls; its credentials (token, client certificate,
    /// exec plugin) are kube-rs's.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a kubeconfig that cannot be read or used; [`Error::Setup`] if
    /// the runtime cannot start. A server that cannot be reached or trusted fails the first
    /// call that needs it (a setup error naming the step).
    pub fn connect(kubeconfig: Option<&Path>, options: ClusterOptions) -> Result<ClusterBackend> {
        let (runtime, client) = connect(kubeconfig)?;
        let cluster = Cluster::new(client, options.namespace.clone());
        Ok(ClusterBackend {
            runtime,
            cluster,
            options,
            template: OnceLock::new(),
            egress_proxy: Mutex::new(None),
        })
    }

    /// The options this backend was connected with.
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// What the warm pool's template enforces (read once from the cluster, then kept).
    ///
    /// # Errors
    /// [`Error::Setup`] when the pool or its template cannot be read.
    pub fn template(&self) -> Result<&TemplateSeen> {
        if let Some(seen) = self.template.get() {
            return Ok(seen);
        }
        let cluster = self.cluster.clone();
        let pool = self.options.warm_pool.clone();
        let seen = self.block(
            async move { template::read(&cluster, &pool).await },
            &RunContext::default(),
        )??;
        Ok(self.template.get_or_init(|| seen))
    }

    /// Runs `future` on the backend's runtime and waits for it; cancelling `ctx` abandons
    /// it (the task is aborted) with [`Error::Cancelled`].
    fn block<T: Send + 'static>(
        &self,
        future: impl std::future::Future<Output = T> + Send + 'static,
        ctx: &RunContext,
    ) -> Result<T> {
        let (tx, rx) = mpsc::channel();
        let task = self.runtime.spawn(async move {
            let _ = tx.send(future.await);
        });
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(value) => return Ok(value),
                Err(mpsc::RecvTimeoutError::Timeout) if ctx.cancel.is_cancelled() => {
                    task.abort();
                    return Err(Error::Cancelled);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::Internal {
                        message: "cluster: the API task ended without an answer".into(),
                        source: None,
                    })
                }
            }
        }
    }

    /// The egress proxy listening at `listen`: the one this backend keeps, else started (or
    /// shared with another backend of this process) and kept.
    fn egress_proxy_at(&self, listen: SocketAddr) -> Result<Arc<egress::HostProxy>> {
        let mut kept = self.egress_proxy.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(proxy) = kept.as_ref().filter(|p| p.listen() == listen) {
            return Ok(proxy.clone());
        }
        let proxy = egress::proxy_at(listen)?;
        *kept = Some(proxy.clone());
        Ok(proxy)
    }

    /// Deletes the claim, waiting for the API server's answer; a failure is logged (the
    /// claim's own expiry is the backstop).
    fn release(&self, claim: &str) {
        let cluster = self.cluster.clone();
        let name = claim.to_owned();
        match self.block(
            async move { cluster.release(&name).await },
            &RunContext::default(),
        ) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(claim, error = %e, "cluster: releasing the claim failed"),
            Err(e) => tracing::warn!(claim, error = %e, "cluster: releasing the claim failed"),
        }
    }
}

/// A runtime for the API calls and a client of the kubeconfig's cluster (see
/// [`ClusterBackend::connect`]).
fn connect(kubeconfig: Option<&Path>) -> Result<(tokio::runtime::Runtime, kube::Client)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("strata-cluster")
        .enable_all()
        .build()
        .map_err(|e| Error::setup(SetupStage::Host, "cluster: tokio runtime", e))?;
    let path = kubeconfig.map(Path::to_path_buf);
    let client = runtime.block_on(async move {
        let config = match path {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(&path).map_err(|e| {
                    Error::invalid(format!("cluster: kubeconfig {}: {e}", path.display()))
                })?;
                kube::Config::from_custom_kubeconfig(file, &Default::default())
                    .await
                    .map_err(|e| {
                        Error::invalid(format!("cluster: kubeconfig {}: {e}", path.display()))
                    })?
            }
            None => kube::Config::from_kubeconfig(&Default::default())
                .await
                .map_err(|e| Error::invalid(format!("cluster: kubeconfig: {e}")))?,
        };
        kube::Client::try_from(config)
            .map_err(|e| Error::invalid(format!("cluster: kube client: {e}")))
    })?;
    Ok((runtime, client))
}

/// Applies a tier's `SandboxTemplate` and `SandboxWarmPool` to the cluster of a kubeconfig
/// (see [`Cluster::apply_tier`]: idempotent; a changed object is replaced).
///
/// # Errors
/// As [`ClusterBackend::connect`]; [`Error::Setup`] naming the object the API server
/// refused.
pub fn apply(
    kubeconfig: Option<&Path>,
    namespace: &str,
    rendered: &crate::Rendered,
) -> Result<crate::client::Applied> {
    let (runtime, client) = connect(kubeconfig)?;
    let cluster = Cluster::new(client, namespace);
    runtime
        .block_on(cluster.apply_tier(rendered))
        .map_err(|e| cluster_error("apply", e))
}

/// A run checked and planned, before its pod is claimed.
struct Prepared {
    seen: TemplateSeen,
    gaps: Vec<(Capability, String)>,
    inner: Option<InnerRun>,
    request: RunRequest,
    egress: Option<egress::PodEgress>,
}

/// A claim on `pool`, named by the API server (`generateName`), deleted with its sandbox
/// on expiry.
pub fn claim_on(pool: &str) -> SandboxClaim {
    SandboxClaim {
        api_version: Kind::SandboxClaim.api_version(),
        kind: Kind::SandboxClaim.name().to_owned(),
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            generate_name: Some(format!("{pool}-")),
            labels: Some([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned())].into()),
            ..Default::default()
        },
        spec: SandboxClaimSpec {
            warm_pool_ref: NameRef {
                name: pool.to_owned(),
            },
            lifecycle: ClaimLifecycle {
                shutdown_policy: ShutdownPolicy::Delete,
            },
        },
        status: None,
    }
}

/// The argv the agent runs for `tool`.
fn argv_for(tool: &Tool) -> Result<Vec<String>> {
    if let Some(argv) = session::plain_argv(tool)? {
        return Ok(argv);
    }
    match tool {
        Tool::Script { language, .. } => Err(Error::unavailable(
            BackendKind::Cluster,
            format!("{language} scripts: the cluster backend runs sh and python scripts and commands (the interpreter must be in the pool's image)"),
        )),
        Tool::Wasm { .. } => Err(Error::unavailable(
            BackendKind::Cluster,
            "wasm tools: the pool's image has no wasm runtime; run them on the wasm backend",
        )),
        _ => Err(Error::invalid("unknown tool kind")),
    }
}

/// Refuses what a pod cannot honour whatever its template.
fn refusals(caps: &Caps) -> Result<()> {
    if let Some(mount) = caps.mounts.first() {
        return Err(Error::invalid(format!(
            "cluster: {} is a directory of this machine, which a pod cannot see; put files in a session's workspace instead",
            mount.host.display()
        )));
    }
    if caps.container.is_some() {
        return Err(Error::invalid(
            "cluster: the pod's image is the warm pool's template's; caps.container cannot choose another",
        ));
    }
    if caps.net == Net::Host {
        return Err(Error::unenforceable(
            "net: cluster",
            "a pod reaches only what its template's NetworkPolicy allows: use net none or an allowlist",
        ));
    }
    if !caps.secrets.is_empty() {
        return Err(Error::unenforceable(
            "net: cluster secrets",
            "secrets are swapped in by the egress proxy over TLS it terminates, so the tool must trust the run's CA; the cluster backend has no place to install it in the pod (its root is read-only) yet",
        ));
    }
    Ok(())
}

/// The inner run's caps and result files, in the pod's workspace (the agent's working
/// directory), out of the inner sandbox's sight.
const INNER_CAPS: &str = ".strata-inner/caps.json";
const INNER_RESULT: &str = ".strata-inner/result.json";

/// The inner run through the image's `strata` CLI, if the options name one.
fn inner_plan(
    cli: Option<&str>,
    tool: &Tool,
    caps: &Caps,
    strictness: Strictness,
    proxy_env: &[(String, String)],
) -> Result<Option<InnerRun>> {
    let Some(cli) = cli else { return Ok(None) };
    let paths = InnerPaths {
        place: Place::Pod,
        cli: cli.to_owned(),
        caps_file: INNER_CAPS.into(),
        result_file: INNER_RESULT.into(),
    };
    let mut inner = inner::plan(tool, caps, proxy_env, &paths)?;
    if strictness == Strictness::BestEffort {
        inner.argv.insert(2, "--best-effort".into());
    }
    Ok(Some(inner))
}

/// How a pod shapes the agent's requests: [`POD_ENV`] under the caps' variables, the
/// agent's own directory (the pod's workspace) when the caps name none, the caller's proxy
/// variables replaced only by an allowlist run's proxy.
pub(crate) const POD: Base = Base {
    env: &POD_ENV,
    default_cwd: None,
    strip_proxy_always: false,
    inner_env: &POD_ENV,
    inner_cwd: "",
};

/// A [`ClusterError`] of one step of a run, as the core's error.
fn cluster_error(step: &str, e: ClusterError) -> Error {
    match e {
        ClusterError::Timeout { .. } => Error::setup(
            SetupStage::Cluster,
            format!("cluster: {step}"),
            std::io::Error::new(std::io::ErrorKind::TimedOut, error_chain(&e)),
        ),
        other => Error::setup(
            SetupStage::Cluster,
            format!("cluster: {step}"),
            std::io::Error::other(error_chain(&other)),
        ),
    }
}

impl Backend for ClusterBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cluster
    }

    fn run(&self, tool: &Tool, spec: &RunSpec, ctx: &RunContext) -> Result<RunOutput> {
        let started = Instant::now();
        let prepared = self.prepare(tool, spec, ctx, true)?;
        let caps = &spec.caps;
        let cluster = self.cluster.clone();
        let claim = claim_on(&self.options.warm_pool);
        let name = self
            .block(async move { cluster.claim(&claim).await }, ctx)?
            .map_err(|e| cluster_error("claim", e))?;
        let claimed = Instant::now();
        let outcome = self.bind(&name, ctx).and_then(|bound| {
            let bound_at = Instant::now();
            let vm = self.drive(&bound.sandbox, prepared.request.clone(), caps, ctx)?;
            Ok((vm, bound_at))
        });
        self.release(&name);
        let (vm, bound_at) = outcome?;
        let lifetime = format!(
            "SandboxClaim {name} on pool {} bound in {} ms; deleted with its sandbox and pod when the run ended",
            self.options.warm_pool,
            bound_at.saturating_duration_since(claimed).as_millis()
        );
        self.finish(tool, caps, ctx, prepared, vm, started, lifetime)
    }

    fn report(&self) -> BackendReport {
        let checks = match self.template() {
            Ok(seen) => vec![Check::new(
                "warm pool",
                true,
                format!(
                    "{}/{}: template {}, runtime class {}",
                    self.options.namespace,
                    self.options.warm_pool,
                    seen.template,
                    seen.runtime_class
                        .as_deref()
                        .unwrap_or("(none: the node's default)")
                ),
            )],
            Err(e) => vec![Check::new("warm pool", false, e.to_string())],
        };
        let available = checks.iter().all(|c| c.ok);
        BackendReport {
            backend: BackendKind::Cluster,
            available,
            reason: (!available).then(|| {
                checks
                    .iter()
                    .map(|c| c.detail.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            }),
            checks,
        }
    }
}

fn tool_program(tool: &Tool) -> String {
    argv_for(tool)
        .ok()
        .and_then(|argv| argv.into_iter().next())
        .unwrap_or_default()
}

impl ClusterBackend {
    /// Checks `caps` against what a pod can honour (nothing is claimed when this fails) and
    /// builds the run request (`layered`: through the image's CLI when the options name one).
    fn prepare(
        &self,
        tool: &Tool,
        spec: &RunSpec,
        ctx: &RunContext,
        layered: bool,
    ) -> Result<Prepared> {
        spec.require_kind(BackendKind::Cluster)?;
        let caps = &spec.caps;
        let argv = argv_for(tool)?;
        refusals(caps)?;
        let seen = self.template()?.clone();
        let mut gaps = template::check_limits(&seen, caps, ctx.strictness)?;
        let egress = egress::plan(
            &seen,
            caps,
            ctx.strictness,
            self.options.egress_listen,
            |listen| self.egress_proxy_at(listen),
            &mut gaps,
        )?;
        let proxy_env = egress
            .as_ref()
            .map(egress::PodEgress::proxy_env)
            .unwrap_or_default();
        let cli = self.options.inner_cli.as_deref().filter(|_| layered);
        let inner = inner_plan(cli, tool, caps, ctx.strictness, &proxy_env)?;
        let request = match &inner {
            Some(inner) => request::inner(inner, &caps.limits, &POD, false),
            None => request::plain(argv, caps, &POD, &proxy_env, false),
        };
        Ok(Prepared {
            seen,
            gaps,
            inner,
            request,
            egress,
        })
    }

    /// Waits until the claim `claim` is bound to a ready sandbox.
    fn bind(&self, claim: &str, ctx: &RunContext) -> Result<crate::client::Bound> {
        let cluster = self.cluster.clone();
        let name = claim.to_owned();
        let timeout = self.options.claim_timeout;
        self.block(async move { cluster.wait_ready(&name, timeout).await }, ctx)?
            .map_err(|e| cluster_error("waiting for the claim", e))
    }

    /// Execs the agent's `serve` in `pod` and drives `request` over its stream.
    fn drive(
        &self,
        pod: &str,
        request: RunRequest,
        caps: &Caps,
        ctx: &RunContext,
    ) -> Result<AgentRun> {
        let pods: Api<Pod> =
            Api::namespaced(self.cluster.client().clone(), self.cluster.namespace());
        let name = pod.to_owned();
        let params = AttachParams::default()
            .container(CONTAINER_NAME)
            .stdin(true)
            .stdout(true)
            .stderr(true);
        let attached = self
            .block(
                async move { pods.exec(&name, AGENT_SERVE.to_vec(), &params).await },
                ctx,
            )?
            .map_err(|e| {
                Error::setup(
                    SetupStage::Cluster,
                    format!("cluster: exec {} in pod {pod}", AGENT_SERVE.join(" ")),
                    std::io::Error::other(error_chain(&e)),
                )
            })?;
        let mut channel = channel::PodChannel::open(self.runtime.handle(), attached, pod)?;
        let plan = RunPlan {
            greeting: Greeting::AwaitReady,
            ready_timeout: self.options.agent_timeout,
            request,
            stdin: &caps.stdin,
            archives: Vec::new(),
        };
        let result = session::drive(&mut channel, Instant::now(), plan, ctx);
        channel.teardown();
        result
    }

    /// The run's output and receipt from what came back (`lifetime`: how the pod was held).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        tool: &Tool,
        caps: &Caps,
        ctx: &RunContext,
        prepared: Prepared,
        vm: AgentRun,
        started: Instant,
        lifetime: String,
    ) -> Result<RunOutput> {
        let Prepared {
            seen,
            gaps,
            inner,
            egress,
            request,
        } = prepared;
        let inner_result = match (&inner, &vm.ending) {
            (Some(_), Ending::Agent(GuestExit::Exited { .. } | GuestExit::Signaled { .. })) => {
                Some(inner::parse(vm.report.as_deref(), &vm.stderr, Place::Pod)?)
            }
            _ => None,
        };
        let (status, limit_hit) = match &inner_result {
            Some(result) => {
                let limit = match result.status {
                    sandbox_core::ExitStatus::Limit { limit, .. } => Some(limit),
                    _ => None,
                };
                (result.status, limit)
            }
            None => session::exit_status(&vm.ending, tool_program(tool).as_str())?,
        };
        // The tool started: what the pod's agent applied for it must be what was asked.
        let mut missing = applied::missing(&request, vm.applied.as_ref());
        missing.extend(template::memory_not_applied(&seen, vm.applied.as_ref()));
        let applied_gaps = applied::require(missing, ctx.strictness, Place::Pod)?;
        let mut receipt = Receipt::new(BackendKind::Cluster, ctx.strictness);
        template::fill_receipt(
            &mut receipt,
            &seen,
            caps,
            inner.is_some(),
            vm.applied.as_ref(),
        );
        let peer = egress.as_ref().map(|e| e.peer().to_string());
        if let Some(egress) = egress {
            egress.finish(&mut receipt);
        }
        receipt.enforce(
            Capability::Lifetime,
            Mechanism::Cluster,
            "claimed pod",
            lifetime,
        );
        for (cap, reason) in gaps.into_iter().chain(applied_gaps) {
            receipt.gap(cap, reason);
        }
        let inner_ran = inner_result.is_some();
        if let Some(result) = &inner_result {
            inner::require_complete(result, ctx.strictness, Place::Pod, peer.is_some())?;
        }
        if let Some(result) = inner_result {
            match &peer {
                Some(peer) => inner::merge_proxied(&mut receipt, result.receipt, Place::Pod, peer),
                None => inner::merge(&mut receipt, result.receipt, Place::Pod),
            }
        }
        match limit_hit {
            _ if inner_ran => {}
            Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => {
                receipt.record_end(kind, &caps.limits)
            }
            Some(LimitKind::Output) => {
                let cap = caps.limits.output.bytes();
                for (stream, len) in [
                    (sandbox_core::Stream::Stdout, vm.stdout.len()),
                    (sandbox_core::Stream::Stderr, vm.stderr.len()),
                ] {
                    if len as u64 >= cap {
                        receipt.record_output_cut(stream, &caps.limits);
                    }
                }
            }
            _ => {}
        }
        let cap = caps.limits.output.bytes();
        let truncated = |len: usize| limit_hit == Some(LimitKind::Output) && len as u64 >= cap;
        Ok(RunOutput {
            status,
            stdout_truncated: truncated(vm.stdout.len()),
            stderr_truncated: truncated(vm.stderr.len()),
            stdout: vm.stdout,
            stderr: vm.stderr,
            duration: started.elapsed(),
            usage: ResourceUsage::default(),
            receipt,
        })
    }
}
