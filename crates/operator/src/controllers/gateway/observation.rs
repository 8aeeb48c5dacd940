//! What the Gateway's own gather step observed, as plain data (filled by `gather.rs`, read by
//! `decide.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use tailnet_api::gateway_parameters::GatewayParameters;
use tailnet_gateway_api::{Gateway, HTTPRoute, ReferenceGrant, TCPRoute, TLSRoute};
use tailnet_render::backends::{ObjectKey, ObservedBackends};
use tailnet_render::gateway::ClusterFacts;
use tailnet_render::gateway::objects::KeyPair;

/// The Gateway's class as far as this operator is concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClassState {
    /// Missing, or another controller's: the Gateway is not ours.
    #[default]
    NotOurs,
    /// Ours: its parameters, or why it is not Accepted.
    Ours(Result<GatewayParameters, String>),
}

impl ClassState {
    /// The namespaces whose pods reach the class's Gateways in-cluster (its parameters'
    /// `inCluster.namespaces`; none unless the class is ours and Accepted).
    pub fn in_cluster_namespaces(&self) -> &[String] {
        match self {
            ClassState::Ours(Ok(parameters)) => &parameters.in_cluster_namespaces,
            _ => &[],
        }
    }
}

/// The Gateway's own observations (besides the agent's and the Tailnet's).
#[derive(Clone, Debug, Default)]
pub struct GatewayObserved {
    pub class: ClassState,
    /// The other Gateways in the cache (the tag assignment: injective over them).
    pub others: Vec<Arc<Gateway>>,
    /// Routes and grants in the watched namespaces (those not naming this Gateway are
    /// ignored by the decision).
    pub http_routes: Vec<HTTPRoute>,
    pub tls_routes: Vec<TLSRoute>,
    pub tcp_routes: Vec<TCPRoute>,
    pub reference_grants: Vec<ReferenceGrant>,
    /// Namespaces' labels, certificate Secrets' usability, backend Services' existence.
    pub facts: ClusterFacts,
    /// The usable certificate Secrets' key pairs (copied for the agent; never logged).
    pub key_pairs: BTreeMap<ObjectKey, KeyPair>,
    /// The backend Services as observed (the agent's egress policy).
    pub backends: ObservedBackends,
}
