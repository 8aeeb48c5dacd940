//! The act step of every agent-backed kind (I/O): applies what `decide` planned, in an order
//! that never starts a pod before what it mounts exists: the agent's ServiceAccount, Role,
//! RoleBinding, state Secret, ConfigMap and NetworkPolicy, then the kind's own objects, then
//! the pre-auth key, then the Deployment.

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::{Watched, apply_cached, apply_in};
use super::decide::{AgentObjects, AgentPlan};
use super::keys::{KeySource, act_on_agent_key};
use super::kind::AgentKind;

pub async fn act<K: AgentKind>(
    ctx: &Context,
    object: &K::Object,
    plan: &AgentPlan<K>,
    keys: &KeySource,
) -> Result<K::Acted, ReconcileError> {
    let namespace = &plan.owner.namespace;
    if let Some(objects) = &plan.objects {
        apply_basics(ctx, namespace, &K::agent_objects(objects)).await?;
    }
    let acted = K::act(ctx, object, plan).await?;
    // The key before the Deployment: a pod started before its auth Secret exists finds no key
    // (TS_AUTHKEY is optional, the Secret goes once the node exists) and waits for an
    // interactive login for a minute (fault e2e test: leader killed mid-apply). Also while
    // nothing is deployed: a spent key is retired once the node exists.
    act_on_agent_key(ctx, object, keys, &plan.owner, &plan.tag, &plan.key).await?;
    if let Some(objects) = &plan.objects
        && !plan.hold_deployment
    {
        apply_deployment(ctx, namespace, K::agent_objects(objects).deployment).await?;
    }
    Ok(acted)
}

/// The objects every agent has besides its Deployment (which is applied last, once
/// everything it mounts exists).
async fn apply_basics(
    ctx: &Context,
    namespace: &str,
    o: &AgentObjects<'_>,
) -> Result<(), ReconcileError> {
    apply_in(ctx, namespace, o.service_account).await?;
    apply_in(ctx, namespace, o.role).await?;
    apply_in(ctx, namespace, o.role_binding).await?;
    apply_in(ctx, namespace, o.state_secret).await?;
    apply_in(ctx, namespace, o.config_map).await?;
    let policies = Api::namespaced(ctx.client.clone(), namespace);
    apply_cached(
        ctx,
        &policies,
        namespace,
        o.network_policy,
        Watched::In(&ctx.caches.network_policies),
    )
    .await?;
    Ok(())
}

/// Applies the agent Deployment (skipped when unchanged and still as applied, per the watch
/// cache).
async fn apply_deployment(
    ctx: &Context,
    namespace: &str,
    deployment: &Deployment,
) -> Result<(), ReconcileError> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let store = &ctx.caches.deployments;
    apply_cached(ctx, &api, namespace, deployment, Watched::In(store))
        .await
        .map(|_| ())
}
