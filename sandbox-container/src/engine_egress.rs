//! Network allowlists on the engine runtimes (Docker, Podman; runc only).
//!
//! A tool container must not start before its only way out exists, and an engine starts a
//! container's process the moment it creates its network namespace. So each run first
//! starts a *holder* container (`--network none`, an image of one tiny static program that
//! only waits), binds the egress proxy's listener inside the holder's namespace
//! (`egress_link::listener_in_namespace_of`: a thread enters it, binds `127.0.0.1:3128`,
//! exits), and then starts the tool container in that namespace (`--network
//! container:HOLDER`). The namespace has loopback only: no interface, route or resolver,
//! and no engine DNS. Both containers carry the run's labels, so an embedder that dies
//! mid-run leaves nothing the next run does not sweep.
//!
//! gVisor (`runsc`) is refused: its user-space network stack would not see a host socket.

use sandbox_core::SetupStage;
use std::collections::HashMap;
use std::net::TcpListener;

use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{CreateContainerOptions, CreateImageOptionsBuilder};
use bollard::Docker;
use futures_util::StreamExt;
use sandbox_core::{ContainerRuntime, Error, Result};
use sandbox_os::backend_api::egress;

/// The holder image: one static x86-64 program, `/pause`, that waits for a signal forever.
pub const HOLDER_IMAGE: &str = "strata/netns-holder:1";

/// The holder's program: an ELF64 x86-64 executable of one loadable segment whose code is
/// `loop { pause() }` (`mov eax, 34; syscall; jmp -9`). It ignores every signal it gets as
/// PID 1 of its container, so only the engine's `SIGKILL` ends it. 129 bytes, written out
/// rather than built so the image needs no toolchain, libc or registry.
pub const PAUSE_ELF: [u8; 129] = {
    let mut elf = [0u8; 129];
    let header: [u8; 64] = [
        0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ident: 64-bit, LE
        2, 0, 0x3e, 0, 1, 0, 0, 0, // executable, x86-64, version 1
        0x78, 0, 0x40, 0, 0, 0, 0, 0, // entry 0x400078
        64, 0, 0, 0, 0, 0, 0, 0, // program headers at 64
        0, 0, 0, 0, 0, 0, 0, 0, // no section headers
        0, 0, 0, 0, 64, 0, 56, 0, // flags, header size, program header size
        1, 0, 0, 0, 0, 0, 0, 0, // one program header, no sections
    ];
    let program: [u8; 56] = [
        1, 0, 0, 0, 5, 0, 0, 0, // PT_LOAD, read + execute
        0, 0, 0, 0, 0, 0, 0, 0, // from file offset 0
        0, 0, 0x40, 0, 0, 0, 0, 0, // at 0x400000
        0, 0, 0x40, 0, 0, 0, 0, 0, // (physical)
        129, 0, 0, 0, 0, 0, 0, 0, // file size
        129, 0, 0, 0, 0, 0, 0, 0, // memory size
        0, 0x10, 0, 0, 0, 0, 0, 0, // 4 KiB aligned
    ];
    let code: [u8; 9] = [0xb8, 34, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7];
    let mut i = 0;
    while i < 64 {
        elf[i] = header[i];
        i += 1;
    }
    while i < 120 {
        elf[i] = program[i - 64];
        i += 1;
    }
    while i < 129 {
        elf[i] = code[i - 120];
        i += 1;
    }
    elf
};

/// A run's holder container and its listener.
pub struct Holder {
    /// The holder's container id (the tool joins `container:ID`).
    pub id: String,
    /// The proxy's listener inside the holder's network namespace.
    pub listener: TcpListener,
}

/// Refuses what this module cannot enforce: runtimes other than Docker and Podman (runc),
/// and hosts other than x86-64 (the holder program is x86-64 code).
pub fn check_supported(runtime: ContainerRuntime) -> Result<()> {
    if runtime == ContainerRuntime::Runsc {
        return Err(Error::unenforceable(
            "net: allowlist",
            "gVisor (runsc) has its own network stack, which cannot reach the host's egress proxy listener; use the native runtime or runc",
        ));
    }
    if !cfg!(target_arch = "x86_64") {
        return Err(Error::unenforceable(
            "net: allowlist",
            "the engine runtimes' allowlists need the x86-64 holder program on this architecture; use the native runtime",
        ));
    }
    Ok(())
}

