//! Strict HuJSON parsing on top of `jsonc-parser`.
//!
//! Headscale parses policies with `tailscale/hujson`, which is JSON plus `//` and `/* */`
//! comments and trailing commas — nothing else. `jsonc-parser` accepts much more by default
//! (single quotes, unquoted keys, hex numbers, missing commas, …); a base using those would
//! pass here and be rejected by Headscale, so every relaxation except comments and trailing
//! commas is switched off.

use jsonc_parser::ast::{ObjectPropName, Value as AstValue};
use jsonc_parser::common::Ranged;
use jsonc_parser::{CollectOptions, CommentCollectionStrategy, ParseOptions, ParseResult};
use serde_json::{Map, Number, Value};

use crate::{BaseError, MAX_NESTING_DEPTH};

/// Parse options equivalent to HuJSON: comments and trailing commas only.
pub(crate) fn hujson_options() -> ParseOptions {
    ParseOptions {
        allow_comments: true,
        allow_trailing_commas: true,
        allow_loose_object_property_names: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: false,
        allow_extended_string_escapes: false,
    }
}

/// A leading UTF-8 byte-order mark is not JSON; tolerate it on input (editors add it).
pub(crate) fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// Parses `text` as HuJSON, collecting tokens (and comments as tokens) so callers can find
/// commas and comments between nodes. Documents nested deeper than [`MAX_NESTING_DEPTH`]
/// are refused before parsing (the conversions recurse per level), and so are raw control
/// characters in strings.
pub(crate) fn parse_ast(text: &str) -> Result<ParseResult<'_>, BaseError> {
    check_lexical(text)?;
    jsonc_parser::parse_to_ast(
        text,
        &CollectOptions {
            comments: CommentCollectionStrategy::AsTokens,
            tokens: true,
        },
        &hujson_options(),
    )
    .map_err(|e| BaseError {
        line: e.line_display(),
        column: e.column_display(),
        message: e.kind().to_string(),
    })
}

/// Rejects objects/arrays nested deeper than [`MAX_NESTING_DEPTH`] and raw control
/// characters in strings, scanning the text lexically (strings and comments tracked) in one
/// pass without recursion.
fn check_lexical(text: &str) -> Result<(), BaseError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Lexical {
        Code,
        String { escaped: bool },
        LineComment,
        BlockComment { star: bool },
    }
    let bytes = text.as_bytes();
    let mut state = Lexical::Code;
    let mut depth = 0usize;
    for (offset, &byte) in bytes.iter().enumerate() {
        state = match state {
            Lexical::Code => match byte {
                b'"' => Lexical::String { escaped: false },
                b'/' if bytes.get(offset + 1) == Some(&b'/') => Lexical::LineComment,
                b'/' if bytes.get(offset + 1) == Some(&b'*') => {
                    Lexical::BlockComment { star: false }
                }
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_NESTING_DEPTH {
                        let (line, column) = line_column(text, offset);
                        return Err(BaseError {
                            line,
                            column,
                            message: format!(
                                "objects and arrays are nested more than {MAX_NESTING_DEPTH} levels deep"
                            ),
                        });
                    }
                    Lexical::Code
                }
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    Lexical::Code
                }
                _ => Lexical::Code,
            },
            Lexical::String { escaped: true } => Lexical::String { escaped: false },
            Lexical::String { escaped: false } => match byte {
                b'\\' => Lexical::String { escaped: true },
                b'"' => Lexical::Code,
                // JSON (and Go's decoder in Headscale) forbids raw control characters in
                // strings; the parser here would take them.
                0..=0x1f => {
                    let (line, column) = line_column(text, offset);
                    return Err(BaseError {
                        line,
                        column,
                        message: format!(
                            "control character U+{byte:04X} in a string; write it as an escape (e.g. \\n, \\u0000)"
                        ),
                    });
                }
                _ => Lexical::String { escaped: false },
            },
            Lexical::LineComment => match byte {
                b'\n' => Lexical::Code,
                // The parser here ends a `//` comment at a lone CR, Go's hujson (Headscale)
                // only at LF: the two would read different documents. Found by fuzzing.
                b'\r' if bytes.get(offset + 1) != Some(&b'\n') => {
                    let (line, column) = line_column(text, offset);
                    return Err(BaseError {
                        line,
                        column,
                        message: "carriage return without a line feed in a // comment; end lines with \\n or \\r\\n".into(),
                    });
                }
                _ => Lexical::LineComment,
            },
            Lexical::BlockComment { star } => match byte {
                b'/' if star => Lexical::Code,
                b'*' => Lexical::BlockComment { star: true },
                _ => Lexical::BlockComment { star: false },
            },
        };
    }
    Ok(())
}

/// 1-based line and column of a byte offset (columns count characters, as the parser does).
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

/// Converts an AST value to `serde_json`, rejecting duplicate object keys: Go's JSON v2
/// decoder (which Headscale uses) rejects them, while a map would silently keep the last.
pub(crate) fn to_json(text: &str, value: &AstValue<'_>) -> Result<Value, BaseError> {
    Ok(match value {
        AstValue::StringLit(s) => Value::String(s.value.to_string()),
        AstValue::NumberLit(n) => {
            let number: Number = serde_json::from_str(n.value).map_err(|e| {
                let (line, column) = line_column(text, n.range.start);
                BaseError {
                    line,
                    column,
                    message: format!("invalid number {:?}: {e}", n.value),
                }
            })?;
            Value::Number(number)
        }
        AstValue::BooleanLit(b) => Value::Bool(b.value),
        AstValue::NullKeyword(_) => Value::Null,
        AstValue::Array(a) => Value::Array(
            a.elements
                .iter()
                .map(|v| to_json(text, v))
                .collect::<Result<_, _>>()?,
        ),
        AstValue::Object(o) => {
            let mut map = Map::new();
            for prop in &o.properties {
                let name = prop_name(&prop.name);
                if map.contains_key(&name) {
                    let (line, column) = line_column(text, prop.range().start);
                    return Err(BaseError {
                        line,
                        column,
                        message: format!("duplicate key {name:?} (Headscale rejects duplicates)"),
                    });
                }
                let v = to_json(text, &prop.value)?;
                map.insert(name, v);
            }
            Value::Object(map)
        }
    })
}

/// The decoded name of an object property.
pub(crate) fn prop_name(name: &ObjectPropName<'_>) -> String {
    match name {
        ObjectPropName::String(s) => s.value.to_string(),
        ObjectPropName::Word(w) => w.value.to_string(),
    }
}

/// Parses a whole HuJSON document into a `serde_json` value (comments dropped).
pub(crate) fn parse_value(text: &str) -> Result<Option<Value>, BaseError> {
    let text = strip_bom(text);
    let parsed = parse_ast(text)?;
    parsed.value.as_ref().map(|v| to_json(text, v)).transpose()
}

/// A JSON type name for error messages.
pub(crate) fn type_name(value: &AstValue<'_>) -> &'static str {
    match value {
        AstValue::StringLit(_) => "string",
        AstValue::NumberLit(_) => "number",
        AstValue::BooleanLit(_) => "boolean",
        AstValue::NullKeyword(_) => "null",
        AstValue::Array(_) => "array",
        AstValue::Object(_) => "object",
    }
}
