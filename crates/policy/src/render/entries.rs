//! Decide entries: which generated entries go into the document (tag owners, route
//! approvals, grants, contributed entries), what each resource gets (its
//! [`ResourceOutcome`]), and the notices about the document. Works on plain data only; where
//! the entries land in the text is [`super::place`]'s business.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

use super::locate::BaseFacts;
use super::{Entry, Plan, sorted_dedup};
use crate::RenderError;
use crate::hujson_edit::json_str;
use crate::issues::{PolicyIssue, PolicyNotice};
use crate::model::{
    AutoApproverRoute, Contribution, EgressPolicy, EgressTarget, GeneratedGrant, IngressPolicy,
    PolicyInputs, ResourceKind, ResourceOutcome, TagOwnerSource, TargetAddress, TargetOutcome,
};
use crate::routes::covering_routes;
use crate::tags::valid_tag;

/// Everything decided before any text is touched.
pub(super) struct Decided {
    pub(super) plan: Plan,
    pub(super) resources: Vec<ResourceOutcome>,
    pub(super) auto_approvers: Vec<AutoApproverRoute>,
    pub(super) notices: BTreeSet<PolicyNotice>,
}

/// Decides the entries for normalized `inputs` against what the base defines.
/// `base_has_rules`: the base has `grants` or `acls`.
pub(super) fn decide(
    inputs: &PolicyInputs,
    base: &BaseFacts,
    base_has_rules: bool,
) -> Result<Decided, RenderError> {
    let mut tags = TagCheck::new(inputs, &base.tag_owners);
    let mut needed = NeededRoutes::default();
    let mut resources = Vec::new();
    // Egress grants first, then ingress grants: the order of the loops.
    let mut grants = Vec::new();
    for e in &inputs.egresses {
        resources.push(egress(e, inputs, &mut tags, &mut needed, &mut grants)?);
    }
    for i in &inputs.ingresses {
        resources.push(ingress(i, inputs, &mut tags, &mut grants)?);
    }
    let mut plan = Plan {
        tag_owners: tags.entries(&inputs.tag_owners),
        grants,
        ..Plan::default()
    };
    needed.add_contributed(&inputs.contributions);
    let mut notices = BTreeSet::new();
    let auto_approvers = route_entries(inputs, &base.routes, &needed, &mut plan, &mut notices)?;
    contributed_entries(inputs, &base.tag_owners, &mut tags.generated, &mut plan);
    let references = References {
        groups: &base.groups,
        base_tags: &base.tag_owners,
        generated_tags: &tags.generated,
    };
    references.notices(inputs, &plan, &auto_approvers, &resources, &mut notices);
    if !plan.grants.is_empty() && !base_has_rules {
        notices.insert(PolicyNotice::BaseHadNoRules);
    }
    Ok(Decided {
        plan,
        resources,
        auto_approvers,
        notices,
    })
}

/// Issues that keep a resource from getting grants.
fn blocking(issues: &[PolicyIssue]) -> bool {
    issues.iter().any(|i| {
        matches!(
            i,
            PolicyIssue::SourceNotAllowed { .. }
                | PolicyIssue::TagOwnedDifferently { .. }
                | PolicyIssue::DuplicateTag { .. }
                | PolicyIssue::InvalidTag { .. }
        )
    })
}

/// The per-resource tag decision: its issues, and whether its tag owner comes from the base,
/// is generated, or is missing.
struct TagCheck<'i> {
    /// Tag → the resources (`Kind ns/name`) that compute it.
    users: BTreeMap<&'i str, Vec<String>>,
    wanted_owners: &'i [String],
    base_tag_owners: &'i Map<String, Value>,
    /// Generated tag owner entries: tag → the resources (or contributors) needing it.
    generated: BTreeMap<String, Vec<String>>,
}

