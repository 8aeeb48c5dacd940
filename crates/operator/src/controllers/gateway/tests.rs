//! The Gateway decision table: `decide` for a Gateway of a class of ours with hand-made
//! observations (no environment): Accepted/Programmed with the agent's preconditions, the
//! addresses, listeners, the agent's listeners and certificate copy, a class not Accepted,
//! and the routes' status entries (other controllers' kept, stale ones of ours removed).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tailnet_api::agent_config::IngressListener;
use tailnet_api::conditions::types;
use tailnet_api::gateway_parameters::GatewayParameters;
use tailnet_api::naming::AgentKind;
use tailnet_gateway_api::{Gateway, HTTPRoute, RouteParentStatus, TCPRoute};
use tailnet_headscale::Node;
use tailnet_render::backends::{ObjectKey, ObservedBackends};
use tailnet_render::gateway::objects::KeyPair;
use tailnet_render::gateway::{CONTROLLER_NAME, ClusterFacts, SecretFact};

use super::super::agent::decide::{self as agent, Decision};
use super::super::agent::observation::{AgentObserved, AuthSecret, Observation};
use super::super::test_fixtures as fx;
use super::decide::{GatewayEntrance, gateway_tag, merge_listeners, route_writes};
use super::observation::{ClassState, GatewayObserved};

const NS: &str = "infra";

fn gateway() -> Gateway {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {
            "name": "web", "namespace": NS, "uid": "gw-uid", "generation": 2,
            "creationTimestamp": "2026-05-01T00:00:00Z",
        },
        "spec": {
            "gatewayClassName": "tailnet",
            "listeners": [
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "wild"}]}},
                {"name": "db", "port": 5432, "protocol": "TCP",
                 "allowedRoutes": {"kinds": [{"kind": "TCPRoute"}]}},
            ],
        },
    }))
    .expect("gateway fixture")
}

fn http_route(name: &str, hostnames: &[&str], backend: &str) -> HTTPRoute {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "11",
                     "creationTimestamp": "2026-05-01T00:00:00Z"},
        "spec": {
            "parentRefs": [{"name": "web"}],
            "hostnames": hostnames,
            "rules": [{"backendRefs": [{"name": backend, "port": 8080}]}],
        },
    }))
    .expect("route fixture")
}

fn tcp_route() -> TCPRoute {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": {"name": "db", "namespace": NS, "creationTimestamp": "2026-05-01T00:00:00Z"},
        "spec": {"parentRefs": [{"name": "web", "sectionName": "db"}],
                 "rules": [{"backendRefs": [{"name": "pg", "port": 5432}]}]},
    }))
    .expect("tcp route fixture")
}

fn tag() -> String {
    gateway_tag(&fx::tailnet(&[]), &gateway(), &[]).expect("a tag")
}

fn agent_node(online: bool) -> Node {
    fx::node(
        9,
        &tailnet_api::naming::tag_hostname(&tag()),
        &tag(),
        online,
        &["100.64.0.9", "fd7a:115c:a1e0::9"],
    )
}

fn healthy() -> Observation<GatewayObserved> {
    let facts = ClusterFacts {
        secrets: BTreeMap::from([(ObjectKey::new(NS, "wild"), SecretFact::TlsKeyPair)]),
        services: [ObjectKey::new(NS, "app"), ObjectKey::new(NS, "pg")]
            .into_iter()
            .collect(),
        ..ClusterFacts::default()
    };
    Observation {
        access: Ok(fx::access(fx::tailnet(&[]))),
        agent: AgentObserved {
            nodes: Ok(Arc::new(vec![agent_node(true)])),
            auth_secret: AuthSecret::RemovedByUs,
            deployment: Some(fx::deployment(1)),
            report: Some(fx::report(vec![], vec![])),
        },
        kind: GatewayObserved {
            class: ClassState::Ours(Ok(GatewayParameters {
                tailnet: Some("demo".into()),
                allow_from: vec!["group:team-a".into()],
                in_cluster_namespaces: Vec::new(),
            })),
            others: Vec::new(),
            http_routes: vec![http_route("app", &["app.example.com"], "app")],
            tls_routes: Vec::new(),
            tcp_routes: vec![tcp_route()],
            reference_grants: Vec::new(),
            facts,
            key_pairs: BTreeMap::from([(
                ObjectKey::new(NS, "wild"),
                KeyPair {
                    certificate: b"CERT".to_vec(),
                    key: b"KEY".to_vec(),
                },
            )]),
            backends: ObservedBackends::default(),
        },
    }
}

