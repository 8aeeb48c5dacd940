//! The human-owned base policy: HuJSON parsing, then rendering the generated parts into it.
//! Input: `<base text>\0<PolicyInputs JSON>` (without a NUL, the base with fixed inputs).
//! Invariants: no panic; a rendered document parses again, carries its ownership marker and
//! is up to date with itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tailnet_policy::{
    EgressPolicy, EgressTarget, IngressPolicy, PolicyInputs, TargetAddress, ownership_marker,
    parse_base, render, up_to_date,
};

fn fixed_inputs() -> PolicyInputs {
    PolicyInputs {
        installation_id: "tailnet-operator/fuzz/demo".into(),
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

fuzz_target!(|data: &[u8]| {
    let (base, inputs) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], serde_json::from_slice(&data[at + 1..]).ok()),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(base) else {
        return;
    };
    let Ok(base) = parse_base(text) else {
        return;
    };
    let inputs: PolicyInputs = inputs.unwrap_or_else(fixed_inputs);
    let Ok(rendered) = render(&base, &inputs) else {
        return;
    };
    if let Err(error) = parse_base(&rendered.document) {
        panic!(
            "rendered document does not parse: {error}\n{}",
            rendered.document
        );
    }
    assert!(
        ownership_marker(&rendered.document).is_some(),
        "rendered document without ownership marker"
    );
    assert_eq!(
        up_to_date(&rendered.document, &rendered.document),
        Ok(true),
        "a rendered document is not up to date with itself"
    );
});
