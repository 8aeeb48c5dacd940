//! Hostile and broken base policies through the real parser and renderer: huge, deeply
//! nested, duplicate keys, unknown keys, invalid HuJSON, wrong types. Each must end in a
//! clear error (with line and column where there is a position) or a correct render, never a
//! panic or a stack overflow. Prints `| input | expected | observed |` rows
//! (docs/reliability.md); times are printed, not asserted.

use std::time::Instant;

use tailnet_policy::{
    EgressPolicy, EgressTarget, IngressPolicy, MAX_BASE_BYTES, MAX_NESTING_DEPTH, PolicyInputs,
    RenderError, TargetAddress, parse_base, render, semantically_equal, up_to_date,
};

fn row(input: &str, expected: &str, observed: &str) {
    println!("| {input} | {expected} | {observed} |");
}

fn inputs() -> PolicyInputs {
    PolicyInputs {
        installation_id: "tailnet-operator/test/demo".into(),
        tag_owners: vec!["group:platform".into()],
        route_approvers: vec!["tag:router".into()],
        ingress_source_allowlist: vec!["group:team-a".into()],
        egresses: vec![EgressPolicy {
            owner: "tailnet-system/team-a".into(),
            tag: "tag:tno-egress-team-a".into(),
            targets: vec![EgressTarget {
                name: "db".into(),
                address: TargetAddress::parse("192.0.2.10"),
                port: 5432,
            }],
        }],
        ingresses: vec![IngressPolicy {
            kind: tailnet_policy::ResourceKind::TailnetIngress,
            owner: "team-a/portal".into(),
            tag: "tag:tno-ingress-team-a-portal".into(),
            allow_from: vec!["group:team-a".into()],
            ports: vec![443],
        }],
        nodes: Vec::new(),
        contributions: Vec::new(),
    }
}

