//! What wraps every reconcile: metrics, and the per-object backoff after a failure.

use kube::runtime::controller::Action;

use super::context::Context;
use super::error::ReconcileError;
use crate::metrics::{ControllerLabels, ErrorLabels};

/// Runs one reconcile with its metrics and resets the object's backoff on success.
pub async fn instrumented(
    ctx: &Context,
    controller: &str,
    key: &str,
    reconcile: impl std::future::Future<Output = Result<Action, ReconcileError>>,
) -> Result<Action, ReconcileError> {
    let started = std::time::Instant::now();
    let labels = ControllerLabels {
        controller: controller.to_string(),
    };
    ctx.metrics.reconciles.get_or_create(&labels).inc();
    let in_flight = ctx.metrics.reconcile_started(&labels);
    let result = reconcile.await;
    drop(in_flight);
    ctx.metrics
        .reconcile_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.reset_backoff(key);
    }
    result
}

/// The error policy of every controller: count by reason, back off exponentially per object
/// (no hot loop against a failing API).
pub fn backoff_on_error(
    ctx: &Context,
    controller: &str,
    key: &str,
    error: &ReconcileError,
) -> Action {
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            controller: controller.to_string(),
            reason: error.reason().to_string(),
        })
        .inc();
    let backoff = ctx.failure_backoff(key);
    tracing::warn!(controller, object = key, %error, ?backoff, "reconcile failed");
    Action::requeue(backoff)
}
