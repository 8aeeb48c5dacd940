//! Virtual hosts of one `http` or `plainHttp` listener: SNI picks the route, the Host header
//! must belong to it (else 421 Misdirected Request; plain HTTP for a Host no route serves gets
//! 404). Hostnames are exact names, `*.` wildcards or `*`; an exact name beats a wildcard, a
//! longer wildcard a shorter one, and both beat `*`. Pure; the TLS resolver, the proxy and the
//! passthrough listener share it.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tailnet_api::agent_config::HttpRoute;

use crate::config::{normalize_hostname, normalized_hostname};

/// Hostname patterns to route indexes; each lookup also names the pattern that matched
/// (a bounded metrics label, unlike the client's Host).
#[derive(Clone, Debug, Default)]
pub struct HostnameIndex {
    exact: HashMap<String, Found>,
    /// By the suffix after `*.`.
    wildcards: HashMap<String, Found>,
    any: Option<Found>,
}

#[derive(Clone, Debug)]
struct Found {
    index: usize,
    pattern: Arc<str>,
}

impl HostnameIndex {
    /// Adds `pattern` for route `index`; a pattern already present keeps its route.
    pub fn insert(&mut self, pattern: &str, index: usize) {
        let pattern = normalize_hostname(pattern);
        let found = Found {
            index,
            pattern: Arc::from(pattern.as_str()),
        };
        if pattern == "*" {
            self.any.get_or_insert(found);
        } else if let Some(suffix) = pattern.strip_prefix("*.") {
            self.wildcards.entry(suffix.to_owned()).or_insert(found);
        } else {
            self.exact.entry(pattern).or_insert(found);
        }
    }

    /// The route of an already normalized `name` and the pattern that matched: exact, then
    /// the longest wildcard suffix, then `*`.
    pub fn lookup(&self, name: &str) -> Option<(usize, &Arc<str>)> {
        let found = self.exact.get(name).or_else(|| {
            name.match_indices('.')
                .find_map(|(dot, _)| self.wildcards.get(&name[dot + 1..]))
                .or(self.any.as_ref())
        })?;
        Some((found.index, &found.pattern))
    }

    /// The route for a connection without SNI (`*` only).
    pub fn any(&self) -> Option<usize> {
        self.any.as_ref().map(|found| found.index)
    }
}

#[derive(Debug)]
pub struct RouteEntry {
    pub route: HttpRoute,
    /// Normalized (lower case, no trailing dot).
    pub hostnames: BTreeSet<String>,
}

#[derive(Clone, Debug)]
pub struct RouteTable {
    routes: Vec<Arc<RouteEntry>>,
    hostnames: HostnameIndex,
}

/// The route a request goes to, borrowed from the table (no reference count touched per
/// request: the table is shared by every connection thread).
#[derive(Clone, Debug)]
pub struct RouteChoice<'t> {
    pub entry: &'t RouteEntry,
    /// Its position in the listener's routes.
    pub index: usize,
    /// The configured hostname (or wildcard, or `*`) the Host matched.
    pub hostname: &'t Arc<str>,
}

/// What a request's SNI and Host select.
#[derive(Clone, Debug)]
pub enum RouteDecision<'t> {
    Route(RouteChoice<'t>),
    /// A TLS session opened for one route carries a Host that route does not serve
    /// (connection coalescing, or an unknown Host on a known SNI): 421.
    Misdirected,
    /// A plain-HTTP request (no SNI) for a Host no route serves: 404, as Gateway API asks of
    /// a listener whose routes do not match the request's hostname.
    UnknownHost,
    /// No Host header and no `:authority`.
    MissingHost,
}

