//! An agent's end: the finalizer every agent-backed kind carries, and the deletion it guards
//! (stop the agent, forget its identity in Headscale).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tailnet_render::meta::Owner;

use super::super::access::tailnet_access_of;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::publish::event;
use super::keys::forget_identity;
use super::kind::AgentKind;
use super::report::agent_pod_selector;

/// Finalizer that removes the agent's Headscale node and keys before the object goes.
pub const FINALIZER: &str = tailnet_api::FINALIZER;
/// Field manager of the server-side apply that adds [`FINALIZER`].
const FINALIZER_MANAGER: &str = "tailnet-operator-finalizer";
/// How long after its `deletionTimestamp` a deletion waits for the agent's pods to stop (an
/// agent drains for up to its grace period) before it forgets the identity anyway.
const STOP_TIMEOUT: Duration = Duration::from_secs(45);
/// A registration already in flight when the keys were expired can land this much later.
const SECOND_PASS_DELAY: Duration = Duration::from_secs(3);

/// Adds [`FINALIZER`] to an object that is not being deleted and lacks it, and returns the
/// object as the apiserver now has it (the object itself when there is nothing to add).
///
/// kube-runtime's `finalizer` helper adds it with a JSON patch whose `test` compares the
/// finalizer list with the *cached* object's, then ends the reconcile and waits for the
/// watch event to reconcile again. A cache that lags the helper's own earlier write makes the
/// `test` fail (422 Invalid) and the object back off 5 s, 10 s, …; that was suspected to be
/// the tail beyond 400 resources of benchmark 4, but the runs of issue 18 counted no such
/// failure at 400 or 1,000 (the tail was the scheduler's, see `Context::poll_interval`). A
/// server-side apply of only this list item (finalizers are a set) is idempotent and keeps
/// other controllers' finalizers, so a stale cache cannot make it fail, and the reconcile
/// goes on with the answer instead of waiting for the watch: a new resource's first
/// reconcile does its work.
pub async fn ensure_finalizer<K>(api: &Api<K>, object: Arc<K>) -> Result<Arc<K>, ReconcileError>
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let meta = object.meta();
    if meta.deletion_timestamp.is_some() || meta.finalizers.iter().flatten().any(|f| f == FINALIZER)
    {
        return Ok(object);
    }
    let name = object.name_any();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "finalizers": [FINALIZER]},
    });
    let updated = api
        .patch(
            &name,
            &PatchParams::apply(FINALIZER_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(ReconcileError::kube(format!("add finalizer to {name}")))?;
    Ok(Arc::new(updated))
}

/// How long past a terminating pod's own deadline (its `deletionTimestamp`, the end of its
/// grace period) it is taken for stuck (e.g. on a lost node) rather than stopping.
const POD_STUCK_MARGIN: Duration = Duration::from_secs(15);
/// How often a deletion looks again while the agent's pods stop. The reconcile does not wait:
/// a slot held for the whole drain (up to the agent's grace period) starved the other
/// objects of the controller when many were deleted at once (the Gateway API conformance
/// suite deletes ~20 Gateways around one test).
const STOP_RECHECK: Duration = Duration::from_secs(2);

/// Where the agent's stop stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// No pod left.
    Stopped,
    /// Pods are still terminating: look again after this long.
    Stopping(Duration),
    /// Pods are left past every deadline: go on without them (and say so).
    GivenUp,
}

/// Decides the stop (pure). `pod_deadlines`: for each pod left, the end of its grace period
/// (`None`: not yet marked for deletion); `deleting_since`: the object's `deletionTimestamp`
/// (`None` when it is released rather than deleted). Given up when the object's deletion is
/// older than [`STOP_TIMEOUT`], or when every pod is past its own deadline by
/// [`POD_STUCK_MARGIN`].
pub fn stop_progress(
    pod_deadlines: &[Option<Timestamp>],
    deleting_since: Option<Timestamp>,
    now: Timestamp,
) -> Stop {
    if pod_deadlines.is_empty() {
        return Stop::Stopped;
    }
    let past = |at: Timestamp, by: Duration| {
        SignedDuration::try_from(by)
            .ok()
            .and_then(|by| at.checked_add(by).ok())
            .is_some_and(|deadline| now > deadline)
    };
    let object_overdue = deleting_since.is_some_and(|since| past(since, STOP_TIMEOUT));
    let pods_stuck = pod_deadlines
        .iter()
        .all(|deadline| deadline.is_some_and(|at| past(at, POD_STUCK_MARGIN)));
    if object_overdue || pods_stuck {
        Stop::GivenUp
    } else {
        Stop::Stopping(STOP_RECHECK)
    }
}

