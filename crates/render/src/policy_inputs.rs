//! From declarations to the plain inputs of the policy renderer (`tailnet-policy`).

use kube::ResourceExt;
use tailnet_api::naming::egress_tag;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress, validate};
use tailnet_policy::{
    EgressPolicy, EgressTarget, IngressPolicy, ObservedNode, PolicyInputs, TargetAddress,
};

/// `namespace/name` of a namespaced object, the owner key used in policy outcomes.
pub fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Does this egress/ingress belong to `tailnet`?
fn references(tailnet: &Tailnet, name: &str) -> bool {
    tailnet.name_any() == name
}

/// The egresses whose grants the policy of `tailnet` carries: those that reference it, live
/// in the operator namespace and are valid. (An invalid one is reported on its own status;
/// the controllers keep its last good grants through `last_good`.)
pub fn egress_policy(
    tailnet: &Tailnet,
    egress: &TailnetEgress,
    operator_namespace: &str,
) -> Option<EgressPolicy> {
    let namespace = egress.namespace().unwrap_or_default();
    if !references(tailnet, &egress.spec.tailnet_ref.name)
        || validate::egress_namespace(&namespace, operator_namespace).is_err()
        || !validate::egress(&egress.spec).is_empty()
    {
        return None;
    }
    let mut targets: Vec<EgressTarget> = egress
        .spec
        .targets
        .iter()
        .filter_map(|t| {
            Some(EgressTarget {
                name: t.name.clone(),
                address: TargetAddress::parse(&t.address),
                port: u16::try_from(t.port).ok()?,
            })
        })
        .collect();
    targets.sort();
    Some(EgressPolicy {
        owner: owner_key(&namespace, &egress.name_any()),
        tag: egress_tag(&tailnet.spec.policy.tag_prefix, &egress.name_any()),
        targets,
    })
}

/// `tag`: the ingress's tag from [`crate::claims::ingress_tags`] (injective over the
/// Tailnet's ingresses).
pub fn ingress_policy(
    tailnet: &Tailnet,
    ingress: &TailnetIngress,
    tag: &str,
) -> Option<IngressPolicy> {
    if !references(tailnet, &ingress.spec.tailnet_ref.name)
        || !validate::ingress(&ingress.spec).is_empty()
    {
        return None;
    }
    let namespace = ingress.namespace().unwrap_or_default();
    let mut ports: Vec<u16> = ingress
        .spec
        .exposes
        .iter()
        .filter_map(|e| u16::try_from(e.port).ok())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let mut allow_from = ingress.spec.allow_from.clone();
    allow_from.sort();
    allow_from.dedup();
    Some(IngressPolicy {
        owner: owner_key(&namespace, &ingress.name_any()),
        tag: tag.to_string(),
        allow_from,
        ports,
    })
}

/// All inputs of the policy of one Tailnet.
pub fn policy_inputs(
    tailnet: &Tailnet,
    installation_id: &str,
    operator_namespace: &str,
    egresses: &[TailnetEgress],
    ingresses: &[TailnetIngress],
    nodes: &[ObservedNode],
) -> PolicyInputs {
    let policy = &tailnet.spec.policy;
    PolicyInputs {
        installation_id: installation_id.to_string(),
        tag_owners: policy.tag_owners.clone(),
        route_approvers: policy.route_approvers.clone(),
        ingress_source_allowlist: policy.ingress_source_allowlist.clone(),
        egresses: egresses
            .iter()
            .filter_map(|e| egress_policy(tailnet, e, operator_namespace))
            .collect(),
        ingresses: {
            let tags =
                crate::claims::ingress_tags(&tailnet.name_any(), &policy.tag_prefix, ingresses);
            ingresses
                .iter()
                .filter_map(|i| {
                    let key = (i.namespace().unwrap_or_default(), i.name_any());
                    // No tag of its own (a collision): no grants to someone else's node.
                    let Some(Ok(tag)) = tags.get(&key) else {
                        return None;
                    };
                    ingress_policy(tailnet, i, tag)
                })
                .collect()
        },
        nodes: nodes.to_vec(),
        // The owner adds accepted contributions (tailnet_render::fragment).
        contributions: Vec::new(),
    }
}
