//! A small async client for tailscaled's LocalAPI over its unix socket (HTTP/1.1 by hand: the
//! dial endpoint hijacks the connection after `101 Switching Protocols`).

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine as _;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::UnixStream;

/// tailscaled rejects LocalAPI requests with any other Host header.
const LOCAL_API_HOST: &str = "local-tailscaled.sock";
/// Upper bound for a response head; LocalAPI heads are a few hundred bytes.
const MAX_HEAD_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum LocalApiError {
    #[error("cannot connect to the LocalAPI at {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("LocalAPI {path}: I/O error")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("LocalAPI {path}: malformed response: {detail}")]
    Malformed { path: String, detail: String },
    #[error("LocalAPI {path}: HTTP {status}: {body}")]
    Status {
        path: String,
        status: u16,
        body: String,
    },
    #[error("LocalAPI {path}: unexpected JSON: {body}")]
    Decode {
        path: String,
        body: String,
        #[source]
        source: serde_json::Error,
    },
}

/// LocalAPI of one tailscaled.
#[derive(Clone, Debug)]
pub struct LocalApi {
    socket: PathBuf,
}

/// `GET /localapi/v0/status` (the fields the tests use).
#[derive(Clone, Debug, Deserialize)]
pub struct Status {
    #[serde(rename = "Version", default)]
    pub version: String,
    #[serde(rename = "BackendState", default)]
    pub backend_state: String,
    #[serde(rename = "TailscaleIPs", default)]
    pub tailscale_ips: Option<Vec<String>>,
    #[serde(rename = "Self", default)]
    pub self_node: Option<PeerStatus>,
    #[serde(rename = "Peer", default)]
    pub peers: Option<HashMap<String, PeerStatus>>,
    #[serde(rename = "Health", default)]
    pub health: Option<Vec<String>>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PeerStatus {
    #[serde(rename = "ID", default)]
    pub id: String,
    #[serde(rename = "HostName", default)]
    pub host_name: String,
    #[serde(rename = "DNSName", default)]
    pub dns_name: String,
    #[serde(rename = "TailscaleIPs", default)]
    pub tailscale_ips: Option<Vec<String>>,
    #[serde(rename = "Online", default)]
    pub online: bool,
    #[serde(rename = "Tags", default)]
    pub tags: Option<Vec<String>>,
    #[serde(rename = "PrimaryRoutes", default)]
    pub primary_routes: Option<Vec<String>>,
}

/// `GET /localapi/v0/whois`: who is behind a tailnet address.
#[derive(Clone, Debug, Deserialize)]
pub struct WhoIs {
    #[serde(rename = "Node")]
    pub node: WhoIsNode,
    #[serde(rename = "UserProfile")]
    pub user_profile: UserProfile,
}

#[derive(Clone, Debug, Deserialize)]
pub struct WhoIsNode {
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Addresses", default)]
    pub addresses: Option<Vec<String>>,
    #[serde(rename = "Tags", default)]
    pub tags: Option<Vec<String>>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct UserProfile {
    #[serde(rename = "LoginName", default)]
    pub login_name: String,
    #[serde(rename = "DisplayName", default)]
    pub display_name: String,
}

/// Outcome of [`LocalApi::dial`].
#[derive(Debug)]
pub enum Dialed {
    /// tailscaled connected to the target through the tailnet; the stream carries the bytes.
    Tailnet(DialedStream),
    /// tailscaled answered `Dial-Self`: the target is not routed through the tailnet. The
    /// caller must not dial `addr` itself if traffic has to stay on the tailnet.
    DialSelf { addr: String },
}

/// A byte stream to a tailnet target, tunnelled through the LocalAPI socket.
#[derive(Debug)]
pub struct DialedStream {
    // Keeps bytes that arrived together with the 101 response head.
    inner: BufReader<UnixStream>,
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
        self.get_json("/localapi/v0/status").await
    }

