//! DNS entries (SPEC §5). The operator is not a DNS server: it renders
//! - `hosts` (and the same names as a CoreDNS server block): what the cluster's DNS answers;
//!   egress aliases → the target Service's ClusterIP, ingress names and aliases → the ingress's
//!   in-cluster Service ClusterIP when it lists `spec.inCluster.namespaces` (split horizon: a
//!   tailnet address is not routable from pods, so it is never written here; without listed
//!   namespaces the name is not in these records at all);
//! - `extra-records.json`: Headscale `dns.extra_records_path` format for the ingress names →
//!   the agent's tailnet IPs, so tailnet clients resolve them through MagicDNS.
//!
//! Output is deterministic (sorted, unique) so the ConfigMap is only written on real change.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// Key of the hosts file in the DNS ConfigMap.
pub const HOSTS_KEY: &str = "hosts";
/// Key of the Headscale extra records in the DNS ConfigMap.
pub const EXTRA_RECORDS_KEY: &str = "extra-records.json";
/// Key of the ready-to-import CoreDNS server block in the DNS ConfigMap: the same names as
/// [`HOSTS_KEY`], in a server block of their own with inline `hosts` entries, so it is added
/// with one top-level `import` (or, on k3s, as a `*.server` key of `coredns-custom`) and never
/// needs a second `hosts` plugin in a server block that already has one.
pub const SERVER_BLOCK_KEY: &str = "tailnet.server";

/// Longest DNS name accepted (RFC 1035: 255 octets on the wire, 253 characters as text).
pub const MAX_DNS_NAME: usize = 253;
/// Longest label (RFC 1035).
pub const MAX_DNS_LABEL: usize = 63;

/// Why a name cannot be written into `hosts`, the server block's zones or the extra records.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    #[error("is empty")]
    Empty,
    #[error("is {0} characters long, more than the {MAX_DNS_NAME} a DNS name may have")]
    TooLong(usize),
    #[error("has a single label (a name needs at least two: `host.domain`)")]
    SingleLabel,
    #[error("has an empty label (two dots in a row, or a leading dot)")]
    EmptyLabel,
    #[error("has a label of {0} characters, more than {MAX_DNS_LABEL}")]
    LabelTooLong(usize),
    #[error(
        "contains {0:?}: only lowercase letters, digits, '-' and '.' are allowed (RFC 1123; no whitespace, wildcards, braces or control characters)"
    )]
    Character(char),
    #[error("has a label that starts or ends with '-'")]
    Hyphen,
}

/// A DNS name as the renderer writes it: RFC 1123 host name syntax, lowercase, at least two
/// labels, each 1–63 of `a-z 0-9 -` (not starting or ending with `-`), at most 253 characters,
/// no trailing dot. Whatever passes is one whitespace-free token in `hosts` and a valid zone
/// (`name:53`) in the server block.
pub fn check_dns_name(name: &str) -> Result<(), DnsNameError> {
    if name.is_empty() {
        return Err(DnsNameError::Empty);
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(DnsNameError::Character(c));
    }
    if name.len() > MAX_DNS_NAME {
        return Err(DnsNameError::TooLong(name.len()));
    }
    let mut labels = 0;
    for label in name.split('.') {
        labels += 1;
        if label.is_empty() {
            return Err(DnsNameError::EmptyLabel);
        }
        if label.len() > MAX_DNS_LABEL {
            return Err(DnsNameError::LabelTooLong(label.len()));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(DnsNameError::Hyphen);
        }
    }
    if labels < 2 {
        return Err(DnsNameError::SingleLabel);
    }
    Ok(())
}

