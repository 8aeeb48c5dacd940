//! The TailnetEgress controller: one agent per egress (tagged node, Deployment, Services,
//! NetworkPolicy), its pre-auth key, and a status that names the missing precondition.
//! gather → decide (pure) → act → status.

pub mod act;
pub mod decide;
pub mod gather;
pub mod node_views;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, ResourceExt};
use tailnet_api::TailnetEgress;
use tailnet_api::naming::{AgentKind, egress_tag};

use super::context::Context;
use super::error::ReconcileError;
use super::instrument::{backoff_on_error, instrumented};
use super::lifecycle::{FINALIZER, cleanup, ensure_finalizer};
use super::publish::write_status;

const CONTROLLER: &str = "egress";

fn key(e: &TailnetEgress) -> String {
    format!(
        "egress/{}/{}",
        e.namespace().unwrap_or_default(),
        e.name_any()
    )
}

pub async fn reconcile(
    egress: Arc<TailnetEgress>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    instrumented(&ctx, CONTROLLER, &key(&egress), run(egress.clone(), &ctx)).await
}

pub fn error_policy(
    egress: Arc<TailnetEgress>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    backoff_on_error(&ctx, CONTROLLER, &key(&egress), error)
}

async fn run(egress: Arc<TailnetEgress>, ctx: &Context) -> Result<Action, ReconcileError> {
    let namespace = egress.namespace().unwrap_or_default();
    let api: Api<TailnetEgress> = Api::namespaced(ctx.client.clone(), &namespace);
    let previous = egress.status.clone().unwrap_or_default();
    if let Some(status) =
        decide::wrong_namespace(&egress, &ctx.config.operator_namespace, Timestamp::now())
    {
        // Not honoured here: no finalizer, no objects, just say so.
        write_status(ctx, &api, &*egress, &previous, &status).await?;
        return Ok(Action::await_change());
    }
    let egress = ensure_finalizer(&api, egress).await?;
    finalizer(&api, FINALIZER, egress, |event| async move {
        match event {
            finalizer::Event::Apply(e) => reconcile_egress(&e, ctx).await,
            finalizer::Event::Cleanup(e) => {
                let name = e.name_any();
                cleanup(ctx, &*e, AgentKind::Egress, &e.spec.tailnet_ref.name, |t| {
                    Some(egress_tag(&t.spec.policy.tag_prefix, &name))
                })
                .await
            }
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

async fn reconcile_egress(egress: &TailnetEgress, ctx: &Context) -> Result<Action, ReconcileError> {
    let api: Api<TailnetEgress> =
        Api::namespaced(ctx.client.clone(), &egress.namespace().unwrap_or_default());
    let previous = egress.status.clone().unwrap_or_default();
    let poll = Action::requeue(ctx.poll_interval(ctx.egresses.state().len()));
    let decision = match decide::validated(egress, Timestamp::now()) {
        Err(refused) => *refused,
        Ok(valid) => {
            let observed = gather::gather(ctx, egress).await?;
            let decision =
                decide::decide(egress, &valid, &observed, &ctx.config, Timestamp::now())?;
            if let Some(plan) = &decision.agent {
                act::act(ctx, egress, &observed, plan).await?;
            }
            decision
        }
    };
    write_status(ctx, &api, egress, &previous, &decision.status).await?;
    Ok(poll)
}
