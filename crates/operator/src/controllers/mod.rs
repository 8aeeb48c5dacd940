//! Controllers: fetch → validate → render → apply (server-side apply, one field manager) →
//! write status (only when it changed, ignoring timestamps).

pub mod agent;
pub mod certificates;
pub mod context;
pub mod egress;
pub mod ingress;
pub mod tailnet;

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
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
