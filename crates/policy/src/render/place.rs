//! Place edits: the decided entries as fenced blocks of text inserted into the base where
//! [`super::locate`] found their containers (or new keys at the end of the root object), the
//! header with the ownership marker, and the base's own line endings.

use jsonc_parser::ast::Object;
use jsonc_parser::tokens::TokenAndRange;

use super::locate::Located;
use super::{BEGIN_GENERATED, END_GENERATED, Entry, Plan};
use crate::hujson::prop_name;
use crate::hujson_edit::{Container, EditCtx, Edits, Line, comment_safe, expect_array, wrap_key};
use crate::{MARKER_PREFIX, RenderError};

/// The rendered document: header, then the base text with the plan's entries inserted.
pub(super) fn document(
    text: &str,
    tokens: &[TokenAndRange<'_>],
    root: &Object<'_>,
    found: &Located<'_, '_>,
    plan: &Plan,
    id: &str,
) -> Result<String, RenderError> {
    let ctx = EditCtx::new(text, tokens, root);
    let mut edits = Edits::default();
    // New top-level keys, inserted at the end of the root object.
    let mut root_lines: Vec<Line> = Vec::new();
    let tag_block = block("tag owners", &plan.tag_owners);
    if !tag_block.is_empty() {
        match found.tag_owners {
            Some(o) => ctx.insert_lines(&mut edits, &Container::object(o), &tag_block),
            None => wrap_key(&mut root_lines, "tagOwners", '{', tag_block),
        }
    }
    place_routes(&ctx, &mut edits, &mut root_lines, found, plan);
    merge_route_approvers(&ctx, &mut edits, found, plan)?;
    let grant_block = block("grants", &plan.grants);
    if !grant_block.is_empty() {
        match found.grants {
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
    Ok(document)
}

/// New `autoApprovers.routes` keys: into the base's `routes`, or a new `routes` in its
/// `autoApprovers`, or a new `autoApprovers` at the root.
fn place_routes(
    ctx: &EditCtx<'_, '_>,
    edits: &mut Edits,
    root_lines: &mut Vec<Line>,
    found: &Located<'_, '_>,
    plan: &Plan,
) {
    let route_block = block("route approvals", &plan.routes);
    if route_block.is_empty() {
        return;
    }
    match (found.auto_approvers, found.routes) {
        (_, Some(r)) => ctx.insert_lines(edits, &Container::object(r), &route_block),
        (Some(aa), None) => {
            let mut lines = Vec::new();
            wrap_key(&mut lines, "routes", '{', route_block);
            ctx.insert_lines(edits, &Container::object(aa), &lines);
        }
        (None, None) => {
            let mut inner = Vec::new();
            wrap_key(&mut inner, "routes", '{', route_block);
            wrap_key(root_lines, "autoApprovers", '{', inner);
        }
    }
}

/// Approvers appended to the base's own `autoApprovers.routes[key]` lists.
fn merge_route_approvers(
    ctx: &EditCtx<'_, '_>,
    edits: &mut Edits,
    found: &Located<'_, '_>,
    plan: &Plan,
) -> Result<(), RenderError> {
    let Some(routes) = found.routes else {
        return Ok(());
    };
    for (key, added, comment) in &plan.route_merges {
        let Some(prop) = routes
            .properties
            .iter()
            .find(|p| prop_name(&p.name) == *key)
        else {
            continue;
        };
        let arr = expect_array(prop, &format!("autoApprovers.routes[{key:?}]"))?;
        ctx.merge_into_array(edits, arr, added, comment);
    }
    Ok(())
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
    lines.push(Line(0, format!("// {END_GENERATED} {what}")));
    lines
}
