//! Behaviour tests of the public API; the realistic example is a reviewed snapshot in
//! `tests/snapshots/example.hujson` (regenerate with `UPDATE_SNAPSHOTS=1`, then review; refused
//! when `CI` is set).

use std::net::IpAddr;

use ipnet::IpNet;
use pretty_assertions::assert_eq;
use tailnet_policy::*;

const BASE: &str = include_str!("fixtures/base.hujson");
const ID: &str = "tailnet-operator/cluster-1/demo";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test ip")
}
fn net(s: &str) -> IpNet {
    s.parse().expect("test net")
}
fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn target(name: &str, address: &str, port: u16) -> EgressTarget {
    EgressTarget {
        name: name.into(),
        address: TargetAddress::parse(address),
        port,
    }
}

fn router() -> ObservedNode {
    ObservedNode {
        id: 1,
        name: "router".into(),
        tags: strs(&["tag:router"]),
        ip_addresses: vec![ip("100.64.0.1"), ip("fd7a:115c:a1e0::1")],
        available_routes: vec![net("192.0.2.0/24"), net("198.51.100.0/24")],
        approved_routes: vec![],
        online: true,
    }
}

/// The demo from SPEC §3: egress tailnet-system/team-a, ingress team-a/portal.
fn demo_inputs() -> PolicyInputs {
    PolicyInputs {
        installation_id: ID.into(),
        tag_owners: strs(&["group:platform"]),
        route_approvers: strs(&["tag:router"]),
        ingress_source_allowlist: strs(&["group:team-a"]),
        egresses: vec![EgressPolicy {
            owner: "tailnet-system/team-a".into(),
            tag: "tag:tno-egress-team-a".into(),
            targets: vec![
                target("remote-db", "192.0.2.10", 5432),
                target("remote-api", "198.51.100.20", 443),
            ],
        }],
        ingresses: vec![IngressPolicy {
            kind: tailnet_policy::ResourceKind::TailnetIngress,
            owner: "team-a/portal".into(),
            tag: "tag:tno-ingress-team-a-portal".into(),
            allow_from: strs(&["group:team-a"]),
            ports: vec![443],
        }],
        nodes: vec![router()],
        contributions: Vec::new(),
    }
}

fn render_demo(inputs: &PolicyInputs) -> RenderedPolicy {
    let base = parse_base(BASE).expect("base parses");
    render(&base, inputs).expect("renders")
}

fn value(doc: &str) -> serde_json::Value {
    // The rendered document must itself be valid HuJSON.
    parse_base(doc)
        .expect("rendered document parses")
        .value()
        .clone()
}

#[test]
fn snapshot_of_the_realistic_example() {
    let rendered = render_demo(&demo_inputs());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/snapshots/example.hujson"
    );
    let update = update_requested(std::env::var_os("UPDATE_SNAPSHOTS"), std::env::var_os("CI"))
        .unwrap_or_else(|refused| panic!("{refused}"));
    if update {
        std::fs::write(path, &rendered.document).expect("write snapshot");
    }
    let expected = std::fs::read_to_string(path).expect("snapshot exists");
    assert_eq!(rendered.document, expected);
}

/// Whether the snapshot may be rewritten: only when `UPDATE_SNAPSHOTS` is set and `CI` is not. Under CI
/// a snapshot that rewrites itself would let any output pass, so the variable is refused there.
fn update_requested(
    update: Option<std::ffi::OsString>,
    ci: Option<std::ffi::OsString>,
) -> Result<bool, String> {
    match (update, ci) {
        (Some(_), Some(ci)) => Err(format!(
            "UPDATE_SNAPSHOTS is set while CI is set (CI={}): the snapshot is never rewritten in CI; unset UPDATE_SNAPSHOTS",
            ci.to_string_lossy()
        )),
        (update, None) => Ok(update.is_some()),
        (None, Some(_)) => Ok(false),
    }
}

#[test]
fn snapshot_updates_are_refused_under_ci() {
    let set = || Some(std::ffi::OsString::from("1"));
    assert_eq!(update_requested(None, None), Ok(false));
    assert_eq!(update_requested(set(), None), Ok(true));
    assert_eq!(update_requested(None, Some("true".into())), Ok(false));
    let refused = update_requested(set(), Some("true".into())).expect_err("refused under CI");
    assert!(
        refused.contains("UPDATE_SNAPSHOTS") && refused.contains("CI"),
        "{refused}"
    );
}

