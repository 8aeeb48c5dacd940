use std::io;
use std::process::ExitStatus;

/// Everything that can go wrong while building or tearing down the lab.
#[derive(Debug, thiserror::Error)]
pub enum NetlabError {
    #[error("could not run `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("could not enter network namespace `{netns}`")]
    EnterNetns {
        netns: String,
        #[source]
        source: io::Error,
    },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("the lab's pod address pool is exhausted")]
    AddressPoolExhausted,
    #[error("`{name}` is already attached to the lab")]
    AlreadyAttached { name: String },
    #[error("pod `{pod_uid}` has no network namespace in this lab")]
    UnknownPod { pod_uid: String },
    #[error("the helper thread for network namespace `{netns}` panicked")]
    HelperThreadPanicked { netns: String },
}

impl NetlabError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        NetlabError::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = NetlabError> = std::result::Result<T, E>;
