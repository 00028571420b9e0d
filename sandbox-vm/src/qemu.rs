//! QEMU `-M microvm` as a [`Vmm`].
//!
//! Command line: `-M microvm,accel=<tcg|kvm> -cpu max|host -m <MiB> -smp <n> -nodefaults
//! -no-user-config -nographic -no-reboot`, the kernel with `console=ttyS0 tsc=reliable
//! no_timer_check tsc_early_khz=<host kHz> panic=-1 quiet` (microvm has no PIT or HPET: without
//! these the kernel hangs calibrating its clock), the serial console on QEMU's stdout (read by
//! a host thread that keeps the tail), one virtio-serial port `org.strata.agent` on a Unix
//! socket and QMP on another. Both sockets listen on the host side and QEMU connects to
//! them at startup, so there is no polling for socket files. Disks ([`crate::vmm::Disk`])
//! are raw images on `virtio-blk-device`s, read-only ones opened `readonly=on` by QEMU. No
//! network or other device exists.

use sandbox_core::SetupStage;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sandbox_core::{
    Access, Backend, ByteSize, CancelToken, Caps, Error, Limits, Result, RunContext, Stream, Tool,
};

use crate::vmm::{Accel, NetRelay, VmConfig, VmInstance, Vmm};
use sandbox_agent::protocol::PORT_NAME;
use sandbox_agent::{Carrier, Place};

/// TCG translation cache per VM, MiB.
const TCG_TB_MIB: u32 = 32;

/// QEMU's x86 system emulator driven as a microvm.
#[derive(Clone)]
pub struct Qemu {
    binary: PathBuf,
    jail: Option<Arc<dyn Backend>>,
}

impl std::fmt::Debug for Qemu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qemu")
            .field("binary", &self.binary)
            .field("jailed", &self.jail.is_some())
            .finish()
    }
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu {
            binary: PathBuf::from("qemu-system-x86_64"),
            jail: None,
        }
    }
}

impl Qemu {
    /// QEMU at `binary` (default: `qemu-system-x86_64` from `PATH`).
    pub fn with_binary(binary: impl Into<PathBuf>) -> Self {
        Qemu {
            binary: binary.into(),
            jail: None,
        }
    }

    /// Runs QEMU as a tool of `jail` (the process backend: its own namespaces, seccomp,
    /// landlock limited to the files the VM needs, a cgroup, an unprivileged uid), the way
    /// Firecracker's jailer confines its VMM. Default: not jailed.
    pub fn jailed(mut self, jail: Arc<dyn Backend>) -> Self {
        self.jail = Some(jail);
        self
    }

    /// The binary this driver runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The kernel command line for a guest on this host.
    pub fn kernel_args() -> String {
        let mut args = String::from("console=ttyS0 tsc=reliable no_timer_check");
        if let Some(khz) = host_tsc_khz() {
            args.push_str(&format!(" tsc_early_khz={khz}"));
        }
        args.push_str(" panic=-1 quiet init_on_free=1");
        args
    }

