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

/// What the act step did that the reconcile's timing depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wrote {
    /// The agent's config changed: the agent re-reads it and probes what is new by itself.
    pub agent_config: bool,
}

pub async fn act<K: AgentKind>(
    ctx: &Context,
    object: &K::Object,
    plan: &AgentPlan<K>,
    keys: &KeySource,
) -> Result<(K::Acted, Wrote), ReconcileError> {
    let namespace = &plan.owner.namespace;
    let mut wrote = Wrote::default();
    if let Some(objects) = &plan.objects {
        wrote.agent_config = apply_basics(ctx, namespace, &K::agent_objects(objects)).await?;
    }
    let acted = K::act(ctx, object, plan).await?;
    // The key before the Deployment: a pod started before its auth Secret exists finds no
    // login config (the volume is optional, the Secret goes once the node exists) and waits
    // for an interactive login (fault e2e test: leader killed mid-apply). Also while nothing
    // is deployed: a spent key is retired once the node exists.
    let login = plan
        .objects
        .as_ref()
        .map(|objects| K::agent_objects(objects).login);
    act_on_agent_key(ctx, object, keys, &plan.owner, &plan.tag, &plan.key, login).await?;
    if let Some(objects) = &plan.objects
        && !plan.hold_deployment
    {
        apply_deployment(ctx, namespace, K::agent_objects(objects).deployment).await?;
    }
    Ok((acted, wrote))
}

/// The objects every agent has besides its Deployment (which is applied last, once
/// everything it mounts exists). Returns whether the agent's config was written.
async fn apply_basics(
    ctx: &Context,
    namespace: &str,
    o: &AgentObjects<'_>,
) -> Result<bool, ReconcileError> {
    apply_in(ctx, namespace, o.service_account).await?;
    apply_in(ctx, namespace, o.role).await?;
    apply_in(ctx, namespace, o.role_binding).await?;
    apply_in(ctx, namespace, o.state_secret).await?;
    let config_maps = Api::namespaced(ctx.client.clone(), namespace);
    let config_written = apply_cached(ctx, &config_maps, namespace, o.config_map, Watched::No)
        .await?
        .is_some();
    let policies = Api::namespaced(ctx.client.clone(), namespace);
    apply_cached(
        ctx,
        &policies,
        namespace,
        o.network_policy,
        Watched::In(&ctx.caches.network_policies),
    )
    .await?;
    Ok(config_written)
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
