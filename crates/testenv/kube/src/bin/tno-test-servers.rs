//! Small servers and clients that test pods run (image `tno.local/tno-test-servers`).
//!
//! Servers: `tcp-echo`, `http-echo` (answers with the request line and headers), `https-echo`
//! (same over TLS with a given certificate), `ws-echo` (WebSocket echo), `slow` (HTTP answer
//! after a delay), `http-backend` (gzip, Range, streaming, WebSocket: see
//! `tno_testenv_kube::http_backend`).
//!
//! Clients (the exit code tells the result): `tcp-check` (sends a line, expects it echoed),
//! `tls-check` (verified TLS handshake with SNI against a given CA) and `tcp-bulk` (streams N
//! pseudo-random bytes through an echo server and checks they all come back unchanged).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use futures::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
#[command(about = "Test servers for the tno test environment")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Impersonates an agent's admin port (hostile-input tests): answers `GET /status` with
    /// `body` (a forged report), or with `huge_bytes` of an endless JSON string when set (no
    /// Content-Length, the connection closes at the end).
    ForgedStatus {
        #[arg(long, default_value = "0.0.0.0:9090")]
        listen: SocketAddr,
        #[arg(long, default_value = "")]
        body: String,
        #[arg(long)]
        huge_bytes: Option<u64>,
    },
    /// Echoes every byte back.
    TcpEcho {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
    },
    /// Answers every HTTP request with its request line and headers (text/plain).
    HttpEcho {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Written first in every answer, to tell servers apart.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// `http-echo` over TLS.
    HttpsEcho {
        #[arg(long, default_value = "0.0.0.0:8443")]
        listen: SocketAddr,
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        #[arg(long, default_value = "")]
        name: String,
    },
    /// The HTTP test backend of `tno_testenv_kube::http_backend` (gzip, Range, streamed
    /// download/upload, trailers, slow headers, WebSocket), over TLS if `cert` and `key` are
    /// given.
    HttpBackend {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        #[arg(long, requires = "key")]
        cert: Option<PathBuf>,
        #[arg(long, requires = "cert")]
        key: Option<PathBuf>,
    },
    /// WebSocket server echoing every message.
    WsEcho {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
    },
    /// HTTP server that waits before answering.
    Slow {
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 2000)]
        delay_ms: u64,
    },
    /// Connects to `target` (`host:port`, names resolved via /etc/resolv.conf), sends
    /// `message` and a newline, and exits 0 if the same line comes back.
    TcpCheck {
        #[arg(long)]
        target: String,
        #[arg(long, default_value = "ping")]
        message: String,
        /// Attempts, one second apart (DNS and Service rules may need a moment).
        #[arg(long, default_value_t = 30)]
        attempts: u32,
    },
    /// Connects to `target` (`host:port`, names resolved via /etc/resolv.conf), completes a
    /// TLS handshake with SNI `server_name`, verifying the server's certificate against
    /// `ca_pem` only (no system roots), reads until the server closes and exits 0 if the text
    /// read contains `expect`. Prints the verified certificate's size and what was read.
    TlsCheck {
        #[arg(long)]
        target: String,
        #[arg(long)]
        server_name: String,
        /// The CA certificate(s), PEM text (not a path: pods get no files from the test).
        #[arg(long, allow_hyphen_values = true)]
        ca_pem: String,
        #[arg(long)]
        expect: String,
        #[arg(long, default_value_t = 30)]
        attempts: u32,
        /// Written after the handshake (e.g. an HTTP request with `Connection: close`; `\r\n`
        /// and `\n` escapes are expanded); default: nothing (the server speaks first).
        #[arg(long, default_value = "")]
        send: String,
    },
    /// Connects to `target` (an echo server, `host:port`), writes `bytes` deterministic
    /// pseudo-random bytes (from `seed`) while reading the echo, and exits 0 only if exactly
    /// the same bytes came back. Prints one line:
    /// `bulk: ok bytes=N seconds=S mib_per_s=X identical=true`; the bytes are compared one
    /// by one against the regenerated stream.
    TcpBulk {
        #[arg(long)]
        target: String,
        #[arg(long)]
        bytes: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Connection attempts, one second apart (DNS and Service rules may need a moment).
        #[arg(long, default_value_t = 30)]
        attempts: u32,
        /// Upper bound for the transfer itself, after connecting.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::ForgedStatus {
            listen,
            body,
            huge_bytes,
        } => {
            let body = Arc::new(body);
            serve(listen, move |stream| {
                forged_status(stream, body.clone(), huge_bytes)
            })
            .await
        }
        Command::TcpEcho { listen } => {
            serve(listen, |stream| async move {
                let (mut reader, mut writer) = tokio::io::split(stream);
                tokio::io::copy(&mut reader, &mut writer).await?;
                Ok(())
            })
            .await
        }
        Command::HttpEcho { listen, name } => {
            let name = Arc::new(name);
            serve(listen, move |stream| {
                http_echo(stream, name.clone(), Duration::ZERO)
            })
            .await
        }
        Command::Slow { listen, delay_ms } => {
            let name = Arc::new(String::from("slow"));
            let delay = Duration::from_millis(delay_ms);
            serve(listen, move |stream| http_echo(stream, name.clone(), delay)).await
        }
        Command::HttpsEcho {
            listen,
            cert,
            key,
            name,
        } => {
            let acceptor = tls_acceptor(&cert, &key)?;
            let name = Arc::new(name);
            serve(listen, move |stream| {
                let acceptor = acceptor.clone();
                let name = name.clone();
                async move {
                    let tls = acceptor.accept(stream).await?;
                    http_echo(tls, name, Duration::ZERO).await
                }
            })
            .await
        }
        Command::HttpBackend { listen, cert, key } => {
            let tls = match (cert, key) {
                (Some(cert), Some(key)) => Some(server_config(&cert, &key)?),
                _ => None,
            };
            let bound = tno_testenv_kube::http_backend::spawn(listen, tls)
                .await
                .with_context(|| format!("binding {listen}"))?;
            println!("http-backend listening on {bound}");
            std::future::pending::<()>().await;
            Ok(())
        }
        Command::WsEcho { listen } => {
            serve(listen, |stream| async move {
                let mut socket = tokio_tungstenite::accept_async(stream).await?;
                while let Some(message) = socket.next().await {
                    let message = message?;
                    if message.is_text() || message.is_binary() {
                        socket.send(message).await?;
                    }
                }
                Ok(())
            })
            .await
        }
        Command::TcpCheck {
            target,
            message,
            attempts,
        } => tcp_check(&target, &message, attempts).await,
        Command::TlsCheck {
            target,
            server_name,
            ca_pem,
            expect,
            attempts,
            send,
        } => {
            let send = send.replace("\\r", "\r").replace("\\n", "\n");
            tls_check(&target, &server_name, &ca_pem, &expect, attempts, &send).await
        }
        Command::TcpBulk {
            target,
            bytes,
            seed,
            attempts,
            timeout_secs,
        } => tcp_bulk(&target, bytes, seed, attempts, timeout_secs).await,
    }
}

