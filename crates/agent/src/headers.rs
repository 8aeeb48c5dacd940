//! Header handling of the reverse proxy. Pure functions on `HeaderMap`s.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::localapi::WhoIs;

/// Hop-by-hop headers (RFC 9110 §7.6.1 plus the legacy ones proxies strip). Names, not
/// strings: removing by `&str` parses the name again for every request.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

pub const USER_LOGIN: &str = "tailscale-user-login";
pub const USER_NAME: &str = "tailscale-user-name";
pub const NODE_NAME: &str = "tailscale-node-name";

/// The tailnet peer behind a connection, from LocalAPI whois.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    pub tailnet_ip: Option<IpAddr>,
    pub node_name: String,
    /// Tagged nodes carry no user identity (Tailscale's own `serve` sets none for them).
    pub tagged: bool,
    pub login_name: String,
    pub display_name: String,
}

impl PeerIdentity {
    pub fn from_whois(whois: &WhoIs) -> Self {
        let tailnet_ip = whois
            .node
            .addresses
            .iter()
            .flatten()
            .filter_map(|prefix| prefix.split('/').next())
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            // IPv4 first: that is what X-Forwarded-For consumers usually expect.
            .min_by_key(|ip| ip.is_ipv6());
        let tagged = whois
            .node
            .tags
            .as_ref()
            .is_some_and(|tags| !tags.is_empty());
        PeerIdentity {
            tailnet_ip,
            node_name: whois.node.name.trim_end_matches('.').to_owned(),
            tagged,
            login_name: whois.user_profile.login_name.clone(),
            display_name: whois.user_profile.display_name.clone(),
        }
    }

    /// For the access log: the user's login, or the node name of a tagged node.
    pub fn describe(&self) -> String {
        if self.tagged || self.login_name.is_empty() {
            self.node_name.clone()
        } else {
            self.login_name.clone()
        }
    }
}

/// Removes hop-by-hop headers, including those the `Connection` header names. Returns
/// whether the client asked for trailers (`TE: trailers`), which is end-to-end meaningful.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // Most messages carry none: one pass over the names (a compare each) instead of a hashed
    // lookup per hop-by-hop name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return false;
    }
    let wants_trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("trailers"));
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    wants_trailers
}

/// An HTTP/1.1 WebSocket upgrade request. Other upgrade protocols (notably `h2c`, a request
/// smuggling vector) are not tunnelled.
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let websocket = headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("websocket"));
    connection_upgrade && websocket
}

/// More than one `Host` line: RFC 9112 §3.2 requires a 400, and which of them a router and a
/// backend pick is exactly what request smuggling exploits.
pub fn has_conflicting_host(headers: &HeaderMap) -> bool {
    headers.get_all(header::HOST).iter().nth(1).is_some()
}

/// Client-address headers that other proxies, load balancers and CDNs set and that backends
/// (frameworks' "real IP" middlewares, rate limiters, audit logs) commonly trust. The agent
/// sets none of them, so a client's own value is always a forgery.
const CLIENT_ADDRESS_HEADERS: [&str; 20] = [
    "forwarded",
    "forwarded-for",
    "x-real-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "cf-connecting-ipv6",
    "x-client-ip",
    "x-cluster-client-ip",
    "fastly-client-ip",
    "x-original-forwarded-for",
    "x-originating-ip",
    "x-remote-ip",
    "x-remote-addr",
    "client-ip",
    "x-proxyuser-ip",
    "wl-proxy-client-ip",
    "proxy-client-ip",
    "x-envoy-external-address",
    "akamai-client-ip",
    "x-appengine-user-ip",
];

/// Removes every header a client could use to impersonate a tailnet identity or another
/// client address: all `Tailscale-*`, `X-Forwarded-*`, `Forwarded`, the client-IP headers of
/// common proxies and CDNs ([`CLIENT_ADDRESS_HEADERS`]) and any other `*-client-ip`/
/// `*-clientip` header.
pub fn strip_client_identity(headers: &mut HeaderMap) {
    let spoofable: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            let name = name.as_str();
            name.starts_with("tailscale-")
                || name.starts_with("x-forwarded-")
                || name.ends_with("-client-ip")
                || name.ends_with("-clientip")
                || CLIENT_ADDRESS_HEADERS.contains(&name)
        })
        .cloned()
        .collect();
    for name in spoofable {
        headers.remove(name);
    }
}

