//! What the ingress's own gather step observed, as plain data (filled by `gather.rs`, read by
//! `decide.rs`).

use std::sync::Arc;

use tailnet_api::TailnetIngress;
use tailnet_render::backends::ObservedBackends;
use tailnet_render::intent::IngressIntent;
use tailnet_render::meta::Owner;

/// The ingress's own observations (besides the agent's and the Tailnet's).
#[derive(Clone, Debug, Default)]
pub struct IngressObserved {
    /// The other TailnetIngresses of the same Tailnet (watch cache): the first to claim a
    /// hostname keeps it.
    pub others: Vec<Arc<TailnetIngress>>,
    /// The intents of the Tailnet's Services of the tailnet `loadBalancerClass` (for a
    /// Service: the other ones): they claim names like ingresses.
    pub entrances: Vec<IngressIntent>,
    /// This ingress's tag from the assignment over the Tailnet's ingresses
    /// (`desired::ingress_tags`: injective, first claim keeps today's form, recorded tags
    /// stay); `Err(holder)`: no tag of its own (`namespace/name` of the ingress holding it).
    /// `None`: not gathered; `decide` assigns it from `others` (the same function).
    pub tag: Option<Result<String, String>>,
    /// Backend Services that exist (their ports) and the CA ConfigMaps of
    /// `backend.tls.caConfigMapRef` (their keys). A backend in another namespace is only read
    /// for an ingress in the operator namespace (elsewhere it is rejected before it matters).
    pub backends: ObservedBackends,
    /// `tls.crt` of the TLS Secret (read only when there is an http expose); `None` when the
    /// Secret or the key does not exist.
    pub tls_certificate: Option<Vec<u8>>,
}

/// The name of the Secret the agent reads its certificate from: `spec.tls.secretName`, else
/// the one cert-manager issues for the operator's Certificate.
pub fn tls_secret_name(ingress: &TailnetIngress, owner: &Owner) -> String {
    ingress
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.secret_name.clone())
        .unwrap_or_else(|| owner.names().tls)
}
