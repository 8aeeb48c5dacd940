//! Metadata shared by every rendered object: labels, owner reference, names.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tailnet_api::naming::{AgentKind, AgentNames, labels};

use crate::RenderError;

/// The label the apiserver sets on every namespace to its name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Identity of the resource that owns an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub kind: AgentKind,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub tailnet: String,
}

impl Owner {
    pub fn names(&self) -> AgentNames {
        AgentNames::new(self.kind, &self.name)
    }

    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.kind.api_version(),
            kind: self.kind.resource_kind().to_string(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// Labels that select the agent's pods (stable for the life of the resource).
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (labels::NAME.to_string(), "tailnet-agent".to_string()),
            (labels::INSTANCE.to_string(), self.names().base),
        ])
    }

    /// All labels of every object of this agent.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut all = self.selector_labels();
        all.extend([
            (
                labels::COMPONENT.to_string(),
                self.kind.as_str().to_string(),
            ),
            (labels::PART_OF.to_string(), "tailnet-operator".to_string()),
            (
                labels::MANAGED_BY.to_string(),
                "tailnet-operator".to_string(),
            ),
            (
                labels::OWNER_KIND.to_string(),
                self.kind.resource_kind().to_string(),
            ),
            (
                labels::OWNER_NAME.to_string(),
                tailnet_api::naming::shorten(&self.name, 63),
            ),
            (
                labels::TAILNET.to_string(),
                tailnet_api::naming::shorten(&self.tailnet, 63),
            ),
        ]);
        all
    }

    /// Metadata of an owned object called `name`.
    pub fn meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels()),
            owner_references: Some(vec![self.owner_reference()]),
            ..ObjectMeta::default()
        }
    }

    /// Builds the owner from an object's metadata.
    pub fn from_meta(
        kind: AgentKind,
        meta: &ObjectMeta,
        tailnet: &str,
    ) -> Result<Owner, RenderError> {
        let name = meta.name.clone().unwrap_or_default();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let uid = meta.uid.clone().ok_or_else(|| RenderError::MissingUid {
            kind: kind.resource_kind(),
            namespace: namespace.clone(),
            name: name.clone(),
        })?;
        Ok(Owner {
            kind,
            name,
            namespace,
            uid,
            tailnet: tailnet.to_string(),
        })
    }
}
