//! Hostname rules of the Gateway API: `*.`-prefixed wildcards match one or more labels to the
//! left (`*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`);
//! a listener hostname and a route's hostnames must intersect, and the intersection (the more
//! specific of two matching names) is what the route serves on that listener; more specific
//! names take precedence over less specific ones.

use std::cmp::Ordering;

/// The suffix a wildcard matches (`*.example.com` → `.example.com`), `None` for a precise name.
fn wildcard_suffix(hostname: &str) -> Option<&str> {
    hostname.strip_prefix('*')
}

/// Whether `pattern` (precise or wildcard) matches the precise or wildcard `name`: equal
/// names, or a wildcard whose suffix ends `name` with at least one label in front (a wildcard
/// `name` is matched by a wildcard `pattern` whose suffix it extends).
pub fn matches(pattern: &str, name: &str) -> bool {
    if pattern == name {
        return true;
    }
    match wildcard_suffix(pattern) {
        Some(suffix) => {
            let name_body = wildcard_suffix(name).unwrap_or(name);
            name_body.len() > suffix.len() && name_body.ends_with(suffix)
        }
        None => false,
    }
}

/// The intersection of two hostnames: the more specific one when one matches the other.
pub fn intersect<'a>(a: &'a str, b: &'a str) -> Option<&'a str> {
    if matches(a, b) {
        Some(b)
    } else if matches(b, a) {
        Some(a)
    } else {
        None
    }
}

/// The hostnames a route serves on a listener (`None` = every hostname): the route's
/// hostnames intersected with the listener's, sorted and without duplicates. Empty when they
/// do not intersect (the route does not attach to this listener).
pub fn effective(listener: Option<&str>, route: &[String]) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = match (listener, route.is_empty()) {
        (listener, true) => vec![listener.map(str::to_string)],
        (None, false) => route.iter().map(|h| Some(h.clone())).collect(),
        (Some(listener), false) => route
            .iter()
            .filter_map(|h| intersect(listener, h).map(|x| Some(x.to_string())))
            .collect(),
    };
    out.sort_by(|a, b| by_precedence(a.as_deref(), b.as_deref()));
    out.dedup();
    out
}

/// Precedence of hostnames, most specific first: precise names (longest first), then
/// wildcards (most labels right of the `*` first, then longest), then "every hostname".
/// Ties are broken alphabetically so the order is total.
pub fn by_precedence(a: Option<&str>, b: Option<&str>) -> Ordering {
    fn rank(h: Option<&str>) -> (u8, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>) {
        match h {
            None => (2, std::cmp::Reverse(0), std::cmp::Reverse(0)),
            Some(h) => match wildcard_suffix(h) {
                None => (0, std::cmp::Reverse(h.len()), std::cmp::Reverse(0)),
                Some(suffix) => (
                    1,
                    std::cmp::Reverse(suffix.matches('.').count()),
                    std::cmp::Reverse(h.len()),
                ),
            },
        }
    }
    rank(a).cmp(&rank(b)).then_with(|| a.cmp(&b))
}

/// Whether two listener hostnames can both match one request (`None` matches everything).
pub fn overlap(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => intersect(a, b).is_some(),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_matching_follows_the_spec() {
        let cases = [
            ("*.example.com", "foo.example.com", true),
            ("*.example.com", "foo.bar.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "fooexample.com", false),
            ("*.example.com", "*.foo.example.com", true),
            ("*.foo.example.com", "*.example.com", false),
            ("*.example.com", "*.example.com", true),
            ("foo.example.com", "foo.example.com", true),
            ("foo.example.com", "*.example.com", false),
            ("foo.example.com", "bar.example.com", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(matches(pattern, name), want, "{pattern} ~ {name}");
        }
    }

    #[test]
    fn intersection_is_the_more_specific_name() {
        let cases = [
            (
                "very.specific.com",
                "*.specific.com",
                Some("very.specific.com"),
            ),
            (
                "*.wildcard.io",
                "foo.bar.wildcard.io",
                Some("foo.bar.wildcard.io"),
            ),
            ("*.wildcard.io", "wildcard.io", None),
            (
                "*.example.com",
                "*.foo.example.com",
                Some("*.foo.example.com"),
            ),
            ("*.a.com", "*.b.com", None),
            ("a.com", "a.com", Some("a.com")),
        ];
        for (a, b, want) in cases {
            assert_eq!(intersect(a, b), want, "{a} ∩ {b}");
            assert_eq!(intersect(b, a), want, "{b} ∩ {a}");
        }
    }

    #[test]
    fn effective_hostnames_per_listener() {
        let route = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let some = |s: &str| Some(s.to_string());
        // Neither sets hostnames: every hostname.
        assert_eq!(effective(None, &[]), vec![None]);
        // Only the listener: the listener's.
        assert_eq!(effective(Some("a.com"), &[]), vec![some("a.com")]);
        // Only the route: the route's, most specific first.
        assert_eq!(
            effective(None, &route(&["*.b.com", "a.com"])),
            vec![some("a.com"), some("*.b.com")]
        );
        // Both: non-matching route names are ignored (conformance HTTPRouteHostnameIntersection).
        assert_eq!(
            effective(
                Some("*.wildcard.io"),
                &route(&[
                    "non.matching.com",
                    "wildcard.io",
                    "foo.wildcard.io",
                    "bar.wildcard.io"
                ])
            ),
            vec![some("bar.wildcard.io"), some("foo.wildcard.io")]
        );
        assert_eq!(
            effective(Some("very.specific.com"), &route(&["*.specific.com"])),
            vec![some("very.specific.com")]
        );
        assert_eq!(
            effective(Some("*.a.com"), &route(&["x.b.com", "b.com"])),
            Vec::<Option<String>>::new()
        );
    }

    #[test]
    fn precedence_most_specific_first() {
        let mut names = vec![
            None,
            Some("*.example.com"),
            Some("foo.example.com"),
            Some("*.foo.example.com"),
            Some("a.io"),
        ];
        names.sort_by(|a, b| by_precedence(*a, *b));
        assert_eq!(
            names,
            vec![
                Some("foo.example.com"),
                Some("a.io"),
                Some("*.foo.example.com"),
                Some("*.example.com"),
                None
            ]
        );
    }

    #[test]
    fn overlapping_listener_hostnames() {
        assert!(overlap(Some("foo.example.com"), Some("*.example.com")));
        assert!(!overlap(Some("foo.example.com"), Some("foo.example.org")));
        assert!(overlap(None, Some("foo.example.org")));
        assert!(overlap(Some("*.example.com"), Some("*.example.com")));
    }
}
