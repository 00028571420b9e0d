//! A microVM run's egress: its registration with the host proxy, served on a socket the
//! VM's network relay joins guest connections to.

use super::*;

/// Where the guest reaches the egress proxy.
pub(super) const GUEST_PROXY_ADDR: std::net::SocketAddr = std::net::SocketAddr::V4(
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(10, 0, 2, 100), 3128),
);

/// The proxy variables (`HTTP_PROXY` and the others) a guest's tools get.
pub(super) type ProxyEnv = Vec<(String, String)>;

/// A run's egress: its registration with the host proxy and the VM's relay to it.
pub(super) struct VmEgress {
    pub(super) run: sandbox_os::RunEgress,
    pub(super) relay: NetRelay,
}

impl MicrovmBackend {
    /// The egress of a run or live sandbox with `caps` (an allowlist: registered with the
    /// proxy, see [`MicrovmBackend::egress_for`]; otherwise none) and the proxy variables
    /// the guest's tools get.
    pub(super) fn guest_egress(
        &self,
        caps: &Caps,
        dir: &Path,
        artifacts: &GuestArtifacts,
    ) -> Result<(Option<VmEgress>, ProxyEnv)> {
        let egress = match &caps.net {
            Net::Allow(_) => Some(self.egress_for(caps, dir, artifacts)?),
            _ => None,
        };
        let proxy_env = egress
            .as_ref()
            .map(|e| {
                let url = e.run.proxy_url_at(GUEST_PROXY_ADDR);
                sandbox_core::egress::PROXY_VARIABLES
                    .iter()
                    .map(|k| (k.to_string(), url.clone()))
                    .collect()
            })
            .unwrap_or_default();
        Ok((egress, proxy_env))
    }

    /// Registers the run with the host egress proxy (started on first use) and serves it on
    /// a socket in the run's directory, which the VM's relay joins guest connections to.
    pub(super) fn egress_for(
        &self,
        caps: &Caps,
        dir: &Path,
        artifacts: &GuestArtifacts,
    ) -> Result<VmEgress> {
        let host = self
            .egress
            .get_or_init(|| sandbox_os::EgressHost::start().map_err(|e| e.to_string()));
        let host = host.as_ref().map_err(|e| {
            Error::setup(
                SetupStage::Egress,
                "microvm: egress proxy",
                std::io::Error::other(e.clone()),
            )
        })?;
        let mut run = sandbox_os::RunEgress::register(host, &caps.net, &caps.limits)?;
        let socket = dir.join("egress.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .map_err(|e| Error::setup(SetupStage::Egress, "microvm: egress socket", e))?;
        sandbox_os::private::restrict(&socket)
            .map_err(|e| Error::setup(SetupStage::Egress, "microvm: egress socket", e))?;
        run.attach_unix(host, listener)?;
        Ok(VmEgress {
            run,
            relay: NetRelay {
                program: artifacts.agent.clone(),
                socket,
            },
        })
    }
}
