//! The TailnetIngress controller: one agent per ingress in the application's namespace,
//! names from the Tailnet's templates, a certificate that must cover every http name before
//! http is served, grants from `allowFrom`, and a status that names the missing precondition.
//! gather → decide (pure) → act → status.

pub mod act;
pub mod decide;
pub mod gather;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::{Api, ResourceExt};
use tailnet_api::TailnetIngress;
use tailnet_api::naming::AgentKind;
use tailnet_render::intent::Claim;

use super::context::Context;
use super::error::ReconcileError;
use super::instrument::{backoff_on_error, instrumented};
use super::lifecycle::{FINALIZER, cleanup, ensure_finalizer};
use super::publish::write_status;

const CONTROLLER: &str = "ingress";

fn key(i: &TailnetIngress) -> String {
    format!(
        "ingress/{}/{}",
        i.namespace().unwrap_or_default(),
        i.name_any()
    )
}

pub async fn reconcile(
    ingress: Arc<TailnetIngress>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    instrumented(&ctx, CONTROLLER, &key(&ingress), run(ingress.clone(), &ctx)).await
}

pub fn error_policy(
    ingress: Arc<TailnetIngress>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    backoff_on_error(&ctx, CONTROLLER, &key(&ingress), error)
}

async fn run(ingress: Arc<TailnetIngress>, ctx: &Context) -> Result<Action, ReconcileError> {
    let api: Api<TailnetIngress> =
        Api::namespaced(ctx.client.clone(), &ingress.namespace().unwrap_or_default());
    let ingress = ensure_finalizer(&api, ingress).await?;
    finalizer(&api, FINALIZER, ingress, |event| async move {
        match event {
            finalizer::Event::Apply(i) => reconcile_ingress(&i, ctx).await,
            finalizer::Event::Cleanup(i) => {
                let all: Vec<_> = ctx.ingresses.state();
                cleanup(
                    ctx,
                    &*i,
                    AgentKind::Ingress,
                    &i.spec.tailnet_ref.name,
                    |t| own_tag(t, &i, all.iter().map(|o| &**o)),
                )
                .await
            }
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

/// The tag whose nodes and keys are this ingress's to delete: the one its status records when
/// that is one of its own forms, else the one the assignment gives it; `None` when it has
/// none of its own (then nothing in Headscale is deleted on its behalf).
fn own_tag<'a>(
    tailnet: &tailnet_api::Tailnet,
    ingress: &'a TailnetIngress,
    all: impl Iterator<Item = &'a TailnetIngress>,
) -> Option<String> {
    let others: Vec<Claim> = all.map(Claim::of_ingress).collect();
    tailnet_render::claims::ingress_tag_of(
        &tailnet.name_any(),
        &tailnet.spec.policy.tag_prefix,
        &Claim::of_ingress(ingress),
        &others,
    )
    .ok()
}

async fn reconcile_ingress(
    ingress: &TailnetIngress,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let api: Api<TailnetIngress> =
        Api::namespaced(ctx.client.clone(), &ingress.namespace().unwrap_or_default());
    let previous = ingress.status.clone().unwrap_or_default();
    let poll = Action::requeue(ctx.poll_interval(ctx.ingresses.state().len()));
    let status = match decide::validated(ingress, Timestamp::now()) {
        Err(refused) => refused.status,
        Ok(valid) => {
            let observed = gather::gather(ctx, ingress, &valid).await?;
            let now = Timestamp::now();
            let decision = decide::decide(ingress, &valid, &observed, &ctx.config, now)?;
            match &decision.agent {
                Some(plan) => {
                    let acted = act::act(ctx, ingress, &observed, plan).await?;
                    match acted.certificate_error {
                        Some(error) => {
                            decide::certificate_not_created(ingress, &decision.status, &error, now)
                        }
                        None => decision.status,
                    }
                }
                None => decision.status,
            }
        }
    };
    write_status(ctx, &api, ingress, &previous, &status).await?;
    Ok(poll)
}
