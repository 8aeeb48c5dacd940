//! The plan as agent listeners: ports, hostname fall-through within a listener, listener
//! isolation, actions as rules, passthrough, TCP, certificates and what is noted.

use std::collections::BTreeMap;

use pretty_assertions::assert_eq;
use tailnet_api::agent_config::{
    self, BackendAddress, HeaderModifier, HeaderValue, HttpFilter, HttpRoute, IngressListener,
    PathModifierType, RedirectScheme, TlsFiles,
};

use super::super::plan::{
    BackendTarget, GatewayPlan, HeaderChanges, HttpAction, HttpBackend, HttpEntry, HttpOutcome,
    HttpServe, ListenerPlan, ListenerServe, NameValue, PathMatch, PathRewrite, Redirect, SniRoute,
    TcpForward, UrlRewrite, VirtualHost, WeightedBackend,
};
use super::*;

const DOMAIN: &str = "cluster.local";

fn svc(name: &str, port: u16) -> BackendTarget {
    BackendTarget::Service {
        namespace: "apps".into(),
        name: name.into(),
        port,
    }
}

fn address(name: &str, port: u16) -> BackendAddress {
    BackendAddress {
        host: format!("{name}.apps.svc.{DOMAIN}"),
        port,
    }
}

fn forward(name: &str) -> HttpAction {
    HttpAction {
        route: ObjectKey::new("apps", name),
        rule_index: 0,
        rule_name: None,
        request_headers: HeaderChanges::default(),
        response_headers: HeaderChanges::default(),
        url_rewrite: None,
        outcome: HttpOutcome::Forward {
            backends: vec![HttpBackend {
                weight: 1,
                target: svc(name, 8080),
                request_headers: HeaderChanges::default(),
                response_headers: HeaderChanges::default(),
            }],
        },
        request_timeout_ms: None,
        backend_request_timeout_ms: None,
    }
}

fn prefix(path: &str, action: usize) -> HttpEntry {
    HttpEntry {
        path: PathMatch::PathPrefix(path.into()),
        method: None,
        headers: Vec::new(),
        query_params: Vec::new(),
        action,
    }
}

fn host(hostname: Option<&str>, entries: Vec<HttpEntry>) -> VirtualHost {
    VirtualHost {
        hostname: hostname.map(str::to_string),
        entries,
    }
}

fn http_listener(name: &str, port: u16, hostname: Option<&str>, serve: HttpServe) -> ListenerPlan {
    ListenerPlan {
        name: name.into(),
        port,
        hostname: hostname.map(str::to_string),
        serve: ListenerServe::Http(serve),
    }
}

/// (hostname pattern, the backend Service of each rule in order) of every route.
fn routes_of(listener: &IngressListener) -> Vec<(String, Vec<String>)> {
    let routes: &[HttpRoute] = match listener {
        IngressListener::Http { routes, .. } | IngressListener::PlainHttp { routes, .. } => routes,
        other => panic!("not an HTTP listener: {other:?}"),
    };
    routes
        .iter()
        .map(|r| {
            let backends = r
                .rules
                .iter()
                .map(|rule| {
                    rule.backends
                        .iter()
                        .map(|b| {
                            b.backend
                                .as_ref()
                                .map_or("-".to_string(), |a| a.host.clone())
                        })
                        .collect::<Vec<_>>()
                        .join("+")
                })
                .map(|host| host.split('.').next().unwrap_or_default().to_string())
                .collect();
            (r.hostnames.join(","), backends)
        })
        .collect()
}

fn convert(plan: &GatewayPlan) -> GatewayAgent {
    agent_listeners(plan, DOMAIN, &BTreeMap::new())
}

fn pair(host: &str, backends: &[&str]) -> (String, Vec<String>) {
    (
        host.to_string(),
        backends.iter().map(|b| b.to_string()).collect(),
    )
}

