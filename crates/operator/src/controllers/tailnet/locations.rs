//! Where a Tailnet's spec points in the cluster: the base policy's key, the DNS ConfigMap.
//! Read by the gather step and the decisions alike.

use tailnet_api::Tailnet;

use super::super::config::OperatorConfig;

/// Key of the base policy in its ConfigMap (and of the document in the rendered-policy one).
pub const BASE_POLICY_KEY: &str = "policy.hujson";

/// Namespace and name of the DNS ConfigMap; `None` when `spec.dns.hostsConfigMap` is not set.
pub fn dns_config_map_location(
    tailnet: &Tailnet,
    config: &OperatorConfig,
) -> Option<(String, String)> {
    let dns = tailnet.spec.dns.as_ref()?;
    let name = dns.hosts_config_map.clone()?;
    let namespace = dns
        .hosts_config_map_namespace
        .clone()
        .unwrap_or_else(|| config.operator_namespace.clone());
    Some((namespace, name))
}
