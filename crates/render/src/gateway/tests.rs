//! Table tests of the Gateway decision, one per spec rule. Objects are written as the
//! apiserver would return them (JSON), so each case reads like the manifest it stands for;
//! several cases are the conformance suite's manifests (v1.6.3) with its expected status.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};
use tailnet_gateway_api::gateway::ListenerStatus;
use tailnet_gateway_api::{
    Gateway, HTTPRoute, ReferenceGrant, RouteParentStatus, TCPRoute, TLSRoute,
};

use super::plan::{BackendTarget, GatewayPlan, HttpOutcome, HttpServe, ListenerServe, PathMatch};
use super::*;

mod decisions;
mod http_plan;
mod listeners_and_conflicts;
mod route_attachment;

const NS: &str = "infra";

/// A Gateway `infra/gw` (generation 5) with these listeners (JSON array).
fn gateway(listeners: Value) -> Gateway {
    gateway_with(listeners, json!({}))
}

/// Like [`gateway`], with extra `spec` fields merged in.
fn gateway_with(listeners: Value, extra_spec: Value) -> Gateway {
    let mut spec = json!({"gatewayClassName": "tailnet", "listeners": listeners});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    from_json(json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw", "namespace": NS, "generation": 5},
        "spec": spec,
    }))
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("test object deserializes")
}

fn meta(namespace: &str, name: &str, created_secs: i64) -> Value {
    let created = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created_secs)
        .expect("valid timestamp")
        .to_string();
    json!({"name": name, "namespace": namespace, "generation": 3, "creationTimestamp": created})
}

/// An HTTPRoute `namespace/name` created `created_secs` after a fixed instant.
fn http_route(namespace: &str, name: &str, created_secs: i64, spec: Value) -> HTTPRoute {
    from_json(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": meta(namespace, name, created_secs), "spec": spec,
    }))
}

fn tls_route(namespace: &str, name: &str, created_secs: i64, spec: Value) -> TLSRoute {
    from_json(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
        "metadata": meta(namespace, name, created_secs), "spec": spec,
    }))
}

fn tcp_route(namespace: &str, name: &str, created_secs: i64, spec: Value) -> TCPRoute {
    from_json(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": meta(namespace, name, created_secs), "spec": spec,
    }))
}

/// A ReferenceGrant in `namespace` from `(kind, namespace)` to `(kind, name?)`.
fn grant(namespace: &str, from: (&str, &str), to: (&str, Option<&str>)) -> ReferenceGrant {
    let group = |kind: &str| {
        if kind == "Secret" || kind == "Service" {
            ""
        } else {
            "gateway.networking.k8s.io"
        }
    };
    let mut to_entry = json!({"group": group(to.0), "kind": to.0});
    if let Some(name) = to.1 {
        to_entry["name"] = json!(name);
    }
    from_json(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
        "metadata": {"name": "grant", "namespace": namespace},
        "spec": {"from": [{"group": group(from.0), "kind": from.0, "namespace": from.1}], "to": [to_entry]},
    }))
}

/// Everything one decision takes; defaults: class Accepted, agent ready at 100.64.0.7.
struct Scenario {
    gateway: Gateway,
    class_accepted: Result<(), String>,
    http: Vec<HTTPRoute>,
    tls: Vec<TLSRoute>,
    tcp: Vec<TCPRoute>,
    grants: Vec<ReferenceGrant>,
    facts: ClusterFacts,
    runtime: GatewayRuntime,
}

impl Scenario {
    fn new(gateway: Gateway) -> Self {
        let mut facts = ClusterFacts::default();
        for (ns, name) in [
            (NS, "infra-backend-v1"),
            (NS, "infra-backend-v2"),
            ("apps", "app"),
            ("apps", "app-v2"),
        ] {
            facts.services.insert(ObjectKey::new(ns, name));
        }
        facts
            .secrets
            .insert(ObjectKey::new(NS, "cert"), SecretFact::TlsKeyPair);
        for ns in [NS, "apps", "other"] {
            facts.namespace_labels.insert(
                ns.to_string(),
                [("kubernetes.io/metadata.name".to_string(), ns.to_string())].into(),
            );
        }
        Scenario {
            gateway,
            class_accepted: Ok(()),
            http: Vec::new(),
            tls: Vec::new(),
            tcp: Vec::new(),
            grants: Vec::new(),
            facts,
            runtime: GatewayRuntime {
                addresses: vec!["100.64.0.7".parse::<IpAddr>().expect("ip")],
                not_ready: None,
            },
        }
    }

