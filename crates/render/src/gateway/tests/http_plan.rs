//! The data plan: HTTP precedence, virtual hosts, actions, TLS passthrough and TCP.

use super::plan::{
    HeaderChanges, HttpBackend, NameValue, PathRewrite, Redirect, SniRoute, TcpForward, UrlRewrite,
    WeightedBackend,
};
use super::*;
use pretty_assertions::assert_eq;

fn svc(name: &str, port: u16) -> BackendTarget {
    BackendTarget::Service {
        namespace: NS.into(),
        name: name.into(),
        port,
    }
}

fn route_to(
    name: &str,
    created: i64,
    hostnames: Value,
    matches: Value,
    backend: &str,
) -> HTTPRoute {
    http_route(
        NS,
        name,
        created,
        json!({"parentRefs": [{"name": "gw"}], "hostnames": hostnames, "rules": [{"matches": matches, "backendRefs": [{"name": backend, "port": 8080}]}]}),
    )
}

/// Precedence within one hostname, each criterion alone deciding (spec HTTPRouteRule.matches).
#[test]
fn match_precedence_table() {
    // (earlier entry, later entry): routes "a" (older) and "b" created in this order unless
    // the case is about age.
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "Exact before PathPrefix",
            json!([{"path": {"type": "Exact", "value": "/a"}}]),
            json!([{"path": {"type": "PathPrefix", "value": "/a/b/c"}}]),
        ),
        (
            "longer prefix first",
            json!([{"path": {"value": "/abc"}}]),
            json!([{"path": {"value": "/ab"}}]),
        ),
        (
            "method before none",
            json!([{"method": "GET"}]),
            json!([{"headers": [{"name": "a", "value": "1"}]}]),
        ),
        (
            "more headers first",
            json!([{"headers": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]}]),
            json!([{"headers": [{"name": "c", "value": "3"}], "queryParams": [{"name": "q", "value": "1"}]}]),
        ),
        (
            "more query params first",
            json!([{"queryParams": [{"name": "q", "value": "1"}]}]),
            json!([{}]),
        ),
    ];
    for (what, first, second) in cases {
        // The more specific match is in the newer route, so only the criterion can order it.
        let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
        s.http.push(route_to(
            "older",
            0,
            json!([]),
            second.clone(),
            "infra-backend-v2",
        ));
        s.http.push(route_to(
            "newer",
            10,
            json!([]),
            first.clone(),
            "infra-backend-v1",
        ));
        let table = routing_table(http_of(&s.run(), "http"));
        let order: Vec<&str> = table[0].1.iter().map(|(_, svc)| svc.as_str()).collect();
        assert_eq!(order, ["infra-backend-v1", "infra-backend-v2"], "{what}");
    }
}

/// Ties: the oldest route, then namespace/name, then rule order, then match order.
#[test]
fn ties_are_broken_by_age_name_and_rule_order() {
    let same = json!([{"path": {"value": "/x"}}]);
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http
        .push(route_to("b-new", 20, json!([]), same.clone(), "svc-b-new"));
    s.http
        .push(route_to("z-old", 0, json!([]), same.clone(), "svc-z-old"));
    s.http
        .push(route_to("a-new", 20, json!([]), same.clone(), "svc-a-new"));
    s.http.push(http_route(
        NS,
        "rules",
        5,
        json!({"parentRefs": [{"name": "gw"}], "rules": [
            {"matches": [{"path": {"value": "/y"}}, {"path": {"value": "/x"}}], "backendRefs": [{"name": "svc-r0", "port": 1}]},
            {"matches": [{"path": {"value": "/x"}}], "backendRefs": [{"name": "svc-r1", "port": 1}]}
        ]}),
    ));
    for name in ["svc-b-new", "svc-z-old", "svc-a-new", "svc-r0", "svc-r1"] {
        s.facts.services.insert(ObjectKey::new(NS, name));
    }
    let table = routing_table(http_of(&s.run(), "http"));
    let order: Vec<&str> = table[0]
        .1
        .iter()
        .filter(|(path, _)| path == "/x")
        .map(|(_, svc)| svc.as_str())
        .collect();
    assert_eq!(
        order,
        ["svc-z-old", "svc-r0", "svc-r1", "svc-a-new", "svc-b-new"]
    );
}

