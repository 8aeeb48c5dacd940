//! The decisions of a Service of the tailnet `loadBalancerClass` (pure). The Service is read
//! as the TailnetIngress it stands for (`tailnet_render::intent::ServiceIntent`: one `tcp`
//! expose per TCP port, the Service itself as the backend) and decided by the ingress's
//! decisions ([`Ingress`]'s `plan` and `report`): tag, names, sources, backends, policy and
//! reachability are the ingress ones. What is the Service's own: the ports it cannot serve
//! (`PortsSupported`), `status.loadBalancer.ingress` (the node's tailnet IPs and its name),
//! and that any other Service is never touched ([`Admission::Ignore`]).

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServiceStatus};
use kube::ResourceExt;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::ingress::TailnetIngressStatus;
use tailnet_api::naming::{AgentKind, AgentNames};
use tailnet_api::service::{
    RefusedPort, is_tailnet_load_balancer, service_entrance, service_errors, tailnet_annotation,
};
use tailnet_api::validate::{self, FieldError, ValidIngress};
use tailnet_api::{Tailnet, TailnetIngress};
use tailnet_headscale::Node;
use tailnet_render::RenderError;
use tailnet_render::ingress::IngressObjects;
use tailnet_render::intent::Claim;

use super::super::agent::decide::{Admission, AgentObjects, AgentStatus, Decide, Input, Planned};
use super::super::agent::identity::Identity;
use super::super::agent::observation::Observation;
use super::super::config::OperatorConfig;
use super::super::ingress::decide::{Ingress, IngressPlan};
use super::super::ingress::observation::IngressObserved;
use super::super::status::{ConditionSet, Problem};

/// Conditions that must hold for `Ready`, in the order of their dependencies (the ingress's,
/// without `CertificateReady`: a Service has no http exposes).
pub const REQUIRED: [&str; 7] = [
    types::TAILNET_READY,
    types::SOURCES_ALLOWED,
    types::BACKENDS_RESOLVED,
    types::AGENT_READY,
    types::NODE_ONLINE,
    types::POLICY_EFFECTIVE,
    types::HOSTNAMES_UNIQUE,
];
/// Conditions that count for `Ready` once they have been observed.
pub const OBSERVED_IF_KNOWN: [&str; 1] = [types::BACKENDS_REACHABLE];

/// The Service kind (a Service of the tailnet `loadBalancerClass`).
#[derive(Debug)]
pub struct LoadBalancer;

/// A Service read as the TailnetIngress it stands for, before its Tailnet is known.
#[derive(Clone, Debug)]
pub struct ServiceIntent {
    /// Metadata of the Service; `tailnetRef` is the annotation's (empty: the default
    /// Tailnet, filled in by `plan`).
    pub ingress: TailnetIngress,
    pub valid: ValidIngress,
    pub refused: Vec<RefusedPort>,
}

/// What the Service decided beyond its agent.
#[derive(Clone, Debug)]
pub struct ServicePlan {
    pub ingress: IngressPlan,
    /// Ports not served, and the `PortsSupported` message (Events compare it).
    pub refused: Vec<RefusedPort>,
    /// Its hostnames (the ingress's names of its exposes), for `status.loadBalancer`.
    pub hostnames: Vec<String>,
}

impl AgentStatus for ServiceStatus {
    /// Conditions carry the generation.
    fn set_observed_generation(&mut self, _generation: Option<i64>) {}

    /// The node's tailnet addresses are the load balancer's (`ip`).
    fn record_node(&mut self, node: &Node) {
        let ingress = node
            .ip_addresses
            .iter()
            .map(|ip| LoadBalancerIngress {
                ip: Some(ip.clone()),
                // The apiserver's default for an `ip` entry, set here so that the status read
                // back compares equal to the decided one.
                ip_mode: Some("VIP".to_string()),
                ..LoadBalancerIngress::default()
            })
            .collect();
        self.load_balancer = Some(LoadBalancerStatus {
            ingress: Some(ingress),
        });
    }
}

impl Decide for LoadBalancer {
    type Object = Service;
    type Status = ServiceStatus;
    type Intent = ServiceIntent;
    type Observed = IngressObserved;
    type Objects = IngressObjects;
    type Plan = ServicePlan;
    type Acted = ();