/// Accepts forever, one task per connection; connection errors are logged, not fatal.
async fn serve<F, Fut>(listen: SocketAddr, handler: F) -> anyhow::Result<()>
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept().await?;
        let connection = handler(stream);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("connection from {peer}: {error:#}");
            }
        });
    }
}

/// Reads HTTP/1.1 requests (keep-alive) and answers each with its own head.
async fn http_echo<S>(stream: S, name: Arc<String>, delay: Duration) -> anyhow::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            if reader.read_until(b'\n', &mut line).await? == 0 {
                return Ok(());
            }
            let blank = line == b"\r\n" || line == b"\n";
            head.extend_from_slice(&line);
            if blank {
                break;
            }
            if head.len() > 64 * 1024 {
                bail!("request head too large");
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut headers);
        request.parse(&head).context("parsing the request head")?;
        let mut body_length = 0usize;
        let mut text = String::new();
        if !name.is_empty() {
            text.push_str(&format!("server: {name}\n"));
        }
        text.push_str(&format!(
            "{} {}\n",
            request.method.unwrap_or("?"),
            request.path.unwrap_or("?")
        ));
        for header in request.headers.iter() {
            let value = String::from_utf8_lossy(header.value);
            if header.name.eq_ignore_ascii_case("content-length") {
                body_length = value.trim().parse().unwrap_or(0);
            }
            text.push_str(&format!("{}: {value}\n", header.name.to_ascii_lowercase()));
        }
        // Drain the body so the next request on the connection parses.
        let mut body = vec![0u8; body_length.min(1 << 20)];
        reader.read_exact(&mut body).await?;
        tokio::time::sleep(delay).await;
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        reader.get_mut().write_all(response.as_bytes()).await?;
        reader.get_mut().flush().await?;
    }
}

