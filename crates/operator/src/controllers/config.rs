//! Operator-wide settings (flags and environment), as plain data: what the pure decide
//! steps may read. No I/O here (see the purity check).

use std::collections::BTreeSet;
use std::time::Duration;

/// Operator-wide settings (flags/env).
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub operator_namespace: String,
    /// Identifies this installation in the policy's ownership marker (per Tailnet:
    /// `<installation_id>/<tailnet name>`).
    pub installation_id: String,
    /// How often Headscale state (nodes, routes, live policy) is re-read.
    pub headscale_poll: Duration,
    pub headscale_timeout: Duration,
    /// Default agent images (a Tailnet's `spec.agent` overrides them).
    pub images: tailnet_render::images::Images,
    /// Cluster DNS domain, for backend Service names.
    pub cluster_domain: String,
    /// Approve advertised routes that cover IP egress targets (Apply mode). Off: routes are
    /// left to the Headscale admin and egresses report `RouteNotApproved`.
    pub approve_routes: bool,
    /// An unchanged child object is applied again after this long at the latest (repairs drift
    /// of kinds the operator does not watch; see applied.rs).
    pub reapply_interval: Duration,
    /// Reconciles of one kind (egress, ingress) running at the same time.
    pub max_concurrent_reconciles: u16,
    /// The namespaces watched and acted in (`--watch-namespaces`).
    pub scope: WatchScope,
    /// The cluster's own address ranges and DNS pods (`--cluster-cidrs`,
    /// `--cluster-dns-pods`): the agents' egress to "anywhere" (the tailnet's transport)
    /// excludes those ranges and DNS goes to those pods only. `None`: not configured.
    pub cluster_network: Option<tailnet_render::reach::ClusterNetwork>,
    /// Restrict the egress of TailnetIngress and Service agents (`--restrict-agent-egress`);
    /// off: their NetworkPolicies carry no egress rules (for CNIs whose `ipBlock` does not
    /// match node addresses, where the Kubernetes API rule would cut agents off).
    pub restrict_agent_egress: bool,
}

/// The namespaces the operator watches and acts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchScope {
    Cluster,
    /// Only these (always including the operator namespace).
    Namespaces(BTreeSet<String>),
}

impl WatchScope {
    /// `listed` empty: the whole cluster. Otherwise the listed namespaces plus
    /// `operator_namespace` (egresses, Secrets and the Lease live there).
    pub fn new(operator_namespace: &str, listed: &[String]) -> Self {
        let listed: BTreeSet<String> = listed
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if listed.is_empty() {
            return WatchScope::Cluster;
        }
        let mut namespaces = listed;
        namespaces.insert(operator_namespace.to_string());
        WatchScope::Namespaces(namespaces)
    }

    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            WatchScope::Cluster => true,
            WatchScope::Namespaces(namespaces) => namespaces.contains(namespace),
        }
    }

    /// `None`: the whole cluster.
    pub fn namespaces(&self) -> Option<&BTreeSet<String>> {
        match self {
            WatchScope::Cluster => None,
            WatchScope::Namespaces(namespaces) => Some(namespaces),
        }
    }

    /// For logs and conditions: `the whole cluster` or `namespaces a, b`.
    pub fn describe(&self) -> String {
        match self {
            WatchScope::Cluster => "the whole cluster".to_string(),
            WatchScope::Namespaces(namespaces) => format!(
                "namespaces {}",
                namespaces.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}
