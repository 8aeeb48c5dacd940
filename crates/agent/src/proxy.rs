//! `http` ingress: TLS termination, virtual hosts by SNI/Host, and a streaming HTTP/1.1 +
//! HTTP/2 reverse proxy to the routes' backends.
//!
//! Bodies pass through frame by frame in both directions (no buffering, no decompression,
//! no re-encoding; Content-Length, Content-Encoding, Range answers and trailers untouched).
//! A route's request timeout bounds the whole exchange including the upload and download; its
//! backend request timeout the wait for the backend's response head (both in milliseconds
//! when the config has them, else in seconds). A WebSocket upgrade is tunnelled and then
//! lives by its own lifecycle.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::backend::connect_failure;
use crate::dedicated::{DedicatedBackend, DedicatedBody};
use crate::dial::error_chain;
use crate::drain::DrainWatch;
use crate::header_timeout::{HeadTimer, HeadWaits, HeadWatch};
use crate::headers::{
    ForwardedHeaders, PeerIdentity, has_conflicting_host, is_websocket_upgrade, remove_hop_by_hop,
    strip_client_identity,
};
use crate::http_rules::{
    self, CompiledRule, RedirectSource, RequestView, choose_backend, modified_path,
    redirect_location, redirect_status,
};
use crate::limits::Admission;
use crate::localapi::LocalApi;
use crate::metrics::{ActiveConnection, Direction, HttpDurationLabels, HttpRequestLabels, Metrics};
use crate::relay::{HalfClose, Tally, relay, tune_tcp};
use crate::routing::{RouteDecision, host_without_port};
use crate::site::{RouteBackend, RuleOutcome, RuleRuntime, SiteRoute};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

pub use crate::body::{BoxError, ProxyBody};
pub use crate::site::{HttpSite, LiveSite, ProxyDefaults, SiteError};

const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// An HTTP/2 connection without a request in flight is closed (GOAWAY) after this long; the
/// HTTP/1.1 equivalent is [`HEADER_READ_TIMEOUT`], which also runs between requests.
const HTTP2_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const HTTP2_GOAWAY_GRACE: Duration = Duration::from_secs(10);
/// Bound for an HTTP/1.1 request head (and the read buffer); beyond it: 431 and close.
const HTTP1_MAX_HEAD_BYTES: usize = 64 * 1024;
const WHOIS_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy needs besides the site.
#[derive(Clone)]
pub struct ProxyContext {
    pub metrics: Arc<Metrics>,
    pub localapi: LocalApi,
    /// Upgraded (WebSocket) tunnels, so shutdown can wait for them.
    pub tunnels: TaskTracker,
}

struct ConnectionInfo {
    /// The port the client connected to: the listener's (redirects default to it).
    listener_port: u16,
    /// The connection's slots under the connection limits; an upgraded (WebSocket) tunnel
    /// keeps a clone, so it counts until it ends.
    admission: Arc<Admission>,
    sni: Option<String>,
    /// X-Forwarded-For and the identity headers, encoded once for all requests.
    forwarded: ForwardedHeaders,
    /// Who the access log names: the user's login, the node, or the client address.
    client: Arc<str>,
    metrics: Arc<ConnectionMetrics>,
    /// HTTP/1.1 connections: their own backend connection (bodiless requests from the second
    /// on), spoken to by the requests themselves.
    dedicated: Option<DedicatedBackend>,
    /// Held here, not cloned per request (its socket path would be copied each time).
    context: ProxyContext,
}

/// The metric handles of one connection, so a request costs no label allocation and no
/// family lookup (label strings, hashing, a lock) in the common case.
struct ConnectionMetrics {
    metrics: Arc<Metrics>,
    bytes_in: Counter,
    bytes_out: Counter,
    /// The request counter and duration histogram of the last request's (route, host,
    /// status): a keep-alive connection almost always repeats them.
    last: std::sync::Mutex<Option<RequestMetrics>>,
}

struct RequestMetrics {
    route: Arc<str>,
    host: String,
    status: u16,
    requests: Counter,
    duration: Histogram,
}

impl ConnectionMetrics {
    fn new(metrics: &Arc<Metrics>, listener: &str) -> Self {
        ConnectionMetrics {
            metrics: metrics.clone(),
            bytes_in: metrics.bytes_counter(listener, Direction::In),
            bytes_out: metrics.bytes_counter(listener, Direction::Out),
            last: std::sync::Mutex::new(None),
        }
    }

    fn observe(&self, route: &Arc<str>, host: &str, status: u16, seconds: f64) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cached = last.as_ref().is_some_and(|last| {
            last.status == status && last.route == *route && last.host == *host
        });
        if !cached {
            let requests = self
                .metrics
                .http_requests
                .get_or_create(&HttpRequestLabels {
                    route: route.to_string(),
                    host: host.to_string(),
                    status: status.to_string(),
                })
                .clone();
            let duration = self
                .metrics
                .http_duration
                .get_or_create(&HttpDurationLabels {
                    route: route.to_string(),
                    host: host.to_string(),
                })
                .clone();
            *last = Some(RequestMetrics {
                route: route.clone(),
                host: host.to_owned(),
                status,
                requests,
                duration,
            });
        }
        if let Some(last) = last.as_ref() {
            last.requests.inc();
            last.duration.observe(seconds);
        }
    }
}