#[test]
fn example_generates_the_expected_parts() {
    let r = render_demo(&demo_inputs());
    let v = value(&r.document);
    assert_eq!(
        v["tagOwners"],
        serde_json::json!({
            "tag:router": ["group:platform"],
            "tag:tno-egress-team-a": ["group:platform"],
            "tag:tno-ingress-team-a-portal": ["group:platform"],
        })
    );
    assert_eq!(
        v["autoApprovers"],
        serde_json::json!({"routes": {
            "192.0.2.0/24": ["tag:router"],
            "198.51.100.0/24": ["tag:router"],
        }})
    );
    assert_eq!(
        v["grants"],
        serde_json::json!([
            {"src": ["group:platform"], "dst": ["tag:router"], "ip": ["tcp:443"]},
            {"src": ["tag:tno-egress-team-a"], "dst": ["192.0.2.10/32"], "ip": ["tcp:5432"]},
            {"src": ["tag:tno-egress-team-a"], "dst": ["198.51.100.20/32"], "ip": ["tcp:443"]},
            {"src": ["group:team-a"], "dst": ["tag:tno-ingress-team-a-portal"], "ip": ["tcp:443"]},
        ])
    );
    // Base keys are all kept with their content.
    let base = parse_base(BASE).expect("base");
    for key in ["groups", "hosts", "acls", "tests"] {
        assert_eq!(v[key], base.value()[key], "{key}");
    }
    assert_eq!(
        r.summary,
        RenderSummary {
            egress_resources: 1,
            ingress_resources: 1,
            generated_tag_owners: 2,
            egress_grants: 2,
            ingress_grants: 1,
            auto_approver_routes: 2,
            dns_targets_skipped: 0,
            resources_with_issues: 0,
            contributed_grants: 0,
        }
    );
    assert!(r.notices.is_empty(), "{:?}", r.notices);
    assert_eq!(ownership_marker(&r.document).as_deref(), Some(ID));
}

#[test]
fn keeps_base_comments_and_marks_generated_entries() {
    let r = render_demo(&demo_inputs());
    for comment in [
        "// Human-owned base policy for the demo tailnet",
        "// application team A",
        "/* Hand-written rules.",
        "// The CI runner must never reach the remote database directly.",
        "// TailnetEgress tailnet-system/team-a: remote-db",
        "// TailnetIngress team-a/portal",
        "// tailnet-operator: begin generated grants",
        "// tailnet-operator: end generated grants",
    ] {
        assert!(r.document.contains(comment), "missing {comment:?}");
    }
    assert!(
        r.document
            .starts_with("// tailnet-operator-installation: tailnet-operator/cluster-1/demo\n")
    );
}

#[test]
fn deterministic_under_shuffled_inputs() {
    let mut a = demo_inputs();
    a.egresses.push(EgressPolicy {
        owner: "tailnet-system/b".into(),
        tag: "tag:tno-egress-b".into(),
        targets: vec![
            target("z", "2001:db8::5", 22),
            target("y", "192.0.2.77", 80),
            target("x", "192.0.2.77", 81),
            target("dns", "db.example.net", 5432),
        ],
    });
    a.ingresses.push(IngressPolicy {
        kind: tailnet_policy::ResourceKind::TailnetIngress,
        owner: "team-a/admin".into(),
        tag: "tag:tno-ingress-team-a-admin".into(),
        allow_from: strs(&["group:team-a", "group:team-a"]),
        ports: vec![8443, 443, 443],
    });
    a.tag_owners = strs(&["group:platform", "group:team-a"]);
    a.nodes.push(ObservedNode {
        id: 7,
        name: "router-2".into(),
        tags: strs(&["tag:router", "tag:other"]),
        available_routes: vec![net("2001:db8::/64"), net("192.0.2.0/25")],
        ..Default::default()
    });

    let mut b = a.clone();
    b.egresses.reverse();
    b.ingresses.reverse();
    b.nodes.reverse();
    b.tag_owners.reverse();
    for e in &mut b.egresses {
        e.targets.reverse();
    }
    for i in &mut b.ingresses {
        i.allow_from.reverse();
        i.ports.reverse();
    }
    for n in &mut b.nodes {
        n.tags.reverse();
        n.available_routes.reverse();
    }
    let ra = render_demo(&a);
    let rb = render_demo(&b);
    assert_eq!(ra.document, rb.document);
    assert_eq!(ra.resources, rb.resources);
    assert_eq!(ra.auto_approvers, rb.auto_approvers);
    // Same address, two ports: one grant with both ports.
    let v = value(&ra.document);
    let grants = v["grants"].as_array().expect("grants");
    assert!(grants.contains(&serde_json::json!(
        {"src": ["tag:tno-egress-b"], "dst": ["192.0.2.77/32"], "ip": ["tcp:80", "tcp:81"]}
    )));
    assert!(grants.contains(&serde_json::json!(
        {"src": ["group:team-a"], "dst": ["tag:tno-ingress-team-a-admin"], "ip": ["tcp:443", "tcp:8443"]}
    )));
}

#[test]
fn ipv4_and_ipv6_targets_get_host_prefixes() {
    let mut inputs = demo_inputs();
    inputs.egresses[0].targets = vec![
        target("v4", "192.0.2.10", 5432),
        target("v6", "2001:db8::10", 443),
    ];
    inputs.nodes[0].available_routes.push(net("2001:db8::/48"));
    let r = render_demo(&inputs);
    let egress = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    let dsts: Vec<&str> = egress.grants.iter().map(|g| g.dst[0].as_str()).collect();
    assert_eq!(dsts, ["192.0.2.10/32", "2001:db8::10/128"]);
    let routes: Vec<String> = r
        .auto_approvers
        .iter()
        .map(|a| a.route.to_string())
        .collect();
    assert_eq!(routes, ["192.0.2.0/24", "2001:db8::/48"]);
}

