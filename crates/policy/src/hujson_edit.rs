//! The HuJSON text-edit engine: finds containers in the base document's syntax tree and
//! inserts lines before their closing brackets, so every byte of the base (comments, key
//! order, formatting, trailing commas) is copied through unchanged. It knows nothing about
//! policies; [`crate::render`] decides what to insert.

use jsonc_parser::ast::{Array, Object, ObjectProp, Value as AstValue};
use jsonc_parser::tokens::{Token, TokenAndRange};

use crate::RenderError;
use crate::hujson::{prop_name, type_name};

/// Comments must stay on one line and not close a block comment.
pub(crate) fn comment_safe(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect::<String>()
        .replace("*/", "*?")
}

pub(crate) fn json_str(s: &str) -> String {
    // Serialising a &str cannot fail; fall back to a debug quote just in case.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// Looks up a top-level (or nested) key the way Headscale does: case-insensitively.
pub(crate) fn find_prop<'a, 'b>(
    obj: &'b Object<'a>,
    key: &str,
    path: &str,
) -> Result<Option<&'b ObjectProp<'a>>, RenderError> {
    let matches: Vec<&ObjectProp<'a>> = obj
        .properties
        .iter()
        .filter(|p| prop_name(&p.name).eq_ignore_ascii_case(key))
        .collect();
    match matches.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one)),
        many => Err(RenderError::AmbiguousKey {
            key: path.to_string(),
            found: many.iter().map(|p| prop_name(&p.name)).collect(),
        }),
    }
}

pub(crate) fn expect_object<'a, 'b>(
    prop: &'b ObjectProp<'a>,
    path: &str,
) -> Result<&'b Object<'a>, RenderError> {
    match &prop.value {
        AstValue::Object(o) => Ok(o),
        other => Err(RenderError::WrongType {
            key: path.to_string(),
            expected: "object",
            found: type_name(other),
        }),
    }
}

pub(crate) fn expect_array<'a, 'b>(
    prop: &'b ObjectProp<'a>,
    path: &str,
) -> Result<&'b Array<'a>, RenderError> {
    match &prop.value {
        AstValue::Array(a) => Ok(a),
        other => Err(RenderError::WrongType {
            key: path.to_string(),
            expected: "array",
            found: type_name(other),
        }),
    }
}

/// One output line: nesting depth below the container's inner indent, and text.
pub(crate) struct Line(pub(crate) usize, pub(crate) String);

/// Wraps lines into a new `"key": { … },` (or `[ … ]`) property.
pub(crate) fn wrap_key(out: &mut Vec<Line>, key: &str, open: char, inner: Vec<Line>) {
    let close = if open == '[' { ']' } else { '}' };
    out.push(Line(0, format!("{}: {open}", json_str(key))));
    out.extend(inner.into_iter().map(|Line(d, t)| Line(d + 1, t)));
    out.push(Line(0, format!("{close},")));
}

/// Positions of a container in the text.
pub(crate) struct Container {
    open: usize,
    /// Offset of the closing bracket.
    close: usize,
    /// Start and end of the last element, if any.
    last: Option<(usize, usize)>,
}

impl Container {
    pub(crate) fn object(o: &Object<'_>) -> Self {
        Container {
            open: o.range.start,
            close: o.range.end.saturating_sub(1),
            last: o.properties.last().map(|p| (p.range.start, p.range.end)),
        }
    }
    pub(crate) fn array(a: &Array<'_>) -> Self {
        let last = a.elements.last().map(|v| {
            let r = value_range(v);
            (r.start, r.end)
        });
        Container {
            open: a.range.start,
            close: a.range.end.saturating_sub(1),
            last,
        }
    }
}

fn value_range(v: &AstValue<'_>) -> jsonc_parser::common::Range {
    match v {
        AstValue::StringLit(x) => x.range,
        AstValue::NumberLit(x) => x.range,
        AstValue::BooleanLit(x) => x.range,
        AstValue::Object(x) => x.range,
        AstValue::Array(x) => x.range,
        AstValue::NullKeyword(x) => x.range,
    }
}

/// Insertions into the base text, applied in one pass.
#[derive(Default)]
pub(crate) struct Edits(Vec<(usize, usize, String)>);

impl Edits {
    pub(crate) fn insert(&mut self, at: usize, text: String) {
        let seq = self.0.len();
        self.0.push((at, seq, text));
    }

    pub(crate) fn apply(mut self, text: &str, nl: &str) -> String {
        self.0.sort_by_key(|(at, seq, _)| (*at, *seq));
        let mut out = String::with_capacity(text.len() + 1024);
        let mut pos = 0;
        for (at, _, ins) in &self.0 {
            // Offsets come from the parser and are char boundaries; be defensive anyway.
            if let Some(chunk) = text.get(pos..*at) {
                out.push_str(chunk);
                pos = *at;
            }
            if nl == "\n" {
                out.push_str(ins);
            } else {
                out.push_str(&ins.replace('\n', nl));
            }
        }
        out.push_str(text.get(pos..).unwrap_or_default());
        out
    }
}

pub(crate) struct EditCtx<'t, 'a> {
    text: &'t str,
    tokens: &'t [TokenAndRange<'a>],
    unit: String,
}

