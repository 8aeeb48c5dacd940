//! Writes what a decision says about an object: its status (one server-side apply, only when
//! something other than timestamps changed; apiVersion and kind are the object type's, so a
//! kind of another API group is written alike) and Events (on `Ready` transitions, and for
//! actions taken). Failures to publish an Event are logged, never fatal.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tailnet_api::FIELD_MANAGER;
use tailnet_api::conditions::{self, types};

use super::context::Context;
use super::error::ReconcileError;
pub use super::status::WithConditions;

/// Whether `next` says the same as `previous`, ignoring condition timestamps and read times
/// ([`WithConditions::clear_read_times`]: a contributor's `lastRead` alone is not written;
/// it goes out with the next real change).
pub fn unchanged<S: WithConditions>(previous: &S, next: &S) -> bool {
    if !conditions::same_ignoring_time(previous.conditions(), next.conditions()) {
        return false;
    }
    let mut compare = next.clone();
    *compare.conditions_mut() = previous.conditions().to_vec();
    compare.clear_read_times();
    let mut previous = previous.clone();
    previous.clear_read_times();
    compare == previous
}

/// The Event a `Ready` change deserves: Normal when it became True, Warning otherwise; `None`
/// when neither its status nor its reason changed.
pub fn ready_transition(
    before: &[Condition],
    after: &[Condition],
) -> Option<(EventType, Condition)> {
    let was = conditions::find(before, types::READY).map(|r| (r.status.clone(), r.reason.clone()));
    let now = conditions::find(after, types::READY)?;
    if was == Some((now.status.clone(), now.reason.clone())) {
        return None;
    }
    let type_ = if now.status == "True" {
        EventType::Normal
    } else {
        EventType::Warning
    };
    Some((type_, now.clone()))
}

/// Writes `next` when it differs from `previous` (ignoring timestamps) and publishes the
/// `Ready` transition, if any. `api` is the object's own (namespaced or cluster) API.
pub async fn write_status<K, S>(
    ctx: &Context,
    api: &Api<K>,
    object: &K,
    previous: &S,
    next: &S,
) -> Result<(), ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: WithConditions,
{
    if unchanged(previous, next) {
        return Ok(());
    }
    let name = object.name_any();
    let kind = K::kind(&()).to_string();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": kind,
        "status": next,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(ReconcileError::kube(format!(
        "patch status of {kind} {name}"
    )))?;
    if let Some((type_, ready)) = ready_transition(previous.conditions(), next.conditions()) {
        event(
            ctx,
            object,
            type_,
            &ready.reason,
            "Reconcile",
            ready.message,
        )
        .await;
    }
    Ok(())
}

/// Publishes an Event about `object`.
pub async fn event<K>(
    ctx: &Context,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) where
    K: Resource<DynamicType = ()>,
{
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::conditions::{Status, reasons};
    use tailnet_api::egress::TailnetEgressStatus;

    fn ready(status: Status, reason: &str, message: &str, second: i64) -> Condition {
        let mut c = conditions::condition(types::READY, status, reason, message, Some(1));
        c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(second).expect("timestamp"),
        );
        c
    }

    /// Issue 26 item 5: an owner reading a contributor sets `lastRead` to now on every read;
    /// that alone must not be a status write (each write triggered the next reconcile).
    #[test]
    fn read_times_alone_are_no_change() {
        use tailnet_api::tailnet::{ContributorStatus, TailnetStatus};
        let status = |last_read: &str, merged: &str| TailnetStatus {
            conditions: vec![ready(Status::True, reasons::READY, "ok", 1)],
            contributors: vec![ContributorStatus {
                name: "cosmos".into(),
                state: "Accepted".into(),
                merged_hash: Some(merged.into()),
                last_read: Some(last_read.into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let before = status("2026-12-03T13:00:00Z", "h1");
        assert!(unchanged(&before, &status("2026-12-03T13:00:02Z", "h1")));
        assert!(!unchanged(&before, &status("2026-12-03T13:00:02Z", "h2")));
        let mut gone = before.clone();
        gone.contributors[0].last_read = None;
        gone.contributors[0].state = "Stale".into();
        assert!(!unchanged(&before, &gone));
    }

    #[test]
    fn timestamps_alone_are_no_change() {
        let a = TailnetEgressStatus {
            conditions: vec![ready(Status::True, reasons::READY, "ok", 1)],
            ..Default::default()
        };
        let mut b = a.clone();
        b.conditions[0] = ready(Status::True, reasons::READY, "ok", 99);
        assert!(unchanged(&a, &b));
        b.summary = Some("1/1 targets".into());
        assert!(!unchanged(&a, &b), "a field beside the conditions changed");
        let mut c = a.clone();
        c.conditions[0] = ready(Status::True, reasons::READY, "other message", 1);
        assert!(!unchanged(&a, &c));
    }

    #[test]
    fn ready_transitions_are_events() {
        let up = [ready(Status::True, reasons::READY, "ok", 1)];
        let down = [ready(Status::False, reasons::NODE_OFFLINE, "off", 2)];
        assert!(matches!(
            ready_transition(&[], &up),
            Some((EventType::Normal, _))
        ));
        assert!(matches!(
            ready_transition(&up, &down),
            Some((EventType::Warning, _))
        ));
        assert!(ready_transition(&up, &up).is_none());
    }
}
