//! `TCPRoute` (`apis/v1/tcproute_types.go`): forwards a TCP listener's connections.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::shared::{BackendRef, ParentReference, RouteStatus};

/// Forwards the connections of a TCP listener to weighted backends.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "TCPRoute",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct TCPRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// Exactly one rule (schema).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<TCPRouteRule>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TCPRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<BackendRef>,
}
