//! Risk routing: which backend runs a tool, from what the tool is and a declared risk.
//!
//! | risk        | preferred   | floor (weakest boundary accepted without the caller's say-so) |
//! |-------------|-------------|------------------------------------------------------|
//! | `compute`   | `wasm`      | `process`                                            |
//! | `files`     | `container` | `process`                                            |
//! | `build`     | `container` | `container`                                          |
//! | `untrusted` | `microvm`   | `microvm`                                            |
//!
//! Boundaries are ordered `process` < `container` < `wasm` < `microvm` (a container adds
//! an image root to the process sandbox; wasm has no system calls at all; a microVM has its
//! own kernel). The router tries the risk's chain ([`Risk::chain`]: the preferred backend,
//! then its fallbacks) among the backends the caller allows, skipping those that cannot run
//! the tool or are unavailable on this host. Which backend runs which tool:
//!
//! | tool | process | container | wasm | microvm |
//! |------|---------|-----------|------|---------|
//! | command | yes | with an image | no | yes |
//! | python or javascript script | yes | with an image | yes (WASI interpreters), without an image | yes |
//! | sh script | yes | with an image | no (no WASI shell) | yes |
//! | WebAssembly module | no | no | yes, without an image | yes |
//!
//! The wasm backend runs Python and JavaScript scripts in interpreters compiled to WASI,
//! which must be installed on the host: whether they are is the caller's `offer` to say
//! (the facade asks the backend for this tool), so a compute-risk script without them
//! falls back to the next backend of the chain, and the reason names why. A backend below
//! the risk's floor is used only when the caller set [`RoutePolicy::allow_weaker`]; the
//! [`Route::reason`] then says so. No risk declared: [`Risk::of`] derives one from the tool.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

pub use sandbox_core::receipt::Route;
pub use sandbox_core::risk::Risk;

use sandbox_core::backend::BackendKind;
use sandbox_core::caps::Caps;
use sandbox_core::error::{Error, Result};
use sandbox_core::tool::{ScriptLanguage, Tool};

/// How strong a backend's boundary is: `process` 1, `container` 2, `wasm` 3, `microvm` 4,
/// `cluster` 4 (the pod's runtime class gives it a kernel of its own: gVisor's or a Kata
/// VM's).
pub fn strength(kind: BackendKind) -> u8 {
    match kind {
        BackendKind::Process => 1,
        BackendKind::Container => 2,
        BackendKind::Wasm => 3,
        BackendKind::Microvm | BackendKind::Cluster => 4,
        // A backend this version does not know is trusted least.
        _ => 0,
    }
}

/// What the caller lets the router choose from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutePolicy {
    /// Backends the router may pick. Default: all four.
    pub allowed: BTreeSet<BackendKind>,
    /// Whether a backend below the risk's floor may be used (said in the route's reason).
    /// Default: `false`: such a run is refused.
    pub allow_weaker: bool,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        RoutePolicy {
            allowed: BackendKind::ALL.into_iter().collect(),
            allow_weaker: false,
        }
    }
}

/// Whether a backend can take a run on this host, as the caller found out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendOffer {
    /// Built in and usable.
    Available,
    /// Not usable here, and why.
    Unavailable(String),
}