/// Sets `X-Forwarded-For/-Proto/-Host` (replacing, not appending: the agent is the first hop
/// that can vouch for anything) and the identity headers for user-owned nodes.
pub fn set_forwarded_and_identity(
    headers: &mut HeaderMap,
    client_ip: IpAddr,
    original_host: &str,
    identity: Option<&PeerIdentity>,
) {
    let forwarded = ForwardedHeaders::new(client_ip, identity);
    forwarded.apply(headers, HeaderValue::from_str(original_host).ok());
}

/// The headers [`set_forwarded_and_identity`] sets that depend only on the connection (client
/// address and tailnet identity), encoded once per connection rather than once per request.
#[derive(Clone, Debug, Default)]
pub struct ForwardedHeaders {
    values: Vec<(HeaderName, HeaderValue)>,
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

impl ForwardedHeaders {
    /// For a TLS-terminating listener (`X-Forwarded-Proto: https`).
    pub fn new(client_ip: IpAddr, identity: Option<&PeerIdentity>) -> Self {
        Self::with_proto(client_ip, identity, "https")
    }

    /// `proto` is the listener's scheme (`http` for plain HTTP listeners).
    pub fn with_proto(client_ip: IpAddr, identity: Option<&PeerIdentity>, proto: &str) -> Self {
        let mut forwarded = ForwardedHeaders::default();
        forwarded.push(X_FORWARDED_FOR, &client_ip.to_string());
        forwarded.push(X_FORWARDED_PROTO, proto);
        let Some(identity) = identity else {
            return forwarded;
        };
        if !identity.node_name.is_empty() {
            forwarded.push(
                HeaderName::from_static(NODE_NAME),
                &encode_header_value(&identity.node_name),
            );
        }
        if !identity.tagged && !identity.login_name.is_empty() {
            forwarded.push(
                HeaderName::from_static(USER_LOGIN),
                &encode_header_value(&identity.login_name),
            );
            forwarded.push(
                HeaderName::from_static(USER_NAME),
                &encode_header_value(&identity.display_name),
            );
        }
        forwarded
    }

    fn push(&mut self, name: HeaderName, value: &str) {
        // Values were made header-safe above; one that still is not is left out rather than
        // sent mangled.
        if let Ok(value) = HeaderValue::from_str(value) {
            self.values.push((name, value));
        }
    }

    /// Sets the connection's headers and `X-Forwarded-Host` (the Host the client asked for;
    /// left out when there is none usable).
    pub fn apply(&self, headers: &mut HeaderMap, original_host: Option<HeaderValue>) {
        for (name, value) in &self.values {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(host) = original_host {
            headers.insert(X_FORWARDED_HOST, host);
        }
    }
}

/// ASCII stays as is; other UTF-8 becomes an RFC 2047 `Q` encoded word (as Tailscale's
/// `serve` does), so names like "Jürgen" survive header transport.
pub fn encode_header_value(value: &str) -> String {
    let printable_ascii = value.bytes().all(|b| (0x20..0x7f).contains(&b));
    if printable_ascii {
        return value.to_owned();
    }
    let mut encoded = String::from("=?utf-8?q?");
    for byte in value.bytes() {
        match byte {
            b' ' => encoded.push('_'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'!' | b'*' | b'+' | b'-' | b'/' => {
                encoded.push(char::from(byte))
            }
            _ => encoded.push_str(&format!("={byte:02X}")),
        }
    }
    encoded.push_str("?=");
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::localapi::{UserProfile, WhoIsNode};

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(name, value);
            }
        }
        headers
    }

