//! Several installations on one Headscale (`mode: Contribute`): the contributor's fragment,
//! rendered by the same pipeline as an owner's document, and the owner's check of every
//! fragment entry against the contributor's tag prefix and limits before it is merged.
//! Pure: no I/O.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use tailnet_api::fragment::{
    FRAGMENT_API_VERSION, FRAGMENT_KIND, FragmentDnsRecord, FragmentGrant, FragmentRoute,
    MAX_FRAGMENT_BYTES, MAX_FRAGMENT_ENTRIES, PolicyFragment,
};
use tailnet_api::tailnet::Contributor;
use tailnet_policy::{
    ContributedGrant, Contribution, ObservedNode, RenderedPolicy, TagOwnerSource, valid_tag,
};

use crate::dns::{check_dns_name, within_domain};

/// The fragment of a contributing installation: what its render generated (tags of its
/// agents, their grants, the routes their IP targets need) and its ingress DNS records.
/// Entries are sorted, so the same inputs give the same bytes (and hash).
pub fn fragment_of(
    installation_id: &str,
    tag_prefix: &str,
    rendered: &RenderedPolicy,
    dns_records: &[FragmentDnsRecord],
) -> PolicyFragment {
    let mut tags = BTreeSet::new();
    let mut grants = BTreeSet::new();
    for r in &rendered.resources {
        if r.tag_owner == TagOwnerSource::None {
            continue;
        }
        tags.insert(r.tag.clone());
        for g in &r.grants {
            grants.insert(FragmentGrant {
                owner: format!("{}/{}", r.kind, r.owner),
                src: g.src.clone(),
                dst: g.dst.clone(),
                ip: g.ip.clone(),
            });
        }
    }
    let routes = rendered
        .auto_approvers
        .iter()
        .map(|a| FragmentRoute {
            route: a.route.to_string(),
            approvers: a.approvers.clone(),
        })
        .collect();
    let mut dns: Vec<FragmentDnsRecord> = dns_records.to_vec();
    dns.sort();
    dns.dedup();
    PolicyFragment {
        api_version: FRAGMENT_API_VERSION.to_string(),
        kind: FRAGMENT_KIND.to_string(),
        installation_id: installation_id.to_string(),
        tag_prefix: tag_prefix.to_string(),
        tags: tags.into_iter().collect(),
        grants: grants.into_iter().collect(),
        routes,
        dns_records: dns,
    }
}

/// The fragment as published (`fragment.json`): pretty JSON with a final newline.
pub fn fragment_text(fragment: &PolicyFragment) -> String {
    let mut text = serde_json::to_string_pretty(fragment).unwrap_or_default();
    text.push('\n');
    text
}

/// A fragment that cannot be used at all: the previous accepted one stays merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FragmentError {
    #[error("fragment.json is {size} bytes, more than the {MAX_FRAGMENT_BYTES} accepted")]
    TooLarge { size: usize },
    #[error("fragment.json: line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "fragment.json is a {kind} of {api_version}, expected {FRAGMENT_KIND} of {FRAGMENT_API_VERSION}"
    )]
    WrongKind { kind: String, api_version: String },
    #[error(
        "fragment.json declares tag prefix {declared:?}, but this contributor is listed with {listed:?}"
    )]
    WrongPrefix { declared: String, listed: String },
    #[error("fragment.json has {count} {what}, more than the {MAX_FRAGMENT_ENTRIES} accepted")]
    TooManyEntries { what: &'static str, count: usize },
}