/// Makes sure the holder image is in the engine, importing it (a one-file root file
/// system) when missing.
async fn ensure_image(docker: &Docker) -> Result<()> {
    if docker.inspect_image(HOLDER_IMAGE).await.is_ok() {
        return Ok(());
    }
    let tar = holder_rootfs().map_err(|e| Error::internal("build the holder image", e))?;
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo("strata/netns-holder")
        .tag("1")
        .build();
    let mut import = docker.create_image(Some(options), Some(bollard::body_full(tar.into())), None);
    while let Some(step) = import.next().await {
        step.map_err(|e| Error::Internal {
            message: format!("container engine: import the holder image: {e}"),
            source: None,
        })?;
    }
    Ok(())
}

/// The holder image's root file system: `/pause`, mode 0755, owned by root.
fn holder_rootfs() -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(PAUSE_ELF.len() as u64);
    header.set_mode(0o755);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, "pause", &PAUSE_ELF[..])?;
    builder.into_inner()
}

/// Starts a run's holder container and binds the proxy's listener in its network
/// namespace. `on_created` gets the container id as soon as it exists (for removal).
pub async fn start_holder(
    docker: &Docker,
    name: &str,
    labels: HashMap<String, String>,
    on_created: impl FnOnce(&str),
) -> Result<Holder> {
    ensure_image(docker).await?;
    let host = HostConfig {
        network_mode: Some("none".to_string()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(2),
        memory: Some(16 << 20),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(HOLDER_IMAGE.to_string()),
        cmd: Some(vec!["/pause".to_string()]),
        user: Some(crate::engine::NON_ROOT_USER.to_string()),
        labels: Some(labels),
        host_config: Some(host),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| engine_err("create the network holder", e))?;
    on_created(&created.id);
    docker
        .start_container(
            &created.id,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| engine_err("start the network holder", e))?;
    let state = docker
        .inspect_container(
            &created.id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(|e| engine_err("inspect the network holder", e))?
        .state
        .unwrap_or_default();
    let pid = match (state.running, state.pid) {
        (Some(true), Some(pid)) if pid > 0 => pid as u32,
        _ => {
            return Err(Error::Internal {
                message: "container engine: the network holder is not running".into(),
                source: None,
            })
        }
    };
    let listener = tokio::task::spawn_blocking(move || egress::listener_in_namespace_of(pid))
        .await
        .map_err(|e| Error::internal("enter the holder's network namespace", std::io::Error::other(e)))?
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) => Error::unenforceable(
                "net: allowlist",
                format!("entering the container's network namespace needs root ({e}); use the native runtime"),
            ),
            _ => Error::setup(SetupStage::Egress, "bind the egress listener in the holder's network namespace", e),
        })?;
    Ok(Holder {
        id: created.id,
        listener,
    })
}

fn engine_err(what: &str, e: bollard::errors::Error) -> Error {
    Error::Internal {
        message: format!("container engine: {what}: {e}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_pause_program_runs_and_waits_until_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pause");
        std::fs::write(&path, PAUSE_ELF).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = std::process::Command::new(&path).spawn().expect("exec");
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(child.try_wait().expect("wait").is_none(), "pause exited");
        child.kill().expect("kill");
        let status = child.wait().expect("wait");
        assert!(!status.success());
    }

    #[test]
    fn the_holder_root_file_system_is_one_executable() {
        let tar = holder_rootfs().expect("tar");
        let mut archive = tar::Archive::new(&tar[..]);
        let entries: Vec<(String, u32, u64)> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let header = e.header();
                (
                    e.path().expect("path").display().to_string(),
                    header.mode().expect("mode"),
                    header.size().expect("size"),
                )
            })
            .collect();
        assert_eq!(entries, vec![("pause".to_string(), 0o755, 129)]);
    }
}