    fn command(&self, config: &VmConfig, agent_sock: &Path, qmp_sock: &Path) -> Command {
        // QEMU must not outlive the thread that started it (the run's, which waits for the
        // VM), even when the embedder is killed with SIGKILL: util-linux's setpriv sets the
        // parent-death signal and execs QEMU (so no unsafe `pre_exec` is needed here).
        let mut cmd = match SETPRIV.iter().map(Path::new).find(|p| p.is_file()) {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(&self.binary);
                cmd
            }
            None => Command::new(&self.binary),
        };
        cmd.args(Self::args(config, agent_sock, qmp_sock))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            .process_group(0);
        cmd
    }

    /// QEMU's arguments for `config`.
    fn args(config: &VmConfig, agent_sock: &Path, qmp_sock: &Path) -> Vec<String> {
        let mut cmd = ArgList::default();
        // TCG's translation cache defaults to 1 GiB of host memory per VM; 32 MiB holds a
        // guest's hot code (measured: no slower for tools, far less resident memory).
        let (accel, cpu) = match config.accel {
            Accel::Kvm => ("kvm".to_string(), "host"),
            Accel::Tcg => (format!("tcg,tb-size={TCG_TB_MIB}"), "max"),
        };
        cmd.args(["-M", "microvm", "-accel", &accel, "-cpu", cpu])
            .args(["-m", &config.memory_mib.to_string()])
            .args(["-smp", &config.vcpus.to_string()])
            .args(["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"])
            .args(["-serial", "stdio"])
            .arg("-kernel")
            .arg(&config.kernel)
            .arg("-initrd")
            .arg(&config.initrd)
            .args(["-append", &Self::kernel_args()]);
        for (i, disk) in config.disks.iter().enumerate() {
            let mut drive = format!(
                "file={},format=raw,if=none,id=disk{i}",
                escape_option(&disk.path.to_string_lossy())
            );
            if disk.read_only {
                drive.push_str(",readonly=on");
            }
            cmd.arg("-drive").arg(drive).arg("-device").arg(format!(
                "virtio-blk-device,drive=disk{i},serial={}",
                escape_option(&disk.serial)
            ));
        }
        cmd.args(["-device", "virtio-serial-device"])
            .arg("-chardev")
            .arg(format!("socket,id=agent,path={}", agent_sock.display()))
            .args([
                "-device",
                &format!("virtserialport,chardev=agent,name={PORT_NAME}"),
            ])
            .arg("-chardev")
            .arg(format!("socket,id=qmp,path={}", qmp_sock.display()))
            .args(["-mon", "chardev=qmp,mode=control"]);
        if let Some(net) = &config.network {
            let relay = format!("{} relay {}", net.program.display(), net.socket.display());
            cmd.arg("-netdev").arg(format!(
                "user,id=net0,restrict=on,ipv6=off,net=10.0.2.0/24,guestfwd=tcp:{}-cmd:{}",
                NetRelay::GUEST_PROXY,
                escape_option(&relay)
            ));
            cmd.args(["-device", "virtio-net-device,netdev=net0"]);
        }
        if config.incoming.is_some() {
            // Loaded over QMP once the capabilities match the saving side's.
            cmd.args(["-incoming", "defer"]);
        }
        cmd.0
    }

    /// The jail's caps for `config`: the VM's files and nothing else.
    fn jail_caps(config: &VmConfig) -> Caps {
        let mut caps = Caps::new();
        let dir = config.dir.clone();
        caps = caps.mount(&dir, &dir, Access::ReadWrite);
        let mut seen = std::collections::BTreeSet::new();
        let files = [&config.kernel, &config.initrd]
            .into_iter()
            .map(|p| (p, true))
            .chain(config.disks.iter().map(|d| (&d.path, d.read_only)))
            .chain(config.incoming.iter().map(|p| (p, true)))
            .chain(config.network.iter().map(|n| (&n.program, true)));
        for (path, read_only) in files {
            if path.starts_with(&dir) || !seen.insert(path.clone()) {
                continue;
            }
            let access = if read_only {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            };
            caps = caps.mount(path, path, access);
        }
        caps.limits = Limits {
            timeout: JAIL_LIFETIME,
            cpu_time: JAIL_LIFETIME,
            memory: ByteSize::mib(config.memory_mib + JAIL_OVERHEAD_MIB),
            processes: 256,
            open_files: 4096,
            output: ByteSize::mib(16),
            file_size: ByteSize::gib(128),
            ..Limits::default()
        };
        caps
    }
}

/// How long a jailed VMM may live at most (runs end it much earlier).
const JAIL_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Host memory a jailed VMM may use on top of its guest's RAM: QEMU itself and the TCG
/// translation cache.
const JAIL_OVERHEAD_MIB: u64 = 384;

/// An argument list built like a `Command`'s.
#[derive(Default)]
struct ArgList(Vec<String>);

impl ArgList {
    fn arg(&mut self, arg: impl AsRef<std::ffi::OsStr>) -> &mut Self {
        self.0.push(arg.as_ref().to_string_lossy().into_owned());
        self
    }

    fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(&mut self, args: I) -> &mut Self {
        for arg in args {
            self.arg(arg);
        }
        self
    }
}

