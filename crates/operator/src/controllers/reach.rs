//! What an entrance's agent may reach, as observed (I/O; the decision is
//! `tailnet_render::reach`, pure): the Kubernetes API's and Headscale's addresses, and the
//! EndpointSlices of backend Services without a selector. Shared by the TailnetIngress and
//! Service kinds' gather steps.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use tailnet_render::backends::ObservedBackends;

use super::context::Context;
use super::kube_io::get_opt_cached;

/// Fills what the egress decision reads besides the backend Services themselves (which the
/// caller recorded already): the control plane's addresses and, for each backend Service
/// without a selector, its EndpointSlices (watched namespaces only; a Service whose slices
/// cannot be read stays out, so the agent's egress is left unrestricted). Nothing is read
/// with `--restrict-agent-egress=false`.
pub async fn observe(ctx: &Context, server: &str, backends: &mut ObservedBackends) {
    if !ctx.config.restrict_agent_egress {
        return;
    }
    backends.control_plane = control_plane(ctx, server).await;
    for service in backends.without_selector() {
        if !ctx.config.scope.contains(&service.namespace) {
            continue;
        }
        let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &service.namespace);
        let params = ListParams::default()
            .labels(&format!("kubernetes.io/service-name={}", service.name))
            .match_any();
        match api.list(&params).await {
            Ok(list) => backends.add_endpoint_slices(service, &list.items),
            Err(error) => {
                tracing::debug!(%error, %service, "EndpointSlices not read: agent egress unrestricted");
            }
        }
    }
}

/// Where an agent's containers must reach besides its backends (its egress NetworkPolicy
/// admits these): the Kubernetes API's endpoints (EndpointSlice
/// `default/kubernetes`, after the Service's DNAT, which is what a NetworkPolicy sees) and
/// Headscale's addresses (`spec.server`, resolved here). Empty when either is unknown: then the
/// agent's egress is not restricted rather than cut off from its control plane.
pub async fn control_plane(ctx: &Context, server: &str) -> Vec<SocketAddr> {
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), "default");
    // From the watch cache (resourceVersion=0): read on every reconcile of every entrance.
    let api = match get_opt_cached(&slices, "kubernetes").await {
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
