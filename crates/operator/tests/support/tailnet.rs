//! Connections from a tailnet node through its LocalAPI (`tailscale dial`): TCP, TLS, and the
//! HTTPS request and TCP echo the ingress tests send; plus the certificates they trust.

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tno_testenv_tailnet::{Dialed, DialedStream, LocalApi};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

/// How long a dial, a TLS handshake or a small response may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// The tcp echo's dial and answer: shorter, as it also probes for refused connections.
const ECHO_TIMEOUT: Duration = Duration::from_secs(8);

/// A TCP connection from `node` to `ip:port` that goes through the tailnet (a `Dial-Self`
/// answer, i.e. not routed through the tailnet, is an error).
pub async fn dial(
    node: &LocalApi,
    ip: &str,
    port: u16,
    timeout: Duration,
) -> Result<DialedStream, String> {
    match tokio::time::timeout(timeout, node.dial(ip, port)).await {
        Ok(Ok(Dialed::Tailnet(stream))) => Ok(stream),
        Ok(Ok(Dialed::DialSelf { addr })) => Err(format!("dial-self {addr}")),
        Ok(Err(e)) => Err(format!("dial: {e}")),
        Err(_) => Err("dial timed out".to_string()),
    }
}

/// TLS over the tailnet from `node` to `ip:port`, verifying `sni` against `ca_pem` only.
pub async fn tls_connect(
    node: &LocalApi,
    ip: &str,
    port: u16,
    sni: &str,
    ca_pem: &str,
) -> Result<TlsStream<DialedStream>, String> {
    let stream = dial(node, ip, port, STEP_TIMEOUT).await?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    tokio::time::timeout(
        STEP_TIMEOUT,
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_string())?
    .map_err(|e| format!("TLS: {e}"))
}

/// `GET /hello` over HTTPS to `ip:443` (see [`tls_connect`]) with `Connection: close` and the
/// `headers` given; returns the whole response text.
pub async fn https_get_hello(
    node: &LocalApi,
    ip: &str,
    sni: &str,
    ca_pem: &str,
    headers: &[(&str, &str)],
) -> Result<String, String> {
    let mut tls = tls_connect(node, ip, 443, sni, ca_pem).await?;
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    let request = format!("GET /hello HTTP/1.1\r\nHost: {sni}\r\n{extra}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, tls.read_to_end(&mut response))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// `response` when it is a 200, else the response as the error (to poll until served).
pub fn ok_200(response: String) -> Result<String, String> {
    if response.starts_with("HTTP/1.1 200") {
        Ok(response)
    } else {
        Err(response)
    }
}

/// Raw TCP through the tailnet: Ok when a connection opens and echoes a line.
pub async fn tcp_echo(node: &LocalApi, ip: &str, port: u16) -> Result<(), String> {
    const LINE: &[u8] = b"ping through the ingress\n";
    let mut stream = dial(node, ip, port, ECHO_TIMEOUT).await?;
    stream.write_all(LINE).await.map_err(|e| e.to_string())?;
    let mut echoed = vec![0u8; LINE.len()];
    tokio::time::timeout(ECHO_TIMEOUT, stream.read_exact(&mut echoed))
        .await
        .map_err(|_| "echo timed out".to_string())?
        .map_err(|e| e.to_string())?;
    if echoed == LINE {
        Ok(())
    } else {
        Err(format!("got {:?}", String::from_utf8_lossy(&echoed)))
    }
}

/// A self-signed certificate for `names`, as (certificate PEM, key PEM); the client pins it
/// as its only root.
pub fn self_signed(names: &[String]) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(names.to_vec())
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    (cert.pem(), key.serialize_pem())
}

/// What a node's tailnet port does with a connection and a plaintext HTTP request.
#[derive(Debug)]
pub enum PortAnswer {
    /// The node refused the connection (its tailscaled reset it): nothing listens there.
    Refused(String),
    /// No connection and no refusal (e.g. the ACL drops the packets, or the grant is not live
    /// yet): says nothing about the port.
    NoConnection(String),
    /// A connection opened; these bytes came back to `GET / HTTP/1.1` (empty: none).
    Connected(Vec<u8>),
}

/// Dials `ip:port` from `node` and, if a connection opens, sends a plaintext `GET /` for
/// `host` and collects what comes back within a few seconds.
pub async fn plaintext_probe(node: &LocalApi, ip: &str, port: u16, host: &str) -> PortAnswer {
    let mut stream = match dial(node, ip, port, ECHO_TIMEOUT).await {
        Ok(stream) => stream,
        Err(e) if e.to_lowercase().contains("refused") => return PortAnswer::Refused(e),
        Err(e) => return PortAnswer::NoConnection(e),
    };
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    // Up to 5 s for a first byte, then until the answer pauses for half a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let until = if answer.is_empty() {
            deadline
        } else {
            deadline.min(tokio::time::Instant::now() + Duration::from_millis(500))
        };
        match tokio::time::timeout_at(until, stream.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => answer.extend_from_slice(&buffer[..read]),
            _ => break,
        }
    }
    PortAnswer::Connected(answer)
}