/// Scales the agent's Deployment to zero and says where the stop stands (one look, no wait).
/// A missing Deployment is already stopped.
async fn stop_agent(
    ctx: &Context,
    owner: &Owner,
    deleting_since: Option<Timestamp>,
) -> Result<Stop, ReconcileError> {
    let name = owner.names().base.clone();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    // A merge patch, not server-side apply: an apply with only `replicas` would drop every
    // other field this manager owns.
    let scale = serde_json::json!({"spec": {"replicas": 0}});
    match deployments
        .patch(&name, &PatchParams::default(), &Patch::Merge(&scale))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Stop::Stopped),
        Err(e) => {
            return Err(ReconcileError::kube(format!(
                "scale Deployment {name} to 0"
            ))(e));
        }
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let left = pods
        .list(&ListParams::default().labels(&agent_pod_selector(owner)))
        .await
        .map_err(ReconcileError::kube(format!("list pods of {name}")))?;
    let deadlines: Vec<Option<Timestamp>> = left
        .items
        .iter()
        .map(|pod| pod.metadata.deletion_timestamp.as_ref().map(|t| t.0))
        .collect();
    let stop = stop_progress(&deadlines, deleting_since, Timestamp::now());
    if stop == Stop::GivenUp {
        tracing::warn!(agent = %name, pods = deadlines.len(), "agent pods still terminating past their deadline; forgetting the identity anyway");
    }
    Ok(stop)
}

/// What a cleanup pass achieved.
#[derive(Debug)]
pub enum Cleanup {
    /// Everything is gone: the finalizer may go.
    Done,
    /// The agent is still stopping: nothing was forgotten yet; reconcile again after this.
    Pending(Duration),
}

/// Deletion of an agent-backed resource: its Headscale node(s) go and unexpired keys of its
/// tag are expired; owned objects go by GC; the Tailnet controller drops grants and DNS
/// entries once the object is gone. Headscale unusable ⇒ the finalizer stays (an orphaned
/// tagged node would keep its identity) and the cleanup is retried with backoff.
pub async fn cleanup<K: AgentKind>(
    ctx: &Context,
    object: &K::Object,
) -> Result<Cleanup, ReconcileError> {
    let deleting_since = object.meta().deletion_timestamp.as_ref().map(|t| t.0);
    let tailnet = K::tailnet_of(ctx, object).await;
    let access = match tailnet_access_of(ctx, tailnet.as_deref()).await {
        Ok(access) => access,
        Err(problem) => {
            tracing::warn!(object = %object.meta().name.clone().unwrap_or_default(), reason = problem.reason, message = %problem.message, "Tailnet gone: nothing to clean up in Headscale");
            return Ok(Cleanup::Done);
        }
    };
    // `None`: the resource never had a tag of its own (its tag is another resource's):
    // nothing in Headscale is ours to delete.
    let all = ctx.kinds.objects::<K::Object>();
    let Some(tag) = K::cleanup_tag(&access.tailnet, object, &all) else {
        tracing::warn!(object = %object.meta().name.clone().unwrap_or_default(), "no tag of its own: leaving Headscale alone");
        return Ok(Cleanup::Done);
    };
    let owner = Owner::from_meta(K::AGENT, object.meta(), &access.tailnet.name_any())?;
    if access.feed.is_some() {
        return cleanup_keyless(ctx, object, &owner, &tag, deleting_since).await;
    }
    let headscale = match &access.headscale {
        Ok(headscale) => headscale,
        Err(problem) => {
            return Err(ReconcileError::HeadscaleUnusable {
                action: format!("clean up node {tag}"),
                reason: problem.reason,
                message: problem.message.clone(),
            });
        }
    };
    // Stop the agent first: a pod that is still running (or still starting) can register a
    // node after its identity was forgotten and leave it behind (seen in the egress e2e
    // test). Garbage collection would only stop it after the finalizer is gone: too late.
    if let Stop::Stopping(after) = stop_agent(ctx, &owner, deleting_since).await? {
        return Ok(Cleanup::Pending(after));
    }
    let hostnames = K::hostnames(&owner.names(), &tag);
    forget_identity(headscale, &tag, &hostnames).await?;
    tokio::time::sleep(SECOND_PASS_DELAY).await;
    forget_identity(headscale, &tag, &hostnames).await?;
    ctx.nodes.invalidate(headscale.server());
    ctx.pre_auth_keys.invalidate(headscale.server());
    // Garbage collection removes the children; a new resource of the same name must not be
    // taken for them.
    ctx.applied
        .forget_prefixed(&owner.namespace, &owner.names().base);
    event(
        ctx,
        object,
        EventType::Normal,
        "Cleaned",
        "Reconcile",
        format!("deleted the Headscale node(s) and expired the keys of {tag}"),
    )
    .await;
    Ok(Cleanup::Done)
}