use std::os::unix::process::CommandExt;

/// `value` as one single-quoted shell word.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// QEMU option values separate options with commas; a literal comma is doubled.
fn escape_option(value: &str) -> String {
    value.replace(',', ",,")
}

/// Where util-linux's `setpriv` is looked for (Debian: `/usr/bin`).
const SETPRIV: [&str; 2] = ["/usr/bin/setpriv", "/bin/setpriv"];

/// The host's TSC frequency in kHz, from `/proc/cpuinfo`'s first `cpu MHz` line (the
/// guest's `tsc_early_khz`; without it one boot in a dozen hangs calibrating). `None` when
/// not found.
pub fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu MHz"))?;
    let mhz: f64 = line.split(':').nth(1)?.trim().parse().ok()?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

impl Vmm for Qemu {
    fn name(&self) -> &'static str {
        "qemu microvm"
    }

    fn start(&self, config: &VmConfig) -> Result<Box<dyn VmInstance>> {
        let agent_sock = config.dir.join("agent.sock");
        let qmp_sock = config.dir.join("qmp.sock");
        let agent_listener = UnixListener::bind(&agent_sock)
            .map_err(|e| Error::setup(SetupStage::Host, "microvm: agent socket", e))?;
        let qmp_listener = UnixListener::bind(&qmp_sock)
            .map_err(|e| Error::setup(SetupStage::Host, "microvm: QMP socket", e))?;
        // Owner-only, like everything in the run's directory (the VMM, jailed or not,
        // connects as the embedder's files' owner).
        for sock in [&agent_sock, &qmp_sock] {
            sandbox_os::private::restrict(sock)
                .map_err(|e| Error::setup(SetupStage::Host, "microvm: socket permissions", e))?;
        }
        let console = Arc::new(Mutex::new(Tail::new(config.console_cap)));
        let stderr_tail = Arc::new(Mutex::new(Tail::new(16 * 1024)));
        let mut drains = Vec::new();
        let process = match &self.jail {
            None => {
                let mut child = self
                    .command(config, &agent_sock, &qmp_sock)
                    .spawn()
                    .map_err(|e| {
                        Error::setup(
                            SetupStage::Vmm,
                            format!("microvm: starting {}", self.binary.display()),
                            e,
                        )
                    })?;
                if let Some(out) = child.stdout.take() {
                    drains.push(drain(out, Arc::clone(&console)));
                }
                if let Some(err) = child.stderr.take() {
                    drains.push(drain(err, Arc::clone(&stderr_tail)));
                }
                VmmProcess::Child(child)
            }
            Some(jail) => {
                let mut argv = vec![self.binary.to_string_lossy().into_owned()];
                argv.extend(Self::args(config, &agent_sock, &qmp_sock));
                let tool = Tool::Command { argv };
                let caps = Self::jail_caps(config);
                let cancel = CancelToken::new();
                let sink_console = Arc::clone(&console);
                let sink_stderr = Arc::clone(&stderr_tail);
                let ctx = RunContext {
                    cancel: cancel.clone(),
                    sink: Some(Arc::new(move |stream: Stream, chunk: &[u8]| match stream {
                        Stream::Stdout => lock(&sink_console).push(chunk),
                        _ => lock(&sink_stderr).push(chunk),
                    })),
                    ..RunContext::default()
                };
                let jail = Arc::clone(jail);
                let outcome = Arc::clone(&stderr_tail);
                let thread = thread::Builder::new()
                    .name("strata-vmm".into())
                    .spawn(move || {
                        let result = jail.run_caps(&tool, &caps, &ctx);
                        let summary = match &result {
                            Ok(out) => format!(" [jail: QEMU ended: {:?}]", out.status),
                            Err(e) => format!(" [jail: {e}]"),
                        };
                        lock(&outcome).push(summary.as_bytes());
                        result
                    })
                    .map_err(|e| {
                        Error::setup(SetupStage::Vmm, "microvm: starting the jailed VMM", e)
                    })?;
                VmmProcess::Jailed {
                    thread: Some(thread),
                    cancel,
                    agent_sock: agent_sock.clone(),
                }
            }
        };
        let mut instance = QemuInstance {
            child: Some(process),
            agent: None,
            qmp_listener,
            qmp: None,
            console,
            stderr_tail,
            drains,
        };
        let agent = instance.accept(&agent_listener, config.connect_timeout)?;
        instance.agent = Some(agent);
        if let Some(state) = &config.incoming {
            if let Err(e) = instance.begin_incoming(state) {
                return Err(Error::setup(
                    SetupStage::Restore,
                    "microvm: restoring the VM snapshot (the VMM exited or did not resume)",
                    std::io::Error::new(e.kind(), format!("{e} ({})", instance.diagnostics())),
                ));
            }
        }
        Ok(Box::new(instance))
    }
}