fn tls_acceptor(cert: &PathBuf, key: &PathBuf) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    Ok(tokio_rustls::TlsAcceptor::from(server_config(cert, key)?))
}

fn server_config(cert: &PathBuf, key: &PathBuf) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("opening {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .context("reading the certificate chain")?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    Ok(Arc::new(config))
}

async fn tcp_check(target: &str, message: &str, attempts: u32) -> anyhow::Result<()> {
    let mut last_error = anyhow::anyhow!("no attempt made");
    for attempt in 1..=attempts.max(1) {
        match tcp_round_trip(target, message).await {
            Ok(()) => {
                println!("ok: {target} echoed {message:?} (attempt {attempt})");
                return Ok(());
            }
            Err(error) => {
                eprintln!("attempt {attempt}: {error:#}");
                last_error = error;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last_error.context(format!("{target} did not echo")))
}

async fn tls_check(
    target: &str,
    server_name: &str,
    ca_pem: &str,
    expect: &str,
    attempts: u32,
    send: &str,
) -> anyhow::Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.context("parsing --ca-pem")?)?;
    }
    if roots.is_empty() {
        bail!("--ca-pem holds no certificate");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name =
        rustls::pki_types::ServerName::try_from(server_name.to_owned()).context("--server-name")?;
    let mut last_error = anyhow::anyhow!("no attempt made");
    for attempt in 1..=attempts.max(1) {
        let exchange = async {
            let stream = TcpStream::connect(target)
                .await
                .with_context(|| format!("connecting to {target}"))?;
            let mut tls = connector
                .connect(name.clone(), stream)
                .await
                .context("TLS handshake")?;
            let chain_len = tls
                .get_ref()
                .1
                .peer_certificates()
                .map_or(0, |chain| chain.len());
            if !send.is_empty() {
                tls.write_all(send.as_bytes()).await.context("sending")?;
                tls.flush().await.context("sending")?;
            }
            let mut text = String::new();
            // Servers that close without close_notify end with an error after the data.
            let _ = tls.read_to_string(&mut text).await;
            anyhow::Ok((chain_len, text))
        };
        match tokio::time::timeout(Duration::from_secs(5), exchange).await {
            Ok(Ok((chain_len, text))) if text.contains(expect) => {
                println!(
                    "ok: TLS to {target} as {server_name} verified ({chain_len} certificates), read {text:?} (attempt {attempt})"
                );
                return Ok(());
            }
            Ok(Ok((_, text))) => last_error = anyhow::anyhow!("read {text:?}, expected {expect:?}"),
            Ok(Err(error)) => last_error = error,
            Err(_) => last_error = anyhow::anyhow!("timed out"),
        }
        eprintln!("attempt {attempt}: {last_error:#}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last_error.context(format!(
        "no verified TLS session with {target} as {server_name}"
    )))
}

async fn tcp_round_trip(target: &str, message: &str) -> anyhow::Result<()> {
    let mut stream = tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(target))
        .await
        .context("connect timed out")?
        .with_context(|| format!("connecting to {target}"))?;
    stream.write_all(format!("{message}\n").as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(3), reader.read_line(&mut line))
        .await
        .context("read timed out")??;
    if line.trim_end() == message {
        Ok(())
    } else {
        bail!("expected {message:?}, got {line:?}")
    }
}

