//! The Tailnet controller: Headscale reachability, the base policy, the rendered policy
//! (DryRun/Apply with ownership), route approval catch-up, DNS entries and which grants are
//! live. Triggered by the Tailnet, its Secret and ConfigMaps, every TailnetEgress/Ingress that
//! references it, their Services, and a poll interval for Headscale's own state.
//! gather → decide (pure steps, fed Headscale's answers by act) → act → status.

pub mod act;
pub mod contributions;
pub mod decide;
pub mod deliver;
pub mod dns;
pub mod effective;
pub mod feed;
pub mod gather;
pub mod kubeconfig;
pub mod locations;
pub mod observation;
pub mod role;
#[cfg(test)]
mod tests;
pub mod wiring;

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;

use super::context::Context;
use super::error::ReconcileError;
use super::instrument::{backoff_on_error, instrumented};
use super::publish::write_status;

const CONTROLLER: &str = "tailnet";

fn key(tailnet: &Tailnet) -> String {
    format!("tailnet/{}", tailnet.name_any())
}

pub async fn reconcile(tailnet: Arc<Tailnet>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    instrumented(
        &ctx,
        CONTROLLER,
        &key(&tailnet),
        reconcile_tailnet(&tailnet, &ctx),
    )
    .await
}

pub fn error_policy(tailnet: Arc<Tailnet>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    backoff_on_error(&ctx, CONTROLLER, &key(&tailnet), error)
}

async fn reconcile_tailnet(tailnet: &Tailnet, ctx: &Context) -> Result<Action, ReconcileError> {
    let api: Api<Tailnet> = Api::all(ctx.client.clone());
    let previous = tailnet.status.clone().unwrap_or_default();
    let poll = Action::requeue(ctx.config.headscale_poll);
    if let Some(status) = decide::refuse_invalid(tailnet, Timestamp::now()) {
        write_status(ctx, &api, tailnet, &previous, &status).await?;
        return Ok(poll);
    }
    if tailnet.spec.api_secret_ref.is_none()
        && role::Role::of(&tailnet.spec.policy) == role::Role::Contributor
    {
        act::ensure_owner_keys_secret(ctx, tailnet).await?;
    }
    let (observed, client) = gather::gather(ctx, tailnet).await?;
    let mut plan = decide::plan(tailnet, &observed, &ctx.config, Timestamp::now());
    act::plan_metrics(ctx, tailnet, &observed, &plan);
    act::plan_events(ctx, tailnet, &plan).await;
    let outcome = act::sync_policy(ctx, tailnet, client.as_ref(), &mut plan, &previous).await;
    decide::keep_store_unless_accepted(&mut plan, outcome.as_ref());
    let approvals = decide::approvals_after(&plan, outcome.as_ref());
    act::approve_routes(ctx, tailnet, client.as_ref(), approvals).await;
    // Keyless contributors: their agents' keys and node facts, through their kubeconfig.
    let version = observed.headscale.as_ref().ok().map(String::as_str);
    let delivered = deliver::deliver(
        ctx,
        tailnet,
        client.as_ref(),
        &plan,
        outcome.as_ref(),
        version,
    )
    .await;
    // The status is written whatever becomes of the DNS and store writes (one failed write
    // must not freeze the owner's status); their first error is returned afterwards, so the
    // reconcile is retried with backoff.
    let dns_written = act::write_dns(ctx, &plan).await;
    let store_written = act::write_contributions(ctx, &plan).await;
    let mut status = decide::finish(plan, outcome.as_ref());
    deliver::record(&mut status, &delivered);
    act::condition_metrics(ctx, &status);
    write_status(ctx, &api, tailnet, &previous, &status).await?;
    dns_written?;
    store_written?;
    Ok(poll)
}
