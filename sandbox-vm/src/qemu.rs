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

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sandbox_core::{Error, Result};

use crate::protocol::PORT_NAME;
use crate::vmm::{Accel, VmConfig, VmInstance, Vmm};

/// TCG translation cache per VM, MiB.
const TCG_TB_MIB: u32 = 32;

/// QEMU's x86 system emulator driven as a microvm.
#[derive(Clone, Debug)]
pub struct Qemu {
    binary: PathBuf,
}

impl Default for Qemu {
    fn default() -> Self {
        Qemu {
            binary: PathBuf::from("qemu-system-x86_64"),
        }
    }
}

impl Qemu {
    /// QEMU at `binary` (default: `qemu-system-x86_64` from `PATH`).
    pub fn with_binary(binary: impl Into<PathBuf>) -> Self {
        Qemu {
            binary: binary.into(),
        }
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
        if config.incoming.is_some() {
            // Loaded over QMP once the capabilities match the saving side's.
            cmd.args(["-incoming", "defer"]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            .process_group(0);
        cmd
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
            .map_err(|e| Error::setup("microvm: agent socket", e))?;
        let qmp_listener =
            UnixListener::bind(&qmp_sock).map_err(|e| Error::setup("microvm: QMP socket", e))?;
        let mut child = self
            .command(config, &agent_sock, &qmp_sock)
            .spawn()
            .map_err(|e| Error::setup(format!("microvm: starting {}", self.binary.display()), e))?;
        let console = Arc::new(Mutex::new(Tail::new(config.console_cap)));
        let stderr_tail = Arc::new(Mutex::new(Tail::new(16 * 1024)));
        let mut drains = Vec::new();
        if let Some(out) = child.stdout.take() {
            drains.push(drain(out, Arc::clone(&console)));
        }
        if let Some(err) = child.stderr.take() {
            drains.push(drain(err, Arc::clone(&stderr_tail)));
        }
        let mut instance = QemuInstance {
            child: Some(child),
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
                    "microvm: restoring the VM snapshot (the VMM exited or did not resume)",
                    std::io::Error::new(e.kind(), format!("{e} ({})", instance.console_tail())),
                ));
            }
        }
        Ok(Box::new(instance))
    }
}

/// A running QEMU; dropping it kills and reaps the process.
struct QemuInstance {
    child: Option<Child>,
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
            .map_err(|e| Error::setup("microvm: agent socket", e))?;
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream
                        .set_nonblocking(false)
                        .map_err(|e| Error::setup("microvm: agent socket", e))?;
                    return Ok(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(Error::setup("microvm: agent socket", e)),
            }
            if self.exited() {
                return Err(Error::setup(
                    "microvm: QEMU exited before connecting the agent channel",
                    std::io::Error::other(self.console_tail()),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::setup(
                    "microvm: QEMU did not connect the agent channel",
                    std::io::Error::new(std::io::ErrorKind::TimedOut, self.console_tail()),
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

impl VmInstance for QemuInstance {
    fn agent(&self) -> std::io::Result<UnixStream> {
        match &self.agent {
            Some(stream) => stream.try_clone(),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the agent channel is closed",
            )),
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    fn console_tail(&self) -> String {
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

    fn save(&mut self, path: &Path) -> Result<()> {
        self.save_state(path).map_err(|e| {
            Error::setup(
                "microvm: saving the VM snapshot",
                std::io::Error::new(e.kind(), format!("{e} ({})", self.console_tail())),
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
                "microvm: restoring the VM snapshot (the VMM exited or did not resume)",
                std::io::Error::new(e.kind(), format!("{e} ({})", self.console_tail())),
            )
        })
    }

    fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Nothing of a finished VM is kept (its disks are private copies, the grants came
        // back through the agent): it is killed, not asked to quit.
        let _ = child.kill();
        let _ = child.wait();
        self.agent = None;
        self.qmp = None;
        for drain in self.drains.drain(..) {
            let _ = drain.join();
        }
    }
}

impl Drop for QemuInstance {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
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
