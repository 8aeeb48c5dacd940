//! What the agent of an entrance (a TailnetIngress, or a Service of the tailnet
//! `loadBalancerClass`) may reach in-cluster: the egress part of its NetworkPolicy. Pure, one
//! code path for both kinds: [`agent_egress`] decides from the exposes and what was observed,
//! [`egress_rules`] renders the rules.
//!
//! The agent reaches its backends (a Service with a selector: its pods on the `targetPort`s;
//! without one: the addresses of its EndpointSlices), DNS, the Kubernetes API and Headscale at
//! their observed addresses, and the tailnet's transport (UDP anywhere: WireGuard to peers and
//! STUN; TCP 443 anywhere: DERP relays). With the cluster's own address ranges known
//! ([`ClusterNetwork`], `run --cluster-cidrs`), "anywhere" excludes them and DNS goes only to
//! the cluster's DNS pods; without them those rules name no peer (any address).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tailnet_api::validate::{BackendPort, ValidExpose};

use crate::backends::{ObjectKey, ObservedBackends, TcpServicePort};
use crate::meta::NAMESPACE_NAME_LABEL;

/// At most this many addresses of hand-made endpoints (Services without a selector) are
/// rendered as `ipBlock`s; beyond it the agent's egress stays unrestricted.
pub const MAX_ENDPOINT_ADDRESSES: usize = 64;
/// DNS (UDP and TCP).
pub const DNS_PORT: i32 = 53;
/// DERP relays (TCP) besides Headscale's own.
pub const DERP_PORT: i32 = 443;
/// `run --cluster-dns-pods`'s default: CoreDNS as kubeadm, kind, k3s and most distributions
/// deploy it.
pub const DEFAULT_DNS_PODS: &str = "kube-system/k8s-app=kube-dns";

/// The cluster's own address ranges and its DNS pods (operator settings `--cluster-cidrs`,
/// `--cluster-dns-pods`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNetwork {
    /// Pod and Service CIDRs (and any other in-cluster range), IPv4 and IPv6.
    pub cidrs: Vec<IpNet>,
    pub dns: DnsPods,
}

/// The cluster's DNS pods: a namespace and a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsPods {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

impl Default for DnsPods {
    fn default() -> Self {
        DnsPods {
            namespace: "kube-system".to_string(),
            labels: BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]),
        }
    }
}

impl FromStr for DnsPods {
    type Err = String;

    /// `namespace/key=value[,key=value...]`, e.g. `kube-system/k8s-app=kube-dns`.
    fn from_str(value: &str) -> Result<Self, String> {
        let usage = || format!("{value:?}: expected namespace/key=value[,key=value...]");
        let (namespace, selector) = value.split_once('/').ok_or_else(usage)?;
        let mut labels = BTreeMap::new();
        for pair in selector.split(',') {
            let (key, label) = pair.split_once('=').ok_or_else(usage)?;
            if key.trim().is_empty() || label.trim().is_empty() {
                return Err(usage());
            }
            labels.insert(key.trim().to_string(), label.trim().to_string());
        }
        if namespace.trim().is_empty() || labels.is_empty() {
            return Err(usage());
        }
        Ok(DnsPods {
            namespace: namespace.trim().to_string(),
            labels,
        })
    }
}

impl fmt::Display for DnsPods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(f, "{}/{}", self.namespace, labels.join(","))
    }
}