/// Serves one accepted TCP connection until it ends, or until `drain` asks it to finish
/// its in-flight requests and close.
pub async fn serve_connection(
    site: impl Into<LiveSite>,
    context: ProxyContext,
    tcp: TcpStream,
    peer: SocketAddr,
    drain: DrainWatch,
    admission: Admission,
) {
    let live = site.into();
    let site = live.current();
    let _active = ActiveConnection::open(&context.metrics, &site.listener);
    tune_tcp(&tcp);
    let listener_port = tcp.local_addr().map_or(0, |address| address.port());
    let acceptor = site.acceptor.clone();
    // Not held for the connection's lifetime: a replaced site (its pools) can go.
    let listener = site.listener.clone();
    drop(site);
    let Some(acceptor) = acceptor else {
        // Plain HTTP: once the first bytes arrived tailscaled has the connection in its map
        // (as after a TLS handshake), so whois can find the peer.
        if tokio::time::timeout(HEADER_READ_TIMEOUT, tcp.readable())
            .await
            .is_err()
        {
            debug!(%listener, %peer, "no request in time");
            return;
        }
        let start = ConnectionStart {
            peer,
            sni: None,
            http2: false,
            listener_port,
            admission,
        };
        serve_http(live, context, TokioIo::new(tcp), start, drain).await;
        return;
    };
    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            count_handshake_failure(&context, &listener);
            debug!(%listener, %peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            count_handshake_failure(&context, &listener);
            debug!(%listener, %peer, "TLS handshake timed out");
            return;
        }
    };
    let (_, session) = tls.get_ref();
    let start = ConnectionStart {
        peer,
        sni: session.server_name().map(str::to_owned),
        http2: session.alpn_protocol() == Some(b"h2".as_slice()),
        listener_port,
        admission,
    };
    serve_http(live, context, TokioIo::new(tls), start, drain).await;
}

fn count_handshake_failure(context: &ProxyContext, listener: &str) {
    context
        .metrics
        .tls_handshake_failures
        .get_or_create(&context.metrics.listener(listener))
        .inc();
}

/// A connection after TLS (or without it).
struct ConnectionStart {
    peer: SocketAddr,
    sni: Option<String>,
    http2: bool,
    listener_port: u16,
    admission: Admission,
}