impl RouteTable {
    /// Routes are validated (a hostname maps to one route per port) before they get here;
    /// should two routes still claim a name, the first keeps it.
    pub fn new(routes: &[HttpRoute]) -> Self {
        let mut table = RouteTable {
            routes: Vec::with_capacity(routes.len()),
            hostnames: HostnameIndex::default(),
        };
        for route in routes {
            let hostnames: BTreeSet<String> = route
                .hostnames
                .iter()
                .map(|name| normalize_hostname(name))
                .collect();
            let index = table.routes.len();
            for name in &hostnames {
                table.hostnames.insert(name, index);
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
        self.index_of(server_name).is_some()
    }

    /// Index of the route serving `hostname`.
    pub fn index_of(&self, hostname: &str) -> Option<usize> {
        self.hostnames
            .lookup(&normalized_hostname(hostname))
            .map(|(index, _)| index)
    }

    /// Index of the route serving `*` (what a ClientHello without SNI is answered for).
    pub fn catch_all(&self) -> Option<usize> {
        self.hostnames.any()
    }

    /// SNI (if the client sent one) selects the route; the Host must be served by the same
    /// route. Without SNI the Host alone selects.
    pub fn select(&self, sni: Option<&str>, host: Option<&str>) -> RouteDecision<'_> {
        let Some(host) = host.and_then(host_without_port) else {
            return RouteDecision::MissingHost;
        };
        let Some((index, hostname)) = self.hostnames.lookup(&host) else {
            return if sni.is_some() {
                RouteDecision::Misdirected
            } else {
                RouteDecision::UnknownHost
            };
        };
        // The usual request names its connection's SNI again: no second lookup for it.
        if let Some(sni) = sni
            && !same_name(sni, &host)
            && self.index_of(sni) != Some(index)
        {
            return RouteDecision::Misdirected;
        }
        match self.routes.get(index) {
            Some(entry) => RouteDecision::Route(RouteChoice {
                entry,
                index,
                hostname,
            }),
            None => RouteDecision::Misdirected,
        }
    }
}

/// Whether `sni` normalizes to the already normalized `host` (a shortcut; `false` may still
/// name the same route).
fn same_name(sni: &str, host: &str) -> bool {
    sni.eq_ignore_ascii_case(host)
}

/// `Host`/`:authority` without the port, normalized; `None` for an empty or malformed value.
pub fn host_without_port(value: &str) -> Option<Cow<'_, str>> {
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
    let host = normalized_hostname(host);
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
            tls: None,
            backend: Some(BackendAddress {
                host: format!("{name}.svc"),
                port: 80,
            }),
            backend_tls: None,
            request_timeout_seconds: None,
            backend_request_timeout_seconds: None,
            request_timeout_millis: None,
            backend_request_timeout_millis: None,
            rules: Vec::new(),
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
            RouteDecision::Route(choice) => choice.entry.route.name.clone(),
            RouteDecision::Misdirected => "421".into(),
            RouteDecision::UnknownHost => "404".into(),
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
            (None, Some("100.64.0.7"), "404"),
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
        assert_eq!(table.catch_all(), None);
        assert_eq!(gateway_table().catch_all(), Some(3));
    }

    fn gateway_table() -> RouteTable {
        RouteTable::new(&[
            route("exact", &["a.example.com"]),
            route("wild", &["*.example.com"]),
            route("deeper", &["*.b.example.com"]),
            route("any", &["*"]),
        ])
    }

    /// Exact beats wildcard, a longer wildcard a shorter one, `*` takes the rest; a wildcard
    /// matches any depth below its suffix but not the suffix itself.
    #[test]
    fn wildcards_and_the_catch_all_by_specificity() {
        let table = gateway_table();
        let cases = [
            ("a.example.com", "exact", "a.example.com"),
            ("A.Example.Com.", "exact", "a.example.com"),
            ("x.example.com", "wild", "*.example.com"),
            ("x.y.example.com", "wild", "*.example.com"),
            ("x.b.example.com", "deeper", "*.b.example.com"),
            ("b.example.com", "wild", "*.example.com"),
            ("example.com", "any", "*"),
            ("other.test", "any", "*"),
            ("100.64.0.7", "any", "*"),
        ];
        for (host, route, pattern) in cases {
            match table.select(None, Some(host)) {
                RouteDecision::Route(choice) => {
                    assert_eq!(choice.entry.route.name, route, "{host}");
                    assert_eq!(&**choice.hostname, pattern, "{host}");
                    assert_eq!(table.routes()[choice.index].route.name, route);
                }
                other => panic!("{host}: {other:?}"),
            }
        }
        // SNI and Host must land on the same route, wildcards included.
        assert_eq!(
            chosen(table.select(Some("x.example.com"), Some("y.example.com"))),
            "wild"
        );
        assert_eq!(
            chosen(table.select(Some("x.example.com"), Some("a.example.com"))),
            "421"
        );
        // The SNI naming the Host again (any case) takes the shortcut, with the same answers.
        assert_eq!(
            chosen(table.select(Some("A.example.COM"), Some("a.example.com"))),
            "exact"
        );
        assert_eq!(
            chosen(table.select(Some("a.example.com."), Some("A.example.com"))),
            "exact"
        );
        assert_eq!(
            chosen(table.select(Some("a.example.com"), Some("b.example.com"))),
            "421"
        );
        let without_catch_all = RouteTable::new(&[route("wild", &["*.example.com"])]);
        assert!(without_catch_all.serves("deep.x.example.com"));
        assert!(!without_catch_all.serves("example.com"));
        assert!(!without_catch_all.serves("xexample.com"));
        assert_eq!(
            chosen(without_catch_all.select(None, Some("example.com"))),
            "404"
        );
        // No routes at all (a Gateway listener nothing is attached to yet): every Host is 404.
        assert_eq!(
            chosen(RouteTable::new(&[]).select(None, Some("example.com"))),
            "404"
        );
    }

    #[test]
    fn the_first_route_keeps_a_pattern_claimed_twice() {
        let mut index = HostnameIndex::default();
        index.insert("*.a.test", 0);
        index.insert("*.A.test.", 1);
        index.insert("*", 2);
        index.insert("*", 3);
        assert_eq!(index.lookup("x.a.test").map(|(i, _)| i), Some(0));
        assert_eq!(index.any(), Some(2));
        assert_eq!(HostnameIndex::default().lookup("a"), None);
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
