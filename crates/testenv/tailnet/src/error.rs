use std::io;
use std::path::PathBuf;

use crate::api::ApiError;
use crate::localapi::LocalApiError;

/// Failures of the tailnet test environment. Messages name what to do where that is known.
#[derive(Debug, thiserror::Error)]
pub enum TailnetError {
    #[error("{component} binary not found at {path} (run `deps/build.sh`, or set {env_var})")]
    MissingBinary {
        component: &'static str,
        path: PathBuf,
        env_var: &'static str,
    },
    #[error("cannot read pinned versions from {path}")]
    Versions {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} pins no {key}")]
    VersionNotPinned { path: PathBuf, key: &'static str },
    #[error(transparent)]
    Netlab(#[from] tno_netlab::NetlabError),
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    LocalApi(#[from] LocalApiError),
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
    #[error("{process} exited early ({status}); log tail:\n{log_tail}")]
    ExitedEarly {
        process: String,
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("{hostname} has no tailnet IPv4 address")]
    NoTailnetAddress { hostname: String },
    #[error("headscale printed no API key: {output}")]
    NoApiKey { output: String },
    #[error("writing the extra-records volume: {0}")]
    RecordsVolume(#[source] tno_atomic_writer::Error),
    #[error("cannot encode the policy")]
    Policy(#[source] serde_json::Error),
    #[error("cannot make the remote site's TLS certificate: {0}")]
    SiteCertificate(String),
    #[error("the shared tailnet environment failed to start earlier: {0}")]
    SharedStartFailed(String),
}

impl TailnetError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        TailnetError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = TailnetError> = std::result::Result<T, E>;
