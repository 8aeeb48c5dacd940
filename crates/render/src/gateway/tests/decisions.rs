//! Gateway-level decisions: Accepted, Programmed, addresses, observedGeneration.

use super::*;
use pretty_assertions::assert_eq;

#[test]
fn a_valid_gateway_is_accepted_programmed_and_reports_its_tailnet_addresses() {
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.runtime
        .addresses
        .push("fd7a:115c:a1e0::7".parse().expect("ip"));
    let d = s.run();
    assert_eq!(cond(&d.status.conditions, "Accepted"), ("True", "Accepted"));
    assert_eq!(
        cond(&d.status.conditions, "Programmed"),
        ("True", "Programmed")
    );
    let addresses: Vec<(Option<&str>, &str)> = d
        .status
        .addresses
        .iter()
        .map(|a| (a.type_.as_deref(), a.value.as_str()))
        .collect();
    assert_eq!(
        addresses,
        [
            (Some("IPAddress"), "100.64.0.7"),
            (Some("IPAddress"), "fd7a:115c:a1e0::7")
        ]
    );
    let l = listener(&d, "http");
    for type_ in ["Accepted", "Programmed", "ResolvedRefs"] {
        assert_eq!(cond(&l.conditions, type_).0, "True", "{type_}");
    }
    assert_eq!(cond(&l.conditions, "Conflicted"), ("False", "NoConflicts"));
    assert!(d.plan.is_some());
}

/// Every condition carries the object's generation (the suite waits for it).
#[test]
fn every_condition_has_the_observed_generation() {
    let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
    s.http.push(http_route(
        NS,
        "r",
        0,
        simple_route_spec("infra-backend-v1"),
    ));
    let d = s.run();
    let gateway_gens: Vec<Option<i64>> = d
        .status
        .conditions
        .iter()
        .chain(d.status.listeners.iter().flat_map(|l| l.conditions.iter()))
        .map(|c| c.observed_generation)
        .collect();
    assert!(!gateway_gens.is_empty());
    assert!(
        gateway_gens.iter().all(|g| *g == Some(5)),
        "{gateway_gens:?}"
    );
    let route_gens: Vec<Option<i64>> = parents(&d, RouteKind::HTTPRoute, "r")
        .iter()
        .flat_map(|p| p.conditions.iter().map(|c| c.observed_generation))
        .collect();
    assert!(!route_gens.is_empty());
    assert!(route_gens.iter().all(|g| *g == Some(3)), "{route_gens:?}");
}

