//! The reconcile of every agent-backed kind (I/O), generic over the kind: admission,
//! finalizer, then gather → decide (pure) → act → status, or the cleanup on deletion; with the
//! reconcile metrics, the per-object backoff and the poll interval.

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};

use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::instrument::{backoff_on_error, instrumented};
use super::super::publish::write_status;
use super::act::act;
use super::decide::{Admission, decide, validated};
use super::gather::gather;
use super::kind::AgentKind;
use super::lifecycle::{Cleanup, FINALIZER, cleanup, ensure_finalizer, release, remove_finalizer};

/// The object's key in metrics, logs and the backoff table: `<controller>/<namespace>/<name>`.
fn key<K: AgentKind>(object: &K::Object) -> String {
    format!(
        "{}/{}/{}",
        K::CONTROLLER,
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

pub async fn reconcile<K: AgentKind>(
    object: Arc<K::Object>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let key = key::<K>(&object);
    instrumented(&ctx, K::CONTROLLER, &key, run::<K>(object, &ctx)).await
}

pub fn error_policy<K: AgentKind>(
    object: Arc<K::Object>,
    error: &ReconcileError,
    ctx: Arc<Context>,
) -> Action {
    backoff_on_error(&ctx, K::CONTROLLER, &key::<K>(&object), error)
}

fn api<K: AgentKind>(ctx: &Context, object: &K::Object) -> Api<K::Object> {
    Api::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default())
}

async fn run<K: AgentKind>(
    object: Arc<K::Object>,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let api = api::<K>(ctx, &object);
    match K::admission(ctx, &object, Timestamp::now()).await? {
        Admission::Handle => {}
        Admission::Refuse(status) => {
            // Not honoured here: no finalizer, no objects, just say so.
            let previous = K::status(&object).cloned().unwrap_or_default();
            write_status(ctx, &api, &*object, &previous, &status).await?;
            return Ok(Action::await_change());
        }
        // Not ours: untouched, unless it still carries the finalizer of when it was.
        Admission::Ignore => return release::<K>(ctx, &api, &object).await,
    }
    if object.meta().deletion_timestamp.is_some() {
        return delete::<K>(ctx, &api, &object).await;
    }
    let object = ensure_finalizer(&api, object).await?;
    apply::<K>(&object, ctx).await
}

/// A deleted object: its cleanup, then the finalizer goes. While the agent's pods stop, the
/// object is looked at again shortly (the reconcile slot is not held for the drain).
async fn delete<K: AgentKind>(
    ctx: &Context,
    api: &Api<K::Object>,
    object: &K::Object,
) -> Result<Action, ReconcileError> {
    let ours = object
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    if !ours {
        return Ok(Action::await_change());
    }
    match cleanup::<K>(ctx, object).await? {
        Cleanup::Pending(after) => Ok(Action::requeue(after)),
        Cleanup::Done => {
            remove_finalizer(api, object).await?;
            Ok(Action::await_change())
        }
    }
}

/// How long after writing a changed agent config its results are read: the agent re-reads its
/// config every 5 s (`--reload-interval-seconds`), then probes what is new at once.
const AGENT_CONFIG_SETTLE: std::time::Duration = std::time::Duration::from_secs(8);

/// One pass over a live object: its status is written when it changed, and it is polled
/// again after the (spread) Headscale poll interval.
async fn apply<K: AgentKind>(object: &K::Object, ctx: &Context) -> Result<Action, ReconcileError> {
    let api = api::<K>(ctx, object);
    let previous = K::status(object).cloned().unwrap_or_default();
    let poll_interval = ctx.poll_interval(ctx.kinds.count::<K::Object>());
    let mut poll = Action::requeue(poll_interval);
    let status = match validated::<K>(object, Timestamp::now()) {
        Err(refused) => refused.status,
        Ok(intent) => {
            let (observed, keys) = gather::<K>(ctx, object, &intent).await?;
            let now = Timestamp::now();
            let decision = decide::<K>(object, &intent, &observed, &ctx.config, now)?;
            match &decision.agent {
                Some(plan) => {
                    let (acted, wrote) = act::<K>(ctx, object, plan, &keys).await?;
                    // A changed config is picked up and probed by the agent by itself: its
                    // results are read once it had the time, not a poll interval later.
                    if wrote.agent_config {
                        poll = Action::requeue(AGENT_CONFIG_SETTLE.min(poll_interval));
                    }
                    K::amend(object, decision.status, &acted, now)
                }
                None => decision.status,
            }
        }
    };
    write_status(ctx, &api, object, &previous, &status).await?;
    Ok(poll)
}
