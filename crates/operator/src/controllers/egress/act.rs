//! The egress's own act step (I/O): its target Services, applied after the agent's basics
//! and before its key and Deployment (see `agent/act.rs`); Services of removed targets go.

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::DeleteParams;

use super::super::agent::decide::AgentPlan;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::{Watched, apply_cached};
use super::decide::Egress;

pub async fn act(ctx: &Context, plan: &AgentPlan<Egress>) -> Result<(), ReconcileError> {
    let namespace = &plan.owner.namespace;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    for service in &plan.kind.services {
        apply_cached(
            ctx,
            &services,
            namespace,
            service,
            Watched::In(&ctx.caches.services),
        )
        .await?;
    }
    for name in &plan.kind.delete_services {
        match services.delete(name, &DeleteParams::default()).await {
            // The cache can still show a Service that is already gone.
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(ReconcileError::kube("delete Service")(e)),
        }
    }
    Ok(())
}
