//! The policy fragment a `mode: Contribute` installation publishes (ConfigMap
//! `<tailnet>-policy-fragment`, key `fragment.json`) and the owner reads: what this
//! installation's resources need in the one Headscale policy. Plain data; the owner checks
//! every entry against the contributor's prefix and limits (`tailnet_render::fragment`).

use serde::{Deserialize, Serialize};

/// `apiVersion` of a fragment document.
pub const FRAGMENT_API_VERSION: &str = "tailnet-operator.dev/v1alpha1";
/// `kind` of a fragment document.
pub const FRAGMENT_KIND: &str = "PolicyFragment";
/// The ConfigMap key holding the fragment.
pub const FRAGMENT_KEY: &str = "fragment.json";
/// Largest fragment the owner reads (a fragment is a few KiB per hundred resources).
pub const MAX_FRAGMENT_BYTES: usize = 512 * 1024;
/// Most entries of each kind the owner accepts from one contributor.
pub const MAX_FRAGMENT_ENTRIES: usize = 2000;

/// Name of the ConfigMap a contributing Tailnet publishes its fragment in.
pub fn fragment_config_map(tailnet: &str) -> String {
    format!("{tailnet}-policy-fragment")
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyFragment {
    pub api_version: String,
    pub kind: String,
    /// The contributor's ownership id (`<installation id>/<tailnet>`).
    pub installation_id: String,
    /// The contributor's `policy.tagPrefix`.
    pub tag_prefix: String,
    /// Tags its agents carry (the owner decides their owners).
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub grants: Vec<FragmentGrant>,
    /// `autoApprovers.routes` it needs for its IP targets.
    #[serde(default)]
    pub routes: Vec<FragmentRoute>,
    /// Ingress DNS records (Headscale extra records).
    #[serde(default)]
    pub dns_records: Vec<FragmentDnsRecord>,
}

/// One grant, as in the Headscale policy (`ip`: `tcp:<port>` entries).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FragmentGrant {
    /// `TailnetEgress/<ns>/<name>` or `TailnetIngress/<ns>/<name>` in the contributor.
    pub owner: String,
    pub src: Vec<String>,
    pub dst: Vec<String>,
    pub ip: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FragmentRoute {
    pub route: String,
    pub approvers: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FragmentDnsRecord {
    pub name: String,
    /// `A` or `AAAA`.
    #[serde(rename = "type")]
    pub type_: String,
    pub value: String,
}
