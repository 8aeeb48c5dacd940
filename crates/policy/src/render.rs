//! Rendering: base text + generated entries, by inserting text into the base (the text
//! edits themselves live in [`crate::hujson_edit`]).
//!
//! The base is never re-serialised: every byte of it (comments, key order, formatting,
//! trailing commas) is copied through, and generated entries are *inserted* before the
//! closing bracket of `tagOwners`, `autoApprovers.routes` and `grants` (creating those
//! keys at the end of the root object when absent), each block fenced by
//! `// tailnet-operator: begin generated …` / `// tailnet-operator: end generated …`
//! comments and every entry preceded by a comment naming the owning resource.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use jsonc_parser::ast::Value as AstValue;
use jsonc_parser::tokens::{Token, TokenAndRange};
use serde_json::Value;

use crate::hujson::{parse_ast, prop_name};
use crate::hujson_edit::{
    Container, EditCtx, Edits, Line, comment_safe, expect_array, expect_object, find_prop,
    json_str, wrap_key,
};
use crate::issues::{PolicyIssue, PolicyNotice};
use crate::model::{
    AutoApproverRoute, Contribution, EgressPolicy, GeneratedGrant, IngressPolicy, PolicyInputs,
    RenderSummary, RenderedPolicy, ResourceKind, ResourceOutcome, TagOwnerSource, TargetAddress,
    TargetOutcome,
};
use crate::routes::covering_routes;
use crate::tags::valid_tag;
use crate::{BasePolicy, MARKER_PREFIX, RenderError};

/// Comment text that opens a generated block; also used to detect a rendered document
/// being fed back in as a base.
pub(crate) const BEGIN_GENERATED: &str = "tailnet-operator: begin generated";

fn json_list<S: AsRef<str>>(items: &[S]) -> String {
    let inner: Vec<String> = items.iter().map(|s| json_str(s.as_ref())).collect();
    format!("[{}]", inner.join(", "))
}

fn sorted_dedup<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    v.iter()
        .cloned()
        .collect::<BTreeSet<T>>()
        .into_iter()
        .collect()
}

