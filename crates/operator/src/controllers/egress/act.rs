//! Act step of the TailnetEgress controller: applies what `decide` planned, in an order that
//! never starts a pod before what it mounts exists.

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::DeleteParams;
use tailnet_api::TailnetEgress;

use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::identity::act_on_agent_key;
use super::super::kube_io::{AgentBasics, Watched, apply_basics, apply_cached, apply_deployment};
use super::decide::AgentPlan;
use super::gather::EgressObservation;

pub async fn act(
    ctx: &Context,
    egress: &TailnetEgress,
    observed: &EgressObservation,
    plan: &AgentPlan,
) -> Result<(), ReconcileError> {
    let namespace = &plan.owner.namespace;
    let objects = &plan.objects;
    apply_basics(
        ctx,
        namespace,
        AgentBasics {
            service_account: &objects.service_account,
            role: &objects.role,
            role_binding: &objects.role_binding,
            state_secret: &objects.state_secret,
            config_map: &objects.config_map,
            network_policy: &objects.network_policy,
        },
    )
    .await?;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    for service in &plan.services {
        apply_cached(
            ctx,
            &services,
            namespace,
            service,
            Watched::In(&ctx.caches.services),
        )
        .await?;
    }
    for name in &plan.delete_services {
        match services.delete(name, &DeleteParams::default()).await {
            // The cache can still show a Service that is already gone.
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(ReconcileError::kube("delete Service")(e)),
        }
    }
    // The key before the Deployment: a pod started before its auth Secret exists finds no key
    // (TS_AUTHKEY is optional, the Secret goes once the node exists) and waits for an
    // interactive login for a minute (fault e2e test: leader killed mid-apply).
    act_on_agent_key(
        ctx,
        egress,
        &observed.access,
        &plan.owner,
        &plan.tag,
        &plan.key,
    )
    .await?;
    apply_deployment(ctx, namespace, &objects.deployment).await
}
