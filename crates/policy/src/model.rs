//! Plain-data inputs and outputs of the renderer.
//!
//! Everything derives `Ord` so the renderer can sort whole inputs and give byte-identical
//! output whatever order the caller (watch caches, Headscale listings) delivers them in, and
//! serde (camelCase) so the `render` CLI can read observed Headscale state from a file.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::issues::{PolicyIssue, PolicyNotice};

/// Everything the renderer needs besides the base document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyInputs {
    /// Ownership marker value written into the document, e.g.
    /// `tailnet-operator/<cluster-id>/<tailnet-name>`. No control characters.
    pub installation_id: String,
    /// Owners of every generated tag (`Tailnet.spec.policy.tagOwners`).
    pub tag_owners: Vec<String>,
    /// Tags whose nodes may have routes auto-approved (`policy.routeApprovers`).
    pub route_approvers: Vec<String>,
    /// What `allowFrom` may name (`policy.ingressSourceAllowlist`); exact string match.
    pub ingress_source_allowlist: Vec<String>,
    #[serde(default)]
    pub egresses: Vec<EgressPolicy>,
    #[serde(default)]
    pub ingresses: Vec<IngressPolicy>,
    /// Nodes as Headscale reports them (`GET /api/v1/node`).
    #[serde(default)]
    pub nodes: Vec<ObservedNode>,
    /// Other installations' entries the owner accepted (already checked against each
    /// contributor's prefix and limits); rendered in their own marked block, after ours.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contributions: Vec<Contribution>,
}

/// The accepted entries of one contributor's fragment.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Contribution {
    /// The contributor's name (from the owner's `policy.contributors`).
    pub contributor: String,
    /// Its tags, owned by the owner's `policy.tagOwners`.
    pub tags: Vec<String>,
    pub grants: Vec<ContributedGrant>,
    /// Routes for `autoApprovers.routes`, approved by the owner's `routeApprovers`.
    pub routes: Vec<IpNet>,
}

/// One accepted grant, with the contributor's resource it serves (for the comment).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContributedGrant {
    pub owner: String,
    pub src: Vec<String>,
    pub dst: Vec<String>,
    pub ip: Vec<String>,
}

/// The policy-relevant part of one `TailnetEgress`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressPolicy {
    /// `namespace/name` of the resource; used in comments and outcomes.
    pub owner: String,
    /// The agent's tag, e.g. `tag:tno-egress-demo`.
    pub tag: String,
    pub targets: Vec<EgressTarget>,
}

/// One egress target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressTarget {
    pub name: String,
    pub address: TargetAddress,
    pub port: u16,
}

/// An egress target address: only IP targets get generated grants and route approvals.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TargetAddress {
    Ip(IpAddr),
    Dns(String),
}

impl TargetAddress {
    /// Classifies a spec `address` string: an IP literal, else a DNS name.
    pub fn parse(address: &str) -> Self {
        match address.parse::<IpAddr>() {
            Ok(ip) => TargetAddress::Ip(ip),
            Err(_) => TargetAddress::Dns(address.to_string()),
        }
    }
}

impl fmt::Display for TargetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetAddress::Ip(ip) => ip.fmt(f),
            TargetAddress::Dns(name) => f.write_str(name),
        }
    }
}

/// The policy-relevant part of one `TailnetIngress`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressPolicy {
    /// `TailnetIngress`, or `Service` for a Service of the tailnet `loadBalancerClass`.
    #[serde(default = "ResourceKind::ingress")]
    pub kind: ResourceKind,
    /// `namespace/name` of the resource.
    pub owner: String,
    /// The agent's tag, e.g. `tag:tno-ingress-team-a-portal`.
    pub tag: String,
    /// Policy aliases allowed to connect (`group:…`, `tag:…`, `user@`, …).
    pub allow_from: Vec<String>,
    /// Tailnet-side TCP ports of all exposes.
    pub ports: Vec<u16>,
}

/// A node as observed in Headscale.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedNode {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub ip_addresses: Vec<IpAddr>,
    /// Routes the node advertises (Headscale: `availableRoutes`).
    #[serde(default)]
    pub available_routes: Vec<IpNet>,
    /// Routes already approved (Headscale: `approvedRoutes`).
    #[serde(default)]
    pub approved_routes: Vec<IpNet>,
    #[serde(default)]
    pub online: bool,
}

/// The rendered document plus what the controllers need for status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderedPolicy {
    /// The complete HuJSON document to check and PUT.
    pub document: String,
    /// One entry per input resource, egresses first, each group sorted by owner.
    pub resources: Vec<ResourceOutcome>,
    /// `autoApprovers.routes` entries this render contributes, sorted by route.
    pub auto_approvers: Vec<AutoApproverRoute>,
    /// Document-level findings that are not tied to one resource.
    pub notices: Vec<PolicyNotice>,
    pub summary: RenderSummary,
}

