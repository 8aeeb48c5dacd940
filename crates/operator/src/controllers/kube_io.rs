//! Thin Kubernetes I/O shared by the act and gather steps: server-side apply with the one
//! field manager (skipped when nothing changed, see applied.rs) and reads served from watch
//! caches.

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tailnet_api::FIELD_MANAGER;

use super::applied;
use super::context::Context;
use super::error::ReconcileError;
use crate::metrics::ApplyLabels;
use crate::scope::CacheRead;

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
    In(&'a dyn CacheRead<K>),
    /// Nowhere: only the age of the last apply bounds the skip.
    No,
}

/// Server-side applies `object` unless this process applied exactly it recently and (for
/// watched kinds) it is still as applied: see applied.rs. Returns the live object: the apply's
/// answer, or the watch cache's copy when skipped (`None` when skipped for an unwatched kind).
pub async fn apply_cached<K>(
    ctx: &Context,
    api: &Api<K>,
    namespace: &str,
    object: &K,
    watched: Watched<'_, K>,
) -> Result<Option<K>, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + 'static,
{
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
        Watched::In(store) => store.cached(&ObjectRef::new(&name).within(namespace)),
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
    store: &dyn CacheRead<K>,
    api: &Api<K>,
    reference: &ObjectRef<K>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + 'static,
{
    match store.cached(reference) {
        Some(object) => Ok(Some((*object).clone())),
        None => api.get_opt(&reference.name).await,
    }
}

/// Server-side applies a namespaced child object of a kind the operator does not watch into
/// `namespace`, unless it was applied unchanged recently (see applied.rs).
pub async fn apply_in<K>(ctx: &Context, namespace: &str, object: &K) -> Result<(), ReconcileError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + 'static,
{
    apply_cached(
        ctx,
        &Api::namespaced(ctx.client.clone(), namespace),
        namespace,
        object,
        Watched::No,
    )
    .await
    .map(|_| ())
}