#[test]
fn dns_target_gets_no_grant_and_is_reported() {
    let mut inputs = demo_inputs();
    inputs.egresses[0].targets = vec![
        target("remote-db", "192.0.2.10", 5432),
        target("remote-api", "api.site.example.net", 443),
    ];
    let r = render_demo(&inputs);
    let egress = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    assert_eq!(egress.dns_targets_skipped(), ["remote-api"]);
    assert_eq!(egress.grants.len(), 1);
    assert!(egress.issues.is_empty());
    let api = egress
        .targets
        .iter()
        .find(|t| t.name == "remote-api")
        .expect("target");
    assert!(!api.granted);
    assert!(api.routes.is_empty());
    assert_eq!(r.summary.dns_targets_skipped, 1);
    assert!(!r.document.contains("api.site.example.net"));
    // Only the route covering the IP target is auto-approved.
    let routes: Vec<String> = r
        .auto_approvers
        .iter()
        .map(|a| a.route.to_string())
        .collect();
    assert_eq!(routes, ["192.0.2.0/24"]);
}

#[test]
fn route_coverage_rules() {
    let mut inputs = demo_inputs();
    inputs.egresses[0].targets = vec![target("remote-db", "192.0.2.10", 5432)];
    inputs.nodes = vec![
        // Approver: covering route counts, non-covering one and the exit route do not.
        ObservedNode {
            id: 1,
            name: "router".into(),
            tags: strs(&["tag:router"]),
            available_routes: vec![net("192.0.2.0/24"), net("203.0.113.0/24"), net("0.0.0.0/0")],
            approved_routes: vec![net("192.0.2.0/24")],
            online: true,
            ..Default::default()
        },
        // Not an approver: its covering route is ignored.
        ObservedNode {
            id: 2,
            name: "laptop".into(),
            tags: strs(&["tag:laptop"]),
            available_routes: vec![net("192.0.2.0/28")],
            ..Default::default()
        },
    ];
    let r = render_demo(&inputs);
    let egress = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    assert_eq!(
        egress.targets[0].routes,
        [CoveringRoute {
            route: net("192.0.2.0/24"),
            node_id: 1,
            node_name: "router".into(),
            approved: true,
            online: true,
        }]
    );
    assert_eq!(r.auto_approvers.len(), 1);
    assert_eq!(r.auto_approvers[0].route, net("192.0.2.0/24"));
    assert_eq!(
        r.auto_approvers[0].needed_by,
        ["TailnetEgress tailnet-system/team-a"]
    );
    assert!(!r.document.contains("203.0.113.0/24"));
    assert!(!r.document.contains("0.0.0.0/0"));
    assert!(!r.document.contains("192.0.2.0/28"));
}

#[test]
fn no_route_approvers_means_no_auto_approvers() {
    let mut inputs = demo_inputs();
    inputs.route_approvers.clear();
    let r = render_demo(&inputs);
    assert!(r.auto_approvers.is_empty());
    assert!(value(&r.document).get("autoApprovers").is_none());
    assert!(routes_needing_approval(&inputs).is_empty());
}

#[test]
fn allow_from_must_be_a_subset_of_the_allowlist() {
    let mut inputs = demo_inputs();
    inputs.ingress_source_allowlist = strs(&["group:team-a", "group:team-b"]);
    inputs.ingresses[0].allow_from = strs(&["group:team-b", "group:team-a"]);
    let r = render_demo(&inputs);
    let ing = r
        .resource(ResourceKind::TailnetIngress, "team-a/portal")
        .expect("outcome");
    assert!(ing.issues.is_empty());
    assert_eq!(ing.grants[0].src, ["group:team-a", "group:team-b"]);

    inputs.ingresses[0].allow_from = strs(&["group:team-a", "autogroup:member", "tag:x"]);
    let r = render_demo(&inputs);
    let ing = r
        .resource(ResourceKind::TailnetIngress, "team-a/portal")
        .expect("outcome");
    // The allowed source keeps its grant (a bad edit must not cut off what works); the
    // offending entries get none and are named.
    assert_eq!(ing.grants.len(), 1);
    assert_eq!(ing.grants[0].src, ["group:team-a"]);
    assert_eq!(
        ing.issues,
        [PolicyIssue::SourceNotAllowed {
            offending: strs(&["autogroup:member", "tag:x"]),
            allowlist: strs(&["group:team-a", "group:team-b"]),
        }]
    );
    assert!(!ing.issues[0].blocks_grants());
    assert_eq!(ing.issues[0].reason(), "SourceNotAllowed");
    assert!(ing.issues[0].to_string().contains("autogroup:member"));
    assert_eq!(ing.tag_owner, TagOwnerSource::Generated);
    let v = value(&r.document);
    let grants = v["grants"].to_string();
    assert!(!grants.contains("autogroup:member") && !grants.contains("\"tag:x\""));
    assert_eq!(r.summary.resources_with_issues, 1);

    // Nothing allowed at all: no grant names the tag (the tag is still owned, so the agent
    // can join).
    inputs.ingresses[0].allow_from = strs(&["autogroup:member", "tag:x"]);
    let r = render_demo(&inputs);
    let ing = r
        .resource(ResourceKind::TailnetIngress, "team-a/portal")
        .expect("outcome");
    assert!(ing.grants.is_empty());
    assert_eq!(ing.tag_owner, TagOwnerSource::Generated);
    let v = value(&r.document);
    assert!(
        !v["grants"]
            .to_string()
            .contains("tag:tno-ingress-team-a-portal")
    );
    assert_eq!(r.summary.resources_with_issues, 1);
}