impl<'i> TagCheck<'i> {
    fn new(inputs: &'i PolicyInputs, base_tag_owners: &'i Map<String, Value>) -> Self {
        let mut users: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for e in &inputs.egresses {
            users.entry(e.tag.as_str()).or_default().push(format!(
                "{} {}",
                ResourceKind::TailnetEgress,
                e.owner
            ));
        }
        for i in &inputs.ingresses {
            users
                .entry(i.tag.as_str())
                .or_default()
                .push(format!("{} {}", i.kind, i.owner));
        }
        TagCheck {
            users,
            wanted_owners: &inputs.tag_owners,
            base_tag_owners,
            generated: BTreeMap::new(),
        }
    }

    fn check(
        &mut self,
        kind: ResourceKind,
        owner: &str,
        tag: &str,
        issues: &mut Vec<PolicyIssue>,
    ) -> Result<TagOwnerSource, RenderError> {
        if !valid_tag(tag) {
            issues.push(PolicyIssue::InvalidTag {
                tag: tag.to_string(),
            });
            return Ok(TagOwnerSource::None);
        }
        let me = format!("{kind} {owner}");
        if let Some(users) = self.users.get(tag)
            && users.len() > 1
        {
            let mut others: Vec<String> = users.iter().filter(|u| **u != me).cloned().collect();
            if others.is_empty() {
                // The same resource listed twice: still ambiguous.
                others.push(me.clone());
            }
            issues.push(PolicyIssue::DuplicateTag {
                tag: tag.to_string(),
                shared_with: others,
            });
        }
        match self.base_tag_owners.get(tag) {
            Some(v) => {
                let base_owners = sorted_dedup(&string_list(v, &format!("tagOwners[{tag:?}]"))?);
                if base_owners == self.wanted_owners {
                    Ok(TagOwnerSource::Base)
                } else {
                    issues.push(PolicyIssue::TagOwnedDifferently {
                        tag: tag.to_string(),
                        base_owners,
                        wanted_owners: self.wanted_owners.to_vec(),
                    });
                    Ok(TagOwnerSource::None)
                }
            }
            None => {
                self.generated.entry(tag.to_string()).or_default().push(me);
                Ok(TagOwnerSource::Generated)
            }
        }
    }

    /// The `tagOwners` entries of the resources' generated tags, sorted by tag.
    fn entries(&self, owners: &[String]) -> Vec<Entry> {
        self.generated
            .iter()
            .map(|(tag, users)| Entry {
                comment: users.join(", "),
                json: format!("{}: {}", json_str(tag), json_list(owners)),
            })
            .collect()
    }
}

/// Routes some resource needs approved: route → who needs it, and for which targets.
#[derive(Default)]
struct NeededRoutes {
    needed_by: BTreeMap<IpNet, BTreeSet<String>>,
    details: BTreeMap<IpNet, BTreeSet<String>>,
}

impl NeededRoutes {
    fn add(&mut self, route: IpNet, needed_by: String, detail: String) {
        self.needed_by.entry(route).or_default().insert(needed_by);
        self.details.entry(route).or_default().insert(detail);
    }

    /// Contributed routes join ours (approved by this installation's routeApprovers); an
    /// exit route (`/0`) never does, whatever the check before let through.
    fn add_contributed(&mut self, contributions: &[Contribution]) {
        for c in contributions {
            for route in c.routes.iter().filter(|r| r.prefix_len() != 0) {
                let who = format!("contributor {}", c.contributor);
                self.add(*route, who.clone(), who);
            }
        }
    }

    /// The comment of a route's entry: who needs it, then for which targets.
    fn comment(&self, route: &IpNet, needed_by: &[String]) -> String {
        // A contributed route names its contributor in both lists: say it once.
        let detail: Vec<String> = self
            .details
            .get(route)
            .into_iter()
            .flatten()
            .filter(|d| !needed_by.contains(d))
            .cloned()
            .collect();
        if detail.is_empty() {
            needed_by.join(", ")
        } else {
            format!("{}: {}", needed_by.join(", "), detail.join(", "))
        }
    }
}

