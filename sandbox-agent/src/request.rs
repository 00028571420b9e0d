//! The agent's [`RunRequest`], built in one place for every backend that runs the agent. A
//! [`Base`] says how a place shapes it (its environment, its default working directory,
//! what the inner layer starts with); the rest comes from the caps.

use std::collections::BTreeMap;

use sandbox_core::{Caps, Limits};

use crate::inner::{InnerRun, INNER_SLACK_MS};
use crate::protocol::{GuestRlimits, RunRequest};

/// How a place shapes the requests to its agent.
#[derive(Clone, Copy, Debug)]
pub struct Base {
    /// The environment a plain run starts from; the caps' variables win over it.
    pub env: &'static [(&'static str, &'static str)],
    /// The working directory of a plain run whose caps name none: `Some` for a fixed one
    /// (a VM's `/tmp`), `None` for the agent's own (a pod's workspace).
    pub default_cwd: Option<&'static str>,
    /// Drop the caps' proxy variables even when the run has no egress proxy (a VM, whose
    /// network has no other way out); otherwise only an allowlist run's proxy replaces them.
    pub strip_proxy_always: bool,
    /// The inner layer's environment (the caps travel in its caps file).
    pub inner_env: &'static [(&'static str, &'static str)],
    /// The inner layer's working directory (empty: the agent's own).
    pub inner_cwd: &'static str,
}

/// The request of a plain run of `argv` under `caps` (`proxy_env`: the egress proxy's
/// variables of an allowlist run, over any the caps set; `network`: bring the guest's
/// network device up).
pub fn plain(
    argv: Vec<String>,
    caps: &Caps,
    base: &Base,
    proxy_env: &[(String, String)],
    network: bool,
) -> RunRequest {
    let limits = &caps.limits;
    let mut env: BTreeMap<String, String> = base
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(caps.env.clone());
    if base.strip_proxy_always || !proxy_env.is_empty() {
        env.retain(|k, _| !sandbox_core::egress::PROXY_VARIABLES.contains(&k.as_str()));
        env.extend(proxy_env.iter().cloned());
    }
    let cwd = match (&caps.workdir, base.default_cwd) {
        (Some(dir), _) => dir.to_string_lossy().into_owned(),
        (None, Some(default)) => default.to_owned(),
        (None, None) => String::new(),
    };
    RunRequest {
        argv,
        env,
        cwd,
        timeout_ms: millis(limits),
        output_cap: limits.output.bytes(),
        entropy: entropy(),
        rlimits: GuestRlimits {
            cpu_seconds: limits.cpu_time.as_secs().max(1),
            file_size: limits.file_size.bytes(),
            open_files: u64::from(limits.open_files),
        },
        network,
        ..RunRequest::default()
    }
}

/// The request of an inner run: the CLI's argv and files; its limits are the inner
/// sandbox's (the agent keeps the wall clock, with [`INNER_SLACK_MS`] of slack, and the
/// output cap).
pub fn inner(inner: &InnerRun, limits: &Limits, base: &Base, network: bool) -> RunRequest {
    RunRequest {
        argv: inner.argv.clone(),
        env: base
            .inner_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cwd: base.inner_cwd.to_owned(),
        timeout_ms: millis(limits).saturating_add(INNER_SLACK_MS),
        output_cap: limits.output.bytes(),
        entropy: entropy(),
        files: inner.files.clone(),
        report: Some(inner.report.clone()),
        network,
        ..RunRequest::default()
    }
}

/// A request that only proves the agent runs a program: `/bin/true` in `/`, one second.
pub fn probe() -> RunRequest {
    RunRequest {
        argv: vec!["/bin/true".into()],
        cwd: "/".into(),
        timeout_ms: 1000,
        entropy: entropy(),
        ..RunRequest::default()
    }
}

/// 64 bytes of host randomness for the agent to mix into its RNG; empty when the host has
/// none to give (the agent then mixes nothing in).
pub fn entropy() -> Vec<u8> {
    let mut bytes = vec![0u8; 64];
    if getrandom::fill(&mut bytes).is_err() {
        bytes.clear();
    }
    bytes
}

fn millis(limits: &Limits) -> u64 {
    limits.timeout.as_millis().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: Base = Base {
        env: &[("PATH", "/usr/bin"), ("HOME", "/tmp")],
        default_cwd: Some("/tmp"),
        strip_proxy_always: true,
        inner_env: &[("PATH", "/usr/bin")],
        inner_cwd: "/",
    };
    const POD: Base = Base {
        env: &[("PATH", "/usr/bin"), ("HOME", "/workspace")],
        default_cwd: None,
        strip_proxy_always: false,
        inner_env: &[("PATH", "/usr/bin")],
        inner_cwd: "",
    };

    #[test]
    fn the_caps_environment_wins_over_the_place_and_the_proxy_wins_over_the_caps() {
        let caps = Caps::new()
            .env("HOME", "/home/agent")
            .env("HTTPS_PROXY", "http://evil:1");
        let proxy = vec![(
            "HTTPS_PROXY".to_string(),
            "http://10.0.2.100:3128".to_string(),
        )];
        let vm = plain(vec!["true".into()], &caps, &VM, &proxy, true);
        assert_eq!(vm.env["HOME"], "/home/agent");
        assert_eq!(vm.env["HTTPS_PROXY"], "http://10.0.2.100:3128");
        assert_eq!(vm.cwd, "/tmp");
        assert!(vm.network);
        // A VM without a proxy drops the caller's proxy variables; a pod keeps them.
        assert!(!plain(vec!["true".into()], &caps, &VM, &[], false)
            .env
            .contains_key("HTTPS_PROXY"));
        let pod = plain(vec!["true".into()], &caps, &POD, &[], false);
        assert_eq!(pod.env["HTTPS_PROXY"], "http://evil:1");
        assert_eq!(pod.cwd, "", "the agent's own directory");
        let pod = plain(
            vec!["true".into()],
            &caps.clone().workdir("/w"),
            &POD,
            &[],
            false,
        );
        assert_eq!(pod.cwd, "/w");
    }

    #[test]
    fn limits_travel_in_the_request() {
        let caps = Caps::new().timeout(std::time::Duration::from_secs(3));
        let request = plain(vec!["true".into()], &caps, &VM, &[], false);
        assert_eq!(request.timeout_ms, 3000);
        assert_eq!(request.output_cap, caps.limits.output.bytes());
        assert_eq!(
            request.rlimits.open_files,
            u64::from(caps.limits.open_files)
        );
        assert_eq!(request.entropy.len(), 64);
    }
}
