//! Act step of the Tailnet controller: publishes the rendered policy, feeds Headscale's
//! answers to the pure steps of `decide` (check, then maybe PUT), approves routes, writes the
//! DNS ConfigMap and records the metrics.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;
use tailnet_api::tailnet::TailnetStatus;
use tailnet_headscale::Client as HeadscaleClient;
use tailnet_policy::RouteApproval;

use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::{Watched, apply, apply_cached};
use super::super::publish::event;
use super::super::status::Problem;
use super::decide::{self, Answer, PolicyOutcome, PolicyStep, PolicySync, Refusal, TailnetPlan};
use super::observation::TailnetObservation;
use crate::metrics::{ConditionLabels, TailnetLabels};

/// A Headscale call's result as the pure steps take it.
fn answer<T>(result: Result<T, tailnet_headscale::Error>) -> Answer {
    result.map(|_| ()).map_err(refusal)
}

fn refusal(error: tailnet_headscale::Error) -> Refusal {
    match error {
        tailnet_headscale::Error::Api { message, .. } => Refusal::Rejected(message),
        e => Refusal::Failed(Problem::headscale(&e, e.to_string())),
    }
}

/// The Events `plan` decided from the observation alone.
pub async fn plan_events(ctx: &Context, tailnet: &Tailnet, plan: &TailnetPlan) {
    for e in &plan.events {
        event(ctx, tailnet, e.type_, e.reason, e.action, e.note.clone()).await;
    }
}

fn labels(tailnet: &Tailnet) -> TailnetLabels {
    TailnetLabels {
        tailnet: tailnet.name_any(),
    }
}

/// Reachability and policy size, as soon as they are known.
pub fn plan_metrics(
    ctx: &Context,
    tailnet: &Tailnet,
    observed: &TailnetObservation,
    plan: &TailnetPlan,
) {
    let labels = labels(tailnet);
    ctx.metrics
        .headscale_reachable
        .get_or_create(&labels)
        .set(i64::from(observed.headscale.is_ok()));
    match observed.api_key.as_ref().and_then(|k| k.expiration) {
        Some(expiration) => {
            ctx.metrics
                .api_key_expiry
                .get_or_create(&labels)
                .set(expiration.as_second());
        }
        None => {
            ctx.metrics.api_key_expiry.remove(&labels);
        }
    }
    if let Some(rendered) = &plan.rendered {
        ctx.metrics
            .policy_size_bytes
            .get_or_create(&labels)
            .set(i64::try_from(rendered.document.len()).unwrap_or(i64::MAX));
    }
}

/// Asks Headscale to check the merged document; when it refuses it, checks it again without
/// each contributor's entries in turn (`plan.exclusions`) and, at the first one it accepts,
/// makes that the plan ([`decide::exclude`]): the contributor is left out and named, the
/// owner's own changes go on. The answer for the document now in `plan.sync`.
async fn check_or_exclude(
    tailnet: &Tailnet,
    client: &HeadscaleClient,
    plan: &mut TailnetPlan,
) -> Option<Answer> {
    let sync = plan.sync.as_ref()?;
    let check = answer(client.check_policy(&sync.document).await);
    let Err(Refusal::Rejected(reason)) = &check else {
        return Some(check);
    };
    for (index, exclusion) in plan.exclusions.iter().enumerate() {
        if answer(client.check_policy(&exclusion.sync.document).await).is_ok() {
            tracing::warn!(
                tailnet = %tailnet.name_any(),
                contributors = %exclusion.contributors.join(", "),
                %reason,
                "Headscale refused the merged policy; leaving out these contributors' entries"
            );
            let reason = reason.clone();
            decide::exclude(plan, index, &reason);
            return Some(Ok(()));
        }
    }
    Some(check)
}

/// Asks Headscale to check the document (leaving out a contributor whose entries it refuses,
/// see [`check_or_exclude`]), publishes the rendered-policy ConfigMap, PUTs the document
/// when `decide` says so. `None`: there was nothing to compare (no sync or no client).
pub async fn sync_policy(
    ctx: &Context,
    tailnet: &Tailnet,
    client: Option<&HeadscaleClient>,
    plan: &mut TailnetPlan,
    previous: &TailnetStatus,
) -> Option<PolicyOutcome> {
    let client = client?;
    let check = check_or_exclude(tailnet, client, plan).await?;
    let sync = plan.sync.as_ref()?;
    // A debugging copy: failing to write it must not stop the sync itself.
    if let Err(error) = write_rendered_policy(ctx, sync).await {
        tracing::warn!(tailnet = %tailnet.name_any(), %error, "writing the rendered-policy ConfigMap failed; syncing the policy anyway");
    }
    let outcome = match decide::after_check(sync, check, previous) {
        PolicyStep::Done(outcome) => outcome,
        PolicyStep::Put { event } => {
            // The check took a while: an edit made since gather must not be overwritten
            // unreported. Read the live document again right before writing.
            let fresh = match client.get_policy().await {
                Ok(policy) => Ok(policy.policy),
                Err(e) => Err(refusal(e)),
            };
            let (sync, step) = decide::before_put(sync, event, fresh, previous);
            match step {
                PolicyStep::Done(outcome) => outcome,
                PolicyStep::Put { event } => {
                    let set = answer(client.set_policy(&sync.document).await);
                    decide::after_set(&sync, event, set)
                }
            }
        }
    };
    if let Some(result) = outcome.metric {
        ctx.metrics.policy_sync(&tailnet.name_any(), result);
    }
    if let Some(e) = &outcome.event {
        event(ctx, tailnet, e.type_, e.reason, e.action, e.note.clone()).await;
    }
    Some(outcome)
}