    /// Identifies the peer behind `addr` (`ip` or `ip:port`); with `proto = Some("tcp")` and a
    /// loopback `addr`, a connection that tailscaled forwarded to a local listener. `Ok(None)`
    /// when tailscaled knows no such peer.
    pub async fn whois(
        &self,
        addr: &str,
        proto: Option<&str>,
    ) -> Result<Option<WhoIs>, LocalApiError> {
        let mut path = format!("/localapi/v0/whois?addr={}", query_escape(addr));
        if let Some(proto) = proto {
            path.push_str(&format!("&proto={}", query_escape(proto)));
        }
        match self.get_json(&path).await {
            Ok(whois) => Ok(Some(whois)),
            Err(LocalApiError::Status { status: 404, .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `GET /localapi/v0/dns-query`: asks tailscaled's own resolver (MagicDNS, Headscale's
    /// extra records) for the IPv4 addresses of `name`. Empty when it has none.
    pub async fn resolve_ipv4(&self, name: &str) -> Result<Vec<Ipv4Addr>, LocalApiError> {
        #[derive(Deserialize)]
        struct DnsQueryResponse {
            // Go encodes []byte as base64.
            #[serde(rename = "Bytes", default)]
            bytes: Option<String>,
        }
        let path = format!("/localapi/v0/dns-query?name={}&type=A", query_escape(name));
        let response: DnsQueryResponse = self.get_json(&path).await?;
        let malformed = |detail: String| LocalApiError::Malformed {
            path: path.clone(),
            detail,
        };
        let Some(encoded) = response.bytes else {
            return Ok(Vec::new());
        };
        let message = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| malformed(format!("DNS answer is not base64: {e}")))?;
        dns_a_records(&message).ok_or_else(|| malformed("truncated DNS answer".into()))
    }

    /// `POST /localapi/v0/dial` with `Upgrade: ts-dial`: a TCP connection to `host:port`
    /// made by tailscaled through the tailnet. Does not time out by itself (a dial the ACL
    /// drops hangs): wrap it in `tokio::time::timeout`.
    pub async fn dial(&self, host: &str, port: u16) -> Result<Dialed, LocalApiError> {
        let path = "/localapi/v0/dial";
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {LOCAL_API_HOST}\r\nConnection: upgrade\r\n\
             Upgrade: ts-dial\r\nDial-Host: {host}\r\nDial-Port: {port}\r\n\
             Dial-Network: tcp\r\nContent-Length: 0\r\n\r\n"
        );
        let mut stream = self.connect().await?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|source| io_error(path, source))?;
        let mut reader = BufReader::new(stream);
        let head = read_head(&mut reader, path).await?;
        if head.status == 101 {
            return Ok(Dialed::Tailnet(DialedStream { inner: reader }));
        }
        if head.status == 200 && head.header("dial-self") == Some("true") {
            let addr = head.header("dial-addr").unwrap_or_default().to_owned();
            return Ok(Dialed::DialSelf { addr });
        }
        let body = read_body(&mut reader, &head, path)
            .await
            .unwrap_or_default();
        Err(LocalApiError::Status {
            path: path.to_owned(),
            status: head.status,
            body: String::from_utf8_lossy(&body).trim().to_owned(),
        })
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, LocalApiError> {
        // HTTP/1.0 so the body is neither chunked nor kept alive: read to EOF.
        let request = format!("GET {path} HTTP/1.0\r\nHost: {LOCAL_API_HOST}\r\n\r\n");
        let mut stream = self.connect().await?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|source| io_error(path, source))?;
        let mut reader = BufReader::new(stream);
        let head = read_head(&mut reader, path).await?;
        let body = read_body(&mut reader, &head, path).await?;
        let body = String::from_utf8_lossy(&body).into_owned();
        if head.status != 200 {
            return Err(LocalApiError::Status {
                path: path.to_owned(),
                status: head.status,
                body: body.trim().to_owned(),
            });
        }
        serde_json::from_str(&body).map_err(|source| LocalApiError::Decode {
            path: path.to_owned(),
            body,
            source,
        })
    }

    async fn connect(&self) -> Result<UnixStream, LocalApiError> {
        UnixStream::connect(&self.socket)
            .await
            .map_err(|source| LocalApiError::Connect {
                socket: self.socket.clone(),
                source,
            })
    }
}

struct ResponseHead {
    status: u16,
    headers: Vec<(String, String)>,
}

impl ResponseHead {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

async fn read_head(
    reader: &mut BufReader<UnixStream>,
    path: &str,
) -> Result<ResponseHead, LocalApiError> {
    let malformed = |detail: String| LocalApiError::Malformed {
        path: path.to_owned(),
        detail,
    };
    let mut line = String::new();
    let mut head_bytes = 0;
    let mut status = None;
    let mut headers = Vec::new();
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .await
            .map_err(|source| io_error(path, source))?;
        head_bytes += read;
        if read == 0 {
            return Err(malformed(
                "connection closed inside the response head".into(),
            ));
        }
        if head_bytes > MAX_HEAD_BYTES {
            return Err(malformed("response head too large".into()));
        }
        let trimmed = line.trim_end_matches(['\r', '\n']);
        if status.is_none() {
            // "HTTP/1.1 101 Switching Protocols"
            let code = trimmed
                .split_whitespace()
                .nth(1)
                .and_then(|code| code.parse::<u16>().ok())
                .ok_or_else(|| malformed(format!("bad status line {trimmed:?}")))?;
            status = Some(code);
            continue;
        }
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    let status = status.ok_or_else(|| malformed("no status line".into()))?;
    Ok(ResponseHead { status, headers })
}

/// Reads a body delimited by Content-Length, or by EOF when there is none.
async fn read_body(
    reader: &mut BufReader<UnixStream>,
    head: &ResponseHead,
    path: &str,
) -> Result<Vec<u8>, LocalApiError> {
    let mut body = Vec::new();
    match head
        .header("content-length")
        .and_then(|value| value.parse::<u64>().ok())
    {
        Some(length) => {
            reader
                .take(length)
                .read_to_end(&mut body)
                .await
                .map_err(|source| io_error(path, source))?;
        }
        None => {
            reader
                .read_to_end(&mut body)
                .await
                .map_err(|source| io_error(path, source))?;
        }
    }
    Ok(body)
}

fn io_error(path: &str, source: io::Error) -> LocalApiError {
    LocalApiError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The A records in the answer section of a DNS response; `None` if it is truncated.
fn dns_a_records(message: &[u8]) -> Option<Vec<Ipv4Addr>> {
    const HEADER_LEN: usize = 12;
    const TYPE_A: u16 = 1;
    let read_u16 = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes([
            *message.get(at)?,
            *message.get(at + 1)?,
        ]))
    };
    let question_count = read_u16(4)?;
    let answer_count = read_u16(6)?;
    let mut at = HEADER_LEN;
    for _ in 0..question_count {
        at = skip_name(message, at)? + 4; // type, class
    }
    let mut addresses = Vec::new();
    for _ in 0..answer_count {
        at = skip_name(message, at)?;
        let record_type = read_u16(at)?;
        let data_len = usize::from(read_u16(at + 8)?); // after type, class, ttl
        let data = message.get(at + 10..at + 10 + data_len)?;
        if record_type == TYPE_A
            && let Ok(octets) = <[u8; 4]>::try_from(data)
        {
            addresses.push(Ipv4Addr::from(octets));
        }
        at += 10 + data_len;
    }
    Some(addresses)
}

/// Offset just past a (possibly compressed) domain name starting at `at`.
fn skip_name(message: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let length = *message.get(at)?;
        match length {
            0 => return Some(at + 1),
            // A compression pointer ends the name.
            _ if length & 0xC0 == 0xC0 => return Some(at + 2),
            _ => at += 1 + usize::from(length),
        }
    }
}

/// Percent-encodes everything but unreserved characters.
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

impl AsyncRead for DialedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for DialedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_records_with_compressed_names() {
        let message = [
            0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0, // header: 1 question, 1 answer
            2, b'd', b'b', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1, // db.test A IN
            0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 100, 64, 0, 9, // pointer, A, 100.64.0.9
        ];
        assert_eq!(
            dns_a_records(&message),
            Some(vec![Ipv4Addr::new(100, 64, 0, 9)])
        );
        assert_eq!(dns_a_records(&message[..30]), None);
    }

    #[test]
    fn escapes_addresses_for_the_query_string() {
        assert_eq!(query_escape("127.0.0.1:4242"), "127.0.0.1%3A4242");
        assert_eq!(query_escape("fd7a::1"), "fd7a%3A%3A1");
    }
}
