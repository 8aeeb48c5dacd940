//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while starting or driving the environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("kubernetes API call failed: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: kube::Error,
    },
    #[error("kubeconfig {path} is unusable: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kube client could not be built: {0}")]
    ClientBuild(#[source] kube::Error),
    #[error("YAML document in {path} is invalid: {source}")]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("JSON conversion failed: {context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("binary {name} not found: {hint}")]
    MissingBinary { name: String, hint: String },
    #[error("{what} did not happen within {seconds}s{details}")]
    Timeout {
        what: String,
        seconds: u64,
        /// Log tails or last observed state, already formatted.
        details: String,
    },
    #[error("{component} exited early ({status}); log tail:\n{log_tail}")]
    ProcessExited {
        component: String,
        status: String,
        log_tail: String,
    },
    #[error("network lab failed: {context}: {source}")]
    Netlab {
        context: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("pod {pod}: {reason}")]
    Pod { pod: String, reason: String },
    #[error("{what}: {reason}")]
    Setup { what: String, reason: String },
    #[error("writing volume {dir:?}: {source}")]
    Volume {
        dir: PathBuf,
        #[source]
        source: tno_atomic_writer::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a human context to `std::io` errors (paths, operations).
pub(crate) trait IoContext<T> {
    fn io_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: context(),
            source,
        })
    }
}

/// Attaches a context to kube errors.
pub(crate) trait KubeContext<T> {
    fn kube_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> KubeContext<T> for std::result::Result<T, kube::Error> {
    fn kube_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Kube {
            context: context(),
            source,
        })
    }
}

/// Attaches a context to netlab errors.
pub(crate) trait NetlabContext<T> {
    fn netlab_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> NetlabContext<T> for tno_netlab::Result<T> {
    fn netlab_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Netlab {
            context: context(),
            source: Box::new(source),
        })
    }
}

/// `error: cause: cause…`, for logs and statuses (Display alone hides the sources).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // thiserror messages often embed their source already.
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