/// The QEMU process: a child of this process, or a tool of the jail's backend run on a
/// thread of its own.
enum VmmProcess {
    Child(Child),
    Jailed {
        thread: Option<thread::JoinHandle<Result<sandbox_core::RunOutput>>>,
        cancel: CancelToken,
        agent_sock: PathBuf,
    },
}

impl VmmProcess {
    fn exited(&mut self) -> bool {
        match self {
            VmmProcess::Child(child) => !matches!(child.try_wait(), Ok(None)),
            VmmProcess::Jailed { thread, .. } => thread.as_ref().is_none_or(|t| t.is_finished()),
        }
    }

    /// Kills the VMM and waits for it (the jail's run ends, its sandbox torn down).
    fn kill(self) {
        match self {
            VmmProcess::Child(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            VmmProcess::Jailed { thread, cancel, .. } => {
                cancel.cancel();
                if let Some(thread) = thread {
                    let _ = thread.join();
                }
            }
        }
    }

    /// The QEMU process id (for a jailed one: found by its agent socket in `/proc`).
    fn pid(&self) -> Option<u32> {
        match self {
            VmmProcess::Child(child) => Some(child.id()),
            VmmProcess::Jailed { agent_sock, .. } => {
                let needle = format!("path={}", agent_sock.display());
                std::fs::read_dir("/proc")
                    .ok()?
                    .flatten()
                    .find_map(|entry| {
                        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                        let text = String::from_utf8_lossy(&cmdline);
                        (text.contains("qemu-system") && text.contains(&needle)).then_some(pid)
                    })
            }
        }
    }
}

/// A running QEMU; dropping it kills and reaps the process.
struct QemuInstance {
    child: Option<VmmProcess>,
    agent: Option<UnixStream>,
    qmp_listener: UnixListener,
    qmp: Option<Qmp>,
    console: Arc<Mutex<Tail>>,
    stderr_tail: Arc<Mutex<Tail>>,
    drains: Vec<thread::JoinHandle<()>>,
}

impl QemuInstance {
    fn accept(&mut self, listener: &UnixListener, timeout: Duration) -> Result<UnixStream> {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::setup(SetupStage::AgentChannel, "microvm: agent socket", e))?;
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).map_err(|e| {
                        Error::setup(SetupStage::AgentChannel, "microvm: agent socket", e)
                    })?;
                    return Ok(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    return Err(Error::setup(
                        SetupStage::AgentChannel,
                        "microvm: agent socket",
                        e,
                    ))
                }
            }
            if self.ended() {
                return Err(Error::setup(
                    SetupStage::Vmm,
                    "microvm: QEMU exited before connecting the agent channel",
                    std::io::Error::other(self.diagnostics()),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::setup(
                    SetupStage::AgentChannel,
                    "microvm: QEMU did not connect the agent channel",
                    std::io::Error::new(std::io::ErrorKind::TimedOut, self.diagnostics()),
                ));
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// The QMP session, connected on first use.
    fn qmp(&mut self) -> std::io::Result<&mut Qmp> {
        if self.qmp.is_none() {
            self.qmp = Some(Qmp::accept(&self.qmp_listener)?);
        }
        match self.qmp.as_mut() {
            Some(qmp) => Ok(qmp),
            None => Err(std::io::Error::other("no QMP session")),
        }
    }

    /// Starts loading a saved state (`-incoming defer`).
    fn begin_incoming(&mut self, state: &Path) -> std::io::Result<()> {
        let qmp = self.qmp()?;
        qmp.set_timeout(Duration::from_secs(10))?;
        let uri = format!("exec:cat {}", shell_quote(&state.to_string_lossy()));
        qmp.execute("migrate-incoming", serde_json::json!({ "uri": uri }))?;
        Ok(())
    }

    fn save_state(&mut self, path: &Path) -> std::io::Result<()> {
        let qmp = self.qmp()?;
        qmp.set_timeout(Duration::from_secs(10))?;
        qmp.execute("stop", serde_json::json!({}))?;
        // Saving to a file: no reason to throttle (QEMU 7.2 defaults to 32 MiB/s).
        qmp.execute(
            "migrate-set-parameters",
            serde_json::json!({"max-bandwidth": 1u64 << 40}),
        )?;
        let uri = format!("exec:cat > {}", shell_quote(&path.to_string_lossy()));
        qmp.execute("migrate", serde_json::json!({ "uri": uri }))?;
        let deadline = Instant::now() + SAVE_TIMEOUT;
        loop {
            let info = qmp.execute("query-migrate", serde_json::json!({}))?;
            match info.get("status").and_then(|s| s.as_str()) {
                Some("completed") => return Ok(()),
                Some("failed") | Some("cancelled") => {
                    return Err(std::io::Error::other(format!(
                        "QEMU could not save the VM: {}",
                        info.get("error-desc")
                            .and_then(|d| d.as_str())
                            .unwrap_or("no reason given")
                    )))
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "saving the VM state took too long",
                ));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// How long saving a VM's state may take.
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);

/// A QMP session: greeting read, capabilities negotiated.
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn accept(listener: &UnixListener) -> std::io::Result<Qmp> {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(e);
                    }
                    thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        qmp.set_timeout(Duration::from_secs(5))?;
        let mut greeting = String::new();
        qmp.reader.read_line(&mut greeting)?;
        qmp.execute("qmp_capabilities", serde_json::json!({}))?;
        Ok(qmp)
    }

    fn set_timeout(&self, timeout: Duration) -> std::io::Result<()> {
        self.writer.set_read_timeout(Some(timeout))?;
        self.writer.set_write_timeout(Some(timeout))
    }

    fn send(&mut self, command: &str, arguments: serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&serde_json::json!({
            "execute": command,
            "arguments": arguments,
        }))?;
        line.push(b'\n');
        self.writer.write_all(&line)
    }

    /// Runs `command` and returns its `return` value; events in between are skipped.
    fn execute(
        &mut self,
        command: &str,
        arguments: serde_json::Value,
    ) -> std::io::Result<serde_json::Value> {
        self.send(command, arguments)?;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("QMP closed during {command}"),
                ));
            }
            let reply: serde_json::Value = serde_json::from_str(&line)?;
            if let Some(value) = reply.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = reply.get("error") {
                return Err(std::io::Error::other(format!("QMP {command}: {error}")));
            }
        }
    }
}