#[test]
fn empty_allow_from_and_ports_are_issues() {
    let mut inputs = demo_inputs();
    inputs.ingresses[0].allow_from.clear();
    inputs.ingresses[0].ports = vec![0];
    let r = render_demo(&inputs);
    let ing = r
        .resource(ResourceKind::TailnetIngress, "team-a/portal")
        .expect("outcome");
    assert_eq!(ing.issues, [PolicyIssue::NoSources, PolicyIssue::NoPorts]);
    assert!(ing.grants.is_empty());
}

#[test]
fn tag_owned_differently_in_base_blocks_grants() {
    let base = parse_base(
        r#"{
  "groups": {"group:platform": ["alice@"], "group:team-a": ["bob@"]},
  "tagOwners": {
    "tag:router": ["group:platform"],
    "tag:tno-egress-team-a": ["bob@"],
  },
}"#,
    )
    .expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let eg = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    assert_eq!(
        eg.issues,
        [PolicyIssue::TagOwnedDifferently {
            tag: "tag:tno-egress-team-a".into(),
            base_owners: strs(&["bob@"]),
            wanted_owners: strs(&["group:platform"]),
        }]
    );
    assert_eq!(eg.tag_owner, TagOwnerSource::None);
    assert!(eg.grants.is_empty());
    assert!(eg.targets.iter().all(|t| !t.granted));
    let v = value(&r.document);
    assert_eq!(
        v["tagOwners"]["tag:tno-egress-team-a"],
        serde_json::json!(["bob@"])
    );
    assert!(!v["grants"].to_string().contains("tag:tno-egress-team-a"));
    // Blocked egress → its routes are not auto-approved either.
    assert!(r.auto_approvers.is_empty());
}

#[test]
fn tag_owned_identically_in_base_is_reused() {
    let base = parse_base(
        r#"{"groups": {"group:platform": ["alice@"], "group:team-a": ["bob@"]},
            "tagOwners": {"tag:router": ["group:platform"], "tag:tno-egress-team-a": ["group:platform"]}}"#,
    )
    .expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let eg = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    assert_eq!(eg.tag_owner, TagOwnerSource::Base);
    assert!(eg.issues.is_empty());
    assert_eq!(eg.grants.len(), 2);
    assert_eq!(r.document.matches("\"tag:tno-egress-team-a\":").count(), 1);
    // The single-line base gets properly formatted insertions.
    let v = value(&r.document);
    assert_eq!(v["tagOwners"].as_object().map(|o| o.len()), Some(3));
}

#[test]
fn duplicate_tags_block_all_sharing_resources() {
    let mut inputs = demo_inputs();
    inputs.egresses.push(EgressPolicy {
        owner: "tailnet-system/team-a-copy".into(),
        tag: "tag:tno-egress-team-a".into(),
        targets: vec![target("other", "192.0.2.11", 22)],
    });
    let r = render_demo(&inputs);
    for owner in ["tailnet-system/team-a", "tailnet-system/team-a-copy"] {
        let eg = r
            .resource(ResourceKind::TailnetEgress, owner)
            .expect("outcome");
        assert!(eg.grants.is_empty(), "{owner}");
        assert!(
            matches!(eg.issues[0], PolicyIssue::DuplicateTag { .. }),
            "{owner}"
        );
    }
    let v = value(&r.document);
    assert_eq!(
        v["tagOwners"]["tag:tno-egress-team-a"],
        serde_json::json!(["group:platform"])
    );
    assert_eq!(r.document.matches("\"tag:tno-egress-team-a\":").count(), 1);
    assert!(routes_needing_approval(&inputs).is_empty());
}

#[test]
fn invalid_tag_generates_nothing() {
    let mut inputs = demo_inputs();
    inputs.ingresses[0].tag = "tag:1bad".into();
    let r = render_demo(&inputs);
    let ing = r
        .resource(ResourceKind::TailnetIngress, "team-a/portal")
        .expect("outcome");
    assert_eq!(
        ing.issues,
        [PolicyIssue::InvalidTag {
            tag: "tag:1bad".into()
        }]
    );
    assert!(!r.document.contains("tag:1bad"));
}

#[test]
fn port_zero_target_is_skipped() {
    let mut inputs = demo_inputs();
    inputs.egresses[0]
        .targets
        .push(target("broken", "192.0.2.99", 0));
    let r = render_demo(&inputs);
    let eg = r
        .resource(ResourceKind::TailnetEgress, "tailnet-system/team-a")
        .expect("outcome");
    assert_eq!(
        eg.issues,
        [PolicyIssue::InvalidPort {
            target: "broken".into()
        }]
    );
    assert_eq!(eg.grants.len(), 2);
    assert!(!r.document.contains("192.0.2.99"));
}

