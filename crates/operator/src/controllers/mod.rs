//! Controllers: fetch → validate → render → apply (server-side apply, one field manager) →
//! write status (only when it changed, ignoring timestamps).

pub mod agent;
pub mod applied;
pub mod certificates;
pub mod context;
pub mod egress;
pub mod ingress;
pub mod shared_list;
pub mod tailnet;

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tailnet_api::FIELD_MANAGER;

/// Errors that make a reconcile fail (and be retried with backoff). Problems the user must fix
/// are not errors: they are conditions.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    #[error("Headscale: {action}: {source}")]
    Headscale {
        action: String,
        #[source]
        source: tailnet_headscale::Error,
    },
    #[error("{action}: Headscale is not usable ({reason}: {message})")]
    HeadscaleUnusable {
        action: String,
        reason: String,
        message: String,
    },
    #[error("rendering: {0}")]
    Render(#[from] tailnet_render::RenderError),
}

impl ReconcileError {
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
        let action = action.into();
        move |source| ReconcileError::Kube { action, source }
    }

    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Kube { .. } => "KubernetesAPI",
            ReconcileError::Finalizer(_) => "Finalizer",
            ReconcileError::Headscale { source, .. } => source.reason(),
            ReconcileError::Render(_) => "Render",
            ReconcileError::HeadscaleUnusable { .. } => "HeadscaleUnusable",
        }
    }
}

/// Runs one reconcile with its metrics and resets the object's backoff on success.
pub async fn instrumented(
    ctx: &context::Context,
    controller: &str,
    key: &str,
    reconcile: impl std::future::Future<
        Output = Result<kube::runtime::controller::Action, ReconcileError>,
    >,
) -> Result<kube::runtime::controller::Action, ReconcileError> {
    use crate::runtime::metrics::ControllerLabels;
    let started = std::time::Instant::now();
    let labels = ControllerLabels {
        controller: controller.to_string(),
    };
    ctx.metrics.reconciles.get_or_create(&labels).inc();
    let result = reconcile.await;
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
    ctx: &context::Context,
    controller: &str,
    key: &str,
    error: &ReconcileError,
) -> kube::runtime::controller::Action {
    use crate::runtime::metrics::ErrorLabels;
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            controller: controller.to_string(),
            reason: error.reason().to_string(),
        })
        .inc();
    let backoff = ctx.failure_backoff(key);
    tracing::warn!(controller, object = key, %error, ?backoff, "reconcile failed");
    kube::runtime::controller::Action::requeue(backoff)
}

/// Server-side applies `object` with the operator's field manager.
pub async fn apply<K>(api: &Api<K>, name: &str, object: &K) -> Result<K, ReconcileError>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(ReconcileError::kube(format!(
        "apply {}/{name}",
        K::kind(&Default::default())
    )))
}

/// Where the live object of a cached apply can be looked up.
pub enum Watched<'a, K: Resource<DynamicType = ()> + 'static> {
    /// In this watch cache (edits and deletes by others are seen).
    In(&'a Store<K>),
    /// Nowhere: only the age of the last apply bounds the skip.
    No,
}

/// Server-side applies `object` unless this process applied exactly it recently and (for
/// watched kinds) it is still as applied: see applied.rs. Returns the live object: the apply's
/// answer, or the watch cache's copy when skipped (`None` when skipped for an unwatched kind).
pub async fn apply_cached<K>(
    ctx: &context::Context,
    api: &Api<K>,
    namespace: &str,
    object: &K,
    watched: Watched<'_, K>,
) -> Result<Option<K>, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + 'static,
{
    use crate::runtime::metrics::ApplyLabels;
    let name = object.name_any();
    let kind = K::kind(&()).to_string();
    let child = applied::ChildRef {
        kind: kind.clone(),
        namespace: namespace.to_string(),
        name: name.clone(),
    };
    // An object that cannot be serialised cannot be applied either: let apply report it.
    let fingerprint = applied::fingerprint(object).ok();
    let live = match &watched {
        Watched::In(store) => store.get(&ObjectRef::new(&name).within(namespace)),
        Watched::No => None,
    };
    let live_version = live.as_deref().map(|l| watched_version(l.meta()));
    let state = match (&watched, &live_version) {
        (Watched::No, _) => applied::Live::Unwatched,
        (Watched::In(_), None) => applied::Live::Absent,
        (Watched::In(_), Some(version)) => applied::Live::Present(version),
    };
    let decision = fingerprint
        .as_ref()
        .map(|f| ctx.applied.decide(&child, f, state))
        .unwrap_or(applied::Decision::Changed);
    ctx.metrics
        .child_applies
        .get_or_create(&ApplyLabels {
            kind,
            decision: decision.label().to_string(),
        })
        .inc();
    if decision == applied::Decision::Unchanged {
        return Ok(live.map(|l| (*l).clone()));
    }
    let result = apply(api, &name, object).await?;
    if let Some(fingerprint) = fingerprint {
        ctx.applied
            .record(child, fingerprint, Some(watched_version(result.meta())));
    }
    Ok(Some(result))
}

/// What must stay the same for a watched child to count as "still as applied": uid and
/// generation where the kind has a generation (Deployment, NetworkPolicy: status updates by
/// kube-controller-manager move the resourceVersion but not the generation, and re-applying
/// after each of them was pointless), otherwise uid and resourceVersion. The uid catches a
/// delete and re-create by someone else.
fn watched_version(meta: &kube::api::ObjectMeta) -> String {
    let uid = meta.uid.as_deref().unwrap_or_default();
    match meta.generation {
        Some(generation) => format!("{uid}/g{generation}"),
        None => format!(
            "{uid}/rv{}",
            meta.resource_version.as_deref().unwrap_or_default()
        ),
    }
}

/// `get_opt` served from the apiserver's watch cache (`resourceVersion=0`): for objects read on
/// every poll where an answer a moment old is as good (no quorum read from etcd each time).
pub async fn get_opt_cached<K>(api: &Api<K>, name: &str) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    match api.get_with(name, &kube::api::GetParams::any()).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// An object from a watch cache, or, on a miss, from a GET: a cache that is still filling (or
/// one that holds only labelled objects) is never taken to mean "absent".
pub async fn from_cache_or_get<K>(
    store: &Store<K>,
    api: &Api<K>,
    reference: &ObjectRef<K>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + 'static,
{
    match store.get(reference) {
        Some(object) => Ok(Some((*object).clone())),
        None => api.get_opt(&reference.name).await,
    }
}
