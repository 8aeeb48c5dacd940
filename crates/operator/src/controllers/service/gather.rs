//! The Service's own gather step: the Tailnet's TailnetIngresses and its other Services of
//! the tailnet `loadBalancerClass` (claims on names; the tag among the Services), and the
//! Service itself as the backend (it is in the watch cache already: nothing is read).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, ResourceExt};
use tailnet_api::TailnetIngress;
use tailnet_render::backends::ObservedBackends;
use tailnet_render::intent::{Claim, IngressIntent};

use super::super::agent::kind::GatherInput;
use super::super::context::Context;
use super::super::entrances::service_intents;
use super::super::error::ReconcileError;
use super::super::ingress::observation::IngressObserved;
use super::decide::ServiceIntent;

pub async fn gather(
    ctx: &Context,
    service: &Service,
    _intent: &ServiceIntent,
    input: GatherInput<'_>,
) -> Result<IngressObserved, ReconcileError> {
    let tailnet = &input.access.tailnet;
    let name = tailnet.name_any();
    let others: Vec<Arc<TailnetIngress>> = ctx
        .kinds
        .objects::<TailnetIngress>()
        .into_iter()
        .filter(|i| i.spec.tailnet_ref.name == name)
        .collect();
    let entrances: Vec<IngressIntent> =
        service_intents(ctx, tailnet, service.metadata.uid.as_deref())
            .into_iter()
            .map(|s| s.intent)
            .collect();
    let claim = Claim::of_service(service, &name);
    let tag = tailnet_render::claims::ingress_tag_of(
        &name,
        &tailnet.spec.policy.tag_prefix,
        &claim,
        entrances.iter().map(|e| &e.claim),
    );
    let mut backends = ObservedBackends::default();
    backends.add_service(service);
    backends.control_plane = control_plane(ctx, &tailnet.spec.server).await;
    Ok(IngressObserved {
        others,
        entrances,
        tag: Some(tag),
        backends,
        tls_certificate: None,
    })
}

/// Where the agent's containers must reach besides the Service's pods (its egress
/// NetworkPolicy admits these): the Kubernetes API's endpoints (EndpointSlice
/// `default/kubernetes`, after the Service's DNAT, which is what a NetworkPolicy sees) and
/// Headscale's addresses (`spec.server`, resolved here). Empty when either is unknown: then the
/// agent's egress is not restricted rather than cut off from its control plane.
async fn control_plane(ctx: &Context, server: &str) -> Vec<SocketAddr> {
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), "default");
    let api = match slices.get_opt("kubernetes").await {
        Ok(Some(slice)) => api_endpoints(&slice),
        Ok(None) => Vec::new(),
        Err(error) => {
            tracing::debug!(%error, "the Kubernetes API's EndpointSlice could not be read: agent egress unrestricted");
            Vec::new()
        }
    };
    let headscale = headscale_addresses(server).await;
    if api.is_empty() || headscale.is_empty() {
        return Vec::new();
    }
    let mut all: Vec<SocketAddr> = api.into_iter().chain(headscale).collect();
    all.sort();
    all.dedup();
    all
}

/// Address × TCP port of the Kubernetes API's EndpointSlice.
fn api_endpoints(slice: &EndpointSlice) -> Vec<SocketAddr> {
    let ports: Vec<u16> = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| p.port.and_then(|p| u16::try_from(p).ok()))
        .collect();
    slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .flat_map(|ip| ports.iter().map(move |p| SocketAddr::new(ip, *p)))
        .collect()
}

/// Headscale's addresses from `spec.server` (an IP literal, or the name resolved), at most a
/// handful, with the URL's port.
async fn headscale_addresses(server: &str) -> Vec<SocketAddr> {
    let Ok(url) = url::Url::parse(server) else {
        return Vec::new();
    };
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Vec::new();
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![SocketAddr::new(ip, port)];
    }
    let lookup = tokio::net::lookup_host((host.as_str(), port));
    match tokio::time::timeout(std::time::Duration::from_secs(5), lookup).await {
        Ok(Ok(addresses)) => addresses.take(16).collect(),
        _ => Vec::new(),
    }
}
