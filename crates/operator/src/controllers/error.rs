//! Errors that make a reconcile fail (and be retried with backoff). Problems the user must fix
//! are not errors: they are conditions (see `status.rs`).

/// A failed reconcile step, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("Headscale: {action}: {source}")]
    Headscale {
        action: String,
        #[source]
        source: tailnet_headscale::Error,
    },
    #[error("{action}: Headscale is not usable ({reason}: {message})")]
    HeadscaleUnusable {
        action: String,
        reason: &'static str,
        message: String,
    },
    #[error("rendering: {0}")]
    Render(#[from] tailnet_render::RenderError),
    #[error("serializing {what}: {source}")]
    Serialize {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ReconcileError {
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ReconcileError {
        let action = action.into();
        move |source| ReconcileError::Kube { action, source }
    }

    pub fn headscale(
        action: impl Into<String>,
    ) -> impl FnOnce(tailnet_headscale::Error) -> ReconcileError {
        let action = action.into();
        move |source| ReconcileError::Headscale { action, source }
    }

    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Kube { .. } => "KubernetesAPI",
            ReconcileError::Headscale { source, .. } => source.reason(),
            ReconcileError::Render(_) => "Render",
            ReconcileError::HeadscaleUnusable { .. } => "HeadscaleUnusable",
            ReconcileError::Serialize { .. } => "Serialize",
        }
    }
}
