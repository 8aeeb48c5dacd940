//! Route coverage: which routes advertised by approver nodes cover which IP targets.
//!
//! Headscale auto-approves an advertised route when an `autoApprovers.routes` prefix
//! contains it (exact key, or `prefix.Bits() <= route.Bits() && prefix.Overlaps(route)`,
//! `hscontrol/policy/v2/policy.go` `NodeCanApproveRoute`). The renderer therefore emits the
//! advertised route itself as the key. Exit routes (`/0`) are never considered: they cover
//! everything, and approving one would make the router an exit node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{
    CoveringRoute, EgressPolicy, ObservedNode, PolicyInputs, RouteApproval, TargetAddress,
};

/// A node is an approver when it carries one of the `routeApprovers` tags.
pub(crate) fn is_approver(node: &ObservedNode, route_approvers: &[String]) -> bool {
    node.tags.iter().any(|t| route_approvers.contains(t))
}

/// Routes advertised by approver nodes that cover `ip`, sorted, one per (route, node).
pub(crate) fn covering_routes(
    ip: IpAddr,
    nodes: &[ObservedNode],
    route_approvers: &[String],
) -> Vec<CoveringRoute> {
    let mut out = BTreeSet::new();
    for node in nodes.iter().filter(|n| is_approver(n, route_approvers)) {
        let approved: BTreeSet<IpNet> = node.approved_routes.iter().map(IpNet::trunc).collect();
        for route in node.available_routes.iter().map(IpNet::trunc) {
            if route.prefix_len() == 0 || !route.contains(&ip) {
                continue;
            }
            out.insert(CoveringRoute {
                route,
                node_id: node.id,
                node_name: node.name.clone(),
                approved: approved.contains(&route),
                online: node.online,
            });
        }
    }
    out.into_iter().collect()
}

/// The egresses whose routes the operator may approve: valid, uniquely tagged ones (the
/// same input-level rules the renderer applies; base-level issues are not known here).
pub(crate) fn eligible_egresses(inputs: &PolicyInputs) -> Vec<&EgressPolicy> {
    let mut tag_count: BTreeMap<&str, usize> = BTreeMap::new();
    for tag in inputs
        .egresses
        .iter()
        .map(|e| e.tag.as_str())
        .chain(inputs.ingresses.iter().map(|i| i.tag.as_str()))
    {
        *tag_count.entry(tag).or_default() += 1;
    }
    inputs
        .egresses
        .iter()
        .filter(|e| crate::tags::valid_tag(&e.tag) && tag_count.get(e.tag.as_str()) == Some(&1))
        .collect()
}

/// Advertised-by-approver routes covering IP targets that are not approved yet, per node,
/// with the full new approved set (existing approvals ∪ new; nothing is ever removed,
/// because `approve_routes` replaces the node's set). Sorted by node id; nodes with nothing
/// to add are omitted. Uses the same eligibility as [`crate::render`] except base-level
/// issues (e.g. `TagOwnedDifferently`), which need the base.
pub fn routes_needing_approval(inputs: &PolicyInputs) -> Vec<RouteApproval> {
    let mut needed: BTreeMap<u64, BTreeSet<IpNet>> = BTreeMap::new();
    for egress in eligible_egresses(inputs) {
        for target in &egress.targets {
            let TargetAddress::Ip(ip) = target.address else {
                continue;
            };
            if target.port == 0 {
                continue;
            }
            for cover in covering_routes(ip, &inputs.nodes, &inputs.route_approvers) {
                if !cover.approved {
                    needed.entry(cover.node_id).or_default().insert(cover.route);
                }
            }
        }
    }

    // Contributors' routes (accepted by the owner): approved on the approver nodes that
    // advertise exactly them, as `autoApprovers` would on the next change. Never an exit
    // route, whoever asks.
    for contribution in &inputs.contributions {
        for route in contribution.routes.iter().filter(|r| r.prefix_len() != 0) {
            for node in inputs
                .nodes
                .iter()
                .filter(|n| n.tags.iter().any(|t| inputs.route_approvers.contains(t)))
                .filter(|n| {
                    n.available_routes.contains(route) && !n.approved_routes.contains(route)
                })
            {
                needed.entry(node.id).or_default().insert(*route);
            }
        }
    }

    let mut out = Vec::new();
    for (node_id, mut added) in needed {
        // The last guard: the catch-up never approves an exit route (`0.0.0.0/0`, `::/0`).
        added.retain(|r| r.prefix_len() != 0);
        if added.is_empty() {
            continue;
        }
        // Several entries with one id would be a Headscale bug; take the first by sort order.
        let mut candidates: Vec<&ObservedNode> =
            inputs.nodes.iter().filter(|n| n.id == node_id).collect();
        candidates.sort();
        let Some(node) = candidates.first() else {
            continue;
        };
        let mut approved: BTreeSet<IpNet> = node.approved_routes.iter().copied().collect();
        approved.extend(added.iter().copied());
        out.push(RouteApproval {
            node_id,
            node_name: node.name.clone(),
            added: added.into_iter().collect(),
            approved_routes: approved.into_iter().collect(),
        });
    }
    out
}
