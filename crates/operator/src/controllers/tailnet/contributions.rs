//! Several installations on one Headscale (pure): the owner's merge of its contributors'
//! fragments (`policy.contributors`), and a contributor's fragment (`mode: Contribute`) with
//! how much of it is live. The merge is classify (which fragment is in force) → check (its
//! entries against the owner) → condition (`ContributionsAccepted`); the reading itself is
//! the gather step's.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::Value;
use tailnet_api::Tailnet;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::fragment::{FRAGMENT_KEY, FragmentDnsRecord, PolicyFragment, fragment_config_map};
use tailnet_api::tailnet::{
    Contributor, ContributorStatus, FragmentStatus, TailnetPolicy, contributor_state,
};
use tailnet_policy::{Contribution, ObservedNode, RenderedPolicy};
use tailnet_render::fragment::{
    CheckedFragment, OwnerContext, check_fragment, fragment_of, fragment_text, parse_fragment,
};

use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};
use super::dns::entry_bytes;
use super::observation::{ContributorRead, StoredFragment};
use tailnet_api::bounded::{MAX_MESSAGE_BYTES, bounded, bounded_lines};

/// SHA-256 of `text`, hex (the fragment's and the stored copy's identity).
use tailnet_api::digest::sha256_hex as sha256;

/// Refused entries listed per contributor in the status (the condition gives the count).
const REFUSED_LISTED: usize = 20;

/// Budget of the entries in `spec.dns.hostsConfigMap` (a ConfigMap holds at most 1 MiB): the
/// owner's own names count first and are never refused; contributed records that do not fit
/// are refused with `DnsBudgetExceeded`.
pub const DNS_BUDGET_BYTES: usize = 512 * 1024;

/// Most bytes one contributor's fragment may take in the contributions store.
pub const STORE_SHARE_BYTES: usize = 256 * 1024;

/// Most bytes all contributors' fragments may take in the contributions store (a ConfigMap
/// holds at most 1 MiB).
pub const STORE_BUDGET_BYTES: usize = 768 * 1024;

/// Name of the owner's ConfigMap with each contributor's last accepted fragment.
pub fn store_config_map(tailnet: &str) -> String {
    format!("{tailnet}-contributions")
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

/// Tags and DNS names taken before the contributors' entries are checked (the owner's base
/// and own records); each accepted entry takes its own for the contributors after it.
#[derive(Clone, Debug, Default)]
pub struct Taken {
    pub tags: BTreeSet<String>,
    pub names: BTreeSet<String>,
    /// Bytes of the DNS ConfigMap's entries admitted so far (the owner's own first), against
    /// [`DNS_BUDGET_BYTES`].
    pub dns_bytes: usize,
}

/// What the owner knows besides the taken tags and names when it checks fragments.
#[derive(Clone, Copy, Debug)]
pub struct OwnerFacts<'a> {
    pub policy: &'a TailnetPolicy,
    /// The cluster's DNS domain (never contributed).
    pub cluster_domain: &'a str,
    /// Headscale's nodes (`None`: not listed; contributed DNS records cannot be checked).
    pub nodes: Option<&'a [ObservedNode]>,
}

/// Merges every listed contributor: classify which fragment is in force (a fresh one that
/// parses replaces the stored one; an unreadable or malformed one leaves the stored one in
/// force), check its entries (in the order of the list: an earlier contributor's tags and
/// names are taken for later ones), then set `ContributionsAccepted`. Contributors no longer
/// listed are dropped from the store.
pub fn merge(
    owner: &OwnerFacts<'_>,
    contributors: &[Contributor],
    reads: &[ContributorRead],
    stored: &BTreeMap<String, StoredFragment>,
    mut taken: Taken,
    c: &mut ConditionSet,
    now: Timestamp,
) -> OwnerMerge {
    let mut out = OwnerMerge::default();
    let mut next_store = BTreeMap::new();
    let mut findings = Findings::default();
    for contributor in contributors {
        let classified = classify(contributor, reads, stored);
        let classified = within_store_budget(contributor, classified, stored, &next_store);
        let (mut status, fragment) =
            in_force(contributor, classified, now, &mut next_store, &mut findings);
        if let Some(fragment) = fragment {
            let checked = check(contributor, &fragment, owner, &mut taken);
            record_checked(contributor, checked, &mut status, &mut findings, &mut out);
        }
        out.statuses.push(status);
    }
    condition(contributors.is_empty(), findings, &out.statuses, c);
    out.store = changed_store(next_store, stored);
    out
}

/// Which fragment of a contributor is in force, and why.
enum Classified {
    /// Read now and parsed: replaces the stored copy.
    Fresh {
        text: String,
        fragment: PolicyFragment,
    },
    /// Unreadable or malformed now; the stored copy (which parses) stays in force.
    Stale {
        error: String,
        kept: StoredFragment,
        fragment: PolicyFragment,
    },
    /// Unreadable or malformed, and nothing usable stored: nothing of it is merged.
    Refused { error: String },
    /// Read now and parsed, but over its share of the store: not stored as accepted; the
    /// stored copy (if any) stays in force.
    OverStoreBudget {
        error: String,
        kept: Option<(StoredFragment, PolicyFragment)>,
    },
}