#[test]
fn gateway_acceptance_table() {
    let class_refused = Err("TailnetGatewayParameters ops/p not found".to_string());
    // (what, gateway, class verdict, Accepted, Programmed)
    type Case = (&'static str, Gateway, Result<(), String>, Cond, Cond);
    let cases: Vec<Case> = vec![
        (
            "class not accepted",
            gateway(json!([http_listener("http", 80)])),
            class_refused,
            ("False", "Invalid"),
            ("False", "Invalid"),
        ),
        (
            "own parametersRef is not supported",
            gateway_with(
                json!([http_listener("http", 80)]),
                json!({"infrastructure": {"parametersRef": {"group": "x.dev", "kind": "P", "name": "p"}}}),
            ),
            Ok(()),
            ("False", "InvalidParameters"),
            ("False", "Invalid"),
        ),
        (
            "Hostname addresses are not supported",
            gateway_with(
                json!([http_listener("http", 80)]),
                json!({"addresses": [{"type": "Hostname", "value": "gw.example.com"}]}),
            ),
            Ok(()),
            ("False", "UnsupportedAddress"),
            ("False", "Invalid"),
        ),
        (
            "a requested address the node does not have",
            gateway_with(
                json!([http_listener("http", 80)]),
                json!({"addresses": [{"type": "IPAddress", "value": "100.64.0.9"}]}),
            ),
            Ok(()),
            ("True", "Accepted"),
            ("False", "AddressNotUsable"),
        ),
        (
            "a requested address the node has",
            gateway_with(
                json!([http_listener("http", 80)]),
                json!({"addresses": [{"value": "100.64.0.7"}]}),
            ),
            Ok(()),
            ("True", "Accepted"),
            ("True", "Programmed"),
        ),
        (
            // Conformance GatewayListenerUnsupportedProtocol, first Gateway.
            "no listener accepted",
            gateway(json!([{"name": "invalid", "port": 1111, "protocol": "INVALID"}])),
            Ok(()),
            ("False", "ListenersNotValid"),
            ("False", "Invalid"),
        ),
        (
            // Conformance GatewayListenerUnsupportedProtocol, second Gateway.
            "some listeners accepted",
            gateway(json!([
                http_listener("http", 80),
                {"name": "invalid", "port": 1111, "protocol": "INVALID"}
            ])),
            Ok(()),
            ("True", "ListenersNotValid"),
            ("True", "Programmed"),
        ),
    ];
    for (what, gw, class, accepted, programmed) in cases {
        let mut s = Scenario::new(gw);
        s.class_accepted = class;
        let d = s.run();
        assert_eq!(
            cond(&d.status.conditions, "Accepted"),
            accepted,
            "{what}: Accepted"
        );
        assert_eq!(
            cond(&d.status.conditions, "Programmed"),
            programmed,
            "{what}: Programmed"
        );
        assert_eq!(
            d.plan.is_some(),
            accepted.0 == "True",
            "{what}: plan only when Accepted"
        );
    }
}

/// Our own preconditions (agent, node, policy) appear as Programmed=False with the spec's
/// reasons, on the Gateway and (Pending) on its otherwise valid listeners.
#[test]
fn runtime_not_ready_is_programmed_false_with_the_specs_reasons() {
    let cases = [
        (
            GatewayRuntime {
                addresses: vec![],
                not_ready: None,
            },
            "AddressNotAssigned",
        ),
        (
            GatewayRuntime {
                addresses: vec!["100.64.0.7".parse().expect("ip")],
                not_ready: Some(NotReady {
                    reason: NotReadyReason::Pending,
                    message: "policy not effective yet".into(),
                }),
            },
            "Pending",
        ),
        (
            GatewayRuntime {
                addresses: vec![],
                not_ready: Some(NotReady {
                    reason: NotReadyReason::NoResources,
                    message: "agent pod unschedulable".into(),
                }),
            },
            "NoResources",
        ),
    ];
    for (runtime, reason) in cases {
        let mut s = Scenario::new(gateway(json!([http_listener("http", 80)])));
        s.runtime = runtime;
        let d = s.run();
        assert_eq!(
            cond(&d.status.conditions, "Accepted"),
            ("True", "Accepted"),
            "{reason}"
        );
        assert_eq!(cond(&d.status.conditions, "Programmed"), ("False", reason));
        let l = listener(&d, "http");
        assert_eq!(
            cond(&l.conditions, "Programmed"),
            ("False", "Pending"),
            "{reason}"
        );
        assert_eq!(
            cond(&l.conditions, "Accepted"),
            ("True", "Accepted"),
            "{reason}"
        );
        // The plan is what to program: present while the Gateway is Accepted.
        assert!(d.plan.is_some(), "{reason}");
    }
}

/// Routes that do not name this Gateway (another Gateway, another namespace, another kind of
/// parent) get no status entries from it; a route naming it twice gets one entry per ref.
#[test]
fn only_parent_refs_naming_this_gateway_get_status() {
    let mut s = Scenario::new(gateway(json!([
        http_listener("a", 80),
        http_listener("b", 8080)
    ])));
    let rule = json!([{"backendRefs": [{"name": "infra-backend-v1", "port": 8080}]}]);
    s.http.push(http_route(
        NS,
        "other-gw",
        0,
        json!({"parentRefs": [{"name": "gw2"}], "rules": rule}),
    ));
    s.http.push(http_route(
        "apps",
        "same-name-other-ns",
        0,
        json!({"parentRefs": [{"name": "gw"}], "rules": rule}),
    ));
    s.http.push(http_route(
        NS,
        "service-parent",
        0,
        json!({"parentRefs": [{"group": "", "kind": "Service", "name": "gw"}], "rules": rule}),
    ));
    s.http.push(http_route(
        NS,
        "twice",
        0,
        json!({"parentRefs": [{"name": "gw", "sectionName": "a"}, {"name": "gw2"}, {"name": "gw", "sectionName": "b"}], "rules": rule}),
    ));
    let d = s.run();
    let names: Vec<&str> = d.routes.iter().map(|r| r.route.name.as_str()).collect();
    assert_eq!(names, ["twice"]);
    let twice = parents(&d, RouteKind::HTTPRoute, "twice");
    let sections: Vec<Option<&str>> = twice
        .iter()
        .map(|p| p.parent_ref.section_name.as_deref())
        .collect();
    assert_eq!(sections, [Some("a"), Some("b")]);
    assert!(twice.iter().all(|p| p.controller_name == CONTROLLER_NAME));
    // The parentRef is echoed as written (no defaults filled in).
    assert_eq!(twice[0].parent_ref.namespace, None);
    assert_eq!(twice[0].parent_ref.group, None);
}
