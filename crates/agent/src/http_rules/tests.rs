use serde_json::json;

use super::*;

fn rules(value: serde_json::Value) -> Vec<CompiledRule> {
    let rules: Vec<HttpRule> =
        serde_json::from_value(value).unwrap_or_else(|e| panic!("test rules: {e}"));
    rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            CompiledRule::compile(rule, &format!("rules[{index}]"))
                .unwrap_or_else(|e| panic!("compile: {e}"))
        })
        .collect()
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
            HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")),
        );
    }
    map
}

/// The index of the rule `method target` with `header_pairs` selects (`None`: 404).
fn chosen(
    rules: &[CompiledRule],
    method: &str,
    target: &str,
    header_pairs: &[(&str, &str)],
) -> Option<usize> {
    let method = Method::from_bytes(method.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let headers = headers(header_pairs);
    let request = RequestView {
        method: &method,
        path,
        query,
        headers: &headers,
    };
    select(rules, &request).map(|selected| selected.index)
}

#[test]
fn path_prefixes_match_whole_segments() {
    let cases = [
        ("/foo", "/foo", true),
        ("/foo", "/foo/", true),
        ("/foo", "/foo/bar", true),
        ("/foo", "/foobar", false),
        ("/foo", "/fo", false),
        ("/foo", "/", false),
        ("/foo/bar", "/foo/bar/baz", true),
        ("/foo/bar", "/foo/barbaz", false),
        ("", "/anything", true),
        ("", "/", true),
    ];
    for (prefix, path, expected) in cases {
        assert_eq!(prefix_matches(prefix, path), expected, "{prefix} {path}");
    }
    // Configured with a trailing slash, `/` or as the root: the same segment rule.
    let rules = rules(json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/foo/"}}]},
        {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}]}
    ]));
    assert_eq!(chosen(&rules, "GET", "/foo", &[]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/foo/x", &[]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/foox", &[]), Some(1));
    assert_eq!(chosen(&rules, "GET", "/", &[]), Some(1));
}