/// Conformance HTTPRouteMatchingAcrossRoutes: matches of different routes interleave by
/// precedence per match, not per rule or route.
#[test]
fn matching_across_routes() {
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(NS, "matching-part1", 0, json!({
        "parentRefs": [{"name": "gw"}], "hostnames": ["example.com", "example.net"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}, {"headers": [{"name": "version", "value": "one"}]}],
                   "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]})));
    s.http.push(http_route(NS, "matching-part2", 1, json!({
        "parentRefs": [{"name": "gw"}], "hostnames": ["example.com"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}, {"headers": [{"name": "version", "value": "two"}]}],
                   "backendRefs": [{"name": "infra-backend-v2", "port": 8080}]}]})));
    let serve = http_of(&s.run(), "http").clone();
    type Host = (Option<String>, Vec<(String, usize, String)>);
    let entries: Vec<Host> = serve
        .virtual_hosts
        .iter()
        .map(|vh| {
            let list = vh
                .entries
                .iter()
                .map(|e| {
                    let path = match &e.path {
                        PathMatch::Exact(p) | PathMatch::PathPrefix(p) => p.clone(),
                    };
                    let to = match &serve.actions[e.action].outcome {
                        HttpOutcome::Forward { backends } => {
                            if backends[0].target == svc("infra-backend-v2", 8080) {
                                "v2"
                            } else {
                                "v1"
                            }
                            .to_string()
                        }
                        other => format!("{other:?}"),
                    };
                    (path, e.headers.len(), to)
                })
                .collect();
            (vh.hostname.clone(), list)
        })
        .collect();
    let e = |p: &str, h: usize, to: &str| (p.to_string(), h, to.to_string());
    assert_eq!(
        entries,
        vec![
            // Equal specificity ("/" and one header): the older route first.
            (
                Some("example.com".into()),
                vec![
                    e("/v2", 0, "v2"),
                    e("/", 1, "v1"),
                    e("/", 1, "v2"),
                    e("/", 0, "v1")
                ]
            ),
            (
                Some("example.net".into()),
                vec![e("/", 1, "v1"), e("/", 0, "v1")]
            ),
        ]
    );
}

/// Virtual hosts are the intersections of route and listener hostnames, most specific first
/// (conformance HTTPRouteHostnameIntersection, HTTPRouteListenerHostnameMatching).
#[test]
fn virtual_hosts_are_the_hostname_intersections() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "listener-1", "port": 80, "protocol": "HTTP", "hostname": "very.specific.com"},
        {"name": "listener-2", "port": 80, "protocol": "HTTP", "hostname": "*.wildcard.io"},
        {"name": "listener-3", "port": 80, "protocol": "HTTP"}
    ])));
    s.http.push(route_to(
        "s1",
        0,
        json!([
            "non.matching.com",
            "*.nonmatchingwildcard.io",
            "very.specific.com"
        ]),
        json!([{"path": {"value": "/s1"}}]),
        "infra-backend-v1",
    ));
    s.http.push(route_to(
        "s2",
        1,
        json!([
            "non.matching.com",
            "wildcard.io",
            "foo.wildcard.io",
            "*.bar.wildcard.io"
        ]),
        json!([{"path": {"value": "/s2"}}]),
        "infra-backend-v2",
    ));
    s.http.push(route_to(
        "s3",
        2,
        json!(["*.specific.com"]),
        json!([{"path": {"value": "/s3"}}]),
        "infra-backend-v1",
    ));
    s.http.push(http_route(NS, "any", 3, json!({"parentRefs": [{"name": "gw", "sectionName": "listener-3"}], "rules": [{"backendRefs": [{"name": "infra-backend-v2", "port": 8080}]}]})));
    let d = s.run();
    let hosts = |name: &str| -> Vec<Option<String>> {
        http_of(&d, name)
            .virtual_hosts
            .iter()
            .map(|v| v.hostname.clone())
            .collect()
    };
    let some = |h: &str| Some(h.to_string());
    assert_eq!(hosts("listener-1"), [some("very.specific.com")]);
    assert_eq!(
        hosts("listener-2"),
        [some("foo.wildcard.io"), some("*.bar.wildcard.io")]
    );
    // Unrestricted listener: each route's own hostnames, and "any" for the route without.
    assert_eq!(
        hosts("listener-3"),
        [
            some("very.specific.com"),
            some("non.matching.com"),
            some("foo.wildcard.io"),
            some("wildcard.io"),
            some("*.bar.wildcard.io"),
            some("*.nonmatchingwildcard.io"),
            some("*.specific.com"),
            None
        ]
    );
    let on_one: Vec<String> = routing_table(http_of(&d, "listener-1"))[0]
        .1
        .iter()
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(on_one, ["/s1", "/s3"]);
    // Listener order in the plan: one port, most specific hostname first (isolation).
    let order: Vec<&str> = plan(&d).listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(order, ["listener-1", "listener-2", "listener-3"]);
}

