//! One typed intent per resource, built once from the declaration by validation and used by
//! every function that looks across objects: claims (who was first), tags, hostnames, policy
//! and DNS inputs. Neither the controllers nor `tailnet-operator render` hand raw
//! `TailnetEgress`/`TailnetIngress` objects to those functions, so an ingress's hostnames are
//! computed once per intent, not once per consumer.

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use tailnet_api::tailnet::TailnetSpec;
use tailnet_api::validate::{self, ExposeNames, FieldError, ValidEgress, ValidIngress};
use tailnet_api::{TailnetEgress, TailnetIngress};

use crate::dns::ClaimRank;

/// The Tailnet an intent is read in: its name, spec and the operator namespace (egresses and
/// administrative ingresses live there).
#[derive(Clone, Copy, Debug)]
pub struct TailnetScope<'a> {
    pub name: &'a str,
    pub spec: &'a TailnetSpec,
    pub operator_namespace: &'a str,
}

/// Who declared something and when: the order of claims on hostnames and tags (creation
/// time, then namespace, then name), the same for every kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub created: Option<Timestamp>,
    pub namespace: String,
    pub name: String,
    /// The Tailnet the resource references (`spec.tailnetRef.name`).
    pub tailnet: String,
    /// The tag its status records (ingresses keep it across re-assignments).
    pub recorded_tag: Option<String>,
}

impl Claim {
    fn of(object: &impl Resource, tailnet: &str, recorded_tag: Option<&str>) -> Self {
        let meta = object.meta();
        Claim {
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta
                .name
                .clone()
                .or_else(|| meta.generate_name.clone())
                .unwrap_or_default(),
            tailnet: tailnet.to_string(),
            recorded_tag: recorded_tag.map(str::to_string),
        }
    }

    /// The claim of an ingress (no other validation): enough for tag assignment.
    pub fn of_ingress(ingress: &TailnetIngress) -> Self {
        Claim::of(
            ingress,
            &ingress.spec.tailnet_ref.name,
            ingress.status.as_ref().and_then(|s| s.tag.as_deref()),
        )
    }

    /// (creation time, namespace, name) borrowed: compared without copying.
    pub fn rank_key(&self) -> (Option<&Timestamp>, &str, &str) {
        (self.created.as_ref(), &self.namespace, &self.name)
    }

    pub fn rank(&self) -> ClaimRank {
        ClaimRank::new(self.created, &self.namespace, &self.name)
    }

    /// `Kind/namespace/name`, the owner key of DNS entries and notes.
    pub fn owner(&self, kind: &str) -> String {
        format!("{kind}/{}/{}", self.namespace, self.name)
    }
}

/// A TailnetEgress as everything downstream reads it.
#[derive(Clone, Debug)]
pub struct EgressIntent {
    pub claim: Claim,
    /// Honoured only in the operator namespace; elsewhere this says why not.
    pub namespace_error: Option<FieldError>,
    /// The validated spec, or what to fix.
    pub spec: Result<ValidEgress, Vec<FieldError>>,
    /// Target name → its aliases, as declared (also while the spec is invalid: the DNS keeps
    /// pointing them at the target Services that still exist).
    pub aliases: Vec<(String, Vec<String>)>,
}

impl EgressIntent {
    pub fn new(egress: &TailnetEgress, operator_namespace: &str) -> Self {
        let claim = Claim::of(egress, &egress.spec.tailnet_ref.name, None);
        EgressIntent {
            namespace_error: validate::egress_namespace(&claim.namespace, operator_namespace).err(),
            spec: validate::valid_egress(&egress.spec),
            aliases: egress
                .spec
                .targets
                .iter()
                .map(|t| (t.name.clone(), t.aliases.clone()))
                .collect(),
            claim,
        }
    }

    /// Valid and in the operator namespace: its grants, Services and aliases exist.
    pub fn honoured(&self) -> Option<&ValidEgress> {
        match (&self.namespace_error, &self.spec) {
            (None, Ok(valid)) => Some(valid),
            _ => None,
        }
    }
}

/// A TailnetIngress as everything downstream reads it.
#[derive(Clone, Debug)]
pub struct IngressIntent {
    pub claim: Claim,
    /// The validated spec, or what to fix.
    pub spec: Result<ValidIngress, Vec<FieldError>>,
    /// Its hostnames per expose in its Tailnet (templates, cross-namespace backends, a
    /// certificate source), before other ingresses' claims; computed once. Also for an
    /// invalid spec: its names still claim (as they did before the spec broke).
    pub names: Result<Vec<ExposeNames>, Vec<FieldError>>,
}

impl IngressIntent {
    pub fn new(ingress: &TailnetIngress, scope: &TailnetScope) -> Self {
        let claim = Claim::of_ingress(ingress);
        IngressIntent {
            names: validate::ingress_in_context(
                &claim.namespace,
                scope.operator_namespace,
                &ingress.spec,
                scope.name,
                scope.spec,
            ),
            spec: validate::valid_ingress(&ingress.spec),
            claim,
        }
    }

    /// Intents of the ingresses of `scope`'s Tailnet among `ingresses` (others are skipped).
    pub fn of_tailnet<'a>(
        scope: &TailnetScope,
        ingresses: impl IntoIterator<Item = &'a TailnetIngress>,
    ) -> Vec<IngressIntent> {
        ingresses
            .into_iter()
            .filter(|i| i.spec.tailnet_ref.name == scope.name)
            .map(|i| IngressIntent::new(i, scope))
            .collect()
    }
}

impl EgressIntent {
    /// Intents of the egresses of `tailnet` among `egresses` (others are skipped).
    pub fn of_tailnet<'a>(
        tailnet: &str,
        operator_namespace: &str,
        egresses: impl IntoIterator<Item = &'a TailnetEgress>,
    ) -> Vec<EgressIntent> {
        egresses
            .into_iter()
            .filter(|e| e.spec.tailnet_ref.name == tailnet)
            .map(|e| EgressIntent::new(e, operator_namespace))
            .collect()
    }
}
