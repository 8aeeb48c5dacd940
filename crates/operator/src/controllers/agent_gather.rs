//! What the gather steps of both agent kinds read about the agent itself: Headscale's node
//! list, the auth Secret, the agent Deployment and the agent's own report.

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::runtime::reflector::ObjectRef;
use tailnet_api::agent_status::StatusReport;
use tailnet_render::meta::Owner;

use super::access::TailnetAccess;
use super::agent_conditions::{NodeList, nodes_unobservable};
use super::agent_report::agent_status;
use super::context::Context;
use super::error::ReconcileError;
use super::identity::{AuthSecret, gather_auth_secret};
use super::kube_io::from_cache_or_get;
use super::status::Problem;

/// The agent as observed.
pub struct AgentObserved {
    pub nodes: NodeList,
    pub auth_secret: AuthSecret,
    pub deployment: Option<Deployment>,
    pub report: Option<StatusReport>,
}

pub async fn gather_agent(
    ctx: &Context,
    access: &TailnetAccess,
    owner: &Owner,
) -> Result<AgentObserved, ReconcileError> {
    let nodes = match &access.headscale {
        Ok(headscale) => ctx
            .nodes
            .get(headscale.server(), || headscale.list_nodes())
            .await
            .map_err(|e| Problem::headscale(&e, format!("listing Headscale nodes failed: {e}"))),
        Err(_) => Err(nodes_unobservable()),
    };
    let auth_secret = gather_auth_secret(ctx, owner).await?;
    let namespace = &owner.namespace;
    let deployment = from_cache_or_get(
        &ctx.caches.deployments,
        &Api::<Deployment>::namespaced(ctx.client.clone(), namespace),
        &ObjectRef::new(&owner.names().base).within(namespace),
    )
    .await
    .map_err(ReconcileError::kube("get Deployment"))?;
    let report = agent_status(ctx, owner, deployment.as_ref()).await;
    Ok(AgentObserved {
        nodes,
        auth_secret,
        deployment,
        report,
    })
}