/// One egress: its tag decision, each target's grant and covering routes, and its grant
/// entries (one per address, ports merged) appended to `grant_entries`.
fn egress(
    e: &EgressPolicy,
    inputs: &PolicyInputs,
    tags: &mut TagCheck<'_>,
    needed: &mut NeededRoutes,
    grant_entries: &mut Vec<Entry>,
) -> Result<ResourceOutcome, RenderError> {
    let mut issues = Vec::new();
    let tag_owner = tags.check(ResourceKind::TailnetEgress, &e.owner, &e.tag, &mut issues)?;
    for t in &e.targets {
        if matches!(t.address, TargetAddress::Ip(_)) && t.port == 0 {
            issues.push(PolicyIssue::InvalidPort {
                target: t.name.clone(),
            });
        }
    }
    let blocked = blocking(&issues);
    // ip -> (ports, target names)
    let mut by_ip: BTreeMap<IpAddr, (BTreeSet<u16>, BTreeSet<String>)> = BTreeMap::new();
    let targets = e
        .targets
        .iter()
        .map(|t| egress_target(e, t, inputs, blocked, needed, &mut by_ip))
        .collect();
    let mut grants = Vec::new();
    for (ip, (ports, names)) in by_ip {
        let grant = GeneratedGrant {
            src: vec![e.tag.clone()],
            dst: vec![host_prefix(ip)],
            ip: ports.iter().map(|p| format!("tcp:{p}")).collect(),
        };
        let names: Vec<String> = names.into_iter().collect();
        grant_entries.push(Entry {
            comment: format!(
                "{} {}: {}",
                ResourceKind::TailnetEgress,
                e.owner,
                names.join(", ")
            ),
            json: grant_json(&grant),
        });
        grants.push(grant);
    }
    Ok(ResourceOutcome {
        kind: ResourceKind::TailnetEgress,
        owner: e.owner.clone(),
        tag: e.tag.clone(),
        tag_owner,
        grants,
        targets,
        issues,
    })
}

/// One egress target: granted (an IP target with a port, the resource not blocked) or not,
/// and the routes that cover it (recorded as needed when granted).
fn egress_target(
    e: &EgressPolicy,
    t: &EgressTarget,
    inputs: &PolicyInputs,
    blocked: bool,
    needed: &mut NeededRoutes,
    by_ip: &mut BTreeMap<IpAddr, (BTreeSet<u16>, BTreeSet<String>)>,
) -> TargetOutcome {
    let (granted, routes) = match &t.address {
        TargetAddress::Dns(_) => (false, Vec::new()),
        TargetAddress::Ip(ip) => {
            let routes = covering_routes(*ip, &inputs.nodes, &inputs.route_approvers);
            let granted = !blocked && t.port != 0;
            if granted {
                let slot = by_ip.entry(*ip).or_default();
                slot.0.insert(t.port);
                slot.1.insert(t.name.clone());
                for r in &routes {
                    needed.add(
                        r.route,
                        format!("{} {}", ResourceKind::TailnetEgress, e.owner),
                        format!("{} ({ip})", t.name),
                    );
                }
            }
            (granted, routes)
        }
    };
    TargetOutcome {
        name: t.name.clone(),
        address: t.address.clone(),
        port: t.port,
        granted,
        routes,
    }
}

