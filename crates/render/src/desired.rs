//! The one desired-state entry point: from validated declarations and plain observed data to
//! everything the operator writes. The controllers (after gathering from the cluster and
//! Headscale) and `tailnet-operator render` (after reading files) call the same functions,
//! so the preview is what the operator does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::{AgentKind, labels};
use tailnet_api::validate::{ExposeNames, FieldError, ValidEgress, ValidIngress};
use tailnet_api::{Tailnet, TailnetIngress};
use tailnet_policy::{ObservedNode, PolicyInputs};

use crate::backends::{self, BackendProblem, ObjectKey, ObservedBackends};
pub use crate::claims::ingress_tags;
use crate::dns::{self, DnsEntry, DnsInputs, PendingName, RenderedDns};
use crate::egress::{self, EgressObjects};
use crate::ingress::{self, IngressInputs, IngressObjects};
use crate::intent::{Claim, EgressIntent, IngressIntent};
use crate::{RenderContext, RenderError, policy_inputs};

/// The objects of one egress agent. `previous_ports` are the listener ports recorded in its
/// status (empty offline), so ports stay stable across edits.
pub fn egress(
    metadata: &ObjectMeta,
    valid: &ValidEgress,
    ctx: &RenderContext,
    previous_ports: &BTreeMap<String, u16>,
) -> Result<EgressObjects, RenderError> {
    egress::render_valid(metadata, valid, ctx, previous_ports)
}

/// The hostnames of one ingress after the Tailnet's templates and other ingresses' claims.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngressNames {
    /// Per expose, without the hostnames claimed elsewhere.
    pub names: Vec<ExposeNames>,
    /// Our hostnames that an older ingress holds: hostname → `namespace/name` of the holder.
    pub claimed: BTreeMap<String, String>,
    /// Sorted, unique hostnames of http exposes: what the certificate must cover.
    pub http_hostnames: Vec<String>,
}

/// Names of an ingress after other ingresses' claims (`claimed`: hostname → holder, see
/// [`claimed_elsewhere`]). Errors are the context rules its intent found
/// ([`validate::ingress_in_context`]).
pub fn ingress_names(
    intent: &IngressIntent,
    claimed: &BTreeMap<String, String>,
) -> Result<IngressNames, Vec<FieldError>> {
    let mut names = intent.names.clone()?;
    let mut ours_claimed = BTreeMap::new();
    for n in &mut names {
        n.hostnames.retain(|h| match claimed.get(h) {
            Some(holder) => {
                ours_claimed.insert(h.clone(), holder.clone());
                false
            }
            None => true,
        });
    }
    let http_hostnames: BTreeSet<String> = names
        .iter()
        .filter(|n| n.mode == ExposeMode::Http)
        .flat_map(|n| n.hostnames.iter().cloned())
        .collect();
    Ok(IngressNames {
        names,
        claimed: ours_claimed,
        http_hostnames: http_hostnames.into_iter().collect(),
    })
}

/// Hostnames of `ingress` that an older ingress of the same Tailnet already claims: the
/// first owner keeps a name (ordered by creation time, then namespace/name). `others` may
/// include `ingress` itself and ingresses of other Tailnets; both are skipped.
pub fn claimed_elsewhere<'a>(
    ingress: &IngressIntent,
    others: impl IntoIterator<Item = &'a IngressIntent>,
) -> BTreeMap<String, String> {
    let ours: BTreeSet<&str> = ingress
        .names
        .iter()
        .flatten()
        .flat_map(|n| n.hostnames.iter().map(String::as_str))
        .collect();
    let my_rank = ingress.claim.rank_key();
    let mut claimed = BTreeMap::new();
    for other in others {
        // `>=` also skips `ingress` itself.
        if other.claim.tailnet != ingress.claim.tailnet || other.claim.rank_key() >= my_rank {
            continue;
        }
        let Ok(other_names) = &other.names else {
            continue;
        };
        for hostname in other_names.iter().flat_map(|n| n.hostnames.iter()) {
            if ours.contains(hostname.as_str()) {
                claimed.insert(
                    hostname.clone(),
                    format!("{}/{}", other.claim.namespace, other.claim.name),
                );
            }
        }
    }
    claimed
}

/// Whether `other` could hold one of `ingress`'s hostnames: of the same Tailnet and claimed
/// earlier. Only those need an intent of their own in [`claimed_elsewhere`] (an ingress
/// reconcile reads every other ingress of the cache).
pub fn may_claim_before(ingress: &Claim, other: &TailnetIngress) -> bool {
    other.spec.tailnet_ref.name == ingress.tailnet
        && Claim::of_ingress(other).rank_key() < ingress.rank_key()
}

