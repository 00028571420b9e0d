//! The host side of a run under a network allowlist: one egress proxy per backend
//! (process, container engine, microVM, cluster), started on first use on its own runtime
//! thread (`strata-egress`), and each run's registration with it; and the host's own
//! addresses ([`host_addresses`]), which a policy refuses unless a rule names them.

mod addresses;

use sandbox_core::SetupStage;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;

pub use addresses::host_addresses;
use sandbox_core::caps::Secret;
use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{EgressPolicy, Error, Limits, Net, Result};

use crate::secrets::BoundSecret;
use crate::{Attached, Budget, EgressProxy, RunGrant, SharedListener};

/// The port of the proxy inside a sandbox's own network namespace, on `127.0.0.1`.
pub const PROXY_PORT: u16 = 3128;

/// Where a tool reaches the proxy, inside its own network namespace.
pub fn proxy_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT))
}

/// A file a run with secrets needs inside its sandbox (its CA, the trust bundle); the
/// backend writes it there read-only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustFile {
    /// Absolute path inside the sandbox.
    pub path: PathBuf,
    /// Contents (PEM).
    pub contents: String,
}

/// Where a run with secrets finds its CA certificate inside the sandbox.
pub const CA_FILE: &str = "/etc/strata/egress-ca.pem";
/// The host's trusted roots plus the run's CA, inside the sandbox.
pub const CA_BUNDLE: &str = "/etc/strata/ca-bundle.pem";
/// The host's bundle of trusted roots (Debian's `ca-certificates`).
const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The variables a run's tool gets, all set to the proxy URL with its credential
/// (`http://TOKEN:egress@127.0.0.1:3128`). Any the caller set are replaced.
pub use sandbox_core::egress::PROXY_VARIABLES as PROXY_VARS;

/// The proxy and the runtime it runs on.
pub struct EgressHost {
    runtime: Option<tokio::runtime::Runtime>,
    proxy: EgressProxy,
}

impl std::fmt::Debug for EgressHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressHost").finish_non_exhaustive()
    }
}

impl EgressHost {
    /// Starts the runtime (one worker thread) and a proxy that serves per-run listeners.
    pub fn start() -> io::Result<EgressHost> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strata-egress")
            .enable_all()
            .build()?;
        let proxy = EgressProxy::attach_only(runtime.handle().clone());
        Ok(EgressHost {
            runtime: Some(runtime),
            proxy,
        })
    }
}

impl EgressHost {
    /// Serves every run registered with this host on a TCP listener bound at `addr` (port
    /// 0: one the OS chooses), each client tied to its run by its credential: for
    /// sandboxes that reach the proxy over a network (a cluster's pods). Serving stops when
    /// the returned listener drops.
    ///
    /// # Errors
    /// When `addr` cannot be bound (not one of this machine's addresses, or in use).
    pub fn serve_shared(&self, addr: std::net::SocketAddr) -> io::Result<SharedListener> {
        let listener = TcpListener::bind(addr)?;
        self.proxy.serve_shared(listener)
    }
}

