//! The agent's HTTP front as far as it is the agent's own code (request head parsing itself is
//! hyper's): routing by SNI/Host, Host normalisation, and the header rewriting applied to
//! every forwarded request. Input: `sni\0host\0` then `name: value\n` header lines.
//! Invariants: no panic; after rewriting, no client-supplied identity, forwarding or
//! hop-by-hop header survives, and the headers the agent sets are present.

#![no_main]

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tailnet_agent::headers::{
    PeerIdentity, encode_header_value, has_conflicting_host, is_websocket_upgrade,
    remove_hop_by_hop, set_forwarded_and_identity, strip_client_identity,
};
use tailnet_agent::routing::{RouteTable, host_without_port};
use tailnet_api::agent_config::{BackendAddress, HttpRoute};

fn table() -> RouteTable {
    let route = |name: &str, hostnames: &[&str]| HttpRoute {
        name: name.into(),
        hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
        tls: None,
        backend: Some(BackendAddress {
            host: "127.0.0.1".into(),
            port: 8080,
        }),
        backend_tls: None,
        request_timeout_seconds: None,
        backend_request_timeout_seconds: None,
        request_timeout_millis: None,
        backend_request_timeout_millis: None,
        rules: Vec::new(),
    };
    RouteTable::new(&[
        route("web", &["portal.test", "portal-alias.test"]),
        route("admin", &["admin.test"]),
        route("v6", &["fd7a::1"]),
        route("wild", &["*.wild.test"]),
    ])
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\0');
    let sni = parts.next().filter(|s| !s.is_empty());
    let host = parts.next().filter(|s| !s.is_empty());
    let lines = parts.next().unwrap_or_default();

    let table = table();
    let _ = table.select(sni, host);
    if let Some(host) = host
        && let Some(normalized) = host_without_port(host)
    {
        assert!(!normalized.is_empty());
        let _ = table.index_of(&normalized);
    }

    let mut headers = HeaderMap::new();
    for line in lines.split('\n') {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_bytes(value.trim().as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    let _ = is_websocket_upgrade(&headers);
    let _ = has_conflicting_host(&headers);
    let _ = remove_hop_by_hop(&mut headers);
    strip_client_identity(&mut headers);
    for name in headers.keys() {
        let name = name.as_str();
        assert!(
            !name.starts_with("tailscale-")
                && !name.starts_with("x-forwarded-")
                && name != "forwarded",
            "client identity header {name} survived"
        );
        assert!(
            ![
                "connection",
                "transfer-encoding",
                "te",
                "upgrade",
                "keep-alive",
                "proxy-connection"
            ]
            .contains(&name),
            "hop-by-hop header {name} survived"
        );
    }
    // Identity strings from whois are arbitrary UTF-8: they must become valid header values.
    let identity = PeerIdentity {
        tailnet_ip: "100.64.0.7".parse().ok(),
        node_name: sni.unwrap_or("node").to_owned(),
        tagged: false,
        login_name: host.unwrap_or("user@").to_owned(),
        display_name: lines.chars().take(64).collect(),
    };
    for value in [
        &identity.node_name,
        &identity.login_name,
        &identity.display_name,
    ] {
        let encoded = encode_header_value(value);
        assert!(
            HeaderValue::from_str(&encoded).is_ok() || value.contains(['\r', '\n', '\0', '\x7f']),
            "{value:?} encoded to an invalid header value {encoded:?}"
        );
    }
    set_forwarded_and_identity(
        &mut headers,
        IpAddr::from([100, 64, 0, 7]),
        host.unwrap_or("portal.test"),
        Some(&identity),
    );
    assert!(headers.contains_key("x-forwarded-for"));
    assert!(headers.contains_key("x-forwarded-proto"));
});
