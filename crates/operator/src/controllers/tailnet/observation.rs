//! What one reconcile of a Tailnet observed, as plain data: the gather step fills it, the
//! decide steps read it. No I/O here (and nothing that does I/O is imported), so the decide
//! modules can depend on it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use serde::{Deserialize, Serialize};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tailnet_policy::ObservedNode;
use tailnet_render::backends::ObjectKey;

use super::super::status::Problem;

/// What one reconcile of a Tailnet observed (plain data: `decide` is pure).
#[derive(Clone, Debug)]
pub struct TailnetObservation {
    /// Headscale's version when it answers, accepts the API key and is healthy; else why
    /// `HeadscaleReachable` is False. When this is an error, `nodes` and `live_policy` are
    /// `None`.
    pub headscale: Result<String, Problem>,
    /// Headscale's nodes; `None` when they could not be listed (then no route is approved).
    pub nodes: Option<Vec<ObservedNode>>,
    /// The policy Headscale enforces now; `None` when it could not be read.
    pub live_policy: Option<String>,
    /// The operator's own API key as Headscale lists it (matched by its public prefix);
    /// `None` when the list could not be read or does not show the key.
    pub api_key: Option<ApiKeyFacts>,
    /// The base policy text; `Ok(None)` when `spec.policy.baseConfigMap` is not set.
    pub base: Result<Option<String>, Problem>,
    pub egresses: Vec<TailnetEgress>,
    pub ingresses: Vec<TailnetIngress>,
    /// The Services of the tailnet `loadBalancerClass` that belong to this Tailnet (read as
    /// ingresses).
    pub services: Vec<Service>,
    /// The Gateways of this Tailnet (classes of ours, Accepted), read as entrances: their
    /// tags, grants and listener hostnames.
    pub gateways: Vec<tailnet_render::intent::IngressIntent>,
    /// Egress Services (operator namespace) → ClusterIP (read only when DNS is configured).
    pub egress_cluster_ips: BTreeMap<ObjectKey, IpAddr>,
    /// The DNS ConfigMap as it is; `None` when DNS is not configured or it does not exist.
    pub dns_config_map: Option<CurrentDns>,
    /// Owner: each listed contributor's fragment as read now.
    pub contributor_reads: Vec<ContributorRead>,
    /// Owner: the last accepted fragment of each contributor (ConfigMap
    /// `<tailnet>-contributions`).
    pub contribution_store: BTreeMap<String, StoredFragment>,
}

/// The operator's API key as Headscale lists it: its public prefix (never the secret) and
/// its expiry (`None`: it does not expire).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyFacts {
    pub prefix: String,
    pub expiration: Option<jiff::Timestamp>,
}

/// What matters of an existing DNS ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CurrentDns {
    /// Our two keys (`hosts`, `extra-records.json`), where present.
    pub keys: BTreeMap<String, String>,
    /// The uids in its owner references.
    pub owner_uids: Vec<String>,
}

/// One contributor's fragment as the gather step read it; `Err`: unreadable now.
#[derive(Clone, Debug)]
pub struct ContributorRead {
    pub name: String,
    pub read: Result<String, Problem>,
}

/// What the owner keeps of a contributor (ConfigMap `<tailnet>-contributions`, one key per
/// contributor): its last fragment that parsed, so an unreadable contributor (or an owner
/// restart meanwhile) keeps its entries in the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredFragment {
    pub fragment: String,
    pub hash: String,
    pub last_read: String,
}
