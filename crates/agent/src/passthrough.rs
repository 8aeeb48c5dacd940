//! `tlsPassthrough` listeners (Gateway API `TLS` listeners in `Passthrough` mode): the agent
//! reads the client's ClientHello without answering it, picks the route by its SNI (exact,
//! then the longest `*.` wildcard, then `*`; no SNI: only `*`), and relays the connection —
//! the ClientHello first — to one of the route's backends by weight. The backend terminates
//! TLS with its own certificate; the agent never sees plaintext.
//!
//! Bounded: the ClientHello must arrive within [`HELLO_TIMEOUT`] and fit in
//! [`MAX_HELLO_BYTES`]. An unknown SNI, or a route without a usable backend, gets the
//! connection closed without a TLS alert (Gateway API's "connection rejected").

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tailnet_api::agent_config::{BackendAddress, PassthroughRoute};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use crate::config::normalize_hostname;
use crate::dial::error_chain;
use crate::http_rules::choose_backend;
use crate::limits::Admission;
use crate::listeners::Shared;
use crate::metrics::{ActiveConnection, Direction};
use crate::relay::{Tally, tune_tcp};
use crate::routing::HostnameIndex;

/// How long a client may take to send its whole ClientHello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a ClientHello (with its record headers) may take; real ones, post-quantum key
/// shares included, stay under 4 KiB.
pub const MAX_HELLO_BYTES: usize = 32 * 1024;
/// TLS records carry at most 2^14 bytes of plaintext (RFC 8446 §5.1).
const MAX_RECORD_PAYLOAD: usize = 16 * 1024;
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const SERVER_NAME_HOST: u8 = 0;

/// What the bytes received so far hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not all of the ClientHello yet.
    Incomplete,
    /// The whole ClientHello; its SNI host name (lower case, no trailing dot), if it has one.
    Complete { server_name: Option<String> },
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not a TLS handshake record")]
    NotTls,
    #[error("the first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is larger than {MAX_HELLO_BYTES} bytes")]
    TooLarge,
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// A big-endian reader over a byte slice that fails instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.bytes.len() < len {
            return Err(HelloError::Malformed(what));
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    /// A vector with a `width`-byte length prefix.
    fn vector(&mut self, width: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        let len = match width {
            1 => usize::from(self.u8(what)?),
            _ => usize::from(self.u16(what)?),
        };
        self.take(len, what)
    }
}

