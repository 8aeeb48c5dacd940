//! Reads an agent's own report (`GET /status` on its admin port) for the gather step.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tailnet_api::agent_status::StatusReport;
use tailnet_render::meta::Owner;

use super::context::Context;

/// The label selector of an agent's pods.
pub fn agent_pod_selector(owner: &Owner) -> String {
    owner
        .selector_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads the agent's `/status` from its running pod (admin port on the pod IP). `None` when
/// no pod runs or it does not answer (e.g. a NetworkPolicy keeps the operator out):
/// reachability is then reported as not observed, never guessed.
pub async fn agent_status(ctx: &Context, owner: &Owner) -> Option<StatusReport> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = agent_pod_selector(owner);
    // Served from the apiserver's watch cache (no etcd read on every poll).
    let list = pods
        .list(
            &kube::api::ListParams::default()
                .labels(&selector)
                .match_any(),
        )
        .await
        .ok()?;
    let ip = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| p.status.as_ref()?.pod_ip.clone())?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    let url = format!(
        "http://{host}:{}/status",
        tailnet_api::agent_config::ADMIN_PORT
    );
    let response = ctx.agent_http.get(&url).send().await.ok()?;
    response.json().await.ok()
}
