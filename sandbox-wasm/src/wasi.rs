//! Builds the WASI context of one run from its plan: arguments, explicit environment,
//! preopens with their permissions, stdin (the caps' bytes, then the context's stream),
//! captured stdout and stderr, and the socket policy. Nothing of the host is inherited.

use sandbox_core::SetupStage;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use bytes::Bytes;
use rustix::fs::{Mode, OFlags, ResolveFlags};
use sandbox_core::{Access, Error, Result};
use wasmtime_wasi::cli::AsyncStdinStream;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder, WasiView};

use crate::capture::Capture;
use crate::egress::EgressGuard;
use crate::plan::{NetPlan, Plan};

/// Resource-table entries reserved beyond `open_files` for stdio streams and pollables.
const TABLE_SLACK: usize = 16;

/// The guest's standard input.
pub(crate) enum Stdin<'a> {
    /// These bytes, then end of file.
    Bytes(&'a [u8]),
    /// Bytes and a stream, read as the guest asks (see [`crate::stdin`]).
    Stream(AsyncStdinStream),
}

/// Builds the context. `args[0]` is the program name the module sees.
pub(crate) fn context(
    plan: &Plan,
    args: &[String],
    stdin: Stdin<'_>,
    stdout: &Capture,
    stderr: &Capture,
    open_files: u32,
    egress: Option<&Arc<EgressGuard>>,
) -> Result<WasiP1Ctx> {
    let mut b = WasiCtxBuilder::new();
    b.args(args).envs(&plan.env);
    match stdin {
        Stdin::Bytes(bytes) => b.stdin(MemoryInputPipe::new(Bytes::copy_from_slice(bytes))),
        Stdin::Stream(stream) => b.stdin(stream),
    };
    b.stdout(stdout.clone()).stderr(stderr.clone());
    for p in &plan.preopens {
        let perms = match p.access {
            Access::ReadWrite => FsPerms::ReadWrite,
            _ => FsPerms::ReadOnly,
        };
        // Opened here without following any symlink, then handed to wasmtime-wasi through
        // the fd's /proc/self/fd link, which names exactly this directory: a path swapped
        // for a symlink after planning fails instead of redirecting the preopen.
        let dir = open_no_symlinks(&p.host).map_err(|e| {
            Error::setup(
                SetupStage::Grants,
                format!(
                    "open preopen {} (it must exist and contain no symlinks; was it replaced?)",
                    p.host.display()
                ),
                e.into(),
            )
        })?;
        let by_fd = format!("/proc/self/fd/{}", dir.as_raw_fd());
        b.preopened_dir(&by_fd, &p.guest, perms).map_err(|e| {
            Error::setup(
                SetupStage::Grants,
                format!("preopen {} at {}", p.host.display(), p.guest),
                std::io::Error::other(e.to_string()),
            )
        })?;
        drop(dir);
    }
    if let Some(cwd) = &plan.cwd {
        b.initial_cwd(cwd);
    }
    match &plan.net {
        NetPlan::None => {
            b.allow_tcp(false)
                .allow_udp(false)
                .allow_ip_name_lookup(false)
                .socket_addr_check(|_, _| Box::pin(async { false }));
        }
        NetPlan::Allow { .. } => {
            let Some(guard) = egress.cloned() else {
                return Err(Error::internal(
                    "build the WASI context",
                    std::io::Error::other("a run under a network allowlist has no egress guard"),
                ));
            };
            // wasmtime-wasi's own resolver stays off: the linker's ip-name-lookup is
            // replaced by one that checks names first (crate::egress). UDP sockets cannot
            // be created.
            b.allow_tcp(true)
                .allow_udp(false)
                .allow_ip_name_lookup(false)
                .socket_addr_check(move |addr, usage| {
                    let ok = guard.check_socket(addr, usage);
                    Box::pin(async move { ok })
                });
        }
        NetPlan::Host => {
            b.inherit_network()
                .allow_tcp(true)
                .allow_udp(true)
                .allow_ip_name_lookup(true);
        }
    }
    let mut wasi = b.build_p1();
    wasi.ctx()
        .table
        .set_max_capacity(open_files as usize + plan.preopens.len() + TABLE_SLACK);
    Ok(wasi)
}

/// Opens the directory `path` (absolute, lexically clean) as an `O_PATH` fd without
/// following a symlink in any component: `openat2(RESOLVE_NO_SYMLINKS)`, or, where a seccomp
/// filter refuses `openat2` with `ENOSYS` (the layered mode's process sandbox does), one
/// `openat(O_NOFOLLOW | O_DIRECTORY)` per component.
fn open_no_symlinks(path: &std::path::Path) -> rustix::io::Result<std::os::fd::OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {}
        other => return other,
    }
    let mut dir = rustix::fs::openat(rustix::fs::CWD, "/", flags, Mode::empty())?;
    for component in path.components() {
        match component {
            std::path::Component::RootDir => {}
            std::path::Component::Normal(name) => {
                dir = rustix::fs::openat(&dir, name, flags | OFlags::NOFOLLOW, Mode::empty())?;
            }
            _ => return Err(rustix::io::Errno::INVAL),
        }
    }
    Ok(dir)
}
