//! Client of tailscaled's LocalAPI on its unix socket: `status`, `whois`, `dial`, and the
//! login retry (`reload-config` + `start`).
//!
//! The dial contract (tailscale `ipn/localapi/localapi.go` `serveDial`, client side
//! `client/local/local.go` `UserDial`, ≥ 1.98): `POST /localapi/v0/dial` with
//! `Connection: upgrade`, `Upgrade: ts-dial`, `Dial-Host`, `Dial-Port`, `Dial-Network` →
//! - `101 Switching Protocols`: the connection is now the raw byte stream to the target;
//! - `200 OK` with `Dial-Self: true` and `Dial-Addr: ip:port`: the target is not a tailnet
//!   route and tailscaled did not dial it; the caller is expected to dial it itself — which for
//!   this agent would leak to the pod network, so it is refused;
//! - `502` with a text body `resolve failure: …` or `dial failure: …` (the netstack's error,
//!   e.g. `connection was refused`);
//! - `400`/`405` for a malformed request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::UnixStream;

/// tailscaled rejects LocalAPI requests with any other Host header.
pub const LOCALAPI_HOST: &str = "local-tailscaled.sock";
/// Largest LocalAPI answer read into memory (a status with many peers is a few MiB at most).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Largest error body of a failed dial kept for the message.
const MAX_DIAL_ERROR_BYTES: usize = 4 * 1024;
const DIAL_PATH: &str = "/localapi/v0/dial";
const STATUS_PATH: &str = "/localapi/v0/status";
const RELOAD_CONFIG_PATH: &str = "/localapi/v0/reload-config";
const START_PATH: &str = "/localapi/v0/start";

#[derive(Debug, thiserror::Error)]
pub enum LocalApiError {
    #[error("cannot connect to the LocalAPI socket {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("LocalAPI {path}: HTTP exchange failed")]
    Http {
        path: String,
        #[source]
        source: hyper::Error,
    },
    #[error("LocalAPI {path}: reading the answer failed")]
    Body {
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("LocalAPI {path}: HTTP {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("LocalAPI {path}: unexpected JSON")]
    Decode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("LocalAPI {path}: building the request failed")]
    Request {
        path: String,
        #[source]
        source: http::Error,
    },
}

/// `GET /localapi/v0/status`, the fields the agent uses.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Status {
    #[serde(rename = "Version", default)]
    pub version: String,
    #[serde(rename = "BackendState", default)]
    pub backend_state: String,
    #[serde(rename = "TailscaleIPs", default)]
    pub tailscale_ips: Option<Vec<String>>,
    #[serde(rename = "Health", default)]
    pub health: Option<Vec<String>>,
}

/// `GET /localapi/v0/whois`: the node and user behind a tailnet connection.
#[derive(Clone, Debug, Deserialize)]
pub struct WhoIs {
    #[serde(rename = "Node")]
    pub node: WhoIsNode,
    #[serde(rename = "UserProfile")]
    pub user_profile: UserProfile,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct WhoIsNode {
    #[serde(rename = "Name", default)]
    pub name: String,
    /// CIDR prefixes, e.g. `100.64.0.3/32`.
    #[serde(rename = "Addresses", default)]
    pub addresses: Option<Vec<String>>,
    #[serde(rename = "Tags", default)]
    pub tags: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct UserProfile {
    #[serde(rename = "LoginName", default)]
    pub login_name: String,
    #[serde(rename = "DisplayName", default)]
    pub display_name: String,
}

/// The raw byte stream to a target that tailscaled dialed through the tailnet.
pub type TunnelStream = TokioIo<Upgraded>;

/// Why a dial did not produce a stream, as counted in metrics (`reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DialFailureReason {
    /// tailscaled answered `Dial-Self`: the target is not routed through the tailnet.
    DialSelf,
    Refused,
    Timeout,
    Error,
}

impl DialFailureReason {
    pub fn label(self) -> &'static str {
        match self {
            DialFailureReason::DialSelf => "dial_self",
            DialFailureReason::Refused => "refused",
            DialFailureReason::Timeout => "timeout",
            DialFailureReason::Error => "error",
        }
    }
}

/// How tailscaled answered a dial request, decided from the response head (and the body of
/// an error answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DialAnswer {
    Upgraded,
    DialSelf {
        addr: String,
    },
    Failed {
        reason: DialFailureReason,
        message: String,
    },
}

