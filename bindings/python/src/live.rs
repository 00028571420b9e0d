//! `LiveSandbox`: a sandbox that stays up for a task (`strata::live`), with the GIL
//! released during every request. `Sandbox.start(...)` makes one; the Python package adds
//! the asyncio wrapper and the output generators.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use strata::live::{ExecRequest, ExitInfo, LiveSandbox, PublishRequest, StartOptions, TtySize};
use strata::Error;

use crate::convert;
use crate::errors::{to_py, IntoPyResult};
use crate::sandbox::PySandbox;
use crate::session::json;

fn duration(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<std::time::Duration>> {
    match obj {
        Some(obj) if !obj.is_none() => convert::seconds(obj, what).map(Some),
        _ => Ok(None),
    }
}

/// The options `Sandbox.start` and `Sandbox.start_from` share: clocks, name, ports, where
/// the supervisor and state are.
fn start_options(
    ttl: Option<&Bound<'_, PyAny>>,
    idle_ttl: Option<&Bound<'_, PyAny>>,
    name: Option<String>,
    publish: Vec<u16>,
    supervisor: Option<PathBuf>,
    state_dir: Option<PathBuf>,
) -> PyResult<StartOptions> {
    Ok(StartOptions {
        name,
        ttl: duration(ttl, "ttl")?,
        idle_ttl: duration(idle_ttl, "idle_ttl")?,
        supervisor,
        state_dir,
        publish: publish.into_iter().map(PublishRequest::loopback).collect(),
        ..StartOptions::default()
    })
}

/// Starts a live sandbox for `Sandbox.start`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    py: Python<'_>,
    sandbox: &PySandbox,
    caps: Option<&Bound<'_, PyAny>>,
    ttl: Option<&Bound<'_, PyAny>>,
    idle_ttl: Option<&Bound<'_, PyAny>>,
    idle_pause: Option<&Bound<'_, PyAny>>,
    name: Option<String>,
    publish: Vec<u16>,
    supervisor: Option<PathBuf>,
    state_dir: Option<PathBuf>,
) -> PyResult<PyLiveSandbox> {
    sandbox.ensure_open(py)?;
    let caps = sandbox.caps_or_profile(caps)?.into_owned();
    let mut options = start_options(ttl, idle_ttl, name, publish, supervisor, state_dir)?;
    options.idle_pause = duration(idle_pause, "idle_pause")?;
    let live = py
        .detach(|| sandbox.sandbox.start(&caps, options))
        .py_err(py)?;
    Ok(PyLiveSandbox::new(live))
}

/// Starts a live sandbox from a snapshot for `Sandbox.start_from`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_from(
    py: Python<'_>,
    sandbox: &PySandbox,
    snapshot: String,
    ttl: Option<&Bound<'_, PyAny>>,
    idle_ttl: Option<&Bound<'_, PyAny>>,
    name: Option<String>,
    publish: Vec<u16>,
    supervisor: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    snapshot_dir: Option<PathBuf>,
) -> PyResult<PyLiveSandbox> {
    sandbox.ensure_open(py)?;
    let options = start_options(ttl, idle_ttl, name, publish, supervisor, state_dir)?;
    let live = py
        .detach(|| {
            let store = crate::snapshots::store(snapshot_dir.as_deref())?;
            sandbox.sandbox.start_from(&store, &snapshot, options)
        })
        .py_err(py)?;
    Ok(PyLiveSandbox::new(live))
}

/// A sandbox that stays up for a task: `Sandbox.start(caps)`.
///
/// Every `exec` runs in the same sandbox (same namespaces, cgroup, caps), so files stay
/// between execs and a process started with `spawn` keeps running after the call. It is
/// owned by this handle: `stop()`, leaving a `with` block, garbage collection or this
/// process's death end it, every process in it included. `LiveSandbox.attach(id)` reaches
/// one started elsewhere (by the same user). Requests on a stopped sandbox raise
/// `InvalidRequestError`.
#[pyclass(frozen, module = "strata._strata", name = "LiveSandbox")]
pub struct PyLiveSandbox {
    live: Mutex<Option<Arc<LiveSandbox>>>,
}

impl PyLiveSandbox {
    fn new(live: LiveSandbox) -> PyLiveSandbox {
        PyLiveSandbox {
            live: Mutex::new(Some(Arc::new(live))),
        }
    }

