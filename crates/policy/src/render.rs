//! Rendering: base text + generated entries, by inserting text into the base (the text
//! edits themselves live in [`crate::hujson_edit`]).
//!
//! The base is never re-serialised: every byte of it (comments, key order, formatting,
//! trailing commas) is copied through, and generated entries are *inserted* before the
//! closing bracket of `tagOwners`, `autoApprovers.routes` and `grants` (creating those
//! keys at the end of the root object when absent), each block fenced by
//! `// tailnet-operator: begin generated …` / `// tailnet-operator: end generated …`
//! comments and every entry preceded by a comment naming the owning resource.
//!
//! Three steps: [`locate`] finds the containers in the base's syntax tree, [`entries`]
//! decides which generated entries go in (and each resource's outcome), [`place`] turns
//! them into text edits.

mod entries;
mod locate;
mod place;

use std::collections::BTreeSet;

use jsonc_parser::tokens::TokenAndRange;

use crate::hujson::parse_ast;
use crate::model::{
    Contribution, EgressPolicy, IngressPolicy, PolicyInputs, RenderSummary, RenderedPolicy,
    ResourceKind,
};
use crate::{BasePolicy, RenderError};

/// Comment text that opens a generated block; also used to detect a rendered document
/// being fed back in as a base.
pub(crate) const BEGIN_GENERATED: &str = "tailnet-operator: begin generated";
/// Comment text that closes a generated block.
pub(crate) const END_GENERATED: &str = "tailnet-operator: end generated";

/// Renders the complete policy document. See the crate docs for the layout and rules.
/// Locate the base's containers → decide the entries → place them as text edits.
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
    locate::refuse_rendered_output(tokens)?;
    let root = locate::root_object(&parsed)?;
    let found = locate::Located::find(root)?;
    let decided = entries::decide(
        &inputs,
        &locate::BaseFacts::of(&base.value),
        found.has_rules,
    )?;
    let document = place::document(text, tokens, root, &found, &decided.plan, id)?;
    let summary = summary(&inputs, &decided);
    Ok(RenderedPolicy {
        document,
        resources: decided.resources,
        auto_approvers: decided.auto_approvers,
        notices: decided.notices.into_iter().collect(),
        summary,
    })
}

fn sorted_dedup<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    v.iter()
        .cloned()
        .collect::<BTreeSet<T>>()
        .into_iter()
        .collect()
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
            kind: i.kind,
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

/// The counts reported beside the document.
fn summary(inputs: &PolicyInputs, decided: &entries::Decided) -> RenderSummary {
    let resources = &decided.resources;
    let grants_of = |kind: ResourceKind| -> usize {
        resources
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.grants.len())
            .sum()
    };
    RenderSummary {
        egress_resources: inputs.egresses.len(),
        ingress_resources: inputs.ingresses.len(),
        generated_tag_owners: decided.plan.tag_owners.len(),
        egress_grants: grants_of(ResourceKind::TailnetEgress),
        ingress_grants: grants_of(ResourceKind::TailnetIngress)
            + grants_of(ResourceKind::Service)
            + grants_of(ResourceKind::Gateway),
        auto_approver_routes: decided.auto_approvers.len(),
        dns_targets_skipped: resources
            .iter()
            .map(|r| r.dns_targets_skipped().len())
            .sum(),
        resources_with_issues: resources.iter().filter(|r| !r.issues.is_empty()).count(),
        contributed_grants: inputs.contributions.iter().map(|c| c.grants.len()).sum(),
    }
}
