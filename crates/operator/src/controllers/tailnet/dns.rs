//! DNS entries of one Tailnet into `spec.dns.hostsConfigMap` (SPEC §5), decided (pure):
//! `DNSRendered`, and the ConfigMap to apply when our two keys in it change.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Resource;
use tailnet_api::Tailnet;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::fragment::FragmentDnsRecord;
use tailnet_render::desired;
use tailnet_render::dns::{self, RenderedDns};

use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, Problem};
use super::locations::dns_config_map_location;
use super::observation::TailnetObservation;

/// Sets `DNSRendered` and returns the DNS ConfigMap to apply, if our keys in it changed.
/// The inputs and the ConfigMap come from the same functions as `tailnet-operator render`.
pub fn decide(
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    config: &OperatorConfig,
    mut inputs: dns::DnsInputs,
    contributed: &[(String, FragmentDnsRecord)],
    c: &mut ConditionSet,
) -> Option<ConfigMap> {
    let Some((cm_namespace, cm_name)) = dns_config_map_location(tailnet, config) else {
        c.ok(
            types::DNS_RENDERED,
            reasons::NOT_CONFIGURED,
            "spec.dns.hostsConfigMap is not set: no DNS entries are rendered",
        );
        return None;
    };
    // Contributors' accepted ingress records (names nobody here claims: checked before).
    for (contributor, record) in contributed {
        if let Ok(address) = record.value.parse() {
            inputs.ingress_names.push(dns::DnsEntry {
                hostname: record.name.clone(),
                address,
                owner: format!("contributor {contributor}"),
                rank: dns::ClaimRank::new(None, "", contributor),
            });
        }
    }
    let current = observed.dns_config_map.as_ref();
    if observed.nodes.is_none() && current.is_some() {
        // Without Headscale's node list every ingress name would go pending and every
        // contributed record unchecked: the ConfigMap keeps its last entries instead of
        // flapping to fewer.
        c.unknown(
            types::DNS_RENDERED,
            Problem::new(
                reasons::HEADSCALE_UNREACHABLE,
                format!(
                    "Headscale's node list could not be read: ConfigMap {cm_namespace}/{cm_name} keeps its last entries until it can (ingress names and contributed records need the node list)"
                ),
            ),
        );
        return None;
    }
    let rendered = dns::render(&inputs);
    c.ok(
        types::DNS_RENDERED,
        reasons::RENDERED,
        message(&rendered, &cm_namespace, &cm_name),
    );
    // The ConfigMap may live where CoreDNS runs and may be shared with other keys (e.g.
    // kube-system/coredns): only our two keys are applied, and it is owned by the Tailnet
    // (garbage-collected with it) only if the operator created it.
    let ours = current.is_none_or(|c| {
        tailnet
            .metadata
            .uid
            .as_ref()
            .is_some_and(|uid| c.owner_uids.contains(uid))
    });
    let owner = tailnet.controller_owner_ref(&()).filter(|_| ours);
    let cm = desired::dns_config_map(tailnet, &config.operator_namespace, &rendered, owner)?;
    // Only written when the keys we own change.
    match (current, &cm.data) {
        (Some(current), Some(data)) if current.keys == *data => None,
        _ => Some(cm),
    }
}

/// Upper bound of the bytes one name takes in the DNS ConfigMap: its `hosts` line, its zone
/// and line in the server block, and its extra record (what [`dns::render`] writes for it).
pub fn entry_bytes(hostname: &str, address: &str) -> usize {
    const PER_ENTRY_OVERHEAD: usize = 80;
    4 * hostname.len() + 3 * address.len() + PER_ENTRY_OVERHEAD
}

/// Bytes of the owner's own names in the DNS ConfigMap (counted before any contributor's).
pub fn owner_entry_bytes(inputs: &dns::DnsInputs) -> usize {
    inputs
        .egress_aliases
        .iter()
        .chain(inputs.ingress_names.iter())
        .map(|e| entry_bytes(&e.hostname, &e.address.to_string()))
        .sum()
}

/// `DNSRendered`'s message: how many entries, what is pending, which names conflict.
fn message(rendered: &RenderedDns, cm_namespace: &str, cm_name: &str) -> String {
    let names = rendered
        .hosts
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    let records = serde_json::from_str::<Vec<serde_json::Value>>(&rendered.extra_records_json)
        .map(|r| r.len())
        .unwrap_or_default();
    let mut message = format!(
        "{names} entries in ConfigMap {cm_namespace}/{cm_name} (the cluster's; {records} tailnet records)"
    );
    if !rendered.pending.is_empty() {
        message.push_str(&format!(
            "; {} pending: {}",
            rendered.pending.len(),
            rendered
                .pending
                .iter()
                .map(|p| format!("{} ({})", p.hostname, p.reason))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !rendered.conflicts.is_empty() {
        message.push_str(&format!(
            "; conflicting names kept by their first owner: {}",
            rendered
                .conflicts
                .iter()
                .map(|(h, _)| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    message
}