/// Deletion without a Headscale key (a contributor fed by the owner): the agent is stopped and
/// nothing is asked of Headscale. The owner expires the tag's unused keys once the tag leaves
/// the fragment; the node stays registered (offline, its grants gone) until a Headscale admin
/// deletes it.
async fn cleanup_keyless<O>(
    ctx: &Context,
    object: &O,
    owner: &Owner,
    tag: &str,
    deleting_since: Option<Timestamp>,
) -> Result<Cleanup, ReconcileError>
where
    O: kube::Resource<DynamicType = ()>,
{
    if let Stop::Stopping(after) = stop_agent(ctx, owner, deleting_since).await? {
        return Ok(Cleanup::Pending(after));
    }
    ctx.applied
        .forget_prefixed(&owner.namespace, &owner.names().base);
    event(
        ctx,
        object,
        EventType::Normal,
        "Cleaned",
        "Reconcile",
        format!(
            "stopped the agent of {tag}; this installation holds no Headscale key: the owner expires the tag's unused pre-auth keys once it leaves the fragment, and its node stays in Headscale (offline) until an admin deletes it"
        ),
    )
    .await;
    Ok(Cleanup::Done)
}

/// An object the controller handled and no longer takes on (e.g. a Service whose
/// `loadBalancerClass` went away): while it carries [`FINALIZER`], its agent is stopped and
/// its identity forgotten ([`cleanup`]), the agent's objects are deleted (they are owned by an
/// object that stays), the status the controller wrote is withdrawn, then the finalizer goes.
/// Objects without the finalizer are not touched at all.
pub async fn release<K: AgentKind>(
    ctx: &Context,
    api: &Api<K::Object>,
    object: &K::Object,
) -> Result<Action, ReconcileError> {
    let meta = object.meta();
    if !meta.finalizers.iter().flatten().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if let Cleanup::Pending(after) = cleanup::<K>(ctx, object).await? {
        return Ok(Action::requeue(after));
    }
    let tailnet = K::tailnet_of(ctx, object).await;
    if let Ok(access) = tailnet_access_of(ctx, tailnet.as_deref()).await {
        let owner = Owner::from_meta(K::AGENT, meta, &access.tailnet.name_any())?;
        delete_agent_objects(ctx, &owner).await?;
    }
    let previous = K::status(object).cloned().unwrap_or_default();
    let released = K::released(&previous);
    super::super::publish::write_status(ctx, api, object, &previous, &released).await?;
    remove_finalizer(api, object).await?;
    event(
        ctx,
        object,
        EventType::Normal,
        "Released",
        "Reconcile",
        "no longer handled by tailnet-operator: its agent, tailnet node and status entries are gone"
            .to_string(),
    )
    .await;
    Ok(Action::await_change())
}