/// Parses what a client sent so far (`bytes`, from its first byte): records of type
/// handshake, whose payloads together hold the ClientHello message.
pub fn parse_client_hello(bytes: &[u8]) -> Result<Hello, HelloError> {
    let mut handshake = Vec::new();
    let mut rest = bytes;
    loop {
        if handshake.len() >= 4 {
            let len = usize::from(handshake[1]) << 16
                | usize::from(handshake[2]) << 8
                | usize::from(handshake[3]);
            if len > MAX_HELLO_BYTES {
                return Err(HelloError::TooLarge);
            }
            if handshake.len() >= 4 + len {
                return client_hello_server_name(&handshake[4..4 + len])
                    .map(|server_name| Hello::Complete { server_name });
            }
        }
        if rest.is_empty() {
            return Ok(Hello::Incomplete);
        }
        if rest[0] != CONTENT_TYPE_HANDSHAKE {
            return Err(if handshake.is_empty() {
                HelloError::NotTls
            } else {
                HelloError::Malformed("a non-handshake record inside the ClientHello")
            });
        }
        if rest.len() < 5 {
            return Ok(Hello::Incomplete);
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD_PAYLOAD {
            return Err(HelloError::Malformed("record length"));
        }
        let Some(payload) = rest.get(5..5 + len) else {
            return Ok(Hello::Incomplete);
        };
        handshake.extend_from_slice(payload);
        rest = &rest[5 + len..];
        if handshake.first() != Some(&HANDSHAKE_CLIENT_HELLO) {
            return Err(HelloError::NotClientHello);
        }
    }
}

/// The SNI host name of a ClientHello body (RFC 8446 §4.1.2, RFC 6066 §3).
fn client_hello_server_name(body: &[u8]) -> Result<Option<String>, HelloError> {
    let mut reader = Reader { bytes: body };
    reader.take(2, "version")?;
    reader.take(32, "random")?;
    reader.vector(1, "session id")?;
    reader.vector(2, "cipher suites")?;
    reader.vector(1, "compression methods")?;
    if reader.bytes.is_empty() {
        // No extensions at all (legal before TLS 1.3): no SNI.
        return Ok(None);
    }
    let mut extensions = Reader {
        bytes: reader.vector(2, "extensions")?,
    };
    while !extensions.bytes.is_empty() {
        let kind = extensions.u16("extension type")?;
        let data = extensions.vector(2, "extension data")?;
        if kind != EXTENSION_SERVER_NAME {
            continue;
        }
        let mut list = Reader {
            bytes: Reader { bytes: data }.vector(2, "server name list")?,
        };
        while !list.bytes.is_empty() {
            let name_type = list.u8("server name type")?;
            let name = list.vector(2, "server name")?;
            if name_type == SERVER_NAME_HOST {
                return host_name(name).map(Some);
            }
        }
        return Ok(None);
    }
    Ok(None)
}

fn host_name(name: &[u8]) -> Result<String, HelloError> {
    let valid = !name.is_empty()
        && name.len() <= 255
        && name
            .iter()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_'));
    let name = std::str::from_utf8(name).ok().filter(|_| valid);
    let normalized = name.map(normalize_hostname).filter(|name| !name.is_empty());
    normalized.ok_or(HelloError::Malformed("server name is not a host name"))
}

/// Reads from `stream` until the ClientHello is complete; returns every byte read (to be
/// relayed first) and the SNI.
pub async fn read_client_hello(
    stream: &mut TcpStream,
) -> Result<(Vec<u8>, Option<String>), ReadHelloError> {
    let mut buffer = Vec::with_capacity(2048);
    loop {
        let mut chunk = [0u8; 4096];
        let read = stream.read(&mut chunk).await.map_err(ReadHelloError::Io)?;
        if read == 0 {
            return Err(ReadHelloError::Closed);
        }
        buffer.extend_from_slice(&chunk[..read]);
        match parse_client_hello(&buffer)? {
            Hello::Complete { server_name } => return Ok((buffer, server_name)),
            Hello::Incomplete if buffer.len() >= MAX_HELLO_BYTES => {
                return Err(HelloError::TooLarge.into());
            }
            Hello::Incomplete => {}
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReadHelloError {
    #[error("reading the ClientHello")]
    Io(#[source] std::io::Error),
    #[error("the client closed before its ClientHello was complete")]
    Closed,
    #[error(transparent)]
    Hello(#[from] HelloError),
}

/// One passthrough route, ready to serve.
#[derive(Debug, PartialEq, Eq)]
pub struct PassthroughTarget {
    pub name: String,
    pub weights: Vec<u32>,
    /// By backend index; `None`: an unresolved reference.
    pub backends: Vec<Option<BackendAddress>>,
}

/// A `tlsPassthrough` listener's routes for one config generation.
#[derive(Debug)]
pub struct PassthroughSite {
    pub listener: String,
    hostnames: HostnameIndex,
    targets: Vec<PassthroughTarget>,
    /// What it was built from, to tell whether a new config changes it.
    pub routes: Vec<PassthroughRoute>,
}

impl PassthroughSite {
    pub fn new(listener: String, routes: &[PassthroughRoute]) -> Self {
        let mut hostnames = HostnameIndex::default();
        let mut targets = Vec::with_capacity(routes.len());
        for (index, route) in routes.iter().enumerate() {
            for hostname in &route.hostnames {
                hostnames.insert(hostname, index);
            }
            targets.push(PassthroughTarget {
                name: route.name.clone(),
                weights: route
                    .backends
                    .iter()
                    .map(|backend| backend.weight)
                    .collect(),
                backends: route
                    .backends
                    .iter()
                    .map(|backend| backend.backend.clone())
                    .collect(),
            });
        }
        PassthroughSite {
            listener,
            hostnames,
            targets,
            routes: routes.to_vec(),
        }
    }

    /// The route for a ClientHello's SNI (already normalized); without SNI only `*` serves.
    pub fn route_for(&self, server_name: Option<&str>) -> Option<&PassthroughTarget> {
        let index = match server_name {
            Some(name) => self.hostnames.lookup(name).map(|(index, _)| index),
            None => self.hostnames.any(),
        }?;
        self.targets.get(index)
    }
}

/// A passthrough connection: ClientHello read, route and backend chosen, then spliced.
pub async fn handle_passthrough(
    mut stream: TcpStream,
    peer: SocketAddr,
    site: Arc<PassthroughSite>,
    shared: Shared,
    admission: Admission,
) {
    let _active = ActiveConnection::open(&shared.metrics, &site.listener);
    tune_tcp(&stream);
    let refused = |reason: &str| {
        shared
            .metrics
            .tls_handshake_failures
            .get_or_create(&shared.metrics.listener(&site.listener))
            .inc();
        debug!(listener = %site.listener, %peer, %reason, "passthrough connection refused");
    };
    let (hello, server_name) =
        match tokio::time::timeout(HELLO_TIMEOUT, read_client_hello(&mut stream)).await {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => return refused(&error_chain(&error)),
            Err(_) => return refused("no complete ClientHello in time"),
        };
    // A connection no route or backend takes is closed without a TLS alert: Gateway API asks
    // for the connection to be rejected (the client sees EOF), as a passthrough proxy that
    // never speaks TLS itself would.
    let Some(target) = site.route_for(server_name.as_deref()) else {
        refused(&format!("no route serves SNI {server_name:?}"));
        let _ = stream.shutdown().await;
        return;
    };
    let chosen = choose_backend(&target.weights, |total| fastrand::u64(0..total))
        .and_then(|index| target.backends.get(index)?.clone());
    let Some(address) = chosen else {
        shared
            .metrics
            .count_backend_failure(&target.name, "no_backend");
        debug!(listener = %site.listener, %peer, route = %target.name, "no backend for this connection");
        let _ = stream.shutdown().await;
        return;
    };
    let backend = match connect(&shared, &target.name, &address).await {
        Some(backend) => backend,
        None => {
            let _ = stream.shutdown().await;
            return;
        }
    };
    let inbound = Tally::new(shared.metrics.bytes_counter(&site.listener, Direction::In));
    let outbound = Tally::new(shared.metrics.bytes_counter(&site.listener, Direction::Out));
    let mut backend = backend;
    if let Err(error) = backend.write_all(&hello).await {
        shared
            .metrics
            .count_backend_failure(&target.name, "connect");
        warn!(listener = %site.listener, %peer, route = %target.name, error = %error, "backend closed before the ClientHello was relayed");
        let _ = stream.shutdown().await;
        return;
    }
    inbound.add(hello.len());
    let result = crate::splice::relay_tcp(
        stream,
        backend,
        &inbound,
        &outbound,
        admission.idle_timeout(),
    )
    .await;
    debug!(
        listener = %site.listener,
        %peer,
        route = %target.name,
        sni = ?server_name,
        bytes_in = inbound.total(),
        bytes_out = outbound.total(),
        error = result.as_ref().err().map(|e| e.to_string()),
        "passthrough connection closed"
    );
}

/// Connects to a backend within the connect timeout; failures are counted and logged.
async fn connect(shared: &Shared, route: &str, address: &BackendAddress) -> Option<TcpStream> {
    let connect = TcpStream::connect((address.host.as_str(), address.port));
    let target = format!("{}:{}", address.host, address.port);
    match tokio::time::timeout(shared.backend_connect_timeout, connect).await {
        Ok(Ok(backend)) => {
            tune_tcp(&backend);
            Some(backend)
        }
        Ok(Err(error)) => {
            shared.metrics.count_backend_failure(route, "connect");
            warn!(%route, backend = %target, error = %error_chain(&error), "backend connect failed");
            None
        }
        Err(_) => {
            shared.metrics.count_backend_failure(route, "timeout");
            warn!(%route, backend = %target, "backend connect timed out");
            None
        }
    }
}

#[cfg(test)]
mod tests;