/// Classifies a dial answer. Pure, so each branch of the contract is unit-tested.
pub fn classify_dial_answer(status: StatusCode, headers: &HeaderMap, body: &str) -> DialAnswer {
    let header_is = |name: &str, expected: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.trim().eq_ignore_ascii_case(expected))
    };
    if status == StatusCode::SWITCHING_PROTOCOLS {
        if header_is("upgrade", "ts-dial") {
            return DialAnswer::Upgraded;
        }
        return DialAnswer::Failed {
            reason: DialFailureReason::Error,
            message: "LocalAPI switched to an unexpected protocol".into(),
        };
    }
    // Checked before anything else about a non-101 answer: whatever else the head says, a
    // Dial-Self means "not through the tailnet" and must never become a dial of our own.
    if header_is("dial-self", "true") {
        let addr = headers
            .get("dial-addr")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        return DialAnswer::DialSelf { addr };
    }
    let body = body.trim();
    let message = if body.is_empty() {
        format!("LocalAPI dial answered HTTP {}", status.as_u16())
    } else {
        format!("LocalAPI dial answered HTTP {}: {body}", status.as_u16())
    };
    let reason = if status == StatusCode::BAD_GATEWAY {
        classify_dial_error_text(body)
    } else {
        DialFailureReason::Error
    };
    DialAnswer::Failed { reason, message }
}

/// Maps tailscaled's dial error text (Go `net.OpError` around a gVisor error, or a context
/// error) to a reason.
pub fn classify_dial_error_text(text: &str) -> DialFailureReason {
    let text = text.to_ascii_lowercase();
    if text.contains("refused") {
        DialFailureReason::Refused
    } else if text.contains("timed out")
        || text.contains("timeout")
        || text.contains("deadline exceeded")
    {
        DialFailureReason::Timeout
    } else {
        DialFailureReason::Error
    }
}

/// Outcome of [`LocalApi::dial`].
pub enum Dialed {
    Tunnel(TunnelStream),
    Refused {
        reason: DialFailureReason,
        message: String,
    },
}

impl std::fmt::Debug for Dialed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dialed::Tunnel(_) => f.write_str("Tunnel"),
            Dialed::Refused { reason, message } => f
                .debug_struct("Refused")
                .field("reason", reason)
                .field("message", message)
                .finish(),
        }
    }
}

/// LocalAPI of one tailscaled. Cheap to clone; every call opens its own socket connection.
#[derive(Clone, Debug)]
pub struct LocalApi {
    socket: PathBuf,
}