/// Within one listener a request for a precise name falls through to the wildcard's and the
/// catch-all's entries, in that order; the wildcard to the catch-all's; not the other way.
#[test]
fn hostnames_fall_through_within_a_listener_by_precedence() {
    let serve = HttpServe {
        virtual_hosts: vec![
            host(Some("foo.example.com"), vec![prefix("/foo", 0)]),
            host(Some("*.example.com"), vec![prefix("/wild", 1)]),
            host(None, vec![prefix("/", 2)]),
        ],
        actions: vec![forward("foo"), forward("wild"), forward("all")],
    };
    let plan = GatewayPlan {
        listeners: vec![http_listener("http", 80, None, serve)],
    };
    let agent = convert(&plan);
    assert_eq!(agent.listeners.len(), 1);
    assert_eq!(agent.listeners[0].port(), 80);
    assert!(matches!(
        agent.listeners[0],
        IngressListener::PlainHttp { .. }
    ));
    assert_eq!(
        routes_of(&agent.listeners[0]),
        vec![
            pair("foo.example.com", &["foo", "wild", "all"]),
            pair("*.example.com", &["wild", "all"]),
            pair("*", &["all"]),
        ]
    );
    assert!(agent.notes.is_empty(), "{:?}", agent.notes);
}

/// A virtual host does not fall through to a sibling it does not match; the listener's own
/// pattern (`*`: it has no hostname) gets a route without rules (404, not a refused
/// handshake).
#[test]
fn unrelated_hostnames_do_not_share_entries() {
    let serve = HttpServe {
        virtual_hosts: vec![
            host(Some("a.example.com"), vec![prefix("/", 0)]),
            host(Some("b.example.com"), vec![prefix("/", 1)]),
            host(Some("*.other.net"), vec![prefix("/", 1)]),
        ],
        actions: vec![forward("a"), forward("b")],
    };
    let plan = GatewayPlan {
        listeners: vec![http_listener("http", 8080, None, serve)],
    };
    assert_eq!(
        routes_of(&convert(&plan).listeners[0]),
        vec![
            pair("a.example.com", &["a"]),
            pair("b.example.com", &["b"]),
            pair("*.other.net", &["b"]),
            pair("*", &[]),
        ]
    );
}

/// Two listeners on one port: the more specific one keeps its names, and names it captures
/// are left out of the less specific one (listener isolation); its own other names stay.
#[test]
fn listeners_of_one_port_are_isolated() {
    let specific = HttpServe {
        virtual_hosts: vec![host(Some("*.example.com"), vec![prefix("/", 0)])],
        actions: vec![forward("specific")],
    };
    let catch_all = HttpServe {
        virtual_hosts: vec![
            host(Some("foo.example.com"), vec![prefix("/", 0)]),
            host(Some("foo.example.org"), vec![prefix("/", 0)]),
            host(None, vec![prefix("/", 1)]),
        ],
        actions: vec![forward("stolen"), forward("rest")],
    };
    // Given in the wrong order: the conversion orders by listener hostname.
    let plan = GatewayPlan {
        listeners: vec![
            http_listener("any", 80, None, catch_all),
            http_listener("wild", 80, Some("*.example.com"), specific),
        ],
    };
    let agent = convert(&plan);
    assert_eq!(agent.listeners.len(), 1);
    assert_eq!(
        routes_of(&agent.listeners[0]),
        vec![
            pair("*.example.com", &["specific"]),
            pair("foo.example.org", &["stolen", "rest"]),
            pair("*", &["rest"]),
        ]
    );
    let IngressListener::PlainHttp { routes, .. } = &agent.listeners[0] else {
        panic!("plain HTTP expected");
    };
    assert_eq!(routes[0].name, "wild/*.example.com");
    assert_eq!(routes[2].name, "any/*");
}

