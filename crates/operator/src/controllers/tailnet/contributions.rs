//! Several installations on one Headscale (pure): the owner's merge of its contributors'
//! fragments (`policy.contributors`), and a contributor's fragment (`mode: Contribute`) with
//! how much of it is live.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tailnet_api::Tailnet;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::fragment::{FRAGMENT_KEY, FragmentDnsRecord, PolicyFragment, fragment_config_map};
use tailnet_api::tailnet::{ContributorStatus, FragmentStatus, contributor_state};
use tailnet_policy::{Contribution, RenderedPolicy};
use tailnet_render::fragment::{
    OwnerContext, check_fragment, fragment_of, fragment_text, parse_fragment,
};

use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};

/// SHA-256 of `text`, hex (the fragment's and the stored copy's identity).
use tailnet_api::digest::sha256_hex as sha256;

/// Refused entries listed per contributor in the status (the condition gives the count).
const REFUSED_LISTED: usize = 20;

/// Name of the owner's ConfigMap with each contributor's last accepted fragment.
pub fn store_config_map(tailnet: &str) -> String {
    format!("{tailnet}-contributions")
}

/// One contributor's fragment as the gather step read it; `Err`: unreadable now.
#[derive(Clone, Debug)]
pub struct ContributorRead {
    pub name: String,
    pub read: Result<String, Problem>,
}

/// What the owner keeps of a contributor (ConfigMap `<tailnet>-contributions`, one key per
/// contributor): its last fragment that parsed, so an unreadable contributor (or an owner
/// restart meanwhile) keeps its entries in the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredFragment {
    pub fragment: String,
    pub hash: String,
    pub last_read: String,
}

/// The owner's merge of all contributors.
#[derive(Clone, Debug, Default)]
pub struct OwnerMerge {
    pub contributions: Vec<Contribution>,
    /// Accepted DNS records, by contributor.
    pub dns_records: Vec<(String, FragmentDnsRecord)>,
    pub statuses: Vec<ContributorStatus>,
    /// The store as it should be (`None`: unchanged).
    pub store: Option<BTreeMap<String, StoredFragment>>,
}