/// The `len` bytes of the stream for `seed`: word `i` (8 bytes, little endian) is splitmix64
/// of `seed` and `i`. Test code elsewhere regenerates it the same way.
fn bulk_payload(seed: u64, len: usize) -> Vec<u8> {
    let mut payload = Vec::with_capacity(len.div_ceil(8) * 8);
    for index in 0..len.div_ceil(8) as u64 {
        payload.extend_from_slice(
            &splitmix64(seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes(),
        );
    }
    payload.truncate(len);
    payload
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload is generated before and compared after the timed transfer, so the figure is
/// the connection's, not the (unoptimised) generator's.
async fn tcp_bulk(
    target: &str,
    bytes: u64,
    seed: u64,
    attempts: u32,
    timeout_secs: u64,
) -> anyhow::Result<()> {
    let len = usize::try_from(bytes).context("--bytes does not fit in memory")?;
    let payload = bulk_payload(seed, len);
    let mut connected = None;
    let mut last_error = anyhow::anyhow!("no attempt made");
    for attempt in 1..=attempts.max(1) {
        match tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                connected = Some(stream);
                break;
            }
            Ok(Err(error)) => last_error = anyhow::Error::from(error),
            Err(_) => last_error = anyhow::anyhow!("connect timed out"),
        }
        eprintln!("attempt {attempt}: {last_error:#}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let Some(stream) = connected else {
        return Err(last_error.context(format!("bulk: connecting to {target}")));
    };
    let started = std::time::Instant::now();
    let (mut reader, mut writer) = stream.into_split();
    let send = async {
        for (index, chunk) in payload.chunks(64 * 1024).enumerate() {
            writer
                .write_all(chunk)
                .await
                .with_context(|| format!("writing chunk {index}"))?;
        }
        writer.flush().await?;
        // The write half stays open until the echo is read: a proxy may close both ways on a
        // half-close.
        anyhow::Ok(())
    };
    let receive = async {
        let mut received = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            let read = reader
                .read(&mut received[filled..])
                .await
                .with_context(|| format!("reading at offset {filled}"))?;
            if read == 0 {
                bail!("connection closed after {filled} of {len} bytes came back");
            }
            filled += read;
        }
        anyhow::Ok(received)
    };
    let transfer = async { tokio::try_join!(send, receive) };
    let ((), received) = tokio::time::timeout(Duration::from_secs(timeout_secs), transfer)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "bulk: transfer of {bytes} bytes to {target} did not finish within {timeout_secs}s"
            )
        })?
        .with_context(|| format!("bulk: transfer of {bytes} bytes to {target} failed"))?;
    let seconds = started.elapsed().as_secs_f64();
    if received != payload {
        let index = received
            .iter()
            .zip(&payload)
            .position(|(got, sent)| got != sent)
            .unwrap_or(0);
        bail!(
            "bulk: the echo differs from what was sent, first at byte {index} (sent {:#04x}, got {:#04x})",
            payload[index],
            received[index]
        );
    }
    let mib_per_s = bytes as f64 / (1024.0 * 1024.0) / seconds.max(1e-9);
    println!("bulk: ok bytes={bytes} seconds={seconds:.3} mib_per_s={mib_per_s:.1} identical=true");
    Ok(())
}

/// One forged `/status` answer (see `Command::ForgedStatus`).
async fn forged_status(
    mut stream: TcpStream,
    body: Arc<String>,
    huge_bytes: Option<u64>,
) -> anyhow::Result<()> {
    let mut request = [0u8; 4096];
    let _ = stream.read(&mut request).await?;
    match huge_bytes {
        None => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Some(total) => {
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"ready\":true,\"reasons\":[\"")
                .await?;
            let chunk = vec![b'a'; 64 * 1024];
            let mut sent = 0u64;
            while sent < total {
                stream.write_all(&chunk).await?;
                sent += chunk.len() as u64;
            }
        }
    }
    stream.shutdown().await?;
    Ok(())
}