impl RenderedPolicy {
    /// The outcome for a resource, by kind and `namespace/name`.
    pub fn resource(&self, kind: ResourceKind, owner: &str) -> Option<&ResourceOutcome> {
        self.resources
            .iter()
            .find(|r| r.kind == kind && r.owner == owner)
    }
}

/// Which resource kind a resource outcome belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceKind {
    TailnetEgress,
    TailnetIngress,
    /// A `Service` of the tailnet `loadBalancerClass` (an entrance like an ingress).
    Service,
    /// A Gateway API `Gateway` of a class of tailnet-operator (an entrance like an ingress).
    Gateway,
}

impl ResourceKind {
    fn ingress() -> Self {
        ResourceKind::TailnetIngress
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceKind::TailnetEgress => "TailnetEgress",
            ResourceKind::TailnetIngress => "TailnetIngress",
            ResourceKind::Service => "Service",
            ResourceKind::Gateway => "Gateway",
        })
    }
}

/// Where the tag's `tagOwners` entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TagOwnerSource {
    /// Generated by this render.
    Generated,
    /// The base already defines it with exactly the wanted owners.
    Base,
    /// Not defined by us (invalid tag, or the base owns it differently).
    None,
}

/// What the renderer did for one resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceOutcome {
    pub kind: ResourceKind,
    pub owner: String,
    pub tag: String,
    pub tag_owner: TagOwnerSource,
    /// Grants generated for this resource (empty when an issue blocks them).
    pub grants: Vec<GeneratedGrant>,
    /// Per-target results (egress only), sorted by target name.
    pub targets: Vec<TargetOutcome>,
    /// Why something was not generated; empty means everything was.
    pub issues: Vec<PolicyIssue>,
}

impl ResourceOutcome {
    /// Names of DNS-name targets that got no grant (they must be granted in the base).
    pub fn dns_targets_skipped(&self) -> Vec<&str> {
        self.targets
            .iter()
            .filter(|t| matches!(t.address, TargetAddress::Dns(_)))
            .map(|t| t.name.as_str())
            .collect()
    }
}

/// One generated grant, as written into the document.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GeneratedGrant {
    pub src: Vec<String>,
    pub dst: Vec<String>,
    pub ip: Vec<String>,
}

/// Result for one egress target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetOutcome {
    pub name: String,
    pub address: TargetAddress,
    pub port: u16,
    /// A grant for this target is in the document.
    pub granted: bool,
    /// Routes advertised by approver nodes that cover the address (IP targets only);
    /// empty means `RouteNotAdvertised`, none approved means `RouteNotApproved`.
    pub routes: Vec<CoveringRoute>,
}

/// An approver node's advertised route covering a target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CoveringRoute {
    pub route: IpNet,
    pub node_id: u64,
    pub node_name: String,
    pub approved: bool,
    pub online: bool,
}

/// One `autoApprovers.routes` entry contributed by this render.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoApproverRoute {
    pub route: IpNet,
    /// The approvers this render requires for the route (`routeApprovers`).
    pub approvers: Vec<String>,
    /// Egress resources whose targets need the route.
    pub needed_by: Vec<String>,
    /// The base already had this prefix: missing approvers were added to its list.
    pub merged_into_base: bool,
}

/// Counts for the Tailnet condition message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderSummary {
    pub egress_resources: usize,
    pub ingress_resources: usize,
    pub generated_tag_owners: usize,
    pub egress_grants: usize,
    pub ingress_grants: usize,
    pub auto_approver_routes: usize,
    pub dns_targets_skipped: usize,
    pub resources_with_issues: usize,
    /// Grants merged from contributors' fragments.
    pub contributed_grants: usize,
}

impl fmt::Display for RenderSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} egress and {} ingress resources: {} generated tag owners, {} egress grants, \
             {} ingress grants, {} auto-approved routes, {} DNS targets left to the base, \
             {} resources with issues",
            self.egress_resources,
            self.ingress_resources,
            self.generated_tag_owners,
            self.egress_grants,
            self.ingress_grants,
            self.auto_approver_routes,
            self.dns_targets_skipped,
            self.resources_with_issues
        )?;
        if self.contributed_grants > 0 {
            write!(f, ", {} contributed grants", self.contributed_grants)?;
        }
        Ok(())
    }
}

/// A route approval the operator should send: `POST /api/v1/node/{id}/approve_routes`
/// with `routes` = `approved_routes` (the full set; the endpoint replaces, never merges).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteApproval {
    pub node_id: u64,
    pub node_name: String,
    /// Routes newly approved by this call.
    pub added: Vec<IpNet>,
    /// The full new approved set: existing approvals ∪ `added`, sorted.
    pub approved_routes: Vec<IpNet>,
}