/// Merges every listed contributor: a fresh fragment that parses replaces the stored one; an
/// unreadable or malformed one leaves the stored one in force (and says so). Entries are
/// checked in the order of the list (an earlier contributor's tags and names are taken for
/// later ones). Contributors no longer listed are dropped from the store.
pub fn merge(
    tailnet: &Tailnet,
    reads: &[ContributorRead],
    stored: &BTreeMap<String, StoredFragment>,
    base_tags: &BTreeSet<String>,
    own_names: &BTreeSet<String>,
    c: &mut ConditionSet,
    now: Timestamp,
) -> OwnerMerge {
    let policy = &tailnet.spec.policy;
    let mut out = OwnerMerge::default();
    let mut next_store = BTreeMap::new();
    let mut taken_tags = base_tags.clone();
    let mut taken_names = own_names.clone();
    let mut problems = Vec::new();
    let mut stale = Vec::new();
    for contributor in &policy.contributors {
        let read = reads.iter().find(|r| r.name == contributor.name);
        let fresh = read.map(|r| {
            r.read
                .as_ref()
                .map_err(|p| p.message.clone())
                .and_then(|text| {
                    parse_fragment(text, contributor)
                        .map(|f| (text.clone(), f))
                        .map_err(|e| e.to_string())
                })
        });
        let previous = stored.get(&contributor.name).and_then(|s| {
            parse_fragment(&s.fragment, contributor)
                .ok()
                .map(|f| (s.clone(), f))
        });
        let mut status = ContributorStatus {
            name: contributor.name.clone(),
            ..ContributorStatus::default()
        };
        let fragment: Option<PolicyFragment> = match (fresh, previous) {
            (Some(Ok((text, fragment))), _) => {
                let hash = sha256(&text);
                let last_read = now.to_string();
                status.merged_hash = Some(hash.clone());
                status.last_read = Some(last_read.clone());
                next_store.insert(
                    contributor.name.clone(),
                    StoredFragment {
                        fragment: text,
                        hash,
                        last_read,
                    },
                );
                Some(fragment)
            }
            (failed, previous) => {
                let error = match failed {
                    Some(Err(e)) => e,
                    _ => "not read yet".to_string(),
                };
                status.error = Some(error.clone());
                match previous {
                    Some((kept, fragment)) => {
                        status.state = contributor_state::STALE.into();
                        status.merged_hash = Some(kept.hash.clone());
                        status.last_read = Some(kept.last_read.clone());
                        stale.push(format!(
                            "{}: {error}; its fragment of {} stays merged",
                            contributor.name, kept.last_read
                        ));
                        next_store.insert(contributor.name.clone(), kept);
                        Some(fragment)
                    }
                    None => {
                        status.state = contributor_state::REFUSED.into();
                        problems.push(format!(
                            "{}: {error}; nothing of it is merged",
                            contributor.name
                        ));
                        None
                    }
                }
            }
        };
        if let Some(fragment) = fragment {
            let checked = check_fragment(
                contributor,
                &fragment,
                &OwnerContext {
                    tag_prefix: &policy.tag_prefix,
                    route_approvers: &policy.route_approvers,
                    taken_tags: &taken_tags,
                    taken_names: &taken_names,
                },
            );
            taken_tags.extend(checked.accepted.tags.iter().cloned());
            taken_names.extend(checked.dns_records.iter().map(|r| r.name.clone()));
            status.merged = Some(checked.summary());
            if status.state.is_empty() {
                status.state = if checked.refused.is_empty() {
                    contributor_state::ACCEPTED.into()
                } else {
                    contributor_state::PARTLY_REFUSED.into()
                };
            }
            if !checked.refused.is_empty() {
                problems.push(format!(
                    "{}: {} entries refused ({})",
                    contributor.name,
                    checked.refused.len(),
                    checked
                        .refused
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            status.refused = checked
                .refused
                .iter()
                .take(REFUSED_LISTED)
                .cloned()
                .collect();
            out.dns_records.extend(
                checked
                    .dns_records
                    .iter()
                    .map(|r| (contributor.name.clone(), r.clone())),
            );
            out.contributions.push(checked.accepted);
        }
        out.statuses.push(status);
    }
    if policy.contributors.is_empty() {
        c.remove(types::CONTRIBUTIONS_ACCEPTED);
    } else if !stale.is_empty() {
        // An unreadable source first: it is what needs fixing before anything else changes.
        stale.extend(problems);
        c.fail(
            types::CONTRIBUTIONS_ACCEPTED,
            Problem::new(reasons::CONTRIBUTOR_STALE, stale.join(" | ")),
        );
    } else if !problems.is_empty() {
        c.fail(
            types::CONTRIBUTIONS_ACCEPTED,
            Problem::new(reasons::CONTRIBUTION_REFUSED, problems.join(" | ")),
        );
    } else {
        c.ok(
            types::CONTRIBUTIONS_ACCEPTED,
            reasons::ACCEPTED,
            format!(
                "every entry of {} contributor(s) accepted: {}",
                out.statuses.len(),
                out.statuses
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.merged.clone().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    // Only what changed is written (last-read times move only with a changed fragment).
    let changed = next_store.len() != stored.len()
        || next_store
            .iter()
            .any(|(k, v)| stored.get(k).is_none_or(|s| s.hash != v.hash));
    if changed {
        out.store = Some(next_store);
    }
    out
}

/// The store ConfigMap's data.
pub fn store_object(
    tailnet: &Tailnet,
    config: &OperatorConfig,
    store: &BTreeMap<String, StoredFragment>,
) -> ConfigMap {
    ConfigMap {
        metadata: owned_meta(tailnet, config, store_config_map(&tailnet.name_any())),
        data: Some(
            store
                .iter()
                .filter_map(|(k, v)| serde_json::to_string(v).ok().map(|s| (k.clone(), s)))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// Parses the store ConfigMap's data (entries that do not parse are dropped).
pub fn parse_store(data: &BTreeMap<String, String>) -> BTreeMap<String, StoredFragment> {
    data.iter()
        .filter_map(|(k, v)| serde_json::from_str(v).ok().map(|s| (k.clone(), s)))
        .collect()
}

/// Metadata of a ConfigMap the Tailnet controller publishes in the operator namespace: the
/// operator's labels, owned by the Tailnet (garbage-collected with it).
pub fn owned_meta(tailnet: &Tailnet, config: &OperatorConfig, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(config.operator_namespace.clone()),
        labels: Some(BTreeMap::from([
            (
                "app.kubernetes.io/managed-by".to_string(),
                "tailnet-operator".to_string(),
            ),
            (
                tailnet_api::naming::labels::TAILNET.to_string(),
                tailnet.name_any(),
            ),
        ])),
        owner_references: tailnet.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// A contributor's fragment: the ConfigMap to publish, its status, and `FragmentLive`.
pub fn contribute(
    tailnet: &Tailnet,
    config: &OperatorConfig,
    installation_id: &str,
    rendered: &RenderedPolicy,
    dns_records: &[FragmentDnsRecord],
    live_policy: Option<&str>,
    c: &mut ConditionSet,
) -> (ConfigMap, FragmentStatus) {
    let fragment = fragment_of(
        installation_id,
        &tailnet.spec.policy.tag_prefix,
        rendered,
        dns_records,
    );
    let text = fragment_text(&fragment);
    let name = fragment_config_map(&tailnet.name_any());
    let hash = sha256(&text);
    let config_map = ConfigMap {
        metadata: owned_meta(tailnet, config, name.clone()),
        data: Some(BTreeMap::from([(FRAGMENT_KEY.to_string(), text)])),
        ..ConfigMap::default()
    };
    let summary = format!(
        "{} tags, {} grants, {} routes, {} DNS records",
        fragment.tags.len(),
        fragment.grants.len(),
        fragment.routes.len(),
        fragment.dns_records.len()
    );
    let mut status = FragmentStatus {
        config_map: name.clone(),
        hash,
        summary: summary.clone(),
        not_live: Vec::new(),
    };
    match live_policy {
        None => c.unknown(
            types::FRAGMENT_LIVE,
            Problem::new(
                reasons::HEADSCALE_UNREACHABLE,
                "the live policy cannot be read (see HeadscaleReachable)",
            ),
        ),
        Some(live) => {
            status.not_live = not_live(&fragment, live);
            if status.not_live.is_empty() {
                c.ok(
                    types::FRAGMENT_LIVE,
                    reasons::FRAGMENT_LIVE,
                    format!("the whole fragment ({summary}) is in the owner's live policy"),
                );
            } else {
                c.fail(
                    types::FRAGMENT_LIVE,
                    Problem::new(
                        reasons::FRAGMENT_NOT_LIVE,
                        format!(
                            "{} of the fragment's entries are not in the live policy (the owner has not merged ConfigMap {}/{name} yet, or refused them: see its Tailnet's status.contributors): {}",
                            status.not_live.len(),
                            config.operator_namespace,
                            status.not_live.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
                        ),
                    ),
                );
            }
        }
    }
    (config_map, status)
}

fn sorted(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Fragment entries the live policy does not have (tags, grants, routes; DNS records live in
/// Headscale's extra records, which the policy does not show).
pub fn not_live(fragment: &PolicyFragment, live: &str) -> Vec<String> {
    let Ok(parsed) = tailnet_policy::parse_base(live) else {
        return vec!["the live policy does not parse".to_string()];
    };
    let live = parsed.value();
    let mut missing = Vec::new();
    for tag in &fragment.tags {
        if live["tagOwners"].get(tag).is_none() {
            missing.push(format!("tag owner {tag}"));
        }
    }
    let live_grants: BTreeSet<(Vec<String>, Vec<String>, Vec<String>)> = live["grants"]
        .as_array()
        .map(|grants| {
            grants
                .iter()
                .map(|g| (sorted(&g["src"]), sorted(&g["dst"]), sorted(&g["ip"])))
                .collect()
        })
        .unwrap_or_default();
    for g in &fragment.grants {
        let mut key = (g.src.clone(), g.dst.clone(), g.ip.clone());
        key.0.sort();
        key.1.sort();
        key.2.sort();
        if !live_grants.contains(&key) {
            missing.push(format!(
                "grant of {} ({} → {} {})",
                g.owner,
                g.src.join(","),
                g.dst.join(","),
                g.ip.join(",")
            ));
        }
    }
    for r in &fragment.routes {
        if live["autoApprovers"]["routes"].get(&r.route).is_none() {
            missing.push(format!("autoApprovers route {}", r.route));
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::fragment::{FRAGMENT_API_VERSION, FRAGMENT_KIND, FragmentGrant};

    fn fragment() -> PolicyFragment {
        PolicyFragment {
            api_version: FRAGMENT_API_VERSION.into(),
            kind: FRAGMENT_KIND.into(),
            installation_id: "b/main".into(),
            tag_prefix: "cos".into(),
            tags: vec!["tag:cos-egress-site".into()],
            grants: vec![FragmentGrant {
                owner: "TailnetEgress/ops/site".into(),
                src: vec!["tag:cos-egress-site".into()],
                dst: vec!["192.0.2.10/32".into()],
                ip: vec!["tcp:5432".into()],
            }],
            routes: vec![],
            dns_records: vec![],
        }
    }

    #[test]
    fn live_entries_are_found_in_any_order_and_missing_ones_named() {
        let live = r#"{
            // comments are fine
            "tagOwners": {"tag:cos-egress-site": ["group:platform"]},
            "grants": [{"ip": ["tcp:5432"], "dst": ["192.0.2.10/32"], "src": ["tag:cos-egress-site"]}],
        }"#;
        assert!(not_live(&fragment(), live).is_empty());
        let missing = not_live(&fragment(), r#"{"grants": []}"#);
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(
            missing[1].starts_with("grant of TailnetEgress/ops/site"),
            "{missing:?}"
        );
    }
}
