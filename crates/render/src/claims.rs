//! Who claimed first: the order of claims on hostnames and tags, shared by the desired-state
//! pipeline (names, DNS entries) and the policy inputs (tags).

use std::collections::BTreeMap;

use kube::ResourceExt;
use tailnet_api::TailnetIngress;
use tailnet_api::naming::{TagClaim, assign_ingress_tags};

use crate::dns::ClaimRank;

/// The order of claims on a hostname, the same for the ingress names ([`crate::desired::claimed_elsewhere`])
/// and the DNS entries ([`crate::dns::render`]): creation time, then namespace, then name.
pub fn claim_rank(object: &impl ResourceExt) -> ClaimRank {
    ClaimRank::new(
        object.creation_timestamp().map(|t| t.0),
        &object.namespace().unwrap_or_default(),
        &object.name_any(),
    )
}

/// The tag of every ingress of `tailnet` among `ingresses` (others' are skipped), injective
/// over (namespace, name): [`tailnet_api::naming::assign_ingress_tags`] in first-claim order
/// ([`claim_rank`]), each keeping the tag its status records. `Err(holder)`: no tag (a
/// collision even with the discriminated form), held by `holder`.
pub fn ingress_tags<'a>(
    tailnet_name: &str,
    prefix: &str,
    ingresses: impl IntoIterator<Item = &'a TailnetIngress>,
) -> BTreeMap<(String, String), Result<String, String>> {
    let mut ours: Vec<&TailnetIngress> = ingresses
        .into_iter()
        .filter(|i| i.spec.tailnet_ref.name == tailnet_name)
        .collect();
    ours.sort_by_key(|i| claim_rank(*i));
    ours.dedup_by_key(|i| (i.namespace(), i.name_any()));
    let claims: Vec<TagClaim> = ours
        .iter()
        .map(|i| TagClaim {
            namespace: i.namespace().unwrap_or_default(),
            name: i.name_any(),
            current: i.status.as_ref().and_then(|s| s.tag.clone()),
        })
        .collect();
    assign_ingress_tags(prefix, &claims)
}