impl LocalApi {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        LocalApi {
            socket: socket.into(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub async fn status(&self) -> Result<Status, LocalApiError> {
        self.get_json(STATUS_PATH).await
    }

    /// Logs in again with the pre-auth key tailscaled's config file holds now: re-reads the
    /// file (`reload-config`; the auth Secret's volume follows the Secret, so a key the
    /// operator minted after tailscaled started is in it) and starts the backend (`start`,
    /// which takes the key from the config while the node is not running). The key never
    /// passes through the agent.
    pub async fn retry_login(&self) -> Result<(), LocalApiError> {
        self.post(RELOAD_CONFIG_PATH, "").await?;
        // `start` decodes an ipn.Options; the empty one changes nothing but the login.
        self.post(START_PATH, "{}").await
    }

    /// The tailnet identity behind `addr` (`ip:port`; a loopback address with `proto=tcp`
    /// names a connection that tailscaled forwarded to a local listener). `Ok(None)` when
    /// tailscaled knows no such peer.
    pub async fn whois(&self, addr: &str) -> Result<Option<WhoIs>, LocalApiError> {
        let path = format!("/localapi/v0/whois?proto=tcp&addr={}", query_escape(addr));
        match self.get_json(&path).await {
            Ok(whois) => Ok(Some(whois)),
            Err(LocalApiError::Status { status: 404, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `GET /localapi/v0/dns-query`: the addresses tailscaled's own resolver has for `name`
    /// (MagicDNS, Headscale's extra records, and split DNS: Headscale's
    /// `dns.nameservers.split` resolvers, asked through the tailnet). `ipv6` picks AAAA over
    /// A. Empty when it has none (NXDOMAIN, no answer).
    pub async fn resolve(
        &self,
        name: &str,
        ipv6: bool,
    ) -> Result<Vec<std::net::IpAddr>, LocalApiError> {
        #[derive(Deserialize)]
        struct DnsQueryResponse {
            // Go encodes []byte as base64.
            #[serde(rename = "Bytes", default)]
            bytes: Option<String>,
        }
        let kind = if ipv6 { "AAAA" } else { "A" };
        let path = format!(
            "/localapi/v0/dns-query?name={}&type={kind}",
            query_escape(name)
        );
        let response: DnsQueryResponse = self.get_json(&path).await?;
        Ok(response
            .bytes
            .and_then(|b| base64_decode(&b))
            .and_then(|message| dns_addresses(&message))
            .unwrap_or_default())
    }

    /// Asks tailscaled to connect to `host:port` through the tailnet, within `timeout`
    /// (a dial that the ACL drops hangs until then). Only a `101` yields a stream;
    /// `Dial-Self`, dial errors and timeouts come back as [`Dialed::Refused`], transport
    /// problems with the socket as `Err`.
    pub async fn dial(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<Dialed, LocalApiError> {
        match tokio::time::timeout(timeout, self.dial_unbounded(host, port)).await {
            Ok(result) => result,
            Err(_) => Ok(Dialed::Refused {
                reason: DialFailureReason::Timeout,
                message: format!("no connection within {}s", timeout.as_secs_f32()),
            }),
        }
    }

    async fn dial_unbounded(&self, host: &str, port: u16) -> Result<Dialed, LocalApiError> {
        let request = Request::post(DIAL_PATH)
            .header(header::HOST, LOCALAPI_HOST)
            .header("Sec-Tailscale", "localapi")
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "ts-dial")
            .header("Dial-Host", host)
            .header("Dial-Port", port.to_string())
            .header("Dial-Network", "tcp")
            .body(Empty::<Bytes>::new())
            .map_err(|source| LocalApiError::Request {
                path: DIAL_PATH.into(),
                source,
            })?;
        let mut sender = self.handshake(DIAL_PATH, true).await?;
        let mut response =
            sender
                .send_request(request)
                .await
                .map_err(|source| LocalApiError::Http {
                    path: DIAL_PATH.into(),
                    source,
                })?;
        let status = response.status();
        let headers = response.headers().clone();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            if let DialAnswer::Failed { reason, message } =
                classify_dial_answer(status, &headers, "")
            {
                return Ok(Dialed::Refused { reason, message });
            }
            let upgraded =
                hyper::upgrade::on(&mut response)
                    .await
                    .map_err(|source| LocalApiError::Http {
                        path: DIAL_PATH.into(),
                        source,
                    })?;
            return Ok(Dialed::Tunnel(TokioIo::new(upgraded)));
        }
        // The error body is only for the message; a body that cannot be read changes nothing.
        let body = Limited::new(response.into_body(), MAX_DIAL_ERROR_BYTES)
            .collect()
            .await
            .map(|collected| String::from_utf8_lossy(&collected.to_bytes()).into_owned())
            .unwrap_or_default();
        match classify_dial_answer(status, &headers, &body) {
            DialAnswer::DialSelf { addr } => Ok(Dialed::Refused {
                reason: DialFailureReason::DialSelf,
                message: format!(
                    "tailscaled answered Dial-Self ({addr}): the target is not routed through the tailnet"
                ),
            }),
            DialAnswer::Failed { reason, message } => Ok(Dialed::Refused { reason, message }),
            DialAnswer::Upgraded => Ok(Dialed::Refused {
                reason: DialFailureReason::Error,
                message: "LocalAPI answered an upgrade without switching protocols".into(),
            }),
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, LocalApiError> {
        let request = Request::get(path)
            .header(header::HOST, LOCALAPI_HOST)
            .header("Sec-Tailscale", "localapi")
            .body(Empty::<Bytes>::new())
            .map_err(|source| LocalApiError::Request {
                path: path.into(),
                source,
            })?;
        let mut sender = self.handshake(path, false).await?;
        let response =
            sender
                .send_request(request)
                .await
                .map_err(|source| LocalApiError::Http {
                    path: path.into(),
                    source,
                })?;
        let body = answer(path, response, MAX_ANSWER_BYTES, |s| s == StatusCode::OK).await?;
        serde_json::from_slice(&body).map_err(|source| LocalApiError::Decode {
            path: path.into(),
            source,
        })
    }

    /// `POST path` with `body`; any 2xx is success.
    async fn post(&self, path: &str, body: &'static str) -> Result<(), LocalApiError> {
        let request = Request::post(path)
            .header(header::HOST, LOCALAPI_HOST)
            .header("Sec-Tailscale", "localapi")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .map_err(|source| LocalApiError::Request {
                path: path.into(),
                source,
            })?;
        let mut sender = self.handshake(path, false).await?;
        let response =
            sender
                .send_request(request)
                .await
                .map_err(|source| LocalApiError::Http {
                    path: path.into(),
                    source,
                })?;
        answer(path, response, MAX_DIAL_ERROR_BYTES, |s| s.is_success()).await?;
        Ok(())
    }

    async fn handshake<B>(
        &self,
        path: &str,
        with_upgrades: bool,
    ) -> Result<hyper::client::conn::http1::SendRequest<B>, LocalApiError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| LocalApiError::Connect {
                    socket: self.socket.clone(),
                    source,
                })?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| LocalApiError::Http {
                path: path.into(),
                source,
            })?;
        if with_upgrades {
            tokio::spawn(async move {
                // Errors surface on the request future; the connection itself has no one to
                // report to.
                let _ = connection.with_upgrades().await;
            });
        } else {
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
        Ok(sender)
    }
}

/// The body of a LocalAPI answer (at most `limit` bytes) whose status `accepted`; else the
/// status with the start of the body as the error.
async fn answer(
    path: &str,
    response: http::Response<hyper::body::Incoming>,
    limit: usize,
    accepted: fn(StatusCode) -> bool,
) -> Result<Bytes, LocalApiError> {
    let status = response.status();
    let body = Limited::new(response.into_body(), limit)
        .collect()
        .await
        .map_err(|source| LocalApiError::Body {
            path: path.into(),
            source,
        })?
        .to_bytes();
    if !accepted(status) {
        return Err(LocalApiError::Status {
            path: path.into(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(512)
                .collect(),
        });
    }
    Ok(body)
}

/// Percent-encodes everything but unreserved characters (for `whois?addr=`).
/// Standard base64 (with or without padding); `None` on any other character.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xFF).ok()?);
        }
    }
    Some(out)
}

/// The A and AAAA records in the answer section of a DNS response; `None` if truncated.
fn dns_addresses(message: &[u8]) -> Option<Vec<std::net::IpAddr>> {
    let read_u16 = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes([
            *message.get(at)?,
            *message.get(at + 1)?,
        ]))
    };
    let skip_name = |mut at: usize| -> Option<usize> {
        loop {
            let length = *message.get(at)?;
            match length {
                0 => return Some(at + 1),
                // A compression pointer ends the name.
                _ if length & 0xC0 == 0xC0 => return Some(at + 2),
                _ => at += 1 + usize::from(length),
            }
        }
    };
    let mut at = 12;
    for _ in 0..read_u16(4)? {
        at = skip_name(at)? + 4; // type, class
    }
    let mut addresses = Vec::new();
    for _ in 0..read_u16(6)? {
        at = skip_name(at)?;
        let record_type = read_u16(at)?;
        let data_len = usize::from(read_u16(at + 8)?); // after type, class, ttl
        let data = message.get(at + 10..at + 10 + data_len)?;
        match record_type {
            1 => addresses.push(std::net::IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
            28 => addresses.push(std::net::IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => {}
        }
        at += 10 + data_len;
    }
    Some(addresses)
}

fn query_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            escaped.push(char::from(byte));
        } else {
            escaped.push_str(&format!("%{byte:02X}"));
        }
    }
    escaped
}

