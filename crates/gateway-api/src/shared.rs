//! Types shared by several kinds (`apis/v1/shared_types.go`, `object_reference_types.go`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

/// A route's reference to its parent (a Gateway, optionally one listener of it).
///
/// Echoed verbatim into `status.parents[].parentRef`: the apiserver defaults `group` and
/// `kind`, and the spec matches status entries to spec entries by value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Default `gateway.networking.k8s.io`; `""` is the core group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Default: the route's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// For a Gateway: the listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// For a Gateway: the listeners on this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// A reference to a backend (usually a Service) with optional namespace and port.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    /// Default: the route's namespace; another namespace needs a ReferenceGrant there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Required for a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Share of the traffic, relative to the rule's other backends. Default 1; 0 sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// A reference to a Secret (listener `tls.certificateRefs`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    /// Default `""` (core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Default `Secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    /// Default: the Gateway's namespace; another namespace needs a ReferenceGrant there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A route group and kind (listener `allowedRoutes.kinds`, `status.listeners[].supportedKinds`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// Default `gateway.networking.k8s.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub kind: String,
}

/// The status of a route with respect to one parent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    /// The controller that wrote this entry; only entries with ours are ours to change.
    pub controller_name: String,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The status common to all routes. `parents` is required by the schema, so always written.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// A reference to a parameters object (GatewayClass `spec.parametersRef`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParametersReference {
    pub group: String,
    pub kind: String,
    pub name: String,
    /// Set for a namespaced kind, unset for a cluster-scoped one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A reference to a parameters object in the Gateway's own namespace
/// (`spec.infrastructure.parametersRef`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalParametersReference {
    pub group: String,
    pub kind: String,
    pub name: String,
}