fn run(gateway: &Gateway, observed: &Observation<GatewayObserved>) -> Decision<GatewayEntrance> {
    agent::decide::<GatewayEntrance>(gateway, &(), observed, &fx::config(), fx::now())
        .expect("decide")
}

fn seen<'a>(list: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
    fx::condition(list, type_)
}

#[test]
fn a_healthy_gateway_is_accepted_programmed_and_served() {
    let decision = run(&gateway(), &healthy());
    let list = &decision.status.conditions;
    assert_eq!(seen(list, "Accepted"), ("True", "Accepted"), "{list:#?}");
    assert_eq!(
        seen(list, "Programmed"),
        ("True", "Programmed"),
        "{list:#?}"
    );
    assert_eq!(seen(list, types::READY).0, "True");
    let addresses: Vec<&str> = decision
        .status
        .addresses
        .iter()
        .map(|a| a.value.as_str())
        .collect();
    assert_eq!(addresses, ["100.64.0.9", "fd7a:115c:a1e0::9"]);
    let listeners: Vec<(&str, i32)> = decision
        .status
        .listeners
        .iter()
        .map(|l| (l.name.as_str(), l.attached_routes))
        .collect();
    assert_eq!(listeners, [("https", 1), ("db", 1)]);
    let plan = decision.agent.expect("agent plan");
    assert_eq!(plan.tag, tag());
    assert!(plan.tag.starts_with("tag:tno-gw-infra-web"), "{}", plan.tag);
    let objects = plan.objects.expect("objects");
    let config = &objects.agent.config;
    let ports: Vec<u16> = config.ingress.iter().map(IngressListener::port).collect();
    assert_eq!(ports, [443, 5432]);
    assert!(
        matches!(&config.ingress[0], IngressListener::Http { routes, .. }
        if routes[0].hostnames == ["app.example.com"])
    );
    assert_eq!(
        config.tls.as_ref().map(|t| t.cert_file.as_str()),
        Some("/etc/tailnet-agent/tls/infra.wild.crt")
    );
    let copy = objects.certificates.expect("the certificate copy");
    assert_eq!(copy.metadata.namespace.as_deref(), Some(NS));
    let owner = &objects
        .agent
        .deployment
        .metadata
        .owner_references
        .expect("owner")[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str()),
        ("gateway.networking.k8s.io/v1", "Gateway")
    );
    assert_eq!(objects.agent.hostnames, ["app.example.com"]);
    // The routes get their first status entries.
    let written: Vec<&str> = plan
        .kind
        .routes
        .iter()
        .map(|w| w.route.name.as_str())
        .collect();
    assert_eq!(written, ["app", "db"]);
}

/// Split horizon: a class with in-cluster namespaces gives each Gateway a ClusterIP Service on
/// its listener ports, a NetworkPolicy rule admitting those namespaces to them, and an agent
/// serving its listeners on the pod IP too; without, none of it (and the same pod template:
/// the agent re-reads its config).
#[test]
fn in_cluster_namespaces_of_the_class_open_an_in_cluster_entrance() {
    let objects = |observed: &Observation<GatewayObserved>| {
        run(&gateway(), observed)
            .agent
            .expect("agent plan")
            .objects
            .expect("objects")
    };
    let tailnet_only = objects(&healthy());
    assert!(tailnet_only.agent.in_cluster_service.is_none());
    assert!(!tailnet_only.agent.config.in_cluster);
    let mut observed = healthy();
    observed.kind.class = ClassState::Ours(Ok(GatewayParameters {
        tailnet: Some("demo".into()),
        allow_from: vec!["group:team-a".into()],
        in_cluster_namespaces: vec!["team-a".into()],
    }));
    let in_cluster = objects(&observed);
    assert!(in_cluster.agent.config.in_cluster);
    let service = in_cluster
        .agent
        .in_cluster_service
        .as_ref()
        .expect("the in-cluster Service");
    assert_eq!(
        service.metadata.name.as_deref(),
        Some("tailnet-gateway-web")
    );
    let ports: Vec<i32> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|p| p.iter().map(|p| p.port).collect())
        .unwrap_or_default();
    assert_eq!(ports, [443, 5432], "the listener ports");
    let rules = in_cluster
        .agent
        .network_policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .unwrap_or_default();
    let namespaces: Vec<String> = rules
        .iter()
        .flat_map(|r| r.from.iter().flatten())
        .filter_map(|peer| peer.namespace_selector.as_ref())
        .flat_map(|s| s.match_expressions.iter().flatten())
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect();
    assert_eq!(namespaces, ["team-a"]);
    assert_eq!(
        tailnet_only
            .agent
            .deployment
            .spec
            .as_ref()
            .map(|s| &s.template),
        in_cluster
            .agent
            .deployment
            .spec
            .as_ref()
            .map(|s| &s.template),
        "toggling the in-cluster entrance does not roll the agent"
    );
}