    /// The sandbox, shared with calls in flight on other threads.
    fn live(&self, py: Python<'_>) -> PyResult<Arc<LiveSandbox>> {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| to_py(py, &Error::invalid("the live sandbox was stopped")))
    }
}

fn request(
    argv: &Bound<'_, PyAny>,
    env: Option<BTreeMap<String, String>>,
    workdir: Option<String>,
    timeout: Option<&Bound<'_, PyAny>>,
) -> PyResult<ExecRequest> {
    let timeout_ms = duration(timeout, "timeout")?
        .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1));
    Ok(ExecRequest {
        argv: convert::argv(argv)?,
        env: env.unwrap_or_default(),
        workdir,
        timeout_ms,
        ..ExecRequest::default()
    })
}

fn exit_dict<'py>(
    py: Python<'py>,
    exit: &ExitInfo,
    stdout: &[u8],
    stderr: &[u8],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("pid", exit.pid)?;
    dict.set_item("exit_code", exit.exit_code)?;
    dict.set_item("signal", exit.signal)?;
    dict.set_item("timed_out", exit.timed_out)?;
    dict.set_item("stdout", PyBytes::new(py, stdout))?;
    dict.set_item("stderr", PyBytes::new(py, stderr))?;
    Ok(dict)
}

#[pymethods]
impl PyLiveSandbox {
    /// Reaches the live sandbox `id` (or name) of this user started by another handle or
    /// process (`strata start`); it is not owned: dropping this handle leaves it running.
    #[staticmethod]
    fn attach(py: Python<'_>, id: String) -> PyResult<PyLiveSandbox> {
        let live = py.detach(|| LiveSandbox::attach(&id)).py_err(py)?;
        Ok(PyLiveSandbox::new(live))
    }

