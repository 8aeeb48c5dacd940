//! Startup and readiness probes (httpGet, tcpSocket), run from the node (the lab netns) like
//! the kubelet's.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tno_netlab::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Probe bookkeeping of one container.
#[derive(Debug, Default)]
pub struct ProbeState {
    pub successes: i32,
    pub failures: i32,
    pub next_at: Option<tokio::time::Instant>,
    /// The startup probe succeeded (or the container has none): readiness is probed.
    pub started: bool,
    pub startup_failures: i32,
    pub startup_next_at: Option<tokio::time::Instant>,
}

/// The port a probe targets: a number or the name of one of the container's ports.
fn resolve_port(port: &IntOrString, container: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(number) => u16::try_from(*number).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|port| port.name.as_deref() == Some(name.as_str()))
            .and_then(|port| u16::try_from(port.container_port).ok()),
    }
}

/// Runs one probe attempt; `true` means success.
pub async fn run_probe(
    node: Arc<Netns>,
    pod_ip: Ipv4Addr,
    container: &Container,
    probe: &Probe,
) -> bool {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(tcp) = &probe.tcp_socket {
        let Some(port) = resolve_port(&tcp.port, container) else {
            return false;
        };
        return connect(
            node,
            SocketAddr::V4(SocketAddrV4::new(pod_ip, port)),
            timeout,
        )
        .await
        .is_some();
    }
    if let Some(http) = &probe.http_get {
        let Some(port) = resolve_port(&http.port, container) else {
            return false;
        };
        if http
            .scheme
            .as_deref()
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https"))
        {
            // Kubernetes does not verify the certificate either; a completed TCP handshake is
            // the part of an HTTPS probe this kubelet checks.
            return connect(
                node,
                SocketAddr::V4(SocketAddrV4::new(pod_ip, port)),
                timeout,
            )
            .await
            .is_some();
        }
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let mut request = format!(
            "GET {path} HTTP/1.1\r\nHost: {pod_ip}:{port}\r\nUser-Agent: kube-probe/tno\r\nConnection: close\r\n"
        );
        for header in http.http_headers.iter().flatten() {
            request.push_str(&format!("{}: {}\r\n", header.name, header.value));
        }
        request.push_str("\r\n");
        let attempt = async {
            let mut stream = connect(
                node,
                SocketAddr::V4(SocketAddrV4::new(pod_ip, port)),
                timeout,
            )
            .await?;
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = vec![0u8; 64];
            let read = stream.read(&mut head).await.ok()?;
            status_is_success(&head[..read])
        };
        return tokio::time::timeout(timeout, attempt)
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
    }
    // exec and grpc probes are not supported: never ready, so the gap is visible.
    false
}

/// `HTTP/1.1 204 …` → true for 200–399, as the kubelet decides.
fn status_is_success(head: &[u8]) -> Option<bool> {
    let text = std::str::from_utf8(head).ok()?;
    let code: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((200..400).contains(&code))
}

async fn connect(
    node: Arc<Netns>,
    addr: SocketAddr,
    timeout: Duration,
) -> Option<tokio::net::TcpStream> {
    let stream = tokio::task::spawn_blocking(move || node.connect_tcp(addr, timeout))
        .await
        .ok()?
        .ok()?
        .ok()?;
    stream.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(stream).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_status_lines_are_classified() {
        assert_eq!(status_is_success(b"HTTP/1.1 200 OK\r\n"), Some(true));
        assert_eq!(status_is_success(b"HTTP/1.0 302 Found\r\n"), Some(true));
        assert_eq!(
            status_is_success(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(false)
        );
        assert_eq!(status_is_success(b"garbage"), None);
    }
}
