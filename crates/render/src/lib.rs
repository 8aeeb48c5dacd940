//! Pure renderers of tailnet-operator: the Kubernetes objects of one agent, the agent's config
//! and the DNS entries. Inputs are the declarations plus plain observed data; outputs are
//! exactly what the controllers apply (server-side apply, field manager `tailnet-operator`).

pub mod backends;
pub mod certificate;
pub mod claims;
pub mod compose;
pub mod desired;
pub mod dns;
pub mod egress;
pub mod fragment;
pub mod gateway;
pub mod go_memory;
pub mod images;
pub mod ingress;
pub mod intent;
pub mod meta;
pub mod pod;
pub mod policy_inputs;
pub mod ports;
pub mod reach;
pub mod targets;

use tailnet_api::tailnet::TailnetSpec;

/// What every agent render needs besides the resource itself.
#[derive(Clone, Debug)]
pub struct RenderContext<'a> {
    /// Namespace the operator runs in (egresses live there).
    pub operator_namespace: &'a str,
    /// Name of the referenced Tailnet.
    pub tailnet_name: &'a str,
    pub tailnet: &'a TailnetSpec,
    /// Images after applying the Tailnet's overrides to the operator's defaults.
    pub images: images::Images,
    /// Cluster DNS domain, for backend Service names.
    pub cluster_domain: &'a str,
    /// The Tailnet's `spec.serverCA` bundle (PEM), read by the operator: the agents' tailscale
    /// containers trust it. `None` offline and without `spec.serverCA`.
    pub server_ca_pem: Option<&'a str>,
    /// The cluster's own address ranges and DNS pods (`run --cluster-cidrs`): agents' egress
    /// to "anywhere" excludes them. `None`: not configured (and offline).
    pub cluster_network: Option<&'a reach::ClusterNetwork>,
    /// Restrict the egress of TailnetIngress and Service agents (`run
    /// --restrict-agent-egress`, default on); off: no egress rules at all.
    pub restrict_agent_egress: bool,
}

/// Errors that stop rendering an agent (invalid input was validated before; these are the
/// cases only the renderer can detect).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    #[error("{kind} {namespace}/{name} has no metadata.uid (it must come from the apiserver)")]
    MissingUid {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("serializing the agent config: {0}")]
    Config(String),
}

impl From<tailnet_api::validate::FieldError> for RenderError {
    fn from(e: tailnet_api::validate::FieldError) -> Self {
        RenderError::Field {
            field: e.field,
            message: e.message,
        }
    }
}

impl RenderError {
    /// The first of a validation's errors (the wrappers that validate before rendering
    /// report one field at a time).
    pub fn first_of(errors: Vec<tailnet_api::validate::FieldError>) -> Self {
        match errors.into_iter().next() {
            Some(e) => e.into(),
            None => RenderError::Field {
                field: "spec".to_string(),
                message: "is invalid".to_string(),
            },
        }
    }
}
