//! Locate: where the containers the render extends sit in the base's syntax tree (found
//! the way Headscale reads names, and type-checked), and what the base already defines, as
//! plain JSON for the entry decisions. Nothing is decided or edited here.

use std::collections::BTreeSet;

use jsonc_parser::ParseResult;
use jsonc_parser::ast::{Array, Object, Value as AstValue};
use jsonc_parser::tokens::{Token, TokenAndRange};
use serde_json::{Map, Value};

use super::BEGIN_GENERATED;
use crate::hujson_edit::{expect_array, expect_object, find_prop};
use crate::{MARKER_PREFIX, RenderError};

/// A rendered document fed back in as a base would nest generated blocks: refused.
pub(super) fn refuse_rendered_output(tokens: &[TokenAndRange<'_>]) -> Result<(), RenderError> {
    let rendered = tokens.iter().any(|t| match &t.token {
        Token::CommentLine(c) | Token::CommentBlock(c) => {
            c.contains(BEGIN_GENERATED) || c.contains(MARKER_PREFIX)
        }
        _ => false,
    });
    if rendered {
        return Err(RenderError::BaseContainsRenderedOutput);
    }
    Ok(())
}

/// The base's root object.
pub(super) fn root_object<'b, 'a>(
    parsed: &'b ParseResult<'a>,
) -> Result<&'b Object<'a>, RenderError> {
    match parsed.value.as_ref() {
        Some(AstValue::Object(root)) => Ok(root),
        _ => Err(RenderError::Base(crate::BaseError {
            line: 1,
            column: 1,
            message: "the base policy must be a JSON object".into(),
        })),
    }
}

/// The containers of the base that generated entries go into (`None`: the base lacks it).
pub(super) struct Located<'b, 'a> {
    pub(super) tag_owners: Option<&'b Object<'a>>,
    pub(super) auto_approvers: Option<&'b Object<'a>>,
    /// `autoApprovers.routes`.
    pub(super) routes: Option<&'b Object<'a>>,
    pub(super) grants: Option<&'b Array<'a>>,
    /// The base has `grants` or `acls` (with neither, Headscale allows everything).
    pub(super) has_rules: bool,
}

impl<'b, 'a> Located<'b, 'a> {
    /// Finds (and type-checks) `tagOwners`, `autoApprovers.routes` and `grants`; an
    /// ambiguous or wrongly typed key is an error naming it.
    pub(super) fn find(root: &'b Object<'a>) -> Result<Self, RenderError> {
        let tag_owners = find_prop(root, "tagOwners", "tagOwners")?
            .map(|p| expect_object(p, "tagOwners"))
            .transpose()?;
        let auto_approvers = find_prop(root, "autoApprovers", "autoApprovers")?
            .map(|p| expect_object(p, "autoApprovers"))
            .transpose()?;
        let routes_prop = match auto_approvers {
            Some(o) => find_prop(o, "routes", "autoApprovers.routes")?,
            None => None,
        };
        let routes = routes_prop
            .map(|p| expect_object(p, "autoApprovers.routes"))
            .transpose()?;
        let grants_prop = find_prop(root, "grants", "grants")?;
        let grants = grants_prop.map(|p| expect_array(p, "grants")).transpose()?;
        // `acls` is only looked up for the allow-all notice, but an ambiguous key is still an
        // error.
        let acls_prop = find_prop(root, "acls", "acls")?;
        Ok(Located {
            tag_owners,
            auto_approvers,
            routes,
            grants,
            has_rules: grants_prop.is_some() || acls_prop.is_some(),
        })
    }
}

/// What the base already defines, which the generated entries are compared against.
pub(super) struct BaseFacts {
    /// `tagOwners` (empty when absent or not an object).
    pub(super) tag_owners: Map<String, Value>,
    /// `autoApprovers.routes` (empty when absent or not an object).
    pub(super) routes: Map<String, Value>,
    /// The names of `groups`.
    pub(super) groups: BTreeSet<String>,
}

impl BaseFacts {
    pub(super) fn of(base: &Value) -> Self {
        let empty = Map::new();
        let base = base.as_object().unwrap_or(&empty);
        let object = |v: Option<&Value>| v.and_then(Value::as_object).cloned().unwrap_or_default();
        BaseFacts {
            tag_owners: object(get_ci(base, "tagOwners")),
            routes: object(
                get_ci(base, "autoApprovers")
                    .and_then(Value::as_object)
                    .and_then(|aa| get_ci(aa, "routes")),
            ),
            groups: get_ci(base, "groups")
                .and_then(Value::as_object)
                .map(|g| g.keys().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// Case-insensitive lookup in a `serde_json` object (mirrors [`find_prop`]).
fn get_ci<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
        .map(|(_, v)| v)
}
