//! Objects of one TailnetIngress agent.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, Secret, SecretVolumeSource, Service,
    ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount,
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
use tailnet_api::TailnetIngress;
use tailnet_api::agent_config::{
    ADMIN_PORT, AgentConfig, BackendAddress, BackendTlsFiles, CA_DIR, HttpRoute, IngressListener,
    LOCALAPI_SOCKET, TLS_DIR, TlsFiles,
};
use tailnet_api::ingress::ExposeMode;
use tailnet_api::naming::AgentKind;
use tailnet_api::validate::{self, ExposeNames, ValidIngress};

use crate::certificate::{self, Certificate};
use crate::meta::{NAMESPACE_NAME_LABEL, Owner};
use crate::pod::{self, PodParts};
use crate::reach::AgentEgress;
use crate::{RenderContext, RenderError};

/// Everything the controller applies for one ingress.
#[derive(Clone, Debug)]
pub struct IngressObjects {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub state_secret: Secret,
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub network_policy: NetworkPolicy,
    /// tailscaled's first login (the act step adds the pre-auth key; see [`pod::auth_secret`]).
    pub login: pod::TailscaledLogin,
    /// The in-cluster ClusterIP Service in front of the agent (split horizon), when
    /// `spec.inCluster.namespaces` lists any; named like the agent ([`in_cluster_service_name`]).
    pub in_cluster_service: Option<Service>,
    /// Present when no `tls.secretName` is given and http exposes exist.
    pub certificate: Option<Certificate>,
    pub config: AgentConfig,
    /// Every hostname (http and tcp exposes, names and aliases), sorted.
    pub hostnames: Vec<String>,
    /// Hostnames the certificate must cover (http exposes), sorted.
    pub http_hostnames: Vec<String>,
    /// Secret the agent reads its certificate from, when http exposes exist.
    pub tls_secret: Option<String>,
}

/// Facts the controller resolved before rendering.
#[derive(Clone, Debug, Default)]
pub struct IngressInputs {
    /// Hostnames per expose, from [`validate::ingress_in_context`].
    pub names: Vec<ExposeNames>,
    /// Backend Service port number per expose (named ports resolved against the Service).
    pub backend_ports: BTreeMap<String, u16>,
    /// Serve http exposes: only when a certificate covering every name is ready. Never a
    /// plaintext fallback: without it, http listeners are left out of the config entirely.
    pub serve_http: bool,
    /// The node's tailnet hostname: its tag's name ([`tailnet_api::naming::tag_hostname`]), unique like
    /// the tag (`tailnet-ingress-<name>` was the same for an ingress of that name in every
    /// namespace).
    pub node_hostname: String,
    /// Whose agent it is (`Ingress`, or `Service` for a Service read as an ingress).
    pub kind: AgentKind,
    /// What the agent may reach, when its egress is restricted ([`crate::reach`]).
    pub egress: Option<AgentEgress>,
}

/// Renders the agent of `ingress`, validating its spec first (the first error is returned);
/// callers that validated already use [`render_valid`].
pub fn render(
    ingress: &TailnetIngress,
    ctx: &RenderContext,
    inputs: &IngressInputs,
) -> Result<IngressObjects, RenderError> {
    let valid = validate::valid_ingress(&ingress.spec).map_err(RenderError::first_of)?;
    render_valid(&ingress.metadata, &valid, ctx, inputs)
}

