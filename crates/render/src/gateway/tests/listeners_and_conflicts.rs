//! Listener validation and the distinctness rules between listeners.

use super::*;
use pretty_assertions::assert_eq;

fn https(name: &str, port: i32, hostname: Option<&str>, cert: Value) -> Value {
    let mut l = json!({"name": name, "port": port, "protocol": "HTTPS", "tls": {"mode": "Terminate", "certificateRefs": [cert]}});
    if let Some(h) = hostname {
        l["hostname"] = json!(h);
    }
    l
}

fn tls_passthrough(name: &str, port: i32, hostname: &str) -> Value {
    json!({"name": name, "port": port, "protocol": "TLS", "hostname": hostname, "tls": {"mode": "Passthrough"}})
}

fn cert() -> Value {
    json!({"group": "", "kind": "Secret", "name": "cert"})
}

/// Unsupported protocols: Accepted=False UnsupportedProtocol, no supported kinds, never
/// served (conformance GatewayListenerUnsupportedProtocol).
#[test]
fn unsupported_protocols() {
    for protocol in ["UDP", "INVALID", "example.com/custom"] {
        let d = Scenario::new(gateway(json!([
            http_listener("http", 80),
            {"name": "x", "port": 1111, "protocol": protocol}
        ])))
        .run();
        let l = listener(&d, "x");
        assert_eq!(
            cond(&l.conditions, "Accepted"),
            ("False", "UnsupportedProtocol"),
            "{protocol}"
        );
        assert_eq!(
            cond(&l.conditions, "Programmed"),
            ("False", "Invalid"),
            "{protocol}"
        );
        assert_eq!(kinds_of(l), Vec::<String>::new(), "{protocol}");
        assert!(
            plan(&d).listeners.iter().all(|p| p.name != "x"),
            "{protocol}"
        );
    }
}

#[test]
fn supported_kinds_follow_the_protocol() {
    let d = Scenario::new(gateway(json!([
        http_listener("http", 80),
        https("https", 443, None, cert()),
        tls_passthrough("tls", 8443, "db.example.com"),
        {"name": "tcp", "port": 5432, "protocol": "TCP"}
    ])))
    .run();
    let got: Vec<(String, Vec<String>)> = d
        .status
        .listeners
        .iter()
        .map(|l| (l.name.clone(), kinds_of(l)))
        .collect();
    let want: Vec<(String, Vec<String>)> = [
        ("http", "HTTPRoute"),
        ("https", "HTTPRoute"),
        ("tls", "TLSRoute"),
        ("tcp", "TCPRoute"),
    ]
    .iter()
    .map(|(l, k)| (l.to_string(), vec![k.to_string()]))
    .collect();
    assert_eq!(got, want);
    assert!(
        d.status
            .listeners
            .iter()
            .all(|l| l.supported_kinds[0].group.as_deref() == Some("gateway.networking.k8s.io"))
    );
}