/// Parses a fragment (bounded in size and entries; errors with line and column).
pub fn parse_fragment(
    text: &str,
    contributor: &Contributor,
) -> Result<PolicyFragment, FragmentError> {
    if text.len() > MAX_FRAGMENT_BYTES {
        return Err(FragmentError::TooLarge { size: text.len() });
    }
    let fragment: PolicyFragment =
        serde_json::from_str(text).map_err(|e| FragmentError::Syntax {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
    if fragment.kind != FRAGMENT_KIND || fragment.api_version != FRAGMENT_API_VERSION {
        return Err(FragmentError::WrongKind {
            kind: fragment.kind,
            api_version: fragment.api_version,
        });
    }
    if fragment.tag_prefix != contributor.tag_prefix {
        return Err(FragmentError::WrongPrefix {
            declared: fragment.tag_prefix,
            listed: contributor.tag_prefix.clone(),
        });
    }
    for (what, count) in [
        ("tags", fragment.tags.len()),
        ("grants", fragment.grants.len()),
        ("routes", fragment.routes.len()),
        ("DNS records", fragment.dns_records.len()),
    ] {
        if count > MAX_FRAGMENT_ENTRIES {
            return Err(FragmentError::TooManyEntries { what, count });
        }
    }
    Ok(fragment)
}

/// What the owner knows when it checks a fragment.
#[derive(Clone, Debug)]
pub struct OwnerContext<'a> {
    /// The owner's own tag prefix.
    pub tag_prefix: &'a str,
    /// The owner's `policy.routeApprovers`: the only approvers a contributed route may name.
    pub route_approvers: &'a [String],
    /// Tags already defined by the owner's base policy or by other installations (a
    /// contributor cannot take them over).
    pub taken_tags: &'a BTreeSet<String>,
    /// DNS names already claimed (the owner's own records, earlier contributors').
    pub taken_names: &'a BTreeSet<String>,
    /// The cluster's DNS domain (`cluster.local` or the configured one): no contributed name
    /// may be in it, or be a parent of it.
    pub cluster_domain: &'a str,
    /// Headscale's nodes, as the owner listed them; `None` when they could not be listed
    /// (then no contributed DNS record can be checked, and none is accepted).
    pub nodes: Option<&'a [ObservedNode]>,
}

/// The owner's verdict on one fragment: what is merged, and every refused entry with why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckedFragment {
    pub accepted: Contribution,
    pub dns_records: Vec<FragmentDnsRecord>,
    pub refused: Vec<String>,
}

impl CheckedFragment {
    /// e.g. `2 tags, 3 grants, 1 route, 1 DNS record`.
    pub fn summary(&self) -> String {
        let n = |count: usize, one: &str, many: &str| {
            format!("{count} {}", if count == 1 { one } else { many })
        };
        format!(
            "{}, {}, {}, {}",
            n(self.accepted.tags.len(), "tag", "tags"),
            n(self.accepted.grants.len(), "grant", "grants"),
            n(self.accepted.routes.len(), "route", "routes"),
            n(self.dns_records.len(), "DNS record", "DNS records")
        )
    }
}

fn own_tag(tag: &str, prefix: &str) -> bool {
    tag.strip_prefix("tag:")
        .and_then(|t| t.strip_prefix(prefix))
        .is_some_and(|rest| rest.starts_with('-') && rest.len() > 1)
}

/// An egress destination (`ip`, `ip/len` or a host name) within the limits.
fn destination_allowed(dst: &str, limits: &[String]) -> bool {
    let as_net = dst
        .parse::<IpNet>()
        .ok()
        .or_else(|| dst.parse::<IpAddr>().ok().map(IpNet::from));
    limits
        .iter()
        .any(|limit| match (as_net, limit.parse::<IpNet>()) {
            (Some(net), Ok(allowed)) => allowed.contains(&net),
            (None, _) => limit == dst,
            (Some(_), Err(_)) => false,
        })
}

fn ports_valid(ip: &[String]) -> bool {
    !ip.is_empty()
        && ip.iter().all(|p| {
            p.strip_prefix("tcp:")
                .and_then(|n| n.parse::<u16>().ok())
                .is_some_and(|n| n != 0)
        })
}

/// A contributed route lies inside one of the contributor's `egressDestinations` (CIDRs or
/// addresses; a host name limit covers no route).
pub fn route_within_limits(route: &IpNet, limits: &[String]) -> bool {
    limits.iter().any(|limit| {
        limit
            .parse::<IpNet>()
            .ok()
            .or_else(|| limit.parse::<IpAddr>().ok().map(IpNet::from))
            .is_some_and(|allowed| allowed.contains(route))
    })
}