#[test]
fn base_auto_approver_for_same_prefix_is_merged_as_union() {
    let base = parse_base(
        r#"{
  "groups": {"group:platform": ["alice@"], "group:team-a": ["bob@"], "group:net": ["carol@"]},
  "tagOwners": {"tag:router": ["group:platform"]},
  "autoApprovers": {
    "routes": {
      "192.0.2.0/24": ["group:net"],
      "198.51.100.0/24": [
        "tag:router", // already fine
      ],
    },
  },
}"#,
    )
    .expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let v = value(&r.document);
    assert_eq!(
        v["autoApprovers"]["routes"],
        serde_json::json!({
            "192.0.2.0/24": ["group:net", "tag:router"],
            "198.51.100.0/24": ["tag:router"],
        })
    );
    assert_eq!(
        r.notices,
        [
            PolicyNotice::AutoApproverMerged {
                route: net("192.0.2.0/24"),
                base_approvers: strs(&["group:net"]),
                added: strs(&["tag:router"]),
            },
            PolicyNotice::BaseHadNoRules,
        ]
    );
    assert!(r.auto_approvers.iter().all(|a| a.merged_into_base));
    assert!(
        r.document
            .contains("/* added by tailnet-operator for TailnetEgress tailnet-system/team-a")
    );
}

#[test]
fn missing_containers_are_created() {
    let base = parse_base("{}").expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let v = value(&r.document);
    assert_eq!(v["tagOwners"].as_object().map(|o| o.len()), Some(2));
    assert_eq!(
        v["autoApprovers"]["routes"].as_object().map(|o| o.len()),
        Some(2)
    );
    assert_eq!(v["grants"].as_array().map(|a| a.len()), Some(3));
    // An empty base has no rules: generated grants change allow-all into deny-by-default.
    assert!(r.notices.contains(&PolicyNotice::BaseHadNoRules));
    assert!(r.notices.contains(&PolicyNotice::UndefinedGroup {
        group: "group:platform".into(),
        used_in: "policy.tagOwners".into(),
    }));
    assert!(r.notices.contains(&PolicyNotice::UndefinedTag {
        tag: "tag:router".into(),
        used_in: "policy.routeApprovers".into(),
    }));

    // autoApprovers present without routes.
    let base = parse_base(
        "{\n\t\"autoApprovers\": {\n\t\t\"exitNode\": [\"tag:router\"]\n\t},\n\t\"grants\": []\n}",
    )
    .expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let v = value(&r.document);
    assert_eq!(
        v["autoApprovers"]["exitNode"],
        serde_json::json!(["tag:router"])
    );
    assert_eq!(
        v["autoApprovers"]["routes"].as_object().map(|o| o.len()),
        Some(2)
    );
    assert_eq!(v["grants"].as_array().map(|a| a.len()), Some(3));
    // Tab indentation is detected and reused.
    assert!(
        r.document.contains("\n\t\t\"routes\": {\n"),
        "{}",
        r.document
    );
}

#[test]
fn base_without_trailing_commas_stays_valid() {
    let base = parse_base(
        r#"{
  "tagOwners": {
    "tag:router": ["group:platform"] // no trailing comma
  },
  "grants": [
    {"src": ["*"], "dst": ["*"], "ip": ["*"]}
  ]
}"#,
    )
    .expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    let v = value(&r.document);
    assert_eq!(v["grants"].as_array().map(|a| a.len()), Some(4));
    assert!(
        r.document
            .contains("[\"group:platform\"], // no trailing comma")
    );
}

#[test]
fn hujson_with_comments_and_trailing_commas_parses() {
    let base = parse_base("/* a */ {\n // b\n \"groups\": {\"group:x\": [\"a@\",],}, // c\n}\n")
        .expect("base");
    assert_eq!(base.value()["groups"]["group:x"], serde_json::json!(["a@"]));
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let err =
        parse_base("{\n  \"groups\": {\n    \"group:x\": [\"a@\"] \"oops\"\n  }\n}").unwrap_err();
    // The parser points where the missing comma belongs: right after `["a@"]`.
    assert_eq!((err.line, err.column), (3, 22), "{err}");
    assert!(
        err.to_string()
            .starts_with("line 3, column 22: Expected comma"),
        "{err}"
    );

    // JSON5 extensions HuJSON does not have are rejected too.
    let err = parse_base("{\n  groups: {}\n}").unwrap_err();
    assert_eq!(err.line, 2, "{err}");
    let err = parse_base("{\"a\": 'x'}").unwrap_err();
    assert_eq!(err.line, 1, "{err}");
    let err = parse_base("{\"a\": 0x10}").unwrap_err();
    assert_eq!(err.line, 1, "{err}");

    // Duplicate keys are rejected (Headscale rejects them).
    let err = parse_base("{\n\"a\": 1,\n\"a\": 2}").unwrap_err();
    assert_eq!((err.line, err.column), (3, 1), "{err}");
}

#[test]
fn base_must_be_an_object() {
    let err = parse_base("\n  [1, 2]").unwrap_err();
    assert_eq!((err.line, err.column), (2, 3));
    assert!(
        err.message.contains("must be an object, found array"),
        "{err}"
    );
    let err = parse_base("  // only a comment\n").unwrap_err();
    assert!(err.message.contains("empty"), "{err}");
}