/// One `--cluster-cidrs` entry: a network address with its prefix (`10.244.0.0/16`), not a
/// host inside it (the apiserver refuses non-canonical `ipBlock`s).
pub fn parse_cidr(value: &str) -> Result<IpNet, String> {
    let net: IpNet = value
        .trim()
        .parse()
        .map_err(|e| format!("{value:?}: {e} (expected e.g. 10.244.0.0/16 or fd00:10:244::/56)"))?;
    if net.trunc() != net {
        return Err(format!(
            "{value:?} is not a network address; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

/// One kind of backend destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendPeer {
    /// The pods of a Service's selector in `namespace`, on its `targetPort`s.
    Pods {
        namespace: String,
        selector: BTreeMap<String, String>,
        ports: Vec<IntOrString>,
    },
    /// The addresses of a selector-less Service's EndpointSlices, on their TCP ports.
    Addresses {
        addresses: BTreeSet<IpAddr>,
        ports: Vec<u16>,
    },
}

/// What an agent may reach (its egress is restricted to this).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentEgress {
    /// The agent's namespace: pods there are named without a namespace selector.
    pub namespace: String,
    /// In the order of the exposes; one entry per selector (ports merged) or Service.
    pub backends: Vec<BackendPeer>,
    /// Kubernetes API and Headscale endpoints.
    pub control_plane: Vec<SocketAddr>,
    /// The cluster's ranges and DNS pods, when the operator knows them.
    pub cluster: Option<ClusterNetwork>,
}

/// Why an agent's egress is left unrestricted (rather than cut off from what it needs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unrestricted {
    #[error("the Kubernetes API's or Headscale's addresses are not known")]
    ControlPlaneUnknown,
    #[error("Service {0} was not observed")]
    ServiceUnobserved(ObjectKey),
    #[error("Service {0} is of type ExternalName (a DNS name outside the cluster's objects)")]
    ExternalName(ObjectKey),
    #[error("the EndpointSlices of Service {0} (no selector) were not read")]
    SlicesUnread(ObjectKey),
    #[error("Service {0} has FQDN endpoints (names no NetworkPolicy can hold)")]
    FqdnEndpoints(ObjectKey),
    #[error(
        "the backends' hand-made endpoints hold {count} addresses, more than {MAX_ENDPOINT_ADDRESSES}"
    )]
    TooManyAddresses { count: usize },
}

/// What the agent of an entrance in `namespace` with `exposes` may reach, from what was
/// observed; `Err` says why its egress stays unrestricted.
pub fn agent_egress(
    namespace: &str,
    exposes: &[ValidExpose],
    observed: &ObservedBackends,
    cluster: Option<&ClusterNetwork>,
) -> Result<AgentEgress, Unrestricted> {
    if observed.control_plane.is_empty() {
        return Err(Unrestricted::ControlPlaneUnknown);
    }
    let mut backends: Vec<BackendPeer> = Vec::new();
    for expose in exposes {
        let backend = &expose.backend;
        let key = ObjectKey::new(backend.namespace_or(namespace), &backend.service);
        let service = observed
            .endpoints
            .get(&key)
            .ok_or_else(|| Unrestricted::ServiceUnobserved(key.clone()))?;
        if service.external_name {
            return Err(Unrestricted::ExternalName(key));
        }
        // Not a TCP port of the Service: the agent has nothing to dial there.
        let Some(port) = service
            .tcp_ports
            .iter()
            .find(|p| names_port(&backend.port, p))
        else {
            continue;
        };
        let peer = match &service.selector {
            Some(selector) => BackendPeer::Pods {
                namespace: key.namespace.clone(),
                selector: selector.clone(),
                ports: vec![port.target.clone()],
            },
            None => {
                let slices = observed
                    .endpoint_slices
                    .get(&key)
                    .ok_or_else(|| Unrestricted::SlicesUnread(key.clone()))?;
                if slices.fqdn {
                    return Err(Unrestricted::FqdnEndpoints(key));
                }
                let ports = slices
                    .tcp_ports
                    .get(port.name.as_deref().unwrap_or_default())
                    .cloned()
                    .unwrap_or_default();
                if ports.is_empty() || slices.addresses.is_empty() {
                    continue;
                }
                BackendPeer::Addresses {
                    addresses: slices.addresses.clone(),
                    ports,
                }
            }
        };
        merge(&mut backends, peer);
    }
    let count = backends
        .iter()
        .filter_map(|b| match b {
            BackendPeer::Addresses { addresses, .. } => Some(addresses.iter()),
            BackendPeer::Pods { .. } => None,
        })
        .flatten()
        .collect::<BTreeSet<_>>()
        .len();
    if count > MAX_ENDPOINT_ADDRESSES {
        return Err(Unrestricted::TooManyAddresses { count });
    }
    Ok(AgentEgress {
        namespace: namespace.to_string(),
        backends,
        control_plane: observed.control_plane.clone(),
        cluster: cluster.cloned(),
    })
}

/// Whether the expose's `backend.port` names this Service port (a number is the `port`, a
/// name the port's `name`), as backend resolution reads it.
fn names_port(wanted: &BackendPort, port: &TcpServicePort) -> bool {
    match wanted {
        BackendPort::Number(n) => port.port == i32::from(*n),
        BackendPort::Name(name) => port.name.as_deref() == Some(name.as_str()),
    }
}