/// Removes [`FINALIZER`] (other controllers' finalizers stay). The patch carries the
/// object's `resourceVersion`: a list changed meanwhile makes it fail and be retried rather
/// than drop a finalizer added since.
pub async fn remove_finalizer<O>(api: &Api<O>, object: &O) -> Result<(), ReconcileError>
where
    O: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let meta = object.meta();
    let name = object.name_any();
    let finalizers: Vec<&String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .collect();
    let patch = serde_json::json!({
        "metadata": {"finalizers": finalizers, "resourceVersion": meta.resource_version},
    });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::kube(format!(
            "remove finalizer from {name}"
        )))?;
    Ok(())
}

/// Deletes the agent's objects by name (a missing one is already gone).
async fn delete_agent_objects(ctx: &Context, owner: &Owner) -> Result<(), ReconcileError> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let names = owner.names();
    let ns = &owner.namespace;
    delete::<Deployment>(ctx, ns, &names.base).await?;
    delete::<NetworkPolicy>(ctx, ns, &names.base).await?;
    delete::<RoleBinding>(ctx, ns, &names.base).await?;
    delete::<Role>(ctx, ns, &names.base).await?;
    delete::<ServiceAccount>(ctx, ns, &names.base).await?;
    delete::<ConfigMap>(ctx, ns, &names.config).await?;
    for secret in [&names.state_secret, &names.auth_secret, &names.tls] {
        delete::<Secret>(ctx, ns, secret).await?;
    }
    super::super::ingress::act::delete_in_cluster_service(ctx, owner).await?;
    ctx.applied.forget_prefixed(ns, &names.base);
    Ok(())
}

async fn delete<T>(ctx: &Context, namespace: &str, name: &str) -> Result<(), ReconcileError>
where
    T: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<T> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(ReconcileError::kube(format!(
            "delete {} {namespace}/{name}",
            T::kind(&())
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("timestamp")
    }

    #[test]
    fn no_pod_left_is_stopped_whatever_the_deadlines() {
        assert_eq!(stop_progress(&[], None, at(0)), Stop::Stopped);
        assert_eq!(stop_progress(&[], Some(at(-1000)), at(0)), Stop::Stopped);
    }

    #[test]
    fn terminating_pods_are_waited_for_without_holding_the_reconcile() {
        // Deleted 10 s ago, the pod's grace period ends in 15 s.
        assert_eq!(
            stop_progress(&[Some(at(15))], Some(at(-10)), at(0)),
            Stop::Stopping(STOP_RECHECK)
        );
        // A pod not yet marked for deletion (the ReplicaSet has not caught up) is waited for.
        assert_eq!(
            stop_progress(&[None], Some(at(-10)), at(0)),
            Stop::Stopping(STOP_RECHECK)
        );
    }

    #[test]
    fn a_deletion_older_than_the_stop_timeout_goes_on_without_the_pods() {
        let timeout = STOP_TIMEOUT.as_secs() as i64;
        assert_eq!(
            stop_progress(&[None], Some(at(-timeout)), at(0)),
            Stop::Stopping(STOP_RECHECK),
            "exactly at the deadline: still waiting"
        );
        assert_eq!(
            stop_progress(&[None], Some(at(-timeout - 1)), at(0)),
            Stop::GivenUp
        );
    }

    #[test]
    fn a_release_gives_up_only_when_every_pod_is_stuck_past_its_grace() {
        let margin = POD_STUCK_MARGIN.as_secs() as i64;
        // No deletionTimestamp of the object (released, not deleted).
        assert_eq!(
            stop_progress(&[Some(at(-margin - 1))], None, at(0)),
            Stop::GivenUp
        );
        assert_eq!(
            stop_progress(&[Some(at(-margin - 1)), Some(at(-1))], None, at(0)),
            Stop::Stopping(STOP_RECHECK),
            "one pod is still within its grace margin"
        );
        assert_eq!(
            stop_progress(&[Some(at(-margin - 1)), None], None, at(0)),
            Stop::Stopping(STOP_RECHECK),
            "one pod is not marked for deletion yet"
        );
    }
}
