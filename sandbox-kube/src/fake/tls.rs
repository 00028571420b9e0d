//! The fake's https: a certificate authority made at start (ECDSA P-256), a server
//! certificate it signs for `127.0.0.1` and `localhost`, and the acceptor serving it. The
//! CA's PEM goes into the fake's kubeconfig (`certificate-authority-data`), as a real
//! cluster's does.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::FakeError;

/// The server side of the fake's TLS.
pub(crate) struct ServerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// The CA certificate (PEM) clients must trust.
    pub ca_pem: String,
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> FakeError {
    FakeError::Tls {
        message: format!("{what}: {e}"),
    }
}

/// A fresh CA and a server certificate for the loopback address.
pub(crate) fn make() -> Result<ServerTls, FakeError> {
    let ca_key = KeyPair::generate().map_err(|e| tls_error("CA key", e))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_error("CA", e))?;
    ca.distinguished_name
        .push(DnType::CommonName, "strata fake API server CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| tls_error("CA", e))?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(|e| tls_error("server key", e))?;
    let mut server = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| tls_error("server certificate", e))?;
    server
        .distinguished_name
        .push(DnType::CommonName, "strata-fake-apiserver");
    server.subject_alt_names = vec![
        SanType::IpAddress(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
        SanType::DnsName(
            "localhost"
                .try_into()
                .map_err(|e| tls_error("server name", e))?,
        ),
    ];
    server.use_authority_key_identifier_extension = true;
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = server
        .signed_by(&key, &issuer)
        .map_err(|e| tls_error("server certificate", e))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("TLS versions", e))?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone(), ca_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| tls_error("server configuration", e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        ca_pem: ca_cert.pem(),
    })
}
