//! The test servers themselves, run directly on 127.0.0.1 (no cluster needed).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tno_testenv_kube::process::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BINARY: &str = env!("CARGO_BIN_EXE_tno-test-servers");

/// A server process, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start(args: &[&str], port: u16) -> Server {
    let child = Command::new(BINARY)
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .expect("test server starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "{args:?} did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Server(child)
}

async fn http_get<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
) -> String {
    stream
        .write_all(b"GET /hello?x=1 HTTP/1.1\r\nHost: test\r\nX-Forwarded-For: 100.64.0.7\r\nConnection: close\r\n\r\n")
        .await
        .expect("request written");
    let mut answer = String::new();
    // The server keeps the connection open; the answer is small and arrives in one piece.
    let mut buffer = vec![0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer))
        .await
        .expect("answer in time")
        .expect("answer read");
    answer.push_str(&String::from_utf8_lossy(&buffer[..read]));
    answer
}

#[tokio::test]
async fn tcp_echo_and_tcp_check_agree() {
    let port = free_port().expect("port");
    let _server = start(
        &["tcp-echo", "--listen", &format!("127.0.0.1:{port}")],
        port,
    )
    .await;
    let ok = Command::new(BINARY)
        .args([
            "tcp-check",
            "--target",
            &format!("127.0.0.1:{port}"),
            "--attempts",
            "3",
        ])
        .status()
        .expect("tcp-check runs");
    assert!(ok.success());
    let closed = free_port().expect("port");
    let failed = Command::new(BINARY)
        .args([
            "tcp-check",
            "--target",
            &format!("127.0.0.1:{closed}"),
            "--attempts",
            "1",
        ])
        .stderr(Stdio::null())
        .status()
        .expect("tcp-check runs");
    assert!(
        !failed.success(),
        "tcp-check must fail against a closed port"
    );
}

#[tokio::test]
async fn http_echo_returns_request_line_and_headers() {
    let port = free_port().expect("port");
    let _server = start(
        &[
            "http-echo",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--name",
            "a",
        ],
        port,
    )
    .await;
    let answer = http_get(
        TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect"),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("server: a\nGET /hello?x=1\n"), "{answer}");
    assert!(answer.contains("x-forwarded-for: 100.64.0.7"), "{answer}");
}

#[tokio::test]
async fn slow_answers_after_its_delay() {
    let port = free_port().expect("port");
    let _server = start(
        &[
            "slow",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--delay-ms",
            "700",
        ],
        port,
    )
    .await;
    let started = Instant::now();
    let answer = http_get(
        TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect"),
    )
    .await;
    assert!(answer.contains("200 OK"), "{answer}");
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "answered before the delay"
    );
}

#[tokio::test]
async fn https_echo_serves_the_given_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["echo.test".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    std::fs::write(&cert_path, cert.pem()).expect("cert written");
    std::fs::write(&key_path, key.serialize_pem()).expect("key written");
    let port = free_port().expect("port");
    let _server = start(
        &[
            "https-echo",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--cert",
            cert_path.to_str().expect("utf-8 path"),
            "--key",
            key_path.to_str().expect("utf-8 path"),
        ],
        port,
    )
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root added");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("echo.test").expect("server name");
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the given cert");
    let answer = http_get(tls).await;
    assert!(answer.contains("GET /hello?x=1"), "{answer}");
}

#[tokio::test]
async fn ws_echo_echoes_messages() {
    let port = free_port().expect("port");
    let _server = start(&["ws-echo", "--listen", &format!("127.0.0.1:{port}")], port).await;
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (mut socket, _) = tokio_tungstenite::client_async(format!("ws://127.0.0.1:{port}/"), tcp)
        .await
        .expect("websocket handshake");
    socket
        .send(tokio_tungstenite::tungstenite::Message::text("hello"))
        .await
        .expect("sent");
    let echoed = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("echo in time")
        .expect("a message")
        .expect("no error");
    assert_eq!(echoed.into_text().expect("text").as_str(), "hello");
}