async fn serve_http<IO>(
    live: LiveSite,
    context: ProxyContext,
    io: TokioIo<IO>,
    start: ConnectionStart,
    mut drain: DrainWatch,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let ConnectionStart {
        peer,
        sni,
        http2,
        listener_port,
        admission,
    } = start;
    // What does not change for a listener: its name, scheme and in-cluster flag.
    let (listener, scheme, in_cluster) = {
        let site = live.current();
        (site.listener.clone(), site.scheme(), site.in_cluster)
    };
    // An in-cluster client has no tailnet identity: tailscaled is not asked at all.
    let identity = if in_cluster {
        None
    } else {
        whois(&context.localapi, peer).await
    };
    let dedicated = (!http2).then(DedicatedBackend::default);
    let client_ip = identity
        .as_ref()
        .and_then(|identity| identity.tailnet_ip)
        .unwrap_or_else(|| peer.ip());
    let connection = Arc::new(ConnectionInfo {
        listener_port,
        admission: Arc::new(admission),
        sni,
        forwarded: ForwardedHeaders::with_proto(client_ip, identity.as_ref(), scheme),
        client: identity
            .as_ref()
            .map(PeerIdentity::describe)
            .unwrap_or_else(|| client_ip.to_string())
            .into(),
        metrics: Arc::new(ConnectionMetrics::new(&context.metrics, &listener)),
        dedicated,
        context,
    });
    // Only HTTP/2 has an idle timeout of the agent's own (HTTP/1.1: hyper's header timeout).
    let activity = http2.then(|| Arc::new(Activity::new()));
    // HTTP/1.1's header read timeout: waits counted by hyper's timer, ended by the service.
    let head_waits = (!http2).then(|| Arc::new(HeadWaits::default()));
    let service = {
        let activity = activity.clone();
        let head_waits = head_waits.clone();
        service_fn(move |request: Request<Incoming>| {
            if let Some(head_waits) = &head_waits {
                head_waits.head_arrived();
            }
            // The listener's routes as they are now.
            let site = live.current();
            let connection = connection.clone();
            let in_flight = activity.as_ref().map(InFlight::start);
            // Boxed: hyper moves the service's future into place for every request, and this
            // one is a few KiB (routing, rules, the backend exchange); one allocation costs
            // less than copying it.
            Box::pin(async move {
                let response =
                    proxy_request(&site, &connection.context, &connection, request).await;
                // The request counts as in flight until its response body is done.
                let (parts, body) = response.into_parts();
                let body = InFlightBody {
                    inner: body,
                    _in_flight: in_flight,
                };
                // Not boxed again: the response body is boxed once, where it is made.
                Ok::<_, Infallible>(Response::from_parts(parts, body))
            })
        })
    };
    let result = if let Some(activity) = activity {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder.timer(TokioTimer::new());
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        tokio::select! {
            result = connection.as_mut() => result,
            () = drain.draining() => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
            () = activity.idle_for(HTTP2_IDLE_TIMEOUT) => {
                debug!(%listener, %peer, "closing idle HTTP/2 connection");
                connection.as_mut().graceful_shutdown();
                // The final GOAWAY waits for the client's PING ack; one that never answers
                // loses the connection anyway.
                match tokio::time::timeout(HTTP2_GOAWAY_GRACE, connection).await {
                    Ok(result) => result,
                    Err(_) => Ok(()),
                }
            }
        }
    } else {
        let head_waits = head_waits.unwrap_or_default();
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(HeadTimer::new(head_waits.clone()))
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(HTTP1_MAX_HEAD_BYTES);
        let mut connection = std::pin::pin!(builder.serve_connection(io, service).with_upgrades());
        let mut head_watch = HeadWatch::new(head_waits, HEADER_READ_TIMEOUT);
        let mut draining = false;
        // One future, polled without a select: the drain check is one atomic load.
        std::future::poll_fn(|cx| {
            if !draining && drain.poll_draining(cx).is_ready() {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
            head_watch
                .poll_connection(cx, |cx| connection.as_mut().poll(cx))
                // hyper did not close a connection whose head wait expired: dropped here.
                .unwrap_or(Poll::Ready(Ok(())))
        })
        .await
    };
    if let Err(error) = result {
        debug!(%listener, %peer, error = %error_chain(&error), "HTTP connection ended with an error");
    }
}

async fn whois(localapi: &LocalApi, peer: SocketAddr) -> Option<PeerIdentity> {
    match tokio::time::timeout(WHOIS_TIMEOUT, localapi.whois(&peer.to_string())).await {
        Ok(Ok(Some(whois))) => Some(PeerIdentity::from_whois(&whois)),
        Ok(Ok(None)) => {
            debug!(%peer, "whois: tailscaled knows no tailnet peer for this connection");
            None
        }
        Ok(Err(error)) => {
            warn!(%peer, error = %error_chain(&error), "whois failed; forwarding without tailnet identity");
            None
        }
        Err(_) => {
            warn!(%peer, "whois timed out; forwarding without tailnet identity");
            None
        }
    }
}

/// One request: route, apply the route's rule, forward, stream back.
async fn proxy_request(
    site: &HttpSite,
    context: &ProxyContext,
    connection: &ConnectionInfo,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    // The request's own Host value (a reference-counted clone, no copy), forwarded as Host and
    // X-Forwarded-Host as it came.
    let host_header = request_host(&request);
    let host_value = host_header.as_ref().and_then(|value| value.to_str().ok());
    let mut exchange = Exchange::begin(started, connection, &request);
    if has_conflicting_host(request.headers()) {
        let mut answer =
            exchange.local_answer(StatusCode::BAD_REQUEST, "more than one Host header\n");
        answer
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return answer;
    }
    let choice = match site.routes.select(connection.sni.as_deref(), host_value) {
        RouteDecision::Route(choice) => choice,
        RouteDecision::Misdirected => {
            return exchange.local_answer(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected request: this connection does not serve that host\n",
            );
        }
        RouteDecision::UnknownHost => {
            return exchange.local_answer(StatusCode::NOT_FOUND, "no route serves this host\n");
        }
        RouteDecision::MissingHost => {
            return exchange.local_answer(StatusCode::BAD_REQUEST, "missing Host\n");
        }
    };
    // The configured name (or wildcard) the Host matched: a bounded metrics label.
    exchange.host = Some(choice.hostname.clone());
    let Some(route) = site.served.get(choice.index) else {
        exchange.route = Some(Arc::from(choice.entry.route.name.as_str()));
        return exchange.local_answer(StatusCode::BAD_GATEWAY, "route has no backend\n");
    };
    exchange.route = Some(route.name.clone());
    let host_name = host_value.and_then(host_without_port).unwrap_or_default();
    let source = RequestSource {
        scheme: site.scheme(),
        host: &host_name,
        listener_port: connection.listener_port,
    };
    match route_rules(route, &request, source, &context.metrics) {
        Routing::Forward(forward) => {
            // Shared by Host and X-Forwarded-Host (a clone is a reference count).
            let original_host = host_header.clone();
            forward_request(
                context,
                connection,
                exchange,
                request,
                original_host,
                forward,
            )
            .await
        }
        Routing::Redirect {
            rule,
            status,
            location,
        } => {
            let mut answer = exchange.local_answer(status, "");
            match HeaderValue::from_str(&location) {
                Ok(location) => {
                    answer.headers_mut().insert(header::LOCATION, location);
                }
                Err(_) => {
                    *answer.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                }
            }
            apply_response_edits(rule, answer)
        }
        Routing::Local { rule, status, text } => {
            let answer = exchange.local_answer(status, text);
            match rule {
                Some(rule) => apply_response_edits(rule, answer),
                None => answer,
            }
        }
    }
}

fn apply_response_edits(
    rule: &CompiledRule,
    mut response: Response<ProxyBody>,
) -> Response<ProxyBody> {
    if let Some(edits) = &rule.response_headers {
        edits.apply(response.headers_mut());
    }
    response
}

/// What a redirect needs to know of the request besides its target.
#[derive(Clone, Copy)]
struct RequestSource<'a> {
    scheme: &'static str,
    /// The Host without its port.
    host: &'a str,
    listener_port: u16,
}

