//! The layer inside the agent's place: the agent runs the tool through the `strata` CLI (on
//! the guest tools disk in a VM, in the image in a pod), under the process backend (commands and scripts), the container
//! backend's native runtime (`caps.container`: an OCI image) or the wasm backend (wasm
//! tools), with the run's caps. The CLI writes its result (status, limits, receipt) to a
//! file the agent sends back; [`merge`] folds it into the host's run output, so the
//! receipt lists every layer from the VM or pod inward. Every message names the [`Place`].
//!
//! In a VM, an image or wasm module travels on the input disk (the last grant slot, mounted
//! at [`INPUT_DIR`]): a directory (an OCI layout or a root file system) as its own image, a
//! file (an image archive, a module) in a directory of its own.

use std::path::{Path, PathBuf};

use sandbox_core::{
    BackendKind, Capability, Caps, ContainerRuntime, Error, ExitStatus, LimitKind, Mechanism,
    Mount, Net, Receipt, Result, Tool,
};

use crate::place::Place;
use crate::protocol::GuestFile;

/// Where the tools disk is mounted in the guest.
pub const TOOLS_DIR: &str = "/run/strata/tools";

/// Where the input disk (image or module) is mounted in the guest.
pub const INPUT_DIR: &str = "/run/strata/input";

/// The inner run's caps file and result file in the guest.
const CAPS_FILE: &str = "/run/strata/inner-caps.json";
const RESULT_FILE: &str = "/run/strata/inner-result.json";

/// How much longer than the tool's timeout the agent lets the inner CLI run (it starts,
/// builds its sandbox and reports within this; the inner sandbox enforces the timeout).
pub const INNER_SLACK_MS: u64 = 10_000;

/// Where the inner run's pieces are on the far side: the `strata` CLI, the caps file the
/// agent writes, the result file it reads back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InnerPaths {
    /// Where the agent runs.
    pub place: Place,
    /// The `strata` CLI.
    pub cli: String,
    /// The caps file (written by the agent before the run).
    pub caps_file: String,
    /// The result file (written by the inner CLI, sent back by the agent).
    pub result_file: String,
}

impl InnerPaths {
    /// The microVM guest's: the CLI on the tools disk, the files under `/run/strata`.
    pub fn guest() -> InnerPaths {
        InnerPaths {
            place: Place::Vm,
            cli: format!("{TOOLS_DIR}/strata"),
            caps_file: CAPS_FILE.into(),
            result_file: RESULT_FILE.into(),
        }
    }
}

/// A run inside the guest's own sandbox.
#[derive(Debug)]
pub struct InnerRun {
    /// The backend inside the guest.
    pub backend: BackendKind,
    /// The agent's command: the guest `strata` CLI.
    pub argv: Vec<String>,
    /// The caps file the agent writes first.
    pub files: Vec<GuestFile>,
    /// The result file the agent sends back.
    pub report: String,
    /// A host path for the input disk (image or module), if any.
    pub input: Option<PathBuf>,
}

/// The inner run for `tool` under `caps`, with the CLI and its files at `paths` (the grants
/// already mounted at their guest paths by the agent; `proxy_env`: the egress proxy
/// variables when the run has an allowlist).
///
/// # Errors
/// [`Error::InvalidRequest`] for a container spec the agent's place cannot run (an engine
/// runtime, a kept workspace) or caps that do not serialize.
pub fn plan(
    tool: &Tool,
    caps: &Caps,
    proxy_env: &[(String, String)],
    paths: &InnerPaths,
) -> Result<InnerRun> {
    let mut inner = caps.clone();
    inner.mounts = caps
        .mounts
        .iter()
        .map(|m| Mount::new(m.guest.clone(), m.guest.clone(), m.access))
        .collect();
    // With an allowlist the guest's network reaches only the host's egress proxy: the
    // tool shares it and gets the proxy variables.
    inner.net = if proxy_env.is_empty() {
        Net::None
    } else {
        Net::Host
    };
    for (key, value) in proxy_env {
        inner.env.insert(key.clone(), value.clone());
    }
    inner.stdin = Vec::new();
    inner.agent = None;
    inner.secrets = Vec::new();
    let mut input = None;
    let mut args: Vec<String> = Vec::new();
    let backend = if let Some(spec) = &caps.container {
        if spec.runtime != ContainerRuntime::Native {
            return Err(Error::invalid(format!(
                "the {} backend runs images with the native runtime inside {} (asked for {})",
                paths.place.backend(),
                paths.place.name(),
                spec.runtime
            )));
        }
        if spec.workspace.is_some() {
            return Err(Error::invalid(format!(
                "a kept container workspace is not supported inside the {} backend",
                paths.place.backend()
            )));
        }
        let host = PathBuf::from(&spec.image);
        let guest = input_path(&host)?;
        input = Some(host);
        let mut spec = spec.clone();
        spec.image = guest;
        inner.container = Some(spec);
        BackendKind::Container
    } else if let Tool::Wasm { module, .. } = tool {
        let guest = input_path(module)?;
        input = Some(module.clone());
        args.push(guest);
        BackendKind::Wasm
    } else {
        BackendKind::Process
    };
    let caps_json = serde_json::to_vec(&inner)
        .map_err(|e| Error::invalid(format!("caps for the guest: {e}")))?;
    let mut argv = vec![
        paths.cli.clone(),
        "run".into(),
        "--backend".into(),
        backend.to_string(),
        "--caps".into(),
        paths.caps_file.clone(),
        "--result-file".into(),
        paths.result_file.clone(),
        "--stdin".into(),
        "--raw-output".into(),
    ];
    match tool {
        Tool::Command { argv: command } => {
            argv.push("--".into());
            argv.extend(command.iter().cloned());
        }
        Tool::Script { language, source } => {
            argv.extend(["--script".into(), language.to_string(), "--".into()]);
            argv.push(source.clone());
        }
        Tool::Wasm {
            args: wasm_args, ..
        } => {
            argv.push("--".into());
            argv.extend(args);
            argv.extend(wasm_args.iter().cloned());
        }
        _ => return Err(Error::invalid("unknown tool kind")),
    }
    Ok(InnerRun {
        backend,
        argv,
        files: vec![GuestFile {
            path: paths.caps_file.clone(),
            data: caps_json,
        }],
        report: paths.result_file.clone(),
        input,
    })
}