/// Chooses the backend for `tool` under `risk` (derived with [`Risk::of`] when `None`).
/// `offer` says whether a backend is usable here for this tool (called only for backends
/// the policy allows and that can run the tool's kind; a caller whose backend lacks what this
/// tool needs, such as the wasm backend without its Python interpreter, answers
/// [`BackendOffer::Unavailable`]). Refuses with [`Error::Unenforceable`] naming the risk
/// and every backend tried when none qualifies.
pub fn route(
    tool: &Tool,
    caps: &Caps,
    risk: Option<Risk>,
    policy: &RoutePolicy,
    mut offer: impl FnMut(BackendKind) -> BackendOffer,
) -> Result<Route> {
    let declared = risk.is_some();
    let risk = risk.unwrap_or_else(|| Risk::of(tool, caps));
    let preferred = risk.preferred();
    let floor = strength(risk.floor());
    let mut skipped = Vec::new();
    for &kind in risk.chain() {
        if !policy.allowed.contains(&kind) {
            skipped.push(format!("{kind}: not allowed by the caller"));
            continue;
        }
        if let Some(why) = cannot_run(kind, tool, caps) {
            skipped.push(format!("{kind}: {why}"));
            continue;
        }
        let weaker = strength(kind) < floor;
        if weaker && !policy.allow_weaker {
            skipped.push(format!(
                "{kind}: weaker than risk {risk} accepts (at least {})",
                risk.floor()
            ));
            continue;
        }
        if let BackendOffer::Unavailable(why) = offer(kind) {
            skipped.push(format!("{kind}: unavailable ({why})"));
            continue;
        }
        let origin = if declared {
            "declared"
        } else {
            "derived from the tool"
        };
        let mut reason = format!("risk {risk} ({origin}) prefers {preferred}");
        if kind != preferred {
            reason.push_str(&format!("; skipped {}", skipped.join("; ")));
        }
        if weaker {
            reason.push_str(&format!(
                "; {kind} is weaker than risk {risk} accepts ({}): allowed by the caller",
                risk.floor()
            ));
        }
        return Ok(Route {
            risk,
            declared,
            backend: kind,
            reason,
        });
    }
    Err(Error::unenforceable(
        format!("risk {risk}"),
        format!(
            "no backend qualifies: {} (allow a weaker boundary explicitly, or make {} available)",
            skipped.join("; "),
            risk.preferred()
        ),
    ))
}