/// What a route's rules make of a request.
enum Routing<'s> {
    Forward(Forward<'s>),
    Redirect {
        rule: &'s CompiledRule,
        status: StatusCode,
        location: String,
    },
    /// Answered by the proxy: no rule matches (404), no backend (500).
    Local {
        rule: Option<&'s CompiledRule>,
        status: StatusCode,
        text: &'static str,
    },
}

struct Forward<'s> {
    rule: &'s CompiledRule,
    runtime: &'s RuleRuntime,
    /// Borrowed from the site the request holds (no shared reference count per request).
    backend: &'s RouteBackend,
    /// The path (without query) a URLRewrite made; `None`: the client's.
    rewritten_path: Option<String>,
}

/// The first rule the request meets and what it does with it: redirect, or a backend chosen
/// by weight (none, or an unresolved one: 500).
fn route_rules<'s>(
    route: &'s SiteRoute,
    request: &Request<Incoming>,
    source: RequestSource<'_>,
    metrics: &Metrics,
) -> Routing<'s> {
    let uri = request.uri();
    let view = RequestView {
        method: request.method(),
        path: uri.path(),
        query: uri.query(),
        headers: request.headers(),
    };
    let found = http_rules::select(&route.rules, &view)
        .and_then(|selected| Some((route.runtime.get(selected.index)?, selected)));
    let Some((runtime, selected)) = found else {
        return Routing::Local {
            rule: None,
            status: StatusCode::NOT_FOUND,
            text: "no rule of this route matches the request\n",
        };
    };
    let rule = selected.rule;
    if let Some(redirect) = &rule.redirect {
        runtime.count(metrics, RuleOutcome::Redirect);
        let redirect_source = RedirectSource {
            scheme: source.scheme,
            host: source.host,
            listener_port: source.listener_port,
            path: uri.path(),
            query: uri.query(),
        };
        return Routing::Redirect {
            rule,
            status: StatusCode::from_u16(redirect_status(redirect)).unwrap_or(StatusCode::FOUND),
            location: redirect_location(redirect, &redirect_source, selected.matched_prefix),
        };
    }
    let chosen = choose_backend(&rule.weights, |total| fastrand::u64(0..total)).and_then(|index| {
        let backend = runtime.backends.get(index)?.as_deref()?;
        Some((index, backend))
    });
    let Some((index, backend)) = chosen else {
        runtime.count(metrics, RuleOutcome::NoBackend);
        return Routing::Local {
            rule: Some(rule),
            status: StatusCode::INTERNAL_SERVER_ERROR,
            text: "no backend for this request\n",
        };
    };
    runtime.count(metrics, RuleOutcome::Backend(index));
    let rewritten_path = rule
        .rewrite
        .as_ref()
        .and_then(|rewrite| rewrite.path.as_ref())
        .map(|modifier| modified_path(modifier, uri.path(), selected.matched_prefix));
    Routing::Forward(Forward {
        rule,
        runtime,
        backend,
        rewritten_path,
    })
}