/// What only the cluster knows about one ingress.
#[derive(Clone, Copy, Debug)]
pub struct IngressObserved<'a> {
    /// Backend Services' ports and CA ConfigMaps' keys.
    pub backends: &'a ObservedBackends,
    /// A certificate covering every http hostname is ready; without it http is not served.
    pub certificate_ready: bool,
    /// The ingress's tag (from [`ingress_tags`]); its name is the node's hostname.
    pub tag: &'a str,
    /// Whose agent it is: `Ingress`, or `Service` for a Service read as an ingress (its
    /// objects' names and owner reference).
    pub kind: AgentKind,
}

/// Everything decided for one ingress.
#[derive(Clone, Debug)]
pub struct IngressDesired {
    pub names: IngressNames,
    /// Backend Service port per expose.
    pub backend_ports: BTreeMap<String, u16>,
    /// Unresolved backends; the agent is not (re)deployed while any remain.
    pub problems: Vec<BackendProblem>,
    /// `None` while there are problems: the last good configuration stays applied.
    pub objects: Option<IngressObjects>,
}

/// Decides one ingress whose names were decided ([`ingress_names`]): backend resolution and,
/// when every backend resolved, the agent's objects.
pub fn ingress(
    metadata: &ObjectMeta,
    valid: &ValidIngress,
    names: IngressNames,
    ctx: &RenderContext,
    observed: &IngressObserved,
) -> Result<IngressDesired, RenderError> {
    let namespace = metadata.namespace.clone().unwrap_or_default();
    let resolved = backends::resolve(&namespace, &valid.exposes, observed.backends);
    let objects = if resolved.problems.is_empty() {
        let inputs = IngressInputs {
            names: names.names.clone(),
            backend_ports: resolved.ports.clone(),
            serve_http: observed.certificate_ready,
            node_hostname: tailnet_api::naming::tag_hostname(observed.tag),
            kind: observed.kind,
            egress: agent_egress(&namespace, valid, ctx, observed),
        };
        Some(ingress::render_valid(metadata, valid, ctx, &inputs)?)
    } else {
        None
    };
    Ok(IngressDesired {
        names,
        backend_ports: resolved.ports,
        problems: resolved.problems,
        objects,
    })
}

/// What the agent may reach (its egress NetworkPolicy, [`crate::reach`]): its backends, DNS,
/// the control plane and the tailnet's transport. `None` (unrestricted) when the operator does
/// not restrict agents' egress, or when something the agent needs is not known, e.g. offline
/// (no control plane observed).
fn agent_egress(
    namespace: &str,
    valid: &ValidIngress,
    ctx: &RenderContext,
    observed: &IngressObserved,
) -> Option<crate::reach::AgentEgress> {
    if !ctx.restrict_agent_egress {
        return None;
    }
    crate::reach::agent_egress(
        namespace,
        &valid.exposes,
        observed.backends,
        ctx.cluster_network,
    )
    .ok()
}

/// The policy inputs of one Tailnet. `route_approval` is the operator's `--route-approval`:
/// when off, route approval is left to the Headscale admin and no autoApprovers are rendered
/// either (Headscale 0.29 evaluates them when the policy is set, not only on route changes).
pub fn policy(
    tailnet: &Tailnet,
    installation_id: &str,
    egresses: &[EgressIntent],
    ingresses: &[IngressIntent],
    nodes: &[ObservedNode],
    route_approval: bool,
) -> PolicyInputs {
    let mut inputs =
        policy_inputs::policy_inputs(tailnet, installation_id, egresses, ingresses, nodes);
    if !route_approval {
        inputs.route_approvers.clear();
    }
    inputs
}

