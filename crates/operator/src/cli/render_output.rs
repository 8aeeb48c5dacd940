//! What `tailnet-operator render` prints and how it fails, shared by the command
//! (`render.rs`) and its Gateway API part (`render_gateway.rs`): the exit codes, the error,
//! the preview uid and the JSON form of a Kubernetes object.

use std::path::PathBuf;

use super::manifests::{ManifestError, Origin};

/// Stand-in for `metadata.uid` of objects that were not read from a cluster.
pub const PREVIEW_UID: &str = "00000000-0000-0000-0000-000000000000";

/// Exit codes of `render` besides 0 (rendered) and 2 (usage: clap's own), documented in
/// docs/cli.md.
pub mod exit {
    /// Reading inputs or writing outputs failed, or an internal error.
    pub const IO: u8 = 1;
    /// The manifests, base policy or --observed file are invalid.
    pub const INVALID: u8 = 3;
    /// Resources have policy issues and --allow-issues was not given.
    pub const ISSUES: u8 = 4;
}

#[derive(Debug, thiserror::Error)]
pub enum RenderCommandError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{path}: {message}")]
    Observed { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    ObservedRead { path: PathBuf, message: String },
    #[error("--tailnet {0}: no Tailnet of that name among the inputs")]
    UnknownTailnet(String),
    #[error(
        "--only policy prints one HuJSON document, but the inputs hold several Tailnets ({0}): pick one with --tailnet"
    )]
    SeveralPolicies(String),
    #[error("{0}")]
    Io(String),
    #[error("invalid input:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
    #[error("no Tailnet in the inputs: add the Tailnet manifest the egresses/ingresses reference")]
    NoTailnet,
    #[error(
        "Tailnet {tailnet}: base policy ConfigMap {namespace}/{name} (spec.policy.baseConfigMap) is not among the inputs"
    )]
    BaseMissing {
        tailnet: String,
        namespace: String,
        name: String,
    },
    #[error(
        "{origin}: data.{key}: the base policy is not valid HuJSON at line {line}, column {column}: {message}"
    )]
    BaseInvalid {
        origin: Origin,
        key: &'static str,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("Tailnet {tailnet}: rendering the policy: {message}")]
    Policy { tailnet: String, message: String },
    #[error("policy issues (use --allow-issues to print anyway):\n{}", .0.join("\n"))]
    Issues(Vec<String>),
    #[error("writing YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

impl RenderCommandError {
    /// The process exit code (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            RenderCommandError::Manifest(ManifestError::Read { .. })
            | RenderCommandError::ObservedRead { .. }
            | RenderCommandError::Io(_)
            | RenderCommandError::Yaml(_) => exit::IO,
            RenderCommandError::Issues(_) => exit::ISSUES,
            RenderCommandError::Manifest(_)
            | RenderCommandError::Observed { .. }
            | RenderCommandError::Invalid(_)
            | RenderCommandError::NoTailnet
            | RenderCommandError::UnknownTailnet(_)
            | RenderCommandError::SeveralPolicies(_)
            | RenderCommandError::BaseMissing { .. }
            | RenderCommandError::BaseInvalid { .. }
            | RenderCommandError::Policy { .. } => exit::INVALID,
        }
    }
}

pub(super) fn json<T: serde::Serialize + kube::Resource<DynamicType = ()>>(
    object: &T,
) -> Result<serde_json::Value, RenderCommandError> {
    let mut value = serde_json::to_value(object).map_err(|e| RenderCommandError::Policy {
        tailnet: String::new(),
        message: e.to_string(),
    })?;
    if let Some(map) = value.as_object_mut() {
        // k8s-openapi types carry no TypeMeta: add it so the output is kubectl-applyable.
        let mut typed = serde_json::Map::new();
        typed.insert("apiVersion".to_string(), T::api_version(&()).into());
        typed.insert("kind".to_string(), T::kind(&()).into());
        typed.append(map);
        value = serde_json::Value::Object(typed);
    }
    Ok(value)
}
