//! Clients that tailnet nodes use in tests and the lab demo: HTTPS through a LocalAPI dial.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tno_testenv_tailnet::{Dialed, LocalApi};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` over HTTPS from the tailnet node behind `node` to `ip:port`: TLS with SNI `sni`
/// verified against `ca_pem` only, `Connection: close`. Returns the raw response (head and
/// body) or what failed.
pub async fn https_get(
    node: &LocalApi,
    ip: &str,
    port: u16,
    sni: &str,
    ca_pem: &str,
    path: &str,
) -> Result<String, String> {
    let stream = match tokio::time::timeout(Duration::from_secs(10), node.dial(ip, port)).await {
        Ok(Ok(Dialed::Tailnet(stream))) => stream,
        Ok(Ok(Dialed::DialSelf { addr })) => {
            return Err(format!("not routed through the tailnet ({addr})"));
        }
        Ok(Err(e)) => return Err(format!("dial: {e}")),
        Err(_) => return Err("dial timed out".to_string()),
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| format!("CA PEM: {e}"))?)
            .map_err(|e| format!("CA: {e}"))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_string())?
    .map_err(|e| format!("TLS: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut response))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}
