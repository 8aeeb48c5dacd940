//! One backend connection per HTTP/1.1 client connection, spoken to directly.
//!
//! An HTTP/1.1 client connection sends one request at a time, so it can keep one backend
//! connection of its own, and the exchange on it needs no client machinery: the request's own
//! future writes the request head into the socket and parses the response head from it
//! ([`framing`]), and the response body reads itself from the socket as hyper's server polls
//! it ([`DedicatedBody`]), handing the connection back when its last byte is out. No
//! dispatcher task, no channels, no pool checkout: a request and its answer cross no task or
//! thread. (hyper's client on such a connection cost 4–11 % of the req/s:
//! docs/benchmarks-history.md#ingress-the-floor-without-hypers-client-2026-12-07.)
//!
//! Which requests: from a client connection's second request on, those without a body that
//! are not an upgrade. A connection's first request goes through the route's pooled client
//! (a client that sends one request and closes then reuses a pooled backend connection
//! instead of opening one of its own), and so do requests with a body (their streaming,
//! deadlines and `100-continue` stay with hyper's client) and WebSocket upgrades.
//!
//! Bounded: one idle backend connection per client connection, which ends with it; a request
//! in flight owns the connection, so a request dropped half-way (timeout, client gone) drops
//! it too. What a backend can send is bounded by [`framing`]'s limits.

pub mod framing;

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Method, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio_util::io::poll_read_buf;

use crate::backend::{BackendConnector, BackendStream};
use crate::body::BoxError;
use framing::{
    BodyDecoder, Decoded, FieldSpans, FramingError, MAX_INTERIM_RESPONSES, Parsed, ResponseHead,
};