/// A Gateway applied together with its certificate Secret is often reconciled before the
/// Secret exists: its pod template must already be the one it gets once the Secret is there
/// (a rollout in the agent's first seconds can lose tailscaled's state; conformance saw the
/// node stay offline). The config carries the certificate only once the copy exists.
#[test]
fn the_pod_template_does_not_wait_for_the_certificate() {
    let template = |observed: &Observation<GatewayObserved>| {
        let decision = run(&gateway(), observed);
        let objects = decision
            .agent
            .expect("agent plan")
            .objects
            .expect("objects");
        let has_tls = objects.agent.config.tls.is_some();
        let deployment = objects.agent.deployment;
        (
            deployment.spec.expect("spec").template,
            has_tls,
            objects.certificates.is_some(),
        )
    };
    let (with_secret, tls_with, copy_with) = template(&healthy());
    let mut before = healthy();
    before.kind.facts.secrets.clear();
    before.kind.key_pairs.clear();
    let (without_secret, tls_without, copy_without) = template(&before);
    assert_eq!(without_secret, with_secret);
    assert!(tls_with && copy_with);
    assert!(!tls_without && !copy_without);
}

#[test]
fn programmed_waits_for_the_node_naming_the_precondition() {
    let mut observed = healthy();
    observed.agent.nodes = Ok(Arc::new(vec![agent_node(false)]));
    let decision = run(&gateway(), &observed);
    let list = &decision.status.conditions;
    assert_eq!(seen(list, "Accepted"), ("True", "Accepted"));
    assert_eq!(seen(list, "Programmed"), ("False", "Pending"));
    let programmed = tailnet_api::conditions::find(list, "Programmed").expect("programmed");
    assert!(
        programmed.message.contains("NodeOnline"),
        "{}",
        programmed.message
    );
    // The agent is still deployed (the node comes online once it runs).
    assert!(decision.agent.is_some());
}

#[test]
fn a_class_not_accepted_deploys_nothing_and_says_why() {
    let mut observed = healthy();
    observed.kind.class = ClassState::Ours(Err("spec.allowFrom[0]: not allowed".into()));
    let decision = run(&gateway(), &observed);
    let list = &decision.status.conditions;
    assert_eq!(seen(list, "Accepted"), ("False", "Invalid"));
    let accepted = tailnet_api::conditions::find(list, "Accepted").expect("accepted");
    assert!(
        accepted.message.contains("spec.allowFrom[0]"),
        "{}",
        accepted.message
    );
    assert!(decision.agent.is_none());
}

#[test]
fn tags_are_the_gateway_kinds_own() {
    let t = tag();
    let ingress_form = tailnet_api::naming::entrance_tag(AgentKind::Ingress, "tno", NS, "web");
    assert_ne!(t, ingress_form);
    // Another Gateway whose dash-joined name collides gets the discriminated form.
    let mut older = gateway();
    older.metadata.namespace = Some("infra-web".into());
    older.metadata.name = Some("x".into());
    older.metadata.uid = Some("older".into());
    older.metadata.creation_timestamp = None;
    let mut later = gateway();
    later.metadata.namespace = Some("infra".into());
    later.metadata.name = Some("web-x".into());
    let a = gateway_tag(&fx::tailnet(&[]), &older, &[Arc::new(later.clone())]).expect("tag");
    let b = gateway_tag(&fx::tailnet(&[]), &later, &[Arc::new(older)]).expect("tag");
    assert_ne!(a, b);
}