impl Carrier for QemuInstance {
    fn place(&self) -> Place {
        Place::Vm
    }

    fn channel(&self) -> std::io::Result<UnixStream> {
        match &self.agent {
            Some(stream) => stream.try_clone(),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the agent channel is closed",
            )),
        }
    }

    fn ended(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.exited(),
            None => true,
        }
    }

    fn diagnostics(&self) -> String {
        let console = lock(&self.console).text();
        let stderr = lock(&self.stderr_tail).text();
        let mut out = String::new();
        if !console.trim().is_empty() {
            out.push_str("guest console: ");
            out.push_str(console.trim());
        }
        if !stderr.trim().is_empty() {
            if !out.is_empty() {
                out.push_str("; ");
            }
            out.push_str("qemu: ");
            out.push_str(stderr.trim());
        }
        if out.is_empty() {
            out.push_str("(no console output)");
        }
        out
    }

    fn teardown(&mut self) {
        let Some(child) = self.child.take() else {
            return;
        };
        // Nothing of a finished VM is kept (its disks are private copies, the grants came
        // back through the agent): it is killed, not asked to quit.
        child.kill();
        self.agent = None;
        self.qmp = None;
        for drain in self.drains.drain(..) {
            let _ = drain.join();
        }
    }
}

impl VmInstance for QemuInstance {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(VmmProcess::pid)
    }

    fn save(&mut self, path: &Path) -> Result<()> {
        self.save_state(path).map_err(|e| {
            Error::setup(
                SetupStage::Snapshot,
                "microvm: saving the VM snapshot",
                std::io::Error::new(e.kind(), format!("{e} ({})", self.diagnostics())),
            )
        })
    }

    fn wait_running(&mut self, deadline: Instant) -> Result<()> {
        let outcome = (|| -> std::io::Result<()> {
            loop {
                let qmp = self.qmp()?;
                qmp.set_timeout(Duration::from_secs(5))?;
                let status = qmp.execute("query-status", serde_json::json!({}))?;
                if status.get("running").and_then(|r| r.as_bool()) == Some(true) {
                    return Ok(());
                }
                let state = status
                    .get("status")
                    .and_then(|s| s.as_str())
                    .unwrap_or("unknown")
                    .to_string();
                if state == "paused" {
                    // Loaded (the state was saved paused): resume it.
                    qmp.execute("cont", serde_json::json!({}))?;
                    continue;
                }
                if state != "inmigrate" && state != "prelaunch" {
                    return Err(std::io::Error::other(format!("the VM is {state}")));
                }
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("the VM is still {state}"),
                    ));
                }
                thread::sleep(Duration::from_millis(2));
            }
        })();
        outcome.map_err(|e| {
            Error::setup(
                SetupStage::Restore,
                "microvm: restoring the VM snapshot (the VMM exited or did not resume)",
                std::io::Error::new(e.kind(), format!("{e} ({})", self.diagnostics())),
            )
        })
    }

    fn set_running(&mut self, running: bool) -> Result<()> {
        let command = if running { "cont" } else { "stop" };
        let outcome = self.qmp().and_then(|qmp| {
            qmp.set_timeout(Duration::from_secs(10))?;
            qmp.execute(command, serde_json::json!({}))
        });
        outcome.map(drop).map_err(|e| {
            Error::setup(
                SetupStage::Vmm,
                format!("microvm: QMP {command}"),
                std::io::Error::new(e.kind(), format!("{e} ({})", self.diagnostics())),
            )
        })
    }
}

