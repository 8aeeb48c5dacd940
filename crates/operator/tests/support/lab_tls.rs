//! TLS to and in front of the lab's HTTPS Headscale, for the tests' own proxies: a client that
//! trusts the lab CA (upstream side) and a server certificate from the same CA (so an operator
//! trusting `spec.serverCA` accepts the proxy as it accepts Headscale).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS connection to `addr` (an IP literal: the lab certificate names 127.0.0.1 and the lab
/// gateway) verified against `ca_pem`.
pub async fn connect(addr: SocketAddr, ca_pem: &str) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        roots.add(cert).map_err(std::io::Error::other)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
}

/// A TLS acceptor serving a certificate for 127.0.0.1 and `ips` issued by `ca` (files under
/// `dir`).
pub fn acceptor(
    ca: &tno_testenv_tailnet::LabCa,
    dir: &Path,
    name: &str,
    ips: &[IpAddr],
) -> TlsAcceptor {
    let mut all = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
    all.extend_from_slice(ips);
    let files = ca
        .issue_server(dir, name, &[], &all)
        .expect("proxy certificate");
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .expect("proxy certificate file")
        .flatten()
        .collect();
    let key = PrivateKeyDer::from_pem_file(&files.key).expect("proxy key file");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("proxy TLS configuration");
    TlsAcceptor::from(Arc::new(config))
}
