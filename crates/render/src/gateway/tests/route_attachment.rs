//! Route attachment (parentRefs, allowedRoutes, hostnames), attachedRoutes, ResolvedRefs and
//! rule validity.

use super::*;
use pretty_assertions::assert_eq;

fn with_allowed(mut l: Value, allowed: Value) -> Value {
    l["allowedRoutes"] = allowed;
    l
}

/// parentRef sectionName/port select listeners; none selected: NoMatchingParent
/// (conformance HTTPRouteInvalidParentRefNotMatchingListenerPort, …SectionName…,
/// …SectionNameNotMatchingPort, TLSRouteInvalidNoMatchingListener).
#[test]
fn no_matching_parent_table() {
    let gw = gateway(json!([
        with_allowed(
            http_listener("http", 80),
            json!({"namespaces": {"from": "All"}})
        ),
        http_listener("alt", 8080)
    ]));
    let cases = [
        (
            json!({"name": "gw", "port": 81}),
            ("False", "NoMatchingParent"),
        ),
        (
            json!({"name": "gw", "sectionName": "nonexistent"}),
            ("False", "NoMatchingParent"),
        ),
        (
            json!({"name": "gw", "sectionName": "http", "port": 81}),
            ("False", "NoMatchingParent"),
        ),
        (
            json!({"name": "gw", "sectionName": "http", "port": 80}),
            ("True", "Accepted"),
        ),
        (json!({"name": "gw", "port": 8080}), ("True", "Accepted")),
        (json!({"name": "gw"}), ("True", "Accepted")),
    ];
    for (parent_ref, accepted) in cases {
        let mut s = Scenario::new(gw.clone());
        s.http.push(http_route(NS, "r", 0, json!({"parentRefs": [parent_ref], "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]})));
        let d = s.run();
        assert_eq!(
            route_conds(&d, RouteKind::HTTPRoute, "r")[0],
            accepted,
            "{parent_ref}"
        );
    }
}

/// allowedRoutes: kinds and namespaces; refused: NotAllowedByListeners, while ResolvedRefs
/// is still decided (conformance HTTPRouteDisallowedKind,
/// HTTPRouteInvalidCrossNamespaceParentRef, TCPRouteInvalidNonTCPListener,
/// TLSRouteInvalidNoMatchingListener).
#[test]
fn not_allowed_by_listeners_table() {
    let selector = |labels: Value| json!({"namespaces": {"from": "Selector", "selector": {"matchLabels": labels}}});
    let cases: Vec<(&str, Value, &str, (&str, &str))> = vec![
        (
            "Same admits the Gateway's namespace",
            http_listener("l", 80),
            NS,
            ("True", "Accepted"),
        ),
        (
            "Same refuses other namespaces",
            http_listener("l", 80),
            "apps",
            ("False", "NotAllowedByListeners"),
        ),
        (
            "All admits any namespace",
            with_allowed(
                http_listener("l", 80),
                json!({"namespaces": {"from": "All"}}),
            ),
            "apps",
            ("True", "Accepted"),
        ),
        (
            "Selector matching",
            with_allowed(
                http_listener("l", 80),
                selector(json!({"kubernetes.io/metadata.name": "apps"})),
            ),
            "apps",
            ("True", "Accepted"),
        ),
        (
            "Selector not matching",
            with_allowed(
                http_listener("l", 80),
                selector(json!({"kubernetes.io/metadata.name": "apps"})),
            ),
            "other",
            ("False", "NotAllowedByListeners"),
        ),
        (
            "Selector on an unknown namespace",
            with_allowed(http_listener("l", 80), selector(json!({"team": "a"}))),
            "unlabelled",
            ("False", "NotAllowedByListeners"),
        ),
        (
            "kind not allowed",
            with_allowed(
                http_listener("l", 80),
                json!({"kinds": [{"kind": "TLSRoute"}]}),
            ),
            NS,
            ("False", "NotAllowedByListeners"),
        ),
        (
            "TLS-only listener",
            json!({"name": "l", "port": 443, "protocol": "TLS", "tls": {"mode": "Passthrough"}}),
            NS,
            ("False", "NotAllowedByListeners"),
        ),
    ];
    for (what, l, route_ns, accepted) in cases {
        let mut s = Scenario::new(gateway(json!([l])));
        s.facts.services.insert(ObjectKey::new(route_ns, "svc"));
        s.http.push(http_route(route_ns, "r", 0, json!({"parentRefs": [{"name": "gw", "namespace": NS}], "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]})));
        let d = s.run();
        let [got_accepted, resolved] = route_conds(&d, RouteKind::HTTPRoute, "r");
        assert_eq!(got_accepted, accepted, "{what}");
        assert_eq!(resolved, ("True", "ResolvedRefs"), "{what}");
        let attached = d.status.listeners[0].attached_routes;
        assert_eq!(
            attached,
            i32::from(accepted.0 == "True"),
            "{what}: attachedRoutes"
        );
    }
}

#[test]
fn tls_and_tcp_routes_on_listeners_of_other_protocols_are_not_allowed() {
    let mut s = Scenario::new(gateway(json!([
        with_allowed(json!({"name": "only-allow-http-routes", "port": 5300, "protocol": "HTTP"}), json!({"kinds": [{"kind": "HTTPRoute"}]})),
        {"name": "https", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "cert"}]}}
    ])));
    s.tcp.push(tcp_route(NS, "tcp-route", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "only-allow-http-routes"}], "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]})));
    s.tls.push(tls_route(NS, "tls-on-https", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "https"}], "hostnames": ["tls.example.com"], "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 443}]}]})));
    let d = s.run();
    assert_eq!(
        route_conds(&d, RouteKind::TCPRoute, "tcp-route")[0],
        ("False", "NotAllowedByListeners")
    );
    assert_eq!(
        route_conds(&d, RouteKind::TLSRoute, "tls-on-https")[0],
        ("False", "NotAllowedByListeners")
    );
    assert!(d.status.listeners.iter().all(|l| l.attached_routes == 0));
}

/// Listener and route hostnames must intersect (conformance GatewayWithAttachedRoutes,
/// HTTPRouteHostnameIntersection, TLSRouteInvalidNoMatchingListenerHostname).
#[test]
fn no_matching_listener_hostname_table() {
    let listener_host =
        |host: &str| json!({"name": "l", "port": 80, "protocol": "HTTP", "hostname": host});
    let cases = [
        (
            "foo.example.com",
            json!(["not-accepted.test.com"]),
            ("False", "NoMatchingListenerHostname"),
        ),
        ("foo.example.com", json!([]), ("True", "Accepted")),
        (
            "*.wildcard.io",
            json!(["wildcard.io"]),
            ("False", "NoMatchingListenerHostname"),
        ),
        (
            "*.wildcard.io",
            json!(["non.matching.com", "foo.bar.wildcard.io"]),
            ("True", "Accepted"),
        ),
        (
            "very.specific.com",
            json!(["*.specific.com"]),
            ("True", "Accepted"),
        ),
    ];
    for (host, route_hosts, accepted) in cases {
        let mut s = Scenario::new(gateway(json!([listener_host(host)])));
        s.http.push(http_route(NS, "r", 0, json!({"parentRefs": [{"name": "gw"}], "hostnames": route_hosts, "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]})));
        let d = s.run();
        assert_eq!(
            route_conds(&d, RouteKind::HTTPRoute, "r")[0],
            accepted,
            "{host} vs {route_hosts}"
        );
    }
    // TLSRoutes follow the same rule.
    let mut s = Scenario::new(gateway(
        json!([{"name": "l", "port": 443, "protocol": "TLS", "hostname": "*.example.com", "tls": {"mode": "Passthrough"}}]),
    ));
    s.tls.push(tls_route(NS, "t", 0, json!({"parentRefs": [{"name": "gw"}], "hostnames": ["db.example.org"], "rules": [{"backendRefs": [{"name": "infra-backend-v1", "port": 443}]}]})));
    assert_eq!(
        route_conds(&s.run(), RouteKind::TLSRoute, "t")[0],
        ("False", "NoMatchingListenerHostname")
    );
}

/// attachedRoutes counts Accepted routes per listener, once per route, also on listeners
/// whose references did not resolve (conformance GatewayWithAttachedRoutes,
/// HTTPRouteHostnameIntersection "counted only if Accepted").
#[test]
fn attached_routes_counts() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "a", "port": 80, "protocol": "HTTP", "hostname": "foo.example.com"},
        {"name": "b", "port": 8080, "protocol": "HTTP"},
        {"name": "tls", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [{"name": "does-not-exist"}]}}
    ])));
    let rule = json!([{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]);
    // Every listener (no sectionName), counted once each even with a second ref to a.
    s.http.push(http_route(
        NS,
        "both",
        0,
        json!({"parentRefs": [{"name": "gw"}, {"name": "gw", "sectionName": "a"}], "rules": rule}),
    ));
    // Not a: its hostname does not intersect a's.
    s.http.push(http_route(
        NS,
        "other-host",
        0,
        json!({"parentRefs": [{"name": "gw"}], "hostnames": ["bar.example.org"], "rules": rule}),
    ));
    // Attached to the unresolved HTTPS listener, with an unresolved backend.
    s.http.push(http_route(NS, "unresolved", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "tls"}], "rules": [{"backendRefs": [{"name": "does-not-exist", "port": 8080}]}]})));
    // Not Accepted (every rule dropped): not counted.
    s.http.push(http_route(NS, "dropped", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "b"}], "rules": [{"filters": [{"type": "RequestMirror"}], "backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]})));
    let d = s.run();
    let counts: Vec<(&str, i32)> = d
        .status
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l.attached_routes))
        .collect();
    // "tls" (certificate missing) still counts the two parentRefs without sectionName and
    // "unresolved".
    assert_eq!(counts, [("a", 1), ("b", 2), ("tls", 3)]);
    let tls = listener(&d, "tls");
    assert_eq!(cond(&tls.conditions, "Programmed").0, "False");
    assert_eq!(cond(&tls.conditions, "ResolvedRefs").0, "False");
    assert_eq!(
        route_conds(&d, RouteKind::HTTPRoute, "unresolved"),
        [("True", "Accepted"), ("False", "BackendNotFound")]
    );
    assert_eq!(
        route_conds(&d, RouteKind::HTTPRoute, "dropped")[0],
        ("False", "UnsupportedValue")
    );
}