/// Host prefix for a grant destination: `/32` or `/128`.
fn host_prefix(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// Inputs in canonical order, so any permutation renders the same bytes.
fn normalize(inputs: &PolicyInputs) -> PolicyInputs {
    let mut egresses: Vec<EgressPolicy> = inputs
        .egresses
        .iter()
        .map(|e| EgressPolicy {
            owner: e.owner.clone(),
            tag: e.tag.clone(),
            targets: sorted_dedup(&e.targets),
        })
        .collect();
    egresses.sort();
    let mut ingresses: Vec<IngressPolicy> = inputs
        .ingresses
        .iter()
        .map(|i| IngressPolicy {
            owner: i.owner.clone(),
            tag: i.tag.clone(),
            allow_from: sorted_dedup(&i.allow_from),
            ports: sorted_dedup(&i.ports),
        })
        .collect();
    ingresses.sort();
    let mut nodes = inputs.nodes.clone();
    for n in &mut nodes {
        n.tags = sorted_dedup(&n.tags);
        n.available_routes = sorted_dedup(&n.available_routes);
        n.approved_routes = sorted_dedup(&n.approved_routes);
        n.ip_addresses = sorted_dedup(&n.ip_addresses);
    }
    nodes.sort();
    PolicyInputs {
        installation_id: inputs.installation_id.clone(),
        tag_owners: sorted_dedup(&inputs.tag_owners),
        route_approvers: sorted_dedup(&inputs.route_approvers),
        ingress_source_allowlist: sorted_dedup(&inputs.ingress_source_allowlist),
        egresses,
        ingresses,
        nodes,
        contributions: {
            let mut contributions: Vec<Contribution> = inputs
                .contributions
                .iter()
                .map(|c| Contribution {
                    contributor: c.contributor.clone(),
                    tags: sorted_dedup(&c.tags),
                    grants: sorted_dedup(&c.grants),
                    routes: sorted_dedup(&c.routes),
                })
                .collect();
            contributions.sort();
            contributions
        },
    }
}

/// A generated entry: the comment naming its owners, and its JSON text.
struct Entry {
    comment: String,
    json: String,
}

/// What the render adds, before it is turned into text.
#[derive(Default)]
struct Plan {
    tag_owners: Vec<Entry>,
    /// New `autoApprovers.routes` keys.
    routes: Vec<Entry>,
    /// Approvers to append to a base `autoApprovers.routes[key]` list: (base key, values, comment).
    route_merges: Vec<(String, Vec<String>, String)>,
    grants: Vec<Entry>,
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

/// Case-insensitive lookup in a `serde_json` object (mirrors [`find_prop`]).
fn get_ci<'v>(obj: &'v serde_json::Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}

/// Renders the complete policy document. See the crate docs for the layout and rules.
pub fn render(base: &BasePolicy, inputs: &PolicyInputs) -> Result<RenderedPolicy, RenderError> {
    let id = inputs.installation_id.trim();
    if id.is_empty() || id.chars().any(char::is_control) {
        return Err(RenderError::InvalidInstallationId(
            inputs.installation_id.clone(),
        ));
    }
    let inputs = normalize(inputs);
    let text = base.text.as_str();
    let parsed = parse_ast(text).map_err(RenderError::Base)?;
    let tokens: &[TokenAndRange<'_>] = parsed.tokens.as_deref().unwrap_or(&[]);
    if tokens.iter().any(|t| match &t.token {
        Token::CommentLine(c) | Token::CommentBlock(c) => {
            c.contains(BEGIN_GENERATED) || c.contains(MARKER_PREFIX)
        }
        _ => false,
    }) {
        return Err(RenderError::BaseContainsRenderedOutput);
    }
    let Some(AstValue::Object(root)) = parsed.value.as_ref() else {
        return Err(RenderError::Base(crate::BaseError {
            line: 1,
            column: 1,
            message: "the base policy must be a JSON object".into(),
        }));
    };
    let base_obj = base.value.as_object().cloned().unwrap_or_default();

    // Locate (and type-check) the containers we extend.
    let tag_owners_prop = find_prop(root, "tagOwners", "tagOwners")?;
    let tag_owners_obj = tag_owners_prop
        .map(|p| expect_object(p, "tagOwners"))
        .transpose()?;
    let aa_prop = find_prop(root, "autoApprovers", "autoApprovers")?;
    let aa_obj = aa_prop
        .map(|p| expect_object(p, "autoApprovers"))
        .transpose()?;
    let routes_prop = match aa_obj {
        Some(o) => find_prop(o, "routes", "autoApprovers.routes")?,
        None => None,
    };
    let routes_obj = routes_prop
        .map(|p| expect_object(p, "autoApprovers.routes"))
        .transpose()?;
    let grants_prop = find_prop(root, "grants", "grants")?;
    let grants_arr = grants_prop.map(|p| expect_array(p, "grants")).transpose()?;
    // `acls` is only looked up for the allow-all notice, but an ambiguous key is still an error.
    let acls_prop = find_prop(root, "acls", "acls")?;

    // Base data we compare against.
    let empty = serde_json::Map::new();
    let base_tag_owners = get_ci(&base_obj, "tagOwners")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let base_routes = get_ci(&base_obj, "autoApprovers")
        .and_then(Value::as_object)
        .and_then(|aa| get_ci(aa, "routes"))
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let base_groups: BTreeSet<String> = get_ci(&base_obj, "groups")
        .and_then(Value::as_object)
        .map(|g| g.keys().cloned().collect())
        .unwrap_or_default();

    // Tags computed for more than one resource.
    let mut tag_users: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for e in &inputs.egresses {
        tag_users.entry(e.tag.as_str()).or_default().push(format!(
            "{} {}",
            ResourceKind::TailnetEgress,
            e.owner
        ));
    }
    for i in &inputs.ingresses {
        tag_users.entry(i.tag.as_str()).or_default().push(format!(
            "{} {}",
            ResourceKind::TailnetIngress,
            i.owner
        ));
    }

    // Common per-resource tag handling: issues and the tagOwners decision.
    let wanted_owners = inputs.tag_owners.clone();
    let mut generated_tags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut tag_check = |kind: ResourceKind,
                         owner: &str,
                         tag: &str,
                         issues: &mut Vec<PolicyIssue>|
     -> Result<TagOwnerSource, RenderError> {
        if !valid_tag(tag) {
            issues.push(PolicyIssue::InvalidTag {
                tag: tag.to_string(),
            });
            return Ok(TagOwnerSource::None);
        }
        let me = format!("{kind} {owner}");
        if let Some(users) = tag_users.get(tag)
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
        match base_tag_owners.get(tag) {
            Some(v) => {
                let base_owners = sorted_dedup(&string_list(v, &format!("tagOwners[{tag:?}]"))?);
                if base_owners == wanted_owners {
                    Ok(TagOwnerSource::Base)
                } else {
                    issues.push(PolicyIssue::TagOwnedDifferently {
                        tag: tag.to_string(),
                        base_owners,
                        wanted_owners: wanted_owners.clone(),
                    });
                    Ok(TagOwnerSource::None)
                }
            }
            None => {
                generated_tags.entry(tag.to_string()).or_default().push(me);
                Ok(TagOwnerSource::Generated)
            }
        }
    };
    let blocking = |issues: &[PolicyIssue]| {
        issues.iter().any(|i| {
            matches!(
                i,
                PolicyIssue::SourceNotAllowed { .. }
                    | PolicyIssue::TagOwnedDifferently { .. }
                    | PolicyIssue::DuplicateTag { .. }
                    | PolicyIssue::InvalidTag { .. }
            )
        })
    };

    let mut plan = Plan::default();
    let mut resources = Vec::new();
    // route -> (resources needing it, comment detail)
    let mut needed_routes: BTreeMap<IpNet, BTreeSet<String>> = BTreeMap::new();
    let mut route_details: BTreeMap<IpNet, BTreeSet<String>> = BTreeMap::new();
    let mut egress_grants = Vec::new();
    let mut ingress_grants = Vec::new();

    for e in &inputs.egresses {
        let mut issues = Vec::new();
        let tag_owner = tag_check(ResourceKind::TailnetEgress, &e.owner, &e.tag, &mut issues)?;
        for t in &e.targets {
            if matches!(t.address, TargetAddress::Ip(_)) && t.port == 0 {
                issues.push(PolicyIssue::InvalidPort {
                    target: t.name.clone(),
                });
            }
        }
        let blocked = blocking(&issues);
        let mut targets = Vec::new();
        // ip -> (ports, target names)
        let mut by_ip: BTreeMap<IpAddr, (BTreeSet<u16>, BTreeSet<String>)> = BTreeMap::new();
        for t in &e.targets {
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
                            needed_routes.entry(r.route).or_default().insert(format!(
                                "{} {}",
                                ResourceKind::TailnetEgress,
                                e.owner
                            ));
                            route_details
                                .entry(r.route)
                                .or_default()
                                .insert(format!("{} ({ip})", t.name));
                        }
                    }
                    (granted, routes)
                }
            };
            targets.push(TargetOutcome {
                name: t.name.clone(),
                address: t.address.clone(),
                port: t.port,
                granted,
                routes,
            });
        }
        let mut grants = Vec::new();
        for (ip, (ports, names)) in by_ip {
            let grant = GeneratedGrant {
                src: vec![e.tag.clone()],
                dst: vec![host_prefix(ip)],
                ip: ports.iter().map(|p| format!("tcp:{p}")).collect(),
            };
            let names: Vec<String> = names.into_iter().collect();
            egress_grants.push(Entry {
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
        resources.push(ResourceOutcome {
            kind: ResourceKind::TailnetEgress,
            owner: e.owner.clone(),
            tag: e.tag.clone(),
            tag_owner,
            grants,
            targets,
            issues,
        });
    }

    for i in &inputs.ingresses {
        let mut issues = Vec::new();
        let tag_owner = tag_check(ResourceKind::TailnetIngress, &i.owner, &i.tag, &mut issues)?;
        let offending: Vec<String> = i
            .allow_from
            .iter()
            .filter(|s| !inputs.ingress_source_allowlist.contains(s))
            .cloned()
            .collect();
        if !offending.is_empty() {
            issues.push(PolicyIssue::SourceNotAllowed {
                offending,
                allowlist: inputs.ingress_source_allowlist.clone(),
            });
        }
        if i.allow_from.is_empty() {
            issues.push(PolicyIssue::NoSources);
        }
        let ports: Vec<u16> = i.ports.iter().copied().filter(|p| *p != 0).collect();
        if ports.is_empty() {
            issues.push(PolicyIssue::NoPorts);
        }
        let allowed: Vec<String> = i
            .allow_from
            .iter()
            .filter(|s| inputs.ingress_source_allowlist.contains(s))
            .cloned()
            .collect();
        let mut grants = Vec::new();
        if issues.iter().all(|issue| !issue.blocks_grants()) && !allowed.is_empty() {
            let grant = GeneratedGrant {
                src: allowed,
                dst: vec![i.tag.clone()],
                ip: ports.iter().map(|p| format!("tcp:{p}")).collect(),
            };
            ingress_grants.push(Entry {
                comment: format!("{} {}", ResourceKind::TailnetIngress, i.owner),
                json: grant_json(&grant),
            });
            grants.push(grant);
        }
        resources.push(ResourceOutcome {
            kind: ResourceKind::TailnetIngress,
            owner: i.owner.clone(),
            tag: i.tag.clone(),
            tag_owner,
            grants,
            targets: Vec::new(),
            issues,
        });
    }

    // tagOwners entries.
    for (tag, owners) in &generated_tags {
        plan.tag_owners.push(Entry {
            comment: owners.join(", "),
            json: format!("{}: {}", json_str(tag), json_list(&inputs.tag_owners)),
        });
    }

    // Contributed routes join ours (approved by this installation's routeApprovers).
    for c in &inputs.contributions {
        for route in &c.routes {
            needed_routes
                .entry(*route)
                .or_default()
                .insert(format!("contributor {}", c.contributor));
            route_details
                .entry(*route)
                .or_default()
                .insert(format!("contributor {}", c.contributor));
        }
    }

    // autoApprovers.routes: new keys, or a union into the base's list for the same prefix.
    let mut auto_approvers = Vec::new();
    let mut notices = BTreeSet::new();
    if !inputs.route_approvers.is_empty() {
        for (route, needed_by) in &needed_routes {
            let base_entry = base_routes
                .iter()
                .find(|(k, _)| k.parse::<IpNet>().ok() == Some(*route));
            let needed_by: Vec<String> = needed_by.iter().cloned().collect();
            let detail: Vec<String> = route_details
                .get(route)
                .map(|d| d.iter().cloned().collect())
                .unwrap_or_default();
            // A contributed route names its contributor in both lists: say it once.
            let detail: Vec<String> = detail
                .into_iter()
                .filter(|d| !needed_by.contains(d))
                .collect();
            let comment = if detail.is_empty() {
                needed_by.join(", ")
            } else {
                format!("{}: {}", needed_by.join(", "), detail.join(", "))
            };
            match base_entry {
                Some((key, value)) => {
                    let base_approvers =
                        string_list(value, &format!("autoApprovers.routes[{key:?}]"))?;
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
    }

    plan.grants = egress_grants;
    plan.grants.extend(ingress_grants);
    // Contributed entries: after ours, each with the contributor in its comment. A tag that
    // the base or this installation already defines is skipped (the owner's check refuses
    // those before; this keeps the document valid whatever the caller passes).
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

    // Notices about references Headscale will reject.
    let generated_tag_set: BTreeSet<&str> = generated_tags.keys().map(String::as_str).collect();
    let tag_defined = |t: &str| base_tag_owners.contains_key(t) || generated_tag_set.contains(t);
    let mut check_ref = |alias: &str, used_in: &str| {
        if alias.starts_with("group:") && !base_groups.contains(alias) {
            notices.insert(PolicyNotice::UndefinedGroup {
                group: alias.to_string(),
                used_in: used_in.to_string(),
            });
        } else if alias.starts_with("tag:") && !tag_defined(alias) {
            notices.insert(PolicyNotice::UndefinedTag {
                tag: alias.to_string(),
                used_in: used_in.to_string(),
            });
        }
    };
    if !plan.tag_owners.is_empty() {
        for o in &inputs.tag_owners {
            check_ref(o, "policy.tagOwners");
        }
    }
    if !auto_approvers.is_empty() {
        for a in &inputs.route_approvers {
            check_ref(a, "policy.routeApprovers");
        }
    }
    for r in resources
        .iter()
        .filter(|r| r.kind == ResourceKind::TailnetIngress)
    {
        for g in &r.grants {
            for s in &g.src {
                check_ref(s, &format!("allowFrom of {}", r.owner));
            }
        }
    }
    if !plan.grants.is_empty() && grants_prop.is_none() && acls_prop.is_none() {
        notices.insert(PolicyNotice::BaseHadNoRules);
    }

    // Text edits.
    let ctx = EditCtx::new(text, tokens, root);
    let mut edits = Edits::default();
    let mut root_lines: Vec<Line> = Vec::new();

    let tag_block = block("tag owners", &plan.tag_owners);
    if !tag_block.is_empty() {
        match tag_owners_obj {
            Some(o) => ctx.insert_lines(&mut edits, &Container::object(o), &tag_block),
            None => wrap_key(&mut root_lines, "tagOwners", '{', tag_block),
        }
    }

    let route_block = block("route approvals", &plan.routes);
    if !route_block.is_empty() {
        match (aa_obj, routes_obj) {
            (_, Some(r)) => ctx.insert_lines(&mut edits, &Container::object(r), &route_block),
            (Some(aa), None) => {
                let mut lines = Vec::new();
                wrap_key(&mut lines, "routes", '{', route_block);
                ctx.insert_lines(&mut edits, &Container::object(aa), &lines);
            }
            (None, None) => {
                let mut inner = Vec::new();
                wrap_key(&mut inner, "routes", '{', route_block);
                wrap_key(&mut root_lines, "autoApprovers", '{', inner);
            }
        }
    }
    if let Some(routes) = routes_obj {
        for (key, added, comment) in &plan.route_merges {
            let Some(prop) = routes
                .properties
                .iter()
                .find(|p| prop_name(&p.name) == *key)
            else {
                continue;
            };
            let arr = expect_array(prop, &format!("autoApprovers.routes[{key:?}]"))?;
            ctx.merge_into_array(&mut edits, arr, added, comment);
        }
    }

    let grant_block = block("grants", &plan.grants);
    if !grant_block.is_empty() {
        match grants_arr {
            Some(a) => ctx.insert_lines(&mut edits, &Container::array(a), &grant_block),
            None => wrap_key(&mut root_lines, "grants", '[', grant_block),
        }
    }
    if !root_lines.is_empty() {
        // Keep the base's rhythm: a blank line between top-level keys if it uses one.
        if let Some(last) = root.properties.last()
            && ctx.blank_line_before(last.range.start)
        {
            root_lines.insert(0, Line(0, String::new()));
        }
        ctx.insert_lines(&mut edits, &Container::object(root), &root_lines);
    }

    // Follow the base's line endings (a CRLF file stays CRLF).
    let nl = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut document = header(id).replace('\n', nl);
    document.push_str(&edits.apply(text, nl));
    if !document.ends_with('\n') {
        document.push_str(nl);
    }

    let summary = RenderSummary {
        egress_resources: inputs.egresses.len(),
        ingress_resources: inputs.ingresses.len(),
        generated_tag_owners: plan.tag_owners.len(),
        egress_grants: resources
            .iter()
            .filter(|r| r.kind == ResourceKind::TailnetEgress)
            .map(|r| r.grants.len())
            .sum(),
        ingress_grants: resources
            .iter()
            .filter(|r| r.kind == ResourceKind::TailnetIngress)
            .map(|r| r.grants.len())
            .sum(),
        auto_approver_routes: auto_approvers.len(),
        dns_targets_skipped: resources
            .iter()
            .map(|r| r.dns_targets_skipped().len())
            .sum(),
        resources_with_issues: resources.iter().filter(|r| !r.issues.is_empty()).count(),
        contributed_grants: inputs.contributions.iter().map(|c| c.grants.len()).sum(),
    };

    Ok(RenderedPolicy {
        document,
        resources,
        auto_approvers,
        notices: notices.into_iter().collect(),
        summary,
    })
}

fn grant_json(g: &GeneratedGrant) -> String {
    format!(
        "{{\"src\": {}, \"dst\": {}, \"ip\": {}}}",
        json_list(&g.src),
        json_list(&g.dst),
        json_list(&g.ip)
    )
}

/// The first lines of every rendered document; the first one is the ownership marker.
fn header(id: &str) -> String {
    format!(
        "// {MARKER_PREFIX} {}\n\
         // Rendered by tailnet-operator: the base policy plus entries between\n\
         // \"tailnet-operator: begin/end generated\" comments. Edits made directly in\n\
         // Headscale are overwritten; change the base policy or the resources instead.\n",
        comment_safe(id)
    )
}

/// A fenced block of entries, each preceded by its owner comment. Empty when no entries.
fn block(what: &str, entries: &[Entry]) -> Vec<Line> {
    if entries.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![Line(
        0,
        format!("// {BEGIN_GENERATED} {what} (overwritten on every render)"),
    )];
    for e in entries {
        lines.push(Line(0, format!("// {}", comment_safe(&e.comment))));
        lines.push(Line(0, format!("{},", e.json)));
    }
    lines.push(Line(
        0,
        format!("// tailnet-operator: end generated {what}"),
    ));
    lines
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
