//! Property tests (proptest) of the identities derived from (kind, namespace, name): tags,
//! node hostnames and agent object names must be injective whatever the lengths and dashes,
//! and recorded identities must survive a re-assignment (upgrade safety).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tailnet_api::naming::{
    AgentKind, AgentNames, MAX_AGENT_NAME, MAX_NAME, TagClaim, assign_ingress_tags, egress_tag,
    ingress_tag, tag_hostname,
};

/// A Kubernetes DNS label (namespace or object name): short ones make the dash-joined forms
/// collide often, long ones exercise the hashed shortening.
fn label() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]([a-z0-9-]{0,3}[a-z0-9])?",
        "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    ]
}

/// (namespace, name) pairs, with adversarial pairs added: for `a`, `b`, `c` both `a-b`/`c` and
/// `a`/`b-c` (the same dash-joined string, the lab's `team-x/dev-api` vs `team-x-dev/api`).
fn claims() -> impl Strategy<Value = Vec<(String, String)>> {
    (
        prop::collection::vec((label(), label()), 1..24),
        prop::collection::vec((label(), label(), label()), 0..6),
    )
        .prop_map(|(mut pairs, triples)| {
            for (a, b, c) in triples {
                pairs.push((format!("{a}-{b}"), c.clone()));
                pairs.push((a, format!("{b}-{c}")));
            }
            let mut seen = BTreeSet::new();
            pairs.retain(|p| p.0.len() <= 63 && p.1.len() <= 63 && seen.insert(p.clone()));
            pairs
        })
}

fn valid_tag_body(tag: &str) -> bool {
    let Some(body) = tag.strip_prefix("tag:") else {
        return false;
    };
    body.len() <= MAX_NAME
        && !body.starts_with('-')
        && !body.ends_with('-')
        && body
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Distinct (kind, namespace, name) of one Tailnet get distinct, valid tags and
    /// hostnames: every pair is claimed by a TailnetIngress and by a Service of the same name.
    #[test]
    fn ingress_identities_are_injective(pairs in claims(), prefix in "[a-z]{1,8}") {
        let claims: Vec<TagClaim> = pairs
            .iter()
            .flat_map(|(namespace, name)| [AgentKind::Ingress, AgentKind::Service].map(|kind| TagClaim {
                kind,
                namespace: namespace.clone(),
                name: name.clone(),
                current: None,
            }))
            .collect();
        let tags = assign_ingress_tags(&prefix, &claims);
        let mut by_tag = BTreeMap::new();
        let mut hostnames = BTreeSet::new();
        for c in &claims {
            let tag = tags[&(c.kind, c.namespace.clone(), c.name.clone())].clone();
            let tag = match tag {
                Ok(tag) => tag,
                Err(holder) => return Err(TestCaseError::fail(format!("{c:?} got no tag (held by {holder})"))),
            };
            prop_assert!(valid_tag_body(&tag), "{}", tag);
            if let Some(other) = by_tag.insert(tag.clone(), c.clone()) {
                return Err(TestCaseError::fail(format!("{other:?} and {c:?} share {tag}")));
            }
            let hostname = tag_hostname(&tag);
            prop_assert!(hostname.len() <= 63);
            prop_assert!(hostnames.insert(hostname.clone()), "hostname {} twice", hostname);
            // Agent objects live in the resource's namespace: the base name must be
            // injective over the name and fit the object name limit.
            prop_assert!(AgentNames::new(AgentKind::Ingress, &c.name).base.len() <= MAX_AGENT_NAME);
        }
    }

    /// Re-assigning with the recorded tags (the status after an upgrade, in any claim order)
    /// keeps every identity, and a newcomer still gets a distinct one.
    #[test]
    fn recorded_tags_survive_reassignment(pairs in claims(), newcomer in (label(), label())) {
        let first: Vec<TagClaim> = pairs
            .iter()
            .map(|(namespace, name)| TagClaim { kind: AgentKind::Ingress, namespace: namespace.clone(), name: name.clone(), current: None })
            .collect();
        let assigned = assign_ingress_tags("tno", &first);
        let mut recorded: Vec<TagClaim> = first
            .iter()
            .map(|c| TagClaim {
                current: assigned[&(c.kind, c.namespace.clone(), c.name.clone())].clone().ok(),
                ..c.clone()
            })
            .collect();
        recorded.reverse();
        let newcomer_key = newcomer.clone();
        if !pairs.contains(&newcomer_key) {
            recorded.push(TagClaim { kind: AgentKind::Ingress, namespace: newcomer.0, name: newcomer.1, current: None });
        }
        let again = assign_ingress_tags("tno", &recorded);
        let mut distinct = BTreeSet::new();
        for c in &recorded {
            let key = (c.kind, c.namespace.clone(), c.name.clone());
            if let Some(before) = &c.current {
                prop_assert_eq!(again[&key].as_ref().ok(), Some(before), "{:?} lost its tag", key);
            }
            let tag = again[&key].clone().map_err(|h| TestCaseError::fail(format!("{key:?}: held by {h}")))?;
            prop_assert!(distinct.insert(tag.clone()), "{} twice", tag);
        }
    }

    /// Egress tags (egresses only live in the operator namespace) are injective over the name,
    /// and their agent names too.
    #[test]
    fn egress_identities_are_injective(names in prop::collection::btree_set(label(), 1..40)) {
        let mut tags = BTreeSet::new();
        let mut bases = BTreeSet::new();
        for name in &names {
            let tag = egress_tag("tno", name);
            prop_assert!(valid_tag_body(&tag), "{}", tag);
            prop_assert!(tags.insert(tag.clone()), "{} twice", tag);
            let base = AgentNames::new(AgentKind::Egress, name).base;
            prop_assert!(base.len() <= MAX_AGENT_NAME);
            prop_assert!(bases.insert(base.clone()), "{} twice", base);
        }
    }
}

/// The lab's pair, fixed: the first claim keeps today's form.
#[test]
fn the_lab_pair_keeps_the_first_claims_tag() {
    let claims = [("team-x", "dev-api"), ("team-x-dev", "api")].map(|(namespace, name)| TagClaim {
        kind: AgentKind::Ingress,
        namespace: namespace.into(),
        name: name.into(),
        current: None,
    });
    let tags = assign_ingress_tags("tno", &claims);
    let first = tags[&(
        AgentKind::Ingress,
        "team-x".to_string(),
        "dev-api".to_string(),
    )]
        .clone();
    let second = tags[&(
        AgentKind::Ingress,
        "team-x-dev".to_string(),
        "api".to_string(),
    )]
        .clone();
    assert_eq!(first, Ok(ingress_tag("tno", "team-x", "dev-api")));
    assert_ne!(first, second);
}
