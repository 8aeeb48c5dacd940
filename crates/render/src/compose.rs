//! The one composition of a Tailnet's desired state: from its declarations and plain observed
//! data to the policy, the DNS entries and every agent's objects. `tailnet-operator render`
//! calls [`tailnet`] (after reading files); the controllers call the same steps one object at
//! a time (the egress and ingress controllers [`ingress_names_among`] and the `desired`
//! renderers, the Tailnet controller [`intents`], [`crate::desired::policy`] and
//! [`crate::desired::dns_inputs`]), so the preview is what the operator does.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use tailnet_api::fragment::FragmentDnsRecord;
use tailnet_api::validate::{FieldError, ValidEgress};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_policy::{BasePolicy, ObservedNode, PolicyInputs, RenderedPolicy};

use crate::backends::{ObjectKey, ObservedBackends};
use crate::desired::{self, IngressDesired, IngressNames, IngressObserved};
use crate::dns::RenderedDns;
use crate::egress::EgressObjects;
use crate::intent::{Claim, EgressIntent, IngressIntent, ServiceIntent, TailnetScope};
use crate::{RenderContext, RenderError};

/// The intents of one Tailnet's egresses and ingresses among `egresses`/`ingresses` (other
/// Tailnets' are skipped), each built once; `services` are Services of this Tailnet (their
/// Tailnet and class selected by the caller) are read as ingresses and listed after the
/// TailnetIngresses.
pub fn intents<'a>(
    scope: &TailnetScope,
    egresses: impl IntoIterator<Item = &'a TailnetEgress>,
    ingresses: impl IntoIterator<Item = &'a TailnetIngress>,
    services: impl IntoIterator<Item = &'a Service>,
) -> (Vec<EgressIntent>, Vec<IngressIntent>) {
    let mut ingress_intents = IngressIntent::of_tailnet(scope, ingresses);
    ingress_intents.extend(
        service_intents(scope, services)
            .into_iter()
            .map(|s| s.intent),
    );
    (
        EgressIntent::of_tailnet(scope.name, scope.operator_namespace, egresses),
        ingress_intents,
    )
}

/// `services` (the callers choose them: of `scope`'s Tailnet and of the tailnet
/// `loadBalancerClass`, or still being released by the controller), read as ingresses.
pub fn service_intents<'a>(
    scope: &TailnetScope,
    services: impl IntoIterator<Item = &'a Service>,
) -> Vec<ServiceIntent> {
    services
        .into_iter()
        .map(|s| ServiceIntent::new(s, scope))
        .collect()
}

/// The hostnames of `ingress` after the claims of the ingresses among `others` that claimed
/// before it (the first claim keeps a name). Errors are its context rules.
pub fn ingress_names_among<'a>(
    ingress: &IngressIntent,
    others: impl IntoIterator<Item = &'a IngressIntent>,
) -> Result<IngressNames, Vec<FieldError>> {
    // Checked before the claims: an out-of-context ingress claims nothing of others either.
    if let Err(errors) = &ingress.names {
        return Err(errors.clone());
    }
    let claimed = desired::claimed_elsewhere(ingress, others);
    desired::ingress_names(ingress, &claimed)
}

/// What the composition is given besides the declarations.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// Headscale's nodes (routers, agent nodes with their tags and IPs).
    pub nodes: &'a [ObservedNode],
    /// ClusterIP per egress Service.
    pub service_cluster_ips: &'a BTreeMap<ObjectKey, IpAddr>,
    /// Backend Services' ports and CA ConfigMaps' keys.
    pub backends: &'a ObservedBackends,
}

/// How the operator is set up for this composition.
#[derive(Clone, Debug)]
pub struct Settings<'a> {
    pub render: RenderContext<'a>,
    /// The policy's ownership marker (`<installation id>/<tailnet>`).
    pub marker: &'a str,
    /// The operator's `--route-approval`.
    pub route_approval: bool,
}