/// Renders the agent of a validated ingress; `metadata` is the resource's (its uid owns every
/// object).
pub fn render_valid(
    metadata: &ObjectMeta,
    spec: &ValidIngress,
    ctx: &RenderContext,
    inputs: &IngressInputs,
) -> Result<IngressObjects, RenderError> {
    let owner = Owner::from_meta(inputs.kind, metadata, ctx.tailnet_name)?;
    let names = owner.names();
    let Listeners {
        listeners,
        ca_volumes,
        all_hostnames,
        http_hostnames,
    } = listeners(spec, ctx, inputs, &owner)?;
    let (tls_secret, certificate) =
        certificate_source(spec, ctx, &owner, &names.tls, &http_hostnames)?;
    let config = AgentConfig {
        localapi_socket: LOCALAPI_SOCKET.to_string(),
        admin_port: ADMIN_PORT,
        egress: Vec::new(),
        ingress: listeners,
        tls: tls_secret.as_ref().map(|_| TlsFiles {
            cert_file: format!("{TLS_DIR}/tls.crt"),
            key_file: format!("{TLS_DIR}/tls.key"),
        }),
        limits: spec.limits,
        in_cluster: !spec.in_cluster_namespaces.is_empty(),
    };
    let config_json =
        serde_json::to_string_pretty(&config).map_err(|e| RenderError::Config(e.to_string()))?;
    let volumes = agent_volumes(tls_secret.as_deref(), &ca_volumes);
    let lowest = spec.exposes.iter().map(|e| e.port).min();
    let parts = PodParts {
        hostname: inputs.node_hostname.clone(),
        agent_ports: Vec::new(),
        agent_volumes: volumes,
        // Ingress listeners bind loopback as non-root; ports below 1024 need this safe sysctl.
        unprivileged_port_start: lowest.filter(|p| *p < 1024),
        // Exposes live only in the ConfigMap, which the agent re-reads (and certificates are
        // re-read from the mounted Secret): changing them must not restart the pod.
        config_hash: pod::config_hash(&[&ctx.tailnet.server, tls_secret.as_deref().unwrap_or("")]),
    };
    Ok(IngressObjects {
        service_account: pod::service_account(&owner),
        role: pod::role(&owner),
        role_binding: pod::role_binding(&owner),
        state_secret: pod::state_secret(&owner),
        config_map: pod::config_map(&owner, &config_json, ctx.server_ca_pem),
        deployment: pod::deployment(&owner, ctx, &parts),
        login: pod::login(&owner, ctx, &parts),
        network_policy: network_policy(&owner, spec, inputs.egress.as_ref()),
        in_cluster_service: in_cluster_service(&owner, spec),
        certificate,
        config,
        hostnames: all_hostnames.into_iter().collect(),
        http_hostnames,
        tls_secret,
    })
}

/// The agent's listeners and what they need, from the exposes.
struct Listeners {
    listeners: Vec<IngressListener>,
    /// CA ConfigMap → keys the backends' verified TLS reads.
    ca_volumes: BTreeMap<String, BTreeSet<String>>,
    all_hostnames: BTreeSet<String>,
    http_hostnames: Vec<String>,
}

