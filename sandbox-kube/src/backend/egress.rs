//! Per-run egress on the cluster: the template's NetworkPolicy lets a pod reach one address
//! only, the egress proxy's; this process serves Strata's egress proxy there, and each run
//! registers its allowlist with it and gets its own credential.
//!
//! The proxy listens at the address the template names ([`EgressProxy::Address`]), or at
//! [`super::ClusterOptions::egress_listen`] when this machine sees that address under
//! another one (NAT). One listener serves every run of every backend of this process at
//! that address: a client is tied to its run by the credential in its proxy URL, which
//! travels in the run request over the exec stream (never in the pod's spec), and is revoked
//! when the run ends.

use sandbox_core::SetupStage;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{Capability, Caps, Error, Mechanism, Net, Receipt, Result, Strictness};
use sandbox_egress::host::{EgressHost, RunEgress};
use sandbox_egress::SharedListener;

use super::TemplateSeen;
use crate::render::EgressProxy;

/// A proxy serving one shared listener. Field order is drop order: the listener closes
/// before the proxy's runtime stops.
pub(crate) struct HostProxy {
    listener: SharedListener,
    host: EgressHost,
}

impl HostProxy {
    /// Where it listens.
    pub(crate) fn listen(&self) -> SocketAddr {
        self.listener.addr()
    }
}

impl std::fmt::Debug for HostProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostProxy")
            .field("listen", &self.listener.addr())
            .finish_non_exhaustive()
    }
}

/// The proxies this process serves, by listen address, so two backends of one template
/// share a listener instead of failing to bind it twice.
static PROXIES: Mutex<BTreeMap<SocketAddr, Weak<HostProxy>>> = Mutex::new(BTreeMap::new());

/// The proxy listening at `listen`, started (and bound) on first use.
pub(crate) fn proxy_at(listen: SocketAddr) -> Result<Arc<HostProxy>> {
    if listen.port() == 0 {
        return Err(Error::invalid(format!(
            "cluster: egress listen address {listen}: port 0 (the pods' NetworkPolicy names a fixed port)"
        )));
    }
    let mut proxies = PROXIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(proxy) = proxies.get(&listen).and_then(Weak::upgrade) {
        return Ok(proxy);
    }
    let host = EgressHost::start()
        .map_err(|e| Error::setup(SetupStage::Egress, "cluster: egress proxy", e))?;
    let listener = host.serve_shared(listen).map_err(|e| {
        Error::setup(
            SetupStage::Egress, format!(
                "cluster: egress proxy on {listen} (the address the template's NetworkPolicy sends pods to; if this machine has it under another address, set the listen address)"
            ),
            e,
        )
    })?;
    let proxy = Arc::new(HostProxy { listener, host });
    proxies.retain(|_, weak| weak.strong_count() > 0);
    proxies.insert(listen, Arc::downgrade(&proxy));
    Ok(proxy)
}

/// One run's egress: its registration with the proxy and where the pod reaches it.
pub(crate) struct PodEgress {
    run: RunEgress,
    /// The address in the pod's proxy URL (the template's).
    reached_at: SocketAddr,
    /// Kept alive for the run.
    proxy: Arc<HostProxy>,
}

impl std::fmt::Debug for PodEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodEgress")
            .field("reached_at", &self.reached_at)
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

/// What a run's network asks of the template's egress, before anything is claimed: for an
/// allowlist, a registration with the proxy (`proxy_at`: the proxy listening at an address,
/// started on first use; `listen`: that address when it is not the template's), else
/// nothing. A proxy the template names that is not this process's
/// (proxy pods in the cluster) cannot apply the run's rules: refused when strict, a gap
/// otherwise.
pub(crate) fn plan(
    seen: &TemplateSeen,
    caps: &Caps,
    strictness: Strictness,
    listen: Option<SocketAddr>,
    proxy_at: impl FnOnce(SocketAddr) -> Result<Arc<HostProxy>>,
    gaps: &mut Vec<(Capability, String)>,
) -> Result<Option<PodEgress>> {
    if !matches!(caps.net, Net::Allow(_)) {
        return Ok(None);
    }
    let template = &seen.template;
    match &seen.proxy {
        Some(EgressProxy::Address(addr)) => {
            let proxy = proxy_at(listen.unwrap_or(*addr))?;
            let run = RunEgress::register(&proxy.host, &caps.net, &caps.limits)?;
            Ok(Some(PodEgress {
                run,
                reached_at: *addr,
                proxy,
            }))
        }
        None if seen.egress.is_none() => Err(Error::invalid(format!(
            "cluster: template {template} lets its pods reach nothing (it was rendered for net none); an allowlist needs a tier rendered with an egress proxy (strata kube apply --egress-proxy IP:PORT of the machine running strata)"
        ))),
        other => {
            let to = match other {
                Some(EgressProxy::Pods {
                    namespace, port, ..
                }) => format!("proxy pods in namespace {namespace} on port {port}"),
                _ => "addresses of its own (not a rule Strata renders)".to_owned(),
            };
            let reason = format!(
                "template {template} sends the pod's egress to {to}, not to this process's egress proxy: the run's allowlist is not applied there"
            );
            match strictness {
                Strictness::Strict => Err(Error::unenforceable_strict("net: cluster allowlist", reason)),
                Strictness::BestEffort => {
                    gaps.push((Capability::Net, reason));
                    Ok(None)
                }
            }
        }
    }
}