    fn run(&self) -> GatewayDecision {
        decide_gateway(&GatewayInputs {
            gateway: &self.gateway,
            class_accepted: &self.class_accepted,
            http_routes: &self.http,
            tls_routes: &self.tls,
            tcp_routes: &self.tcp,
            reference_grants: &self.grants,
            facts: &self.facts,
            runtime: &self.runtime,
        })
    }
}

/// `(status, reason)` of the condition of this type; panics (fails the test) when absent.
fn cond<'a>(conditions: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
    let c = conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"));
    (c.status.as_str(), c.reason.as_str())
}

fn has_cond(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_)
}

fn listener<'a>(decision: &'a GatewayDecision, name: &str) -> &'a ListenerStatus {
    decision
        .status
        .listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

fn kinds_of(status: &ListenerStatus) -> Vec<String> {
    status
        .supported_kinds
        .iter()
        .map(|k| k.kind.clone())
        .collect()
}

/// The status entries of a route for this Gateway.
fn parents<'a>(
    decision: &'a GatewayDecision,
    kind: RouteKind,
    name: &str,
) -> &'a [RouteParentStatus] {
    &decision
        .routes
        .iter()
        .find(|r| r.route.kind == kind && r.route.name == name)
        .unwrap_or_else(|| panic!("no status for {kind:?} {name}"))
        .parents
}

/// `(Accepted, ResolvedRefs)` `(status, reason)` of the route's first parent entry.
fn route_conds<'a>(
    decision: &'a GatewayDecision,
    kind: RouteKind,
    name: &str,
) -> [(&'a str, &'a str); 2] {
    let p = &parents(decision, kind, name)[0];
    [
        cond(&p.conditions, "Accepted"),
        cond(&p.conditions, "ResolvedRefs"),
    ]
}

fn plan(decision: &GatewayDecision) -> &GatewayPlan {
    decision.plan.as_ref().expect("a plan (Gateway Accepted)")
}

/// The HTTP routing of a served listener (HTTP or HTTPS).
fn http_of<'a>(decision: &'a GatewayDecision, name: &str) -> &'a HttpServe {
    let l = plan(decision)
        .listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("listener {name} not in the plan"));
    match &l.serve {
        ListenerServe::Http(h) | ListenerServe::Https { http: h, .. } => h,
        other => panic!("listener {name} is not HTTP: {other:?}"),
    }
}

/// `(status, reason)` of a condition.
type Cond = (&'static str, &'static str);

/// `(hostname, [(path, target)])` per virtual host.
type RoutingTable = Vec<(Option<String>, Vec<(String, String)>)>;

/// What each entry of each virtual host forwards to (`=path` for Exact matches; the first
/// backend's Service name, `invalid:<reason>`, `fixed:<status>` or `redirect`).
fn routing_table(serve: &HttpServe) -> RoutingTable {
    serve
        .virtual_hosts
        .iter()
        .map(|vh| {
            let entries = vh
                .entries
                .iter()
                .map(|e| {
                    let path = match &e.path {
                        PathMatch::Exact(p) => format!("={p}"),
                        PathMatch::PathPrefix(p) => p.clone(),
                    };
                    let target = match &serve.actions[e.action].outcome {
                        HttpOutcome::Forward { backends } => match &backends[0].target {
                            BackendTarget::Service { name, .. } => name.clone(),
                            BackendTarget::Invalid { reason } => format!("invalid:{reason}"),
                        },
                        HttpOutcome::Fixed { status } => format!("fixed:{status}"),
                        HttpOutcome::Redirect(_) => "redirect".to_string(),
                    };
                    (path, target)
                })
                .collect();
            (vh.hostname.clone(), entries)
        })
        .collect()
}

fn http_listener(name: &str, port: i32) -> Value {
    json!({"name": name, "port": port, "protocol": "HTTP"})
}

/// An HTTPRoute spec attached to `infra/gw` with one rule forwarding to `backend`.
fn simple_route_spec(backend: &str) -> Value {
    json!({
        "parentRefs": [{"name": "gw", "namespace": NS}],
        "rules": [{"backendRefs": [{"name": backend, "port": 8080}]}],
    })
}
