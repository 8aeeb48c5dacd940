//! Every condition type and reason the operator can set has an anchor in
//! `docs/troubleshooting.md` (`<a id="<lowercased name>"></a>`), so `kubectl describe` output
//! and alert runbook links (`docs/troubleshooting.md#headscalereachable`) lead to what it
//! means, how to confirm it and how to fix it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use regex::Regex;
use tailnet_api::agent_status::ProbeState;
use tailnet_api::conditions::reasons;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo().join(relative))
        .unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

/// The values of all `pub const X: &str = "Value";` in conditions.rs (types and reasons).
fn constants_in_code() -> BTreeSet<String> {
    let source = read("crates/api/src/conditions.rs");
    let constant = Regex::new(r#"pub const [A-Z_]+: &str = "([A-Za-z]+)";"#).expect("regex");
    constant
        .captures_iter(&source)
        .map(|c| c[1].to_string())
        .collect()
}

fn anchors_in_docs() -> BTreeSet<String> {
    let docs = read("docs/troubleshooting.md");
    let anchor = Regex::new(r#"<a id="([a-z0-9-]+)"></a>"#).expect("regex");
    anchor
        .captures_iter(&docs)
        .map(|c| c[1].to_string())
        .collect()
}

fn undocumented<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let anchors = anchors_in_docs();
    names
        .into_iter()
        .filter(|n| !anchors.contains(&n.to_lowercase()))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_condition_type_and_reason_constant_has_an_anchor() {
    let constants = constants_in_code();
    // The parse must see the real list (tens of names), or this test would pass vacuously.
    assert!(
        constants.len() > 60 && constants.contains("HeadscaleReachable"),
        "parsed only {constants:?} from conditions.rs"
    );
    let missing = undocumented(constants.iter().map(String::as_str));
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md has no <a id=\"…\"></a> anchor for {missing:?}: add a section \
         (what it means, how to confirm, how to fix)"
    );
}

/// Probe labels become `TargetsReachable`/`BackendsReachable` reasons verbatim.
#[test]
fn probe_states_are_reason_constants() {
    let constants = constants_in_code();
    for state in [
        ProbeState::Reachable,
        ProbeState::NoRoute,
        ProbeState::Refused,
        ProbeState::Timeout,
        ProbeState::Error,
    ] {
        assert!(
            constants.contains(state.label()),
            "ProbeState label {:?} is not in conditions::reasons",
            state.label()
        );
    }
}

/// The Headscale client's reasons are passed into conditions verbatim; the mirror in
/// `conditions::reasons::headscale::ALL` must cover every one of them.
#[test]
fn headscale_client_reasons_are_mirrored() {
    use tailnet_headscale::{Error, TransportKind};
    let builder_error = || {
        reqwest::Client::new()
            .get("not a url")
            .build()
            .expect_err("a relative URL cannot be built")
    };
    let decode_error = || serde_json::from_str::<u8>("x").expect_err("not a number");
    let kinds = [
        TransportKind::Dns,
        TransportKind::Connect,
        TransportKind::CertificateUntrusted,
        TransportKind::Tls,
        TransportKind::Timeout,
        TransportKind::Other,
    ];
    let mut errors: Vec<Error> = kinds
        .iter()
        .map(|kind| Error::Transport {
            endpoint: "test",
            kind: *kind,
            message: String::new(),
            source: builder_error(),
        })
        .collect();
    errors.extend([
        Error::Unauthorized { endpoint: "test" },
        Error::Api {
            endpoint: "test",
            status: 500,
            code: None,
            message: String::new(),
        },
        Error::Decode {
            endpoint: "test",
            source: decode_error(),
        },
        Error::TooLarge {
            endpoint: "test",
            limit: 1,
        },
        Error::InvalidUrl {
            url: String::new(),
            message: String::new(),
        },
        Error::Client(builder_error()),
        Error::InvalidServerCa {
            message: String::new(),
        },
    ]);
    // A new variant must be added above: this match fails to compile until it is.
    for error in &errors {
        match error {
            Error::Transport { .. }
            | Error::Unauthorized { .. }
            | Error::Api { .. }
            | Error::Decode { .. }
            | Error::TooLarge { .. }
            | Error::InvalidUrl { .. }
            | Error::Client(_)
            | Error::InvalidServerCa { .. } => {}
        }
        assert!(
            reasons::headscale::ALL.contains(&error.reason()),
            "Headscale client reason {:?} is not mirrored in conditions::reasons::headscale",
            error.reason()
        );
    }
    let missing = undocumented(reasons::headscale::ALL.iter().copied());
    assert!(missing.is_empty(), "undocumented: {missing:?}");
}

/// Modules compiled only for unit tests (decision tables and their fixtures), which may spell
/// reasons and field values out.
fn test_only(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    matches!(name, "tests.rs" | "test_fixtures.rs" | "reason_coverage.rs")
}

/// A reason written as a string literal in a controller would bypass the constants. Every
/// CamelCase literal there must be documented (condition reasons, Event reasons, reconcile
/// error reasons) or be one of the few non-reason words below.
#[test]
fn controllers_use_only_documented_reasons() {
    const NOT_REASONS: &[&str] = &[
        // Kinds.
        "Tailnet",
        "TailnetEgress",
        "TailnetIngress",
        "Certificate",
        "Deployment",
        "ReplicaSet",
        // Event actions.
        "Reconcile",
        "CheckPolicy",
        "SetPolicy",
        "ApproveRoutes",
        // Internal error label for a Certificate that does not serialize (a bug, not a state).
        "Serialize",
        // Placeholder before Headscale was asked (always replaced in the same reconcile).
        "Unknown",
        // Condition status values.
        "True",
        "False",
    ];
    let literal = Regex::new(r#""([A-Z][a-z]+[A-Za-z]*)""#).expect("regex");
    let mut found = BTreeSet::new();
    let dir = repo().join("crates/operator/src/controllers");
    let mut files = Vec::new();
    let mut pending = vec![dir];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("controllers dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") && !test_only(&path) {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 5, "found only {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read controller");
        // Unit tests may spell reasons out.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for c in literal.captures_iter(code) {
            if !NOT_REASONS.contains(&&c[1]) {
                found.insert(c[1].to_string());
            }
        }
    }
    let missing = undocumented(found.iter().map(String::as_str));
    assert!(
        missing.is_empty(),
        "CamelCase literals in crates/operator/src/controllers without an anchor in \
         docs/troubleshooting.md: {missing:?} (use a constant from conditions::reasons and \
         document it)"
    );
}

/// The chart's alerts link their runbooks into docs/troubleshooting.md: every fixed anchor
/// must exist, and a templated one (`{{ $labels.condition | toLower }}`) resolves to a
/// condition type, which all have anchors (checked above).
#[test]
fn alert_runbook_anchors_exist() {
    let path = "charts/tailnet-operator/files/prometheus-rules.yaml";
    let Ok(rules) = std::fs::read_to_string(repo().join(path)) else {
        panic!("{path} is missing: the chart's alerts are what this test checks");
    };
    let link = Regex::new(r"troubleshooting\.md#([a-z0-9-]+)").expect("regex");
    let anchors: Vec<&str> = link
        .captures_iter(&rules)
        .map(|c| c.get(1).map_or("", |m| m.as_str()))
        .collect();
    assert!(!anchors.is_empty(), "no runbook links found in {path}");
    let missing = undocumented(anchors);
    assert!(
        missing.is_empty(),
        "{path} links to anchors that docs/troubleshooting.md lacks: {missing:?}"
    );
}