    #[test]
    fn hop_by_hop_headers_go_including_those_named_by_connection() {
        let mut headers = map(&[
            ("connection", "keep-alive, x-secret-hop"),
            ("keep-alive", "timeout=5"),
            ("x-secret-hop", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip, trailers"),
            ("proxy-authorization", "Basic abc"),
            ("content-encoding", "gzip"),
            ("range", "bytes=0-9"),
            ("trailer", "x-checksum"),
        ]);
        assert!(remove_hop_by_hop(&mut headers), "TE: trailers is noticed");
        let mut left: Vec<&str> = headers.keys().map(|name| name.as_str()).collect();
        left.sort();
        assert_eq!(left, ["content-encoding", "range", "trailer"]);
        assert!(!remove_hop_by_hop(&mut map(&[("te", "gzip")])));
    }

    #[test]
    fn only_websocket_upgrades_are_tunnelled() {
        assert!(is_websocket_upgrade(&map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!is_websocket_upgrade(&map(&[
            ("connection", "upgrade"),
            ("upgrade", "h2c")
        ])));
        assert!(!is_websocket_upgrade(&map(&[("upgrade", "websocket")])));
    }

    #[test]
    fn a_second_host_line_conflicts() {
        assert!(!has_conflicting_host(&map(&[("host", "a.test")])));
        assert!(!has_conflicting_host(&map(&[])));
        assert!(has_conflicting_host(&map(&[
            ("host", "a.test"),
            ("host", "b.test")
        ])));
        // Identical lines too: the request is malformed either way.
        assert!(has_conflicting_host(&map(&[
            ("host", "a.test"),
            ("host", "a.test")
        ])));
    }

    #[test]
    fn client_supplied_identity_is_replaced() {
        let mut headers = map(&[
            ("Tailscale-User-Login", "admin@example.com"),
            ("tailscale-anything", "x"),
            ("X-Forwarded-For", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
            ("accept", "*/*"),
        ]);
        strip_client_identity(&mut headers);
        let identity = PeerIdentity {
            tailnet_ip: "100.64.0.3".parse().ok(),
            node_name: "laptop.lab.example.net".into(),
            tagged: false,
            login_name: "alice@".into(),
            display_name: "Alice Jürgens".into(),
        };
        let client_ip = identity.tailnet_ip.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        set_forwarded_and_identity(
            &mut headers,
            client_ip,
            "portal.example.net",
            Some(&identity),
        );
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("<none>")
                .to_owned()
        };
        assert_eq!(get("x-forwarded-for"), "100.64.0.3");
        assert_eq!(get("x-forwarded-proto"), "https");
        assert_eq!(get("x-forwarded-host"), "portal.example.net");
        assert_eq!(get(USER_LOGIN), "alice@");
        assert_eq!(get(USER_NAME), "=?utf-8?q?Alice_J=C3=BCrgens?=");
        assert_eq!(get("tailscale-anything"), "<none>");
        assert_eq!(get("forwarded"), "<none>");
        assert_eq!(get("accept"), "*/*");
    }

    #[test]
    fn client_ip_headers_of_other_proxies_and_cdns_are_stripped() {
        let spoofed = [
            "X-Real-IP",
            "True-Client-IP",
            "CF-Connecting-IP",
            "CF-Connecting-IPv6",
            "X-Client-IP",
            "X-Cluster-Client-IP",
            "Fastly-Client-IP",
            "Forwarded",
            "Forwarded-For",
            "X-Original-Forwarded-For",
            "X-Originating-IP",
            "X-Remote-IP",
            "X-Remote-Addr",
            "Client-IP",
            "X-ProxyUser-IP",
            "WL-Proxy-Client-IP",
            "Proxy-Client-IP",
            "X-Envoy-External-Address",
            "Akamai-Client-IP",
            "X-Azure-ClientIP",
            "X-Appengine-User-IP",
        ];
        let mut pairs: Vec<(&str, &str)> = spoofed.iter().map(|name| (*name, "10.0.0.1")).collect();
        pairs.push(("x-request-id", "abc"));
        pairs.push(("accept", "*/*"));
        let mut headers = map(&pairs);
        strip_client_identity(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(|name| name.as_str()).collect();
        left.sort();
        assert_eq!(left, ["accept", "x-request-id"]);
    }

    #[test]
    fn tagged_nodes_get_no_user_headers() {
        let mut headers = map(&[("tailscale-user-login", "spoofed")]);
        strip_client_identity(&mut headers);
        let identity = PeerIdentity {
            tailnet_ip: None,
            node_name: "ci-runner".into(),
            tagged: true,
            login_name: "tagged-devices".into(),
            display_name: "tagged-devices".into(),
        };
        set_forwarded_and_identity(
            &mut headers,
            IpAddr::from([100, 64, 0, 9]),
            "a",
            Some(&identity),
        );
        assert!(headers.get(USER_LOGIN).is_none());
        assert_eq!(
            headers.get(NODE_NAME).and_then(|v| v.to_str().ok()),
            Some("ci-runner")
        );
    }

    #[test]
    fn identity_comes_from_whois() {
        let whois = WhoIs {
            node: WhoIsNode {
                name: "laptop.lab.example.net.".into(),
                addresses: Some(vec!["fd7a:115c:a1e0::3/128".into(), "100.64.0.3/32".into()]),
                tags: None,
            },
            user_profile: UserProfile {
                login_name: "alice@".into(),
                display_name: "alice".into(),
            },
        };
        let identity = PeerIdentity::from_whois(&whois);
        assert_eq!(identity.tailnet_ip, "100.64.0.3".parse().ok());
        assert_eq!(identity.node_name, "laptop.lab.example.net");
        assert!(!identity.tagged);
        assert_eq!(identity.describe(), "alice@");
    }
}