/// What one read asks the socket for at most; also what an idle connection keeps.
const READ_CHUNK: usize = 16 * 1024;
/// A request head's usual size: the write buffer starts with this much.
const HEAD_CAPACITY: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("writing the request to the backend")]
    Write(#[source] io::Error),
    #[error("the backend closed the connection without answering")]
    ClosedBeforeAnswer,
    #[error("the backend's connection failed before it answered")]
    ResetBeforeAnswer(#[source] io::Error),
    #[error("the backend closed the connection in the middle of the response head")]
    ClosedInHead,
    #[error("reading the backend's response")]
    Read(#[source] io::Error),
    #[error(transparent)]
    Framing(#[from] FramingError),
}

impl ExchangeError {
    /// Nothing came back: on a connection that was idle before, the backend may have closed
    /// it just then (its keep-alive timeout), so an idempotent request can go to a new one.
    fn nothing_received(&self) -> bool {
        matches!(
            self,
            ExchangeError::Write(_)
                | ExchangeError::ClosedBeforeAnswer
                | ExchangeError::ResetBeforeAnswer(_)
        )
    }
}

/// A backend connection and its buffers.
struct Connection {
    stream: BackendStream,
    /// Read from the socket and not handed out yet.
    read: BytesMut,
    /// The request head being written; kept for the next one.
    write: Vec<u8>,
    /// Scratch space of the response head parser; kept for the next one.
    spans: FieldSpans,
}

/// The idle backend connection and the route (by its shared name) it belongs to.
#[derive(Default)]
struct Idle {
    route: Option<Arc<str>>,
    connection: Option<Connection>,
}

/// Where a body puts its connection back.
struct Home {
    idle: Arc<Mutex<Idle>>,
    route: Arc<str>,
}

impl Home {
    fn put_back(&self, connection: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if !idle
            .route
            .as_ref()
            .is_some_and(|name| Arc::ptr_eq(name, &self.route))
        {
            idle.route = Some(self.route.clone());
        }
        idle.connection = Some(connection);
    }
}

/// The per-client-connection handle the requests use.
pub struct DedicatedBackend {
    idle: Arc<Mutex<Idle>>,
    /// A request came before (the first one goes through the pool).
    seen_request: AtomicBool,
}

impl Default for DedicatedBackend {
    fn default() -> Self {
        DedicatedBackend {
            idle: Arc::new(Mutex::new(Idle::default())),
            seen_request: AtomicBool::new(false),
        }
    }
}

impl DedicatedBackend {
    /// False for the connection's first request (pooled), true from the second on.
    pub fn claim(&self) -> bool {
        self.seen_request.swap(true, Ordering::Relaxed)
    }

    /// The idle connection if it belongs to `route` and still looks open; another route's
    /// or a closed one is dropped.
    fn take(&self, route: &Arc<str>) -> Option<Connection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let mut connection = idle.connection.take()?;
        let same_route = idle
            .route
            .as_ref()
            .is_some_and(|name| Arc::ptr_eq(name, route));
        drop(idle);
        (same_route && connection.still_open()).then_some(connection)
    }

    /// Sends the bodiless request `head` (origin-form URI, Host set) on this client
    /// connection's backend connection for `route`, opening one if there is none, and answers
    /// with the response head and a body that streams from the connection. The request's
    /// header map becomes the response's (hyper's server then reuses it for the client's next
    /// request: a map with room for a request's fields, no allocation on either side).
    pub async fn send(
        &self,
        route: &Arc<str>,
        connector: &BackendConnector,
        mut head: Parts,
    ) -> Result<Response<DedicatedBody>, BoxError> {
        if let Some(mut connection) = self.take(route) {
            match connection.exchange(&mut head).await {
                Ok(answer) => return Ok(self.respond(route, connection, answer, head.headers)),
                Err(error) if error.nothing_received() && head.method.is_idempotent() => {
                    tracing::debug!(%error, "idle backend connection was closed; retrying on a new one");
                }
                Err(error) => return Err(error.into()),
            }
        }
        // Boxed: connecting (TCP, TLS) is a large future that only a connection's first
        // dedicated request needs; inline, every request's future would carry its size.
        Box::pin(async {
            let mut connection = Connection::new(connector.connect().await?);
            let answer = connection.exchange(&mut head).await?;
            Ok(self.respond(route, connection, answer, head.headers))
        })
        .await
    }

    fn respond(
        &self,
        route: &Arc<str>,
        connection: Connection,
        answer: ResponseHead,
        headers: HeaderMap,
    ) -> Response<DedicatedBody> {
        let ResponseHead {
            status,
            framing,
            reusable,
        } = answer;
        let mut body = DedicatedBody {
            connection: Some(connection),
            decoder: BodyDecoder::new(framing),
            reusable,
            home: Home {
                idle: self.idle.clone(),
                route: route.clone(),
            },
        };
        if body.decoder.is_done() {
            body.finish();
        }
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }
}

impl Connection {
    fn new(stream: BackendStream) -> Self {
        Connection {
            stream,
            read: BytesMut::with_capacity(READ_CHUNK),
            write: Vec::with_capacity(HEAD_CAPACITY),
            spans: FieldSpans::default(),
        }
    }

    /// An idle connection has nothing to read: a close (or anything else) arrived while it
    /// waited means it cannot carry a request.
    fn still_open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        poll_read_buf(Pin::new(&mut self.stream), &mut cx, &mut self.read).is_pending()
    }

    /// Writes the request head and reads the final response head (interim ones skipped),
    /// whose fields replace the request's in `head.headers` once it is complete.
    async fn exchange(&mut self, head: &mut Parts) -> Result<ResponseHead, ExchangeError> {
        write_request_head(&mut self.write, head);
        self.stream
            .write_all(&self.write)
            .await
            .map_err(ExchangeError::Write)?;
        self.stream.flush().await.map_err(ExchangeError::Write)?;
        let head_request = head.method == Method::HEAD;
        let mut received = false;
        let mut interim = 0;
        loop {
            if !self.read.is_empty() {
                match framing::parse_head(
                    &mut self.read,
                    head_request,
                    &mut head.headers,
                    &mut self.spans,
                )? {
                    Parsed::Final(answer) => return Ok(answer),
                    Parsed::Interim => {
                        interim += 1;
                        if interim > MAX_INTERIM_RESPONSES {
                            return Err(FramingError::TooManyInterimResponses.into());
                        }
                        continue;
                    }
                    Parsed::Partial => {}
                }
            }
            self.read.reserve(READ_CHUNK);
            let read = std::future::poll_fn(|cx| {
                poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.read)
            })
            .await;
            match read {
                Ok(0) if received => return Err(ExchangeError::ClosedInHead),
                Ok(0) => return Err(ExchangeError::ClosedBeforeAnswer),
                Ok(_) => received = true,
                Err(error) if received => return Err(ExchangeError::Read(error)),
                Err(error) => return Err(ExchangeError::ResetBeforeAnswer(error)),
            }
        }
    }
}

