//! From declarations to the plain inputs of the policy renderer (`tailnet-policy`).

use kube::ResourceExt;
use tailnet_api::Tailnet;
use tailnet_api::naming::egress_tag;
use tailnet_api::validate;
use tailnet_policy::{
    EgressPolicy, EgressTarget, IngressPolicy, ObservedNode, PolicyInputs, TargetAddress,
};

use crate::intent::{EgressIntent, IngressIntent};

/// `namespace/name` of a namespaced object, the owner key used in policy outcomes.
pub fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The grants of one egress in the policy of `tailnet`: only when it references it, lives in
/// the operator namespace and is valid. (An invalid one is reported on its own status; the
/// controllers keep its last good grants through `last_good`.)
pub fn egress_policy(tailnet: &Tailnet, egress: &EgressIntent) -> Option<EgressPolicy> {
    if egress.claim.tailnet != tailnet.name_any() {
        return None;
    }
    let valid = egress.honoured()?;
    let mut targets: Vec<EgressTarget> = valid
        .targets
        .iter()
        .map(|t| EgressTarget {
            name: t.name.clone(),
            address: match &t.address {
                validate::TargetAddress::Ip(ip) => TargetAddress::Ip(*ip),
                validate::TargetAddress::Dns(name) => TargetAddress::Dns(name.clone()),
            },
            port: t.port,
        })
        .collect();
    targets.sort();
    Some(EgressPolicy {
        owner: owner_key(&egress.claim.namespace, &egress.claim.name),
        tag: egress_tag(&tailnet.spec.policy.tag_prefix, &egress.claim.name),
        targets,
    })
}

/// The grants of one valid ingress; `tag`: its tag from [`crate::claims::ingress_tags`]
/// (injective over the Tailnet's ingresses).
pub fn ingress_policy(
    tailnet: &Tailnet,
    ingress: &IngressIntent,
    tag: &str,
) -> Option<IngressPolicy> {
    if ingress.claim.tailnet != tailnet.name_any() {
        return None;
    }
    let valid = ingress.spec.as_ref().ok()?;
    let mut ports: Vec<u16> = valid.exposes.iter().map(|e| e.port).collect();
    ports.sort_unstable();
    ports.dedup();
    let mut allow_from = valid.allow_from.clone();
    allow_from.sort();
    allow_from.dedup();
    Some(IngressPolicy {
        kind: match ingress.claim.kind {
            tailnet_api::naming::AgentKind::Service => tailnet_policy::ResourceKind::Service,
            tailnet_api::naming::AgentKind::Gateway => tailnet_policy::ResourceKind::Gateway,
            _ => tailnet_policy::ResourceKind::TailnetIngress,
        },
        owner: owner_key(&ingress.claim.namespace, &ingress.claim.name),
        tag: tag.to_string(),
        allow_from,
        ports,
    })
}

/// All inputs of the policy of one Tailnet.
pub fn policy_inputs(
    tailnet: &Tailnet,
    installation_id: &str,
    egresses: &[EgressIntent],
    ingresses: &[IngressIntent],
    nodes: &[ObservedNode],
) -> PolicyInputs {
    let policy = &tailnet.spec.policy;
    let tags = crate::claims::ingress_tags(
        &tailnet.name_any(),
        &policy.tag_prefix,
        ingresses.iter().map(|i| &i.claim),
    );
    PolicyInputs {
        installation_id: installation_id.to_string(),
        tag_owners: policy.tag_owners.clone(),
        route_approvers: policy.route_approvers.clone(),
        ingress_source_allowlist: policy.ingress_source_allowlist.clone(),
        egresses: egresses
            .iter()
            .filter_map(|e| egress_policy(tailnet, e))
            .collect(),
        ingresses: ingresses
            .iter()
            .filter_map(|i| {
                // No tag of its own (a collision): no grants to someone else's node.
                let Some(Ok(tag)) = tags.get(&i.claim.tag_key()) else {
                    return None;
                };
                ingress_policy(tailnet, i, tag)
            })
            .collect(),
        nodes: nodes.to_vec(),
        // The owner adds accepted contributions (tailnet_render::fragment).
        contributions: Vec::new(),
    }
}