/// An action carries the rule's filters, weighted backends and timeouts; outcomes for
/// redirects, ExtensionRef and rules without usable backends.
#[test]
fn actions_table() {
    let rules = json!([
        {"matches": [{"path": {"value": "/fwd"}}],
         "filters": [
            {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-Set", "value": "1"}], "add": [{"name": "x-add", "value": "2"}], "remove": ["X-Gone"]}},
            {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"add": [{"name": "x-resp", "value": "3"}]}},
            {"type": "URLRewrite", "urlRewrite": {"hostname": "internal.example.com", "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}}],
         "backendRefs": [
            {"name": "infra-backend-v1", "port": 8080, "weight": 3, "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "canary", "value": "no"}]}}]},
            {"name": "infra-backend-v2", "port": 8080},
            {"name": "zero", "port": 8080, "weight": 0},
            {"name": "missing", "port": 8080, "weight": 2}],
         "timeouts": {"request": "1m30s", "backendRequest": "500ms"}},
        {"matches": [{"path": {"value": "/redirect"}}],
         "filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https", "hostname": "other.example.com", "port": 8443, "statusCode": 301, "path": {"type": "ReplaceFullPath", "replaceFullPath": "/new"}}}]},
        {"matches": [{"path": {"value": "/ext"}}], "filters": [{"type": "ExtensionRef"}], "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]},
        {"matches": [{"path": {"type": "Exact", "value": "/omitted-no-forward"}}]},
        {"matches": [{"path": {"value": "/all-zero"}}], "backendRefs": [{"name": "infra-backend-v1", "port": 8080, "weight": 0}]}
    ]);
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.facts.services.insert(ObjectKey::new(NS, "zero"));
    s.http.push(http_route(
        NS,
        "r",
        0,
        json!({"parentRefs": [{"name": "gw"}], "rules": rules}),
    ));
    let d = s.run();
    let actions = &http_of(&d, "http").actions;
    let nv = |n: &str, v: &str| NameValue {
        name: n.into(),
        value: v.into(),
    };
    let fwd = &actions[0];
    assert_eq!(
        fwd.request_headers,
        HeaderChanges {
            set: vec![nv("x-set", "1")],
            add: vec![nv("x-add", "2")],
            remove: vec!["x-gone".into()]
        }
    );
    assert_eq!(fwd.response_headers.add, [nv("x-resp", "3")]);
    assert_eq!(
        fwd.url_rewrite,
        Some(UrlRewrite {
            hostname: Some("internal.example.com".into()),
            path: Some(PathRewrite::ReplacePrefixMatch("/v2".into()))
        })
    );
    assert_eq!(
        (fwd.request_timeout_ms, fwd.backend_request_timeout_ms),
        (Some(90_000), Some(500))
    );
    let canary = HeaderChanges {
        set: vec![nv("canary", "no")],
        ..HeaderChanges::default()
    };
    assert_eq!(
        fwd.outcome,
        HttpOutcome::Forward {
            backends: vec![
                HttpBackend {
                    weight: 3,
                    target: svc("infra-backend-v1", 8080),
                    request_headers: canary,
                    response_headers: HeaderChanges::default()
                },
                HttpBackend {
                    weight: 1,
                    target: svc("infra-backend-v2", 8080),
                    request_headers: HeaderChanges::default(),
                    response_headers: HeaderChanges::default()
                },
                HttpBackend {
                    weight: 2,
                    target: BackendTarget::Invalid {
                        reason: "BackendNotFound".into()
                    },
                    request_headers: HeaderChanges::default(),
                    response_headers: HeaderChanges::default()
                },
            ]
        }
    );
    assert_eq!(
        actions[1].outcome,
        HttpOutcome::Redirect(Redirect {
            scheme: Some("https".into()),
            hostname: Some("other.example.com".into()),
            path: Some(PathRewrite::ReplaceFullPath("/new".into())),
            port: Some(8443),
            status_code: 301
        })
    );
    assert_eq!(
        actions[2].outcome,
        HttpOutcome::Fixed { status: 500 },
        "ExtensionRef"
    );
    assert_eq!(
        actions[3].outcome,
        HttpOutcome::Fixed { status: 500 },
        "no backendRefs"
    );
    assert_eq!(
        actions[4].outcome,
        HttpOutcome::Fixed { status: 500 },
        "all weights 0"
    );
    // Default redirect status is 302.
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(NS, "r", 0, json!({"parentRefs": [{"name": "gw"}], "rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "a.example.com"}}]}]})));
    match &http_of(&s.run(), "http").actions[0].outcome {
        HttpOutcome::Redirect(r) => assert_eq!(
            (r.status_code, r.port, r.scheme.as_deref()),
            (302, None, None)
        ),
        other => panic!("not a redirect: {other:?}"),
    }
}

/// Matches are normalised: default path prefix `/`, trailing `/` of a prefix ignored,
/// header names lower-cased, only the first of a repeated header or query name counted.
#[test]
fn matches_are_normalised() {
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(NS, "r", 0, json!({"parentRefs": [{"name": "gw"}], "rules": [
        {"matches": [
            {"path": {"type": "PathPrefix", "value": "/abc/"}, "headers": [{"name": "Version", "value": "1"}, {"name": "version", "value": "2"}], "queryParams": [{"name": "q", "value": "1"}, {"name": "q", "value": "2"}, {"name": "Q", "value": "3"}]},
            {"method": "POST"}
        ], "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}
    ]})));
    let serve = http_of(&s.run(), "http").clone();
    let entries = &serve.virtual_hosts[0].entries;
    assert_eq!(entries[0].path, PathMatch::PathPrefix("/abc".into()));
    assert_eq!(
        entries[0].headers,
        [NameValue {
            name: "version".into(),
            value: "1".into()
        }]
    );
    let query: Vec<(&str, &str)> = entries[0]
        .query_params
        .iter()
        .map(|q| (q.name.as_str(), q.value.as_str()))
        .collect();
    assert_eq!(query, [("q", "1"), ("Q", "3")]);
    assert_eq!(
        (entries[1].path.clone(), entries[1].method.as_deref()),
        (PathMatch::PathPrefix("/".into()), Some("POST"))
    );
}

/// HTTPS listeners carry their certificates; only served listeners are in the plan; the plan
/// is ordered by port.
#[test]
fn plan_listeners_and_certificates() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "web", "port": 443, "protocol": "HTTPS", "hostname": "web.example.com", "tls": {"certificateRefs": [{"name": "cert"}]}},
        {"name": "broken", "port": 8443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "missing"}]}},
        {"name": "plain", "port": 80, "protocol": "HTTP"},
        {"name": "udp", "port": 53, "protocol": "UDP"}
    ])));
    s.http
        .push(route_to("r", 0, json!([]), json!([{}]), "infra-backend-v1"));
    let d = s.run();
    let names: Vec<(&str, u16)> = plan(&d)
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l.port))
        .collect();
    assert_eq!(names, [("plain", 80), ("web", 443)]);
    match &plan(&d).listeners[1].serve {
        ListenerServe::Https { certificates, http } => {
            assert_eq!(certificates, &[ObjectKey::new(NS, "cert")]);
            assert_eq!(
                http.virtual_hosts[0].hostname.as_deref(),
                Some("web.example.com")
            );
        }
        other => panic!("not HTTPS: {other:?}"),
    }
}