/// The request line and header fields of a bodiless request. The head was parsed by hyper
/// and edited through `http`'s types, which admit no CR or LF in a name, value or target.
/// A body's framing is the agent's to state: the client's Transfer-Encoding (hop-by-hop,
/// removed before) and Content-Length are not copied, and `content-length: 0` is sent where
/// the client sent a length or the method expects a body.
fn write_request_head(buffer: &mut Vec<u8>, head: &Parts) {
    buffer.clear();
    buffer.extend_from_slice(head.method.as_str().as_bytes());
    buffer.push(b' ');
    let target = head
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    buffer.extend_from_slice(target.as_bytes());
    buffer.extend_from_slice(b" HTTP/1.1\r\n");
    let mut had_length = false;
    for (name, value) in &head.headers {
        if name == header::CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        if name == header::TRANSFER_ENCODING {
            continue;
        }
        write_field(buffer, name.as_str(), value);
    }
    if had_length || matches!(head.method, Method::POST | Method::PUT | Method::PATCH) {
        buffer.extend_from_slice(b"content-length: 0\r\n");
    }
    buffer.extend_from_slice(b"\r\n");
}

fn write_field(buffer: &mut Vec<u8>, name: &str, value: &HeaderValue) {
    buffer.extend_from_slice(name.as_bytes());
    buffer.extend_from_slice(b": ");
    buffer.extend_from_slice(value.as_bytes());
    buffer.extend_from_slice(b"\r\n");
}

/// A response body read from the dedicated connection as it is polled; the connection goes
/// back to its client connection when the body is complete and the connection reusable.
pub struct DedicatedBody {
    connection: Option<Connection>,
    decoder: BodyDecoder,
    reusable: bool,
    home: Home,
}

impl DedicatedBody {
    /// The body is complete: the connection goes back unless the answer said close or the
    /// backend sent more than it framed.
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take()
            && self.reusable
            && connection.read.is_empty()
        {
            self.home.put_back(connection);
        }
    }

    fn fail(&mut self, error: ExchangeError) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        self.connection = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for DedicatedBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        loop {
            let Some(connection) = this.connection.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut connection.read) {
                Ok(Decoded::Data(data)) => {
                    // The last bytes: the connection goes back before the client has them.
                    if this.decoder.is_done() {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Decoded::Trailers(trailers)) => {
                    this.finish();
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                Ok(Decoded::End) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Decoded::NeedMore) => {}
                Err(error) => return this.fail(error.into()),
            }
            connection.read.reserve(READ_CHUNK);
            match ready!(poll_read_buf(
                Pin::new(&mut connection.stream),
                cx,
                &mut connection.read
            )) {
                Ok(0) => match this.decoder.at_eof() {
                    Ok(_) => {
                        // A close-delimited body: complete, and the connection with it.
                        this.connection = None;
                        return Poll::Ready(None);
                    }
                    Err(error) => return this.fail(error.into()),
                },
                Ok(_) => {}
                Err(error) => return this.fail(ExchangeError::Read(error)),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_of(request: http::Request<()>) -> String {
        let (parts, ()) = request.into_parts();
        let mut buffer = Vec::new();
        write_request_head(&mut buffer, &parts);
        String::from_utf8(buffer).expect("ascii")
    }

    #[test]
    fn the_request_head_is_written_in_origin_form_with_every_field() {
        let request = http::Request::get("/a/b?c=d")
            .header("host", "app.example")
            .header("x-multi", "1")
            .header("x-multi", "2")
            .body(())
            .expect("request");
        assert_eq!(
            head_of(request),
            "GET /a/b?c=d HTTP/1.1\r\nhost: app.example\r\nx-multi: 1\r\nx-multi: 2\r\n\r\n"
        );
    }

    #[test]
    fn a_bodiless_request_states_its_own_framing() {
        let with_length = http::Request::get("/")
            .header("content-length", "0")
            .header("transfer-encoding", "chunked")
            .body(())
            .expect("request");
        assert_eq!(
            head_of(with_length),
            "GET / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        );
        let post = http::Request::post("/form").body(()).expect("request");
        assert_eq!(
            head_of(post),
            "POST /form HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        );
        let delete = http::Request::delete("/x").body(()).expect("request");
        assert_eq!(head_of(delete), "DELETE /x HTTP/1.1\r\n\r\n");
    }
}
