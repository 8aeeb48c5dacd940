//! Label selectors (`allowedRoutes.namespaces.selector`) evaluated on a namespace's labels,
//! with Kubernetes semantics: all `matchLabels` and all `matchExpressions` must hold; an empty
//! selector matches everything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector that cannot be evaluated (unknown operator, values where none belong).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("label selector: {0}")]
pub struct InvalidSelector(pub String);

/// Checks a selector once, so that evaluation cannot fail later.
pub fn validate(selector: &LabelSelector) -> Result<(), InvalidSelector> {
    for requirement in selector.match_expressions.iter().flatten() {
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(InvalidSelector(format!(
                    "{} {} needs values",
                    requirement.key, requirement.operator
                )));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(InvalidSelector(format!(
                    "{} {} takes no values",
                    requirement.key, requirement.operator
                )));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(InvalidSelector(format!(
                    "unknown operator {other:?} for {}",
                    requirement.key
                )));
            }
        }
    }
    Ok(())
}

/// Whether `labels` satisfy a selector that passed [`validate`] (an invalid requirement
/// matches nothing).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_hold = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    let expressions_hold = selector.match_expressions.iter().flatten().all(|r| {
        let values = r.values.as_deref().unwrap_or_default();
        let value = labels.get(&r.key);
        match r.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_hold && expressions_hold
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
        }
    }

    #[test]
    fn match_labels_and_expressions() {
        let ns = labels(&[("team", "a"), ("env", "prod")]);
        let cases = [
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("team", "a")])),
                    match_expressions: None,
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("team", "b")])),
                    match_expressions: None,
                },
                false,
            ),
            (expression("env", "In", &["prod", "dev"]), true),
            (expression("env", "In", &["dev"]), false),
            (expression("env", "NotIn", &["dev"]), true),
            (expression("missing", "NotIn", &["dev"]), true),
            (expression("env", "NotIn", &["prod"]), false),
            (expression("team", "Exists", &[]), true),
            (expression("missing", "Exists", &[]), false),
            (expression("missing", "DoesNotExist", &[]), true),
            (expression("team", "DoesNotExist", &[]), false),
        ];
        for (selector, want) in cases {
            assert_eq!(validate(&selector), Ok(()), "{selector:?}");
            assert_eq!(matches(&selector, &ns), want, "{selector:?}");
        }
    }

    #[test]
    fn invalid_selectors_are_reported_and_match_nothing() {
        for selector in [
            expression("env", "Equals", &["prod"]),
            expression("env", "In", &[]),
            expression("env", "Exists", &["prod"]),
        ] {
            assert!(validate(&selector).is_err(), "{selector:?}");
        }
        let unknown = expression("env", "Equals", &["prod"]);
        assert!(!matches(&unknown, &labels(&[("env", "prod")])));
    }
}
