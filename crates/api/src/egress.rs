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
    doc = "Targets in the tailnet (a tailnet node's address, an IP behind a subnet router, a MagicDNS or other tailnet DNS name), each published as a Service in the operator namespace for the listed consumer namespaces, through one agent pod with its own tailnet identity. Only honoured in the operator namespace.",
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
    printcolumn = r#"{"name":"Kinds","type":"string","jsonPath":".status.kinds","priority":1}"#,
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
    /// IPv4/IPv6 address or DNS name of the target in the tailnet: a tailnet node's address
    /// (grant generated, no route), an IP behind a subnet router (grant and route approval
    /// generated), a node's MagicDNS name or another DNS name (dialed by name; must be granted
    /// in the base policy). The class is shown in `status.targets[].kind`.
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
    /// How many targets of each kind (`status.targets[].kind`), e.g.
    /// `2 TailnetNode, 1 MagicDNS, 1 SubnetRoute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<String>,
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
    /// What the address is, decided from Headscale's node list: `TailnetNode` (an address a
    /// node holds), `SubnetRoute` (behind a `routeApprovers` router), `MagicDNS` (a node's
    /// MagicDNS name) or `DNSName` (resolved by tailscaled through the tailnet's DNS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TargetKind>,
    /// The Headscale node a `TailnetNode` or `MagicDNS` target is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<TargetNode>,
    /// The grant line to add to the base policy when the live policy does not grant this
    /// egress's tag the target (MagicDNS targets; the operator generates no grant for names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_grant: Option<String>,
    /// Covering route (e.g. `192.0.2.0/24`) and its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// `Ready`, `RouteNotAdvertised`, `ServiceNameConflict`, `TargetNodeOffline`,
    /// `GrantMissing`, `NoRoute`, `Refused`, `Timeout`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// What the state means for this target and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The class of an egress target: what the operator found the address to be.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub enum TargetKind {
    /// An address a Headscale node holds (e.g. 100.64.0.7, fd7a:115c:a1e0::7): the grant is
    /// generated, no route is involved.
    TailnetNode,
    /// An address behind a subnet router of `routeApprovers`: grant and route approval.
    SubnetRoute,
    /// The MagicDNS name of a node: dialed by name; granted in the base policy.
    #[serde(rename = "MagicDNS")]
    MagicDns,
    /// Any other DNS name (e.g. Headscale split DNS): dialed by name; granted in the base.
    #[serde(rename = "DNSName")]
    DnsName,
}

impl TargetKind {
    pub fn label(self) -> &'static str {
        match self {
            TargetKind::TailnetNode => "TailnetNode",
            TargetKind::SubnetRoute => "SubnetRoute",
            TargetKind::MagicDns => "MagicDNS",
            TargetKind::DnsName => "DNSName",
        }
    }
}

/// A target's Headscale node as last observed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetNode {
    /// The node's given name (its MagicDNS host name).
    pub name: String,
    /// Headscale node id.
    pub id: String,
    pub online: bool,
    /// The node's tailnet addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty", rename = "ips")]
    pub ips: Vec<String>,
    /// When Headscale last heard from it (RFC 3339), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<String>,
    /// When its key expired (RFC 3339), only when it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<String>,
}