/// backendRefs (conformance HTTPRouteInvalidNonExistentBackendRef, …BackendRefUnknownKind,
/// …CrossNamespaceBackendRef, HTTPRouteReferenceGrant, HTTPRoutePartiallyInvalidViaInvalidReferenceGrant,
/// TCPRouteReferenceGrant, TLSRouteInvalidReferenceGrant).
#[test]
fn resolved_refs_table() {
    let route_grant = grant("apps", ("HTTPRoute", NS), ("Service", Some("app")));
    let all_services = grant("apps", ("HTTPRoute", NS), ("Service", None));
    let tcp_grant = grant("apps", ("TCPRoute", NS), ("Service", Some("app")));
    let cases: Vec<(&str, Value, Vec<ReferenceGrant>, Cond)> = vec![
        (
            "same namespace",
            json!({"name": "infra-backend-v1", "port": 8080}),
            vec![],
            ("True", "ResolvedRefs"),
        ),
        (
            "missing Service",
            json!({"name": "nonexistent", "port": 8080}),
            vec![],
            ("False", "BackendNotFound"),
        ),
        (
            "unknown kind",
            json!({"group": "unknownkind.example.com", "kind": "NonExistent", "name": "infra-backend-v1", "port": 8080}),
            vec![],
            ("False", "InvalidKind"),
        ),
        (
            "ServiceImport is not supported",
            json!({"group": "multicluster.x-k8s.io", "kind": "ServiceImport", "name": "x", "port": 8080}),
            vec![],
            ("False", "InvalidKind"),
        ),
        (
            "cross-namespace without grant",
            json!({"name": "app", "namespace": "apps", "port": 8080}),
            vec![],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant for another route kind",
            json!({"name": "app", "namespace": "apps", "port": 8080}),
            vec![tcp_grant],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant for another Service",
            json!({"name": "app-v2", "namespace": "apps", "port": 8080}),
            vec![route_grant.clone()],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant for this Service",
            json!({"name": "app", "namespace": "apps", "port": 8080}),
            vec![route_grant],
            ("True", "ResolvedRefs"),
        ),
        (
            "grant for all Services",
            json!({"name": "app-v2", "namespace": "apps", "port": 8080}),
            vec![all_services],
            ("True", "ResolvedRefs"),
        ),
        (
            "refused before existence is checked",
            json!({"name": "nonexistent", "namespace": "apps", "port": 8080}),
            vec![],
            ("False", "RefNotPermitted"),
        ),
    ];
    for (what, backend, grants, resolved) in cases {
        let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
        s.grants = grants;
        s.http.push(http_route(
            NS,
            "r",
            0,
            json!({"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [backend]}]}),
        ));
        let d = s.run();
        assert_eq!(
            route_conds(&d, RouteKind::HTTPRoute, "r"),
            [("True", "Accepted"), resolved],
            "{what}"
        );
        let table = routing_table(http_of(&d, "http"));
        let target = &table[0].1[0].1;
        let want_invalid = resolved.0 == "False";
        assert_eq!(
            target.starts_with("invalid:"),
            want_invalid,
            "{what}: plan target {target}"
        );
    }
}

#[test]
fn tcp_and_tls_backends_resolve_with_their_own_kind_in_grants() {
    let mut s = Scenario::new(gateway(json!([
        {"name": "tcp", "port": 5432, "protocol": "TCP"},
        {"name": "tls", "port": 443, "protocol": "TLS", "tls": {"mode": "Passthrough"}}
    ])));
    s.grants = vec![grant("apps", ("TCPRoute", NS), ("Service", Some("app")))];
    let backend = json!([{"backendRefs": [{"name": "app", "namespace": "apps", "port": 5432}]}]);
    s.tcp.push(tcp_route(
        NS,
        "tcp",
        0,
        json!({"parentRefs": [{"name": "gw", "sectionName": "tcp"}], "rules": backend}),
    ));
    s.tls.push(tls_route(NS, "tls", 0, json!({"parentRefs": [{"name": "gw", "sectionName": "tls"}], "hostnames": ["db.example.com"], "rules": backend})));
    let d = s.run();
    assert_eq!(
        route_conds(&d, RouteKind::TCPRoute, "tcp"),
        [("True", "Accepted"), ("True", "ResolvedRefs")]
    );
    assert_eq!(
        route_conds(&d, RouteKind::TLSRoute, "tls"),
        [("True", "Accepted"), ("False", "RefNotPermitted")]
    );
}

/// Rules this implementation cannot serve, with the reason each is dropped.
fn unsupported_rules() -> Vec<(&'static str, Value, &'static str)> {
    let bad = |rule: Value| {
        let mut r = rule;
        r["backendRefs"] = json!([{"name": "infra-backend-v1", "port": 8080}]);
        r
    };
    vec![
        (
            "unsupported filter",
            bad(json!({"filters": [{"type": "RequestMirror", "requestMirror": {}}]})),
            "UnsupportedValue",
        ),
        (
            "CORS filter",
            bad(json!({"filters": [{"type": "CORS"}]})),
            "UnsupportedValue",
        ),
        (
            "unknown filter type",
            bad(json!({"filters": [{"type": "Teleport"}]})),
            "UnsupportedValue",
        ),
        (
            "filter without its body",
            bad(json!({"filters": [{"type": "RequestHeaderModifier"}]})),
            "UnsupportedValue",
        ),
        (
            "one header twice",
            bad(
                json!({"filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-A", "value": "1"}], "remove": ["x-a"]}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "one filter type twice",
            bad(
                json!({"filters": [{"type": "URLRewrite", "urlRewrite": {"hostname": "a"}}, {"type": "URLRewrite", "urlRewrite": {"hostname": "b"}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "redirect with rewrite",
            bad(
                json!({"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "https"}}, {"type": "URLRewrite", "urlRewrite": {"hostname": "a"}}]}),
            ),
            "IncompatibleFilters",
        ),
        (
            "redirect scheme ftp",
            bad(
                json!({"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "ftp"}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "redirect status 305",
            bad(
                json!({"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 305}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "ReplacePrefixMatch on an Exact match",
            bad(
                json!({"matches": [{"path": {"type": "Exact", "value": "/a"}}], "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "path modifier without its value",
            bad(
                json!({"filters": [{"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplaceFullPath"}}}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "regular expression path",
            bad(json!({"matches": [{"path": {"type": "RegularExpression", "value": "/a.*"}}]})),
            "UnsupportedValue",
        ),
        (
            "regular expression header",
            bad(
                json!({"matches": [{"headers": [{"type": "RegularExpression", "name": "a", "value": ".*"}]}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "regular expression query",
            bad(
                json!({"matches": [{"queryParams": [{"type": "RegularExpression", "name": "a", "value": ".*"}]}]}),
            ),
            "UnsupportedValue",
        ),
        (
            "unknown method",
            bad(json!({"matches": [{"method": "BREW"}]})),
            "UnsupportedValue",
        ),
        (
            "relative path",
            bad(json!({"matches": [{"path": {"type": "PathPrefix", "value": "a"}}]})),
            "UnsupportedValue",
        ),
        (
            "redirect on a backendRef",
            json!({"backendRefs": [{"name": "infra-backend-v1", "port": 8080, "filters": [{"type": "RequestRedirect", "requestRedirect": {}}]}]}),
            "UnsupportedValue",
        ),
        (
            "bad timeout",
            bad(json!({"timeouts": {"request": "10 seconds"}})),
            "UnsupportedValue",
        ),
        (
            "backend timeout above request timeout",
            bad(json!({"timeouts": {"request": "1s", "backendRequest": "2s"}})),
            "UnsupportedValue",
        ),
    ]
}

/// Rules with values this implementation does not support are dropped: all dropped →
/// Accepted=False with the reason; some → Accepted=True and PartiallyInvalid=True whose
/// message starts "Dropped Rule"; none → no PartiallyInvalid.
#[test]
fn rule_validity_table() {
    let ok = json!({"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]});
    for (what, rule, reason) in unsupported_rules() {
        // Only the bad rule: not Accepted.
        let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
        s.http.push(http_route(
            NS,
            "r",
            0,
            json!({"parentRefs": [{"name": "gw"}], "rules": [rule.clone()]}),
        ));
        let d = s.run();
        assert_eq!(
            route_conds(&d, RouteKind::HTTPRoute, "r")[0],
            ("False", reason),
            "{what}: alone"
        );
        // With a valid rule: Accepted, PartiallyInvalid, the valid rule served.
        let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
        s.http.push(http_route(
            NS,
            "r",
            0,
            json!({"parentRefs": [{"name": "gw"}], "rules": [rule, ok.clone()]}),
        ));
        let d = s.run();
        let p = &parents(&d, RouteKind::HTTPRoute, "r")[0];
        assert_eq!(
            cond(&p.conditions, "Accepted"),
            ("True", "Accepted"),
            "{what}: with a valid rule"
        );
        assert_eq!(
            cond(&p.conditions, "PartiallyInvalid"),
            ("True", reason),
            "{what}"
        );
        let message = &p
            .conditions
            .iter()
            .find(|c| c.type_ == "PartiallyInvalid")
            .expect("present")
            .message;
        assert!(message.starts_with("Dropped Rule"), "{what}: {message}");
        assert_eq!(
            http_of(&d, "http").actions.len(),
            1,
            "{what}: only the valid rule is served"
        );
        assert_eq!(http_of(&d, "http").actions[0].rule_index, 1, "{what}");
    }
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(
        NS,
        "r",
        0,
        json!({"parentRefs": [{"name": "gw"}], "rules": [ok]}),
    ));
    assert!(!has_cond(
        &parents(&s.run(), RouteKind::HTTPRoute, "r")[0].conditions,
        "PartiallyInvalid"
    ));
}