/// Classifies a contributor by what was read now and what the store keeps.
fn classify(
    contributor: &Contributor,
    reads: &[ContributorRead],
    stored: &BTreeMap<String, StoredFragment>,
) -> Classified {
    let fresh = reads.iter().find(|r| r.name == contributor.name).map(|r| {
        r.read
            .as_ref()
            .map_err(|p| p.message.clone())
            .and_then(|text| {
                parse_fragment(text, contributor)
                    .map(|f| (text.clone(), f))
                    .map_err(|e| e.to_string())
            })
    });
    let error = match fresh {
        Some(Ok((text, fragment))) => return Classified::Fresh { text, fragment },
        Some(Err(e)) => e,
        None => "not read yet".to_string(),
    };
    match previous(contributor, stored) {
        Some((kept, fragment)) => Classified::Stale {
            error,
            kept,
            fragment,
        },
        None => Classified::Refused { error },
    }
}

/// The stored copy of a contributor's fragment, if it still parses.
fn previous(
    contributor: &Contributor,
    stored: &BTreeMap<String, StoredFragment>,
) -> Option<(StoredFragment, PolicyFragment)> {
    stored.get(&contributor.name).and_then(|s| {
        parse_fragment(&s.fragment, contributor)
            .ok()
            .map(|f| (s.clone(), f))
    })
}

/// Bytes a fragment takes in the store ConfigMap: its key and its entry (the fragment's text
/// JSON-escaped, its hash and read time).
fn stored_bytes(name: &str, fragment: &str) -> usize {
    const HASH_AND_READ_TIME: usize = 160;
    let escaped = serde_json::to_string(fragment).map_or(usize::MAX / 2, |s| s.len());
    name.len() + escaped + HASH_AND_READ_TIME
}

/// A fresh fragment over its share of the store ([`STORE_SHARE_BYTES`]), or over what the
/// contributors before it left of [`STORE_BUDGET_BYTES`], is not stored as accepted: the
/// stored copy stays in force (`StoreBudgetExceeded`). Anything else passes unchanged.
fn within_store_budget(
    contributor: &Contributor,
    classified: Classified,
    stored: &BTreeMap<String, StoredFragment>,
    next_store: &BTreeMap<String, StoredFragment>,
) -> Classified {
    let Classified::Fresh { text, .. } = &classified else {
        return classified;
    };
    let bytes = stored_bytes(&contributor.name, text);
    let used: usize = next_store
        .iter()
        .map(|(name, s)| stored_bytes(name, &s.fragment))
        .sum();
    let over = if bytes > STORE_SHARE_BYTES {
        format!("its share of {STORE_SHARE_BYTES} bytes")
    } else if used.saturating_add(bytes) > STORE_BUDGET_BYTES {
        format!(
            "the {} bytes the contributors before it left of {STORE_BUDGET_BYTES}",
            STORE_BUDGET_BYTES.saturating_sub(used)
        )
    } else {
        return classified;
    };
    let error = format!(
        "{}: the fragment would take {bytes} bytes of ConfigMap {}, over {over}; it is not stored as accepted",
        reasons::STORE_BUDGET_EXCEEDED,
        store_config_map("<tailnet>"),
    );
    Classified::OverStoreBudget {
        error,
        kept: previous(contributor, stored),
    }
}

/// What the merge found wrong, for `ContributionsAccepted`.
#[derive(Default)]
struct Findings {
    /// Contributors whose stored fragment stays in force.
    stale: Vec<String>,
    /// Contributors refused, and refused entries.
    problems: Vec<String>,
}

/// The contributor's status from its classification, the store entry that follows, and the
/// fragment in force (`None`: refused).
fn in_force(
    contributor: &Contributor,
    classified: Classified,
    now: Timestamp,
    next_store: &mut BTreeMap<String, StoredFragment>,
    findings: &mut Findings,
) -> (ContributorStatus, Option<PolicyFragment>) {
    let mut status = ContributorStatus {
        name: contributor.name.clone(),
        ..ContributorStatus::default()
    };
    let fragment = match classified {
        Classified::Fresh { text, fragment } => {
            let hash = sha256(&text);
            let last_read = now.to_string();
            status.merged_hash = Some(hash.clone());
            status.last_read = Some(last_read.clone());
            let stored = StoredFragment {
                fragment: text,
                hash,
                last_read,
            };
            next_store.insert(contributor.name.clone(), stored);
            Some(fragment)
        }
        Classified::Stale {
            error,
            kept,
            fragment,
        } => {
            status.state = contributor_state::STALE.into();
            status.merged_hash = Some(kept.hash.clone());
            status.last_read = Some(kept.last_read.clone());
            findings.stale.push(format!(
                "{}: {error}; its fragment of {} stays merged",
                contributor.name, kept.last_read
            ));
            status.error = Some(bounded(&error, MAX_MESSAGE_BYTES));
            next_store.insert(contributor.name.clone(), kept);
            Some(fragment)
        }
        Classified::Refused { error } => {
            status.state = contributor_state::REFUSED.into();
            findings.problems.push(format!(
                "{}: {error}; nothing of it is merged",
                contributor.name
            ));
            status.error = Some(bounded(&error, MAX_MESSAGE_BYTES));
            None
        }
        Classified::OverStoreBudget { error, kept } => {
            let outcome = match &kept {
                Some((kept, _)) => format!("its fragment of {} stays merged", kept.last_read),
                None => "nothing of it is merged".to_string(),
            };
            findings
                .problems
                .push(format!("{}: {error}; {outcome}", contributor.name));
            status.error = Some(bounded(&error, MAX_MESSAGE_BYTES));
            let Some((kept, fragment)) = kept else {
                status.state = contributor_state::REFUSED.into();
                return (status, None);
            };
            status.state = contributor_state::STALE.into();
            status.merged_hash = Some(kept.hash.clone());
            status.last_read = Some(kept.last_read.clone());
            next_store.insert(contributor.name.clone(), kept);
            Some(fragment)
        }
    };
    (status, fragment)
}