/// Addresses of the contributor's own nodes: those carrying a tag under its prefix (and
/// none of the owner's).
fn contributor_addresses(
    nodes: &[ObservedNode],
    prefix: &str,
    owner_prefix: &str,
) -> BTreeSet<IpAddr> {
    nodes
        .iter()
        .filter(|n| {
            n.tags.iter().any(|t| own_tag(t, prefix))
                && !n.tags.iter().any(|t| own_tag(t, owner_prefix))
        })
        .flat_map(|n| n.ip_addresses.iter().copied())
        .collect()
}

/// Why a contributed DNS record is refused (`None`: accepted). `name` is normalized
/// (lowercase, no trailing dot).
fn dns_record_refusal(
    name: &str,
    record: &FragmentDnsRecord,
    suffixes: &[String],
    owner: &OwnerContext<'_>,
    own_addresses: Option<&BTreeSet<IpAddr>>,
) -> Option<String> {
    if let Err(e) = check_dns_name(name) {
        return Some(format!("not a valid DNS name: it {e}"));
    }
    let under = suffixes.iter().any(|suffix| {
        let suffix = suffix.trim_matches('.').to_ascii_lowercase();
        !suffix.is_empty() && name != suffix && within_domain(name, &suffix)
    });
    if !under {
        return Some(format!("not under limits.dnsSuffixes {suffixes:?}"));
    }
    let cluster = owner.cluster_domain.trim_matches('.').to_ascii_lowercase();
    if !cluster.is_empty() && (within_domain(name, &cluster) || within_domain(&cluster, name)) {
        return Some(format!(
            "inside (or above) the cluster domain {cluster}: never contributed"
        ));
    }
    let address = match record.type_.as_str() {
        "A" => record
            .value
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .map(IpAddr::V4),
        "AAAA" => record
            .value
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(IpAddr::V6),
        _ => None,
    };
    let Some(address) = address else {
        return Some(format!(
            "type {:?} with value {:?} is not an A/AAAA record",
            record.type_, record.value
        ));
    };
    if owner.taken_names.contains(name) {
        return Some("already claimed by the owner or another installation".to_string());
    }
    match own_addresses {
        None => Some(
            "Headscale's node list could not be read: the address cannot be checked".to_string(),
        ),
        Some(own) if !own.contains(&address) => Some(format!(
            "{address} is not an address of one of the contributor's own nodes (tagged under its prefix)"
        )),
        Some(_) => None,
    }
}

/// DNS records: valid names under `limits.dnsSuffixes` (label boundary), outside the cluster
/// domain, not claimed before, pointing at the contributor's own nodes.
fn check_dns_records(
    contributor: &Contributor,
    fragment: &PolicyFragment,
    owner: &OwnerContext<'_>,
    out: &mut CheckedFragment,
) {
    let own_addresses = owner
        .nodes
        .map(|nodes| contributor_addresses(nodes, &contributor.tag_prefix, owner.tag_prefix));
    for record in &fragment.dns_records {
        let name = record
            .name
            .strip_suffix('.')
            .unwrap_or(&record.name)
            .to_ascii_lowercase();
        let refusal = dns_record_refusal(
            &name,
            record,
            &contributor.limits.dns_suffixes,
            owner,
            own_addresses.as_ref(),
        );
        match refusal {
            Some(why) => out
                .refused
                .push(format!("DNS record {}: {why}", name.escape_debug())),
            None => out.dns_records.push(FragmentDnsRecord {
                name,
                ..record.clone()
            }),
        }
    }
}