/// One ingress: its tag decision, its sources against the allowlist, and its grant entry
/// (appended to `grant_entries`) when nothing blocks it.
fn ingress(
    i: &IngressPolicy,
    inputs: &PolicyInputs,
    tags: &mut TagCheck<'_>,
    grant_entries: &mut Vec<Entry>,
) -> Result<ResourceOutcome, RenderError> {
    let mut issues = Vec::new();
    let tag_owner = tags.check(i.kind, &i.owner, &i.tag, &mut issues)?;
    let allowlist = &inputs.ingress_source_allowlist;
    let (allowed, offending): (Vec<String>, Vec<String>) = i
        .allow_from
        .iter()
        .cloned()
        .partition(|s| allowlist.contains(s));
    if !offending.is_empty() {
        issues.push(PolicyIssue::SourceNotAllowed {
            offending,
            allowlist: allowlist.clone(),
        });
    }
    if i.allow_from.is_empty() {
        issues.push(PolicyIssue::NoSources);
    }
    let ports: Vec<u16> = i.ports.iter().copied().filter(|p| *p != 0).collect();
    if ports.is_empty() {
        issues.push(PolicyIssue::NoPorts);
    }
    let mut grants = Vec::new();
    if issues.iter().all(|issue| !issue.blocks_grants()) && !allowed.is_empty() {
        let grant = GeneratedGrant {
            src: allowed,
            dst: vec![i.tag.clone()],
            ip: ports.iter().map(|p| format!("tcp:{p}")).collect(),
        };
        grant_entries.push(Entry {
            comment: format!("{} {}", i.kind, i.owner),
            json: grant_json(&grant),
        });
        grants.push(grant);
    }
    Ok(ResourceOutcome {
        kind: i.kind,
        owner: i.owner.clone(),
        tag: i.tag.clone(),
        tag_owner,
        grants,
        targets: Vec::new(),
        issues,
    })
}

/// `autoApprovers.routes`: a new key per needed route, or a union into the base's list for
/// the same prefix (reported as a notice). Nothing without `routeApprovers`.
fn route_entries(
    inputs: &PolicyInputs,
    base_routes: &Map<String, Value>,
    needed: &NeededRoutes,
    plan: &mut Plan,
    notices: &mut BTreeSet<PolicyNotice>,
) -> Result<Vec<AutoApproverRoute>, RenderError> {
    let mut auto_approvers = Vec::new();
    if inputs.route_approvers.is_empty() {
        return Ok(auto_approvers);
    }
    for (route, needed_by) in &needed.needed_by {
        let base_entry = base_routes
            .iter()
            .find(|(k, _)| k.parse::<IpNet>().ok() == Some(*route));
        let needed_by: Vec<String> = needed_by.iter().cloned().collect();
        let comment = needed.comment(route, &needed_by);
        match base_entry {
            Some((key, value)) => {
                let base_approvers = string_list(value, &format!("autoApprovers.routes[{key:?}]"))?;
                let added: Vec<String> = inputs
                    .route_approvers
                    .iter()
                    .filter(|a| !base_approvers.contains(a))
                    .cloned()
                    .collect();
                if !added.is_empty() {
                    plan.route_merges
                        .push((key.clone(), added.clone(), comment.clone()));
                    notices.insert(PolicyNotice::AutoApproverMerged {
                        route: *route,
                        base_approvers,
                        added,
                    });
                }
            }
            None => plan.routes.push(Entry {
                comment,
                json: format!(
                    "{}: {}",
                    json_str(&route.to_string()),
                    json_list(&inputs.route_approvers)
                ),
            }),
        }
        auto_approvers.push(AutoApproverRoute {
            route: *route,
            approvers: inputs.route_approvers.clone(),
            needed_by,
            merged_into_base: base_entry.is_some(),
        });
    }
    Ok(auto_approvers)
}

/// Contributed entries: after ours, each with the contributor in its comment. A tag that the
/// base or this installation already defines is skipped (the owner's check refuses those
/// before; this keeps the document valid whatever the caller passes).
fn contributed_entries(
    inputs: &PolicyInputs,
    base_tag_owners: &Map<String, Value>,
    generated_tags: &mut BTreeMap<String, Vec<String>>,
    plan: &mut Plan,
) {
    for c in &inputs.contributions {
        for tag in &c.tags {
            if base_tag_owners.contains_key(tag) || generated_tags.contains_key(tag) {
                continue;
            }
            generated_tags
                .entry(tag.clone())
                .or_default()
                .push(format!("contributor {}", c.contributor));
            plan.tag_owners.push(Entry {
                comment: format!("contributor {}", c.contributor),
                json: format!("{}: {}", json_str(tag), json_list(&inputs.tag_owners)),
            });
        }
        for g in &c.grants {
            plan.grants.push(Entry {
                comment: format!("contributor {}: {}", c.contributor, g.owner),
                json: grant_json(&GeneratedGrant {
                    src: g.src.clone(),
                    dst: g.dst.clone(),
                    ip: g.ip.clone(),
                }),
            });
        }
    }
}