/// TLS passthrough: SNI routes most specific first; one hostname from two routes goes to
/// the older (both stay Accepted and counted) (conformance TLSRouteHostnameIntersection).
#[test]
fn tls_passthrough_plan() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "tls", "port": 443, "protocol": "TLS", "hostname": "*.example.com", "tls": {"mode": "Passthrough"}}
    ])));
    let backends =
        |name: &str| json!([{"backendRefs": [{"name": name, "port": 443, "weight": 2}]}]);
    s.tls.push(tls_route(NS, "newer", 5, json!({"parentRefs": [{"name": "gw"}], "hostnames": ["abc.example.com"], "rules": backends("infra-backend-v2")})));
    s.tls.push(tls_route(NS, "older", 0, json!({"parentRefs": [{"name": "gw"}], "hostnames": ["abc.example.com", "*.example.com", "other.example.org"], "rules": backends("infra-backend-v1")})));
    let d = s.run();
    assert_eq!(listener(&d, "tls").attached_routes, 2);
    assert_eq!(
        route_conds(&d, RouteKind::TLSRoute, "newer")[0],
        ("True", "Accepted")
    );
    let routes = match &plan(&d).listeners[0].serve {
        ListenerServe::TlsPassthrough { routes } => routes.clone(),
        other => panic!("not TLS: {other:?}"),
    };
    let older = |hostname: &str| SniRoute {
        hostname: hostname.into(),
        route: ObjectKey::new(NS, "older"),
        backends: vec![WeightedBackend {
            weight: 2,
            target: svc("infra-backend-v1", 443),
        }],
    };
    assert_eq!(routes, [older("abc.example.com"), older("*.example.com")]);
}

