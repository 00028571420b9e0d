//! The host's check of what the agent applied ([`Applied`]) against what it asked for: a
//! guarantee the agent did not read back is missing. A strict run whose agent reports less
//! than the request is withheld, as the process backend withholds a run whose helper reports
//! less than its spec; a best-effort run keeps the missing guarantees as gaps.

use sandbox_core::{Capability, Error, Result, Strictness};

use crate::place::Place;
use crate::protocol::{Applied, RunRequest};

/// What `applied` lacks of `request`: each mount not found at its target, each rlimit the
/// tool did not start with. No report at all (an agent that never said) lacks everything
/// the request asked of it.
pub fn missing(request: &RunRequest, applied: Option<&Applied>) -> Vec<(Capability, String)> {
    let mut missing = Vec::new();
    let mounts: &[u32] = applied.map_or(&[], |a| &a.mounts);
    for (index, mount) in request.mounts.iter().enumerate() {
        if !mounts.contains(&(index as u32)) {
            missing.push((
                Capability::Fs,
                format!(
                    "disk {} was not found mounted at {}",
                    mount.serial, mount.target
                ),
            ));
        }
    }
    let asked = request.rlimits;
    let seen = applied.and_then(|a| a.rlimits);
    for (capability, name, want, got) in [
        (
            Capability::Cpu,
            "RLIMIT_CPU",
            asked.cpu_seconds,
            seen.map(|r| r.cpu_seconds),
        ),
        (
            Capability::FileSize,
            "RLIMIT_FSIZE",
            asked.file_size,
            seen.map(|r| r.file_size),
        ),
        (
            Capability::OpenFiles,
            "RLIMIT_NOFILE",
            asked.open_files,
            seen.map(|r| r.open_files),
        ),
    ] {
        match got {
            _ if want == 0 => {}
            Some(got) if got != 0 && got <= want => {}
            Some(got) => missing.push((
                capability,
                format!("{name} of the tool reads {} (asked {want})", shown(got)),
            )),
            None => missing.push((
                capability,
                format!("{name} of the tool could not be read back (asked {want})"),
            )),
        }
    }
    missing
}

/// Applies the strictness to what is `missing`: a strict run is refused (its result
/// withheld), a best-effort run gets the list back as gaps for its receipt.
///
/// # Errors
/// [`Error::Unenforceable`] naming the place and everything missing, for a strict run.
pub fn require(
    missing: Vec<(Capability, String)>,
    strictness: Strictness,
    place: Place,
) -> Result<Vec<(Capability, String)>> {
    if missing.is_empty() || strictness != Strictness::Strict {
        return Ok(missing);
    }
    let list: Vec<String> = missing
        .iter()
        .map(|(cap, why)| format!("{cap}: {why}"))
        .collect();
    Err(Error::unenforceable_strict(
        place.say(format!("what {} applied", place.agent())),
        format!(
            "it reports less than the run asked ({}); the run's result is withheld",
            list.join("; ")
        ),
    ))
}

fn shown(value: u64) -> String {
    if value == 0 {
        "unlimited".into()
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{GuestMount, GuestRlimits};

    fn request() -> RunRequest {
        RunRequest {
            rlimits: GuestRlimits {
                cpu_seconds: 30,
                file_size: 1 << 20,
                open_files: 64,
            },
            mounts: vec![GuestMount {
                serial: "strata-g0".into(),
                target: "/data".into(),
                writable: false,
            }],
            ..RunRequest::default()
        }
    }

    #[test]
    fn an_agent_that_applied_everything_is_missing_nothing() {
        let applied = Applied {
            mounts: vec![0],
            rlimits: Some(request().rlimits),
            ..Applied::default()
        };
        assert!(missing(&request(), Some(&applied)).is_empty());
    }

    /// An agent that skipped a mount or started the tool without its limits (a tampered or
    /// outdated guest) must not produce a strict result that claims them.
    #[test]
    fn a_limit_or_mount_the_agent_did_not_apply_withholds_a_strict_run() {
        let applied = Applied {
            mounts: vec![],
            rlimits: Some(GuestRlimits {
                cpu_seconds: 30,
                file_size: 0,
                open_files: 64,
            }),
            ..Applied::default()
        };
        let gaps = missing(&request(), Some(&applied));
        assert_eq!(gaps.len(), 2, "{gaps:?}");
        assert!(gaps[0].1.contains("/data"), "{gaps:?}");
        assert!(
            gaps[1]
                .1
                .contains("RLIMIT_FSIZE of the tool reads unlimited"),
            "{gaps:?}"
        );
        let err = require(gaps.clone(), Strictness::Strict, Place::Vm).expect_err("withheld");
        assert_eq!(err.kind(), sandbox_core::ErrorKind::Unenforceable);
        assert!(
            err.to_string()
                .contains("microvm: what the guest agent applied"),
            "{err}"
        );
        assert_eq!(
            require(gaps, Strictness::BestEffort, Place::Pod)
                .expect("gaps")
                .len(),
            2
        );
        assert_eq!(
            missing(&request(), None).len(),
            4,
            "no report lacks everything"
        );
    }
}
