//! One run: plan it from the caps, prepare grants, egress and the layer inside, take a
//! pooled VM or start one, drive the agent, and build the output and its receipt.

use super::*;

/// A run's private directory, naming this process as its owner; the first call of a
/// process sweeps directories of dead embedders ([`crate::leftovers`]).
pub(super) fn private_dir() -> std::io::Result<PrivateDir> {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        crate::leftovers::sweep(&std::env::temp_dir());
    });
    crate::leftovers::run_dir()
}

/// The argv the agent runs for `tool`.
pub(super) fn argv_for(tool: &Tool, layered: bool) -> Result<Vec<String>> {
    if let Some(argv) = session::plain_argv(tool)? {
        return Ok(argv);
    }
    match tool {
        Tool::Script { language, .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "{language} scripts need their interpreter in the guest root file system, which holds python3 and busybox only; sh and python scripts and commands work"
            ),
        )),
        Tool::Wasm { module, .. } if layered => Ok(vec![module.to_string_lossy().into_owned()]),
        Tool::Wasm { .. } => Err(Error::unavailable(
            BackendKind::Microvm,
            format!(
                "wasm tools run in the wasm backend inside the guest, which needs the guest tools ({} next to {})",
                crate::artifacts::INNER_TOOLS.join(" and "),
                crate::artifacts::AGENT_NAME
            ),
        )),
        _ => Err(Error::invalid("unknown tool kind")),
    }
}

/// What the caps ask of this backend, checked before anything boots.
pub(super) struct Plan {
    /// Guest RAM.
    pub(super) memory_mib: u64,
    /// The tool's memory limit (what the layer inside applies; the guest RAM without it).
    pub(super) tool_mib: u64,
    /// Whether the layer inside runs (and keeps the tool to `tool_mib`).
    pub(super) layered: bool,
    pub(super) vcpus: u32,
    pub(super) gaps: Vec<(Capability, String)>,
}

/// What any guest needs for `caps`, with the layer inside assumed (see [`Plan::with_layers`]):
/// requests no guest could honour are refused here, before the guest is even looked for.
pub(super) fn plan(caps: &Caps, strictness: Strictness) -> Result<Plan> {
    let mut gaps = Vec::new();
    let unenforceable =
        |guarantee: &str, reason: String, gaps: &mut Vec<(Capability, String)>, cap: Capability| {
            match strictness {
                Strictness::Strict => Err(Error::unenforceable_strict(guarantee, reason)),
                Strictness::BestEffort => {
                    gaps.push((cap, reason));
                    Ok(())
                }
            }
        };
    if caps.net == Net::Host {
        return Err(Error::unenforceable(
            "net: microvm",
            "a guest's only way out is the egress proxy: use net none or an allowlist (allow:HOST[:PORT],...), not host",
        ));
    }
    if !caps.secrets.is_empty() {
        return Err(Error::unenforceable(
            "net: microvm secrets",
            "secrets need the run's interception CA in the guest's trust store, which the microvm backend does not install yet",
        ));
    }
    let asked = caps.limits.memory.bytes() / ByteSize::mib(1).bytes();
    let memory_mib = if asked < MIN_GUEST_MIB {
        unenforceable(
            "memory: microvm guest RAM",
            format!("limits.memory is {asked} MiB; a guest needs at least {MIN_GUEST_MIB} MiB, so best-effort gives it {MIN_GUEST_MIB} MiB"),
            &mut gaps,
            Capability::Memory,
        )?;
        MIN_GUEST_MIB
    } else {
        asked
    };
    let cpus = caps.limits.cpus;
    let host_cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as u32;
    let vcpus = (cpus.ceil() as u32).clamp(1, host_cores.max(1));
    if cpus.fract() != 0.0 {
        unenforceable(
            "cpu: microvm vCPUs",
            format!("limits.cpus is {cpus}; the guest gets whole vCPUs ({vcpus}) and the VMM's host CPU bandwidth is not capped yet"),
            &mut gaps,
            Capability::Cpu,
        )?;
    }
    Ok(Plan {
        memory_mib: memory_mib + LAYER_OVERHEAD_MIB,
        tool_mib: memory_mib,
        layered: true,
        vcpus,
        gaps,
    })
}