/// One egress of the composition.
#[derive(Clone, Debug)]
pub struct ComposedEgress {
    pub claim: Claim,
    pub outcome: Result<(ValidEgress, EgressObjects), EgressRefusal>,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum EgressRefusal {
    #[error("{}", tailnet_api::validate::summarize(.0))]
    Invalid(Vec<FieldError>),
    #[error(transparent)]
    Render(RenderError),
}

/// One ingress of the composition.
#[derive(Clone, Debug)]
pub enum IngressOutcome {
    /// The spec is invalid.
    Invalid(Vec<FieldError>),
    /// Valid, but not in its Tailnet's context (templates, cross-namespace backend, no
    /// certificate source).
    OutOfContext(Vec<FieldError>),
    /// No tag of its own (a collision the policy names): nothing of it is rendered.
    NoTag,
    /// Offline the certificate is assumed ready (see `tailnet-operator render`'s README).
    Decided(Box<IngressDesired>),
    /// Only the renderer could tell (e.g. a missing uid).
    Render(RenderError),
}

#[derive(Clone, Debug)]
pub struct ComposedIngress {
    pub claim: Claim,
    pub outcome: IngressOutcome,
}

/// Everything one Tailnet's declarations become.
#[derive(Clone, Debug)]
pub struct TailnetComposition {
    pub policy_inputs: PolicyInputs,
    pub policy: RenderedPolicy,
    /// By egress name.
    pub egresses: Vec<ComposedEgress>,
    /// In the order given, then the Services read as ingresses (their claims say
    /// `AgentKind::Service`).
    pub ingresses: Vec<ComposedIngress>,
    pub dns: RenderedDns,
    /// `None` without `spec.dns.hostsConfigMap`.
    pub dns_config_map: Option<ConfigMap>,
    /// The fragment a `mode: Contribute` Tailnet publishes (JSON text).
    pub fragment: String,
}

/// The Tailnet's declarations: its egresses and ingresses (others' are skipped), the Services
/// of the tailnet `loadBalancerClass` of this Tailnet (the caller resolves their Tailnet) and
/// the intents of its Gateways (`crate::gateway::intent::gateway_intent`; the caller resolves
/// their class and Tailnet).
#[derive(Clone, Copy, Debug)]
pub struct Declared<'a> {
    pub egresses: &'a [TailnetEgress],
    pub ingresses: &'a [TailnetIngress],
    pub services: &'a [Service],
    pub gateways: &'a [IngressIntent],
}

/// The whole desired state of `tailnet` from its declarations, its base policy and what was
/// observed. Offline, every ingress certificate is taken as ready. Gateways are entrances
/// after the ingresses and Services (as the Tailnet controller reads them): they enter the
/// policy and the DNS; their agents are the Gateway decision's (`crate::gateway`).
pub fn tailnet(
    tailnet: &Tailnet,
    base: &BasePolicy,
    declared: &Declared<'_>,
    observed: &Observed,
    settings: &Settings,
) -> Result<TailnetComposition, tailnet_policy::RenderError> {
    let Declared {
        egresses,
        ingresses,
        services,
        gateways,
    } = *declared;
    let ctx = &settings.render;
    let scope = TailnetScope {
        name: ctx.tailnet_name,
        spec: ctx.tailnet,
        operator_namespace: ctx.operator_namespace,
    };
    let ours: Vec<&TailnetEgress> = egresses
        .iter()
        .filter(|e| e.spec.tailnet_ref.name == scope.name)
        .collect();
    let services = service_intents(&scope, services);
    let mut our_ingresses: Vec<&TailnetIngress> = ingresses
        .iter()
        .filter(|i| i.spec.tailnet_ref.name == scope.name)
        .collect();
    let (egress_intents, mut ingress_intents) = intents(
        &scope,
        ours.iter().copied(),
        our_ingresses.iter().copied(),
        [],
    );
    // Services are composed as the ingresses they are read as, after the TailnetIngresses.
    our_ingresses.extend(services.iter().map(|s| &s.ingress));
    ingress_intents.extend(services.iter().map(|s| s.intent.clone()));
    // The ingresses' and Services' agents are decided among themselves (as their controllers
    // do); the policy and DNS read the Gateways too, after them.
    let entrances = ingress_intents.len();
    ingress_intents.extend(gateways.iter().cloned());
    let policy_inputs = desired::policy(
        tailnet,
        settings.marker,
        &egress_intents,
        &ingress_intents,
        observed.nodes,
        settings.route_approval,
    );
    let policy = tailnet_policy::render(base, &policy_inputs)?;
    let dns = crate::dns::render(&desired::dns_inputs(
        tailnet,
        ctx.operator_namespace,
        &egress_intents,
        &ingress_intents,
        observed.service_cluster_ips,
        observed.nodes,
    ));
    let dns_config_map = desired::dns_config_map(tailnet, ctx.operator_namespace, &dns, None);
    let records: Vec<FragmentDnsRecord> =
        serde_json::from_str(&dns.extra_records_json).unwrap_or_default();
    let fragment = crate::fragment::fragment_text(&crate::fragment::fragment_of(
        settings.marker,
        &tailnet.spec.policy.tag_prefix,
        &policy,
        &records,
    ));
    Ok(TailnetComposition {
        egresses: compose_egresses(&ours, egress_intents, ctx),
        ingresses: compose_ingresses(&our_ingresses, &ingress_intents[..entrances], observed, ctx),
        policy_inputs,
        policy,
        dns,
        dns_config_map,
        fragment,
    })
}

