//! The gather step of every agent-backed kind (I/O): the Tailnet and its Headscale client,
//! then what every agent shares (Headscale's node list, the auth Secret, the agent
//! Deployment, the agent's own report), then the kind's own reads.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tailnet_headscale::Node;
use tailnet_render::meta::Owner;

use super::super::access::{TailnetAccess, tailnet_access_of};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::from_cache_or_get;
use super::super::status::Problem;
use super::super::tailnet::feed::node_of;
use super::keys::{KeySource, gather_auth_secret};
use super::kind::{AgentKind, GatherInput};
use super::observation::{AgentObserved, NodeList, Observation, nodes_unobservable};
use super::report::agent_status;

/// Everything `decide` needs of one object, read once, and where the act step gets keys
/// (this installation's Headscale client, or the owner's feed without a key).
pub async fn gather<K: AgentKind>(
    ctx: &Context,
    object: &K::Object,
    intent: &K::Intent,
) -> Result<(Observation<K::Observed>, KeySource), ReconcileError> {
    let tailnet = K::tailnet_of(ctx, object).await;
    let access = match tailnet_access_of(ctx, tailnet.as_deref()).await {
        Ok(access) => access,
        Err(problem) => {
            return Ok((Observation::only_access(Err(problem)), KeySource::Unusable));
        }
    };
    let owner = Owner::from_meta(K::AGENT, object.meta(), &access.tailnet.name_any())?;
    let agent = gather_agent(ctx, &access, &owner).await?;
    let input = GatherInput {
        access: &access,
        owner: &owner,
        agent: &agent,
    };
    let kind = K::gather(ctx, object, intent, input).await?;
    let observation = Observation {
        access: Ok(access.view()),
        agent,
        kind,
    };
    let keys = match (&access.feed, access.headscale) {
        (Some(Ok(feed)), _) => KeySource::Owner(feed.clone()),
        (None, Ok(client)) => KeySource::Headscale(Box::new(client)),
        _ => KeySource::Unusable,
    };
    Ok((observation, keys))
}

/// Headscale's node list (shared, see `SharedList`), or the owner's feed without a key.
async fn list_nodes(ctx: &Context, access: &TailnetAccess) -> NodeList {
    match (&access.feed, &access.headscale) {
        // Without a key: the nodes the owner wrote into the feed.
        (Some(Ok(feed)), _) => Ok(Arc::new(feed.nodes.iter().map(node_of).collect())),
        (Some(Err(_)), _) | (None, Err(_)) => Err(nodes_unobservable()),
        (None, Ok(headscale)) => ctx
            .nodes
            .get(headscale.server(), || headscale.list_nodes())
            .await
            .map_err(|e| Problem::headscale(&e, format!("listing Headscale nodes failed: {e}"))),
    }
}

/// Whether the list has an online node with one of the agent's tailnet IPs.
fn shows_online(nodes: &[Node], agent_ips: &[String]) -> bool {
    nodes
        .iter()
        .any(|n| n.online && n.ip_addresses.iter().any(|ip| agent_ips.contains(ip)))
}

/// What every agent shares, as observed.
async fn gather_agent(
    ctx: &Context,
    access: &TailnetAccess,
    owner: &Owner,
) -> Result<AgentObserved, ReconcileError> {
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
    let mut nodes = list_nodes(ctx, access).await;
    // The shared list may be up to its TTL old: when the agent says it is on the tailnet but
    // the list does not show its node online, the list predates that (the reconcile was
    // woken by the pod turning ready). Asked again once, not left for the next poll.
    if let (Some(report), Ok(listed), (None, Ok(headscale))) =
        (&report, &nodes, (&access.feed, &access.headscale))
        && report.tailnet.connected
        && !shows_online(listed, &report.tailnet.tailnet_ips)
    {
        ctx.nodes.invalidate(headscale.server());
        nodes = list_nodes(ctx, access).await;
    }
    Ok(AgentObserved {
        nodes,
        auth_secret,
        deployment,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::super::super::test_fixtures as fx;
    use super::*;

    #[test]
    fn a_list_shows_the_agent_online_only_with_an_online_node_of_its_ips() {
        let ips = vec!["100.64.0.7".to_string(), "fd7a:115c:a1e0::7".to_string()];
        let online = fx::node(7, "tailnet-egress-a", "tag:a", true, &["100.64.0.7"]);
        let offline = fx::node(7, "tailnet-egress-a", "tag:a", false, &["100.64.0.7"]);
        let other = fx::node(8, "tailnet-egress-b", "tag:b", true, &["100.64.0.8"]);
        assert!(shows_online(&[other.clone(), online], &ips));
        assert!(
            !shows_online(&[other.clone(), offline], &ips),
            "stale: offline"
        );
        assert!(!shows_online(&[other], &ips), "stale: not listed yet");
        assert!(!shows_online(&[], &[]));
    }
}