fn parent_entry(controller: &str, gateway: &str, status: &str) -> RouteParentStatus {
    serde_json::from_value(serde_json::json!({
        "parentRef": {"name": gateway},
        "controllerName": controller,
        "conditions": [{"type": "Accepted", "status": status, "reason": "Accepted",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": 1}],
    }))
    .expect("parent entry")
}

#[test]
fn route_status_keeps_other_entries_and_drops_stale_ones_of_ours() {
    let observed = healthy();
    let mut route = http_route("app", &["app.example.com"], "app");
    route.status = Some(tailnet_gateway_api::RouteStatus {
        parents: vec![
            parent_entry("example.net/other", "web", "True"),
            parent_entry(CONTROLLER_NAME, "another-gateway", "True"),
        ],
    });
    // A route that no longer names the Gateway but still carries our entry for it.
    let mut stale = http_route("old", &[], "app");
    stale.spec.parent_refs.clear();
    stale.status = Some(tailnet_gateway_api::RouteStatus {
        parents: vec![parent_entry(CONTROLLER_NAME, "web", "True")],
    });
    let mut kind = observed.kind.clone();
    kind.http_routes = vec![route, stale];
    kind.tcp_routes.clear();
    let observation = Observation { kind, ..healthy() };
    let decision = run(&gateway(), &observation);
    let plan = decision.agent.expect("plan");
    let writes = &plan.kind.routes;
    assert_eq!(writes.len(), 2, "{writes:#?}");
    let app = writes.iter().find(|w| w.route.name == "app").expect("app");
    assert_eq!(app.resource_version.as_deref(), Some("11"));
    let entries: Vec<(&str, &str)> = app
        .parents
        .iter()
        .map(|p| (p.controller_name.as_str(), p.parent_ref.name.as_str()))
        .collect();
    assert_eq!(
        entries,
        [
            ("example.net/other", "web"),
            (CONTROLLER_NAME, "another-gateway"),
            (CONTROLLER_NAME, "web"),
        ]
    );
    let old = writes.iter().find(|w| w.route.name == "old").expect("old");
    assert!(old.parents.is_empty());
    // Written once: the same decision over the written status writes nothing more.
    let mut kind = observation.kind.clone();
    for (route, write) in kind.http_routes.iter_mut().zip([app, old]) {
        route.status = Some(tailnet_gateway_api::RouteStatus {
            parents: write.parents.clone(),
        });
    }
    let again = run(
        &gateway(),
        &Observation {
            kind: kind.clone(),
            ..healthy()
        },
    );
    assert!(again.agent.expect("plan").kind.routes.is_empty());
    // Without a decided entry, ours for this Gateway goes: one write (app).
    let removed = route_writes(&gateway(), &kind, &[], fx::now());
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].route.name, "app");
}

#[test]
fn listener_conditions_keep_their_transition_times() {
    let t0 = jiff::Timestamp::from_second(100).expect("t0");
    let t1 = jiff::Timestamp::from_second(200).expect("t1");
    let listener = |status: &str| tailnet_gateway_api::ListenerStatus {
        name: "https".into(),
        supported_kinds: Vec::new(),
        attached_routes: 0,
        conditions: vec![tailnet_api::conditions::condition(
            "Programmed",
            if status == "True" {
                tailnet_api::conditions::Status::True
            } else {
                tailnet_api::conditions::Status::False
            },
            "Programmed",
            "",
            Some(1),
        )],
    };
    let first = merge_listeners(&[], vec![listener("True")], t0);
    assert_eq!(first[0].conditions[0].last_transition_time.0, t0);
    let same = merge_listeners(&first, vec![listener("True")], t1);
    assert_eq!(same[0].conditions[0].last_transition_time.0, t0);
    let changed = merge_listeners(&same, vec![listener("False")], t1);
    assert_eq!(changed[0].conditions[0].last_transition_time.0, t1);
}
