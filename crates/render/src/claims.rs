//! Who claimed first: the order of claims on hostnames and tags, shared by the desired-state
//! pipeline (names, DNS entries) and the policy inputs (tags).

use std::collections::{BTreeMap, BTreeSet};

use tailnet_api::naming::{
    TagClaim, TagKey, assign_ingress_tags, entrance_tag, entrance_tag_discriminated,
};

use crate::intent::Claim;

/// The tag of every ingress of `tailnet` among `ingresses` (others' are skipped), injective
/// over (namespace, name): [`tailnet_api::naming::assign_ingress_tags`] in first-claim order
/// ([`claim_rank`]), each keeping the tag its status records. `Err(holder)`: no tag (a
/// collision even with the discriminated form), held by `holder`.
pub fn ingress_tags<'a>(
    tailnet_name: &str,
    prefix: &str,
    ingresses: impl IntoIterator<Item = &'a Claim>,
) -> BTreeMap<TagKey, Result<String, String>> {
    let mut ours: Vec<&Claim> = ingresses
        .into_iter()
        .filter(|i| i.tailnet == tailnet_name)
        .collect();
    ours.sort_by(|a, b| a.rank_key().cmp(&b.rank_key()));
    ours.dedup_by(|a, b| {
        let ((_, a_namespace, a_name), (_, b_namespace, b_name)) = (a.rank_key(), b.rank_key());
        (a.kind, a_namespace, a_name) == (b.kind, b_namespace, b_name)
    });
    let claims: Vec<TagClaim> = ours
        .iter()
        .map(|i| TagClaim {
            kind: i.kind,
            namespace: i.namespace.clone(),
            name: i.name.clone(),
            current: i.recorded_tag.clone(),
        })
        .collect();
    assign_ingress_tags(prefix, &claims)
}

/// The tag of `ingress` among `others` (which may include it and other Tailnets' ingresses),
/// exactly `ingress_tags(..)[its key]` without assigning every ingress a tag. An ingress can
/// only ever get one of its two own forms ([`ingress_tag`], [`ingress_tag_discriminated`]),
/// so only the claims whose forms overlap with its own, and transitively with theirs, can
/// change its outcome: that group alone is ranked and assigned (usually the ingress alone).
/// Every ingress reconcile asks this; assigning all 500 ingresses each time was 72 % of the
/// operator's allocations at 1,000 resources and made each reconcile cost grow with the
/// number of ingresses (benchmark 4, heaptrack). `Err(holder)` as in [`ingress_tags`];
/// `Err("")` when `ingress` is not of `tailnet_name`.
pub fn ingress_tag_of<'a>(
    tailnet_name: &str,
    prefix: &str,
    ingress: &'a Claim,
    others: impl IntoIterator<Item = &'a Claim>,
) -> Result<String, String> {
    let key = ingress.tag_key();
    let (_, own_namespace, own_name) = ingress.rank_key();
    let ours: Vec<&Claim> = others
        .into_iter()
        .chain(std::iter::once(ingress))
        .filter(|i| i.tailnet == tailnet_name)
        .collect();
    let forms: Vec<[String; 2]> = ours
        .iter()
        .map(|i| {
            let (_, namespace, name) = i.rank_key();
            [
                entrance_tag(i.kind, prefix, namespace, name),
                entrance_tag_discriminated(i.kind, prefix, namespace, name),
            ]
        })
        .collect();
    // Seeded with every entry of its own key (the caller's copy and the cache's may differ).
    let mut in_group: Vec<bool> = ours
        .iter()
        .map(|i| {
            let (_, namespace, name) = i.rank_key();
            (i.kind, namespace, name) == (ingress.kind, own_namespace, own_name)
        })
        .collect();
    if !in_group.contains(&true) {
        return Err(String::new());
    }
    let mut reachable: BTreeSet<&str> = forms
        .iter()
        .zip(&in_group)
        .filter(|(_, member)| **member)
        .flat_map(|(pair, _)| pair.iter().map(String::as_str))
        .collect();
    let mut grown = true;
    while grown {
        grown = false;
        for (index, pair) in forms.iter().enumerate() {
            if !in_group[index] && pair.iter().any(|f| reachable.contains(f.as_str())) {
                in_group[index] = true;
                reachable.extend(pair.iter().map(String::as_str));
                grown = true;
            }
        }
    }
    let group = ours
        .iter()
        .zip(&in_group)
        .filter(|(_, member)| **member)
        .map(|(i, _)| *i);
    ingress_tags(tailnet_name, prefix, group)
        .remove(&key)
        .unwrap_or_else(|| Err(String::new()))
}