#[test]
fn wrong_types_of_generated_keys_are_render_errors() {
    let cases = [
        (r#"{"tagOwners": []}"#, "tagOwners", "object", "array"),
        (
            r#"{"autoApprovers": "x"}"#,
            "autoApprovers",
            "object",
            "string",
        ),
        (
            r#"{"autoApprovers": {"routes": []}}"#,
            "autoApprovers.routes",
            "object",
            "array",
        ),
        (r#"{"grants": {}}"#, "grants", "array", "object"),
        (
            r#"{"tagOwners": {"tag:tno-egress-team-a": "group:platform"}}"#,
            "tagOwners[\"tag:tno-egress-team-a\"]",
            "array of strings",
            "string",
        ),
    ];
    for (text, key, expected, found) in cases {
        let base = parse_base(text).expect("base");
        let err = render(&base, &demo_inputs()).unwrap_err();
        assert_eq!(
            err,
            RenderError::WrongType {
                key: key.into(),
                expected,
                found
            },
            "{text}"
        );
        assert!(err.to_string().contains(key));
    }
    let base = parse_base(r#"{"grants": [], "Grants": []}"#).expect("base");
    assert!(matches!(
        render(&base, &demo_inputs()),
        Err(RenderError::AmbiguousKey { .. })
    ));
}

#[test]
fn rendered_document_is_not_accepted_as_base() {
    let r = render_demo(&demo_inputs());
    let base = parse_base(&r.document).expect("parses");
    assert_eq!(
        render(&base, &demo_inputs()),
        Err(RenderError::BaseContainsRenderedOutput)
    );
}

#[test]
fn installation_id_is_validated() {
    let mut inputs = demo_inputs();
    inputs.installation_id = "a\nb".into();
    let base = parse_base(BASE).expect("base");
    assert!(matches!(
        render(&base, &inputs),
        Err(RenderError::InvalidInstallationId(_))
    ));
}

#[test]
fn ownership_marker_round_trip_and_tolerance() {
    let r = render_demo(&demo_inputs());
    assert_eq!(ownership_marker(&r.document).as_deref(), Some(ID));
    // CRLF line endings, BOM, leading whitespace.
    let crlf = format!("\u{feff}  {}", r.document.replace('\n', "\r\n"));
    assert_eq!(ownership_marker(&crlf).as_deref(), Some(ID));
    // Not at the top, in a block comment.
    assert_eq!(
        ownership_marker("{\n /* tailnet-operator-installation: other/x */ \"groups\": {}}")
            .as_deref(),
        Some("other/x")
    );
    // Absent, or a document that does not even parse.
    assert_eq!(ownership_marker(BASE), None);
    assert_eq!(ownership_marker(""), None);
    assert_eq!(
        ownership_marker("// tailnet-operator-installation: broken/one\n{ not json").as_deref(),
        Some("broken/one")
    );
    // A string value containing the text is not a marker.
    assert_eq!(
        ownership_marker(r#"{"x": "tailnet-operator-installation: y"}"#),
        None
    );
}

#[test]
fn semantic_equality_ignores_comments_format_and_key_order() {
    let r = render_demo(&demo_inputs());
    let plain = serde_json::to_string(&value(&r.document)).expect("json");
    assert_eq!(semantically_equal(&r.document, &plain), Ok(true));
    assert_eq!(
        semantically_equal(
            r#"{"a": 1, "b": [1, 2]}"#,
            "{\n\"b\": [1, 2,], // c\n\"a\": 1,\n}"
        ),
        Ok(true)
    );
    assert_eq!(
        semantically_equal(r#"{"b": [1, 2]}"#, r#"{"b": [2, 1]}"#),
        Ok(false)
    );
    assert_eq!(
        semantically_equal(r#"{"a": 1}"#, r#"{"a": "1"}"#),
        Ok(false)
    );
    assert!(matches!(
        semantically_equal("{", "{}"),
        Err(CompareError::First(BaseError { line: 1, .. }))
    ));
    assert!(matches!(
        semantically_equal("{}", "[,"),
        Err(CompareError::Second(_))
    ));

    // up_to_date also wants the same marker.
    assert_eq!(up_to_date(&r.document, &r.document), Ok(true));
    assert_eq!(up_to_date(&plain, &r.document), Ok(false));
    assert_eq!(up_to_date("{ broken", &r.document), Ok(false));
}

#[test]
fn diff_is_unified_and_empty_when_equal() {
    let r = render_demo(&demo_inputs());
    assert_eq!(diff(&r.document, &r.document), "");
    let d = diff(BASE, &r.document);
    assert!(d.starts_with("--- live\n+++ rendered\n@@"), "{d}");
    assert!(d.contains("\n+// tailnet-operator-installation: tailnet-operator/cluster-1/demo\n"));
    assert!(
        d.contains("\n+    \"tag:tno-egress-team-a\": [\"group:platform\"],\n"),
        "{d}"
    );
}

#[test]
fn routes_needing_approval_keeps_existing_approvals() {
    let mut inputs = demo_inputs();
    inputs.nodes = vec![
        ObservedNode {
            id: 3,
            name: "router".into(),
            tags: strs(&["tag:router"]),
            available_routes: vec![
                net("192.0.2.0/24"),
                net("198.51.100.0/24"),
                net("203.0.113.0/24"),
            ],
            // Already approved: one covering route and an unrelated manual approval.
            approved_routes: vec![net("198.51.100.0/24"), net("10.9.0.0/16")],
            ..Default::default()
        },
        ObservedNode {
            id: 4,
            name: "not-a-router".into(),
            tags: strs(&["tag:other"]),
            available_routes: vec![net("192.0.2.0/24")],
            ..Default::default()
        },
        ObservedNode {
            id: 5,
            name: "router-2".into(),
            tags: strs(&["tag:router"]),
            available_routes: vec![net("198.51.100.0/24")],
            approved_routes: vec![net("198.51.100.0/24")],
            ..Default::default()
        },
    ];
    assert_eq!(
        routes_needing_approval(&inputs),
        [RouteApproval {
            node_id: 3,
            node_name: "router".into(),
            added: vec![net("192.0.2.0/24")],
            approved_routes: vec![
                net("10.9.0.0/16"),
                net("192.0.2.0/24"),
                net("198.51.100.0/24")
            ],
        }]
    );
    // Everything approved → nothing to do.
    inputs.nodes[0].approved_routes.push(net("192.0.2.0/24"));
    assert!(routes_needing_approval(&inputs).is_empty());
}

#[test]
fn observed_state_deserialises_from_camel_case_json() {
    let node: ObservedNode = serde_json::from_str(
        r#"{"id": 1, "name": "router", "tags": ["tag:router"], "ipAddresses": ["100.64.0.1"],
            "availableRoutes": ["192.0.2.0/24"], "approvedRoutes": [], "online": true}"#,
    )
    .expect("node");
    assert_eq!(node.available_routes, [net("192.0.2.0/24")]);
    assert_eq!(
        TargetAddress::parse("2001:db8::1"),
        TargetAddress::Ip(ip("2001:db8::1"))
    );
    assert_eq!(
        TargetAddress::parse("db.example.net"),
        TargetAddress::Dns("db.example.net".into())
    );
}

#[test]
fn crlf_base_stays_crlf() {
    let base = parse_base(&BASE.replace('\n', "\r\n")).expect("base");
    let r = render(&base, &demo_inputs()).expect("render");
    assert_eq!(
        r.document.matches('\n').count(),
        r.document.matches("\r\n").count()
    );
    let lf = render_demo(&demo_inputs());
    assert_eq!(r.document.replace("\r\n", "\n"), lf.document);
}

#[test]
fn contributions_are_rendered_after_ours_with_the_owners_tag_owners() {
    let mut inputs = demo_inputs();
    let contribution = |name: &str| Contribution {
        contributor: name.into(),
        tags: strs(&["tag:cos-egress-site", "tag:cos-ingress-apps-portal"]),
        grants: vec![
            ContributedGrant {
                owner: "TailnetIngress/apps/portal".into(),
                src: strs(&["group:team-a"]),
                dst: strs(&["tag:cos-ingress-apps-portal"]),
                ip: strs(&["tcp:443"]),
            },
            ContributedGrant {
                owner: "TailnetEgress/cos/site".into(),
                src: strs(&["tag:cos-egress-site"]),
                dst: strs(&["192.0.2.10/32"]),
                ip: strs(&["tcp:5432"]),
            },
        ],
        routes: vec![net("192.0.2.0/24")],
    };
    inputs.contributions = vec![contribution("cosmos")];
    let r = render_demo(&inputs);
    let v = value(&r.document);
    assert_eq!(
        v["tagOwners"]["tag:cos-egress-site"],
        serde_json::json!(inputs.tag_owners),
        "the owner's tagOwners, whatever the contributor wanted"
    );
    let grants = v["grants"].as_array().expect("grants");
    assert!(
        grants
            .iter()
            .any(|g| g["dst"] == serde_json::json!(["192.0.2.10/32"])
                && g["src"] == serde_json::json!(["tag:cos-egress-site"]))
    );
    assert!(
        grants
            .iter()
            .any(|g| g["dst"] == serde_json::json!(["tag:cos-ingress-apps-portal"]))
    );
    assert!(
        r.document
            .contains("// contributor cosmos: TailnetEgress/cos/site"),
        "{}",
        r.document
    );
    // The contributed route's approval names the contributor once.
    let route_comment = r
        .document
        .lines()
        .zip(r.document.lines().skip(1))
        .find(|(_, next)| next.trim_start().starts_with("\"192.0.2.0/24\""))
        .map(|(comment, _)| comment.trim().to_string())
        .unwrap_or_default();
    assert!(
        route_comment.contains("contributor cosmos")
            && route_comment.matches("contributor cosmos").count() == 1,
        "{route_comment:?}\n{}",
        r.document
    );
    assert_eq!(r.summary.contributed_grants, 2);
    assert!(
        r.summary.to_string().ends_with(", 2 contributed grants"),
        "{}",
        r.summary
    );
    // The route the contributor needs joins ours (same approvers).
    assert!(v["autoApprovers"]["routes"]["192.0.2.0/24"].is_array());
    // Deterministic whatever the order of the contributions' entries.
    let mut shuffled = inputs.clone();
    shuffled.contributions[0].grants.reverse();
    shuffled.contributions[0].tags.reverse();
    assert_eq!(render_demo(&shuffled).document, r.document);
    // A contributed tag the owner already has is not defined twice.
    let mut clash = inputs.clone();
    clash.contributions[0]
        .tags
        .push("tag:tno-egress-demo".into());
    let doc = render_demo(&clash).document;
    assert_eq!(
        doc.matches("\"tag:tno-egress-team-a\":").count(),
        1,
        "{doc}"
    );
}

#[test]
fn contributed_routes_are_approved_on_approver_nodes_that_advertise_them() {
    let mut inputs = demo_inputs();
    inputs.egresses.clear();
    inputs.nodes = vec![
        ObservedNode {
            id: 3,
            name: "router".into(),
            tags: strs(&["tag:router"]),
            available_routes: vec![net("203.0.113.0/24")],
            ..Default::default()
        },
        ObservedNode {
            id: 4,
            name: "not-a-router".into(),
            tags: strs(&["tag:other"]),
            available_routes: vec![net("203.0.113.0/24")],
            ..Default::default()
        },
    ];
    assert!(routes_needing_approval(&inputs).is_empty());
    inputs.contributions = vec![Contribution {
        contributor: "cosmos".into(),
        routes: vec![net("203.0.113.0/24")],
        ..Default::default()
    }];
    let approvals = routes_needing_approval(&inputs);
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0].node_id, 3);
    assert_eq!(approvals[0].added, vec![net("203.0.113.0/24")]);
}

#[test]
fn states_rules_tells_allow_all_documents_apart() {
    use tailnet_policy::states_rules;
    // Headscale's allow-all: no document, or one with neither `acls` nor `grants`.
    assert_eq!(states_rules(""), Some(false));
    assert_eq!(states_rules("  \n// only a comment\n"), Some(false));
    assert_eq!(
        states_rules(r#"{"tagOwners": {"tag:a": ["alice@"]}, "groups": {}}"#),
        Some(false)
    );
    // Either key states rules, even an empty list (deny-by-default).
    assert_eq!(states_rules(r#"{"grants": []}"#), Some(true));
    assert_eq!(
        states_rules(
            "{\n  // ours\n  \"acls\": [{\"action\": \"accept\", \"src\": [\"*\"], \"dst\": [\"*:*\"]}],\n}"
        ),
        Some(true)
    );
    assert_eq!(states_rules("{\"grants\": [,"), None);
}

/// The lockdown guard tells a live document rendered from a rule-less base (deny-by-default
/// already: only generated grants) from one whose base had rules of its own.
#[test]
fn base_states_rules_looks_past_the_generated_blocks() {
    use tailnet_policy::{base_states_rules, states_rules};
    let from_ruleless = render(&parse_base("{}").expect("base"), &demo_inputs())
        .expect("render")
        .document;
    assert_eq!(
        states_rules(&from_ruleless),
        Some(true),
        "generated grants are rules"
    );
    assert_eq!(
        base_states_rules(&from_ruleless),
        Some(false),
        "the grants list the renderer opened holds only generated grants:\n{from_ruleless}"
    );
    let from_demo = render_demo(&demo_inputs()).document;
    assert_eq!(base_states_rules(&from_demo), Some(true), "{from_demo}");
    // A hand-written document without markers is judged on everything it has.
    assert_eq!(
        base_states_rules(r#"{"acls": [{"action": "accept"}]}"#),
        Some(true)
    );
    assert_eq!(base_states_rules(r#"{"groups": {}}"#), Some(false));
    assert_eq!(base_states_rules(""), Some(false));
    assert_eq!(base_states_rules("{\"grants\": [,"), None);
}

/// Issue 26 item 3: an exit route reaches neither `autoApprovers` nor the catch-up
/// approval, even when it comes in as an accepted contribution (the owner's check refuses it
/// first; this is the renderer's own guard), and even with an owner egress inside it.
#[test]
fn exit_routes_are_never_auto_approved_nor_approved() {
    let mut inputs = demo_inputs();
    inputs.nodes = vec![ObservedNode {
        id: 3,
        name: "router".into(),
        tags: strs(&["tag:router"]),
        available_routes: vec![net("0.0.0.0/0"), net("::/0"), net("203.0.113.0/24")],
        ..Default::default()
    }];
    inputs.contributions = vec![Contribution {
        contributor: "cosmos".into(),
        routes: vec![net("0.0.0.0/0"), net("::/0"), net("203.0.113.0/24")],
        ..Default::default()
    }];
    let approvals = routes_needing_approval(&inputs);
    assert_eq!(approvals.len(), 1, "{approvals:?}");
    assert_eq!(approvals[0].added, vec![net("203.0.113.0/24")]);
    assert!(
        approvals[0]
            .approved_routes
            .iter()
            .all(|r| r.prefix_len() != 0),
        "{approvals:?}"
    );
    let r = render_demo(&inputs);
    let v = value(&r.document);
    let routes = v["autoApprovers"]["routes"].as_object().expect("routes");
    assert!(routes.contains_key("203.0.113.0/24"), "{}", r.document);
    assert!(
        !routes.contains_key("0.0.0.0/0") && !routes.contains_key("::/0"),
        "{}",
        r.document
    );
    assert!(r.auto_approvers.iter().all(|a| a.route.prefix_len() != 0));
}