/// Checks every entry of `fragment` (from `contributor`) and keeps what passes:
/// * tags only valid ones (`valid_tag`) under the contributor's prefix, not defined by anyone else (their owners are
///   the owner's `tagOwners`, whatever the fragment would like);
/// * a grant whose destination is one of its own tags (an ingress) may have only sources in
///   `limits.ingressSourceAllowlist`; a grant whose source is one of its own tags (an egress)
///   may reach only `limits.egressDestinations`; only `tcp:<port>` entries;
/// * routes only inside `limits.egressDestinations`, never an exit route (`/0`), and only
///   when they cover an accepted egress destination, approved by the owner's
///   `routeApprovers` only;
/// * DNS records only valid DNS names under `limits.dnsSuffixes` (on a label boundary),
///   outside the cluster domain, not claimed by the owner or an earlier installation (first
///   claim wins), with an A/AAAA value that is an address of the contributor's own nodes.
pub fn check_fragment(
    contributor: &Contributor,
    fragment: &PolicyFragment,
    owner: &OwnerContext<'_>,
) -> CheckedFragment {
    let prefix = contributor.tag_prefix.as_str();
    let limits = &contributor.limits;
    let mut out = CheckedFragment {
        accepted: Contribution {
            contributor: contributor.name.clone(),
            ..Contribution::default()
        },
        ..CheckedFragment::default()
    };
    let mut tags = BTreeSet::new();
    for tag in &fragment.tags {
        if !valid_tag(tag) {
            out.refused.push(format!(
                "tag {:?}: not a valid tag (`tag:` then a letter; no whitespace, quotes, ':' or '@')",
                tag
            ));
        } else if !own_tag(tag, prefix) {
            out.refused.push(format!(
                "tag {tag}: not under the contributor's prefix tag:{prefix}-"
            ));
        } else if own_tag(tag, owner.tag_prefix) || owner.taken_tags.contains(tag) {
            out.refused.push(format!(
                "tag {tag}: already defined by the owner or another installation"
            ));
        } else {
            tags.insert(tag.clone());
        }
    }
    let mut egress_destinations = Vec::new();
    for g in &fragment.grants {
        let what = format!("grant of {}", g.owner);
        if !ports_valid(&g.ip) {
            out.refused.push(format!(
                "{what}: ip must be tcp:<port> entries, got {:?}",
                g.ip
            ));
            continue;
        }
        let src_own = !g.src.is_empty() && g.src.iter().all(|s| tags.contains(s));
        let dst_own = !g.dst.is_empty() && g.dst.iter().all(|d| tags.contains(d));
        if dst_own {
            let outside: Vec<&String> = g
                .src
                .iter()
                .filter(|s| !limits.ingress_source_allowlist.contains(s) && !tags.contains(*s))
                .collect();
            if !outside.is_empty() || g.src.is_empty() {
                out.refused.push(format!(
                    "{what}: sources {outside:?} are not in limits.ingressSourceAllowlist {:?}",
                    limits.ingress_source_allowlist
                ));
                continue;
            }
        } else if src_own {
            let outside: Vec<&String> = g
                .dst
                .iter()
                .filter(|d| !destination_allowed(d, &limits.egress_destinations))
                .collect();
            if !outside.is_empty() {
                out.refused.push(format!(
                    "{what}: destinations {outside:?} are not in limits.egressDestinations {:?}",
                    limits.egress_destinations
                ));
                continue;
            }
            egress_destinations.extend(g.dst.iter().cloned());
        } else {
            out.refused.push(format!(
                "{what}: neither its sources {:?} nor its destinations {:?} are the contributor's own (accepted) tags",
                g.src, g.dst
            ));
            continue;
        }
        out.accepted.grants.push(ContributedGrant {
            owner: g.owner.clone(),
            src: g.src.clone(),
            dst: g.dst.clone(),
            ip: g.ip.clone(),
        });
    }
    for r in &fragment.routes {
        let Ok(route) = r.route.parse::<IpNet>() else {
            out.refused.push(format!("route {:?}: not a CIDR", r.route));
            continue;
        };
        if route.prefix_len() == 0 {
            out.refused.push(format!(
                "route {route}: an exit route (/0) is never approved for a contributor"
            ));
            continue;
        }
        if !route_within_limits(&route, &limits.egress_destinations) {
            out.refused.push(format!(
                "route {route}: not inside limits.egressDestinations {:?}",
                limits.egress_destinations
            ));
            continue;
        }
        let covers = egress_destinations.iter().any(|d| {
            d.parse::<IpNet>()
                .ok()
                .or_else(|| d.parse::<IpAddr>().ok().map(IpNet::from))
                .is_some_and(|net| route.contains(&net))
        });
        if !covers {
            out.refused.push(format!(
                "route {route}: covers none of the contributor's accepted egress destinations"
            ));
            continue;
        }
        let foreign: Vec<&String> = r
            .approvers
            .iter()
            .filter(|a| !owner.route_approvers.contains(a))
            .collect();
        if !foreign.is_empty() {
            out.refused.push(format!(
                "route {route}: approvers {foreign:?} are not among the owner's routeApprovers {:?}",
                owner.route_approvers
            ));
            continue;
        }
        out.accepted.routes.push(route);
    }
    check_dns_records(contributor, fragment, owner, &mut out);
    // Tags without an accepted grant are still merged: an agent's node must be taggable
    // before its grants are (its pre-auth key carries the tag).
    out.accepted.tags = tags.into_iter().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::tailnet::{ContributorLimits, FragmentSource};

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

    fn grant(owner: &str, src: &[&str], dst: &[&str], ports: &[u16]) -> FragmentGrant {
        FragmentGrant {
            owner: owner.into(),
            src: src.iter().map(|s| s.to_string()).collect(),
            dst: dst.iter().map(|s| s.to_string()).collect(),
            ip: ports.iter().map(|p| format!("tcp:{p}")).collect(),
        }
    }

    fn node(id: u64, tags: &[&str], ips: &[&str]) -> ObservedNode {
        ObservedNode {
            id,
            name: format!("node-{id}"),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ip_addresses: ips.iter().map(|ip| ip.parse().expect("ip")).collect(),
            available_routes: vec![],
            approved_routes: vec![],
            online: true,
        }
    }

    /// The contributor's ingress node (100.64.0.9), the owner's (100.64.0.2), a node of
    /// nobody's prefix (100.64.0.5).
    fn nodes() -> Vec<ObservedNode> {
        vec![
            node(
                9,
                &["tag:cos-ingress-apps-portal"],
                &["100.64.0.9", "fd7a:115c:a1e0::9"],
            ),
            node(2, &["tag:hyd-ingress-apps-portal"], &["100.64.0.2"]),
            node(5, &["tag:router"], &["100.64.0.5"]),
        ]
    }

    fn owner_context<'a>(
        taken_names: &'a BTreeSet<String>,
        nodes: Option<&'a [ObservedNode]>,
        route_approvers: &'a [String],
    ) -> OwnerContext<'a> {
        static NO_TAGS: BTreeSet<String> = BTreeSet::new();
        OwnerContext {
            tag_prefix: "hyd",
            route_approvers,
            taken_tags: &NO_TAGS,
            taken_names,
            cluster_domain: "cluster.local",
            nodes,
        }
    }

    fn record(name: &str, type_: &str, value: &str) -> FragmentDnsRecord {
        FragmentDnsRecord {
            name: name.into(),
            type_: type_.into(),
            value: value.into(),
        }
    }

    /// Only the DNS records of `records` are checked (no tags, grants or routes).
    fn check_records(
        contributor: &Contributor,
        records: Vec<FragmentDnsRecord>,
        owner: &OwnerContext<'_>,
    ) -> CheckedFragment {
        let mut f = fragment();
        f.tags.clear();
        f.grants.clear();
        f.routes.clear();
        f.dns_records = records;
        check_fragment(contributor, &f, owner)
    }

    /// Issue 26 item 1: a name that would inject into `hosts` or the server block, take the
    /// cluster domain or a public name, or point at someone else's node is refused, each
    /// with why; valid names of the contributor's own nodes pass (normalized to lowercase).
    #[test]
    fn hostile_dns_records_are_refused_and_valid_ones_pass() {
        let mut c = contributor();
        // A suffix that itself is the cluster domain's parent: still never the cluster domain.
        c.limits.dns_suffixes = vec!["cosmos.example.net".into(), "local".into()];
        let taken = BTreeSet::from(["owner.cosmos.example.net".to_string()]);
        let nodes = nodes();
        let owner = owner_context(&taken, Some(&nodes), &[]);
        let long_label = format!("{}.cosmos.example.net", "a".repeat(64));
        let long_name = format!("{}cosmos.example.net", "abcdefghi.".repeat(24));
        let hostile = [
            ("svc.cluster.local x.cosmos.example.net", "contains ' '"),
            ("registry.example.com x.cosmos.example.net", "contains ' '"),
            ("a.cosmos.example.net\n}\n. {", "contains '\\n'"),
            ("a\n.cosmos.example.net", "contains '\\n'"),
            ("x.cosmos.example.net\t", "contains '\\t'"),
            ("*.cosmos.example.net", "contains '*'"),
            ("{.cosmos.example.net", "contains '{'"),
            ("a}.cosmos.example.net", "contains '}'"),
            ("a_b.cosmos.example.net", "contains '_'"),
            ("-a.cosmos.example.net", "starts or ends with '-'"),
            ("a..cosmos.example.net", "empty label"),
            (long_label.as_str(), "label of 64 characters"),
            (long_name.as_str(), "more than the 253"),
            ("xcosmos.example.net", "not under limits.dnsSuffixes"),
            ("cosmos.example.net", "not under limits.dnsSuffixes"),
            ("svc.cluster.local", "cluster domain"),
            ("kubernetes.default.svc.cluster.local", "cluster domain"),
            ("cluster.local", "cluster domain"),
            ("owner.cosmos.example.net", "already claimed"),
        ];
        let mut records: Vec<FragmentDnsRecord> = hostile
            .iter()
            .map(|(name, _)| record(name, "A", "100.64.0.9"))
            .collect();
        records.extend([
            record("other.cosmos.example.net", "A", "100.64.0.2"),
            record("router.cosmos.example.net", "A", "100.64.0.5"),
            record("public.cosmos.example.net", "A", "1.1.1.1"),
            record("ok.cosmos.example.net", "A", "100.64.0.9"),
            record("OK.Cosmos.Example.Net.", "AAAA", "fd7a:115c:a1e0::9"),
        ]);
        let checked = check_records(&c, records, &owner);
        assert_eq!(
            checked.dns_records,
            vec![
                record("ok.cosmos.example.net", "A", "100.64.0.9"),
                record("ok.cosmos.example.net", "AAAA", "fd7a:115c:a1e0::9"),
            ]
        );
        assert_eq!(
            checked.refused.len(),
            hostile.len() + 3,
            "{:#?}",
            checked.refused
        );
        for ((name, why), refused) in hostile.iter().zip(&checked.refused) {
            assert!(
                refused.contains(why),
                "{name:?}: expected {why:?} in {refused:?}"
            );
            assert!(!refused.contains('\n'), "{refused:?}");
        }
        for refused in &checked.refused[hostile.len()..] {
            assert!(
                refused.contains("is not an address of one of the contributor's own nodes"),
                "{refused:?}"
            );
        }
    }

    /// Without Headscale's node list no address can be checked: nothing is accepted.
    #[test]
    fn dns_records_need_the_node_list() {
        let taken = BTreeSet::new();
        let owner = owner_context(&taken, None, &[]);
        let checked = check_records(
            &contributor(),
            vec![record("ok.cosmos.example.net", "A", "100.64.0.9")],
            &owner,
        );
        assert!(checked.dns_records.is_empty());
        assert!(
            checked.refused[0].contains("node list could not be read"),
            "{:?}",
            checked.refused
        );
    }

    /// Issue 26 item 3: a contributed route must lie inside limits.egressDestinations (not
    /// merely cover an accepted destination), and an exit route is refused even when the
    /// owner's limits would allow everything.
    #[test]
    fn routes_stay_inside_the_limits_and_never_exit() {
        let mut c = contributor();
        c.limits.egress_destinations =
            vec!["192.0.2.10/32".into(), "0.0.0.0/0".into(), "::/0".into()];
        let mut f = fragment();
        f.tags = vec!["tag:cos-egress-site".into()];
        f.grants = vec![grant(
            "TailnetEgress/cos/site",
            &["tag:cos-egress-site"],
            &["192.0.2.10/32"],
            &[5432],
        )];
        let route = |r: &str| FragmentRoute {
            route: r.into(),
            approvers: vec!["tag:router".into()],
        };
        f.routes = vec![route("0.0.0.0/0"), route("::/0"), route("192.0.2.10/32")];
        f.dns_records.clear();
        let taken = BTreeSet::new();
        let approvers = ["tag:router".to_string()];
        let owner = owner_context(&taken, None, &approvers);
        let checked = check_fragment(&c, &f, &owner);
        assert_eq!(
            checked.accepted.routes,
            vec!["192.0.2.10/32".parse::<IpNet>().expect("net")]
        );
        assert_eq!(checked.refused.len(), 2, "{:?}", checked.refused);
        assert!(checked.refused.iter().all(|r| r.contains("exit route")));
        // A wider route that covers the accepted destination but leaves the limits.
        c.limits.egress_destinations = vec!["192.0.2.10/32".into()];
        f.routes = vec![route("192.0.2.0/24")];
        let checked = check_fragment(&c, &f, &owner);
        assert!(checked.accepted.routes.is_empty());
        assert!(
            checked.refused[0].contains("route 192.0.2.0/24: not inside limits.egressDestinations"),
            "{:?}",
            checked.refused
        );
    }

    /// Issue 26 item 9: contributed tags pass Headscale's tag rule, `@` included (Headscale
    /// reads `tag:cos-x@y` as a user).
    #[test]
    fn contributed_tags_must_be_valid_tags() {
        let mut f = fragment();
        f.tags = vec![
            "tag:cos-x@y".into(),
            "tag:cos-a b".into(),
            "tag:cos-a\"b".into(),
            "tag:cos-ok".into(),
        ];
        f.grants.clear();
        f.routes.clear();
        f.dns_records.clear();
        let taken = BTreeSet::new();
        let checked = check_fragment(&contributor(), &f, &owner_context(&taken, None, &[]));
        assert_eq!(checked.accepted.tags, vec!["tag:cos-ok".to_string()]);
        assert_eq!(checked.refused.len(), 3, "{:?}", checked.refused);
        assert!(
            checked
                .refused
                .iter()
                .all(|r| r.contains("not a valid tag"))
        );
    }

    fn fragment() -> PolicyFragment {
        PolicyFragment {
            api_version: FRAGMENT_API_VERSION.into(),
            kind: FRAGMENT_KIND.into(),
            installation_id: "cosmos-uid/main".into(),
            tag_prefix: "cos".into(),
            tags: vec![
                "tag:cos-egress-site".into(),
                "tag:cos-ingress-apps-portal".into(),
                "tag:hyd-egress-site".into(),
                "tag:router".into(),
            ],
            grants: vec![
                grant(
                    "TailnetEgress/cos/site",
                    &["tag:cos-egress-site"],
                    &["192.0.2.10/32"],
                    &[5432],
                ),
                grant(
                    "TailnetEgress/cos/site",
                    &["tag:cos-egress-site"],
                    &["198.51.100.7/32"],
                    &[22],
                ),
                grant(
                    "TailnetIngress/apps/portal",
                    &["group:team-b"],
                    &["tag:cos-ingress-apps-portal"],
                    &[443],
                ),
                grant(
                    "TailnetIngress/apps/portal",
                    &["group:admins"],
                    &["tag:cos-ingress-apps-portal"],
                    &[443],
                ),
                grant(
                    "TailnetEgress/cos/steal",
                    &["tag:hyd-egress-site"],
                    &["192.0.2.10/32"],
                    &[5432],
                ),
            ],
            routes: vec![
                FragmentRoute {
                    route: "192.0.2.0/24".into(),
                    approvers: vec!["tag:router".into()],
                },
                FragmentRoute {
                    route: "10.0.0.0/8".into(),
                    approvers: vec!["tag:router".into()],
                },
                FragmentRoute {
                    route: "192.0.2.0/25".into(),
                    approvers: vec!["tag:cos-egress-site".into()],
                },
            ],
            dns_records: vec![
                FragmentDnsRecord {
                    name: "portal.cosmos.example.net".into(),
                    type_: "A".into(),
                    value: "100.64.0.9".into(),
                },
                FragmentDnsRecord {
                    name: "portal.hydra.example.net".into(),
                    type_: "A".into(),
                    value: "100.64.0.9".into(),
                },
                FragmentDnsRecord {
                    name: "taken.cosmos.example.net".into(),
                    type_: "A".into(),
                    value: "100.64.0.9".into(),
                },
            ],
        }
    }

    #[test]
    fn every_entry_is_checked_against_prefix_and_limits() {
        let taken_names = BTreeSet::from(["taken.cosmos.example.net".to_string()]);
        let checked = check_fragment(
            &contributor(),
            &fragment(),
            &OwnerContext {
                tag_prefix: "hyd",
                route_approvers: &["tag:router".to_string()],
                taken_tags: &BTreeSet::new(),
                taken_names: &taken_names,
                cluster_domain: "cluster.local",
                nodes: Some(&nodes()),
            },
        );
        assert_eq!(
            checked.accepted.tags,
            vec![
                "tag:cos-egress-site".to_string(),
                "tag:cos-ingress-apps-portal".to_string()
            ]
        );
        let owners: Vec<(&str, &Vec<String>)> = checked
            .accepted
            .grants
            .iter()
            .map(|g| (g.owner.as_str(), &g.dst))
            .collect();
        assert_eq!(owners.len(), 2, "{owners:?}");
        assert_eq!(
            checked.accepted.routes,
            vec!["192.0.2.0/24".parse::<IpNet>().expect("net")]
        );
        assert_eq!(checked.dns_records.len(), 1);
        let refused = checked.refused.join("\n");
        for expected in [
            "tag tag:hyd-egress-site: not under the contributor's prefix tag:cos-",
            "tag tag:router: not under",
            "destinations [\"198.51.100.7/32\"] are not in limits.egressDestinations",
            "sources [\"group:admins\"] are not in limits.ingressSourceAllowlist",
            "grant of TailnetEgress/cos/steal: neither its sources",
            "route 10.0.0.0/8: not inside limits.egressDestinations",
            "route 192.0.2.0/25: approvers [\"tag:cos-egress-site\"] are not among",
            "DNS record portal.hydra.example.net: not under",
            "DNS record taken.cosmos.example.net: already claimed",
        ] {
            assert!(
                refused.contains(expected),
                "missing {expected:?} in:\n{refused}"
            );
        }
        assert_eq!(checked.refused.len(), 9, "{refused}");
        assert_eq!(checked.summary(), "2 tags, 2 grants, 1 route, 1 DNS record");
    }

    #[test]
    fn the_owners_own_or_taken_tags_cannot_be_contributed() {
        let mut c = contributor();
        c.tag_prefix = "hyd-b".into();
        let mut f = fragment();
        f.tag_prefix = "hyd-b".into();
        f.tags = vec!["tag:hyd-b-egress-x".into(), "tag:hyd-b-ingress-y".into()];
        let taken = BTreeSet::from(["tag:hyd-b-ingress-y".to_string()]);
        let checked = check_fragment(
            &c,
            &f,
            &OwnerContext {
                tag_prefix: "hyd",
                route_approvers: &[],
                taken_tags: &taken,
                taken_names: &BTreeSet::new(),
                cluster_domain: "cluster.local",
                nodes: Some(&nodes()),
            },
        );
        // `hyd-b-…` is under the owner's `hyd-` too: refused (the CRD refuses such prefixes).
        assert!(
            checked.accepted.tags.is_empty(),
            "{:?}",
            checked.accepted.tags
        );
        // 2 tags; then nothing of it is its own: 5 grants, 3 routes, 3 DNS names (one outside
        // the suffixes, two pointing at a node that is not under its prefix).
        assert_eq!(
            checked.refused.len(),
            2 + 5 + 3 + 3,
            "{:?}",
            checked.refused
        );
    }

    #[test]
    fn malformed_fragments_are_refused_whole_with_line_and_column() {
        let error = parse_fragment("{\n  \"apiVersion\": 3\n}", &contributor()).expect_err("type");
        let FragmentError::Syntax { line, column, .. } = error else {
            panic!("{error}")
        };
        assert_eq!((line, column), (2, 17));
        let mut f = fragment();
        f.tag_prefix = "other".into();
        let text = fragment_text(&f);
        assert!(matches!(
            parse_fragment(&text, &contributor()),
            Err(FragmentError::WrongPrefix { .. })
        ));
        let big = " ".repeat(MAX_FRAGMENT_BYTES + 1);
        assert!(matches!(
            parse_fragment(&big, &contributor()),
            Err(FragmentError::TooLarge { .. })
        ));
        let unknown = text.replacen("\"kind\"", "\"extra\": 1, \"kind\"", 1);
        assert!(matches!(
            parse_fragment(&unknown, &contributor()),
            Err(FragmentError::Syntax { .. })
        ));
        assert_eq!(
            parse_fragment(&fragment_text(&fragment()), &contributor()),
            Ok(fragment())
        );
    }
}
