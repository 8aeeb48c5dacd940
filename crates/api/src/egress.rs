//! `TailnetEgress`: stable in-cluster Services for targets reachable through the tailnet.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::TailnetRef;

/// Targets in the tailnet, each published as a Service in the operator namespace.
/// Only honoured in the operator namespace.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    doc = "Targets in the tailnet (an IP behind a subnet router, or a tailnet DNS name), each published as a Service in the operator namespace for the listed consumer namespaces, through one agent pod with its own tailnet identity. Only honoured in the operator namespace.",
    group = "tailnet-operator.dev",
    version = "v1alpha1",
    kind = "TailnetEgress",
    namespaced,
    shortname = "tne",
    category = "tailnet-operator",
    status = "TailnetEgressStatus",
    printcolumn = r#"{"name":"Tailnet","type":"string","jsonPath":".spec.tailnetRef.name"}"#,
    printcolumn = r#"{"name":"Targets","type":"string","jsonPath":".status.summary"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.tailnetIPs[0]","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TailnetEgressSpec {
    pub tailnet_ref: TailnetRef,
    /// Namespaces whose pods may connect to the target Services (enforced by NetworkPolicy).
    #[schemars(
        length(min = 1, max = 64),
        inner(length(max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub consumer_namespaces: Vec<String>,
    /// Remote targets; each becomes a Service named after it.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub targets: Vec<EgressTarget>,
    /// Concurrent connection limits of the agent (defaults: 1024 per agent, 512 per target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AgentLimits>,
}

/// Concurrent connections one agent serves. A connection beyond a limit is reset at once
/// (the client sees a prompt connection reset, not a hang) and counted in the agent's
/// `tailnet_agent_connections_refused_total`; the defaults keep the agent far below its
/// memory limit.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentLimits {
    /// Across all listeners of the agent (default 1024, at most 2048).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2048))]
    pub max_connections: Option<i32>,
    /// Per listener: an egress target, a tcp expose or an https port (default 512, at most
    /// 2048; never more than `maxConnections`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2048))]
    pub max_connections_per_listener: Option<i32>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EgressTarget {
    /// Name of the Service created for this target (RFC 1035 label).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// IPv4/IPv6 address or DNS name of the target in the tailnet. For IP targets the operator
    /// generates the grant and route approval; DNS-name targets must be granted in the base policy.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("isIP(self) || self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?\\\\.)*[a-z]([-a-z0-9]*[a-z0-9])?$')").message("must be an IPv4/IPv6 address or a lowercase DNS name"))]
    pub address: String,
    /// TCP port of the target; also the Service port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Hostnames rendered into the DNS hosts ConfigMap pointing at the Service, so TLS SNI and
    /// HTTP Host stay the remote service's own names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(
            length(max = 253),
            regex(pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub aliases: Vec<String>,
    /// Reachability probe (a TCP connect through the tailnet, no payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

/// A reachability probe. Disabled with `enabled: false`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// `false` switches probing of this target off (`TargetsReachable` then stays `Unknown`
    /// for it); default `true`.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Interval between probes (default `30s`): a duration as in Gateway API (GEP-2257), e.g.
    /// `30s`, `1m30s`, `500ms`; Go forms such as `1.5m` are accepted too. More than 0, at
    /// most `168h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 32),
        regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
    )]
    pub interval: Option<String>,
}

fn default_true() -> bool {
    true
}

/// What the operator observed; written by the operator only.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TailnetEgressStatus {
    /// `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` plus `SpecValid`, `TailnetReady`, `ServicesReady`, `AgentReady`, `NodeOnline`,
    /// `PolicyEffective`, `RoutesReady`, `TargetsReachable` (see docs/troubleshooting.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// e.g. `2/2 ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The generated tag of this egress's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Headscale node id of the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Tailnet addresses of the agent's node.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "tailnetIPs")]
    pub tailnet_ips: Vec<String>,
    /// One entry per `spec.targets` entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<EgressTargetStatus>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressTargetStatus {
    /// `spec.targets[].name`.
    pub name: String,
    /// Service name (empty while it conflicts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// ClusterIP of the Service: what consumers (and DNS aliases) connect to.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// Service port (= the target's port).
    pub port: i32,
    /// Port the agent listens on for this target (allocated, stable).
    pub agent_port: i32,
    /// Covering route (e.g. `192.0.2.0/24`) and its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// `Ready`, `RouteNotAdvertised`, `ServiceNameConflict`, `NoRoute`, `Refused`, `Timeout`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// What the state means for this target and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