#[test]
fn exact_and_regular_expression_paths() {
    let rules = rules(json!([
        {"matches": [{"path": {"type": "Exact", "value": "/exact"}}]},
        {"matches": [{"path": {"type": "RegularExpression", "value": "/v[0-9]+/.*"}}]}
    ]));
    assert_eq!(chosen(&rules, "GET", "/exact", &[]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/exact/", &[]), None);
    assert_eq!(chosen(&rules, "GET", "/Exact", &[]), None, "case-sensitive");
    assert_eq!(
        chosen(&rules, "GET", "/exact?x=1", &[]),
        Some(0),
        "query aside"
    );
    assert_eq!(chosen(&rules, "GET", "/v2/items", &[]), Some(1));
    assert_eq!(chosen(&rules, "GET", "/x/v2/items", &[]), None, "anchored");
}

#[test]
fn headers_match_by_name_case_insensitively_and_value_exactly() {
    let rules = rules(json!([
        {"matches": [{"headers": [
            {"name": "X-Env", "value": "canary"},
            {"name": "x-env", "value": "ignored: a repeated name counts once, first wins"}
        ]}]},
        {"matches": [{"headers": [{"type": "RegularExpression", "name": "x-version", "value": "v[12]"}]}]}
    ]));
    assert_eq!(chosen(&rules, "GET", "/", &[("x-env", "canary")]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/", &[("X-ENV", "canary")]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/", &[("x-env", "Canary")]), None);
    assert_eq!(
        chosen(
            &rules,
            "GET",
            "/",
            &[("x-env", "stable"), ("x-env", "canary")]
        ),
        Some(0),
        "any of several values"
    );
    assert_eq!(chosen(&rules, "GET", "/", &[("x-version", "v2")]), Some(1));
    assert_eq!(chosen(&rules, "GET", "/", &[("x-version", "v3")]), None);
    assert_eq!(chosen(&rules, "GET", "/", &[("x-version", "v12")]), None);
    assert_eq!(chosen(&rules, "GET", "/", &[]), None);
}

#[test]
fn query_parameters_match_decoded_first_occurrence() {
    let rules = rules(json!([
        {"matches": [{"queryParams": [{"name": "animal", "value": "whale"}]}]},
        {"matches": [{"queryParams": [{"name": "q", "value": "a b"}]}]},
        {"matches": [{"queryParams": [{"type": "RegularExpression", "name": "id", "value": "[0-9]+"}]}]}
    ]));
    assert_eq!(chosen(&rules, "GET", "/?animal=whale", &[]), Some(0));
    assert_eq!(chosen(&rules, "GET", "/?x=1&animal=whale&y", &[]), Some(0));
    assert_eq!(
        chosen(&rules, "GET", "/?animal=dolphin&animal=whale", &[]),
        None
    );
    assert_eq!(
        chosen(&rules, "GET", "/?Animal=whale", &[]),
        None,
        "names case-sensitive"
    );
    assert_eq!(chosen(&rules, "GET", "/?q=a%20b", &[]), Some(1));
    assert_eq!(
        chosen(&rules, "GET", "/?%71=a%20b", &[]),
        Some(1),
        "decoded name"
    );
    assert_eq!(chosen(&rules, "GET", "/?id=42", &[]), Some(2));
    assert_eq!(chosen(&rules, "GET", "/?id=4x", &[]), None);
    assert_eq!(chosen(&rules, "GET", "/", &[]), None);
    assert_eq!(query_value(Some("a&b=&c=%zz%4"), "a").as_deref(), Some(""));
    assert_eq!(query_value(Some("a&b=&c=%zz%4"), "b").as_deref(), Some(""));
    assert_eq!(
        query_value(Some("a&b=&c=%zz%4"), "c").as_deref(),
        Some("%zz%4"),
        "malformed escapes stay"
    );
    assert_eq!(query_value(Some("c=%FF"), "c").as_deref(), Some("\u{fffd}"));
    assert_eq!(query_value(None, "c"), None);
}

#[test]
fn method_and_conditions_of_one_match_all_hold() {
    let rules = rules(json!([
        {"matches": [{"method": "POST", "path": {"type": "PathPrefix", "value": "/api"},
                      "headers": [{"name": "x-a", "value": "1"}],
                      "queryParams": [{"name": "q", "value": "1"}]}]},
        {"matches": [{"method": "GET"}, {"path": {"type": "Exact", "value": "/or"}}]}
    ]));
    assert_eq!(
        chosen(&rules, "POST", "/api/x?q=1", &[("x-a", "1")]),
        Some(0)
    );
    assert_eq!(chosen(&rules, "PUT", "/api/x?q=1", &[("x-a", "1")]), None);
    assert_eq!(chosen(&rules, "POST", "/api/x", &[("x-a", "1")]), None);
    assert_eq!(chosen(&rules, "POST", "/api/x?q=1", &[]), None);
    assert_eq!(chosen(&rules, "POST", "/other?q=1", &[("x-a", "1")]), None);
    // Matches of one rule: any of them.
    assert_eq!(chosen(&rules, "GET", "/anything", &[]), Some(1));
    assert_eq!(chosen(&rules, "DELETE", "/or", &[]), Some(1));
    assert_eq!(chosen(&rules, "DELETE", "/and", &[]), None);
}

#[test]
fn the_first_rule_in_order_wins_and_empty_matches_take_everything() {
    let rules = rules(json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/a"}}]},
        {"matches": [{"path": {"type": "Exact", "value": "/a/b"}}]},
        {}
    ]));
    assert_eq!(
        chosen(&rules, "GET", "/a/b", &[]),
        Some(0),
        "order, not specificity"
    );
    assert_eq!(chosen(&rules, "GET", "/z", &[]), Some(2));
    assert_eq!(chosen(&[], "GET", "/z", &[]), None);
}

#[test]
fn the_matched_prefix_is_the_matching_match_s() {
    let rules = rules(json!([
        {"matches": [{"path": {"type": "PathPrefix", "value": "/one/"}},
                     {"path": {"type": "PathPrefix", "value": "/two"}},
                     {"method": "PATCH"}]}
    ]));
    let method = Method::GET;
    let empty = HeaderMap::new();
    let prefix = |method: &Method, path: &str| {
        let request = RequestView {
            method,
            path,
            query: None,
            headers: &empty,
        };
        select(&rules, &request).map(|selected| selected.matched_prefix.to_owned())
    };
    assert_eq!(prefix(&method, "/one/x").as_deref(), Some("/one"));
    assert_eq!(prefix(&method, "/two").as_deref(), Some("/two"));
    assert_eq!(prefix(&Method::PATCH, "/three").as_deref(), Some(""));
    assert_eq!(prefix(&method, "/three"), None);
}