    /// The sandbox's id.
    #[getter]
    fn id(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.live(py)?.id().to_string())
    }

    /// Whether `stop()` was called on this handle.
    #[getter]
    fn stopped(&self) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// What the sandbox is now (a dict: id, name, backend, receipt, clocks, paused, ports,
    /// cpu_us).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let info = py.detach(|| live.refresh()).py_err(py)?;
        json(py, &info)
    }

    /// Runs `argv` in the foreground and returns a dict: pid, exit_code, signal, timed_out,
    /// stdout and stderr (bytes). `stdin` (bytes) is written to it and closed; `timeout`
    /// (seconds) kills its process group (`timed_out` then).
    #[pyo3(signature = (argv, *, env = None, workdir = None, timeout = None, stdin = None))]
    fn exec<'py>(
        &self,
        py: Python<'py>,
        argv: &Bound<'_, PyAny>,
        env: Option<BTreeMap<String, String>>,
        workdir: Option<String>,
        timeout: Option<&Bound<'_, PyAny>>,
        stdin: Option<Vec<u8>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let live = self.live(py)?;
        let request = request(argv, env, workdir, timeout)?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let input = stdin
            .map(|bytes| Box::new(std::io::Cursor::new(bytes)) as Box<dyn std::io::Read + Send>);
        let exit = py
            .detach(|| {
                live.exec(request, input, |stream, bytes| match stream {
                    strata::live::Stream::Stdout => out.extend_from_slice(bytes),
                    strata::live::Stream::Stderr => err.extend_from_slice(bytes),
                })
            })
            .py_err(py)?;
        exit_dict(py, &exit, &out, &err)
    }

    /// Starts `argv` in the background and returns its pid; its output is kept (the last
    /// 1 MiB per process) for `logs`. `stdin=True` keeps its stdin open for `write_stdin`.
    /// `tty=(rows, cols)` runs it on a terminal of that size (output is one stream).
    #[pyo3(signature = (argv, *, env = None, workdir = None, timeout = None, stdin = false, tty = None))]
    #[allow(clippy::too_many_arguments)]
    fn spawn(
        &self,
        py: Python<'_>,
        argv: &Bound<'_, PyAny>,
        env: Option<BTreeMap<String, String>>,
        workdir: Option<String>,
        timeout: Option<&Bound<'_, PyAny>>,
        stdin: bool,
        tty: Option<(u16, u16)>,
    ) -> PyResult<i32> {
        let live = self.live(py)?;
        let mut request = request(argv, env, workdir, timeout)?;
        request.stdin = stdin;
        request.tty = tty.map(|(rows, cols)| TtySize { rows, cols });
        py.detach(|| live.spawn(request)).py_err(py)
    }

    /// Every process started with exec or spawn: dicts of pid, argv, state
    /// ("running"/"exited"), exit_code, signal, timed_out.
    fn ps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let processes = py.detach(|| live.ps()).py_err(py)?;
        json(py, &processes)
    }

    /// A process's kept output (stdout and stderr as written, interleaved); with `follow`,
    /// waits until it exits.
    #[pyo3(signature = (pid, *, follow = false))]
    fn logs<'py>(&self, py: Python<'py>, pid: i32, follow: bool) -> PyResult<Bound<'py, PyBytes>> {
        let live = self.live(py)?;
        let mut out = Vec::new();
        py.detach(|| live.logs(pid, follow, |_, bytes| out.extend_from_slice(bytes)))
            .py_err(py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Calls `on_chunk(stream, data)` ("stdout"/"stderr", bytes) for a process's kept
    /// output and then, until it exits, for what it writes; returns its exit dict (without
    /// output) or None. The building block of `LiveSandbox.stream`.
    fn _follow<'py>(
        &self,
        py: Python<'py>,
        pid: i32,
        on_chunk: Py<PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let live = self.live(py)?;
        let mut failed: Option<PyErr> = None;
        let exit = py
            .detach(|| {
                live.logs(pid, true, |stream, bytes| {
                    if failed.is_some() {
                        return;
                    }
                    let name = match stream {
                        strata::live::Stream::Stdout => "stdout",
                        strata::live::Stream::Stderr => "stderr",
                    };
                    Python::attach(|py| {
                        if let Err(e) = on_chunk.call1(py, (name, PyBytes::new(py, bytes))) {
                            failed = Some(e);
                        }
                    });
                })
            })
            .py_err(py)?;
        if let Some(e) = failed {
            return Err(e);
        }
        exit.map(|exit| exit_dict(py, &exit, &[], &[])).transpose()
    }

    /// Waits for a process to exit; returns its exit dict (without output).
    fn wait<'py>(&self, py: Python<'py>, pid: i32) -> PyResult<Bound<'py, PyDict>> {
        let live = self.live(py)?;
        let exit = py.detach(|| live.wait(pid)).py_err(py)?;
        exit_dict(py, &exit, &[], &[])
    }

    /// Sends `signal` (default 15, SIGTERM) to a process's group.
    #[pyo3(signature = (pid, signal = 15))]
    fn kill(&self, py: Python<'_>, pid: i32, signal: i32) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.kill(pid, signal)).py_err(py)
    }

    /// Writes to the stdin (or terminal) of a process started with `stdin=True` or `tty`.
    fn write_stdin(&self, py: Python<'_>, pid: i32, data: Vec<u8>) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.write_stdin(pid, &data)).py_err(py)
    }

    /// Closes a process's stdin.
    fn close_stdin(&self, py: Python<'_>, pid: i32) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.close_stdin(pid)).py_err(py)
    }

    /// Resizes the terminal of a process started with `tty`.
    fn resize(&self, py: Python<'_>, pid: i32, rows: u16, cols: u16) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.resize(pid, TtySize { rows, cols }))
            .py_err(py)
    }

    /// Pauses every process (the cgroup freezer, else stop signals); returns how
    /// ("freezer" or "signals"; "vm" on a microVM: its vCPUs stop). TTLs stand still; new execs are refused until `resume`.
    fn pause(&self, py: Python<'_>) -> PyResult<String> {
        let live = self.live(py)?;
        let method = py.detach(|| live.pause()).py_err(py)?;
        Ok(match method {
            strata::live::PauseMethod::Freezer => "freezer".into(),
            strata::live::PauseMethod::Signals => "signals".into(),
            strata::live::PauseMethod::Vm => "vm".into(),
        })
    }

    /// Resumes a paused sandbox.
    fn resume(&self, py: Python<'_>) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.resume()).py_err(py)
    }

    /// Publishes the TCP port `guest_port` the tool listens on inside to the host (default
    /// 127.0.0.1 and a free port); returns a dict of host_ip, host_port and guest_port.
    #[pyo3(signature = (guest_port, *, host_port = None, host_ip = None))]
    fn publish<'py>(
        &self,
        py: Python<'py>,
        guest_port: u16,
        host_port: Option<u16>,
        host_ip: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let host_ip = host_ip
            .map(|ip| {
                ip.parse()
                    .map_err(|_| to_py(py, &Error::invalid(format!("{ip:?} is not an IP address"))))
            })
            .transpose()?;
        let request = PublishRequest {
            guest_port,
            host_ip,
            host_port,
        };
        let port = py.detach(|| live.publish(&request)).py_err(py)?;
        json(py, &port)
    }

    /// A regular file's contents (a symlink, device or hard-linked file is refused).
    fn read_file<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyBytes>> {
        let live = self.live(py)?;
        let data = py.detach(|| live.read_file(&path)).py_err(py)?;
        Ok(PyBytes::new(py, &data))
    }

    /// Replaces (or creates) a file, making missing parents; never writes through a link.
    fn write_file(&self, py: Python<'_>, path: String, data: Vec<u8>) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.write_file(&path, &data)).py_err(py)
    }

    /// A directory's entries: dicts of name, kind, size, mode.
    fn list_dir<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let entries = py.detach(|| live.list_dir(&path)).py_err(py)?;
        json(py, &entries)
    }

    /// One entry (a symlink is described, not followed).
    fn stat<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let entry = py.detach(|| live.stat(&path)).py_err(py)?;
        json(py, &entry)
    }

    /// Makes a directory (`parents`: and missing parents).
    #[pyo3(signature = (path, *, parents = false))]
    fn mkdir(&self, py: Python<'_>, path: String, parents: bool) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.mkdir(&path, parents)).py_err(py)
    }

    /// Renames an entry.
    fn rename(&self, py: Python<'_>, src: String, dst: String) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.rename(&src, &dst)).py_err(py)
    }

    /// Removes a file, symlink or directory tree.
    fn remove(&self, py: Python<'_>, path: String) -> PyResult<()> {
        let live = self.live(py)?;
        py.detach(|| live.remove(&path)).py_err(py)
    }

    /// Copies the host's file or directory into the sandbox; returns files, dirs, bytes.
    fn upload<'py>(
        &self,
        py: Python<'py>,
        host_path: &Bound<'_, PyAny>,
        path: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let host = convert::path(host_path, "host_path")?;
        let moved = py.detach(|| live.upload(&host, &path)).py_err(py)?;
        json(py, &moved)
    }

    /// Copies a file or directory out to a host path that must not exist.
    fn download<'py>(
        &self,
        py: Python<'py>,
        path: String,
        host_path: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let host = convert::path(host_path, "host_path")?;
        let moved = py.detach(|| live.download(&path, &host)).py_err(py)?;
        json(py, &moved)
    }

    /// Snapshots the sandbox (its own files, caps and policy on the process and container
    /// backends) into the snapshot store (`snapshot_dir`, default `$STRATA_SNAPSHOT_DIR` or
    /// `~/.local/share/strata/snapshots`) under `name` (default: its id). Returns a dict:
    /// id, name, backend, source, created_at, carries, not_carried, files, bytes.
    #[pyo3(signature = (name = None, *, snapshot_dir = None))]
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
        name: Option<String>,
        snapshot_dir: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let live = self.live(py)?;
        let info = py
            .detach(|| {
                let store = crate::snapshots::store(snapshot_dir.as_deref())?;
                live.snapshot(&store, name.as_deref())
            })
            .py_err(py)?;
        json(py, &info)
    }

    /// Starts `count` copies of the sandbox (1 to 100), each with its own copy of its files
    /// and its caps and policy; each is owned by its returned handle.
    #[pyo3(signature = (count = 1, *, ttl = None, idle_ttl = None, snapshot_dir = None))]
    fn fork(
        &self,
        py: Python<'_>,
        count: usize,
        ttl: Option<&Bound<'_, PyAny>>,
        idle_ttl: Option<&Bound<'_, PyAny>>,
        snapshot_dir: Option<PathBuf>,
    ) -> PyResult<Vec<PyLiveSandbox>> {
        let live = self.live(py)?;
        let options = StartOptions {
            ttl: duration(ttl, "ttl")?,
            idle_ttl: duration(idle_ttl, "idle_ttl")?,
            ..StartOptions::default()
        };
        let forked = py
            .detach(|| {
                let store = crate::snapshots::store(snapshot_dir.as_deref())?;
                live.fork(&store, count, &options)
            })
            .py_err(py)?;
        Ok(forked
            .children
            .into_iter()
            .map(PyLiveSandbox::new)
            .collect())
    }

    /// Ends the sandbox (every process, its cgroup and state) and returns once all of it is
    /// gone. Stopping twice does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner()).take();
        match live {
            Some(live) => py.detach(|| live.stop_shared()).py_err(py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.stop(py)?;
        Ok(false)
    }
}
