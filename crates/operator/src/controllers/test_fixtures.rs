//! Hand-made observations for the decision tables (unit tests only): a Tailnet, an operator
//! config, Headscale nodes, Deployments and agent reports, all plain data.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use tailnet_api::Tailnet;
use tailnet_api::agent_status::{ProbeState, ProbeView, StatusReport};
use tailnet_api::conditions::{self, Status, types};
use tailnet_headscale::Node;

use super::agent::observation::TailnetView;
use super::config::OperatorConfig;

pub const OPERATOR_NAMESPACE: &str = "tailnet-system";

pub fn now() -> Timestamp {
    "2026-06-01T12:00:00Z".parse().expect("timestamp")
}

pub fn config() -> OperatorConfig {
    OperatorConfig {
        operator_namespace: OPERATOR_NAMESPACE.to_string(),
        installation_id: "test-installation".to_string(),
        headscale_poll: Duration::from_secs(10),
        headscale_timeout: Duration::from_secs(5),
        images: tailnet_render::images::Images::default(),
        cluster_domain: "cluster.local".to_string(),
        approve_routes: true,
        reapply_interval: Duration::from_secs(600),
        max_concurrent_reconciles: 16,
        scope: crate::scope::WatchScope::Cluster,
        cluster_network: None,
        restrict_agent_egress: true,
    }
}

/// A Tailnet in Apply mode; `effective_for` lists the resources whose grants are live.
pub fn tailnet(effective_for: &[&str]) -> Tailnet {
    let mut tailnet: Tailnet = serde_json::from_value(serde_json::json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "Tailnet",
        "metadata": {"name": "demo", "uid": "tailnet-uid"},
        "spec": {
            "server": "https://headscale.example.net",
            "apiSecretRef": {"name": "headscale-api", "key": "apiKey"},
            "dns": {
                "hostsConfigMap": "tailnet-hosts",
                "ingressNameTemplate": "{name}.{namespace}.lab.example.net",
                "ingressAliasTemplate": "{name}.lab.example.net"
            },
            "defaults": {"tls": {"issuerRef": {"name": "lab-ca", "kind": "ClusterIssuer"}}},
            "policy": {
                "mode": "Apply",
                "tagOwners": ["group:platform"],
                "routeApprovers": ["tag:router"],
                "ingressSourceAllowlist": ["group:team-a", "tag:laptop"]
            }
        }
    }))
    .expect("tailnet fixture");
    let mut status = tailnet.status.clone().unwrap_or_default();
    status.policy = Some(tailnet_api::tailnet::PolicyStatus {
        effective_for: effective_for.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    });
    tailnet.status = Some(status);
    tailnet
}

/// The Tailnet's `PolicyApplied` set to False with `reason`.
pub fn with_policy_applied_false(mut tailnet: Tailnet, reason: &str) -> Tailnet {
    let mut status = tailnet.status.clone().unwrap_or_default();
    status.conditions.push(conditions::condition(
        types::POLICY_APPLIED,
        Status::False,
        reason,
        "the policy is not live",
        None,
    ));
    tailnet.status = Some(status);
    tailnet
}

/// A Tailnet whose Headscale server can be used.
pub fn access(tailnet: Tailnet) -> TailnetView {
    TailnetView {
        tailnet,
        headscale: Ok(()),
        server_ca: None,
        owner_keys: None,
    }
}

pub fn node(id: u64, given_name: &str, tag: &str, online: bool, ips: &[&str]) -> Node {
    Node {
        id,
        // The hostname the node logged in with; Headscale's given name starts out the same.
        name: given_name.to_string(),
        given_name: given_name.to_string(),
        tags: vec![tag.to_string()],
        online,
        ip_addresses: ips.iter().map(|s| s.to_string()).collect(),
        ..Node::default()
    }
}

pub fn router(advertised: &[&str], approved: &[&str]) -> Node {
    Node {
        available_routes: advertised.iter().map(|s| s.to_string()).collect(),
        approved_routes: approved.iter().map(|s| s.to_string()).collect(),
        ..node(1, "site-router", "tag:router", true, &["100.64.0.1"])
    }
}

pub fn deployment(available: i32) -> Deployment {
    Deployment {
        status: Some(DeploymentStatus {
            available_replicas: Some(available),
            ..DeploymentStatus::default()
        }),
        ..Deployment::default()
    }
}

pub fn probe(name: &str, address: &str, state: ProbeState) -> ProbeView {
    ProbeView {
        name: name.to_string(),
        address: address.to_string(),
        state,
        message: String::new(),
        last_probe: None,
    }
}

/// An agent report with these target and backend probes.
pub fn report(targets: Vec<ProbeView>, backends: Vec<ProbeView>) -> StatusReport {
    StatusReport {
        ready: true,
        reasons: Vec::new(),
        tailnet: tailnet_api::agent_status::TailnetView {
            connected: true,
            backend_state: tailnet_api::agent_status::BACKEND_RUNNING.into(),
            tailnet_ips: vec!["100.64.0.9".into()],
            version: "1.102.5".into(),
            dial_self_supported: true,
            message: String::new(),
        },
        listeners: Vec::new(),
        targets,
        backends,
        certificate: Default::default(),
        config: Default::default(),
    }
}

/// `(type, status, reason)` of a condition in `list`.
pub fn condition<'a>(list: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
    conditions::find(list, type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
        .unwrap_or(("absent", "absent"))
}
