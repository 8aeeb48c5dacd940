//! `TLSRoute` (`apis/v1/tlsroute_types.go`): forwards TLS connections by SNI (passthrough).

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::shared::{BackendRef, ParentReference, RouteStatus};

/// Forwards the TLS connections whose SNI matches `hostnames` to weighted backends.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "TLSRoute",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct TLSRouteSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentReference>,
    /// SNI names, precise or `*.`-prefixed (at least one, schema).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    /// Exactly one rule (schema).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<TLSRouteRule>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TLSRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<BackendRef>,
}
