//! A contributor's fragment as the owner reads it: `parse_fragment` (size, syntax, kind,
//! prefix, entry counts), then `check_fragment` against fixed limits and nodes, then the DNS
//! render of what was accepted. Input: the fragment text.
//! Invariants: no panic; every accepted entry is within the limits (tags valid and under the
//! prefix, routes never `/0` and inside `egressDestinations`, DNS names valid, under a
//! suffix, outside the cluster domain, pointing at the contributor's nodes); every `hosts`
//! line has exactly two fields.

#![no_main]

use std::collections::BTreeSet;
use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use tailnet_api::tailnet::{Contributor, ContributorLimits, FragmentSource};
use tailnet_policy::{ObservedNode, valid_tag};
use tailnet_render::dns::{self, ClaimRank, DnsEntry, DnsInputs, check_dns_name, within_domain};
use tailnet_render::fragment::{OwnerContext, check_fragment, parse_fragment};

fn contributor() -> Contributor {
    Contributor {
        name: "cosmos".into(),
        tag_prefix: "cos".into(),
        source: FragmentSource {
            config_map: Some("cosmos-fragment".into()),
            kubeconfig: None,
        },
        limits: ContributorLimits {
            ingress_source_allowlist: vec!["group:team-b".into()],
            egress_destinations: vec!["192.0.2.0/24".into(), "db.site.internal".into()],
            dns_suffixes: vec!["cosmos.example.net".into()],
        },
        keys: None,
    }
}

fn nodes() -> Vec<ObservedNode> {
    vec![
        ObservedNode {
            id: 9,
            name: "cos".into(),
            tags: vec!["tag:cos-ingress-apps-portal".into()],
            ip_addresses: vec!["100.64.0.9".parse().expect("ip"), "fd7a:115c:a1e0::9".parse().expect("ip")],
            ..Default::default()
        },
        ObservedNode {
            id: 2,
            name: "owner".into(),
            tags: vec!["tag:hyd-ingress-x".into()],
            ip_addresses: vec!["100.64.0.2".parse().expect("ip")],
            ..Default::default()
        },
    ]
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let contributor = contributor();
    let Ok(fragment) = parse_fragment(text, &contributor) else {
        return;
    };
    let nodes = nodes();
    let taken_names = BTreeSet::from(["owner.cosmos.example.net".to_string()]);
    let taken_tags = BTreeSet::from(["tag:cos-taken".to_string()]);
    let route_approvers = vec!["tag:router".to_string()];
    let checked = check_fragment(
        &contributor,
        &fragment,
        &OwnerContext {
            tag_prefix: "hyd",
            route_approvers: &route_approvers,
            taken_tags: &taken_tags,
            taken_names: &taken_names,
            cluster_domain: "cluster.local",
            nodes: Some(&nodes),
        },
    );
    for tag in &checked.accepted.tags {
        assert!(valid_tag(tag) && tag.starts_with("tag:cos-"), "tag {tag:?}");
        assert!(!taken_tags.contains(tag), "taken tag {tag:?}");
    }
    let limit: ipnet::IpNet = "192.0.2.0/24".parse().expect("net");
    for route in &checked.accepted.routes {
        assert!(route.prefix_len() != 0 && limit.contains(route), "route {route}");
    }
    let own: Vec<IpAddr> = nodes[0].ip_addresses.clone();
    let mut entries = Vec::new();
    for record in &checked.dns_records {
        let name = record.name.as_str();
        assert_eq!(check_dns_name(name), Ok(()), "name {name:?}");
        assert!(within_domain(name, "cosmos.example.net") && name != "cosmos.example.net");
        assert!(!within_domain(name, "cluster.local") && !taken_names.contains(name));
        let address: IpAddr = record.value.parse().expect("accepted value is an address");
        assert!(own.contains(&address), "address {address}");
        entries.push(DnsEntry {
            hostname: record.name.clone(),
            address,
            owner: "contributor cosmos".into(),
            rank: ClaimRank::default(),
        });
    }
    let rendered = dns::render(&DnsInputs {
        ingress_names: entries,
        ..Default::default()
    });
    for line in rendered.hosts.lines().filter(|l| !l.starts_with('#')) {
        assert_eq!(line.split_whitespace().count(), 2, "hosts line {line:?}");
    }
});