/// Listeners on different ports are separate agent listeners, sorted by port; HTTPS
/// terminates TLS (`http` mode) with the certificate Secret's files.
#[test]
fn ports_and_protocols_become_agent_listeners() {
    let serve = || HttpServe {
        virtual_hosts: vec![host(None, vec![prefix("/", 0)])],
        actions: vec![forward("web")],
    };
    let cert = ObjectKey::new("infra", "web-cert");
    let plan = GatewayPlan {
        listeners: vec![
            ListenerPlan {
                name: "https".into(),
                port: 443,
                hostname: None,
                serve: ListenerServe::Https {
                    certificates: vec![cert.clone()],
                    http: serve(),
                },
            },
            http_listener("http", 80, None, serve()),
        ],
    };
    let files = TlsFiles {
        cert_file: "/etc/tailnet-agent/tls/infra-web-cert.crt".into(),
        key_file: "/etc/tailnet-agent/tls/infra-web-cert.key".into(),
    };
    let agent = agent_listeners(&plan, DOMAIN, &BTreeMap::from([(cert, files.clone())]));
    let ports: Vec<u16> = agent.listeners.iter().map(IngressListener::port).collect();
    assert_eq!(ports, [80, 443]);
    assert!(matches!(
        agent.listeners[0],
        IngressListener::PlainHttp { .. }
    ));
    assert!(matches!(agent.listeners[1], IngressListener::Http { .. }));
    assert_eq!(agent.tls, Some(files));
    assert_eq!(agent.backends, vec![(ObjectKey::new("apps", "web"), 8080)]);
}

/// Each HTTPS listener's routes carry its own certificate (the agent picks it by SNI); the
/// most specific listener's is the default for a ClientHello without SNI. A listener whose
/// certificate is not mounted falls back to the default and is noted; none mounted: no
/// default either.
#[test]
fn each_https_listener_serves_its_own_certificate() {
    let https = |name: &str, hostname: &str, secret: &str| ListenerPlan {
        name: name.into(),
        port: 443,
        hostname: Some(hostname.into()),
        serve: ListenerServe::Https {
            certificates: vec![ObjectKey::new("infra", secret)],
            http: HttpServe::default(),
        },
    };
    let plan = GatewayPlan {
        listeners: vec![
            https("a", "a.example.com", "a"),
            https("b", "b.example.com", "b"),
        ],
    };
    let files = |stem: &str| TlsFiles {
        cert_file: format!("{stem}.crt"),
        key_file: format!("{stem}.key"),
    };
    let route_certificates = |agent: &GatewayAgent| -> Vec<(String, Option<String>)> {
        let IngressListener::Http { routes, .. } = &agent.listeners[0] else {
            panic!("not an HTTPS listener: {:?}", agent.listeners);
        };
        routes
            .iter()
            .map(|r| {
                (
                    r.hostnames.join(","),
                    r.tls.as_ref().map(|t| t.cert_file.clone()),
                )
            })
            .collect()
    };
    let both = BTreeMap::from([
        (ObjectKey::new("infra", "a"), files("a")),
        (ObjectKey::new("infra", "b"), files("b")),
    ]);
    let agent = agent_listeners(&plan, DOMAIN, &both);
    assert_eq!(agent.tls, Some(files("a")));
    assert_eq!(
        route_certificates(&agent),
        [
            ("a.example.com".to_string(), Some("a.crt".to_string())),
            ("b.example.com".to_string(), Some("b.crt".to_string())),
        ]
    );
    assert!(agent.notes.is_empty(), "{:?}", agent.notes);

    let only_a = BTreeMap::from([(ObjectKey::new("infra", "a"), files("a"))]);
    let agent = agent_listeners(&plan, DOMAIN, &only_a);
    assert_eq!(agent.tls, Some(files("a")));
    assert_eq!(
        route_certificates(&agent),
        [
            ("a.example.com".to_string(), Some("a.crt".to_string())),
            ("b.example.com".to_string(), None),
        ]
    );
    assert_eq!(agent.notes.len(), 1, "{:?}", agent.notes);
    assert!(
        agent.notes[0].contains("listener b") && agent.notes[0].contains("infra/b"),
        "{:?}",
        agent.notes
    );

    let agent = convert(&plan);
    assert_eq!(agent.tls, None);
    assert_eq!(agent.notes.len(), 2, "{:?}", agent.notes);
    assert!(agent.notes.iter().all(|n| n.contains("not mounted")));
}