impl PodEgress {
    /// Where the pod reaches the proxy (the template's address).
    pub(crate) fn peer(&self) -> SocketAddr {
        self.reached_at
    }

    /// The proxy variables the tool gets: the proxy URL with this run's credential, at the
    /// address the pod reaches.
    pub(crate) fn proxy_env(&self) -> Vec<(String, String)> {
        let url = self.run.proxy_url_at(self.reached_at);
        sandbox_core::egress::PROXY_VARIABLES
            .iter()
            .map(|key| (key.to_string(), url.clone()))
            .collect()
    }

    /// Revokes the run's credential and states the proxy's decisions in `receipt`.
    pub(crate) fn finish(self, receipt: &mut Receipt) {
        let listen = self.proxy.listener.addr();
        let (network, denials): (NetworkReceipt, Vec<Denial>) = self.run.finish_as(format!(
            "{} (the pod's only egress peer) -> strata's egress proxy on {listen}",
            self.reached_at
        ));
        receipt.enforce(
            Capability::Net,
            Mechanism::Proxy,
            "strata egress proxy",
            format!(
                "allowlist [{}]; the template's NetworkPolicy lets the pod reach only {}, where this process serves the proxy; the run's credential travelled in the run request and is revoked now; names are resolved by the proxy (no cluster DNS)",
                network.rules.join(", "),
                self.reached_at
            ),
        );
        receipt.denials.extend(denials);
        receipt.network = Some(network);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(proxy: Option<EgressProxy>, egress: Option<&str>) -> TemplateSeen {
        TemplateSeen {
            template: "strata-t".into(),
            runtime_class: Some("gvisor".into()),
            memory: None,
            cpu_millis: None,
            disk: None,
            hardening: Vec::new(),
            egress: egress.map(str::to_owned),
            proxy,
            ingress_rules: 0,
        }
    }

    fn allowlist() -> Caps {
        Caps {
            net: Net::Allow(vec!["example.com:443".parse().expect("rule")]),
            ..Caps::default()
        }
    }

    #[test]
    fn proxy_pods_of_the_cluster_cannot_apply_a_runs_allowlist() {
        let pods = EgressProxy::Pods {
            namespace: "strata-system".into(),
            labels: [("app".to_owned(), "egress".to_owned())].into(),
            port: 3128,
        };
        let template = seen(Some(pods), Some("[...]"));
        let mut gaps = Vec::new();
        let err = plan(
            &template,
            &allowlist(),
            Strictness::Strict,
            None,
            proxy_at,
            &mut gaps,
        )
        .expect_err("strict refuses");
        assert!(matches!(err, Error::Unenforceable { .. }), "{err}");
        assert!(err.to_string().contains("strata-system"), "{err}");
        let planned = plan(
            &template,
            &allowlist(),
            Strictness::BestEffort,
            None,
            proxy_at,
            &mut gaps,
        )
        .expect("best effort runs");
        assert!(planned.is_none());
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].0, Capability::Net);
    }

    #[test]
    fn hand_written_egress_rules_are_not_taken_for_the_proxy() {
        let template = seen(None, Some("[{\"to\": [...]}]"));
        let err = plan(
            &template,
            &allowlist(),
            Strictness::Strict,
            None,
            proxy_at,
            &mut Vec::new(),
        )
        .expect_err("strict refuses");
        assert!(
            err.to_string().contains("not a rule Strata renders"),
            "{err}"
        );
    }

    #[test]
    fn runs_without_an_allowlist_register_nothing() {
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let template = seen(Some(EgressProxy::Address(addr)), Some("[...]"));
        let planned = plan(
            &template,
            &Caps::default(),
            Strictness::Strict,
            None,
            |_| panic!("no proxy is started for a run without an allowlist"),
            &mut Vec::new(),
        )
        .expect("nothing to plan");
        assert!(planned.is_none());
    }

    #[test]
    fn a_listen_address_without_a_port_is_refused() {
        let err = proxy_at("127.0.0.1:0".parse().expect("addr")).expect_err("port 0");
        assert!(matches!(err, Error::InvalidRequest { .. }), "{err}");
    }

    #[test]
    fn an_address_this_machine_does_not_have_is_a_setup_error_naming_it() {
        // TEST-NET-3: never one of this machine's addresses.
        let err = proxy_at("203.0.113.9:3128".parse().expect("addr")).expect_err("bind fails");
        assert!(matches!(err, Error::Setup { .. }), "{err}");
        assert!(err.to_string().contains("203.0.113.9:3128"), "{err}");
    }

    #[test]
    fn backends_listening_at_one_address_share_one_proxy() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let first = proxy_at(addr).expect("bound");
        let second = proxy_at(addr).expect("shared, not bound twice");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first.listener.addr(), addr);
        drop((first, second));
        let registry = PROXIES.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            registry.get(&addr).and_then(Weak::upgrade).is_none(),
            "the proxy stops with its last user"
        );
    }
}