/// Waits (up to `timeout`) until `node`'s dial of `ip:port` is refused, i.e. reaches the node
/// and finds no listener: a closed port, told apart from a dropped dial (which proves nothing)
/// and from a listener that answers (plaintext or not), which fails at once with what came
/// back. Returns the refusal.
pub async fn port_refused(
    node: &LocalApi,
    ip: &str,
    port: u16,
    host: &str,
    timeout: Duration,
) -> Result<String, String> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match plaintext_probe(node, ip, port, host).await {
            PortAnswer::Refused(message) => return Ok(message),
            PortAnswer::Connected(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                return Err(format!(
                    "{ip}:{port} accepted a connection; a plaintext GET got {} ({:?})",
                    if text.starts_with("HTTP/") {
                        "an HTTP answer"
                    } else if bytes.is_empty() {
                        "no bytes"
                    } else {
                        "non-HTTP bytes"
                    },
                    text.chars().take(200).collect::<String>()
                ));
            }
            PortAnswer::NoConnection(message) if std::time::Instant::now() > deadline => {
                return Err(format!(
                    "{ip}:{port} was neither refused nor connected within {timeout:?}: {message}"
                ));
            }
            PortAnswer::NoConnection(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// An HTTPS connection kept open across requests (HTTP/1.1 keep-alive): the witness that a
/// certificate reload leaves established connections alone.
pub struct KeptConnection {
    tls: TlsStream<DialedStream>,
    sni: String,
}

impl KeptConnection {
    /// TLS to `ip:443` from `node` (see [`tls_connect`]).
    pub async fn open(node: &LocalApi, ip: &str, sni: &str, ca_pem: &str) -> Result<Self, String> {
        Ok(KeptConnection {
            tls: tls_connect(node, ip, 443, sni, ca_pem).await?,
            sni: sni.to_string(),
        })
    }

    /// The serial number (hex) of the certificate the server presented in this connection's
    /// handshake.
    pub fn peer_serial(&self) -> Result<String, String> {
        let leaf = self
            .tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .ok_or("no peer certificate")?;
        der_serial(leaf.as_ref())
    }

    /// `GET /hello` on this connection; reads exactly one response (Content-Length or chunked
    /// body) and leaves the connection open.
    pub async fn get_hello(&mut self) -> Result<String, String> {
        let request = format!(
            "GET /hello HTTP/1.1\r\nHost: {}\r\nConnection: keep-alive\r\n\r\n",
            self.sni
        );
        self.tls
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        tokio::time::timeout(STEP_TIMEOUT, read_one_response(&mut self.tls))
            .await
            .map_err(|_| "response timed out".to_string())?
    }
}

async fn read_one_response(tls: &mut TlsStream<DialedStream>) -> Result<String, String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buffer).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let head = text[..head_end].to_lowercase();
            let body = &text[head_end + 4..];
            let length = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse::<usize>().ok());
            let complete = match length {
                Some(length) => body.len() >= length,
                None if head.contains("transfer-encoding: chunked") => body.ends_with("0\r\n\r\n"),
                None => return Err(format!("response without a length: {text}")),
            };
            if complete {
                return Ok(text);
            }
        }
        let read = tls
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if read == 0 {
            return Err(format!(
                "connection closed after {} bytes: {}",
                buffer.len(),
                String::from_utf8_lossy(&buffer)
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// The serial number (hex) of a DER certificate.
pub fn der_serial(der: &[u8]) -> Result<String, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    Ok(cert.tbs_certificate.raw_serial_as_string())
}

/// The serial number (hex) of the first certificate of a PEM chain (a Secret's `tls.crt`).
pub fn pem_serial(pem: &str) -> Result<String, String> {
    let first = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or("no certificate in the PEM")?
        .map_err(|e| e.to_string())?;
    der_serial(first.as_ref())
}