/// Written on every reconcile of the Tailnet: sent only when it changed (see applied.rs).
async fn write_rendered_policy(ctx: &Context, sync: &PolicySync) -> Result<(), ReconcileError> {
    let ns = &ctx.config.operator_namespace;
    apply_cached(
        ctx,
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
        ns,
        &sync.config_map,
        Watched::No,
    )
    .await
    .map(|_| ())
}

/// The route approval catch-up (autoApprovers only fire when a route changes). A failed
/// approval is logged and retried on the next poll.
pub async fn approve_routes(
    ctx: &Context,
    tailnet: &Tailnet,
    client: Option<&HeadscaleClient>,
    approvals: &[RouteApproval],
) {
    let Some(client) = client else {
        return;
    };
    for approval in approvals {
        match client
            .approve_routes(approval.node_id, &approval.approved_routes)
            .await
        {
            Ok(_) => {
                ctx.metrics
                    .routes_approved
                    .get_or_create(&labels(tailnet))
                    .inc_by(approval.added.len() as u64);
                event(
                    ctx,
                    tailnet,
                    EventType::Normal,
                    "RoutesApproved",
                    "ApproveRoutes",
                    decide::routes_approved_note(approval),
                )
                .await;
            }
            Err(e) => {
                tracing::warn!(tailnet = %tailnet.name_any(), node = approval.node_id, error = %e, "approving routes failed")
            }
        }
    }
}

/// Applies the DNS ConfigMap when `decide` says our keys changed.
pub async fn write_dns(ctx: &Context, plan: &TailnetPlan) -> Result<(), ReconcileError> {
    let Some(cm) = &plan.dns else {
        return Ok(());
    };
    let namespace = cm.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    apply(&api, &cm.name_any(), cm).await.map(|_| ())
}

/// Publishes a contributor's fragment, and the owner's store of accepted fragments when it
/// changed (both in the operator namespace, owned by the Tailnet).
pub async fn write_contributions(ctx: &Context, plan: &TailnetPlan) -> Result<(), ReconcileError> {
    let ns = &ctx.config.operator_namespace;
    for cm in plan.fragment.iter().chain(plan.contribution_store.iter()) {
        apply_cached(
            ctx,
            &Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
            ns,
            cm,
            Watched::No,
        )
        .await?;
    }
    Ok(())
}

/// `resources_by_condition` for every condition of the status to be written.
pub fn condition_metrics(ctx: &Context, status: &TailnetStatus) {
    for c in &status.conditions {
        ctx.metrics
            .resources_by_condition
            .get_or_create(&ConditionLabels {
                kind: "Tailnet".to_string(),
                condition: c.type_.clone(),
                status: c.status.clone(),
            })
            .set(1);
    }
}

/// A contributor without a Headscale key: creates Secret `<tailnet>-owner-keys` (empty,
/// owned by the Tailnet) when it does not exist, so that the owner, whose Role there allows
/// only `get`, `update` and `patch` on that one name, can write its feed. Never overwrites it.
pub async fn ensure_owner_keys_secret(
    ctx: &Context,
    tailnet: &Tailnet,
) -> Result<(), ReconcileError> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    use kube::runtime::reflector::ObjectRef;
    let ns = &ctx.config.operator_namespace;
    let name = tailnet_api::owner_feed::owner_keys_secret(&tailnet.name_any());
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let existing = super::super::kube_io::from_cache_or_get(
        &ctx.caches.operator_secrets,
        &api,
        &ObjectRef::new(&name).within(ns),
    )
    .await
    .map_err(ReconcileError::kube(format!("get Secret {name}")))?;
    if existing.is_some() {
        return Ok(());
    }
    let secret = Secret {
        metadata: super::contributions::owned_meta(tailnet, &ctx.config, name.clone()),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(ReconcileError::kube(format!("create Secret {name}"))(e)),
    }
}
