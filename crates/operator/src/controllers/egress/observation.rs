//! What the egress's own gather step observed, as plain data (filled by `gather.rs`, read by
//! `decide.rs`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// The egress's own observations (besides the agent's and the Tailnet's).
#[derive(Clone, Debug, Default)]
pub struct EgressObserved {
    /// Services in the operator namespace named like a target but held by someone else:
    /// target name → holder ("TailnetEgress other" or "no controller (created by hand)").
    pub foreign_services: BTreeMap<String, String>,
    /// This egress's own Services (watch cache or GET), by name, including those of removed
    /// targets.
    pub own_services: BTreeMap<String, Service>,
    /// Per MagicDNS target on a known node (by target name): whether the live policy grants
    /// this egress's tag the node's address and port (asked of Headscale's policy check).
    pub grants: BTreeMap<String, GrantCheck>,
}

/// Headscale's answer to "does the live policy let this egress reach that node's port?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantCheck {
    Granted,
    Missing,
    /// Could not be decided (e.g. the agent's node does not exist yet), and why.
    Unknown(String),
}