/// Every action kind as agent filters and backends.
#[test]
fn actions_become_rule_filters_and_backends() {
    let mut headers = forward("web");
    headers.request_headers = HeaderChanges {
        set: vec![NameValue {
            name: "x-set".into(),
            value: "1".into(),
        }],
        add: vec![],
        remove: vec!["x-drop".into()],
    };
    headers.response_headers = HeaderChanges {
        set: vec![],
        add: vec![NameValue {
            name: "x-added".into(),
            value: "2".into(),
        }],
        remove: vec![],
    };
    headers.url_rewrite = Some(UrlRewrite {
        hostname: Some("internal.example".into()),
        path: Some(PathRewrite::ReplaceFullPath("/v2".into())),
    });
    headers.request_timeout_ms = Some(1500);
    headers.backend_request_timeout_ms = Some(0);
    let mut redirect = forward("unused");
    redirect.outcome = HttpOutcome::Redirect(Redirect {
        scheme: Some("https".into()),
        hostname: None,
        path: Some(PathRewrite::ReplaceFullPath("/new".into())),
        port: None,
        status_code: 301,
    });
    let mut fixed = forward("unused");
    fixed.outcome = HttpOutcome::Fixed { status: 500 };
    let mut invalid = forward("unused");
    invalid.outcome = HttpOutcome::Forward {
        backends: vec![
            HttpBackend {
                weight: 3,
                target: svc("v1", 80),
                request_headers: HeaderChanges::default(),
                response_headers: HeaderChanges::default(),
            },
            HttpBackend {
                weight: 1,
                target: BackendTarget::Invalid {
                    reason: "BackendNotFound".into(),
                },
                request_headers: HeaderChanges::default(),
                response_headers: HeaderChanges::default(),
            },
        ],
    };
    let entry = HttpEntry {
        path: PathMatch::Exact("/exact".into()),
        method: Some("POST".into()),
        headers: vec![NameValue {
            name: "version".into(),
            value: "two".into(),
        }],
        query_params: vec![NameValue {
            name: "q".into(),
            value: "1".into(),
        }],
        action: 0,
    };
    let serve = HttpServe {
        virtual_hosts: vec![host(
            None,
            vec![entry, prefix("/r", 1), prefix("/f", 2), prefix("/w", 3)],
        )],
        actions: vec![headers, redirect, fixed, invalid],
    };
    let agent = convert(&GatewayPlan {
        listeners: vec![http_listener("http", 80, None, serve)],
    });
    let IngressListener::PlainHttp { routes, .. } = &agent.listeners[0] else {
        panic!("plain HTTP expected");
    };
    let rules = &routes[0].rules;
    assert_eq!(rules.len(), 4);
    // Matches and the header/rewrite filters, timeouts (0 = none).
    let m = &rules[0].matches[0];
    assert_eq!(
        m.path.as_ref().map(|p| (p.kind, p.value.as_str())),
        Some((agent_config::PathMatchType::Exact, "/exact"))
    );
    assert_eq!(m.method.as_deref(), Some("POST"));
    assert_eq!(
        (m.headers[0].name.as_str(), m.headers[0].value.as_str()),
        ("version", "two")
    );
    assert_eq!(m.query_params[0].name, "q");
    assert_eq!(
        rules[0].filters,
        vec![
            HttpFilter::RequestHeaderModifier(HeaderModifier {
                set: vec![HeaderValue {
                    name: "x-set".into(),
                    value: "1".into()
                }],
                add: vec![],
                remove: vec!["x-drop".into()],
            }),
            HttpFilter::ResponseHeaderModifier(HeaderModifier {
                set: vec![],
                add: vec![HeaderValue {
                    name: "x-added".into(),
                    value: "2".into()
                }],
                remove: vec![],
            }),
            HttpFilter::UrlRewrite(agent_config::UrlRewrite {
                hostname: Some("internal.example".into()),
                path: Some(agent_config::PathModifier {
                    kind: PathModifierType::ReplaceFullPath,
                    value: "/v2".into()
                }),
            }),
        ]
    );
    assert_eq!(rules[0].request_timeout_millis, Some(1500));
    assert_eq!(rules[0].backend_request_timeout_millis, None);
    assert_eq!(rules[0].backends[0].backend, Some(address("web", 8080)));
    // A redirect: the filter, no backends.
    let HttpFilter::RequestRedirect(r) = &rules[1].filters[0] else {
        panic!("redirect expected: {:?}", rules[1].filters);
    };
    assert_eq!(
        (r.scheme, r.status_code, r.path.as_ref().map(|p| p.kind)),
        (
            Some(RedirectScheme::Https),
            Some(301),
            Some(PathModifierType::ReplaceFullPath)
        )
    );
    assert!(rules[1].backends.is_empty());
    // A fixed 500: no filters, no backends (the agent answers 500).
    assert!(rules[2].filters.is_empty() && rules[2].backends.is_empty());
    // Weighted backends; the invalid one keeps its share without an address.
    let weights: Vec<(u32, Option<BackendAddress>)> = rules[3]
        .backends
        .iter()
        .map(|b| (b.weight, b.backend.clone()))
        .collect();
    assert_eq!(weights, vec![(3, Some(address("v1", 80))), (1, None)]);
    // The agent's own checks accept what was produced.
    let mut budget = agent_config::RegexBudget::default();
    agent_config::check_http_rules(rules, "routes[0]", &mut budget).expect("valid rules");
}

