//! The tailnet-operator API: CRD types (`tailnet-operator.dev/v1alpha1`), naming rules,
//! condition helpers, the agent's config contract and pure validation.
//!
//! Nothing in this crate performs I/O; the controllers and the `render` command share it.

pub mod agent_config;
pub mod agent_status;
pub mod bounded;
pub mod common;
pub mod conditions;
pub mod crd;
pub mod digest;
pub mod egress;
pub mod fragment;
pub mod gateway_parameters;
pub mod ingress;
pub mod naming;
pub mod owner_feed;
pub mod patterns;
pub mod service;
pub mod tailnet;
pub mod validate;

pub use egress::{TailnetEgress, TailnetEgressSpec, TailnetEgressStatus};
pub use ingress::{TailnetIngress, TailnetIngressSpec, TailnetIngressStatus};
pub use tailnet::{Tailnet, TailnetSpec, TailnetStatus};

/// API group of every CRD of this operator.
pub const GROUP: &str = "tailnet-operator.dev";
/// The only served version.
pub const VERSION: &str = "v1alpha1";
/// Finalizer of every agent-backed object: its agent's Headscale node and keys go first.
pub const FINALIZER: &str = "tailnet-operator.dev/cleanup";
/// Field manager used for every server-side apply of the operator.
pub const FIELD_MANAGER: &str = "tailnet-operator";