/// Where `host` (a file or a directory) appears in the guest on the input disk.
fn input_path(host: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(host).map_err(|e| Error::invalid(format!("{}: {e}", host.display())))?;
    if meta.is_dir() {
        return Ok(INPUT_DIR.into());
    }
    let name = host
        .file_name()
        .ok_or_else(|| Error::invalid(format!("{}: no file name", host.display())))?;
    Ok(format!("{INPUT_DIR}/{}", name.to_string_lossy()))
}

/// What the inner run reported.
#[derive(Debug)]
pub struct InnerResult {
    /// How the tool ended inside.
    pub status: ExitStatus,
    /// The inner sandbox's receipt.
    pub receipt: Receipt,
}

/// Parses the inner CLI's result file from an inner run in `place`; errors name the outer
/// backend and the place.
///
/// # Errors
/// The inner run's own error (with its kind), or [`Error::Internal`] when the report is
/// missing or malformed.
pub fn parse(report: Option<&[u8]>, stderr: &[u8], place: Place) -> Result<InnerResult> {
    let (outer, where_) = (place.backend(), place.name());
    let data = report.unwrap_or_default();
    if data.is_empty() {
        return Err(Error::Internal {
            message: format!(
                "{outer}: the sandbox inside {where_} reported nothing ({})",
                String::from_utf8_lossy(stderr).trim()
            ),
            source: None,
        });
    }
    let value: serde_json::Value = serde_json::from_slice(data).map_err(|e| Error::Internal {
        message: format!("{outer}: malformed result from inside {where_}: {e}"),
        source: None,
    })?;
    if let Some(error) = value.get("error") {
        let kind = error.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let message = format!(
            "inside {where_}: {}",
            error.get("message").and_then(|m| m.as_str()).unwrap_or("")
        );
        return Err(match kind {
            "invalid_request" => Error::invalid(message),
            "unenforceable" => {
                Error::unenforceable(format!("{outer}: the sandbox inside {where_}"), message)
            }
            "backend_unavailable" => Error::unavailable(outer, message),
            _ => Error::Internal {
                message,
                source: None,
            },
        });
    }
    let receipt: Receipt =
        serde_json::from_value(value.get("receipt").cloned().unwrap_or_default()).map_err(|e| {
            Error::Internal {
                message: format!("{outer}: malformed receipt from inside {where_}: {e}"),
                source: None,
            }
        })?;
    let signal = value
        .get("signal")
        .and_then(|s| s.as_i64())
        .map(|s| s as i32);
    let limit: Option<LimitKind> = value
        .get("limit")
        .cloned()
        .and_then(|l| serde_json::from_value(l).ok());
    let status = match (
        limit,
        signal,
        value.get("exit_code").and_then(|c| c.as_i64()),
    ) {
        (Some(limit), signal, _) => ExitStatus::Limit { limit, signal },
        (None, Some(signal), _) => ExitStatus::Signaled { signal },
        (None, None, Some(code)) => ExitStatus::Exited { code: code as i32 },
        (None, None, None) => {
            return Err(Error::Internal {
                message: format!("{outer}: the inner result has no status"),
                source: None,
            })
        }
    };
    Ok(InnerResult { status, receipt })
}