/// Checks a fragment's entries against the owner (its prefix, its route approvers, the tags
/// and names taken so far); what it accepts is taken for the contributors after it.
fn check(
    contributor: &Contributor,
    fragment: &PolicyFragment,
    owner: &OwnerFacts<'_>,
    taken: &mut Taken,
) -> CheckedFragment {
    let mut checked = check_fragment(
        contributor,
        fragment,
        &OwnerContext {
            tag_prefix: &owner.policy.tag_prefix,
            route_approvers: &owner.policy.route_approvers,
            taken_tags: &taken.tags,
            taken_names: &taken.names,
            cluster_domain: owner.cluster_domain,
            nodes: owner.nodes,
        },
    );
    admit_dns_within_budget(&mut checked, &mut taken.dns_bytes);
    taken.tags.extend(checked.accepted.tags.iter().cloned());
    taken
        .names
        .extend(checked.dns_records.iter().map(|r| r.name.clone()));
    checked
}

/// Admits a contributor's checked DNS records, sorted by name, while they fit in what is left
/// of [`DNS_BUDGET_BYTES`] (`used`: the owner's entries and earlier contributors' admitted
/// ones); a record that does not fit is refused with `DnsBudgetExceeded`.
fn admit_dns_within_budget(checked: &mut CheckedFragment, used: &mut usize) {
    let mut records = std::mem::take(&mut checked.dns_records);
    records.sort_by(|a, b| (&a.name, &a.value).cmp(&(&b.name, &b.value)));
    for record in records {
        let bytes = entry_bytes(&record.name, &record.value);
        if used.saturating_add(bytes) <= DNS_BUDGET_BYTES {
            *used += bytes;
            checked.dns_records.push(record);
        } else {
            checked.refused.push(format!(
                "{}: DNS record {} → {}: its {bytes} bytes do not fit in the DNS ConfigMap's budget of {DNS_BUDGET_BYTES} bytes ({} used by the owner and the records admitted before it)",
                reasons::DNS_BUDGET_EXCEEDED,
                record.name,
                record.value,
                *used
            ));
        }
    }
}

/// The check's verdict into the contributor's status, the findings and the merge.
fn record_checked(
    contributor: &Contributor,
    checked: CheckedFragment,
    status: &mut ContributorStatus,
    findings: &mut Findings,
    out: &mut OwnerMerge,
) {
    status.merged = Some(checked.summary());
    // A stale contributor stays stale whatever its entries.
    if status.state.is_empty() {
        status.state = if checked.refused.is_empty() {
            contributor_state::ACCEPTED.into()
        } else {
            contributor_state::PARTLY_REFUSED.into()
        };
    }
    if !checked.refused.is_empty() {
        findings.problems.push(format!(
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
    status.refused = bounded_lines(&checked.refused, REFUSED_LISTED);
    out.dns_records.extend(
        checked
            .dns_records
            .iter()
            .map(|r| (contributor.name.clone(), r.clone())),
    );
    out.contributions.push(checked.accepted);
}

/// `ContributionsAccepted`: absent without contributors; a stale one first (an unreadable
/// source is what needs fixing before anything else changes), then refusals, else True.
fn condition(
    no_contributors: bool,
    findings: Findings,
    statuses: &[ContributorStatus],
    c: &mut ConditionSet,
) {
    let Findings {
        mut stale,
        problems,
    } = findings;
    if no_contributors {
        c.remove(types::CONTRIBUTIONS_ACCEPTED);
    } else if !stale.is_empty() {
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
                statuses.len(),
                statuses
                    .iter()
                    .map(|s| format!("{} ({})", s.name, s.merged.clone().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
}

/// The store to write, `None` when unchanged (last-read times move only with a changed
/// fragment, so only what changed is written).
fn changed_store(
    next: BTreeMap<String, StoredFragment>,
    stored: &BTreeMap<String, StoredFragment>,
) -> Option<BTreeMap<String, StoredFragment>> {
    let changed = next.len() != stored.len()
        || next
            .iter()
            .any(|(k, v)| stored.get(k).is_none_or(|s| s.hash != v.hash));
    changed.then_some(next)
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