    const AGENT: AgentKind = AgentKind::Service;
    const REQUIRED: &'static [&'static str] = &REQUIRED;
    const OBSERVED_IF_KNOWN: &'static [&'static str] = &OBSERVED_IF_KNOWN;

    fn status(service: &Service) -> Option<&ServiceStatus> {
        service.status.as_ref()
    }

    fn tailnet_name(service: &Service) -> Option<&str> {
        tailnet_annotation(service)
    }

    /// Only Services of `type: LoadBalancer` and the tailnet class.
    fn ours(service: &Service) -> bool {
        is_tailnet_load_balancer(service)
    }

    /// Every other Service is not the operator's (one it handled before is released).
    fn admit(
        service: &Service,
        _config: &OperatorConfig,
        _now: Timestamp,
    ) -> Admission<ServiceStatus> {
        if Self::ours(service) {
            Admission::Handle
        } else {
            Admission::Ignore
        }
    }

    fn intent(service: &Service) -> Result<ServiceIntent, Vec<FieldError>> {
        service_intent(service)
    }

    fn hostnames(names: &AgentNames, tag: &str) -> Vec<String> {
        Ingress::hostnames(names, tag)
    }

    fn plan(
        input: &Input<'_, LoadBalancer>,
        c: &mut ConditionSet,
        status: &mut ServiceStatus,
    ) -> Result<Option<Planned<LoadBalancer>>, RenderError> {
        plan(input, c, status)
    }

    fn report(
        input: &Input<'_, LoadBalancer>,
        planned: &Planned<LoadBalancer>,
        identity: &Identity,
        c: &mut ConditionSet,
        status: &mut ServiceStatus,
    ) {
        let ingress = as_ingress(input);
        let mut ingress_status = TailnetIngressStatus::default();
        let as_ingress_plan = Planned::<Ingress> {
            tag: planned.tag.clone(),
            objects: None,
            plan: planned.plan.ingress.clone(),
        };
        with_ingress_input(input, &ingress, |ingress_input| {
            Ingress::report(
                ingress_input,
                &as_ingress_plan,
                identity,
                c,
                &mut ingress_status,
            );
        });
        let magic_dns_domain = input
            .tailnet
            .spec
            .dns
            .as_ref()
            .and_then(|d| d.magic_dns_domain.as_deref());
        load_balancer_names(
            status,
            identity.node(),
            &planned.plan.hostnames,
            magic_dns_domain,
        );
    }

    fn agent_objects(objects: &IngressObjects) -> AgentObjects<'_> {
        Ingress::agent_objects(objects)
    }

    /// Its tag among the Tailnet's Services (Service tags never collide with ingress tags).
    fn cleanup_tag(tailnet: &Tailnet, service: &Service, all: &[Arc<Service>]) -> Option<String> {
        let name = tailnet.name_any();
        let claim = Claim::of_service(service, &name);
        let others: Vec<Claim> = all
            .iter()
            .filter(|s| is_tailnet_load_balancer(s))
            .map(|s| Claim::of_service(s, &name))
            .collect();
        tailnet_render::claims::ingress_tag_of(
            &name,
            &tailnet.spec.policy.tag_prefix,
            &claim,
            &others,
        )
        .ok()
    }

    /// Conditions and addresses withdrawn (server-side apply drops what is no longer set).
    fn released(_status: &ServiceStatus) -> ServiceStatus {
        ServiceStatus::default()
    }

    fn amend(
        _service: &Service,
        status: ServiceStatus,
        _acted: &(),
        _now: Timestamp,
    ) -> ServiceStatus {
        status
    }
}

/// The Service as the TailnetIngress it stands for, validated like one (errors name the
/// Service's annotations and ports).
pub fn service_intent(service: &Service) -> Result<ServiceIntent, Vec<FieldError>> {
    let entrance = service_entrance(service, tailnet_annotation(service).unwrap_or_default());
    if entrance.spec.exposes.is_empty() {
        return Err(vec![FieldError::new(
            "spec.ports",
            format!(
                "no TCP port: only TCP ports are exposed on the tailnet{}",
                refused_suffix(&entrance.refused)
            ),
        )]);
    }
    let valid = validate::valid_ingress(&entrance.spec).map_err(service_errors)?;
    let mut ingress = TailnetIngress::new(&service.name_any(), entrance.spec);
    ingress.metadata = service.metadata.clone();
    Ok(ServiceIntent {
        ingress,
        valid,
        refused: entrance.refused,
    })
}

fn refused_suffix(refused: &[RefusedPort]) -> String {
    if refused.is_empty() {
        return String::new();
    }
    let list: Vec<String> = refused.iter().map(ToString::to_string).collect();
    format!(" (not served: {})", list.join(", "))
}

/// The TailnetIngress the Service stands for, in its Tailnet.
fn as_ingress(input: &Input<'_, LoadBalancer>) -> TailnetIngress {
    let mut ingress = input.intent.ingress.clone();
    ingress.spec.tailnet_ref.name = input.tailnet.name_any();
    ingress
}