impl Plan {
    /// The plan for a guest with (`layered`) or without the layer inside: without it, an
    /// image cannot run, the guest RAM is the tool's, and the pids limit is a gap.
    pub(super) fn with_layers(mut self, caps: &Caps, layered: bool) -> Result<Plan> {
        if layered {
            return Ok(self);
        }
        if caps.container.is_some() {
            return Err(Error::unavailable(
                BackendKind::Microvm,
                format!(
                    "images run with the native container runtime inside the guest, which needs the guest tools ({} next to {})",
                    crate::artifacts::INNER_TOOLS.join(" and "),
                    crate::artifacts::AGENT_NAME
                ),
            ));
        }
        self.memory_mib = self.tool_mib;
        self.layered = false;
        self.gaps.push((
            Capability::Pids,
            format!(
                "limits.processes ({}) is not applied in the guest (the tool runs as the guest's root, without the sandbox inside the guest); its processes are bounded by guest RAM and die with the VM",
                caps.limits.processes
            ),
        ));
        Ok(self)
    }
}

impl MicrovmBackend {
    pub(super) fn run_tool(&self, tool: &Tool, caps: &Caps, ctx: &RunContext) -> Result<RunOutput> {
        let started = Instant::now();
        // Requests no guest could honour are refused before the guest is even looked for.
        let plan = plan(caps, ctx.strictness)?;
        let artifacts = self.artifacts()?;
        let layered = self.layers && artifacts.inner.is_some();
        let argv = argv_for(tool, layered)?;
        let plan = plan.with_layers(caps, layered)?;
        let accel = self.usable_accel()?;
        let dir = private_dir()
            .map_err(|e| Error::setup(SetupStage::Host, "microvm: private temp dir", e))?;
        let (egress, proxy_env) = self.guest_egress(caps, dir.path(), &artifacts)?;
        let inner = if layered {
            Some(inner::plan(tool, caps, &proxy_env, &InnerPaths::guest())?)
        } else {
            None
        };
        let limits = &caps.limits;
        let mut request = match &inner {
            None => request::plain(argv.clone(), caps, &GUEST, &proxy_env, egress.is_some()),
            Some(inner) => request::inner(inner, limits, &GUEST, egress.is_some()),
        };
        let prepared = grants::prepare(&caps.mounts, dir.path(), limits.disk.bytes())?;
        request.mounts = prepared.mounts.clone();
        let input = match inner.as_ref().and_then(|i| i.input.as_deref()) {
            Some(host) => {
                let contents = crate::input::input_dir(host, dir.path())?;
                request.mounts.push(sandbox_agent::protocol::GuestMount {
                    serial: grants::input_serial(),
                    target: inner::INPUT_DIR.into(),
                    writable: false,
                });
                Some(grants::input_disk(&contents, dir.path())?)
            }
            None => None,
        };
        let disks = RunDisks {
            grants: prepared.disks.clone(),
            input,
            network: egress.as_ref().map(|e| e.relay.clone()),
        };
        let shape = Shape {
            memory_mib: plan.memory_mib,
            vcpus: plan.vcpus,
            accel: accel.accel,
            network: egress.is_some(),
        };
        let mut pooled = None;
        let (config, boot, snapshot) = if self.snapshots {
            let snap = self.snapshot(&artifacts, shape)?;
            if self.pool_size > 0
                && disks.grants.is_empty()
                && disks.input.is_none()
                && disks.network.is_none()
            {
                pooled = self.pool.take(shape, &snap.state);
                self.refill(self.restorer(&artifacts, &snap, shape), None);
            }
            let config = restore_config(
                self.console_cap,
                &artifacts,
                &snap,
                dir.path(),
                shape,
                &disks,
            )?;
            (config, Boot::Restored, Some(snap))
        } else {
            let mut config = self.cold_config(&artifacts, dir.path(), shape, disks.all())?;
            config.network = disks.network.clone();
            (config, Boot::Cold, None)
        };
        let archives = prepared
            .writable
            .iter()
            .map(|w| ArchiveTarget {
                mount: w.mount,
                path: dir.path().join(format!("archive{}.tar", w.mount)),
                cap: w.image_size + (16 << 20),
            })
            .collect();
        let sent = request.clone();
        let run_plan = RunPlan {
            greeting: boot.greeting(),
            ready_timeout: self.ready_timeout,
            request,
            stdin: &caps.stdin,
            archives,
        };
        let from_pool = pooled.is_some();
        let result = match pooled {
            Some(pooled) => {
                let result = session::run_on(pooled.vm, boot, run_plan, ctx);
                drop(pooled.dir);
                result
            }
            None => session::run(self.vmm.as_ref(), &config, boot, run_plan, ctx),
        };
        if let (Err(error), Some(snap)) = (&result, &snapshot) {
            if snapshot_is_suspect(error) {
                snap.discard();
            }
        }
        let vm = result?;
        let written_back = write_back(&prepared, &vm.archives);
        drop(dir);
        let cap = limits.output.bytes();
        let inner_result = match (&inner, &vm.ending) {
            (Some(_), Ending::Agent(GuestExit::Exited { .. } | GuestExit::Signaled { .. })) => {
                Some(inner::parse(vm.report.as_deref(), &vm.stderr, Place::Vm)?)
            }
            _ => None,
        };
        let (status, limit_hit) = if let Some(result) = &inner_result {
            let limit = match result.status {
                ExitStatus::Limit { limit, .. } => Some(limit),
                _ => None,
            };
            (result.status, limit)
        } else {
            session::exit_status(&vm.ending, argv.first().map_or("", String::as_str))?
        };
        // The tool started: what the agent applied for it must be what was asked.
        let applied_gaps = applied::require(
            applied::missing(&sent, vm.applied.as_ref()),
            ctx.strictness,
            Place::Vm,
        )?;
        let mut receipt = Receipt::new(BackendKind::Microvm, ctx.strictness);
        let guest = GuestSeen {
            kernel: &vm.kernel,
            rootfs: &artifacts.rootfs_version,
            boot: vm.boot,
            restored: boot == Boot::Restored,
            pooled: from_pool,
            memory_total: vm.applied.as_ref().and_then(|a| a.memory_total),
        };
        self.fill_receipt(&mut receipt, caps, &plan, &accel, &guest);
        grant_receipt(&mut receipt, caps, &prepared, &written_back);
        let proxied = egress.is_some();
        if let Some(egress) = egress {
            let (network, denials) = egress.run.finish_as(format!(
                "{} in the guest -> the host's egress proxy",
                NetRelay::GUEST_PROXY
            ));
            receipt.enforce(
                Capability::Net,
                Mechanism::Proxy,
                "host egress proxy",
                format!(
                    "allowlist [{}]; the guest's one network device is QEMU's user-mode network with restrict=on: its only peer is {} (relayed to the run's proxy socket, credential per run); no other address, no DNS",
                    network.rules.join(", "),
                    NetRelay::GUEST_PROXY
                ),
            );
            receipt.denials.extend(denials);
            receipt.network = Some(network);
        }
        for (cap, reason) in plan.gaps.into_iter().chain(applied_gaps) {
            receipt.gap(cap, reason);
        }
        let inner_ran = inner_result.is_some();
        if let Some(result) = &inner_result {
            inner::require_complete(result, ctx.strictness, Place::Vm, proxied)?;
        }
        if let Some(result) = inner_result {
            if proxied {
                inner::merge_proxied(
                    &mut receipt,
                    result.receipt,
                    Place::Vm,
                    NetRelay::GUEST_PROXY,
                );
            } else {
                inner::merge(&mut receipt, result.receipt, Place::Vm);
            }
            if let (Some(seen), Some(spec)) = (receipt.container.as_mut(), &caps.container) {
                // The image as the caller named it, not its guest path.
                seen.image = spec.image.clone();
            }
        } else if let Some(inner) = &inner {
            receipt.layers.push(inner.backend);
        }
        match limit_hit {
            _ if inner_ran => {}
            Some(kind @ (LimitKind::Wall | LimitKind::Cpu)) => receipt.record_end(kind, limits),
            Some(LimitKind::Output) => {
                let cap = limits.output.bytes();
                for (stream, len) in [
                    (Stream::Stdout, vm.stdout.len()),
                    (Stream::Stderr, vm.stderr.len()),
                ] {
                    if len as u64 >= cap {
                        receipt.record_output_cut(stream, limits);
                    }
                }
            }
            Some(LimitKind::Memory) => receipt.deny(
                Capability::Memory,
                format!(
                    "the guest's {} MiB ran out; its OOM killer ended the tool",
                    plan.memory_mib
                ),
            ),
            _ => {}
        }
        let stdout_truncated =
            limit_hit == Some(LimitKind::Output) && vm.stdout.len() as u64 >= cap;
        let stderr_truncated =
            limit_hit == Some(LimitKind::Output) && vm.stderr.len() as u64 >= cap;
        Ok(RunOutput {
            status,
            stdout: vm.stdout,
            stderr: vm.stderr,
            stdout_truncated,
            stderr_truncated,
            duration: started.elapsed(),
            usage: ResourceUsage::default(),
            receipt,
        })
    }
}