/// Sends the request to the chosen backend with the rule's header edits and rewrites, and
/// streams the answer back.
async fn forward_request(
    context: &ProxyContext,
    connection: &ConnectionInfo,
    exchange: Exchange,
    mut request: Request<Incoming>,
    original_host: Option<HeaderValue>,
    forward: Forward<'_>,
) -> Response<ProxyBody> {
    let Forward {
        rule,
        runtime,
        backend,
        rewritten_path,
    } = forward;
    let started = exchange.started;
    let websocket =
        request.version() == Version::HTTP_11 && is_websocket_upgrade(request.headers());
    let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    // From its second request on, an HTTP/1.1 client's bodiless request goes to its own
    // backend connection, which needs the origin form (the pooled client turns the absolute
    // form into it by itself).
    let bodiless = body.is_end_stream();
    let dedicated = connection
        .dedicated
        .as_ref()
        .filter(|dedicated| dedicated.claim() && bodiless && !websocket);
    rewrite_request_head(
        &mut parts.headers,
        &connection.forwarded,
        original_host,
        websocket,
    );
    apply_rule_to_request_head(rule, &mut parts.headers);
    let Some(authority) = backend.authority.clone() else {
        return exchange.local_answer(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    let Some(uri) = backend_target(&parts.uri, rewritten_path)
        .and_then(|target| backend_uri(&mut parts, authority, dedicated.is_some(), target))
    else {
        return exchange.local_answer(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;

    let deadline = runtime.request_timeout.map(|timeout| started + timeout);
    // A request without a body (most of them) needs no upload bookkeeping: its body is a
    // zero-sized empty one, boxed without an allocation.
    let mut exchange = exchange;
    let backend_body = if bodiless {
        empty_body()
    } else {
        let upload = Arc::new(Upload::new(connection.metrics.bytes_in.clone()));
        exchange.upload = Some(upload.clone());
        UploadBody::new(body, deadline, upload).boxed_unsync()
    };

    // The backend's time to answer starts when it has the whole request: while the client
    // is still uploading, no backend can be expected to send its head.
    let head_wait = std::pin::pin!({
        let upload = exchange.upload.clone();
        let timeout = runtime.backend_request_timeout;
        async move {
            if let Some(upload) = upload {
                upload.wait_complete().await;
            }
            tokio::time::sleep(timeout).await;
        }
    });
    let exchange_deadline = std::pin::pin!(async move {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    });
    // Pinned where they are made: moved into the select, each would be stored twice in this
    // function's future (which hyper moves for every request).
    let send = std::pin::pin!(async {
        match dedicated {
            Some(dedicated) => dedicated
                .send(&backend.identity, &backend.connector, parts)
                .await
                .map(BackendResponse::Dedicated),
            None => backend
                .client
                .request(Request::from_parts(parts, backend_body))
                .await
                .map(BackendResponse::Pooled)
                .map_err(BoxError::from),
        }
    });
    let answer = tokio::select! {
        // In this order: no random start per request.
        biased;
        answer = send => Some(answer),
        () = head_wait => None,
        () = exchange_deadline => None,
    };
    let response = match answer {
        Some(Ok(response)) => response,
        Some(Err(error)) => {
            return failed_exchange(exchange, &context.metrics, backend, Some(error));
        }
        None => return failed_exchange(exchange, &context.metrics, backend, None),
    };

    let response = match response {
        BackendResponse::Pooled(response)
            if response.status() == StatusCode::SWITCHING_PROTOCOLS =>
        {
            return tunnel_upgrade(
                context,
                connection,
                backend,
                exchange,
                client_upgrade,
                response,
            );
        }
        BackendResponse::Pooled(response) => response.map(BackendBody::Pooled),
        BackendResponse::Dedicated(response) => response.map(BackendBody::Dedicated),
    };

    let (mut parts, body) = response.into_parts();
    if parts.headers.contains_key(header::TRANSFER_ENCODING) {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3): the body is framed by
        // it, so a length beside it (a smuggling attempt or a broken backend) is not passed
        // on, where the client would frame the answer by it.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    remove_hop_by_hop(&mut parts.headers);
    if let Some(edits) = &rule.response_headers {
        edits.apply(&mut parts.headers);
    }
    exchange.status = parts.status;
    let body = AnswerBody::new(body, deadline, Some(exchange));
    Response::from_parts(parts, body.boxed_unsync())
}

/// The backend's answer: from the route's pooled client or the client connection's own
/// backend connection.
enum BackendResponse {
    Pooled(Response<Incoming>),
    Dedicated(Response<DedicatedBody>),
}

/// A backend response body of either kind.
enum BackendBody {
    Pooled(Incoming),
    Dedicated(DedicatedBody),
}

impl Body for BackendBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Both are Unpin.
        match self.get_mut() {
            BackendBody::Pooled(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            BackendBody::Dedicated(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            BackendBody::Pooled(body) => body.is_end_stream(),
            BackendBody::Dedicated(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            BackendBody::Pooled(body) => body.size_hint(),
            BackendBody::Dedicated(body) => body.size_hint(),
        }
    }
}

/// The rule's request header edits and hostname rewrite. They come after the agent's own
/// edits and cannot touch what the agent sets (the config validation refuses those names).
fn apply_rule_to_request_head(rule: &CompiledRule, headers: &mut http::HeaderMap) {
    if let Some(edits) = &rule.request_headers {
        edits.apply(headers);
    }
    if let Some(hostname) = rule
        .rewrite
        .as_ref()
        .and_then(|rewrite| rewrite.hostname.as_deref())
        && let Ok(hostname) = HeaderValue::from_str(hostname)
    {
        headers.insert(header::HOST, hostname);
    }
}

/// The path and query the backend gets: a URLRewrite's path with the client's query, or the
/// client's own (`/` when it sent none). `None`: the rewritten target is not a valid one.
fn backend_target(uri: &Uri, rewritten_path: Option<String>) -> Option<PathAndQuery> {
    match rewritten_path {
        Some(path) => {
            let target = match uri.query() {
                Some(query) => format!("{path}?{query}"),
                None => path,
            };
            PathAndQuery::try_from(target).ok()
        }
        None => Some(
            uri.path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        ),
    }
}

/// The client's request head as the backend gets it: hop-by-hop headers, `Expect` and
/// client-supplied identity headers removed; forwarding headers, the original Host and, when
/// the client asked for them, `TE: trailers` set; a WebSocket upgrade asked for again.
fn rewrite_request_head(
    headers: &mut http::HeaderMap,
    forwarded: &ForwardedHeaders,
    original_host: Option<HeaderValue>,
    websocket: bool,
) {
    let wants_trailers = remove_hop_by_hop(headers);
    // hyper already answered any `Expect: 100-continue` towards the client.
    headers.remove(header::EXPECT);
    strip_client_identity(headers);
    forwarded.apply(headers, original_host.clone());
    if let Some(host) = original_host {
        // The backend sees the name the client asked for (HTTP/2 carries it in :authority).
        headers.insert(header::HOST, host);
    }
    if wants_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if websocket {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    }
}

/// The backend request's URI: the origin form on a dedicated HTTP/1.1 connection (which then
/// needs a Host header: the backend's authority if the client sent none), the absolute form
/// for the pooled client. `None`: the parts form no URI.
fn backend_uri(
    parts: &mut http::request::Parts,
    authority: Authority,
    dedicated: bool,
    path_and_query: PathAndQuery,
) -> Option<Uri> {
    let mut uri = http::uri::Parts::default();
    if dedicated {
        if !parts.headers.contains_key(header::HOST)
            && let Ok(host) = HeaderValue::from_str(authority.as_str())
        {
            parts.headers.insert(header::HOST, host);
        }
    } else {
        uri.scheme = Some(Scheme::HTTP);
        uri.authority = Some(authority);
    }
    uri.path_and_query = Some(path_and_query);
    Uri::from_parts(uri).ok()
}

/// The answer when the backend gave no response head: `error` from the exchange, or `None`
/// when a deadline fired first. A request whose upload ran out of time is the client's
/// (408); anything else is the backend's (502, 504), counted as its failure.
fn failed_exchange(
    mut exchange: Exchange,
    metrics: &Metrics,
    backend: &RouteBackend,
    error: Option<BoxError>,
) -> Response<ProxyBody> {
    // No upload: the request had no body, so it was complete from the start.
    let (expired, complete) = exchange.upload.as_ref().map_or((false, true), |upload| {
        (upload.expired(), upload.complete())
    });
    match error {
        Some(error) => {
            if expired {
                exchange.message = "request timeout during upload".into();
                exchange.local_answer(StatusCode::REQUEST_TIMEOUT, "request timeout\n")
            } else {
                let reason = connect_failure(&*error).map_or("protocol", |failure| failure.label());
                metrics.count_backend_failure(&backend.name, reason);
                exchange.message = format!("backend {reason} failure: {}", error_chain(&*error));
                exchange.local_answer(StatusCode::BAD_GATEWAY, "bad gateway\n")
            }
        }
        None => {
            if expired || !complete {
                exchange.message = "request timeout during upload".into();
                exchange.local_answer(StatusCode::REQUEST_TIMEOUT, "request timeout\n")
            } else {
                metrics.count_backend_failure(&backend.name, "timeout");
                exchange.message = "no response head from the backend in time".into();
                exchange.local_answer(StatusCode::GATEWAY_TIMEOUT, "gateway timeout\n")
            }
        }
    }
}

/// A backend's `101 Switching Protocols`: relays between the two upgraded connections in a
/// tracked task that holds the connection's admission, and passes the head to the client.
fn tunnel_upgrade(
    context: &ProxyContext,
    connection: &ConnectionInfo,
    backend: &RouteBackend,
    mut exchange: Exchange,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    mut response: Response<Incoming>,
) -> Response<ProxyBody> {
    let Some(client_upgrade) = client_upgrade else {
        context
            .metrics
            .count_backend_failure(&backend.name, "protocol");
        exchange.message = "backend switched protocols without an upgrade request".into();
        return exchange.local_answer(StatusCode::BAD_GATEWAY, "bad gateway\n");
    };
    let backend_upgrade = hyper::upgrade::on(&mut response);
    let tallies = Arc::new(Tallies {
        inbound: Tally::new(connection.metrics.bytes_in.clone()),
        outbound: Tally::new(connection.metrics.bytes_out.clone()),
    });
    let route = backend.name.clone();
    let admission = connection.admission.clone();
    context.tunnels.spawn(async move {
        let _admission = admission;
        match tokio::try_join!(client_upgrade, backend_upgrade) {
            Ok((client, backend)) => {
                let result = relay(
                    TokioIo::new(client),
                    TokioIo::new(backend),
                    &tallies.inbound,
                    &tallies.outbound,
                    HalfClose::Propagate,
                    None,
                )
                .await;
                debug!(%route, bytes_in = tallies.inbound.total(), bytes_out = tallies.outbound.total(), ?result, "upgraded connection closed");
            }
            Err(error) => {
                debug!(%route, error = %error_chain(&error), "upgrade did not complete");
            }
        }
    });
    let (parts, _) = response.into_parts();
    exchange.status = parts.status;
    let body = AnswerBody::new(http_body_util::Empty::<Bytes>::new(), None, Some(exchange));
    Response::from_parts(parts, body.boxed_unsync())
}

/// Requests in flight on one connection and when the last one ended: what an idle timeout
/// needs (hyper's HTTP/2 server has keep-alive pings but no idle timeout).
struct Activity {
    in_flight: std::sync::atomic::AtomicUsize,
    last_ended: std::sync::Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            last_ended: std::sync::Mutex::new(Instant::now()),
        }
    }

    fn last_ended(&self) -> Instant {
        *self
            .last_ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Resolves once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let busy = self.in_flight.load(Ordering::SeqCst) > 0;
            let deadline = self.last_ended() + timeout;
            if !busy && Instant::now() >= deadline {
                return;
            }
            // While busy, look again a timeout later: the end of a request moves the deadline.
            let wake = if busy {
                Instant::now() + timeout
            } else {
                deadline
            };
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// One request in flight; ends when dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self
            .0
            .last_ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted as in flight until it is done.
    struct InFlightBody {
        #[pin]
        inner: ProxyBody,
        _in_flight: Option<InFlight>,
    }
}

impl Body for InFlightBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The Host the client asked for: the request target's authority when it has one
/// (`:authority` on HTTP/2, absolute-form on HTTP/1.1, which RFC 9112 §3.2.2 puts before the
/// Host header), else the Host header.
fn request_host<B>(request: &Request<B>) -> Option<HeaderValue> {
    match request.uri().authority() {
        // absolute-form (and HTTP/2's :authority): one copy
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => request.headers().get(header::HOST).cloned(),
    }
}

/// A request body's progress, shared by the body the backend reads and the exchange: its
/// bytes, whether it is complete, whether it ran out of time.
#[derive(Debug)]
struct Upload {
    bytes: Tally,
    complete: AtomicBool,
    expired: AtomicBool,
    completed: Notify,
}

impl Upload {
    fn new(bytes_in: Counter) -> Self {
        Upload {
            bytes: Tally::new(bytes_in),
            complete: AtomicBool::new(false),
            expired: AtomicBool::new(false),
            completed: Notify::new(),
        }
    }

    fn complete(&self) -> bool {
        self.complete.load(Ordering::SeqCst)
    }

    fn mark_complete(&self) {
        self.complete.store(true, Ordering::SeqCst);
        self.completed.notify_waiters();
    }

    async fn wait_complete(&self) {
        let notified = self.completed.notified();
        if self.complete() {
            return;
        }
        notified.await;
    }

    fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }
}

/// The body of a request without one: zero-sized, so boxing it allocates nothing.
fn empty_body() -> ProxyBody {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// The metrics label of a request no route matched: one shared string, not one per request.
/// The host label of a request no route took.
const UNKNOWN_HOST: &str = "unknown";

#[derive(Debug, thiserror::Error)]
#[error("request timeout: the exchange took longer than the route allows")]
pub struct ExchangeDeadline;

/// One request/response for the access log and the HTTP metrics; reported when the response
/// body is finished or dropped (so durations include the download).
struct Exchange {
    started: Instant,
    metrics: Arc<ConnectionMetrics>,
    /// `None` until a route is selected (`-` in the metrics and the log).
    route: Option<Arc<str>>,
    /// The configured name the Host matched; `None` until then (`unknown`).
    host: Option<Arc<str>>,
    method: Method,
    path: String,
    status: StatusCode,
    client: Arc<str>,
    /// The request body's progress; `None`: the request had no body.
    upload: Option<Arc<Upload>>,
    /// Bytes of the response body so far (the live counter is the connection's).
    bytes_out: u64,
    message: String,
}

impl Exchange {
    /// The record of `request`, started at `started`, before a route is selected.
    fn begin<B>(started: Instant, connection: &ConnectionInfo, request: &Request<B>) -> Self {
        // The path is only for the access log; not copied when that is off.
        let path = if tracing::enabled!(target: "access", tracing::Level::INFO) {
            request.uri().path().to_owned()
        } else {
            String::new()
        };
        Exchange {
            started,
            metrics: connection.metrics.clone(),
            route: None,
            host: None,
            method: request.method().clone(),
            path,
            status: StatusCode::OK,
            client: connection.client.clone(),
            upload: None,
            bytes_out: 0,
            message: String::new(),
        }
    }

    fn local_answer(mut self, status: StatusCode, text: &'static str) -> Response<ProxyBody> {
        self.status = status;
        let body = AnswerBody::new(
            Full::new(Bytes::from_static(text.as_bytes())),
            None,
            Some(self),
        );
        let mut response = Response::new(body.boxed_unsync());
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        let duration = self.started.elapsed();
        let route = self.route.get_or_insert_with(|| Arc::from("-"));
        let host = self.host.as_deref().unwrap_or(UNKNOWN_HOST);
        self.metrics
            .observe(route, host, self.status.as_u16(), duration.as_secs_f64());
        info!(
            target: "access",
            route = %route,
            host = %host,
            method = %self.method,
            path = %self.path,
            status = self.status.as_u16(),
            client = %self.client,
            bytes_in = self.upload.as_ref().map_or(0, |upload| upload.bytes.total()),
            bytes_out = self.bytes_out,
            duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            detail = %self.message,
            "request"
        );
    }
}

/// The byte counts of an upgraded (WebSocket) tunnel, client to backend and back.
#[derive(Debug)]
struct Tallies {
    inbound: Tally,
    outbound: Tally,
}

/// What a [`MeteredBody`] reports to: the request's upload record or the exchange itself.
trait Meter {
    fn on_data(&mut self, bytes: usize);
    fn on_failure(&mut self, error: &BoxError);
    fn on_deadline(&mut self);
    fn on_end(&mut self);
}

/// A request body on its way to the backend: its bytes, its end, and whether the exchange
/// deadline cut it off.
type UploadBody<B> = MeteredBody<B, Arc<Upload>>;

/// A response body on its way to the client; the exchange is reported at its end (or when the
/// body is dropped).
type AnswerBody<B> = MeteredBody<B, Option<Exchange>>;

impl Meter for Arc<Upload> {
    fn on_data(&mut self, bytes: usize) {
        self.bytes.add(bytes);
    }

    fn on_failure(&mut self, _error: &BoxError) {}

    fn on_deadline(&mut self) {
        self.expired.store(true, Ordering::SeqCst);
    }

    fn on_end(&mut self) {
        self.mark_complete();
    }
}

impl Meter for Option<Exchange> {
    fn on_data(&mut self, bytes: usize) {
        if let Some(exchange) = self.as_mut() {
            let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
            exchange.bytes_out = exchange.bytes_out.saturating_add(bytes);
            exchange.metrics.bytes_out.inc_by(bytes);
        }
    }

    fn on_failure(&mut self, error: &BoxError) {
        if let Some(exchange) = self.as_mut() {
            exchange.message = format!("body aborted: {error}");
        }
    }

    fn on_deadline(&mut self) {
        if let Some(exchange) = self.as_mut() {
            exchange.message = "cut off at the request timeout".into();
        }
    }

    fn on_end(&mut self) {
        // Report now rather than when hyper drops the body.
        drop(self.take());
    }
}

pin_project_lite::pin_project! {
    /// A body passing through the proxy: frames pass unchanged while the meter counts their
    /// bytes, and the exchange deadline is enforced.
    struct MeteredBody<B, M> {
        #[pin]
        inner: B,
        deadline: Option<Pin<Box<Sleep>>>,
        meter: M,
        failed: bool,
    }
}

impl<B: Body, M: Meter> MeteredBody<B, M> {
    fn new(inner: B, deadline: Option<Instant>, meter: M) -> Self {
        MeteredBody {
            inner,
            deadline: deadline.map(|deadline| Box::pin(tokio::time::sleep_until(deadline))),
            meter,
            failed: false,
        }
    }
}

impl<B, M> Body for MeteredBody<B, M>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    M: Meter,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.failed {
            return Poll::Ready(None);
        }
        if past_deadline(this.deadline, cx) {
            *this.failed = true;
            this.meter.on_deadline();
            return Poll::Ready(Some(Err(Box::new(ExchangeDeadline))));
        }
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.meter.on_data(data.len());
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                *this.failed = true;
                let error: BoxError = error.into();
                this.meter.on_failure(&error);
                Poll::Ready(Some(Err(error)))
            }
            None => {
                this.meter.on_end();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether the exchange deadline (if any) has passed; registers the waker otherwise.
fn past_deadline(deadline: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) -> bool {
    deadline
        .as_mut()
        .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, uri: &str, host: Option<&str>) -> Request<()> {
        let mut builder = Request::get(uri).version(version);
        if let Some(host) = host {
            builder = builder.header(header::HOST, host);
        }
        builder.body(()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_without_requests_in_flight() {
        let activity = Arc::new(Activity::new());
        let timeout = Duration::from_millis(50);
        activity.idle_for(timeout).await;

        let in_flight = InFlight::start(&activity);
        let still_busy =
            tokio::time::timeout(Duration::from_millis(300), activity.idle_for(timeout)).await;
        assert!(still_busy.is_err(), "idle while a request is in flight");
        drop(in_flight);
        assert_eq!(activity.in_flight.load(Ordering::SeqCst), 0);
        tokio::time::timeout(Duration::from_secs(5), activity.idle_for(timeout))
            .await
            .unwrap_or_else(|_| panic!("never idle after the request ended"));
    }

    #[test]
    fn the_host_comes_from_the_authority_first() {
        let cases = [
            (
                Version::HTTP_2,
                "https://portal.test:8443/x",
                None,
                Some("portal.test:8443"),
            ),
            (
                Version::HTTP_11,
                "/x",
                Some("portal.test"),
                Some("portal.test"),
            ),
            (
                Version::HTTP_11,
                "https://admin.test/x",
                Some("portal.test"),
                Some("admin.test"),
            ),
            (Version::HTTP_11, "/x", None, None),
        ];
        for (version, uri, host, expected) in cases {
            assert_eq!(
                request_host(&request(version, uri, host))
                    .as_ref()
                    .and_then(|value| value.to_str().ok()),
                expected,
                "{uri} {host:?}"
            );
        }
    }
}