/// `name` is `domain` or a name under it (on a label boundary).
pub fn within_domain(name: &str, domain: &str) -> bool {
    name == domain
        || name
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Who claimed a name first: ordered by creation time (`None`, objects not read from a
/// cluster, sorts first), then namespace, then name. The one rule for a contested
/// hostname everywhere (`desired::claimed_elsewhere` serves the ingress with the same order):
/// the first claim wins, whatever the addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimRank {
    pub created: Option<Timestamp>,
    pub namespace: String,
    pub name: String,
}

impl ClaimRank {
    pub fn new(created: Option<Timestamp>, namespace: &str, name: &str) -> Self {
        ClaimRank {
            created,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// One name → address, with the resource it comes from (for conflicts and status).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DnsEntry {
    pub hostname: String,
    pub address: IpAddr,
    /// `Kind/namespace/name` of the resource that declared it.
    pub owner: String,
    /// Who claimed the name first (decides a conflict, never the address).
    pub rank: ClaimRank,
}

/// Names that cannot be rendered yet (no ClusterIP / no tailnet IP observed).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PendingName {
    pub hostname: String,
    pub owner: String,
    pub reason: String,
}

/// Inputs of the DNS renderer.
#[derive(Clone, Debug, Default)]
pub struct DnsInputs {
    /// Egress aliases with the ClusterIP of their target Service.
    pub egress_aliases: Vec<DnsEntry>,
    /// Ingress names and aliases with each tailnet IP of their agent (extra records only).
    pub ingress_names: Vec<DnsEntry>,
    /// Ingress names and aliases with the ClusterIP of their in-cluster Service (split
    /// horizon; `hosts` and the server block only).
    pub in_cluster_names: Vec<DnsEntry>,
    pub pending: Vec<PendingName>,
}

/// Whether `address` is a tailnet address (Headscale's `100.64.0.0/10` and
/// `fd7a:115c:a1e0::/48`): never routable from pods, so never in the cluster's records.
pub fn is_tailnet_address(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            a == 100 && (64..128).contains(&b)
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            segments[0] == 0xfd7a && segments[1] == 0x115c && segments[2] == 0xa1e0
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedDns {
    pub hosts: String,
    /// The CoreDNS server block of [`SERVER_BLOCK_KEY`].
    pub server_block: String,
    pub extra_records_json: String,
    /// Names claimed by more than one resource: the first claim (see [`ClaimRank`]) keeps it;
    /// here the hostname with the owners that lost it.
    pub conflicts: Vec<(String, Vec<String>)>,
    pub pending: Vec<PendingName>,
}

#[derive(Serialize)]
struct ExtraRecord<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    record_type: &'static str,
    value: String,
}

/// Resolves conflicts (a hostname claimed by two resources: the first claim keeps it, by
/// [`ClaimRank`], not by address or owner name) and renders both formats. A hostname that
/// is not a valid DNS name ([`check_dns_name`]) is never written: it is listed as pending
/// with the reason, so no input can produce a malformed `hosts` line or server block.
pub fn render(inputs: &DnsInputs) -> RenderedDns {
    let mut invalid = Vec::new();
    let mut all: Vec<&DnsEntry> = Vec::new();
    for entry in inputs
        .egress_aliases
        .iter()
        .chain(inputs.ingress_names.iter())
        .chain(inputs.in_cluster_names.iter())
    {
        match check_dns_name(&entry.hostname) {
            Ok(()) => all.push(entry),
            Err(e) => invalid.push(PendingName {
                hostname: entry.hostname.escape_debug().to_string(),
                owner: entry.owner.clone(),
                reason: format!("not written: the name {e}"),
            }),
        }
    }
    all.sort();
    let mut by_claim = all.clone();
    by_claim.sort_by(|a, b| {
        (a.hostname.as_str(), &a.rank, a.owner.as_str()).cmp(&(
            b.hostname.as_str(),
            &b.rank,
            b.owner.as_str(),
        ))
    });
    let mut winner: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    let mut losers: std::collections::BTreeMap<String, BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for entry in &by_claim {
        let owner = *winner
            .entry(entry.hostname.as_str())
            .or_insert(entry.owner.as_str());
        if owner != entry.owner {
            losers
                .entry(entry.hostname.clone())
                .or_default()
                .insert(entry.owner.clone());
        }
    }
    let kept = |e: &DnsEntry| winner.get(e.hostname.as_str()) == Some(&e.owner.as_str());

    let mut hosts =
        String::from("# Generated by tailnet-operator. Do not edit: changes are overwritten.\n");
    // What the cluster answers: egress aliases and in-cluster ingress names, never a tailnet
    // address (split horizon).
    let mut lines = BTreeSet::new();
    let in_cluster = inputs.egress_aliases.iter().chain(&inputs.in_cluster_names);
    for entry in in_cluster.filter(|e| check_dns_name(&e.hostname).is_ok() && kept(e)) {
        if is_tailnet_address(&entry.address) {
            invalid.push(PendingName {
                hostname: entry.hostname.clone(),
                owner: entry.owner.clone(),
                reason: format!(
                    "not written into the cluster's records: {} is a tailnet address, not routable from pods",
                    entry.address
                ),
            });
            continue;
        }
        lines.insert((entry.hostname.clone(), entry.address));
    }
    for (hostname, address) in &lines {
        hosts.push_str(&format!("{address} {hostname}\n"));
    }

    let server_block = server_block(&lines);

    let mut ingress: Vec<&DnsEntry> = inputs
        .ingress_names
        .iter()
        .filter(|e| check_dns_name(&e.hostname).is_ok() && kept(e))
        .collect();
    ingress.sort();
    ingress.dedup_by(|a, b| a.hostname == b.hostname && a.address == b.address);
    let records: Vec<ExtraRecord> = ingress
        .iter()
        .map(|e| ExtraRecord {
            name: &e.hostname,
            record_type: if e.address.is_ipv4() { "A" } else { "AAAA" },
            value: e.address.to_string(),
        })
        .collect();
    let extra_records_json =
        serde_json::to_string_pretty(&records).unwrap_or_else(|_| "[]".to_string()) + "\n";

    let mut pending = inputs.pending.clone();
    pending.extend(invalid);
    pending.sort();
    pending.dedup();
    RenderedDns {
        hosts,
        server_block,
        extra_records_json,
        conflicts: losers
            .into_iter()
            .map(|(h, o)| (h, o.into_iter().collect()))
            .collect(),
        pending,
    }
}

/// A CoreDNS server block answering exactly these names (each name is a zone of the block)
/// from inline `hosts` entries; `/dev/null` as the hosts file keeps the container's
/// `/etc/hosts` out. Without names: comments only (an import of it adds nothing).
fn server_block(lines: &BTreeSet<(String, IpAddr)>) -> String {
    let mut out = String::from(
        "# Generated by tailnet-operator. Do not edit: changes are overwritten.\n\
         # A CoreDNS server block: import it at the top level of the Corefile (not inside another\n\
         # server block), e.g. `import /etc/coredns/tailnet/*.server`; on k3s put it into\n\
         # ConfigMap kube-system/coredns-custom. See docs/dns.md.\n",
    );
    let names: BTreeSet<&str> = lines.iter().map(|(h, _)| h.as_str()).collect();
    if names.is_empty() {
        out.push_str("# (no names yet)\n");
        return out;
    }
    let zones: Vec<String> = names.iter().map(|n| format!("{n}:53")).collect();
    out.push_str(&format!("{} {{\n    hosts /dev/null {{\n", zones.join(" ")));
    for (hostname, address) in lines {
        out.push_str(&format!("        {address} {hostname}\n"));
    }
    out.push_str("        ttl 30\n    }\n    errors\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use proptest::prelude::*;

    /// Issue 26 item 1: whatever a hostname holds, the renderer writes only valid names: a
    /// name with a space would have made the server block authoritative for
    /// `svc.cluster.local`, a newline would have injected Corefile text.
    #[test]
    fn invalid_names_are_never_written_and_are_reported_pending() {
        let hostile = [
            "svc.cluster.local x.cosmos.example.net",
            "a.example.net\n}\n. {\n    whoami\n",
            "*.example.net",
            "{.example.net",
            "Upper.example.net",
            "single",
            "trailing.example.net.",
        ];
        let mut inputs = DnsInputs {
            in_cluster_names: hostile
                .iter()
                .map(|h| entry(h, "10.96.0.9", "contributor cosmos"))
                .collect(),
            ..Default::default()
        };
        inputs
            .in_cluster_names
            .push(entry("ok.example.net", "10.96.0.9", "contributor cosmos"));
        let out = render(&inputs);
        assert_eq!(
            out.hosts
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["10.96.0.9 ok.example.net"]
        );
        assert!(
            out.server_block.contains("\nok.example.net:53 {\n"),
            "{}",
            out.server_block
        );
        assert!(!out.extra_records_json.contains("cluster.local"));
        assert_eq!(out.pending.len(), hostile.len(), "{:?}", out.pending);
        assert!(
            out.pending.iter().all(
                |p| p.reason.starts_with("not written: the name") && !p.hostname.contains('\n')
            )
        );
    }

    /// Split horizon (SPEC §5): an ingress name is in the cluster's records only through its
    /// in-cluster Service; a tailnet address given for the cluster is never written (pending,
    /// with the reason); the extra records keep the tailnet addresses.
    #[test]
    fn the_cluster_never_gets_a_tailnet_address() {
        let out = render(&DnsInputs {
            ingress_names: vec![
                entry("a.example.net", "100.64.0.2", "TailnetIngress/x/a"),
                entry("b.example.net", "100.64.0.3", "TailnetIngress/x/b"),
            ],
            in_cluster_names: vec![
                entry("a.example.net", "10.96.0.7", "TailnetIngress/x/a"),
                entry("c.example.net", "100.100.0.1", "TailnetIngress/x/c"),
                entry("d.example.net", "fd7a:115c:a1e0::4", "TailnetIngress/x/d"),
            ],
            ..Default::default()
        });
        assert_eq!(
            out.hosts
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["10.96.0.7 a.example.net"]
        );
        assert!(!out.server_block.contains("b.example.net"));
        let records: serde_json::Value =
            serde_json::from_str(&out.extra_records_json).expect("json");
        assert_eq!(
            records,
            serde_json::json!([
                {"name": "a.example.net", "type": "A", "value": "100.64.0.2"},
                {"name": "b.example.net", "type": "A", "value": "100.64.0.3"},
            ])
        );
        let pending: Vec<&str> = out.pending.iter().map(|p| p.hostname.as_str()).collect();
        assert_eq!(pending, ["c.example.net", "d.example.net"]);
        assert!(out.pending[0].reason.contains("tailnet address"));
        for (address, tailnet) in [
            ("100.63.255.255", false),
            ("100.64.0.0", true),
            ("100.127.255.255", true),
            ("100.128.0.0", false),
            ("10.96.0.1", false),
            ("fd7a:115c:a1e0:ab12::1", true),
            ("fd7a:115c:a1e1::1", false),
            ("2001:db8::1", false),
        ] {
            let ip: IpAddr = address.parse().expect("ip");
            assert_eq!(is_tailnet_address(&ip), tailnet, "{address}");
        }
    }

    #[test]
    fn dns_name_rules() {
        for good in [
            "a.b",
            "x-1.example.net",
            "1.2.example.net",
            &format!("{}.net", "a".repeat(63)),
        ] {
            assert_eq!(check_dns_name(good), Ok(()), "{good}");
        }
        let too_long = format!("{}net", "a.".repeat(126));
        for (bad, error) in [
            ("", DnsNameError::Empty),
            ("net", DnsNameError::SingleLabel),
            ("a..net", DnsNameError::EmptyLabel),
            (".a.net", DnsNameError::EmptyLabel),
            ("a.net.", DnsNameError::EmptyLabel),
            ("-a.net", DnsNameError::Hyphen),
            ("a-.net", DnsNameError::Hyphen),
            ("A.net", DnsNameError::Character('A')),
            ("a b.net", DnsNameError::Character(' ')),
            ("*.net", DnsNameError::Character('*')),
            ("é.net", DnsNameError::Character('é')),
            (too_long.as_str(), DnsNameError::TooLong(too_long.len())),
        ] {
            assert_eq!(check_dns_name(bad), Err(error), "{bad:?}");
        }
        assert_eq!(
            check_dns_name(&format!("{}.net", "a".repeat(64))),
            Err(DnsNameError::LabelTooLong(64))
        );
        assert!(within_domain("a.cluster.local", "cluster.local"));
        assert!(within_domain("cluster.local", "cluster.local"));
        assert!(!within_domain("acluster.local", "cluster.local"));
        assert!(!within_domain("local", "cluster.local"));
    }

    /// Any string, biased towards the characters that break `hosts` lines and Corefiles.
    fn any_hostname() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9.{}* \t\n\r#;:-]{0,40}",
            "([a-z0-9]{1,8}\\.){1,4}[a-z]{2,5}",
            any::<String>(),
        ]
    }

    fn any_entry() -> impl Strategy<Value = DnsEntry> {
        (any_hostname(), any::<std::net::IpAddr>(), "[a-z/ ]{1,12}").prop_map(
            |(hostname, address, owner)| DnsEntry {
                hostname,
                address,
                rank: ClaimRank::new(None, "", &owner),
                owner,
            },
        )
    }

    /// The zones of the server block's header line: every token ends in `:53` except the
    /// final `{`, and each zone's name is a valid DNS name.
    fn zones_well_formed(block: &str) -> Result<(), String> {
        let body: Vec<&str> = block.lines().filter(|l| !l.starts_with('#')).collect();
        if body.is_empty() {
            return Ok(());
        }
        let (header, rest) = body.split_first().ok_or("no header")?;
        let tokens: Vec<&str> = header.split_whitespace().collect();
        let (open, zones) = tokens.split_last().ok_or("empty header")?;
        if *open != "{" || zones.is_empty() {
            return Err(format!("header {header:?}"));
        }
        for zone in zones {
            let name = zone.strip_suffix(":53").ok_or(format!("zone {zone:?}"))?;
            check_dns_name(name).map_err(|e| format!("zone {zone:?}: {e}"))?;
        }
        let closing = rest.iter().filter(|l| l.trim() == "}").count();
        let opening = rest.iter().filter(|l| l.trim_end().ends_with('{')).count();
        if closing != opening + 1 || rest.last() != Some(&"}") {
            return Err(format!("unbalanced block: {block}"));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Every `hosts` line (and every entry line of the server block) has exactly two
        /// fields, an address and a valid name; the server block is well formed; the extra
        /// records are valid JSON with only valid names.
        #[test]
        fn the_renderer_never_emits_a_malformed_line_or_zone(
            egress in proptest::collection::vec(any_entry(), 0..6),
            ingress in proptest::collection::vec(any_entry(), 0..6),
            in_cluster in proptest::collection::vec(any_entry(), 0..6),
        ) {
            let out = render(&DnsInputs { egress_aliases: egress, ingress_names: ingress, in_cluster_names: in_cluster, pending: vec![] });
            for line in out.hosts.lines().filter(|l| !l.starts_with('#')) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                prop_assert_eq!(fields.len(), 2, "{:?}", line);
                let address = fields[0].parse::<IpAddr>();
                prop_assert!(address.is_ok(), "{:?}", line);
                // Split horizon: never a tailnet address in the cluster's records.
                prop_assert!(!address.as_ref().is_ok_and(is_tailnet_address), "{:?}", line);
                prop_assert_eq!(check_dns_name(fields[1]), Ok(()), "{:?}", line);
                prop_assert_eq!(line, format!("{} {}", fields[0], fields[1]));
            }
            prop_assert_eq!(zones_well_formed(&out.server_block), Ok(()));
            for line in out.server_block.lines().filter(|l| l.starts_with("        ") && !l.trim().starts_with("ttl")) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                prop_assert_eq!(fields.len(), 2, "{:?}", line);
                prop_assert_eq!(check_dns_name(fields[1]), Ok(()), "{:?}", line);
            }
            let records: Vec<serde_json::Value> = serde_json::from_str(&out.extra_records_json)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            for r in records {
                prop_assert_eq!(check_dns_name(r["name"].as_str().unwrap_or_default()), Ok(()));
            }
        }
    }

    fn entry(hostname: &str, address: &str, owner: &str) -> DnsEntry {
        let mut parts = owner.rsplitn(3, '/');
        let name = parts.next().unwrap_or_default();
        let namespace = parts.next().unwrap_or_default();
        DnsEntry {
            hostname: hostname.into(),
            address: address.parse().expect("ip"),
            owner: owner.into(),
            rank: ClaimRank::new(None, namespace, name),
        }
    }

    fn created(mut e: DnsEntry, at: &str) -> DnsEntry {
        e.rank.created = Some(at.parse().expect("timestamp"));
        e
    }

    /// The lab's case: the newer ingress's node got the lower address. The older claim keeps
    /// the name in both files, and the newer one is the loser.
    #[test]
    fn the_first_claim_wins_even_when_the_newer_node_has_the_lower_address() {
        let older = created(
            entry(
                "portal.example.net",
                "100.64.0.9",
                "TailnetIngress/team-b/portal",
            ),
            "2026-01-01T00:00:00Z",
        );
        let older6 = created(
            entry(
                "portal.example.net",
                "fd7a:115c:a1e0::9",
                "TailnetIngress/team-b/portal",
            ),
            "2026-01-01T00:00:00Z",
        );
        let newer = created(
            entry(
                "portal.example.net",
                "100.64.0.2",
                "TailnetIngress/team-a/portal",
            ),
            "2026-01-02T00:00:00Z",
        );
        for inputs in [
            vec![older.clone(), older6.clone(), newer.clone()],
            vec![newer.clone(), older6.clone(), older.clone()],
        ] {
            let out = render(&DnsInputs {
                ingress_names: inputs,
                ..Default::default()
            });
            // Tailnet addresses are for tailnet clients only (split horizon).
            assert!(!out.hosts.contains("portal.example.net"), "{}", out.hosts);
            assert!(out.extra_records_json.contains("fd7a:115c:a1e0::9"));
            assert!(out.extra_records_json.contains("100.64.0.9"));
            assert!(!out.extra_records_json.contains("100.64.0.2"));
            assert_eq!(
                out.conflicts,
                vec![(
                    "portal.example.net".to_string(),
                    vec!["TailnetIngress/team-a/portal".to_string()]
                )]
            );
        }
    }

    /// Same creation time: namespace, then name decide (as in `claimed_elsewhere`), not the
    /// owner string (`team-a-dev/x` sorts before `team-a/x` as a string).
    #[test]
    fn equal_creation_times_fall_back_to_namespace_then_name() {
        let at = "2026-01-01T00:00:00Z";
        let a = created(
            entry("x.example.net", "100.64.0.9", "TailnetIngress/team-a/x"),
            at,
        );
        let b = created(
            entry("x.example.net", "100.64.0.1", "TailnetIngress/team-a-dev/x"),
            at,
        );
        let out = render(&DnsInputs {
            ingress_names: vec![b, a],
            ..Default::default()
        });
        assert!(
            out.extra_records_json.contains("100.64.0.9")
                && !out.extra_records_json.contains("100.64.0.1\""),
            "{}",
            out.extra_records_json
        );
        assert_eq!(
            out.conflicts[0].1,
            vec!["TailnetIngress/team-a-dev/x".to_string()]
        );
    }

    #[test]
    fn renders_hosts_and_extra_records_sorted() {
        let inputs = DnsInputs {
            egress_aliases: vec![entry(
                "api.site.example.net",
                "10.96.0.20",
                "TailnetEgress/tailnet-system/team-a",
            )],
            ingress_names: vec![
                entry(
                    "portal.team-a.lab.example.net",
                    "fd7a:115c:a1e0::2",
                    "TailnetIngress/team-a/portal",
                ),
                entry(
                    "portal.team-a.lab.example.net",
                    "100.64.0.2",
                    "TailnetIngress/team-a/portal",
                ),
                entry(
                    "admin.team-a.lab.example.net",
                    "100.64.0.2",
                    "TailnetIngress/team-a/portal",
                ),
            ],
            in_cluster_names: vec![
                entry(
                    "portal.team-a.lab.example.net",
                    "10.96.0.30",
                    "TailnetIngress/team-a/portal",
                ),
                entry(
                    "admin.team-a.lab.example.net",
                    "10.96.0.30",
                    "TailnetIngress/team-a/portal",
                ),
            ],
            pending: vec![],
        };
        let out = render(&inputs);
        // The cluster answers with the in-cluster Service; tailnet clients get the tailnet IPs.
        assert_eq!(
            out.hosts,
            "# Generated by tailnet-operator. Do not edit: changes are overwritten.\n\
             10.96.0.30 admin.team-a.lab.example.net\n\
             10.96.0.20 api.site.example.net\n\
             10.96.0.30 portal.team-a.lab.example.net\n"
        );
        let records: serde_json::Value =
            serde_json::from_str(&out.extra_records_json).expect("json");
        assert_eq!(
            records,
            serde_json::json!([
                {"name": "admin.team-a.lab.example.net", "type": "A", "value": "100.64.0.2"},
                {"name": "portal.team-a.lab.example.net", "type": "A", "value": "100.64.0.2"},
                {"name": "portal.team-a.lab.example.net", "type": "AAAA", "value": "fd7a:115c:a1e0::2"},
            ])
        );
        assert!(out.conflicts.is_empty());
    }

    #[test]
    fn deterministic_under_input_order() {
        let a = entry("a.example.net", "100.64.0.1", "TailnetIngress/x/a");
        let b = entry("b.example.net", "100.64.0.2", "TailnetIngress/x/b");
        let one = render(&DnsInputs {
            ingress_names: vec![a.clone(), b.clone()],
            ..Default::default()
        });
        let two = render(&DnsInputs {
            ingress_names: vec![b, a],
            ..Default::default()
        });
        assert_eq!(one, two);
    }

    #[test]
    fn first_owner_keeps_a_conflicting_name() {
        let inputs = DnsInputs {
            ingress_names: vec![
                entry(
                    "portal.example.net",
                    "100.64.0.9",
                    "TailnetIngress/team-b/portal",
                ),
                entry(
                    "portal.example.net",
                    "100.64.0.2",
                    "TailnetIngress/team-a/portal",
                ),
            ],
            ..Default::default()
        };
        let out = render(&inputs);
        assert!(out.extra_records_json.contains("100.64.0.2"));
        assert!(!out.extra_records_json.contains("100.64.0.9"));
        assert!(!out.hosts.contains("portal.example.net"), "{}", out.hosts);
        assert_eq!(
            out.conflicts,
            vec![(
                "portal.example.net".to_string(),
                vec!["TailnetIngress/team-b/portal".to_string()]
            )]
        );
    }

    #[test]
    fn empty_inputs_render_valid_empty_files() {
        let out = render(&DnsInputs::default());
        assert_eq!(out.extra_records_json, "[]\n");
        assert!(out.hosts.starts_with('#'));
        assert!(
            out.server_block.lines().all(|l| l.starts_with('#')),
            "{}",
            out.server_block
        );
    }

    #[test]
    fn the_server_block_serves_exactly_the_hosts_entries() {
        let out = render(&DnsInputs {
            egress_aliases: vec![entry(
                "api.site.example.net",
                "10.96.0.20",
                "TailnetEgress/tailnet-system/team-a",
            )],
            ingress_names: vec![
                entry(
                    "portal.example.net",
                    "100.64.0.2",
                    "TailnetIngress/team-a/portal",
                ),
                entry(
                    "portal.example.net",
                    "fd7a:115c:a1e0::2",
                    "TailnetIngress/team-a/portal",
                ),
            ],
            in_cluster_names: vec![entry(
                "portal.example.net",
                "10.96.0.30",
                "TailnetIngress/team-a/portal",
            )],
            pending: vec![],
        });
        let body: Vec<&str> = out
            .server_block
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect();
        assert_eq!(
            body,
            [
                "api.site.example.net:53 portal.example.net:53 {",
                "    hosts /dev/null {",
                "        10.96.0.20 api.site.example.net",
                "        10.96.0.30 portal.example.net",
                "        ttl 30",
                "    }",
                "    errors",
                "}",
            ]
        );
    }
}