/// One listener per tcp expose, one per port for the http exposes (virtual hosts by name),
/// sorted by port; http only while `inputs.serve_http`.
fn listeners(
    spec: &ValidIngress,
    ctx: &RenderContext,
    inputs: &IngressInputs,
    owner: &Owner,
) -> Result<Listeners, RenderError> {
    let hostnames_of: BTreeMap<&str, &ExposeNames> = inputs
        .names
        .iter()
        .map(|n| (n.expose.as_str(), n))
        .collect();

    let mut http_routes: BTreeMap<u16, Vec<HttpRoute>> = BTreeMap::new();
    let mut tcp_listeners = Vec::new();
    let mut ca_volumes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut all_hostnames = BTreeSet::new();
    let mut http_hostnames = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for expose in &spec.exposes {
        let port = expose.port;
        let hostnames = hostnames_of
            .get(expose.name.as_str())
            .map(|n| n.hostnames.clone())
            .unwrap_or_default();
        all_hostnames.extend(hostnames.iter().cloned());
        let backend_port =
            *inputs
                .backend_ports
                .get(&expose.name)
                .ok_or_else(|| RenderError::Field {
                    field: format!("spec.exposes[{}].backend.port", expose.name),
                    message: "the backend port could not be resolved against the Service"
                        .to_string(),
                })?;
        let backend = BackendAddress {
            host: format!(
                "{}.{}.svc.{}",
                expose.backend.service,
                expose.backend.namespace_or(&owner.namespace),
                ctx.cluster_domain
            ),
            port: backend_port,
        };
        match expose.mode {
            ExposeMode::Tcp => {
                ports.insert(port);
                tcp_listeners.push(IngressListener::Tcp {
                    port,
                    name: expose.name.clone(),
                    backend,
                    backends: Vec::new(),
                });
            }
            ExposeMode::Http => {
                http_hostnames.extend(hostnames.iter().cloned());
                let backend_tls = expose.backend.tls.as_ref().map(|tls| {
                    let cm = &tls.ca_config_map_ref;
                    ca_volumes
                        .entry(cm.name.clone())
                        .or_default()
                        .insert(cm.key.clone());
                    BackendTlsFiles {
                        server_name: tls.server_name.clone(),
                        ca_file: format!("{CA_DIR}/{}/{}", cm.name, cm.key),
                    }
                });
                use tailnet_api::agent_config::{
                    timeout_millis as millis, timeout_seconds as seconds,
                };
                let route = HttpRoute {
                    name: expose.name.clone(),
                    hostnames,
                    tls: None,
                    backend: Some(backend),
                    backend_tls,
                    request_timeout_seconds: seconds(expose.timeouts.request),
                    backend_request_timeout_seconds: seconds(expose.timeouts.backend_request),
                    request_timeout_millis: millis(expose.timeouts.request),
                    backend_request_timeout_millis: millis(expose.timeouts.backend_request),
                    rules: Vec::new(),
                };
                if inputs.serve_http {
                    ports.insert(port);
                    http_routes.entry(port).or_default().push(route);
                }
            }
        }
    }
    let mut listeners: Vec<IngressListener> = tcp_listeners;
    listeners.extend(http_routes.into_iter().map(|(port, mut routes)| {
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        IngressListener::Http { port, routes }
    }));
    listeners.sort_by_key(IngressListener::port);

    Ok(Listeners {
        listeners,
        ca_volumes,
        all_hostnames,
        http_hostnames: http_hostnames.into_iter().collect(),
    })
}

/// The Secret the agent reads its certificate from (`None` without http exposes) and the
/// cert-manager Certificate to issue into it (`None` when the user names the Secret).
fn certificate_source(
    spec: &ValidIngress,
    ctx: &RenderContext,
    owner: &Owner,
    issued_secret: &str,
    http_hostnames: &[String],
) -> Result<(Option<String>, Option<certificate::Certificate>), RenderError> {
    let has_http = spec.exposes.iter().any(|e| e.mode == ExposeMode::Http);
    let user_secret = spec.tls_secret_name.clone();
    let tls_secret = has_http.then(|| {
        user_secret
            .clone()
            .unwrap_or_else(|| issued_secret.to_string())
    });
    let certificate = match (&tls_secret, &user_secret) {
        (Some(_), None) => {
            let issuer = ctx
                .tailnet
                .defaults
                .as_ref()
                .and_then(|d| d.tls.as_ref())
                .map(|t| &t.issuer_ref)
                .ok_or_else(|| RenderError::Field {
                    field: "spec.tls.secretName".to_string(),
                    message: format!(
                        "http exposes need a certificate: set spec.tls.secretName or spec.defaults.tls.issuerRef on Tailnet {}",
                        ctx.tailnet_name
                    ),
                })?;
            Some(certificate::certificate(owner, issuer, http_hostnames))
        }
        _ => None,
    };

    Ok((tls_secret, certificate))
}