/// `allowedRoutes.kinds` naming kinds the listener cannot serve: ResolvedRefs=False
/// InvalidRouteKinds; the servable ones stay in supportedKinds (conformance
/// GatewayInvalidRouteKind, TLSRouteListenerPassthroughSupportedKinds).
#[test]
fn invalid_route_kinds_table() {
    let cases = [
        (
            http_listener("l", 80),
            json!([{"kind": "InvalidRoute"}]),
            vec![],
        ),
        (
            http_listener("l", 80),
            json!([{"kind": "InvalidRoute"}, {"kind": "HTTPRoute"}]),
            vec!["HTTPRoute"],
        ),
        (
            http_listener("l", 80),
            json!([{"group": "example.com", "kind": "HTTPRoute"}]),
            vec![],
        ),
        (
            http_listener("l", 80),
            json!([{"kind": "TLSRoute"}]),
            vec![],
        ),
        (
            tls_passthrough("l", 443, "a.example.com"),
            json!([{"kind": "TCPRoute"}, {"kind": "TLSRoute"}]),
            vec!["TLSRoute"],
        ),
        (
            json!({"name": "l", "port": 9, "protocol": "TCP"}),
            json!([{"kind": "HTTPRoute"}]),
            vec![],
        ),
    ];
    for (mut l, kinds, want) in cases {
        l["allowedRoutes"] = json!({"namespaces": {"from": "All"}, "kinds": kinds});
        let d = Scenario::new(gateway(json!([l]))).run();
        let status = listener(&d, "l");
        assert_eq!(kinds_of(status), want, "{kinds}");
        assert_eq!(
            cond(&status.conditions, "ResolvedRefs"),
            ("False", "InvalidRouteKinds"),
            "{kinds}"
        );
        assert_eq!(
            cond(&status.conditions, "Programmed"),
            ("False", "Invalid"),
            "{kinds}"
        );
    }
    // Listing only servable kinds (twice) is fine.
    let mut l = http_listener("l", 80);
    l["allowedRoutes"] = json!({"kinds": [{"kind": "HTTPRoute"}, {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]});
    let d = Scenario::new(gateway(json!([l]))).run();
    assert_eq!(
        cond(&listener(&d, "l").conditions, "ResolvedRefs"),
        ("True", "ResolvedRefs")
    );
    assert_eq!(kinds_of(listener(&d, "l")), ["HTTPRoute"]);
}

/// certificateRefs (conformance GatewayInvalidTLSConfiguration, GatewaySecretMissingReferenceGrant,
/// GatewaySecretInvalidReferenceGrant, GatewaySecretReferenceGrant*): the listener stays
/// Accepted, ResolvedRefs says why, it is not served.
#[test]
fn certificate_refs_table() {
    let cross = json!({"group": "", "kind": "Secret", "name": "certificate", "namespace": "web"});
    let grant_all = grant("web", ("Gateway", NS), ("Secret", None));
    let grant_named = grant("web", ("Gateway", NS), ("Secret", Some("certificate")));
    let grant_other_name = grant("web", ("Gateway", NS), ("Secret", Some("other")));
    let grant_wrong_from = grant("web", ("HTTPRoute", NS), ("Secret", None));
    let cases: Vec<(&str, Value, Vec<ReferenceGrant>, Cond)> = vec![
        ("valid", cert(), vec![], ("True", "ResolvedRefs")),
        (
            "missing",
            json!({"name": "nonexistent-certificate"}),
            vec![],
            ("False", "InvalidCertificateRef"),
        ),
        (
            "malformed",
            json!({"name": "malformed"}),
            vec![],
            ("False", "InvalidCertificateRef"),
        ),
        (
            "wrong group",
            json!({"group": "wrong.group.company.io", "kind": "Secret", "name": "cert"}),
            vec![],
            ("False", "InvalidCertificateRef"),
        ),
        (
            "wrong kind",
            json!({"group": "", "kind": "WrongKind", "name": "cert"}),
            vec![],
            ("False", "InvalidCertificateRef"),
        ),
        (
            "cross-namespace without grant",
            cross.clone(),
            vec![],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant for another name",
            cross.clone(),
            vec![grant_other_name],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant from another kind",
            cross.clone(),
            vec![grant_wrong_from],
            ("False", "RefNotPermitted"),
        ),
        (
            "grant for all Secrets",
            cross.clone(),
            vec![grant_all],
            ("True", "ResolvedRefs"),
        ),
        (
            "grant for this Secret",
            cross,
            vec![grant_named],
            ("True", "ResolvedRefs"),
        ),
    ];
    for (what, reference, grants, resolved) in cases {
        let mut s = Scenario::new(gateway(json!([https("https", 443, None, reference)])));
        s.grants = grants;
        s.facts
            .secrets
            .insert(ObjectKey::new("web", "certificate"), SecretFact::TlsKeyPair);
        s.facts.secrets.insert(
            ObjectKey::new(NS, "malformed"),
            SecretFact::Unusable("tls.crt is not PEM".into()),
        );
        let d = s.run();
        let l = listener(&d, "https");
        assert_eq!(cond(&l.conditions, "ResolvedRefs"), resolved, "{what}");
        assert_eq!(
            cond(&l.conditions, "Accepted"),
            ("True", "Accepted"),
            "{what}"
        );
        assert_eq!(kinds_of(l), ["HTTPRoute"], "{what}");
        let served = plan(&d).listeners.iter().any(|p| p.name == "https");
        assert_eq!(
            served,
            resolved.0 == "True",
            "{what}: served only with its certificate"
        );
    }
}

#[test]
fn https_without_certificate_refs_is_unresolved() {
    let d = Scenario::new(gateway(json!([
        {"name": "a", "port": 443, "protocol": "HTTPS"},
        {"name": "b", "port": 8443, "protocol": "HTTPS", "tls": {"mode": "Terminate"}}
    ])))
    .run();
    for name in ["a", "b"] {
        assert_eq!(
            cond(&listener(&d, name).conditions, "ResolvedRefs"),
            ("False", "InvalidCertificateRef"),
            "{name}"
        );
    }
}

/// TLS settings a listener of each protocol may have (conformance
/// TLSRouteListenerTerminateNotSupported for TLS+Terminate).
#[test]
fn tls_settings_table() {
    let cases = [
        (
            "TLS passthrough",
            tls_passthrough("l", 443, "a.example.com"),
            json!({}),
            ("True", "Accepted"),
        ),
        (
            "TLS terminate is not supported",
            json!({"name": "l", "port": 443, "protocol": "TLS", "allowedRoutes": {"kinds": [{"kind": "TLSRoute"}]}, "tls": {"mode": "Terminate", "certificateRefs": [cert()]}}),
            json!({}),
            ("False", "UnsupportedValue"),
        ),
        (
            "TLS without mode",
            json!({"name": "l", "port": 443, "protocol": "TLS"}),
            json!({}),
            ("False", "UnsupportedValue"),
        ),
        (
            "HTTPS passthrough",
            json!({"name": "l", "port": 443, "protocol": "HTTPS", "tls": {"mode": "Passthrough", "certificateRefs": [cert()]}}),
            json!({}),
            ("False", "UnsupportedValue"),
        ),
        (
            "HTTPS with tls.options",
            json!({"name": "l", "port": 443, "protocol": "HTTPS", "tls": {"certificateRefs": [cert()], "options": {"example.com/min-version": "1.3"}}}),
            json!({}),
            ("False", "UnsupportedValue"),
        ),
        (
            "HTTP with tls",
            json!({"name": "l", "port": 80, "protocol": "HTTP", "tls": {"certificateRefs": [cert()]}}),
            json!({}),
            ("False", "UnsupportedValue"),
        ),
        (
            "HTTPS with client certificate validation",
            https("l", 443, None, cert()),
            json!({"tls": {"frontend": {"default": {"validation": {"caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}}}}}),
            ("False", "UnsupportedValue"),
        ),
        (
            "port 0",
            json!({"name": "l", "port": 0, "protocol": "HTTP"}),
            json!({}),
            ("False", "PortUnavailable"),
        ),
    ];
    for (what, l, extra, accepted) in cases {
        let d = Scenario::new(gateway_with(json!([l]), extra)).run();
        let status = listener(&d, "l");
        assert_eq!(cond(&status.conditions, "Accepted"), accepted, "{what}");
        // A mode the protocol cannot serve supports no route kinds (even when listed).
        let unservable_mode = what.contains("terminate")
            || what.contains("without mode")
            || what.contains("HTTPS passthrough");
        assert_eq!(
            status.supported_kinds.is_empty(),
            unservable_mode,
            "{what}: supportedKinds {:?}",
            status.supported_kinds
        );
        if accepted.0 == "False" {
            assert_eq!(
                cond(&status.conditions, "Programmed"),
                ("False", "Invalid"),
                "{what}"
            );
        }
    }
}

/// allowedRoutes.namespaces values that cannot be honoured refuse the listener.
#[test]
fn invalid_allowed_namespaces_table() {
    for namespaces in [
        json!({"from": "Selector"}),
        json!({"from": "Selector", "selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
        json!({"from": "None"}),
    ] {
        let mut l = http_listener("l", 80);
        l["allowedRoutes"] = json!({"namespaces": namespaces});
        let d = Scenario::new(gateway(json!([l]))).run();
        assert_eq!(
            cond(&listener(&d, "l").conditions, "Accepted"),
            ("False", "UnsupportedValue"),
            "{namespaces}"
        );
    }
}

/// Distinct listeners: one protocol family per port (HTTP | HTTPS+TLS | TCP), distinct
/// hostnames within; every indistinct listener is Conflicted and not Accepted, none wins.
#[test]
fn conflicts_table() {
    let tcp = |name: &str, port: i32| json!({"name": name, "port": port, "protocol": "TCP"});
    let http_host = |name: &str, host: &str| json!({"name": name, "port": 80, "protocol": "HTTP", "hostname": host});
    type Want = Vec<(&'static str, Option<&'static str>)>;
    let cases: Vec<(&str, Value, Want)> = vec![
        (
            "HTTP and HTTPS on one port",
            json!([http_listener("a", 443), https("b", 443, None, cert())]),
            vec![
                ("a", Some("ProtocolConflict")),
                ("b", Some("ProtocolConflict")),
            ],
        ),
        (
            "TCP and HTTP on one port",
            json!([
                tcp("a", 80),
                http_host("b", "x.example.com"),
                http_host("c", "y.example.com")
            ]),
            vec![
                ("a", Some("ProtocolConflict")),
                ("b", Some("ProtocolConflict")),
                ("c", Some("ProtocolConflict")),
            ],
        ),
        (
            "HTTPS and TLS by SNI on one port",
            json!([
                https("a", 443, Some("web.example.com"), cert()),
                tls_passthrough("b", 443, "db.example.com")
            ]),
            vec![("a", None), ("b", None)],
        ),
        (
            "HTTPS and TLS with one hostname",
            json!([
                https("a", 443, Some("x.example.com"), cert()),
                tls_passthrough("b", 443, "x.example.com")
            ]),
            vec![
                ("a", Some("HostnameConflict")),
                ("b", Some("HostnameConflict")),
            ],
        ),
        (
            "two HTTP with one hostname",
            json!([
                http_host("a", "x.example.com"),
                http_host("b", "x.example.com"),
                http_host("c", "y.example.com")
            ]),
            vec![
                ("a", Some("HostnameConflict")),
                ("b", Some("HostnameConflict")),
                ("c", None),
            ],
        ),
        (
            "two HTTP without hostname",
            json!([http_listener("a", 80), http_listener("b", 80)]),
            vec![
                ("a", Some("HostnameConflict")),
                ("b", Some("HostnameConflict")),
            ],
        ),
        (
            "two TCP on one port",
            json!([tcp("a", 9), tcp("b", 9)]),
            vec![
                ("a", Some("HostnameConflict")),
                ("b", Some("HostnameConflict")),
            ],
        ),
        (
            "same hostname on different ports",
            json!([http_host("a", "x.example.com"), {"name": "b", "port": 8080, "protocol": "HTTP", "hostname": "x.example.com"}]),
            vec![("a", None), ("b", None)],
        ),
        (
            "unsupported protocol takes no part",
            json!([http_listener("a", 80), {"name": "b", "port": 80, "protocol": "UDP"}]),
            vec![("a", None)],
        ),
    ];
    for (what, listeners, want) in cases {
        let d = Scenario::new(gateway(listeners)).run();
        for (name, conflict) in want {
            let l = listener(&d, name);
            match conflict {
                Some(reason) => {
                    assert_eq!(
                        cond(&l.conditions, "Conflicted"),
                        ("True", reason),
                        "{what}: {name}"
                    );
                    assert_eq!(
                        cond(&l.conditions, "Accepted"),
                        ("False", reason),
                        "{what}: {name}"
                    );
                    assert!(
                        d.plan
                            .as_ref()
                            .is_none_or(|p| p.listeners.iter().all(|l| l.name != name)),
                        "{what}: {name} served"
                    );
                }
                None => {
                    assert_eq!(
                        cond(&l.conditions, "Conflicted"),
                        ("False", "NoConflicts"),
                        "{what}: {name}"
                    );
                    assert_eq!(
                        cond(&l.conditions, "Accepted"),
                        ("True", "Accepted"),
                        "{what}: {name}"
                    );
                }
            }
        }
    }
}

/// OverlappingTLSConfig: HTTPS listeners on one port whose hostnames overlap; only set
/// while True.
#[test]
fn overlapping_tls_hostnames() {
    let d = Scenario::new(gateway(json!([
        https("a", 443, Some("foo.example.com"), cert()),
        https("b", 443, Some("foo.example.org"), cert()),
        https("c", 443, Some("*.example.com"), cert()),
        https("d", 8443, Some("foo.example.com"), cert()),
    ])))
    .run();
    let overlapping: Vec<(&str, bool)> = d
        .status
        .listeners
        .iter()
        .map(|l| {
            (
                l.name.as_str(),
                has_cond(&l.conditions, "OverlappingTLSConfig"),
            )
        })
        .collect();
    assert_eq!(
        overlapping,
        [("a", true), ("b", false), ("c", true), ("d", false)]
    );
    assert_eq!(
        cond(&listener(&d, "a").conditions, "OverlappingTLSConfig"),
        ("True", "OverlappingHostnames")
    );
    // Overlap is a warning, not a refusal.
    assert_eq!(
        cond(&listener(&d, "a").conditions, "Accepted"),
        ("True", "Accepted")
    );
}