/// TCP: only the oldest route binds; both are Accepted and counted (conformance
/// TCPRouteMultipleRoutesAttachment); weights and invalid backends carried.
#[test]
fn tcp_plan_takes_the_oldest_route() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "tcp", "port": 9310, "protocol": "TCP", "allowedRoutes": {"kinds": [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute"}], "namespaces": {"from": "Same"}}},
        {"name": "empty", "port": 9311, "protocol": "TCP"}
    ])));
    s.tcp.push(tcp_route(NS, "tcproute-attach-newer", 1, json!({"parentRefs": [{"name": "gw", "sectionName": "tcp"}], "rules": [{"backendRefs": [{"name": "infra-backend-v2", "port": 3000}]}]})));
    s.tcp.push(tcp_route(NS, "tcproute-attach-older", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "tcp"}], "rules": [{"backendRefs": [
        {"name": "infra-backend-v1", "port": 3000, "weight": 9}, {"name": "gone", "port": 3000}, {"name": "infra-backend-v2", "port": 3000, "weight": 0}]}]})));
    let d = s.run();
    assert_eq!(listener(&d, "tcp").attached_routes, 2);
    for name in ["tcproute-attach-newer", "tcproute-attach-older"] {
        assert_eq!(
            route_conds(&d, RouteKind::TCPRoute, name)[0],
            ("True", "Accepted"),
            "{name}"
        );
    }
    let serves: Vec<ListenerServe> = plan(&d).listeners.iter().map(|l| l.serve.clone()).collect();
    assert_eq!(
        serves,
        [
            ListenerServe::Tcp {
                route: Some(TcpForward {
                    route: ObjectKey::new(NS, "tcproute-attach-older"),
                    backends: vec![
                        WeightedBackend {
                            weight: 9,
                            target: svc("infra-backend-v1", 3000)
                        },
                        WeightedBackend {
                            weight: 1,
                            target: BackendTarget::Invalid {
                                reason: "BackendNotFound".into()
                            }
                        },
                    ],
                })
            },
            ListenerServe::Tcp { route: None },
        ]
    );
}

#[test]
fn gateway_api_durations() {
    let cases = [
        ("0s", Some(0)),
        ("10s", Some(10_000)),
        ("500ms", Some(500)),
        ("1h2m3s4ms", Some(3_723_004)),
        ("99999ms", Some(99_999)),
        ("1m30s", Some(90_000)),
        ("", None),
        ("10", None),
        ("1d", None),
        ("123456s", None),
        ("1s1s1s1s1s", None),
        ("-1s", None),
        ("1.5s", None),
    ];
    for (text, want) in cases {
        assert_eq!(http::parse_duration_ms(text), want, "{text:?}");
    }
}

/// Conformance HTTPRouteServiceTypes: a headless Service's name resolves to its endpoints, so
/// the agent dials the numeric `targetPort`; a Service with a cluster IP keeps its port, and a
/// named `targetPort` (not resolvable without EndpointSlices) keeps the Service port.
#[test]
fn headless_services_are_dialled_on_their_target_port() {
    let service = |cluster_ip: &str| -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(json!({
            "metadata": {"name": "s", "namespace": NS},
            "spec": {"clusterIP": cluster_ip, "ports": [
                {"port": 8080, "targetPort": 3000},
                {"port": 9090, "targetPort": "metrics"},
                {"port": 7070}
            ]}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(
        crate::gateway::headless_target_ports(&service("None")),
        Some(BTreeMap::from([(8080, 3000), (7070, 7070)]))
    );
    assert_eq!(
        crate::gateway::headless_target_ports(&service("10.96.0.7")),
        None
    );

    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(
        NS,
        "r",
        0,
        json!({"parentRefs": [{"name": "gw"}], "rules": [
            {"matches": [{"path": {"value": "/headless"}}], "backendRefs": [{"name": "headless", "port": 8080}]},
            {"matches": [{"path": {"value": "/named"}}], "backendRefs": [{"name": "headless", "port": 9090}]},
            {"matches": [{"path": {"value": "/ip"}}], "backendRefs": [{"name": "ip", "port": 8080}]}
        ]}),
    ));
    for name in ["headless", "ip"] {
        s.facts.services.insert(ObjectKey::new(NS, name));
    }
    s.facts.headless_target_ports.insert(
        ObjectKey::new(NS, "headless"),
        BTreeMap::from([(8080, 3000)]),
    );
    let d = s.run();
    let targets: Vec<BackendTarget> = http_of(&d, "http")
        .actions
        .iter()
        .map(|action| match &action.outcome {
            HttpOutcome::Forward { backends } => backends[0].target.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        targets,
        [
            svc("headless", 3000),
            svc("headless", 9090),
            svc("ip", 8080)
        ]
    );
}