/// Backend header filters: a lone backend's become the rule's; with several they are noted.
#[test]
fn backend_header_filters_fold_or_are_noted() {
    let changes = HeaderChanges {
        set: vec![NameValue {
            name: "x-backend".into(),
            value: "v1".into(),
        }],
        add: vec![],
        remove: vec![],
    };
    let backend = |name: &str, with: bool| HttpBackend {
        weight: 1,
        target: svc(name, 80),
        request_headers: if with {
            changes.clone()
        } else {
            HeaderChanges::default()
        },
        response_headers: HeaderChanges::default(),
    };
    let mut lone = forward("x");
    lone.outcome = HttpOutcome::Forward {
        backends: vec![backend("v1", true)],
    };
    let mut several = forward("y");
    several.outcome = HttpOutcome::Forward {
        backends: vec![backend("v1", true), backend("v2", false)],
    };
    let serve = HttpServe {
        virtual_hosts: vec![host(None, vec![prefix("/a", 0), prefix("/b", 1)])],
        actions: vec![lone, several],
    };
    let agent = convert(&GatewayPlan {
        listeners: vec![http_listener("http", 80, None, serve)],
    });
    let IngressListener::PlainHttp { routes, .. } = &agent.listeners[0] else {
        panic!("plain HTTP expected");
    };
    assert!(matches!(
        &routes[0].rules[0].filters[..],
        [HttpFilter::RequestHeaderModifier(m)] if m.set[0].name == "x-backend"
    ));
    assert!(routes[0].rules[1].filters.is_empty());
    assert_eq!(agent.notes.len(), 1);
    assert!(agent.notes[0].contains("apps/y"), "{:?}", agent.notes);
}

fn sni(hostname: &str, route: &str, backend: &str) -> SniRoute {
    SniRoute {
        hostname: hostname.into(),
        route: ObjectKey::new("apps", route),
        backends: vec![WeightedBackend {
            weight: 1,
            target: svc(backend, 443),
        }],
    }
}

/// TLS passthrough: SNI routes by precedence, isolated across listeners of the port.
#[test]
fn passthrough_routes_by_sni_and_isolated() {
    let tls = |name: &str, hostname: Option<&str>, routes: Vec<SniRoute>| ListenerPlan {
        name: name.into(),
        port: 443,
        hostname: hostname.map(str::to_string),
        serve: ListenerServe::TlsPassthrough { routes },
    };
    let plan = GatewayPlan {
        listeners: vec![
            tls(
                "any",
                None,
                vec![
                    sni("db.example.com", "stolen", "x"),
                    sni("*.example.org", "org", "org"),
                ],
            ),
            tls(
                "wild",
                Some("*.example.com"),
                vec![sni("*.example.com", "wild", "wild")],
            ),
        ],
    };
    let agent = convert(&plan);
    let IngressListener::TlsPassthrough { port, routes } = &agent.listeners[0] else {
        panic!("passthrough expected: {:?}", agent.listeners);
    };
    assert_eq!(*port, 443);
    let got: Vec<(String, String)> = routes
        .iter()
        .map(|r| (r.hostnames.join(","), r.name.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("*.example.com".to_string(), "wild/apps/wild".to_string()),
            ("*.example.org".to_string(), "any/apps/org".to_string()),
        ]
    );
    assert_eq!(routes[0].backends[0].backend, Some(address("wild", 443)));
    agent_config::check_backends(&routes[0].backends, "routes[0].backends", false)
        .expect("valid passthrough backends");
}

