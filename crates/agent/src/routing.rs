//! Virtual hosts of one `http` listener: SNI picks the route, the Host header must belong to
//! it (else 421 Misdirected Request). Pure; the TLS resolver and the proxy share it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tailnet_api::agent_config::HttpRoute;

use crate::config::normalize_hostname;

#[derive(Debug)]
pub struct RouteEntry {
    pub route: HttpRoute,
    /// Normalized (lower case, no trailing dot).
    pub hostnames: BTreeSet<String>,
}

#[derive(Clone, Debug)]
pub struct RouteTable {
    routes: Vec<Arc<RouteEntry>>,
    by_hostname: HashMap<String, usize>,
}

/// What a request's SNI and Host select.
#[derive(Clone, Debug)]
pub enum RouteDecision {
    Route(Arc<RouteEntry>),
    /// The Host is not served here, or not by the route the TLS session was opened for.
    Misdirected,
    /// No Host header and no `:authority`.
    MissingHost,
}

impl RouteTable {
    /// Routes are validated (a hostname maps to one route per port) before they get here;
    /// should two routes still claim a name, the first keeps it.
    pub fn new(routes: &[HttpRoute]) -> Self {
        let mut table = RouteTable {
            routes: Vec::with_capacity(routes.len()),
            by_hostname: HashMap::new(),
        };
        for route in routes {
            let hostnames: BTreeSet<String> = route
                .hostnames
                .iter()
                .map(|name| normalize_hostname(name))
                .collect();
            let index = table.routes.len();
            for name in &hostnames {
                table.by_hostname.entry(name.clone()).or_insert(index);
            }
            table.routes.push(Arc::new(RouteEntry {
                route: route.clone(),
                hostnames,
            }));
        }
        table
    }

    pub fn routes(&self) -> &[Arc<RouteEntry>] {
        &self.routes
    }

    /// Whether a TLS ClientHello with this SNI may be answered on this listener.
    pub fn serves(&self, server_name: &str) -> bool {
        self.by_hostname
            .contains_key(&normalize_hostname(server_name))
    }

    /// Index of the route serving `hostname`.
    pub fn index_of(&self, hostname: &str) -> Option<usize> {
        self.by_hostname.get(&normalize_hostname(hostname)).copied()
    }

    /// SNI (if the client sent one) selects the route; the Host must be one of its names.
    /// Without SNI the Host alone selects.
    pub fn select(&self, sni: Option<&str>, host: Option<&str>) -> RouteDecision {
        let Some(host) = host.and_then(host_without_port) else {
            return RouteDecision::MissingHost;
        };
        let by_host = self.by_hostname.get(&host);
        let chosen = match sni {
            Some(sni) => {
                let by_sni = self.by_hostname.get(&normalize_hostname(sni));
                match (by_sni, by_host) {
                    (Some(by_sni), Some(by_host)) if by_sni == by_host => Some(*by_sni),
                    _ => None,
                }
            }
            None => by_host.copied(),
        };
        match chosen.and_then(|index| self.routes.get(index)) {
            Some(entry) => RouteDecision::Route(entry.clone()),
            None => RouteDecision::Misdirected,
        }
    }
}

/// `Host`/`:authority` without the port, normalized; `None` for an empty or malformed value.
pub fn host_without_port(value: &str) -> Option<String> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let host = if let Some(rest) = value.strip_prefix('[') {
        // [v6]:port or [v6]
        let end = rest.find(']')?;
        &rest[..end]
    } else {
        match value.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            Some(_) => return None,
            None => value,
        }
    };
    // "." and ":443"-style values normalise to nothing: no Host, not an unknown one.
    let host = normalize_hostname(host);
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::agent_config::BackendAddress;

    fn route(name: &str, hostnames: &[&str]) -> HttpRoute {
        HttpRoute {
            name: name.into(),
            hostnames: hostnames.iter().map(|h| h.to_string()).collect(),
            backend: BackendAddress {
                host: format!("{name}.svc"),
                port: 80,
            },
            backend_tls: None,
            request_timeout_seconds: None,
            backend_request_timeout_seconds: None,
            request_timeout_millis: None,
            backend_request_timeout_millis: None,
        }
    }

    fn table() -> RouteTable {
        RouteTable::new(&[
            route(
                "web",
                &["portal.team-a.lab.example.net", "portal.lab.example.net"],
            ),
            route("admin", &["admin.team-a.lab.example.net"]),
        ])
    }

    fn chosen(decision: RouteDecision) -> String {
        match decision {
            RouteDecision::Route(entry) => entry.route.name.clone(),
            RouteDecision::Misdirected => "421".into(),
            RouteDecision::MissingHost => "400".into(),
        }
    }

    #[test]
    fn sni_selects_and_host_must_belong_to_the_same_route() {
        let table = table();
        let cases = [
            (
                Some("portal.team-a.lab.example.net"),
                Some("portal.team-a.lab.example.net"),
                "web",
            ),
            // An alias of the same route on a session opened for the main name.
            (
                Some("portal.team-a.lab.example.net"),
                Some("portal.lab.example.net:443"),
                "web",
            ),
            (
                Some("PORTAL.team-a.lab.example.net."),
                Some("Portal.Team-A.lab.example.net"),
                "web",
            ),
            // Connection coalescing must not carry a request to another route.
            (
                Some("portal.team-a.lab.example.net"),
                Some("admin.team-a.lab.example.net"),
                "421",
            ),
            (
                Some("portal.team-a.lab.example.net"),
                Some("elsewhere.example.net"),
                "421",
            ),
            (
                Some("unknown.example.net"),
                Some("portal.lab.example.net"),
                "421",
            ),
            (None, Some("admin.team-a.lab.example.net"), "admin"),
            (None, Some("100.64.0.7"), "421"),
            (Some("portal.lab.example.net"), None, "400"),
            (Some("portal.lab.example.net"), Some(""), "400"),
        ];
        for (sni, host, expected) in cases {
            assert_eq!(
                chosen(table.select(sni, host)),
                expected,
                "{sni:?} {host:?}"
            );
        }
    }

    #[test]
    fn the_handshake_accepts_only_served_names() {
        let table = table();
        assert!(table.serves("admin.team-a.lab.example.net"));
        assert!(table.serves("Portal.Lab.Example.Net."));
        assert!(!table.serves("other.example.net"));
    }

    #[test]
    fn host_values_lose_their_port() {
        assert_eq!(
            host_without_port("a.example:8443").as_deref(),
            Some("a.example")
        );
        assert_eq!(
            host_without_port("[fd7a::1]:443").as_deref(),
            Some("fd7a::1")
        );
        assert_eq!(host_without_port("[fd7a::1]").as_deref(), Some("fd7a::1"));
        assert_eq!(
            host_without_port("A.Example.").as_deref(),
            Some("a.example")
        );
        assert_eq!(host_without_port("a.example:https"), None);
        assert_eq!(host_without_port(":443"), None);
        // Found by the http_front fuzz target: a lone root dot normalised to "".
        assert_eq!(host_without_port("."), None);
        assert_eq!(host_without_port(" .:443"), None);
    }
}
