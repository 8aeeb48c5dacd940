//! An HTTP test backend (hyper, HTTP/1.1, plain or TLS) with the endpoints that ingress tests
//! need: `/echo-headers` (request headers as JSON), `/gzip` (a real gzip member served with
//! `Content-Encoding: gzip`), `/gzip-large?bytes=N` (N pattern bytes as stored-block gzip), `/blob` (1 MiB, honours `Range: bytes=a-b`), `/download?bytes=N`
//! (streamed pattern), `/upload` (answers `<length> <sha256>` of the body it streamed),
//! `/trailers`, `/slow-head` (headers after 3 s), `/ws` (WebSocket echo), `/whoami`.
//! Run in pods as `tno-test-servers http-backend`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub const CHUNK: usize = 64 * 1024;

/// Deterministic, non-repeating-looking content: byte `i` of the stream.
pub fn pattern_chunk(index: u64, len: usize) -> Vec<u8> {
    let start = index * CHUNK as u64;
    (0..len as u64)
        .map(|i| {
            let at = start + i;
            (at.wrapping_mul(31) ^ (at >> 13)) as u8
        })
        .collect()
}

pub fn pattern_sha256(total: u64) -> String {
    let mut hasher = Sha256::new();
    let mut index = 0;
    let mut left = total;
    while left > 0 {
        let len = left.min(CHUNK as u64) as usize;
        hasher.update(pattern_chunk(index, len));
        left -= len as u64;
        index += 1;
    }
    // A streamed digest: its own lowercase-hex formatting (whole buffers use
    // `tailnet_api::digest::sha256_hex`).
    format!("{:x}", hasher.finalize())
}

/// A real gzip member (so "no decompression" is tested on real gzip, not random bytes).
pub fn gzip_body() -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for line in 0..2000 {
        let _ = writeln!(
            encoder,
            "line {line}: the quick brown fox jumps over the lazy dog"
        );
    }
    encoder.finish().unwrap_or_default()
}

/// `len` bytes of the pattern stream as one real gzip member of stored (uncompressed) blocks:
/// large objects are cheap to make, and a proxy that decoded or re-encoded them would change
/// the bytes. Deterministic, so a client can compute the expected hash itself.
pub fn gzip_of_pattern(len: u64) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(len as usize + len as usize / 8192 + 64),
        flate2::Compression::none(),
    );
    let mut index = 0;
    let mut left = len;
    while left > 0 {
        let chunk = left.min(CHUNK as u64) as usize;
        if encoder.write_all(&pattern_chunk(index, chunk)).is_err() {
            break;
        }
        left -= chunk as u64;
        index += 1;
    }
    encoder.finish().unwrap_or_default()
}

/// 1 MiB blob for Range requests.
pub fn blob() -> Vec<u8> {
    pattern_chunk(7, 1024 * 1024)
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response
}

fn streamed(total: u64) -> Body {
    let chunks = futures_util::stream::unfold((0u64, total), |(index, left)| async move {
        if left == 0 {
            return None;
        }
        let len = left.min(CHUNK as u64) as usize;
        let frame = Frame::data(Bytes::from(pattern_chunk(index, len)));
        Some((Ok::<_, Infallible>(frame), (index + 1, left - len as u64)))
    });
    StreamBody::new(chunks).boxed_unsync()
}

async fn handle(mut request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_owned();
    let response = match path.as_str() {
        "/echo-headers" => echo_headers(&request),
        "/gzip" => {
            let mut response = full(StatusCode::OK, gzip_body());
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            headers.insert(header::ETAG, HeaderValue::from_static("\"gz-1\""));
            response
        }
        "/gzip-large" => {
            let len = request
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("bytes="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let mut response = full(StatusCode::OK, gzip_of_pattern(len));
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(header::ETAG, HeaderValue::from_static("\"gz-large\""));
            response
        }
        "/blob" => blob_range(&request),
        "/download" => {
            let total = request
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("bytes="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            Response::new(streamed(total))
        }
        "/upload" => upload_digest(request).await,
        "/trailers" => {
            let frames = futures_util::stream::iter([
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"body before trailers"))),
                Ok(Frame::trailers({
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("x-checksum", HeaderValue::from_static("abc123"));
                    trailers
                })),
            ]);
            let mut response = Response::new(StreamBody::new(frames).boxed_unsync());
            response
                .headers_mut()
                .insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
            response
        }
        "/slow-head" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            full(StatusCode::OK, "finally")
        }
        "/ws" => websocket_echo(&mut request),
        "/whoami" => full(StatusCode::OK, "admin-backend"),
        _ => full(StatusCode::NOT_FOUND, "no such test endpoint"),
    };
    Ok(response)
}

/// The request's headers and version as JSON.
fn echo_headers(request: &Request<Incoming>) -> Response<Body> {
    let mut headers = serde_json::Map::new();
    for (name, value) in request.headers() {
        headers.insert(
            name.as_str().to_owned(),
            serde_json::Value::String(value.to_str().unwrap_or("<binary>").to_owned()),
        );
    }
    let json = serde_json::json!({
        "version": format!("{:?}", request.version()),
        "headers": headers,
    });
    full(StatusCode::OK, json.to_string())
}

/// The 1 MiB blob, or the `Range: bytes=a-b` part of it.
fn blob_range(request: &Request<Incoming>) -> Response<Body> {
    let blob = blob();
    let range = request
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    match range {
        Some((start, end)) if start <= end && end < blob.len() => {
            let mut response = full(StatusCode::PARTIAL_CONTENT, blob[start..=end].to_vec());
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{end}/{}", blob.len()))
            {
                response.headers_mut().insert(header::CONTENT_RANGE, value);
            }
            response
        }
        _ => full(StatusCode::OK, blob),
    }
}

/// `<length> <sha256>` of the streamed request body.
async fn upload_digest(request: Request<Incoming>) -> Response<Body> {
    let mut hasher = Sha256::new();
    let mut length = 0u64;
    let mut body = request.into_body();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    hasher.update(data);
                    length += data.len() as u64;
                }
            }
            Err(error) => {
                return full(StatusCode::BAD_REQUEST, format!("upload broke: {error}"));
            }
        }
    }
    full(StatusCode::OK, format!("{length} {:x}", hasher.finalize()))
}

/// A WebSocket upgrade whose messages are echoed.
fn websocket_echo(request: &mut Request<Incoming>) -> Response<Body> {
    let key = request
        .headers()
        .get("sec-websocket-key")
        .map(|key| derive_accept_key(key.as_bytes()));
    let Some(accept) = key else {
        return full(StatusCode::BAD_REQUEST, "not a websocket request");
    };
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut socket =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(Ok(message)) = socket.next().await {
            if message.is_close() {
                break;
            }
            if socket.send(message).await.is_err() {
                break;
            }
        }
    });
    let mut response = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        headers.insert("sec-websocket-accept", accept);
    }
    response
}

/// Binds `address` and serves the test endpoints (HTTP/1.1, plain or TLS) on a task.
pub async fn spawn(
    address: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(handle);
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .with_upgrades()
                            .await;
                    }
                    Some(config) => {
                        let Ok(stream) =
                            tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                        else {
                            return;
                        };
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .with_upgrades()
                            .await;
                    }
                }
            });
        }
    });
    Ok(bound)
}
