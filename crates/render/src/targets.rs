//! The class of each egress target (SPEC §3), decided from Headscale's node list: a tailnet
//! node address, a subnet address behind a router, the MagicDNS name of a node, or another DNS
//! name. Shared by the egress controller (status) and `tailnet-operator render` (notes), so
//! both classify alike.

use std::net::IpAddr;

use ipnet::IpNet;
use tailnet_api::egress::TargetKind;
use tailnet_api::validate::TargetAddress;
use tailnet_policy::ObservedNode;

/// Headscale's default tailnet address ranges (`prefixes.v4`/`v6` of its config).
pub const TAILNET_V4: &str = "100.64.0.0/10";
pub const TAILNET_V6: &str = "fd7a:115c:a1e0::/48";

/// What the classification needs of one Headscale node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeView {
    pub id: u64,
    /// The given name (the MagicDNS host label).
    pub name: String,
    /// The owning user's name; `None` for a tagged node (or when not observed).
    pub user: Option<String>,
    pub tags: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub online: bool,
    /// RFC 3339, when known.
    pub last_seen: Option<String>,
    /// RFC 3339 expiry, set only when the node's key has expired.
    pub expired_at: Option<String>,
}

impl From<&ObservedNode> for NodeView {
    fn from(node: &ObservedNode) -> Self {
        NodeView {
            id: node.id,
            name: node.name.clone(),
            user: None,
            tags: node.tags.clone(),
            ips: node.ip_addresses.clone(),
            online: node.online,
            last_seen: None,
            expired_at: None,
        }
    }
}

/// One target's class, with the node it lives on when it is a node's address or name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetClass<'a> {
    /// An address `node` holds.
    TailnetNode(&'a NodeView),
    /// An address in Headscale's tailnet ranges that no node holds (removed, or a typo).
    UnknownNodeAddress,
    /// Any other IP: behind a subnet router (its route state is decided from the routers).
    Subnet,
    /// The MagicDNS name of `node`.
    MagicDns(&'a NodeView),
    /// A name under the MagicDNS domain whose host label no node has.
    UnknownMagicDnsName,
    /// Any other DNS name.
    DnsName,
}

impl TargetClass<'_> {
    pub fn kind(&self) -> TargetKind {
        match self {
            TargetClass::TailnetNode(_) | TargetClass::UnknownNodeAddress => {
                TargetKind::TailnetNode
            }
            TargetClass::Subnet => TargetKind::SubnetRoute,
            TargetClass::MagicDns(_) | TargetClass::UnknownMagicDnsName => TargetKind::MagicDns,
            TargetClass::DnsName => TargetKind::DnsName,
        }
    }

    pub fn node(&self) -> Option<&NodeView> {
        match self {
            TargetClass::TailnetNode(n) | TargetClass::MagicDns(n) => Some(n),
            _ => None,
        }
    }
}

/// Whether `ip` lies in Headscale's default tailnet ranges.
pub fn in_tailnet_range(ip: &IpAddr) -> bool {
    [TAILNET_V4, TAILNET_V6]
        .iter()
        .filter_map(|n| n.parse::<IpNet>().ok())
        .any(|n| n.contains(ip))
}

/// Classifies `address`. `magic_dns_domain` is the Tailnet's `spec.dns.magicDNSDomain`
/// (Headscale's `dns.base_domain`); without it only a node's short name is a MagicDNS name.
pub fn classify<'a>(
    address: &TargetAddress,
    nodes: &'a [NodeView],
    magic_dns_domain: Option<&str>,
) -> TargetClass<'a> {
    match address {
        TargetAddress::Ip(ip) => match nodes.iter().find(|n| n.ips.contains(ip)) {
            Some(node) => TargetClass::TailnetNode(node),
            None if in_tailnet_range(ip) => TargetClass::UnknownNodeAddress,
            None => TargetClass::Subnet,
        },
        TargetAddress::Dns(name) => {
            let name = name.trim_end_matches('.');
            let lower = name.to_ascii_lowercase();
            let host = match magic_dns_domain.map(|d| d.trim_end_matches('.').to_ascii_lowercase())
            {
                Some(domain) => match lower.strip_suffix(domain.as_str()) {
                    Some(host) if host.ends_with('.') => Some(host.trim_end_matches('.')),
                    _ if !name.contains('.') => Some(name),
                    _ => None,
                },
                None if !name.contains('.') => Some(name),
                None => None,
            };
            let Some(host) = host else {
                return TargetClass::DnsName;
            };
            // DNS names are case-insensitive (RFC 4343): `DB-1` is the node `db-1`.
            match nodes.iter().find(|n| n.name.eq_ignore_ascii_case(host)) {
                Some(node) => TargetClass::MagicDns(node),
                // Only a name under the configured domain is known to be MagicDNS.
                None if host != name => TargetClass::UnknownMagicDnsName,
                None => TargetClass::DnsName,
            }
        }
    }
}

/// The grant line that gives `tag` TCP `port` on `node` (both its addresses), as a user adds
/// it to the base policy's `grants`.
pub fn grant_line(tag: &str, node: &NodeView, port: u16) -> String {
    let dst: Vec<String> = node.ips.iter().map(|ip| format!("\"{ip}\"")).collect();
    format!(
        r#"{{"src": ["{tag}"], "dst": [{}], "ip": ["tcp:{port}"]}}"#,
        dst.join(", ")
    )
}