/// The DNS entries of one Tailnet: egress aliases → the ClusterIP of the target's Service
/// (`service_cluster_ips`, keyed by Service), ingress names → the tailnet IPs of the Headscale
/// node tagged with the ingress's tag (extra records) and, for an ingress listing
/// `spec.inCluster.namespaces`, → the ClusterIP of its in-cluster Service (also in
/// `service_cluster_ips`; the cluster's records); a name without its address is pending, with
/// the reason.
/// Egresses outside the operator namespace and intents of other Tailnets are skipped.
pub fn dns_inputs(
    tailnet: &Tailnet,
    operator_namespace: &str,
    egresses: &[EgressIntent],
    ingresses: &[IngressIntent],
    service_cluster_ips: &BTreeMap<ObjectKey, IpAddr>,
    nodes: &[ObservedNode],
) -> DnsInputs {
    let name = tailnet.name_any();
    let mut inputs = DnsInputs::default();
    for egress in egresses {
        if egress.claim.tailnet == name && egress.namespace_error.is_none() {
            egress_aliases(&mut inputs, operator_namespace, egress, service_cluster_ips);
        }
    }
    let tags = ingress_tags(
        &name,
        &tailnet.spec.policy.tag_prefix,
        ingresses.iter().map(|i| &i.claim),
    );
    for ingress in ingresses {
        if ingress.claim.tailnet != name {
            continue;
        }
        let Ok(names) = &ingress.names else {
            continue;
        };
        let owner = ingress.claim.owner();
        // No tag of its own (a collision): none of its names points anywhere.
        let Some(Ok(tag)) = tags.get(&ingress.claim.tag_key()) else {
            continue;
        };
        let ips: Vec<IpAddr> = nodes
            .iter()
            .filter(|n| n.tags.contains(tag))
            .flat_map(|n| n.ip_addresses.iter().copied())
            .collect();
        let in_cluster = ingress.in_cluster.then(|| {
            let service = ObjectKey::new(
                &ingress.claim.namespace,
                crate::ingress::in_cluster_service_name(ingress.claim.kind, &ingress.claim.name),
            );
            let ip = service_cluster_ips.get(&service).copied();
            (service, ip)
        });
        for hostname in names.iter().flat_map(|n| n.hostnames.iter()) {
            match &in_cluster {
                Some((_, Some(address))) => inputs.in_cluster_names.push(DnsEntry {
                    hostname: hostname.clone(),
                    address: *address,
                    owner: owner.clone(),
                    rank: ingress.claim.rank(),
                }),
                Some((service, None)) => inputs.pending.push(PendingName {
                    hostname: hostname.clone(),
                    owner: owner.clone(),
                    reason: format!("in-cluster Service {service} has no ClusterIP yet"),
                }),
                None => {}
            }
            if ips.is_empty() {
                inputs.pending.push(PendingName {
                    hostname: hostname.clone(),
                    owner: owner.clone(),
                    reason: format!("no Headscale node tagged {tag} yet"),
                });
            }
            for address in &ips {
                inputs.ingress_names.push(DnsEntry {
                    hostname: hostname.clone(),
                    address: *address,
                    owner: owner.clone(),
                    rank: ingress.claim.rank(),
                });
            }
        }
    }
    inputs
}

/// The aliases of one egress's targets → the ClusterIP of the target's Service.
fn egress_aliases(
    inputs: &mut DnsInputs,
    operator_namespace: &str,
    egress: &EgressIntent,
    service_cluster_ips: &BTreeMap<ObjectKey, IpAddr>,
) {
    // Aliases of an invalid egress still point at its Services while they exist (as they did
    // before the spec broke), so they are read from the raw targets' names and aliases.
    let owner = egress.claim.owner();
    for (target, aliases) in &egress.aliases {
        let service = ObjectKey::new(operator_namespace, target);
        for alias in aliases {
            match service_cluster_ips.get(&service) {
                Some(address) => inputs.egress_aliases.push(DnsEntry {
                    hostname: alias.clone(),
                    address: *address,
                    owner: owner.clone(),
                    rank: egress.claim.rank(),
                }),
                None => inputs.pending.push(PendingName {
                    hostname: alias.clone(),
                    owner: owner.clone(),
                    reason: format!("Service {service} has no ClusterIP yet"),
                }),
            }
        }
    }
}

/// The DNS ConfigMap of one Tailnet (only our two keys), or `None` when
/// `spec.dns.hostsConfigMap` is not set. `owner` is the Tailnet's owner reference when the
/// operator created the ConfigMap (a shared one such as kube-system/coredns gets none).
pub fn dns_config_map(
    tailnet: &Tailnet,
    operator_namespace: &str,
    rendered: &RenderedDns,
    owner: Option<OwnerReference>,
) -> Option<ConfigMap> {
    let spec_dns = tailnet.spec.dns.as_ref()?;
    let name = spec_dns.hosts_config_map.clone()?;
    let namespace = spec_dns
        .hosts_config_map_namespace
        .clone()
        .unwrap_or_else(|| operator_namespace.to_string());
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "tailnet-operator".to_string(),
                ),
                (labels::TAILNET.to_string(), tailnet.name_any()),
            ])),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            (dns::HOSTS_KEY.to_string(), rendered.hosts.clone()),
            (
                dns::SERVER_BLOCK_KEY.to_string(),
                rendered.server_block.clone(),
            ),
            (
                dns::EXTRA_RECORDS_KEY.to_string(),
                rendered.extra_records_json.clone(),
            ),
        ])),
        ..ConfigMap::default()
    })
}