#[test]
fn header_edits_set_add_remove() {
    let modifier: HeaderModifier = serde_json::from_value(json!({
        "set": [{"name": "X-Set", "value": "new"}],
        "add": [{"name": "x-add", "value": "second"}, {"name": "x-fresh", "value": "1"}],
        "remove": ["x-gone", "X-Set-Then-Removed"]
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    let edits = HeaderEdits::compile(&modifier, "f").unwrap_or_else(|e| panic!("{e}"));
    let mut map = headers(&[
        ("x-set", "old1"),
        ("x-set", "old2"),
        ("x-add", "first"),
        ("x-gone", "1"),
        ("x-gone", "2"),
        ("x-set-then-removed", "1"),
        ("x-kept", "yes"),
    ]);
    edits.apply(&mut map);
    let values = |name: &str| -> Vec<String> {
        map.get_all(name)
            .iter()
            .map(|value| value.to_str().unwrap_or("?").to_owned())
            .collect()
    };
    assert_eq!(values("x-set"), ["new"]);
    assert_eq!(values("x-add"), ["first", "second"]);
    assert_eq!(values("x-fresh"), ["1"]);
    assert!(values("x-gone").is_empty());
    assert!(values("x-set-then-removed").is_empty());
    assert_eq!(values("x-kept"), ["yes"]);
    let bad: HeaderModifier =
        serde_json::from_value(json!({"set": [{"name": "a b", "value": "x"}]}))
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(HeaderEdits::compile(&bad, "f").is_err());
}

fn modifier(kind: PathModifierType, value: &str) -> PathModifier {
    PathModifier {
        kind,
        value: value.to_owned(),
    }
}

/// The Gateway API's table for `ReplacePrefixMatch` (HTTPPathModifier), row by row.
#[test]
fn replace_prefix_match_follows_the_spec_table() {
    let rows = [
        ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
        ("/foo", "/foo", "/xyz", "/xyz"),
        ("/foo/", "/foo", "/xyz", "/xyz/"),
        ("/foo/bar", "/foo", "", "/bar"),
        ("/foo/", "/foo", "", "/"),
        ("/foo", "/foo", "", "/"),
        ("/foo/", "/foo", "/", "/"),
        ("/foo", "/foo", "/", "/"),
        // The brief's examples and the root prefix.
        ("/foo/baz", "/foo", "/bar", "/bar/baz"),
        ("/foo/baz", "/foo", "/", "/baz"),
        ("/foo/baz", "", "/bar", "/bar/foo/baz"),
        ("/prefix/one/two", "/prefix/one", "/one", "/one/two"),
    ];
    for (path, prefix, value, expected) in rows {
        // The prefix as compiled: without its trailing slash.
        let compiled = prefix.trim_end_matches('/');
        assert_eq!(
            modified_path(
                &modifier(PathModifierType::ReplacePrefixMatch, value),
                path,
                compiled
            ),
            expected,
            "{path} prefix {prefix} → {value}"
        );
    }
    assert_eq!(
        modified_path(
            &modifier(PathModifierType::ReplaceFullPath, "/full"),
            "/foo/bar",
            "/foo"
        ),
        "/full"
    );
}

fn source<'a>(scheme: &'a str, path: &'a str, query: Option<&'a str>) -> RedirectSource<'a> {
    RedirectSource {
        scheme,
        host: "app.example.com",
        listener_port: 8080,
        path,
        query,
    }
}

fn redirect(value: serde_json::Value) -> RequestRedirect {
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn redirect_locations_follow_the_port_and_scheme_rules() {
    let cases: Vec<(serde_json::Value, RedirectSource<'_>, &str, &str)> = vec![
        // Nothing set: the request's scheme, host, path and query; the listener's port.
        (
            json!({}),
            source("http", "/a", Some("x=1")),
            "",
            "http://app.example.com:8080/a?x=1",
        ),
        // A scheme: its well-known port, left out.
        (
            json!({"scheme": "https"}),
            source("http", "/a", None),
            "",
            "https://app.example.com/a",
        ),
        (
            json!({"scheme": "http"}),
            source("https", "/a", None),
            "",
            "http://app.example.com/a",
        ),
        // A port: written unless it is the scheme's default.
        (
            json!({"scheme": "https", "port": 8443}),
            source("http", "/a", None),
            "",
            "https://app.example.com:8443/a",
        ),
        (
            json!({"port": 80}),
            source("http", "/a", None),
            "",
            "http://app.example.com/a",
        ),
        (
            json!({"port": 443}),
            source("http", "/a", None),
            "",
            "http://app.example.com:443/a",
        ),
        (
            json!({"port": 443}),
            source("https", "/a", None),
            "",
            "https://app.example.com/a",
        ),
        // The listener port on its own scheme's default is left out too.
        (
            json!({}),
            RedirectSource {
                listener_port: 80,
                ..source("http", "/a", None)
            },
            "",
            "http://app.example.com/a",
        ),
        (
            json!({"hostname": "other.example.com"}),
            source("http", "/a", None),
            "",
            "http://other.example.com:8080/a",
        ),
        (
            json!({"path": {"type": "ReplaceFullPath", "value": "/full"}}),
            source("http", "/a/b", Some("q")),
            "",
            "http://app.example.com:8080/full?q",
        ),
        (
            json!({"path": {"type": "ReplacePrefixMatch", "value": "/new"}}),
            source("http", "/old/page", None),
            "/old",
            "http://app.example.com:8080/new/page",
        ),
        (
            json!({}),
            RedirectSource {
                host: "fd7a::1",
                ..source("http", "/", None)
            },
            "",
            "http://[fd7a::1]:8080/",
        ),
    ];
    for (config, source, prefix, expected) in cases {
        assert_eq!(
            redirect_location(&redirect(config.clone()), &source, prefix),
            expected,
            "{config}"
        );
    }
    assert_eq!(redirect_status(&redirect(json!({}))), 302);
    assert_eq!(redirect_status(&redirect(json!({"statusCode": 301}))), 301);
}

#[test]
fn weights_choose_deterministically_for_a_given_random_value() {
    assert_eq!(choose_backend(&[0, 100], |_| 0), Some(1));
    assert_eq!(choose_backend(&[0, 100], |total| total - 1), Some(1));
    assert_eq!(choose_backend(&[100, 0], |total| total - 1), Some(0));
    assert_eq!(choose_backend(&[0, 0], |_| 0), None, "all weights 0: 500");
    assert_eq!(choose_backend(&[], |_| 0), None, "no backend: 500");
    assert_eq!(choose_backend(&[1, 2, 1], |_| 0), Some(0));
    assert_eq!(choose_backend(&[1, 2, 1], |_| 1), Some(1));
    assert_eq!(choose_backend(&[1, 2, 1], |_| 2), Some(1));
    assert_eq!(choose_backend(&[1, 2, 1], |_| 3), Some(2));
    assert_eq!(choose_backend(&[1, 2, 1], |_| 99), Some(2), "clamped");
    let max = tailnet_api::agent_config::MAX_BACKEND_WEIGHT;
    assert_eq!(
        choose_backend(&[max; 16], |total| {
            assert_eq!(total, 16 * u64::from(max));
            total - 1
        }),
        Some(15)
    );
}

#[test]
fn weights_split_in_proportion_over_every_random_value() {
    // Every value of the random source once: the split is exactly the weights.
    let weights = [3, 0, 5, 2];
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    let mut counts = [0u32; 4];
    for value in 0..total {
        if let Some(index) = choose_backend(&weights, |_| value) {
            counts[index] += 1;
        }
    }
    assert_eq!(counts, [3, 0, 5, 2]);
}

#[test]
fn the_single_backend_rule_takes_every_request() {
    let rule = CompiledRule::single_backend();
    let rules = [rule];
    assert_eq!(chosen(&rules, "DELETE", "/anything?x", &[]), Some(0));
    assert_eq!(choose_backend(&rules[0].weights, |_| 0), Some(0));
    assert!(rules[0].redirect.is_none() && rules[0].rewrite.is_none());
}