/// What the document defines, for notices about references Headscale will reject.
struct References<'d> {
    groups: &'d BTreeSet<String>,
    base_tags: &'d Map<String, Value>,
    generated_tags: &'d BTreeMap<String, Vec<String>>,
}

impl References<'_> {
    /// A group or tag the document does not define, used in `used_in`.
    fn undefined(&self, alias: &str, used_in: &str) -> Option<PolicyNotice> {
        let tag_defined =
            |t: &str| self.base_tags.contains_key(t) || self.generated_tags.contains_key(t);
        if alias.starts_with("group:") && !self.groups.contains(alias) {
            Some(PolicyNotice::UndefinedGroup {
                group: alias.to_string(),
                used_in: used_in.to_string(),
            })
        } else if alias.starts_with("tag:") && !tag_defined(alias) {
            Some(PolicyNotice::UndefinedTag {
                tag: alias.to_string(),
                used_in: used_in.to_string(),
            })
        } else {
            None
        }
    }

    /// Notices for the aliases the generated entries use: tag owners, route approvers and
    /// ingress sources.
    fn notices(
        &self,
        inputs: &PolicyInputs,
        plan: &Plan,
        auto_approvers: &[AutoApproverRoute],
        resources: &[ResourceOutcome],
        notices: &mut BTreeSet<PolicyNotice>,
    ) {
        if !plan.tag_owners.is_empty() {
            notices.extend(
                inputs
                    .tag_owners
                    .iter()
                    .filter_map(|o| self.undefined(o, "policy.tagOwners")),
            );
        }
        if !auto_approvers.is_empty() {
            notices.extend(
                inputs
                    .route_approvers
                    .iter()
                    .filter_map(|a| self.undefined(a, "policy.routeApprovers")),
            );
        }
        for r in resources.iter().filter(|r| {
            matches!(
                r.kind,
                ResourceKind::TailnetIngress | ResourceKind::Service | ResourceKind::Gateway
            )
        }) {
            for s in r.grants.iter().flat_map(|g| &g.src) {
                notices.extend(self.undefined(s, &format!("allowFrom of {}", r.owner)));
            }
        }
    }
}

/// A list of strings from the base (tag owners, approvers), or a typed error naming `path`.
fn string_list(value: &Value, path: &str) -> Result<Vec<String>, RenderError> {
    let wrong = |found: &'static str| RenderError::WrongType {
        key: path.to_string(),
        expected: "array of strings",
        found,
    };
    match value {
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or(wrong("array")))
            .collect(),
        Value::Object(_) => Err(wrong("object")),
        Value::String(_) => Err(wrong("string")),
        Value::Number(_) => Err(wrong("number")),
        Value::Bool(_) => Err(wrong("boolean")),
        Value::Null => Err(wrong("null")),
    }
}

fn json_list<S: AsRef<str>>(items: &[S]) -> String {
    let inner: Vec<String> = items.iter().map(|s| json_str(s.as_ref())).collect();
    format!("[{}]", inner.join(", "))
}

fn grant_json(g: &GeneratedGrant) -> String {
    format!(
        "{{\"src\": {}, \"dst\": {}, \"ip\": {}}}",
        json_list(&g.src),
        json_list(&g.dst),
        json_list(&g.ip)
    )
}

/// Host prefix for a grant destination: `/32` or `/128`.
fn host_prefix(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_prefixes() {
        assert_eq!(
            host_prefix("192.0.2.1".parse().unwrap_or(IpAddr::from([0; 4]))),
            "192.0.2.1/32"
        );
        assert_eq!(
            host_prefix("2001:db8::1".parse().unwrap_or(IpAddr::from([0; 4]))),
            "2001:db8::1/128"
        );
    }
}
