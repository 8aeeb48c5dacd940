use std::path::PathBuf;
use std::sync::Arc;

use tno_testenv_kube::error_chain;

/// Failures of the end-to-end environment and its helpers. Messages name what to do where that
/// is known.
#[derive(Debug, thiserror::Error)]
pub enum E2eError {
    #[error("kubernetes environment: {}", error_chain(&**.0))]
    KubeEnv(Arc<tno_testenv_kube::Error>),
    #[error("tailnet environment: {}", error_chain(.0))]
    Tailnet(#[from] tno_testenv_tailnet::TailnetError),
    #[error("network lab: {}", error_chain(.0))]
    Netlab(#[from] tno_netlab::NetlabError),
    #[error("kubernetes API call failed: {context}: {source}")]
    KubeApi {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("headscale API: {}", error_chain(.0))]
    Headscale(#[from] tno_testenv_tailnet::ApiError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kubeconfig {path} cannot be read: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("cannot encode {what}: {source}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("binary {name} not found: {hint}")]
    MissingBinary { name: String, hint: String },
    #[error("`{command}` failed ({status}): {output}")]
    CommandFailed {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("{what} did not happen within {seconds}s; last observation: {last}")]
    Timeout {
        what: String,
        seconds: u64,
        last: String,
    },
    #[error("headscale has no node named {hostname}")]
    UnknownNode { hostname: String },
    #[error("invalid operator arguments: {0}")]
    OperatorArgs(String),
    #[error("operator admin request {url} failed: {source}")]
    Admin {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("prometheus API {request}: {detail}")]
    Prometheus { request: String, detail: String },
    #[error("installing the product: {0}")]
    Install(String),
    #[error("the lab demo failed: {0}")]
    Demo(String),
    #[error("cannot make a lab certificate: {0}")]
    Certificate(String),
    #[error(
        "Headscale's extra records are already projected from another ConfigMap; drop that projection before projecting {requested}"
    )]
    ExtraRecordsBusy { requested: String },
    #[error("gateway API conformance: {}", error_chain(.0))]
    Conformance(#[from] crate::gateway_conformance::ConformanceError),
    #[error("the shared end-to-end environment failed to start: {0}")]
    SharedStartFailed(String),
}

impl From<tno_testenv_kube::Error> for E2eError {
    fn from(error: tno_testenv_kube::Error) -> Self {
        E2eError::KubeEnv(Arc::new(error))
    }
}

impl From<Arc<tno_testenv_kube::Error>> for E2eError {
    fn from(error: Arc<tno_testenv_kube::Error>) -> Self {
        E2eError::KubeEnv(error)
    }
}

impl E2eError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        E2eError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        E2eError::KubeApi {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = E2eError> = std::result::Result<T, E>;
