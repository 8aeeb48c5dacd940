//! An experiment beside the floor: the same client side (hyper's HTTP/1.1 server, rustls, one
//! current-thread runtime per CPU) with the backend exchange written by hand instead of
//! hyper's HTTP/1.1 client — the request head serialised into the backend socket, the response
//! head parsed with httparse, the body streamed from the socket into the client's response by
//! a `Body` that gives the connection back when its last byte is out. No dispatcher task state,
//! no request/response channels, no body channel.
//!
//! It measures what the agent could gain by leaving hyper's client for its dedicated backend
//! connections (`tno-bench serve-proxy --raw-backend`, beside the floor). Only what the
//! benchmark's backend sends is handled: bodiless requests, responses with a Content-Length;
//! anything else is a 502. Not a product.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, HOST, HeaderName, HeaderValue};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::forwarding_headers::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO};

/// Bound of a response head.
const MAX_HEAD: usize = 64 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// The client connection's own backend connection and what was read beyond the last answer.
pub struct Backend {
    stream: TcpStream,
    buffer: BytesMut,
}

/// Where the backend connection waits between requests (taken while one is in flight).
pub type Slot = Arc<Mutex<Option<Backend>>>;

/// Gives the connection back for the client connection's next request.
fn put_back(slot: &Slot, backend: Backend) {
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(backend);
}

/// The answer's body: the bytes of the Content-Length, straight from the backend socket.
pub struct RawBody {
    backend: Option<Backend>,
    remaining: u64,
    slot: Slot,
}

impl Body for RawBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let Some(backend) = this.backend.as_mut() else {
            return Poll::Ready(None);
        };
        if backend.buffer.is_empty() {
            backend.buffer.reserve(READ_CHUNK);
            let read = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut backend.stream),
                cx,
                &mut backend.buffer
            ))?;
            if read == 0 {
                this.backend = None;
                return Poll::Ready(Some(Err(std::io::ErrorKind::UnexpectedEof.into())));
            }
        }
        let take = usize::try_from(this.remaining)
            .unwrap_or(usize::MAX)
            .min(backend.buffer.len());
        let data = backend.buffer.split_to(take).freeze();
        this.remaining -= take as u64;
        if this.remaining == 0 {
            // Done: the connection goes back before the client has even seen the last frame.
            if let Some(backend) = this.backend.take() {
                put_back(&this.slot, backend);
            }
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// The empty body of the proxy's own 502.
fn bad_gateway(slot: Slot) -> Response<RawBody> {
    let mut response = Response::new(RawBody {
        backend: None,
        remaining: 0,
        slot,
    });
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// Forwards `request` (bodiless) on the slot's connection (a new one if there is none) with
/// the headers nginx's configuration sets, and answers with the backend's head and body.
pub async fn forward(
    slot: Slot,
    backend_address: SocketAddr,
    client_ip: Option<HeaderValue>,
    request: Request<Incoming>,
) -> Result<Response<RawBody>, Infallible> {
    let taken = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    let backend = match taken {
        Some(backend) => Some(backend),
        None => TcpStream::connect(backend_address)
            .await
            .ok()
            .map(|stream| {
                let _ = stream.set_nodelay(true);
                Backend {
                    stream,
                    buffer: BytesMut::with_capacity(READ_CHUNK),
                }
            }),
    };
    let Some(mut backend) = backend else {
        return Ok(bad_gateway(slot));
    };
    match exchange(&mut backend, client_ip, &request).await {
        Some((head, remaining)) => {
            let body = RawBody {
                backend: Some(backend),
                remaining,
                slot: slot.clone(),
            };
            let mut response = Response::new(body);
            *response.status_mut() = head.status;
            *response.headers_mut() = head.headers;
            if remaining == 0 {
                // Nothing to stream: the connection can go back now.
                if let Some(backend) = response.body_mut().backend.take() {
                    put_back(&slot, backend);
                }
            }
            Ok(response)
        }
        None => Ok(bad_gateway(slot)),
    }
}

struct Head {
    status: StatusCode,
    headers: http::HeaderMap,
}

/// Writes the request head and reads the response head; `None` on anything unexpected.
async fn exchange(
    backend: &mut Backend,
    client_ip: Option<HeaderValue>,
    request: &Request<Incoming>,
) -> Option<(Head, u64)> {
    if !hyper::body::Body::is_end_stream(request.body()) {
        return None;
    }
    let mut head = Vec::with_capacity(512);
    let target = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    write!(head, "{} {target} HTTP/1.1\r\n", request.method()).ok()?;
    let host = request.headers().get(HOST);
    let https = HeaderValue::from_static("https");
    let forwarded = [
        (&X_FORWARDED_FOR, client_ip.as_ref()),
        (&X_FORWARDED_PROTO, Some(&https)),
        (&X_FORWARDED_HOST, host),
    ];
    let own = request
        .headers()
        .iter()
        .filter(|(name, _)| *name != CONNECTION);
    let added = forwarded
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)));
    for (name, value) in own.chain(added) {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    backend.stream.write_all(&head).await.ok()?;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&backend.buffer).ok()? {
            httparse::Status::Complete(length) => {
                let status = StatusCode::from_u16(parsed.code?).ok()?;
                let mut map = http::HeaderMap::with_capacity(parsed.headers.len());
                let mut content_length = None;
                for header in parsed.headers.iter() {
                    let name = HeaderName::from_bytes(header.name.as_bytes()).ok()?;
                    if name == http::header::CONTENT_LENGTH {
                        content_length = std::str::from_utf8(header.value).ok()?.parse().ok();
                    } else if name == http::header::TRANSFER_ENCODING || name == CONNECTION {
                        return None;
                    }
                    map.append(name, HeaderValue::from_bytes(header.value).ok()?);
                }
                let _ = backend.buffer.split_to(length);
                return Some((
                    Head {
                        status,
                        headers: map,
                    },
                    content_length?,
                ));
            }
            httparse::Status::Partial => {
                if backend.buffer.len() >= MAX_HEAD {
                    return None;
                }
                backend.buffer.reserve(READ_CHUNK);
                let read = std::future::poll_fn(|cx| {
                    tokio_util::io::poll_read_buf(
                        Pin::new(&mut backend.stream),
                        cx,
                        &mut backend.buffer,
                    )
                })
                .await
                .ok()?;
                if read == 0 {
                    return None;
                }
            }
        }
    }
}