fn tcp(port: u16, route: Option<TcpForward>) -> ListenerPlan {
    ListenerPlan {
        name: format!("tcp-{port}"),
        port,
        hostname: None,
        serve: ListenerServe::Tcp { route },
    }
}

/// TCP: the route's backend; several: chosen per connection by weight (an unresolved one's
/// share closed), the heaviest valid one as `backend`; none valid or no route: no listener
/// (noted).
#[test]
fn tcp_listeners_relay_by_weight() {
    let forward_to = |backends: Vec<WeightedBackend>| {
        Some(TcpForward {
            route: ObjectKey::new("apps", "db"),
            backends,
        })
    };
    let weighted = |weight: u32, target: BackendTarget| WeightedBackend { weight, target };
    let invalid = BackendTarget::Invalid {
        reason: "RefNotPermitted".into(),
    };
    let plan = GatewayPlan {
        listeners: vec![
            tcp(5432, forward_to(vec![weighted(1, svc("pg", 5432))])),
            tcp(
                6379,
                forward_to(vec![
                    weighted(1, svc("redis-a", 6379)),
                    weighted(5, svc("redis-b", 6379)),
                    weighted(9, invalid.clone()),
                ]),
            ),
            tcp(7000, forward_to(vec![weighted(1, invalid)])),
            tcp(7001, None),
        ],
    };
    let agent = convert(&plan);
    assert_eq!(
        agent.listeners,
        vec![
            IngressListener::Tcp {
                port: 5432,
                name: "tcp-5432".into(),
                backend: address("pg", 5432),
                backends: Vec::new(),
            },
            IngressListener::Tcp {
                port: 6379,
                name: "tcp-6379".into(),
                backend: address("redis-b", 6379),
                backends: vec![
                    tailnet_api::agent_config::WeightedBackend {
                        backend: Some(address("redis-a", 6379)),
                        weight: 1,
                        backend_tls: None,
                    },
                    tailnet_api::agent_config::WeightedBackend {
                        backend: Some(address("redis-b", 6379)),
                        weight: 5,
                        backend_tls: None,
                    },
                    tailnet_api::agent_config::WeightedBackend {
                        backend: None,
                        weight: 9,
                        backend_tls: None,
                    },
                ],
            },
        ]
    );
    assert_eq!(agent.notes.len(), 2, "{:?}", agent.notes);
    assert!(agent.notes[0].contains("no valid backend"));
    assert!(agent.notes[1].contains("no TCPRoute attached"));
    assert_eq!(
        agent.backends,
        [
            (ObjectKey::new("apps", "pg"), 5432),
            (ObjectKey::new("apps", "redis-a"), 6379),
            (ObjectKey::new("apps", "redis-b"), 6379),
        ]
    );
}

/// A second protocol on a port is not served (the first, most specific, listener's is).
#[test]
fn a_second_protocol_on_a_port_is_noted() {
    let plan = GatewayPlan {
        listeners: vec![
            ListenerPlan {
                name: "tls".into(),
                port: 443,
                hostname: Some("db.example.com".into()),
                serve: ListenerServe::TlsPassthrough {
                    routes: vec![sni("db.example.com", "db", "db")],
                },
            },
            http_listener("web", 443, None, HttpServe::default()),
        ],
    };
    let agent = convert(&plan);
    assert_eq!(agent.listeners.len(), 1);
    assert!(matches!(
        agent.listeners[0],
        IngressListener::TlsPassthrough { .. }
    ));
    assert_eq!(agent.notes.len(), 1);
    assert!(agent.notes[0].contains("listener web (HTTP) is not served"));
}

/// No listeners: nothing at all.
#[test]
fn an_empty_plan_has_no_listeners() {
    assert_eq!(convert(&GatewayPlan::default()), GatewayAgent::default());
}
