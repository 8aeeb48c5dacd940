//! Which resources' grants are live in Headscale's current policy (pure). Egress/ingress
//! controllers report `PolicyEffective` from this, so DryRun, a rejected policy or a manual
//! edit that removed a grant all show up truthfully.

use std::collections::BTreeSet;

use serde_json::Value;
use tailnet_policy::{GeneratedGrant, ResourceOutcome};

/// A grant normalised for comparison: sorted `src`, `dst` and `ip`.
fn normalise(
    src: &[String],
    dst: &[String],
    ip: &[String],
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v.dedup();
        v
    };
    (sorted(src), sorted(dst), sorted(ip))
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `Kind/namespace/name` of a policy outcome.
pub fn resource_key(outcome: &ResourceOutcome) -> String {
    format!("{}/{}", outcome.kind, outcome.owner)
}

/// Resources whose tag owner and every generated grant are present in `live` (the HuJSON
/// document Headscale currently enforces). Resources with issues are never effective.
pub fn effective_resources(live: &str, outcomes: &[ResourceOutcome]) -> Vec<String> {
    let Ok(base) = tailnet_policy::parse_base(live) else {
        return Vec::new();
    };
    let doc = base.value();
    let live_grants: BTreeSet<_> = doc
        .get("grants")
        .and_then(|g| g.as_array())
        .into_iter()
        .flatten()
        .map(|g| {
            normalise(
                &strings(g.get("src")),
                &strings(g.get("dst")),
                &strings(g.get("ip")),
            )
        })
        .collect();
    let tag_owners = doc.get("tagOwners").and_then(|t| t.as_object());
    let has = |g: &GeneratedGrant| live_grants.contains(&normalise(&g.src, &g.dst, &g.ip));
    let mut effective: Vec<String> = outcomes
        .iter()
        // Partly granted resources (allowFrom partly outside the allowlist) are effective for
        // the sources that got a grant; their SourcesAllowed condition names the rest.
        .filter(|o| o.issues.iter().all(|i| !i.blocks_grants()))
        .filter(|o| o.issues.is_empty() || !o.grants.is_empty())
        .filter(|o| tag_owners.is_some_and(|t| t.contains_key(&o.tag)))
        .filter(|o| o.grants.iter().all(has))
        .map(resource_key)
        .collect();
    effective.sort();
    effective
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_policy::{EgressPolicy, EgressTarget, IngressPolicy, PolicyInputs, TargetAddress};

    fn rendered() -> tailnet_policy::RenderedPolicy {
        let base =
            tailnet_policy::parse_base(r#"{"groups": {"group:team-a": ["bob@"]}, "grants": []}"#)
                .expect("base");
        let inputs = PolicyInputs {
            installation_id: "test".into(),
            tag_owners: vec!["group:team-a".into()],
            route_approvers: vec![],
            ingress_source_allowlist: vec!["group:team-a".into()],
            egresses: vec![EgressPolicy {
                owner: "tailnet-system/e".into(),
                tag: "tag:tno-egress-e".into(),
                targets: vec![EgressTarget {
                    name: "db".into(),
                    address: TargetAddress::parse("192.0.2.10"),
                    port: 5432,
                }],
            }],
            ingresses: vec![IngressPolicy {
                kind: tailnet_policy::ResourceKind::TailnetIngress,
                owner: "team-a/i".into(),
                tag: "tag:tno-ingress-team-a-i".into(),
                allow_from: vec!["group:team-a".into()],
                ports: vec![443],
            }],
            nodes: vec![],
            contributions: vec![],
        };
        tailnet_policy::render(&base, &inputs).expect("render")
    }

    #[test]
    fn everything_effective_when_live_is_rendered() {
        let r = rendered();
        assert_eq!(
            effective_resources(&r.document, &r.resources),
            vec!["TailnetEgress/tailnet-system/e", "TailnetIngress/team-a/i"]
        );
    }

    #[test]
    fn nothing_effective_before_the_policy_is_written() {
        let r = rendered();
        assert!(effective_resources(r#"{"grants": []}"#, &r.resources).is_empty());
    }

    #[test]
    fn a_removed_grant_makes_only_its_resource_ineffective() {
        let r = rendered();
        let edited = r
            .document
            .replace(r#""ip": ["tcp:443"]"#, r#""ip": ["tcp:8443"]"#);
        assert_ne!(edited, r.document, "fixture must contain the ingress grant");
        assert_eq!(
            effective_resources(&edited, &r.resources),
            vec!["TailnetEgress/tailnet-system/e"]
        );
    }
}
