//! An authenticating front for the lab registry (`crane registry serve` has no authentication):
//! the token flow of Docker Hub, GHCR and Harbor on loopback. Every `/v2/…` request without a
//! token this front issued is answered `401` with `WWW-Authenticate: Bearer
//! realm="http://<front>/token",service="lab-registry",scope="repository:<repo>:pull,push"`;
//! `GET /token` issues a token only to `Authorization: Basic <user:password>` with the front's
//! user; requests with a valid token are forwarded to the registry as they are. It counts what
//! it refused, so a test can show that a push without credentials was refused.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A running front; its task ends with the runtime.
#[derive(Debug, Clone)]
pub struct AuthFront {
    host: String,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    backend: String,
    /// `Basic <base64 user:password>` the token endpoint accepts.
    basic: String,
    tokens: Mutex<HashSet<String>>,
    refused: AtomicUsize,
    token_refusals: AtomicUsize,
    forwarded: AtomicUsize,
    http: reqwest::Client,
}

impl AuthFront {
    /// Serves on `127.0.0.1:<free port>` in front of `backend` (`host:port`, plain HTTP).
    pub async fn start(backend: &str, username: &str, password: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let basic = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
        );
        let state = Arc::new(State {
            backend: backend.to_string(),
            basic,
            tokens: Mutex::default(),
            refused: AtomicUsize::new(0),
            token_refusals: AtomicUsize::new(0),
            forwarded: AtomicUsize::new(0),
            http: reqwest::Client::new(),
        });
        tokio::spawn(serve(listener, address, state.clone()));
        Ok(Self {
            host: address.to_string(),
            state,
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `/v2/` requests answered 401 (no or an unknown token).
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Token requests refused (no or wrong Basic credentials).
    pub fn token_refusals(&self) -> usize {
        self.state.token_refusals.load(Ordering::Relaxed)
    }

    /// Requests forwarded to the registry (authenticated).
    pub fn forwarded(&self) -> usize {
        self.state.forwarded.load(Ordering::Relaxed)
    }
}

async fn serve(listener: TcpListener, address: SocketAddr, state: Arc<State>) {
    while let Ok((stream, _)) = listener.accept().await {
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(request, address, state.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
}

/// `repository:<name>:pull,push` for `/v2/<name>/(blobs|manifests|tags)/…`.
fn scope(path: &str) -> String {
    let rest = path.trim_start_matches("/v2/");
    let name = ["/blobs/", "/manifests/", "/tags/"]
        .iter()
        .filter_map(|marker| rest.find(marker))
        .min()
        .map_or("", |end| &rest[..end]);
    format!("repository:{name}:pull,push")
}

async fn handle(
    request: Request<Incoming>,
    address: SocketAddr,
    state: Arc<State>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let path = request.uri().path().to_string();
    if path == "/token" {
        if authorization != state.basic {
            state.token_refusals.fetch_add(1, Ordering::Relaxed);
            return Ok(reply(StatusCode::UNAUTHORIZED, "bad credentials"));
        }
        let token = format!("lab-{:016x}", rand_u64());
        if let Ok(mut tokens) = state.tokens.lock() {
            tokens.insert(token.clone());
        }
        return Ok(reply(
            StatusCode::OK,
            serde_json::json!({ "token": token }).to_string(),
        ));
    }
    let token_ok = authorization.strip_prefix("Bearer ").is_some_and(|token| {
        state
            .tokens
            .lock()
            .is_ok_and(|tokens| tokens.contains(token))
    });
    if !token_ok {
        state.refused.fetch_add(1, Ordering::Relaxed);
        let mut response = reply(StatusCode::UNAUTHORIZED, "authentication required");
        let challenge = format!(
            "Bearer realm=\"http://{address}/token\",service=\"lab-registry\",scope=\"{}\"",
            scope(&path)
        );
        if let Ok(value) = challenge.parse() {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        return Ok(response);
    }
    state.forwarded.fetch_add(1, Ordering::Relaxed);
    Ok(forward(request, address, &state).await)
}

/// The request as it came (minus Host and Authorization), sent to the registry; an absolute
/// `Location` naming the registry is rewritten to the front (clients must not go around it).
async fn forward(
    request: Request<Incoming>,
    address: SocketAddr,
    state: &State,
) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return reply(StatusCode::BAD_REQUEST, "body");
    };
    let url = format!("http://{}{path_and_query}", state.backend);
    let mut outgoing = state.http.request(parts.method, &url).body(body);
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::AUTHORIZATION {
            outgoing = outgoing.header(name, value);
        }
    }
    let Ok(answer) = outgoing.send().await else {
        return reply(StatusCode::BAD_GATEWAY, "registry unreachable");
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer.bytes().await.unwrap_or_default();
    let mut response = reply(status, bytes);
    for (name, value) in &headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        let backend = format!("http://{}", state.backend);
        let rewritten = (name == header::LOCATION)
            .then(|| value.to_str().ok())
            .flatten()
            .and_then(|location| location.strip_prefix(&backend))
            .and_then(|rest| format!("http://{address}{rest}").parse().ok());
        response
            .headers_mut()
            .append(name, rewritten.unwrap_or_else(|| value.clone()));
    }
    response
}

/// Token material: not a secret of any real system, only unguessable within a test.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::scope;

    #[test]
    fn scopes_name_the_repository() {
        assert_eq!(
            scope("/v2/tno/tailnet-agent/blobs/uploads/"),
            "repository:tno/tailnet-agent:pull,push"
        );
        assert_eq!(
            scope("/v2/tno/charts/tailnet-operator/manifests/0.1.0"),
            "repository:tno/charts/tailnet-operator:pull,push"
        );
        assert_eq!(scope("/v2/"), "repository::pull,push");
    }
}