/// Fails closed on a strict run whose layer inside reports a gap (a guarantee it did not
/// enforce; gaps the caller asked for, [`sandbox_core::Gap::by_request`], do not count): the tool ran, but its result is withheld, as the process backend withholds a
/// run whose helper reports less than the spec asked. A best-effort run keeps the gaps in
/// its receipt. With `proxied` (an allowlist run) the inner sandbox was asked to share the
/// outer network, whose only peer is the egress proxy: its network gap is what was asked
/// for (see [`merge_proxied`]), not a missing guarantee.
///
/// # Errors
/// [`Error::Unenforceable`] naming the outer backend, the place and the gaps.
pub fn require_complete(
    result: &InnerResult,
    strictness: sandbox_core::Strictness,
    place: Place,
    proxied: bool,
) -> Result<()> {
    let (outer, place) = (place.backend(), place.name());
    let gaps: Vec<String> = result
        .receipt
        .gaps
        .iter()
        .filter(|g| !(g.by_request || (proxied && g.capability == Capability::Net)))
        .map(|g| format!("{}: {}", g.capability, g.reason))
        .collect();
    if strictness != sandbox_core::Strictness::Strict || gaps.is_empty() {
        return Ok(());
    }
    Err(Error::unenforceable_strict(
        format!("{outer}: the sandbox inside {place}"),
        format!(
            "it reports guarantees it did not enforce ({}); the run's result is withheld",
            gaps.join("; ")
        ),
    ))
}

/// [`merge`] for a run whose allowlist the outer layer enforces through the egress
/// proxy at `peer`: the inner sandbox was asked to share the outer network (its only peer
/// is that proxy), so the inner layer's "network shared" gap is stated as what it is.
pub fn merge_proxied(outer: &mut Receipt, mut inner: Receipt, place: Place, peer: &str) {
    let before = inner.gaps.len();
    inner.gaps.retain(|g| g.capability != Capability::Net);
    if inner.gaps.len() != before {
        outer.enforce(
            Capability::Net,
            Mechanism::Proxy,
            format!("{}: the outer network", place.inside()),
            format!("the inner sandbox shares it; its only peer is the egress proxy at {peer}, which applies the allowlist"),
        );
    }
    merge(outer, inner, place);
}

/// Folds the inner receipt into the outer one: the inner backend becomes the next layer, its
/// enforcements, gaps and denials are listed with the place (`in the guest:`, `in the pod:`)
/// before their mechanism or detail.
pub fn merge(outer: &mut Receipt, inner: Receipt, place: Place) {
    let place = place.inside();
    outer.layers.extend(inner.layers);
    for mut e in inner.enforced {
        e.mechanism = format!("{place}: {}", e.mechanism);
        outer.enforced.push(e);
    }
    for mut g in inner.gaps {
        g.reason = format!("{place}: {}", g.reason);
        outer.gaps.push(g);
    }
    for mut d in inner.denials {
        d.detail = format!("{place}: {}", d.detail);
        outer.denials.push(d);
    }
    if outer.container.is_none() {
        outer.container = inner.container;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Strictness;

    fn result_with_gap(capability: Capability) -> InnerResult {
        let mut receipt = Receipt::new(BackendKind::Process, Strictness::Strict);
        receipt.gap(
            capability,
            "landlock ABI 2 enforces only part of the requested rights",
        );
        InnerResult {
            status: ExitStatus::Exited { code: 0 },
            receipt,
        }
    }

    /// Round 3: a strict microVM run whose guest kernel offered only part of what the
    /// layer inside asked for ran on with a gap. A strict run whose layer inside reports a
    /// gap is withheld; best effort keeps the gap in the receipt.
    #[test]
    fn a_strict_run_whose_layer_inside_reports_a_gap_is_withheld() {
        let result = result_with_gap(Capability::Fs);
        let err =
            require_complete(&result, Strictness::Strict, Place::Vm, false).expect_err("withheld");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable);
        assert!(err.to_string().contains("inside the guest"), "{err}");
        assert!(err.to_string().contains("landlock ABI 2"), "{err}");
        require_complete(&result, Strictness::BestEffort, Place::Vm, false)
            .expect("best effort keeps it as a gap");
    }

    #[test]
    fn the_shared_network_of_a_proxied_run_is_not_a_missing_guarantee() {
        let result = result_with_gap(Capability::Net);
        require_complete(&result, Strictness::Strict, Place::Pod, true).expect("asked for");
        assert!(require_complete(&result, Strictness::Strict, Place::Pod, false).is_err());
    }
    /// A strict session grants its workspace with `protect_host_executed: false`: the layer
    /// inside states that as a gap the caller asked for, which does not withhold the run.
    #[test]
    fn a_gap_the_caller_asked_for_does_not_withhold_a_strict_run() {
        let mut receipt = Receipt::new(BackendKind::Process, Strictness::Strict);
        receipt.gap_by_request(
            Capability::Fs,
            "host-executed paths in writable grants are writable (by request)",
        );
        let result = InnerResult {
            status: ExitStatus::Exited { code: 0 },
            receipt,
        };
        require_complete(&result, Strictness::Strict, Place::Vm, false).expect("asked for");
    }
}