/// Adds `peer`, merging its ports into an entry for the same pods or addresses.
fn merge(backends: &mut Vec<BackendPeer>, peer: BackendPeer) {
    for existing in backends.iter_mut() {
        match (existing, &peer) {
            (
                BackendPeer::Pods {
                    namespace,
                    selector,
                    ports,
                },
                BackendPeer::Pods {
                    namespace: n,
                    selector: s,
                    ports: new,
                },
            ) if namespace == n && selector == s => {
                for port in new {
                    if !ports.contains(port) {
                        ports.push(port.clone());
                    }
                }
                return;
            }
            (
                BackendPeer::Addresses { addresses, ports },
                BackendPeer::Addresses {
                    addresses: a,
                    ports: new,
                },
            ) if addresses == a => {
                for port in new {
                    if !ports.contains(port) {
                        ports.push(*port);
                    }
                }
                return;
            }
            _ => {}
        }
    }
    backends.push(peer);
}

fn port(protocol: &str, port: Option<IntOrString>) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port,
        protocol: Some(protocol.to_string()),
        end_port: None,
    }
}

fn host_block(ip: IpAddr) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: IpNet::from(ip).to_string(),
            except: None,
        }),
        ..NetworkPolicyPeer::default()
    }
}

fn labels(labels: BTreeMap<String, String>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels),
        match_expressions: None,
    })
}

/// The egress rules, in this order: backends (pods, then hand-made endpoints), DNS, the
/// tailnet's transport, the control plane (one `ipBlock` per address and port).
pub fn egress_rules(egress: &AgentEgress) -> Vec<NetworkPolicyEgressRule> {
    let mut rules: Vec<NetworkPolicyEgressRule> = egress
        .backends
        .iter()
        .map(|backend| match backend {
            BackendPeer::Pods {
                namespace,
                selector,
                ports,
            } => NetworkPolicyEgressRule {
                to: Some(vec![NetworkPolicyPeer {
                    pod_selector: labels(selector.clone()),
                    namespace_selector: (namespace != &egress.namespace).then(|| LabelSelector {
                        match_labels: Some(BTreeMap::from([(
                            NAMESPACE_NAME_LABEL.to_string(),
                            namespace.clone(),
                        )])),
                        match_expressions: None,
                    }),
                    ip_block: None,
                }]),
                ports: Some(ports.iter().map(|p| port("TCP", Some(p.clone()))).collect()),
            },
            BackendPeer::Addresses { addresses, ports } => NetworkPolicyEgressRule {
                to: Some(addresses.iter().copied().map(host_block).collect()),
                ports: Some(
                    ports
                        .iter()
                        .map(|p| port("TCP", Some(IntOrString::Int(i32::from(*p)))))
                        .collect(),
                ),
            },
        })
        .collect();
    rules.push(NetworkPolicyEgressRule {
        to: egress.cluster.as_ref().map(|cluster| {
            vec![NetworkPolicyPeer {
                namespace_selector: labels(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_string(),
                    cluster.dns.namespace.clone(),
                )])),
                pod_selector: labels(cluster.dns.labels.clone()),
                ip_block: None,
            }]
        }),
        ports: Some(vec![
            port("UDP", Some(IntOrString::Int(DNS_PORT))),
            port("TCP", Some(IntOrString::Int(DNS_PORT))),
        ]),
    });
    rules.push(NetworkPolicyEgressRule {
        to: egress.cluster.as_ref().map(outside_the_cluster),
        ports: Some(vec![
            port("UDP", None),
            port("TCP", Some(IntOrString::Int(DERP_PORT))),
        ]),
    });
    for address in &egress.control_plane {
        rules.push(NetworkPolicyEgressRule {
            to: Some(vec![host_block(address.ip())]),
            ports: Some(vec![port(
                "TCP",
                Some(IntOrString::Int(i32::from(address.port()))),
            )]),
        });
    }
    rules
}

/// Every IPv4 and IPv6 address but the cluster's ranges.
fn outside_the_cluster(cluster: &ClusterNetwork) -> Vec<NetworkPolicyPeer> {
    let block = |all: &str, v4: bool| {
        let except: Vec<String> = cluster
            .cidrs
            .iter()
            .filter(|c| matches!(c, IpNet::V4(_)) == v4)
            .map(IpNet::to_string)
            .collect();
        NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: all.to_string(),
                except: (!except.is_empty()).then_some(except),
            }),
            ..NetworkPolicyPeer::default()
        }
    };
    vec![block("0.0.0.0/0", true), block("::/0", false)]
}

#[cfg(test)]
#[path = "reach_tests.rs"]
mod tests;