/// Where a target node stands, in words for the status: `None` when it is online and valid.
pub fn node_problem(node: &NodeView) -> Option<(NodeProblem, String)> {
    if let Some(at) = &node.expired_at {
        return Some((
            NodeProblem::Expired,
            format!(
                "node {} (id {}) expired at {at}; re-authenticate it (tailscale up) or disable its key expiry in Headscale",
                node.name, node.id
            ),
        ));
    }
    if !node.online {
        let since = node
            .last_seen
            .as_deref()
            .map(|t| format!(", last seen {t}"))
            .unwrap_or_default();
        return Some((
            NodeProblem::Offline,
            format!(
                "node {} (id {}) is offline{since}; start it or its tailscaled",
                node.name, node.id
            ),
        ));
    }
    None
}

/// Why a target's node cannot serve it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeProblem {
    Offline,
    Expired,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ips: &[&str]) -> NodeView {
        NodeView {
            id: 3,
            name: name.into(),
            ips: ips.iter().map(|i| i.parse().expect("ip")).collect(),
            online: true,
            ..NodeView::default()
        }
    }

    #[test]
    fn classes() {
        let nodes = [
            node("nas", &["100.64.0.7", "fd7a:115c:a1e0::7"]),
            node("router", &["100.64.0.1"]),
        ];
        let ip = |s: &str| TargetAddress::Ip(s.parse().expect("ip"));
        let dns = |s: &str| TargetAddress::Dns(s.into());
        let domain = Some("ts.example.net");
        let kind = |a: &TargetAddress, d| classify(a, &nodes, d);
        assert_eq!(
            kind(&ip("100.64.0.7"), None),
            TargetClass::TailnetNode(&nodes[0])
        );
        assert_eq!(
            kind(&ip("fd7a:115c:a1e0::7"), None),
            TargetClass::TailnetNode(&nodes[0])
        );
        assert_eq!(
            kind(&ip("100.64.0.9"), None),
            TargetClass::UnknownNodeAddress
        );
        assert_eq!(
            kind(&ip("fd7a:115c:a1e0::9"), None),
            TargetClass::UnknownNodeAddress
        );
        assert_eq!(kind(&ip("192.0.2.10"), None), TargetClass::Subnet);
        assert_eq!(kind(&ip("fd00:192::10"), None), TargetClass::Subnet);
        assert_eq!(
            kind(&dns("nas.ts.example.net"), domain),
            TargetClass::MagicDns(&nodes[0])
        );
        assert_eq!(kind(&dns("nas"), domain), TargetClass::MagicDns(&nodes[0]));
        assert_eq!(kind(&dns("nas"), None), TargetClass::MagicDns(&nodes[0]));
        assert_eq!(
            kind(&dns("gone.ts.example.net"), domain),
            TargetClass::UnknownMagicDnsName
        );
        // Without the domain, or under another domain, a name is an ordinary DNS name.
        assert_eq!(kind(&dns("nas.ts.example.net"), None), TargetClass::DnsName);
        assert_eq!(
            kind(&dns("nas.site.example.net"), domain),
            TargetClass::DnsName
        );
        assert_eq!(kind(&dns("xts.example.net"), domain), TargetClass::DnsName);
        assert_eq!(kind(&dns("db"), domain), TargetClass::DnsName);
    }

    #[test]
    fn magic_dns_names_are_case_insensitive() {
        let nodes = [node("nas", &["100.64.0.7"])];
        let dns = |s: &str| TargetAddress::Dns(s.into());
        let domain = Some("ts.example.net");
        for name in [
            "NAS",
            "nas.TS.Example.NET",
            "Nas.ts.example.net.",
            "nas.ts.example.net",
        ] {
            assert_eq!(
                classify(&dns(name), &nodes, domain),
                TargetClass::MagicDns(&nodes[0]),
                "{name}"
            );
        }
        assert_eq!(
            classify(&dns("nas.TS.example.net"), &nodes, Some("ts.example.NET.")),
            TargetClass::MagicDns(&nodes[0])
        );
        assert_eq!(
            classify(&dns("OTHER.ts.example.net"), &nodes, domain),
            TargetClass::UnknownMagicDnsName
        );
        assert_eq!(
            classify(&dns("nas.example.org"), &nodes, domain),
            TargetClass::DnsName
        );
    }

    #[test]
    fn grant_line_names_both_addresses() {
        let n = node("nas", &["100.64.0.7", "fd7a:115c:a1e0::7"]);
        assert_eq!(
            grant_line("tag:tno-egress-e", &n, 7000),
            r#"{"src": ["tag:tno-egress-e"], "dst": ["100.64.0.7", "fd7a:115c:a1e0::7"], "ip": ["tcp:7000"]}"#
        );
    }

    #[test]
    fn node_problems() {
        let mut n = node("nas", &["100.64.0.7"]);
        assert_eq!(node_problem(&n), None);
        n.online = false;
        n.last_seen = Some("2026-06-01T12:00:00Z".into());
        let (p, m) = node_problem(&n).expect("offline");
        assert_eq!(p, NodeProblem::Offline);
        assert!(m.contains("last seen 2026-06-01T12:00:00Z"), "{m}");
        n.expired_at = Some("2026-05-01T00:00:00Z".into());
        assert_eq!(node_problem(&n).map(|p| p.0), Some(NodeProblem::Expired));
    }
}