/// Why `kind` cannot run `tool` with `caps` at all, whatever the host (see the table in the
/// module docs).
fn cannot_run(kind: BackendKind, tool: &Tool, caps: &Caps) -> Option<&'static str> {
    let image = caps.container.is_some();
    match (kind, tool) {
        (BackendKind::Wasm, _) if image => Some("does not run an image"),
        (BackendKind::Wasm, Tool::Wasm { .. }) => None,
        (BackendKind::Wasm, Tool::Script { language, .. }) => match language {
            ScriptLanguage::Python | ScriptLanguage::Javascript => None,
            ScriptLanguage::Sh => Some("runs no sh scripts (there is no WASI shell)"),
            _ => Some("runs no scripts in this language"),
        },
        (BackendKind::Wasm, Tool::Command { .. }) => {
            Some("runs WebAssembly modules and Python/JavaScript scripts, not host commands")
        }
        (BackendKind::Container, Tool::Wasm { .. }) => Some("does not run WebAssembly modules"),
        (BackendKind::Container, _) if !image => Some("needs an image (caps.container)"),
        (BackendKind::Process, _) if image => Some("cannot run an image"),
        (BackendKind::Process, Tool::Wasm { .. }) => Some("does not run WebAssembly modules"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_available(_: BackendKind) -> BackendOffer {
        BackendOffer::Available
    }

    fn no_vm(kind: BackendKind) -> BackendOffer {
        match kind {
            BackendKind::Microvm => BackendOffer::Unavailable("no qemu".into()),
            _ => BackendOffer::Available,
        }
    }

    #[test]
    fn compute_goes_to_wasm_and_files_to_the_process_sandbox_without_an_image() {
        let caps = Caps::new();
        let wasm = Tool::wasm("/m.wasm", Vec::<String>::new());
        let r = route(&wasm, &caps, None, &RoutePolicy::default(), all_available).expect("route");
        assert_eq!(
            (r.risk, r.backend, r.declared),
            (Risk::Compute, BackendKind::Wasm, false)
        );
        let cmd = Tool::command(["ls"]);
        let r = route(&cmd, &caps, None, &RoutePolicy::default(), all_available).expect("route");
        assert_eq!((r.risk, r.backend), (Risk::Files, BackendKind::Process));
        assert!(
            r.reason.contains("container: needs an image"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn untrusted_scripts_never_fall_to_a_weaker_boundary_silently() {
        let script = Tool::script(ScriptLanguage::Python, "print(1)");
        let caps = Caps::new();
        let r = route(&script, &caps, None, &RoutePolicy::default(), all_available).expect("route");
        assert_eq!((r.risk, r.backend), (Risk::Untrusted, BackendKind::Microvm));
        let err = route(&script, &caps, None, &RoutePolicy::default(), no_vm).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("risk untrusted") && text.contains("no qemu"),
            "{text}"
        );
        let policy = RoutePolicy {
            allow_weaker: true,
            ..RoutePolicy::default()
        };
        let r = route(&script, &caps, None, &policy, no_vm).expect("route");
        assert_eq!(r.backend, BackendKind::Process);
        assert!(r.reason.contains("allowed by the caller"), "{}", r.reason);
    }

    #[test]
    fn build_with_an_image_uses_the_container_and_refuses_the_process_sandbox() {
        let caps = Caps::new().image("docker-archive:/x.tar");
        let cmd = Tool::command(["make"]);
        let r = route(&cmd, &caps, None, &RoutePolicy::default(), all_available).expect("route");
        assert_eq!((r.risk, r.backend), (Risk::Build, BackendKind::Container));
        let only_process = RoutePolicy {
            allowed: [BackendKind::Process].into_iter().collect(),
            allow_weaker: true,
        };
        assert!(route(&cmd, &caps, None, &only_process, all_available).is_err());
    }

    #[test]
    fn compute_risk_python_and_javascript_scripts_go_to_wasm() {
        let caps = Caps::new();
        for language in [ScriptLanguage::Python, ScriptLanguage::Javascript] {
            let script = Tool::script(language, "1");
            let r = route(
                &script,
                &caps,
                Some(Risk::Compute),
                &RoutePolicy::default(),
                all_available,
            )
            .expect("route");
            assert_eq!(r.backend, BackendKind::Wasm, "{language}: {}", r.reason);
        }
        // Without the WASI interpreter (the caller's offer for this tool says so), the
        // chain falls back to the process sandbox and says why.
        let no_interpreter = |kind: BackendKind| match kind {
            BackendKind::Wasm => BackendOffer::Unavailable("python.wasm is missing".into()),
            _ => BackendOffer::Available,
        };
        let python = Tool::script(ScriptLanguage::Python, "1");
        let r = route(
            &python,
            &caps,
            Some(Risk::Compute),
            &RoutePolicy::default(),
            no_interpreter,
        )
        .expect("route");
        assert_eq!(r.backend, BackendKind::Process);
        assert!(r.reason.contains("python.wasm is missing"), "{}", r.reason);
        // Shell scripts and commands have no WASI runner; an image keeps wasm out too.
        for tool in [
            Tool::script(ScriptLanguage::Sh, "true"),
            Tool::command(["true"]),
        ] {
            let r = route(
                &tool,
                &caps,
                Some(Risk::Compute),
                &RoutePolicy::default(),
                all_available,
            )
            .expect("route");
            assert_eq!(r.backend, BackendKind::Process, "{}", r.reason);
            assert!(r.reason.contains("wasm: runs"), "{}", r.reason);
        }
        let imaged = Caps::new().image("docker-archive:/x.tar");
        let r = route(
            &python,
            &imaged,
            Some(Risk::Compute),
            &RoutePolicy::default(),
            all_available,
        )
        .expect("route");
        assert_eq!(r.backend, BackendKind::Container, "{}", r.reason);
    }

    #[test]
    fn risks_parse_and_print() {
        for risk in Risk::ALL {
            assert_eq!(risk.as_str().parse::<Risk>().expect("parse"), risk);
        }
        assert!("dangerous".parse::<Risk>().is_err());
    }
}