/// Runs `f` with the ingress decisions' input for the Service (the same Tailnet, owner and
/// observations; the status as an ingress's: its conditions).
fn with_ingress_input<R>(
    input: &Input<'_, LoadBalancer>,
    ingress: &TailnetIngress,
    f: impl FnOnce(&Input<'_, Ingress>) -> R,
) -> R {
    let previous = TailnetIngressStatus {
        conditions: input.previous.conditions.clone().unwrap_or_default(),
        ..TailnetIngressStatus::default()
    };
    let observed: &Observation<IngressObserved> = input.observed;
    f(&Input::<Ingress> {
        object: ingress,
        intent: &input.intent.valid,
        previous: &previous,
        tailnet: input.tailnet,
        owner: input.owner,
        observed,
        config: input.config,
        now: input.now,
    })
}

/// Before the identity: the ingress's plan for the TailnetIngress the Service stands for,
/// then `PortsSupported`; the load balancer's addresses are recorded again from the node.
fn plan(
    input: &Input<'_, LoadBalancer>,
    c: &mut ConditionSet,
    status: &mut ServiceStatus,
) -> Result<Option<Planned<LoadBalancer>>, RenderError> {
    status.load_balancer = Some(LoadBalancerStatus::default());
    ports_supported(c, &input.intent.refused);
    let ingress = as_ingress(input);
    let mut ingress_status = TailnetIngressStatus::default();
    let planned = with_ingress_input(input, &ingress, |ingress_input| {
        Ingress::plan(ingress_input, c, &mut ingress_status)
    })?;
    // Tcp only: there is no certificate to speak of.
    c.remove(types::CERTIFICATE_READY);
    Ok(planned.map(|p| Planned {
        tag: p.tag,
        objects: p.objects,
        plan: ServicePlan {
            ingress: p.plan,
            refused: input.intent.refused.clone(),
            hostnames: ingress_status.hostnames,
        },
    }))
}

/// `PortsSupported`: every port is TCP, else the others are named (not served; the TCP ports
/// are).
pub fn ports_supported(c: &mut ConditionSet, refused: &[RefusedPort]) {
    match ports_problem(refused) {
        None => c.ok(
            types::PORTS_SUPPORTED,
            reasons::READY,
            "every port is TCP: all are exposed on the tailnet",
        ),
        Some(problem) => c.fail(types::PORTS_SUPPORTED, problem),
    }
}

/// Why `PortsSupported` is False, if it is.
pub fn ports_problem(refused: &[RefusedPort]) -> Option<Problem> {
    if refused.is_empty() {
        return None;
    }
    let list: Vec<String> = refused.iter().map(ToString::to_string).collect();
    Some(Problem::new(
        reasons::UNSUPPORTED_PROTOCOL,
        format!(
            "{} not served: only TCP ports are exposed on the tailnet (the TCP ports are served)",
            list.join(", ")
        ),
    ))
}

/// Its hostnames beside the node's addresses in `status.loadBalancer.ingress`, once the node
/// exists (before it, the load balancer has no address at all). Without names of its own (the
/// Tailnet has no `ingressNameTemplate`), its node's MagicDNS name
/// ([`magic_dns_name`]).
pub fn load_balancer_names(
    status: &mut ServiceStatus,
    node: Option<&Node>,
    hostnames: &[String],
    magic_dns_domain: Option<&str>,
) {
    let Some(node) = node else {
        return;
    };
    let fallback = magic_dns_name(node, magic_dns_domain);
    let names: Vec<String> = if hostnames.is_empty() {
        fallback.into_iter().collect()
    } else {
        hostnames.to_vec()
    };
    let lb = status.load_balancer.get_or_insert_with(Default::default);
    let entries = lb.ingress.get_or_insert_with(Vec::new);
    entries.extend(names.into_iter().map(|h| LoadBalancerIngress {
        hostname: Some(h),
        ..LoadBalancerIngress::default()
    }));
}

/// The node's MagicDNS name: Headscale's `givenName` under the Tailnet's `magicDNSDomain`
/// (`dns.base_domain` of Headscale); `None` without the domain or when the result is not a
/// valid DNS name (nothing Headscale sends is published unchecked).
pub fn magic_dns_name(node: &Node, magic_dns_domain: Option<&str>) -> Option<String> {
    let domain = magic_dns_domain?.trim_end_matches('.');
    let name = format!("{}.{domain}", node.given_name.to_ascii_lowercase());
    tailnet_render::dns::check_dns_name(&name).ok()?;
    Some(name)
}