fn nested(depth: usize) -> String {
    format!(
        "{{\"x\": {}{}}}",
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    for (name, text) in [
        ("100 000 nested arrays", nested(100_000)),
        ("1 000 000 unclosed `[`", "[".repeat(1_000_000)),
        (
            "100 000 nested objects",
            format!("{}{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)),
        ),
    ] {
        let started = Instant::now();
        let error = parse_base(&text).expect_err(name);
        row(
            name,
            "error naming the depth limit, no stack overflow",
            &format!("`{error}` in {:?}", started.elapsed()),
        );
        assert!(error.message.contains("nested more than"), "{error}");
        assert_eq!(error.line, 1);
        assert!(error.column > MAX_NESTING_DEPTH, "{error}");
        // The comparison paths parse the live document with the same bound.
        assert!(semantically_equal(&text, "{}").is_err());
        assert_eq!(up_to_date(&text, "{}"), Ok(false));
    }

    // At the limit: accepted and rendered.
    let at_limit = nested(MAX_NESTING_DEPTH);
    let base = parse_base(&at_limit).unwrap_or_else(|e| panic!("depth {MAX_NESTING_DEPTH}: {e}"));
    render(&base, &inputs()).unwrap_or_else(|e| panic!("render at the limit: {e}"));
    let error = parse_base(&nested(MAX_NESTING_DEPTH + 1)).expect_err("one over the limit");
    row(
        &format!(
            "nesting depth {MAX_NESTING_DEPTH} / {}",
            MAX_NESTING_DEPTH + 1
        ),
        "accepted / refused",
        &format!("accepted / `{error}`"),
    );

    // Brackets in strings and comments are not nesting.
    let decoys = format!(
        "{{\n  // {}\n  /* {} */\n  \"s\": \"{}\\\"{}\",\n}}",
        "[".repeat(1000),
        "{".repeat(1000),
        "[".repeat(1000),
        "{".repeat(1000)
    );
    parse_base(&decoys).unwrap_or_else(|e| panic!("brackets in strings/comments: {e}"));
    row(
        "1000s of `[`/`{` inside strings and comments",
        "accepted (not nesting)",
        "accepted",
    );
}

#[test]
fn huge_bases_are_bounded() {
    let over = format!(
        "{{\"groups\": {{\"group:a\": [\"{}\"]}}}}",
        "a".repeat(MAX_BASE_BYTES)
    );
    let error = parse_base(&over).expect_err("over the size limit");
    row(
        "base of 1 MiB + 30 bytes",
        "error naming the size limit",
        &format!("`{error}`"),
    );
    assert!(error.message.contains("at most 1048576"), "{error}");

    // Just under the limit, a realistic shape: many groups with many members.
    let mut text = String::from("{\n  \"groups\": {\n");
    let mut groups = 0;
    while text.len() < MAX_BASE_BYTES - 200 {
        text.push_str(&format!(
            "    \"group:g{groups}\": [\"alice{groups}@\", \"bob{groups}@\"],\n"
        ));
        groups += 1;
    }
    text.push_str("  },\n  \"grants\": [],\n}\n");
    assert!(text.len() <= MAX_BASE_BYTES);
    let started = Instant::now();
    let base = parse_base(&text).unwrap_or_else(|e| panic!("large base: {e}"));
    let parsed = started.elapsed();
    let rendered = render(&base, &inputs()).unwrap_or_else(|e| panic!("render: {e}"));
    let total = started.elapsed();
    assert!(
        rendered
            .document
            .contains(&format!("group:g{}", groups - 1))
    );
    assert_eq!(up_to_date(&rendered.document, &rendered.document), Ok(true));
    row(
        &format!("{} KiB base with {groups} groups", text.len() / 1024),
        "parsed and rendered",
        &format!("parsed in {parsed:?}, rendered in {:?}", total - parsed),
    );

    // One enormous string value and one enormous array.
    for (name, text) in [
        (
            "one 1000 KiB string",
            format!("{{\"hosts\": {{\"x\": \"{}\"}}}}", "1".repeat(1000 * 1024)),
        ),
        (
            "array of 200 000 numbers",
            format!("{{\"x\": [{}0]}}", "0,".repeat(200_000)),
        ),
    ] {
        let started = Instant::now();
        let outcome = parse_base(&text);
        row(
            name,
            "parsed (within the limits)",
            &format!(
                "{} in {:?}",
                if outcome.is_ok() { "parsed" } else { "refused" },
                started.elapsed()
            ),
        );
        assert!(outcome.is_ok(), "{name}: {outcome:?}");
    }
}

#[test]
fn duplicate_keys_are_errors_with_a_position() {
    let cases = [
        (
            "top-level key twice",
            "{\n  \"groups\": {},\n  \"groups\": {}\n}",
            3,
        ),
        (
            "group defined twice",
            "{\n  \"groups\": {\n    \"group:a\": [],\n    \"group:a\": [\"x@\"]\n  }\n}",
            4,
        ),
        (
            "duplicate inside a grant",
            "{\"grants\": [{\"src\": [\"*\"], \"src\": [\"x@\"], \"dst\": [\"*\"], \"ip\": [\"*\"]}]}",
            1,
        ),
    ];
    for (name, text, line) in cases {
        let error = parse_base(text).expect_err(name);
        row(
            name,
            "error naming the key and its line",
            &format!("`{error}`"),
        );
        assert_eq!(error.line, line, "{name}: {error}");
        assert!(error.message.contains("duplicate"), "{name}: {error}");
    }
    // Headscale matches top-level names case-insensitively: a render error names both.
    let base = parse_base("{\"tagOwners\": {}, \"TagOwners\": {}}")
        .unwrap_or_else(|e| panic!("case variants parse: {e}"));
    let error = render(&base, &inputs()).expect_err("case-insensitive duplicate");
    row(
        "`tagOwners` and `TagOwners`",
        "render error naming both",
        &format!("`{error}`"),
    );
    assert!(matches!(error, RenderError::AmbiguousKey { .. }), "{error}");
}

#[test]
fn unknown_keys_pass_through_for_headscale_to_judge() {
    let text = "{\n  // not a Headscale field\n  \"frobnicate\": {\"x\": 1},\n  \"groups\": {\"group:platform\": [\"alice@\"]},\n}\n";
    let base = parse_base(text).unwrap_or_else(|e| panic!("unknown key: {e}"));
    let rendered = render(&base, &inputs()).unwrap_or_else(|e| panic!("render: {e}"));
    row(
        "unknown top-level key `frobnicate`",
        "kept byte for byte; Headscale's policy check rejects it (`unknown field`) → PolicyApplied=Rejected",
        &format!(
            "kept: {}",
            rendered.document.contains("\"frobnicate\": {\"x\": 1}")
        ),
    );
    assert!(rendered.document.contains("\"frobnicate\": {\"x\": 1}"));
}

#[test]
fn invalid_hujson_is_an_error_with_line_and_column() {
    let cases: &[(&str, &str)] = &[
        ("single-quoted string", "{'groups': {}}"),
        ("unquoted key", "{groups: {}}"),
        ("hexadecimal number", "{\"x\": 0x10}"),
        ("unary plus", "{\"x\": +1}"),
        ("bare decimal point", "{\"x\": .5}"),
        ("NaN", "{\"x\": NaN}"),
        ("Infinity", "{\"x\": Infinity}"),
        ("missing comma", "{\"a\": 1\n \"b\": 2}"),
        ("unterminated string", "{\"a\": \"abc}"),
        ("unterminated block comment", "{\"a\": 1 /* never closed"),
        ("unclosed object", "{\"a\": {\"b\": 1}"),
        ("stray closing bracket", "{\"a\": 1]}"),
        ("two documents", "{} {}"),
        ("trailing garbage", "{\"a\": 1} x"),
        ("NUL byte in a string", "{\"a\": \"x\0y\"}"),
        ("raw newline in a string", "{\"a\": \"x\ny\"}"),
        ("invalid escape", "{\"a\": \"\\x41\"}"),
        ("number out of range", "{\"a\": 1e999}"),
        ("empty document", ""),
        ("only a comment", "// nothing\n"),
        ("array at the root", "[]"),
        ("string at the root", "\"policy\""),
        ("byte-order mark in the middle", "{\"a\": \u{feff}1}"),
        ("comma only", "{,}"),
        ("lone surrogate escape", "{\"a\": \"\\ud800\"}"),
        // Found by the policy_base fuzz target: the parser ended the comment at the CR and
        // read `{" \n\x0cgrants": [],}` (a raw newline in a key); Headscale's hujson reads
        // the whole line as a comment.
        (
            "lone CR in a // comment, then a key with a raw newline",
            "// \x0c\r\x0c{\" \n\x0cgrants\": [],}",
        ),
        ("lone CR in a // comment", "// c\r{\"groups\": {}}"),
    ];
    let mut accepted = Vec::new();
    for (name, text) in cases {
        let outcome = parse_base(text);
        let observed = match &outcome {
            Ok(base) => format!("accepted as {}", base.value()),
            Err(error) => format!("`{error}`"),
        };
        row(name, "error with line and column", &observed);
        match outcome {
            Ok(_) => accepted.push(*name),
            Err(error) => {
                assert!(error.line >= 1 && error.column >= 1, "{name}: {error}");
                assert!(!error.message.is_empty(), "{name}");
            }
        }
    }
    // JSON allows a lone surrogate escape; Go's decoder replaces it with U+FFFD. Nothing else
    // may be accepted.
    accepted.retain(|name| *name != "lone surrogate escape");
    // CRLF line ends stay fine.
    parse_base("// comment\r\n{\"groups\": {}}\r\n").unwrap_or_else(|e| panic!("CRLF base: {e}"));
    assert!(accepted.is_empty(), "accepted invalid HuJSON: {accepted:?}");
}

#[test]
fn wrong_types_and_rendered_bases_are_render_errors() {
    let cases = [
        ("`tagOwners` is an array", "{\"tagOwners\": []}"),
        ("`grants` is an object", "{\"grants\": {}}"),
        ("`autoApprovers` is a string", "{\"autoApprovers\": \"x\"}"),
        (
            "`autoApprovers.routes` is an array",
            "{\"autoApprovers\": {\"routes\": []}}",
        ),
    ];
    for (name, text) in cases {
        let base = parse_base(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let error = render(&base, &inputs()).expect_err(name);
        row(name, "render error naming the key", &format!("`{error}`"));
        assert!(matches!(error, RenderError::WrongType { .. }), "{error}");
    }
    let once = render(
        &parse_base("{}").unwrap_or_else(|e| panic!("{e}")),
        &inputs(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let again = parse_base(&once.document).unwrap_or_else(|e| panic!("rendered parses: {e}"));
    let error = render(&again, &inputs()).expect_err("rendered document as base");
    row(
        "a rendered document used as the base",
        "render error (would nest generated blocks)",
        &format!("`{error}`"),
    );
    assert_eq!(error, RenderError::BaseContainsRenderedOutput);

    let mut hostile_id = inputs();
    hostile_id.installation_id = "x\n\"grants\": [{\"src\": [\"*\"]}]".into();
    let error = render(
        &parse_base("{}").unwrap_or_else(|e| panic!("{e}")),
        &hostile_id,
    )
    .expect_err("control characters in the marker");
    row(
        "installation id with a newline (marker comment injection)",
        "render error",
        &format!("`{error}`"),
    );
    assert!(matches!(error, RenderError::InvalidInstallationId(_)));
}