impl<'t, 'a> EditCtx<'t, 'a> {
    /// An editor of `text` (with its tokens), indenting like the base's `root` object.
    pub(crate) fn new(text: &'t str, tokens: &'t [TokenAndRange<'a>], root: &Object<'_>) -> Self {
        EditCtx {
            text,
            tokens,
            unit: indent_unit(text, root),
        }
    }

    fn line_start(&self, pos: usize) -> usize {
        self.text
            .get(..pos)
            .and_then(|s| s.rfind('\n'))
            .map_or(0, |i| i + 1)
    }

    fn line_indent(&self, pos: usize) -> String {
        let start = self.line_start(pos);
        self.text
            .get(start..)
            .unwrap_or_default()
            .chars()
            .take_while(|c| *c == ' ' || *c == '\t')
            .collect()
    }

    /// Only whitespace between the start of `pos`'s line and `pos`.
    fn first_on_line(&self, pos: usize) -> bool {
        let start = self.line_start(pos);
        self.text
            .get(start..pos)
            .is_some_and(|s| s.chars().all(|c| c == ' ' || c == '\t'))
    }

    /// The line before `pos`'s line (ignoring comment-only lines) is empty.
    pub(crate) fn blank_line_before(&self, pos: usize) -> bool {
        let mut end = self.line_start(pos);
        while end > 0 {
            let start = self.line_start(end - 1);
            let line = self.text.get(start..end - 1).unwrap_or_default().trim();
            if line.is_empty() {
                return true;
            }
            if !line.starts_with("//") {
                return false;
            }
            end = start;
        }
        false
    }

    fn has_comma_between(&self, from: usize, to: usize) -> bool {
        self.tokens
            .iter()
            .any(|t| t.token == Token::Comma && t.range.start >= from && t.range.start < to)
    }

    /// The comma the last element needs before anything is appended.
    fn comma_after_last(&self, edits: &mut Edits, c: &Container) {
        if let Some((_, end)) = c.last
            && !self.has_comma_between(end, c.close)
        {
            edits.insert(end, ",".into());
        }
    }

    /// Appends whole lines before the container's closing bracket, indented like the
    /// container's existing elements (or one unit deeper than its opening line).
    pub(crate) fn insert_lines(&self, edits: &mut Edits, c: &Container, lines: &[Line]) {
        self.comma_after_last(edits, c);
        let outer = self.line_indent(c.open);
        let inner = match c.last {
            Some((start, _)) if self.first_on_line(start) => self.line_indent(start),
            _ => format!("{outer}{}", self.unit),
        };
        let mut body = String::new();
        for Line(depth, t) in lines {
            if t.is_empty() {
                body.push('\n');
                continue;
            }
            body.push_str(&inner);
            for _ in 0..*depth {
                body.push_str(&self.unit);
            }
            body.push_str(t);
            body.push('\n');
        }
        let close_line = self.line_start(c.close);
        if close_line > c.open && self.first_on_line(c.close) {
            edits.insert(close_line, body);
        } else {
            // The bracket moves to its own line, aligned with the line that opened it.
            edits.insert(c.close, format!("\n{body}{outer}"));
        }
    }

    /// Appends approvers to a base array: inline when it is written on one line.
    pub(crate) fn merge_into_array(
        &self,
        edits: &mut Edits,
        arr: &Array<'_>,
        add: &[String],
        comment: &str,
    ) {
        let c = Container::array(arr);
        let one_line = self
            .text
            .get(c.open..c.close)
            .is_some_and(|s| !s.contains('\n'));
        if one_line {
            let sep = match c.last {
                Some((_, end)) if !self.has_comma_between(end, c.close) => ", ",
                Some(_) => " ",
                None => "",
            };
            let items: Vec<String> = add.iter().map(|a| json_str(a)).collect();
            // Strip whitespace between the last element and the bracket is not needed:
            // the insertion goes right before the bracket.
            edits.insert(
                c.close,
                format!(
                    "{sep}{} /* added by tailnet-operator for {} */",
                    items.join(", "),
                    comment_safe(comment)
                ),
            );
        } else {
            let mut lines = vec![Line(
                0,
                format!("// added by tailnet-operator for {}", comment_safe(comment)),
            )];
            lines.extend(add.iter().map(|a| Line(0, format!("{},", json_str(a)))));
            self.insert_lines(edits, &c, &lines);
        }
    }
}

/// The base's indentation unit, from its first top-level property; two spaces otherwise.
fn indent_unit(text: &str, root: &Object<'_>) -> String {
    let ctx = EditCtx {
        text,
        tokens: &[],
        unit: String::new(),
    };
    if let Some(first) = root.properties.first()
        && ctx.first_on_line(first.range.start)
    {
        let prop_indent = ctx.line_indent(first.range.start);
        let root_indent = ctx.line_indent(root.range.start);
        if let Some(unit) = prop_indent.strip_prefix(&root_indent)
            && !unit.is_empty()
        {
            return unit.to_string();
        }
    }
    "  ".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hujson::parse_ast;

    #[test]
    fn comments_cannot_break_out() {
        assert_eq!(comment_safe("a\nb */ c"), "a?b *? c");
    }

    #[test]
    fn single_line_root_gets_default_indent() {
        let text = r#"{"groups": {}}"#;
        let parsed = parse_ast(text).expect("parses");
        let Some(AstValue::Object(root)) = parsed.value.as_ref() else {
            panic!("object");
        };
        assert_eq!(indent_unit(text, root), "  ");
        let text = "{\n    \"groups\": {}\n}";
        let parsed = parse_ast(text).expect("parses");
        let Some(AstValue::Object(root)) = parsed.value.as_ref() else {
            panic!("object");
        };
        assert_eq!(indent_unit(text, root), "    ");
    }
}
