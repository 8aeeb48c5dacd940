//! Objects of one TailnetEgress agent.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, Secret, Service, ServiceAccount, ServicePort, ServiceSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tailnet_api::TailnetEgress;
use tailnet_api::agent_config::{ADMIN_PORT, AgentConfig, EgressListener, LOCALAPI_SOCKET};
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::{self, ValidEgress};

use crate::meta::Owner;
use crate::pod::{self, PodParts};
use crate::{RenderContext, RenderError, ports};

/// Default interval of the reachability probe of each target.
pub const DEFAULT_PROBE_INTERVAL_SECONDS: u64 = validate::DEFAULT_PROBE_INTERVAL.as_secs();

/// Everything the controller applies for one egress.
#[derive(Clone, Debug)]
pub struct EgressObjects {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub state_secret: Secret,
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub network_policy: NetworkPolicy,
    /// tailscaled's first login (the act step adds the pre-auth key; see [`pod::auth_secret`]).
    pub login: pod::TailscaledLogin,
    /// One Service per target, named after it, in target-name order.
    pub services: Vec<Service>,
    pub config: AgentConfig,
    /// Listener port of each target.
    pub ports: BTreeMap<String, u16>,
}

/// Renders the agent of `egress`. `previous_ports` are the allocations recorded in its status,
/// so that ports stay stable across edits. Validates the spec first (the first error is
/// returned); callers that validated already use [`render_valid`].
pub fn render(
    egress: &TailnetEgress,
    ctx: &RenderContext,
    previous_ports: &BTreeMap<String, u16>,
) -> Result<EgressObjects, RenderError> {
    let valid = validate::valid_egress(&egress.spec).map_err(RenderError::first_of)?;
    render_valid(&egress.metadata, &valid, ctx, previous_ports)
}

/// Renders the agent of a validated egress; `metadata` is the resource's (its uid owns every
/// object).
pub fn render_valid(
    metadata: &ObjectMeta,
    egress: &ValidEgress,
    ctx: &RenderContext,
    previous_ports: &BTreeMap<String, u16>,
) -> Result<EgressObjects, RenderError> {
    let owner = Owner::from_meta(AgentKind::Egress, metadata, ctx.tailnet_name)?;
    let names: Vec<&str> = egress.targets.iter().map(|t| t.name.as_str()).collect();
    let ports = ports::allocate(&names, previous_ports);

    let mut listeners = Vec::new();
    let mut services = Vec::new();
    let mut targets: Vec<_> = egress.targets.iter().collect();
    targets.sort_by(|a, b| a.name.cmp(&b.name));
    for target in targets {
        let listen_port = *ports.get(&target.name).ok_or_else(|| RenderError::Field {
            field: format!("spec.targets[{}]", target.name),
            message: "no listener port could be allocated".to_string(),
        })?;
        listeners.push(EgressListener {
            name: target.name.clone(),
            listen_port,
            target_host: target.address.to_string(),
            target_port: target.port,
            probe_interval_seconds: target.probe_interval.map(|d| d.as_secs().max(1)),
        });
        services.push(Service {
            metadata: owner.meta(&target.name),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".to_string()),
                selector: Some(owner.selector_labels()),
                ports: Some(vec![ServicePort {
                    name: Some("tcp".to_string()),
                    port: i32::from(target.port),
                    target_port: Some(IntOrString::Int(i32::from(listen_port))),
                    protocol: Some("TCP".to_string()),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        });
    }

    let config = AgentConfig {
        localapi_socket: LOCALAPI_SOCKET.to_string(),
        admin_port: ADMIN_PORT,
        egress: listeners,
        ingress: Vec::new(),
        tls: None,
        limits: egress.limits,
        in_cluster: false,
    };
    let config_json =
        serde_json::to_string_pretty(&config).map_err(|e| RenderError::Config(e.to_string()))?;
    // Targets live only in the ConfigMap, which the agent re-reads: adding, changing or
    // removing a target must not restart the pod (established connections keep flowing, the
    // node stays). So neither the config nor per-target container ports are in the template;
    // the Services target the listener ports by number.
    let parts = PodParts {
        // Egresses live only in the operator namespace: the name is unique.
        hostname: owner.names().base,
        agent_ports: Vec::new(),
        agent_volumes: Vec::new(),
        unprivileged_port_start: None,
        config_hash: pod::config_hash(&[&ctx.tailnet.server]),
    };
    Ok(EgressObjects {
        service_account: pod::service_account(&owner),
        role: pod::role(&owner),
        role_binding: pod::role_binding(&owner),
        state_secret: pod::state_secret(&owner),
        config_map: pod::config_map(&owner, &config_json, ctx.server_ca_pem),
        deployment: pod::deployment(&owner, ctx, &parts),
        login: pod::login(&owner, ctx, &parts),
        network_policy: network_policy(&owner, &egress.consumer_namespaces, &ports),
        services,
        config,
        ports,
    })
}

fn tcp_port(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_string()),
        end_port: None,
    }
}

/// Only pods in the consumer namespaces may reach the listener ports; the admin port (metrics)
/// is open in-cluster for Prometheus.
fn network_policy(
    owner: &Owner,
    consumers: &[String],
    ports: &BTreeMap<String, u16>,
) -> NetworkPolicy {
    let mut namespaces: Vec<String> = consumers.to_vec();
    namespaces.sort();
    namespaces.dedup();
    NetworkPolicy {
        metadata: owner.meta(&owner.names().base),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(owner.selector_labels()),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector {
                            match_labels: None,
                            match_expressions: Some(vec![LabelSelectorRequirement {
                                key: "kubernetes.io/metadata.name".to_string(),
                                operator: "In".to_string(),
                                values: Some(namespaces),
                            }]),
                        }),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(ports.values().map(|p| tcp_port(*p)).collect()),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: Some(vec![tcp_port(ADMIN_PORT)]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    }
}
