//! The HTTP side of the ingress benchmark: the backend every proxy forwards to, a stand-in
//! for tailscaled's LocalAPI `whois`, the TLS handshake client, and the wrappers around
//! `wrk` (keep-alive load) and `curl` (one large download).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const SMALL_BODY: usize = 1024;
const CHUNK: usize = 256 * 1024;

/// A response body of `left` bytes sent in 256 KiB frames of one shared buffer.
struct Repeated {
    chunk: Bytes,
    left: u64,
}

impl Body for Repeated {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        let len = self.left.min(self.chunk.len() as u64) as usize;
        self.left -= len as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..len)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.left)
    }
}

enum Answer {
    Small(Full<Bytes>),
    Large(Repeated),
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Answer::Small(body) => Pin::new(body).poll_frame(cx),
            Answer::Large(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Answer::Small(body) => body.size_hint(),
            Answer::Large(body) => body.size_hint(),
        }
    }
}

/// `GET /1k` → 1 KiB; `GET /bytes?n=N` → N bytes; anything else → 404.
fn answer(request: &Request<Incoming>, small: &Bytes, chunk: &Bytes) -> Response<Answer> {
    let path = request.uri().path();
    let body = if path == "/1k" {
        Answer::Small(Full::new(small.clone()))
    } else if path == "/bytes" {
        let left = request
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("n="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Answer::Large(Repeated {
            chunk: chunk.clone(),
            left,
        })
    } else {
        let mut response = Response::new(Answer::Small(Full::new(Bytes::new())));
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    };
    Response::new(body)
}

/// The backend (plain HTTP/1.1 on 127.0.0.1:`port`) and, on `localapi_socket`, a LocalAPI
/// stand-in that knows no peer (`404` to every request, as tailscaled answers `whois` for a
/// connection that did not come from the tailnet), so the agent's per-connection `whois`
/// costs a real round trip. Runs until killed.
pub fn serve(port: u16, localapi_socket: &Path) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let _ = std::fs::remove_file(localapi_socket);
    let unix = runtime.block_on(async { tokio::net::UnixListener::bind(localapi_socket) })?;
    runtime.spawn(async move {
        while let Ok((stream, _)) = unix.accept().await {
            tokio::spawn(async move {
                let service = service_fn(|_request: Request<Incoming>| async {
                    let mut response = Response::new(Full::new(Bytes::from_static(b"no match")));
                    *response.status_mut() = StatusCode::NOT_FOUND;
                    Ok::<_, Infallible>(response)
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let small = Bytes::from(vec![b'x'; SMALL_BODY]);
        let chunk: Bytes = (0..CHUNK)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let (small, chunk) = (small.clone(), chunk.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let response = answer(&request, &small, &chunk);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// New TLS connections per second: each does a full handshake (no resumption), one
/// `GET /1k` with `Connection: close`, and checks the answer. `clients` concurrent loops for
/// `duration`; any failure fails the run.
pub fn handshake_rate(
    address: SocketAddr,
    server_name: &str,
    ca_pem: &str,
    clients: usize,
    duration: Duration,
) -> Result<f64> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("CA certificate")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls_pki_types::ServerName::try_from(server_name.to_owned())?;
    let request = format!("GET /1k HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (stop, done) = (stop.clone(), done.clone());
            let (connector, name, request) = (connector.clone(), name.clone(), request.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    one_tls_request(address, &connector, &name, &request).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }));
        }
        let started = Instant::now();
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        let completed = done.load(Ordering::Relaxed);
        let elapsed = started.elapsed();
        for task in tasks {
            task.await??;
        }
        if completed == 0 {
            bail!("{address}: no TLS connection completed");
        }
        Ok(completed as f64 / elapsed.as_secs_f64())
    })
}

async fn one_tls_request(
    address: SocketAddr,
    connector: &tokio_rustls::TlsConnector,
    name: &rustls_pki_types::ServerName<'static>,
    request: &str,
) -> Result<()> {
    let tcp = tokio::net::TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector
        .connect(name.clone(), tcp)
        .await
        .with_context(|| format!("TLS handshake with {address}"))?;
    tls.write_all(request.as_bytes()).await?;
    let mut answer = Vec::with_capacity(2048);
    match tls.read_to_end(&mut answer).await {
        Ok(_) => {}
        // A server that closes without close_notify after a complete answer.
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(error) => return Err(error.into()),
    }
    check_small_answer(&answer).with_context(|| format!("{address}: GET /1k"))
}

fn check_small_answer(answer: &[u8]) -> Result<()> {
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("no complete response head in {} bytes", answer.len());
    };
    let head = String::from_utf8_lossy(&answer[..split]);
    if !head.starts_with("HTTP/1.1 200") {
        bail!("answer {:?}", head.lines().next());
    }
    let body = &answer[split + 4..];
    if body.len() != SMALL_BODY || body.iter().any(|b| *b != b'x') {
        bail!("body of {} bytes instead of 1 KiB of 'x'", body.len());
    }
    Ok(())
}

/// What one `wrk` run measured.
#[derive(Clone, Copy, Debug)]
pub struct WrkResult {
    pub requests_per_second: f64,
    pub p50_micros: f64,
    pub p99_micros: f64,
    pub requests: u64,
    /// Socket errors (connect, read, write, timeout) and non-2xx answers.
    pub errors: u64,
}

/// `wrk` (keep-alive, HTTP/1.1) against `url` with `connections` for `duration`. wrk puts
/// the URL's host into SNI and Host, so `bench.test` must resolve: wrk runs in a private
/// mount namespace with `hosts_file` bound over /etc/hosts.
pub fn wrk(
    hosts_file: &Path,
    url: &str,
    connections: usize,
    duration: Duration,
) -> Result<WrkResult> {
    let threads = connections.clamp(1, 2).to_string();
    let connections = connections.to_string();
    let seconds = format!("{}s", duration.as_secs().max(1));
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$0" /etc/hosts && exec wrk "$@""#)
        .arg(hosts_file)
        .args([
            "--latency",
            "-t",
            &threads,
            "-c",
            &connections,
            "-d",
            &seconds,
        ])
        .arg(url)
        .output()
        .context("running wrk (Debian package wrk)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk {url} failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_wrk(&text).with_context(|| format!("wrk output for {url}:\n{text}"))
}

fn parse_wrk(text: &str) -> Result<WrkResult> {
    let mut result = WrkResult {
        requests_per_second: f64::NAN,
        p50_micros: f64::NAN,
        p99_micros: f64::NAN,
        requests: 0,
        errors: 0,
    };
    for line in text.lines() {
        let line = line.trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", value] => result.requests_per_second = value.parse()?,
            ["50%", value] => result.p50_micros = micros(value)?,
            ["99%", value] => result.p99_micros = micros(value)?,
            [count, "requests", "in", ..] => result.requests = count.parse()?,
            ["Non-2xx", "or", "3xx", "responses:", count] => {
                result.errors += count.parse::<u64>()?;
            }
            ["Socket", "errors:", rest @ ..] => {
                // connect 0, read 0, write 0, timeout 0
                for pair in rest.chunks(2) {
                    if let [_, count] = pair {
                        result.errors += count.trim_end_matches(',').parse::<u64>()?;
                    }
                }
            }
            _ => {}
        }
    }
    if result.requests == 0 || result.requests_per_second.is_nan() || result.p99_micros.is_nan() {
        bail!("no requests completed (or unreadable output)");
    }
    Ok(result)
}

fn micros(value: &str) -> Result<f64> {
    let (number, scale) = if let Some(n) = value.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1e6)
    } else {
        bail!("latency {value:?} without a unit");
    };
    Ok(number.parse::<f64>()? * scale)
}

/// One HTTPS download of `bytes` with curl (verified against `ca_file`); MiB/s.
pub fn curl_download(ca_file: &Path, server_name: &str, port: u16, bytes: u64) -> Result<f64> {
    let resolve = format!("{server_name}:{port}:127.0.0.1");
    let url = format!("https://{server_name}:{port}/bytes?n={bytes}");
    let output = std::process::Command::new("curl")
        .args([
            "-sS",
            "--http1.1",
            "-o",
            "/dev/null",
            "--resolve",
            &resolve,
            "--cacert",
        ])
        .arg(ca_file)
        .args([
            "-w",
            "%{http_code} %{size_download} %{speed_download}",
            &url,
        ])
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields.as_slice() {
        [code, size, speed] if output.status.success() && *code == "200" => {
            let size: u64 = size.parse()?;
            if size != bytes {
                bail!("{url}: {size} of {bytes} bytes arrived");
            }
            Ok(speed.parse::<f64>()? / (1024.0 * 1024.0))
        }
        _ => bail!(
            "{url}: curl {} {text} {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_wrk_output() {
        let text = "Running 1s test @ https://bench.test:8443/1k
  2 threads and 16 connections
  Latency Distribution
     50%  410.00us
     75%  600.00us
     90%  800.00us
     99%    1.23ms
  12345 requests in 1.00s, 15.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
Requests/sec:  12345.67
Transfer/sec:     15.00MB
";
        let result = parse_wrk(text).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(result.requests, 12345);
        assert_eq!(result.errors, 3);
        assert!((result.p50_micros - 410.0).abs() < 1e-9);
        assert!((result.p99_micros - 1230.0).abs() < 1e-6);
        assert!((result.requests_per_second - 12345.67).abs() < 1e-9);
        assert!(parse_wrk("unable to connect").is_err());
    }

    #[test]
    fn checks_the_small_answer() {
        let good = [
            b"HTTP/1.1 200 OK\r\ncontent-length: 1024\r\n\r\n".as_slice(),
            &[b'x'; 1024],
        ]
        .concat();
        assert!(check_small_answer(&good).is_ok());
        assert!(check_small_answer(&good[..good.len() - 1]).is_err());
        assert!(check_small_answer(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").is_err());
    }
}