impl Drop for QemuInstance {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill();
        }
    }
}

fn lock(tail: &Mutex<Tail>) -> std::sync::MutexGuard<'_, Tail> {
    match tail.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

fn drain(mut from: impl Read + Send + 'static, into: Arc<Mutex<Tail>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => lock(&into).push(&buf[..n]),
            }
        }
    })
}

/// The last `cap` bytes of a stream, and how many were dropped before them.
#[derive(Debug)]
pub(crate) struct Tail {
    cap: usize,
    buf: Vec<u8>,
    dropped: u64,
}

impl Tail {
    pub(crate) fn new(cap: usize) -> Self {
        Tail {
            cap,
            buf: Vec::new(),
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.cap {
            let cut = self.buf.len() - self.cap;
            self.buf.drain(..cut);
            self.dropped += cut as u64;
        }
    }

    pub(crate) fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.buf);
        match self.dropped {
            0 => text.into_owned(),
            n => format!("[{n} earlier bytes dropped] {text}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_tail_keeps_the_last_bytes_of_a_flood() {
        let mut tail = Tail::new(8);
        for _ in 0..1000 {
            tail.push(b"0123456789");
        }
        assert_eq!(tail.buf.len(), 8);
        assert!(tail.text().starts_with("[9992 earlier bytes dropped]"));
    }

    #[test]
    fn kernel_args_keep_the_clock_flags() {
        let args = Qemu::kernel_args();
        for needed in [
            "console=ttyS0",
            "tsc=reliable",
            "no_timer_check",
            "panic=-1",
        ] {
            assert!(args.contains(needed), "{args}");
        }
    }
}
