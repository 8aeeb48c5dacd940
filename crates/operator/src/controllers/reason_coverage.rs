//! Test support for the decision tables: every reason constant that a controller's decide
//! code names (`reasons::SOME_REASON` in its source) must come out of at least one case of
//! its table, so a reason without a case fails the test.

use std::collections::BTreeSet;

/// `NAME → "Value"` of every `pub const NAME: &str = "Value";` in the API's conditions.rs.
fn reason_values() -> Vec<(String, String)> {
    let source = include_str!("../../../api/src/conditions.rs");
    let reasons = source
        .split_once("pub mod reasons")
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    reasons
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(": &str = \"")?;
            let value = rest.strip_suffix("\";")?;
            Some((name.to_string(), value.to_string()))
        })
        .collect()
}

/// The reason values named as `reasons::NAME` (or `reasons::headscale::NAME`) in `sources`.
pub fn reasons_named_in(sources: &[&str]) -> BTreeSet<String> {
    let values = reason_values();
    let mut named = BTreeSet::new();
    for source in sources {
        for (_, rest) in source
            .match_indices("reasons::")
            .map(|(i, _)| source.split_at(i + 9))
        {
            let rest = rest.strip_prefix("headscale::").unwrap_or(rest);
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if name.is_empty() {
                continue;
            }
            if let Some((_, value)) = values.iter().find(|(n, _)| *n == name) {
                named.insert(value.clone());
            }
        }
    }
    named
}

/// Fails naming every reason of `sources` that no case produced.
pub fn assert_every_reason_has_a_case(seen: &BTreeSet<String>, sources: &[&str]) {
    let named = reasons_named_in(sources);
    assert!(
        named.len() >= 5,
        "parsed only {named:?}: the source scan is broken, the check would pass vacuously"
    );
    let missing: Vec<&String> = named.iter().filter(|r| !seen.contains(*r)).collect();
    assert!(
        missing.is_empty(),
        "reasons named in the decide code without a case in the table: {missing:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_named_reasons() {
        let named =
            reasons_named_in(&["c.fail(reasons::NODE_OFFLINE) reasons::headscale::TIMEOUT x"]);
        assert_eq!(
            named,
            BTreeSet::from(["NodeOffline".to_string(), "Timeout".to_string()])
        );
    }
}