/// Each egress's objects, by name (offline there are no previously allocated ports).
fn compose_egresses(
    egresses: &[&TailnetEgress],
    intents: Vec<EgressIntent>,
    ctx: &RenderContext,
) -> Vec<ComposedEgress> {
    let mut composed: Vec<ComposedEgress> = egresses
        .iter()
        .zip(intents)
        .map(|(egress, intent)| {
            let outcome = match intent.spec {
                Err(errors) => Err(EgressRefusal::Invalid(errors)),
                Ok(valid) => desired::egress(&egress.metadata, &valid, ctx, &BTreeMap::new())
                    .map(|objects| (valid, objects))
                    .map_err(EgressRefusal::Render),
            };
            ComposedEgress {
                claim: intent.claim,
                outcome,
            }
        })
        .collect();
    composed.sort_by(|a, b| a.claim.name.cmp(&b.claim.name));
    composed
}

/// Each ingress decided as its controller decides it: names after older claims, its tag
/// among all, backends, objects.
fn compose_ingresses(
    ingresses: &[&TailnetIngress],
    intents: &[IngressIntent],
    observed: &Observed,
    ctx: &RenderContext,
) -> Vec<ComposedIngress> {
    let tags = desired::ingress_tags(
        ctx.tailnet_name,
        &ctx.tailnet.policy.tag_prefix,
        intents.iter().map(|i| &i.claim),
    );
    ingresses
        .iter()
        .zip(intents)
        .map(|(ingress, intent)| {
            let tag = match tags.get(&intent.claim.tag_key()) {
                Some(Ok(tag)) => Some(tag.as_str()),
                _ => None,
            };
            let outcome = ingress_outcome(ingress, intent, intents, tag, observed, ctx);
            ComposedIngress {
                claim: intent.claim.clone(),
                outcome,
            }
        })
        .collect()
}

fn ingress_outcome(
    ingress: &TailnetIngress,
    intent: &IngressIntent,
    all: &[IngressIntent],
    tag: Option<&str>,
    observed: &Observed,
    ctx: &RenderContext,
) -> IngressOutcome {
    let valid = match &intent.spec {
        Ok(valid) => valid,
        Err(errors) => return IngressOutcome::Invalid(errors.clone()),
    };
    let names = match ingress_names_among(intent, all) {
        Ok(names) => names,
        Err(errors) => return IngressOutcome::OutOfContext(errors),
    };
    let Some(tag) = tag else {
        return IngressOutcome::NoTag;
    };
    let wanted = IngressObserved {
        backends: observed.backends,
        certificate_ready: true,
        tag,
        kind: intent.claim.kind,
    };
    match desired::ingress(&ingress.metadata, valid, names, ctx, &wanted) {
        Ok(decided) => IngressOutcome::Decided(Box::new(decided)),
        Err(e) => IngressOutcome::Render(e),
    }
}