impl Drop for EgressHost {
    fn drop(&mut self) {
        // Never blocks, so dropping the backend inside an async context is fine; open
        // tunnels are cut.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One run's egress: its credential, policy and budget, and its listener once attached.
pub struct RunEgress {
    grant: RunGrant,
    attached: Option<Attached>,
    rules: Vec<String>,
    /// `(variable, placeholder)` of each secret.
    placeholders: Vec<(String, String)>,
    /// The transparent listeners being served.
    transparent: Vec<Attached>,
}

impl std::fmt::Debug for RunEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunEgress")
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl RunEgress {
    /// Registers a run with `net`'s allowlist (the host's own addresses are refused unless
    /// a rule names them) and the egress budget of `limits`.
    pub fn register(host: &EgressHost, net: &Net, limits: &Limits) -> Result<RunEgress> {
        Self::register_with_secrets(host, net, limits, &[])
    }

    /// Like [`RunEgress::register`], with the caps' secrets bound to their hosts: the tool
    /// gets placeholders, and (with any secret) trusts the run's own CA, which the files of
    /// [`RunEgress::trust_files`] and the variables of [`RunEgress::set_env`] give it.
    pub fn register_with_secrets(
        host: &EgressHost,
        net: &Net,
        limits: &Limits,
        secrets: &[Secret],
    ) -> Result<RunEgress> {
        let Net::Allow(rules) = net else {
            return Err(Error::internal(
                "register egress",
                io::Error::other("the run has no allowlist"),
            ));
        };
        let own = host_addresses().map_err(|e| {
            Error::setup(
                SetupStage::Egress,
                "list the host's addresses for the egress policy",
                e,
            )
        })?;
        let policy = EgressPolicy::new(rules)?.with_host_addrs(own);
        let budget = Budget {
            max_connections: Some(u64::from(limits.egress_connections)),
            max_bytes: Some(limits.egress_bytes.bytes()),
        };
        let bound = secrets
            .iter()
            .map(|s| BoundSecret::new(&s.env, &s.value, &s.hosts))
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| {
                Error::setup(SetupStage::Egress, "make the run's secret placeholders", e)
            })?;
        let placeholders = bound
            .iter()
            .map(|s| (s.env.clone(), s.placeholder.clone()))
            .collect();
        let grant = host
            .proxy
            .register_with_secrets(policy, budget, bound)
            .map_err(|e| {
                Error::setup(
                    SetupStage::Egress,
                    "register the run with the egress proxy",
                    e,
                )
            })?;
        Ok(RunEgress {
            grant,
            attached: None,
            rules: rules.iter().map(ToString::to_string).collect(),
            placeholders,
            transparent: Vec::new(),
        })
    }

    /// Replaces the proxy variables in `env` (`KEY=VALUE` entries) with this run's.
    pub fn set_env(&self, env: &mut Vec<String>) {
        env.retain(|entry| {
            let key = entry.split('=').next().unwrap_or_default();
            !PROXY_VARS.contains(&key)
        });
        let url = self.grant.proxy_url(proxy_addr());
        env.extend(PROXY_VARS.iter().map(|key| format!("{key}={url}")));
        for (key, placeholder) in &self.placeholders {
            env.retain(|entry| entry.split('=').next() != Some(key.as_str()));
            env.push(format!("{key}={placeholder}"));
        }
        if self.grant.ca_pem().is_some() {
            let trust = [
                ("SSL_CERT_FILE", CA_BUNDLE),
                ("CURL_CA_BUNDLE", CA_BUNDLE),
                ("REQUESTS_CA_BUNDLE", CA_BUNDLE),
                ("GIT_SSL_CAINFO", CA_BUNDLE),
                ("PIP_CERT", CA_BUNDLE),
                ("NODE_EXTRA_CA_CERTS", CA_FILE),
            ];
            for (key, path) in trust {
                env.retain(|entry| entry.split('=').next() != Some(key));
                env.push(format!("{key}={path}"));
            }
        }
    }

    /// With secrets: the run's CA certificate and a bundle of it with the host's trusted
    /// roots, written into the sandbox at [`CA_FILE`] and [`CA_BUNDLE`]. Empty otherwise.
    pub fn trust_files(&self) -> Vec<TrustFile> {
        let Some(ca) = self.grant.ca_pem() else {
            return Vec::new();
        };
        let mut bundle = std::fs::read_to_string(HOST_BUNDLE).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(ca);
        vec![
            TrustFile {
                path: CA_FILE.into(),
                contents: ca.to_string(),
            },
            TrustFile {
                path: CA_BUNDLE.into(),
                contents: bundle,
            },
        ]
    }

    /// The secrets' variables, for the receipt (never the values).
    pub fn secret_names(&self) -> Vec<&str> {
        self.placeholders.iter().map(|(k, _)| k.as_str()).collect()
    }

    /// Serves the transparent listeners the helper created (see `egress_transparent`),
    /// mapping `names`' synthetic addresses back to their host names.
    pub fn attach_transparent(
        &mut self,
        host: &EgressHost,
        listeners: Vec<TcpListener>,
        names: &[(std::net::Ipv4Addr, String)],
    ) -> Result<()> {
        let map: std::collections::HashMap<std::net::IpAddr, String> = names
            .iter()
            .map(|(addr, name)| (std::net::IpAddr::V4(*addr), name.clone()))
            .collect();
        for listener in listeners {
            let attached = host
                .proxy
                .attach_transparent(listener, &self.grant, map.clone())
                .map_err(|e| {
                    Error::setup(SetupStage::Egress, "serve a transparent egress listener", e)
                })?;
            self.transparent.push(attached);
        }
        Ok(())
    }

    /// Serves the listener the helper created inside the sandbox.
    pub fn attach(&mut self, host: &EgressHost, listener: TcpListener) -> Result<()> {
        let attached = host
            .proxy
            .attach(listener, &self.grant)
            .map_err(|e| Error::setup(SetupStage::Egress, "serve the egress listener", e))?;
        self.attached = Some(attached);
        Ok(())
    }

    /// Serves a Unix socket listener for this run (a VM's user-mode network relays guest
    /// connections onto it).
    pub fn attach_unix(
        &mut self,
        host: &EgressHost,
        listener: std::os::unix::net::UnixListener,
    ) -> Result<()> {
        let attached = host
            .proxy
            .attach_unix(listener, &self.grant)
            .map_err(|e| Error::setup(SetupStage::Egress, "serve the egress socket", e))?;
        self.attached = Some(attached);
        Ok(())
    }

    /// The proxy URL with this run's credential, for a proxy reached at `addr`.
    pub fn proxy_url_at(&self, addr: std::net::SocketAddr) -> String {
        self.grant.proxy_url(addr)
    }

    /// Stops serving the run and returns its decisions, and a denial for each refusal.
    pub fn finish(self) -> (NetworkReceipt, Vec<Denial>) {
        self.finish_as(proxy_addr().to_string())
    }

    /// Like [`RunEgress::finish`], naming the enforcer as `enforcer` in the receipt.
    pub fn finish_as(mut self, enforcer: String) -> (NetworkReceipt, Vec<Denial>) {
        drop(self.attached.take());
        self.transparent.clear();
        let receipt = self
            .grant
            .receipt(enforcer, std::mem::take(&mut self.rules));
        let denials = crate::denials(&receipt);
        (receipt, denials)
    }
}
