//! One typed intent per resource, built once from the declaration by validation and used by
//! every function that looks across objects: claims (who was first), tags, hostnames, policy
//! and DNS inputs. Neither the controllers nor `tailnet-operator render` hand raw
//! `TailnetEgress`/`TailnetIngress` objects to those functions, so an ingress's hostnames are
//! computed once per intent, not once per consumer.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use tailnet_api::naming::{AgentKind, TagKey};
use tailnet_api::service::{RefusedPort, service_entrance, service_errors};
use tailnet_api::tailnet::TailnetSpec;
use tailnet_api::validate::{self, ExposeNames, FieldError, ValidEgress, ValidIngress};
use tailnet_api::{TailnetEgress, TailnetIngress, TailnetIngressSpec};

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
    /// `Ingress` (a TailnetIngress) or `Service` (a Service of the tailnet
    /// `loadBalancerClass`); egresses claim as `Egress`.
    pub kind: AgentKind,
    pub created: Option<Timestamp>,
    pub namespace: String,
    pub name: String,
    /// The Tailnet the resource references (`spec.tailnetRef.name`).
    pub tailnet: String,
    /// The tag its status records (ingresses keep it across re-assignments).
    pub recorded_tag: Option<String>,
}

impl Claim {
    fn of(
        kind: AgentKind,
        object: &impl Resource,
        tailnet: &str,
        recorded_tag: Option<&str>,
    ) -> Self {
        let meta = object.meta();
        Claim {
            kind,
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
            AgentKind::Ingress,
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

    /// The claim of a Service of the tailnet `loadBalancerClass` in Tailnet `tailnet` (no
    /// recorded tag: a Service's status has no place for it).
    pub fn of_service(service: &Service, tailnet: &str) -> Self {
        Claim::of(AgentKind::Service, service, tailnet, None)
    }

    /// `Kind/namespace/name`, the owner key of DNS entries and notes.
    pub fn owner(&self) -> String {
        format!(
            "{}/{}/{}",
            self.kind.resource_kind(),
            self.namespace,
            self.name
        )
    }

    /// Its key in the tag assignment ([`crate::claims::ingress_tags`]).
    pub fn tag_key(&self) -> TagKey {
        (self.kind, self.namespace.clone(), self.name.clone())
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
        let claim = Claim::of(
            AgentKind::Egress,
            egress,
            &egress.spec.tailnet_ref.name,
            None,
        );
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
    /// It lists `spec.inCluster.namespaces`: in-cluster, its names resolve to its in-cluster
    /// Service (split horizon); otherwise they are not in the cluster's records.
    pub in_cluster: bool,
}

impl IngressIntent {
    pub fn new(ingress: &TailnetIngress, scope: &TailnetScope) -> Self {
        Self::of_spec(Claim::of_ingress(ingress), &ingress.spec, scope)
    }

    fn of_spec(claim: Claim, spec: &TailnetIngressSpec, scope: &TailnetScope) -> Self {
        let in_context = match claim.kind {
            AgentKind::Service => validate::service_in_context,
            _ => validate::ingress_in_context,
        };
        IngressIntent {
            names: in_context(
                &claim.namespace,
                scope.operator_namespace,
                spec,
                scope.name,
                scope.spec,
            ),
            spec: validate::valid_ingress(spec),
            in_cluster: !spec.in_cluster_namespaces().is_empty(),
            claim,
        }
    }

    /// The intent of `ingress` as the agent kind `kind` decides it: a Service of the tailnet
    /// `loadBalancerClass` (read as a TailnetIngress) takes its names from the Tailnet's
    /// template or, without one, from its node's MagicDNS name
    /// ([`validate::service_in_context`]); the claim stays the ingress's.
    pub fn of_kind(ingress: &TailnetIngress, scope: &TailnetScope, kind: AgentKind) -> Self {
        let mut intent = Self::new(ingress, scope);
        if kind == AgentKind::Service {
            intent.names = validate::service_in_context(
                &intent.claim.namespace,
                scope.operator_namespace,
                &ingress.spec,
                scope.name,
                scope.spec,
            );
        }
        intent
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

/// A Service of the tailnet `loadBalancerClass` as everything downstream reads it: the
/// TailnetIngress it is read as (metadata of the Service, one `tcp` expose per TCP port, see
/// [`tailnet_api::service::service_entrance`]) and its intent, whose claim is the Service's
/// (kind `Service`: its tag, DNS owner and policy entry are its own). Errors name the
/// Service's annotations and ports.
#[derive(Clone, Debug)]
pub struct ServiceIntent {
    /// The TailnetIngress the Service is read as (its `tailnetRef` is `scope`'s Tailnet).
    pub ingress: TailnetIngress,
    pub intent: IngressIntent,
    /// Ports not served (UDP, SCTP).
    pub refused: Vec<RefusedPort>,
}

impl ServiceIntent {
    pub fn new(service: &Service, scope: &TailnetScope) -> Self {
        let entrance = service_entrance(service, scope.name);
        let mut ingress = TailnetIngress::new(
            service.metadata.name.as_deref().unwrap_or_default(),
            entrance.spec,
        );
        ingress.metadata = service.metadata.clone();
        let mut intent =
            IngressIntent::of_spec(Claim::of_service(service, scope.name), &ingress.spec, scope);
        intent.spec = intent.spec.map_err(service_errors);
        intent.names = intent.names.map_err(service_errors);
        ServiceIntent {
            ingress,
            intent,
            refused: entrance.refused,
        }
    }
}
