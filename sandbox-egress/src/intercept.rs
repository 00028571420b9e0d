//! HTTPS interception for secrets: a run with secrets gets its own certificate authority;
//! a tunnel to a host a secret is bound to is terminated with a certificate for that host,
//! one request is read, the secrets bound to the host are substituted in its headers, and
//! it is re-sent over TLS to the upstream, verified against the system's roots.
//!
//! The CA's key never leaves the proxy's memory and dies with the run; its certificate is
//! name-constrained to the secrets' hosts, so even a sandbox that trusts it cannot be
//! shown a certificate for any other name. Only HTTP/1.1 is offered (ALPN), one request
//! per connection.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::first_bytes::{self, FirstBytes};
use crate::http1::{forward_request, origin_request, read_head, HostPort};
use crate::secrets::BoundSecret;
use crate::{lock, refuse, Refusal, RunState, HEAD_TIMEOUT};

/// A run's certificate authority and the server configurations it issued, per host.
pub struct RunCa {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
    issued: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for RunCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCa").finish_non_exhaustive()
    }
}

fn tls_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl RunCa {
    /// A fresh CA (ECDSA P-256) whose certificates may only name the secrets' hosts.
    pub fn new(secrets: &[BoundSecret]) -> io::Result<RunCa> {
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Strata egress run CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted: Vec<GeneralSubtree> = Vec::new();
        for host in secrets.iter().flat_map(BoundSecret::hosts) {
            let name = host.trim_start_matches("*.").to_string();
            if !permitted.contains(&GeneralSubtree::DnsName(name.clone())) {
                permitted.push(GeneralSubtree::DnsName(name));
            }
        }
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        let cert = params.self_signed(&key).map_err(tls_err)?;
        Ok(RunCa {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
            issued: Mutex::default(),
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A TLS server configuration presenting a certificate for `host` (made once per host).
    fn server_config(&self, host: &str) -> io::Result<Arc<rustls::ServerConfig>> {
        if let Some(config) = lock(&self.issued).get(host) {
            return Ok(config.clone());
        }
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(tls_err)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_err)?;
        let chain = vec![cert.der().clone(), self.der.clone()];
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(tls_err)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        lock(&self.issued).insert(host.to_string(), config.clone());
        Ok(config)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The client configuration for upstreams: the system's roots (`SSL_CERT_FILE` and
/// `SSL_CERT_DIR` honoured), loaded once per process.
fn upstream_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(loaded.certs);
            if added == 0 {
                return Err(format!(
                    "no trusted root certificates on this host ({:?})",
                    loaded.errors
                ));
            }
            let mut config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

/// Whether tunnels to `host` are intercepted in this run.
pub(crate) fn intercepts(run: &RunState, host: &str) -> bool {
    run.ca.is_some() && run.secrets.iter().any(|s| s.bound_to(host))
}

/// Serves an established tunnel (`200` already sent) to a host secrets are bound to: TLS
/// is terminated and re-originated, plain HTTP is read directly; one request either way,
/// with the secrets substituted. Anything else is refused.
pub(crate) async fn serve_intercepted<S: AsyncRead + AsyncWrite + Unpin>(
    client: S,
    upstream: TcpStream,
    early: Vec<u8>,
    run: &RunState,
    host: &str,
    port: u16,
    addr: IpAddr,
) {
    let refused = |why: String| refuse(run, host, port, Some(addr), Refusal::BadRequest(why));
    let mut client = Prefixed {
        prefix: early,
        inner: client,
    };
    let first = match tokio::time::timeout(HEAD_TIMEOUT, first_verdict(&mut client)).await {
        Ok(Ok(verdict)) => verdict,
        Ok(Err(_)) => return,
        Err(_) => return refused("the client's first bytes did not arrive in time".into()),
    };
    match first {
        FirstBytes::Tls { sni } if sni.as_deref().is_none_or(|name| name == host) => {}
        FirstBytes::Http { .. } => {
            return serve_one(client, upstream, run, host, port, addr, 80).await;
        }
        other => {
            return refused(format!(
                "a host secrets are bound to is reached by HTTP or HTTPS only (got {other:?})"
            ))
        }
    }
    let ca = match &run.ca {
        Some(ca) => ca,
        None => return,
    };
    let acceptor = match ca.server_config(host) {
        Ok(config) => tokio_rustls::TlsAcceptor::from(config),
        Err(e) => return refused(format!("issue a certificate for {host}: {e}")),
    };
    let tls_client = match tokio::time::timeout(HEAD_TIMEOUT, acceptor.accept(client)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return refused(format!("TLS with the client: {e}")),
        Err(_) => return refused("TLS with the client timed out".into()),
    };
    let tls_upstream = match connect_tls(upstream, host).await {
        Ok(stream) => stream,
        Err(why) => return refuse(run, host, port, Some(addr), Refusal::ConnectFailed(why)),
    };
    serve_one(tls_client, tls_upstream, run, host, port, addr, 443).await;
}

/// TLS to an upstream already connected, verified against the host's roots for `host`.
pub(crate) async fn connect_tls(
    upstream: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let connector = tokio_rustls::TlsConnector::from(upstream_config()?);
    let name =
        ServerName::try_from(host.to_string()).map_err(|e| format!("server name {host:?}: {e}"))?;
    match tokio::time::timeout(crate::CONNECT_TIMEOUT, connector.connect(name, upstream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("TLS with {host}: {e}")),
        Err(_) => Err(format!("TLS with {host} timed out")),
    }
}

/// Reads until the first bytes are classified (they stay in the prefix for the reader).
async fn first_verdict<S: AsyncRead + Unpin>(client: &mut Prefixed<S>) -> io::Result<FirstBytes> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 4096];
    loop {
        match first_bytes::classify(&client.prefix) {
            FirstBytes::NeedMore => {}
            verdict => return Ok(verdict),
        }
        let n = client.inner.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        client.prefix.extend_from_slice(&chunk[..n]);
    }
}

/// One request from `client` to `host`, secrets substituted, the response back.
async fn serve_one<C, U>(
    mut client: C,
    upstream: U,
    run: &RunState,
    host: &str,
    port: u16,
    addr: IpAddr,
    default_port: u16,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let refused = |why: String| refuse(run, host, port, Some(addr), Refusal::BadRequest(why));
    let (raw, early) =
        match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client, Vec::new())).await {
            Ok(Ok(read)) => read,
            Ok(Err(why)) => return refused(why),
            Err(_) => return refused("the request head timed out".into()),
        };
    let host_port = HostPort::Exactly {
        port,
        default: default_port,
    };
    let (request, body) = match origin_request(run, &raw, host, port, addr, host_port) {
        Ok(request) => request,
        Err((_, why)) => return refused(why),
    };
    forward_request(client, upstream, run, request, early, body, |why| {
        refuse(run, host, port, Some(addr), why);
    })
    .await;
}

/// A stream whose first reads return `prefix` (bytes already read from `inner`).
struct Prefixed<S> {
    prefix: Vec<u8>,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
