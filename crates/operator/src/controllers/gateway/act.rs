//! The Gateway's own act step (I/O): the copy of its certificate Secrets (before the agent's
//! Deployment mounts it), the in-cluster Service (split horizon) and the routes'
//! `status.parents` entries for this Gateway.

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tailnet_api::FIELD_MANAGER;
use tailnet_gateway_api::{HTTPRoute, TCPRoute, TLSRoute};
use tailnet_render::gateway::RouteKind;

use super::super::agent::decide::AgentPlan;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::apply_in;
use super::decide::{GatewayEntrance, RouteStatusWrite};

pub async fn act(ctx: &Context, plan: &AgentPlan<GatewayEntrance>) -> Result<(), ReconcileError> {
    if let Some(secret) = plan.objects.as_ref().and_then(|o| o.certificates.as_ref()) {
        apply_in(ctx, &plan.owner.namespace, secret).await?;
    }
    // Split horizon: the in-cluster Service while the class lists in-cluster namespaces.
    super::super::ingress::act::in_cluster_service(
        ctx,
        &plan.owner,
        plan.objects.as_ref().map(|o| &o.agent),
    )
    .await?;
    for write in &plan.kind.routes {
        let result = match write.route.kind {
            RouteKind::HTTPRoute => write_route_status::<HTTPRoute>(ctx, write).await,
            RouteKind::TLSRoute => write_route_status::<TLSRoute>(ctx, write).await,
            RouteKind::TCPRoute => write_route_status::<TCPRoute>(ctx, write).await,
        };
        match result {
            Ok(()) => {}
            // Changed since it was read: the next reconcile (triggered by that change) writes.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(route = %write.route.name, "route changed while its status was written; retried on the next reconcile");
            }
            Err(e) => {
                return Err(ReconcileError::kube("patch route status")(e));
            }
        }
    }
    Ok(())
}

/// Server-side applies `status.parents` (the whole list: the schema keeps it atomic) with the
/// route's resourceVersion, so another controller's entry written meanwhile is never lost.
async fn write_route_status<K>(ctx: &Context, write: &RouteStatusWrite) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &write.route.namespace);
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {
            "name": write.route.name,
            "resourceVersion": write.resource_version,
        },
        "status": {"parents": write.parents},
    });
    api.patch_status(
        &write.route.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}