/// Parses `major.minor` from a tailscale version string such as `1.102.5` or
/// `1.98.0-t1234abc-g5678`.
pub fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// First tailscaled release whose dial endpoint answers `Dial-Self` instead of dialing a
/// non-tailnet target from the host's own network (tailscale commit 0e10a3f58, v1.98.0).
pub const MIN_DIAL_SELF_VERSION: (u32, u32) = (1, 98);

/// Whether a tailscaled of this version answers `Dial-Self`; unknown versions do not count.
pub fn supports_dial_self(version: &str) -> bool {
    parse_version(version).is_some_and(|version| version >= MIN_DIAL_SELF_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn switching_protocols_to_ts_dial_is_a_stream() {
        assert_eq!(
            classify_dial_answer(
                StatusCode::SWITCHING_PROTOCOLS,
                &headers(&[("upgrade", "ts-dial"), ("connection", "upgrade")]),
                ""
            ),
            DialAnswer::Upgraded
        );
        assert!(matches!(
            classify_dial_answer(
                StatusCode::SWITCHING_PROTOCOLS,
                &headers(&[("upgrade", "websocket")]),
                ""
            ),
            DialAnswer::Failed {
                reason: DialFailureReason::Error,
                ..
            }
        ));
    }

    #[test]
    fn dial_self_is_recognised_with_and_without_addr() {
        assert_eq!(
            classify_dial_answer(
                StatusCode::OK,
                &headers(&[("dial-self", "true"), ("dial-addr", "10.96.0.1:443")]),
                ""
            ),
            DialAnswer::DialSelf {
                addr: "10.96.0.1:443".into()
            }
        );
        // Without Dial-Addr (the Go client calls that an error) it is still not a tailnet dial.
        assert_eq!(
            classify_dial_answer(StatusCode::OK, &headers(&[("Dial-Self", "TRUE")]), ""),
            DialAnswer::DialSelf {
                addr: String::new()
            }
        );
    }

    #[test]
    fn a_plain_200_is_not_a_stream() {
        assert!(matches!(
            classify_dial_answer(StatusCode::OK, &HeaderMap::new(), ""),
            DialAnswer::Failed {
                reason: DialFailureReason::Error,
                ..
            }
        ));
    }

    #[test]
    fn dial_errors_are_classified_from_tailscaleds_text() {
        let cases = [
            (
                "dial failure: connect tcp 192.0.2.10:5432: connection was refused",
                DialFailureReason::Refused,
            ),
            (
                "dial failure: connect tcp 192.0.2.10:5432: operation timed out",
                DialFailureReason::Timeout,
            ),
            (
                "dial failure: context deadline exceeded",
                DialFailureReason::Timeout,
            ),
            (
                "dial failure: connect tcp 192.0.2.10:5432: no route to host",
                DialFailureReason::Error,
            ),
            (
                "resolve failure: lookup db.example: no such host",
                DialFailureReason::Error,
            ),
        ];
        for (body, reason) in cases {
            match classify_dial_answer(StatusCode::BAD_GATEWAY, &HeaderMap::new(), body) {
                DialAnswer::Failed {
                    reason: got,
                    message,
                } => {
                    assert_eq!(got, reason, "{body}");
                    assert!(message.contains(body), "{message}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(matches!(
            classify_dial_answer(
                StatusCode::BAD_REQUEST,
                &HeaderMap::new(),
                "missing Dial-Host"
            ),
            DialAnswer::Failed {
                reason: DialFailureReason::Error,
                ..
            }
        ));
    }

    #[test]
    fn versions_gate_dial_self_support() {
        assert!(supports_dial_self("1.98.0"));
        assert!(supports_dial_self("1.102.5-t0e10a3f58-gabc"));
        assert!(supports_dial_self("2.0.0"));
        assert!(!supports_dial_self("1.96.4"));
        assert!(!supports_dial_self(""));
        assert!(!supports_dial_self("garbage"));
    }

    #[test]
    fn escapes_addresses_for_the_query_string() {
        assert_eq!(query_escape("127.0.0.1:4242"), "127.0.0.1%3A4242");
        assert_eq!(query_escape("[fd7a::1]:80"), "%5Bfd7a%3A%3A1%5D%3A80");
    }
}

#[cfg(test)]
mod dns_query_tests {
    use super::*;

    #[test]
    fn base64_and_dns_answers_decode() {
        assert_eq!(base64_decode("aGk=").as_deref(), Some(&b"hi"[..]));
        assert_eq!(base64_decode("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(base64_decode("a!"), None);
        // One question (db.x, A) and two answers: A 192.0.2.10 and AAAA fd00::10.
        let mut m = vec![0, 1, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0];
        m.extend_from_slice(&[2, b'd', b'b', 1, b'x', 0, 0, 1, 0, 1]);
        m.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 10]);
        m.extend_from_slice(&[0xC0, 12, 0, 28, 0, 1, 0, 0, 0, 30, 0, 16]);
        m.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        let ips = dns_addresses(&m).expect("answers");
        assert_eq!(
            ips,
            vec![
                "192.0.2.10".parse::<std::net::IpAddr>().expect("ip"),
                "fd00::10".parse().expect("ip")
            ]
        );
        assert_eq!(dns_addresses(&m[..m.len() - 1]), None);
    }
}
