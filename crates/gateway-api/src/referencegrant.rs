//! `ReferenceGrant` (`apis/v1/referencegrant_types.go`): lives in the namespace of the
//! referenced objects and lists who may reference them.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Trust from the kinds/namespaces in `from` to the objects in `to` (in this namespace).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "ReferenceGrant",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Entries are ORed.
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    /// Entries are ORed.
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

/// A kind in a namespace that may reference the `to` objects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    /// `""` is the core group.
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

/// Objects of this namespace that may be referenced; without `name`, all of the kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    /// `""` is the core group.
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