/// The agent container's volumes: the TLS Secret (optional: tcp exposes work while it is
/// issued) and one per backend CA ConfigMap.
fn agent_volumes(
    tls_secret: Option<&str>,
    ca_volumes: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<(Volume, VolumeMount)> {
    let mut volumes = Vec::new();
    if let Some(secret) = tls_secret {
        volumes.push((
            Volume {
                name: "tls".to_string(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.to_string()),
                    // The pod starts (tcp exposes work) while the certificate is issued.
                    optional: Some(true),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
            VolumeMount {
                name: "tls".to_string(),
                mount_path: TLS_DIR.to_string(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ));
    }
    for (i, (config_map, keys)) in ca_volumes.iter().enumerate() {
        let volume = format!("backend-ca-{i}");
        volumes.push((
            Volume {
                name: volume.clone(),
                config_map: Some(ConfigMapVolumeSource {
                    name: config_map.clone(),
                    items: Some(
                        keys.iter()
                            .map(|k| KeyToPath {
                                key: k.clone(),
                                path: k.clone(),
                                mode: None,
                            })
                            .collect(),
                    ),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            VolumeMount {
                name: volume,
                mount_path: format!("{CA_DIR}/{config_map}"),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ));
    }
    volumes
}

/// Ingress agents accept nothing in-cluster but the admin port (their tailnet traffic arrives
/// through tailscaled on loopback) and, with `spec.inCluster.namespaces`, their expose ports
/// from pods of those namespaces (split horizon: the in-cluster Service's clients).
pub fn network_policy(
    owner: &Owner,
    spec: &ValidIngress,
    egress: Option<&AgentEgress>,
) -> NetworkPolicy {
    let mut rules = vec![NetworkPolicyIngressRule {
        from: None,
        ports: Some(vec![tcp_port(ADMIN_PORT)]),
    }];
    if !spec.in_cluster_namespaces.is_empty() {
        rules.push(NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: NAMESPACE_NAME_LABEL.to_string(),
                        operator: "In".to_string(),
                        values: Some(spec.in_cluster_namespaces.clone()),
                    }]),
                }),
                ..NetworkPolicyPeer::default()
            }]),
            ports: Some(expose_ports(spec).into_iter().map(tcp_port).collect()),
        });
    }
    let mut policy_types = vec!["Ingress".to_string()];
    if egress.is_some() {
        policy_types.push("Egress".to_string());
    }
    NetworkPolicy {
        metadata: owner.meta(&owner.names().base),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(owner.selector_labels()),
                match_expressions: None,
            }),
            policy_types: Some(policy_types),
            ingress: Some(rules),
            egress: egress.map(crate::reach::egress_rules),
        }),
    }
}

fn tcp_port(port: u16) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_string()),
        end_port: None,
    }
}

/// The distinct expose ports, ascending.
fn expose_ports(spec: &ValidIngress) -> Vec<u16> {
    let ports: BTreeSet<u16> = spec.exposes.iter().map(|e| e.port).collect();
    ports.into_iter().collect()
}

/// Name of the in-cluster Service of an agent: the agent's base name.
pub fn in_cluster_service_name(kind: AgentKind, resource_name: &str) -> String {
    tailnet_api::naming::AgentNames::new(kind, resource_name).base
}

/// The ClusterIP Service in-cluster clients reach the agent through (split horizon): every
/// expose port, to the same port on the agent's pod IP. `None` without
/// `spec.inCluster.namespaces`.
pub fn in_cluster_service(owner: &Owner, spec: &ValidIngress) -> Option<Service> {
    if spec.in_cluster_namespaces.is_empty() {
        return None;
    }
    let ports = expose_ports(spec)
        .into_iter()
        .map(|port| ServicePort {
            name: Some(format!("port-{port}")),
            port: i32::from(port),
            target_port: Some(IntOrString::Int(i32::from(port))),
            protocol: Some("TCP".to_string()),
            ..ServicePort::default()
        })
        .collect();
    Some(Service {
        metadata: owner.meta(&in_cluster_service_name(owner.kind, &owner.name)),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(owner.selector_labels()),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}
