//! The floor of the agent's HTTP stack: a reverse proxy built from the same libraries (tokio,
//! hyper's HTTP/1.1 server and client connections, rustls with ring) in the same connection
//! model (one single-threaded runtime per CPU, each accepted connection moved to one of them,
//! one backend connection per client connection polled by the client connection's task) and
//! nothing else: no routing, no rules, no identity, no metrics, no limits, no timeouts.
//!
//! Measured beside the agent and nginx (`tno-bench run --hyper-floor`), it separates what the
//! agent's own code costs from what the stack costs: the agent cannot be faster than this
//! without leaving the stack. Not a product: it is only ever started by the benchmark.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::header::{CONNECTION, HOST, HeaderValue};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::forwarding_headers::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};

/// The backend's body, or none for the proxy's own 502.
type Answer = Either<Incoming, Empty<Bytes>>;

/// Serves HTTPS on 127.0.0.1:`port` with `cert`/`key` (PEM), forwarding every request to the
/// HTTP/1.1 backend on 127.0.0.1:`backend_port`. Runs until killed.
///
/// `raw_backend`: the backend exchange without hyper's client ([`crate::raw_backend`]).
pub fn serve(
    port: u16,
    backend_port: u16,
    cert: &Path,
    key: &Path,
    raw_backend: bool,
) -> Result<()> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let backend = SocketAddr::from((Ipv4Addr::LOCALHOST, backend_port));

    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut handles = Vec::with_capacity(threads);
    for index in 0..threads {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        std::thread::Builder::new()
            .name(format!("floor-{index}"))
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    }
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
    // Round robin over the connection threads (accepting is this one thread's job).
    let mut next = 0usize;
    loop {
        let (stream, peer) = listener.accept()?;
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let Some(handle) = handles.get(next % handles.len()) else {
            bail!("no connection thread");
        };
        next = next.wrapping_add(1);
        let acceptor = acceptor.clone();
        spawn_connection(handle, stream, peer, acceptor, backend, raw_backend);
    }
}

fn spawn_connection(
    handle: &Handle,
    stream: std::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    backend: SocketAddr,
    raw_backend: bool,
) {
    handle.spawn(async move {
        let Ok(tcp) = TcpStream::from_std(stream) else {
            return;
        };
        let Ok(tls) = acceptor.accept(tcp).await else {
            return;
        };
        let client_ip = HeaderValue::from_str(&peer.ip().to_string()).ok();
        if raw_backend {
            serve_with_raw_backend(tls, client_ip, backend).await;
        } else {
            serve_with_hyper_client(tls, client_ip, backend).await;
        }
    });
}

/// The client connection with its own backend connection through hyper's HTTP/1.1 client.
async fn serve_with_hyper_client(
    tls: TlsStream<TcpStream>,
    client_ip: Option<HeaderValue>,
    backend: SocketAddr,
) {
    let Ok(upstream) = TcpStream::connect(backend).await else {
        return;
    };
    let _ = upstream.set_nodelay(true);
    let Ok((sender, upstream)) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)).await
    else {
        return;
    };
    let sender = Arc::new(Mutex::new(Some(sender)));
    let service = service_fn(move |request| forward(sender.clone(), client_ip.clone(), request));
    let downstream =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service);
    // Both connections in this task: a request and its answer cross no task or thread.
    // The client connection decides when it ends (its last answer may still be writing
    // when the backend connection is done).
    tokio::pin!(downstream);
    tokio::select! {
        _ = downstream.as_mut() => {}
        _ = upstream => { let _ = downstream.await; }
    }
}

/// The client connection with the backend exchange written by hand
/// ([`crate::raw_backend`]): the backend connection is opened by the first request and waits
/// in a slot between requests.
async fn serve_with_raw_backend(
    tls: TlsStream<TcpStream>,
    client_ip: Option<HeaderValue>,
    backend: SocketAddr,
) {
    let slot = crate::raw_backend::Slot::default();
    let service = service_fn(move |request| {
        crate::raw_backend::forward(slot.clone(), backend, client_ip.clone(), request)
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), service)
        .await;
}

/// The request to the backend with the headers nginx's configuration sets (Host and
/// X-Forwarded-*), the backend's response streamed back as it comes.
async fn forward(
    sender: Arc<Mutex<Option<SendRequest<Incoming>>>>,
    client_ip: Option<HeaderValue>,
    request: Request<Incoming>,
) -> Result<Response<Answer>, Infallible> {
    let taken = sender.lock().unwrap_or_else(PoisonError::into_inner).take();
    let Some(mut upstream) = taken else {
        return Ok(bad_gateway());
    };
    let (mut parts, body) = request.into_parts();
    if let Some(path) = parts.uri.path_and_query().cloned() {
        parts.uri = path.into();
    }
    // Hop-by-hop, like nginx's `proxy_set_header Connection ""`: the backend connection
    // stays open whatever the client asked of its own.
    parts.headers.remove(CONNECTION);
    let host = parts.headers.get(HOST).cloned();
    if let Some(ip) = client_ip {
        parts.headers.insert(X_FORWARDED_FOR, ip);
    }
    parts
        .headers
        .insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    if let Some(host) = host {
        parts.headers.insert(X_FORWARDED_HOST, host);
    }
    let answer = upstream
        .send_request(Request::from_parts(parts, body))
        .await;
    *sender.lock().unwrap_or_else(PoisonError::into_inner) = Some(upstream);
    Ok(answer.map_or_else(|_| bad_gateway(), |answer| answer.map(Either::Left)))
}

fn bad_gateway() -> Response<Answer> {
    let mut response = Response::new(Either::Right(Empty::new()));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
