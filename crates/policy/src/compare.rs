//! Reading live documents back: ownership marker, semantic comparison, diff.

use jsonc_parser::tokens::Token;

use crate::hujson::{parse_ast, parse_value, strip_bom};
use crate::render::{BEGIN_GENERATED, END_GENERATED};
use crate::{CompareError, MARKER_PREFIX};

fn marker_in(comment: &str) -> Option<String> {
    let rest = comment.trim().strip_prefix(MARKER_PREFIX)?;
    let id = rest.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// The installation id in a live document's ownership marker (the first
/// `// tailnet-operator-installation: <id>` comment), or `None` when there is none.
///
/// Tolerant by design: the live document may be anything a human stored with
/// `headscale policy set`. When it does not parse, a line scan for a `//` marker line is
/// used instead, so an invalid live policy can still be attributed.
pub fn ownership_marker(document: &str) -> Option<String> {
    let document = strip_bom(document);
    match parse_ast(document) {
        Ok(parsed) => parsed
            .tokens
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .find_map(|t| match &t.token {
                Token::CommentLine(c) => marker_in(c),
                Token::CommentBlock(c) => c
                    .lines()
                    .find_map(|l| marker_in(l.trim_start().trim_start_matches('*'))),
                _ => None,
            }),
        Err(_) => document
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("//").and_then(marker_in)),
    }
}

/// Whether two HuJSON documents mean the same policy: comments, whitespace, trailing commas
/// and object key order are ignored; array order is significant (as in JSON). An empty
/// document equals only another empty document.
///
/// Comments are ignored, so this alone does not see a lost ownership marker; use
/// [`up_to_date`] to decide whether to PUT.
pub fn semantically_equal(a: &str, b: &str) -> Result<bool, CompareError> {
    let a = parse_value(a).map_err(CompareError::First)?;
    let b = parse_value(b).map_err(CompareError::Second)?;
    Ok(a == b)
}

/// Whether the live document already is the rendered one: semantically equal *and* carrying
/// the same ownership marker. The operator PUTs only when this is false. A live document
/// that does not parse is simply not up to date.
pub fn up_to_date(live: &str, rendered: &str) -> Result<bool, CompareError> {
    let rendered_value = parse_value(rendered).map_err(CompareError::Second)?;
    let Ok(live_value) = parse_value(live) else {
        return Ok(false);
    };
    Ok(live_value == rendered_value && ownership_marker(live) == ownership_marker(rendered))
}

/// Whether a (live) document states access rules of its own: `acls` or `grants`. Without
/// either Headscale allows everything (an empty document included). `None`: the document
/// does not parse, so what it allows is not known.
pub fn states_rules(document: &str) -> Option<bool> {
    match parse_value(document) {
        Ok(None) => Some(false),
        Ok(Some(value)) => Some(value.get("acls").is_some() || value.get("grants").is_some()),
        Err(_) => None,
    }
}

/// Whether the *base part* of a document this crate rendered states rules of its own: the
/// document without its generated blocks (the lines from a `tailnet-operator: begin
/// generated` comment to its `end generated` comment) has a non-empty `acls` or `grants`
/// list. A `grants` list the renderer opened for its generated grants is empty once they are
/// cut out, so a document rendered from a rule-less base answers `false`. `None`: the rest
/// does not parse.
pub fn base_states_rules(document: &str) -> Option<bool> {
    let mut inside = false;
    let mut base = String::with_capacity(document.len());
    for line in strip_bom(document).lines() {
        let comment = line.trim_start().strip_prefix("//").map(str::trim_start);
        if comment.is_some_and(|c| c.starts_with(BEGIN_GENERATED)) {
            inside = true;
        } else if comment.is_some_and(|c| c.starts_with(END_GENERATED)) {
            inside = false;
        } else if !inside {
            base.push_str(line);
            base.push('\n');
        }
    }
    let non_empty = |v: &serde_json::Value, key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_array)
            .is_some_and(|a| !a.is_empty())
    };
    match parse_value(&base) {
        Ok(None) => Some(false),
        Ok(Some(value)) => Some(non_empty(&value, "acls") || non_empty(&value, "grants")),
        Err(_) => None,
    }
}

/// Unified diff (3 lines of context) from the live document to the rendered one, with
/// `live` / `rendered` headers; empty when the texts are identical.
pub fn diff(live: &str, rendered: &str) -> String {
    if live == rendered {
        return String::new();
    }
    similar::TextDiff::from_lines(live, rendered)
        .unified_diff()
        .context_radius(3)
        .header("live", "rendered")
        .to_string()
}
