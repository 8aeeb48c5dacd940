//! The Kubernetes objects of one Gateway's agent (pure): the shared agent objects (as an
//! ingress agent's, [`IngressObjects`]) with the config from [`super::agent`], the copy of
//! the listeners' certificate Secrets the agent mounts (a pod mounts Secrets of its own
//! namespace only, and a certificateRef may name another namespace), and what the agent's
//! egress NetworkPolicy admits (its backend Services).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Secret, SecretVolumeSource, Volume, VolumeMount};
use tailnet_api::agent_config::{
    ADMIN_PORT, AgentConfig, ConnectionLimits, LOCALAPI_SOCKET, TLS_DIR, TlsFiles,
};
use tailnet_api::validate::{BackendPort, ValidBackend, ValidExpose, ValidIngress, ValidTimeouts};

use super::agent::GatewayAgent;
use crate::backends::{ObjectKey, ObservedBackends};
use crate::ingress::IngressObjects;
use crate::meta::Owner;
use crate::pod::{self, PodParts};
use crate::{RenderContext, RenderError};

/// A certificate Secret's key pair, as read (never logged).
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub certificate: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for KeyPair {
    /// Sizes only: a private key never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KeyPair {{ certificate: {} bytes, key: {} bytes }}",
            self.certificate.len(),
            self.key.len()
        )
    }
}

/// The files a certificate Secret's pair has in the agent's copy (mounted at `TLS_DIR`):
/// `<namespace>.<name>.crt` and `.key` (namespaces have no dots, so names cannot collide).
pub fn certificate_files(secret: &ObjectKey) -> TlsFiles {
    let stem = format!("{TLS_DIR}/{}.{}", secret.namespace, secret.name);
    TlsFiles {
        cert_file: format!("{stem}.crt"),
        key_file: format!("{stem}.key"),
    }
}

fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// The agent's copy of the certificate Secrets (`None` without any): one Secret in the agent's
/// namespace, owned by the Gateway, named like the agent's TLS Secret.
pub fn certificate_secret(owner: &Owner, pairs: &BTreeMap<ObjectKey, KeyPair>) -> Option<Secret> {
    if pairs.is_empty() {
        return None;
    }
    let mut data = BTreeMap::new();
    for (secret, pair) in pairs {
        let files = certificate_files(secret);
        data.insert(
            file_name(&files.cert_file),
            ByteString(pair.certificate.clone()),
        );
        data.insert(file_name(&files.key_file), ByteString(pair.key.clone()));
    }
    Some(Secret {
        metadata: owner.meta(&owner.names().tls),
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Secret::default()
    })
}

/// What the Gateway's agent render reads besides the owner and the Tailnet.
#[derive(Clone, Debug)]
pub struct GatewayInputs<'a> {
    pub agent: &'a GatewayAgent,
    /// The node's tailnet hostname (its tag's name).
    pub node_hostname: String,
    /// Whether the certificate copy exists (then the config names its files; it is always mounted).
    pub certificates: bool,
    /// The backend Services as observed (their selectors and ports), for the egress policy.
    pub backends: &'a ObservedBackends,
    /// The class's in-cluster namespaces (split horizon), sorted and unique: with any, the
    /// agent also serves its listeners on the pod IP, behind a ClusterIP Service that only
    /// pods of these namespaces may reach (its NetworkPolicy). Empty: tailnet only.
    pub in_cluster_namespaces: &'a [String],
}

/// The agent's objects for a Gateway.
pub fn render(
    owner: &Owner,
    ctx: &RenderContext,
    inputs: &GatewayInputs<'_>,
) -> Result<IngressObjects, RenderError> {
    let agent = inputs.agent;
    // The pod template does not depend on the listeners or on whether the certificate copy
    // exists yet (both reach the agent through its re-read config and files): the copy is
    // always mounted (optional) and every port may be bound. A Gateway applied together with
    // its certificate Secret is otherwise rolled out again a second later, which can replace
    // the pod before tailscaled has stored its state; the new pod then finds its node
    // registered and its single-use key spent.
    let tls_secret = Some(owner.names().tls);
    let config = AgentConfig {
        localapi_socket: LOCALAPI_SOCKET.to_string(),
        admin_port: ADMIN_PORT,
        egress: Vec::new(),
        ingress: agent.listeners.clone(),
        tls: agent.tls.clone().filter(|_| inputs.certificates),
        limits: ConnectionLimits::default(),
        in_cluster: !inputs.in_cluster_namespaces.is_empty(),
    };
    let config_json =
        serde_json::to_string_pretty(&config).map_err(|e| RenderError::Config(e.to_string()))?;
    let parts = PodParts {
        hostname: inputs.node_hostname.clone(),
        agent_ports: Vec::new(),
        agent_volumes: tls_secret.iter().map(|s| tls_volume(s)).collect(),
        // Listeners bind loopback as non-root; any port (below 1024 too) with this safe
        // sysctl.
        unprivileged_port_start: Some(0),
        // The config and the certificates are re-read by the agent: no restart for them.
        config_hash: pod::config_hash(&[&ctx.tailnet.server, tls_secret.as_deref().unwrap_or("")]),
    };
    let exposes = backend_exposes(agent);
    // The listener ports as exposes: what the in-cluster Service forwards and the
    // NetworkPolicy opens to the in-cluster namespaces (as for a TailnetIngress).
    let in_cluster_spec = ValidIngress {
        allow_from: Vec::new(),
        tls_secret_name: None,
        exposes: listener_exposes(agent),
        limits: ConnectionLimits::default(),
        in_cluster_namespaces: inputs.in_cluster_namespaces.to_vec(),
    };
    let egress = ctx
        .restrict_agent_egress
        .then(|| {
            crate::reach::agent_egress(
                &owner.namespace,
                &exposes,
                inputs.backends,
                ctx.cluster_network,
            )
            .ok()
        })
        .flatten();
    let mut hostnames: Vec<String> = Vec::new();
    for listener in &agent.listeners {
        hostnames.extend(listener_hostnames(listener));
    }
    hostnames.sort();
    hostnames.dedup();
    Ok(IngressObjects {
        service_account: pod::service_account(owner),
        role: pod::role(owner),
        role_binding: pod::role_binding(owner),
        state_secret: pod::state_secret(owner),
        config_map: pod::config_map(owner, &config_json, ctx.server_ca_pem),
        deployment: pod::deployment(owner, ctx, &parts),
        login: pod::login(owner, ctx, &parts),
        network_policy: crate::ingress::network_policy(owner, &in_cluster_spec, egress.as_ref()),
        in_cluster_service: crate::ingress::in_cluster_service(owner, &in_cluster_spec),
        certificate: None,
        config,
        hostnames,
        http_hostnames: Vec::new(),
        tls_secret,
    })
}

/// The precise hostnames a listener serves (wildcards and `*` are not names).
fn listener_hostnames(listener: &tailnet_api::agent_config::IngressListener) -> Vec<String> {
    use tailnet_api::agent_config::IngressListener;
    let names: Vec<&String> = match listener {
        IngressListener::Http { routes, .. } | IngressListener::PlainHttp { routes, .. } => {
            routes.iter().flat_map(|r| &r.hostnames).collect()
        }
        IngressListener::TlsPassthrough { routes, .. } => {
            routes.iter().flat_map(|r| &r.hostnames).collect()
        }
        IngressListener::Tcp { .. } => Vec::new(),
    };
    names
        .into_iter()
        .filter(|h| !h.contains('*'))
        .cloned()
        .collect()
}

/// The agent's listener ports as exposes (the port is all the in-cluster Service and the
/// NetworkPolicy read).
fn listener_exposes(agent: &GatewayAgent) -> Vec<ValidExpose> {
    agent
        .listeners
        .iter()
        .map(|listener| ValidExpose {
            name: format!("port-{}", listener.port()),
            dns_label: String::new(),
            alias: false,
            mode: tailnet_api::ingress::ExposeMode::Tcp,
            port: listener.port(),
            backend: ValidBackend {
                service: String::new(),
                namespace: None,
                port: BackendPort::Number(listener.port()),
                tls: None,
            },
            timeouts: ValidTimeouts::default(),
        })
        .collect()
}

/// The backend Services as exposes, only for what the egress decision reads (namespace,
/// Service, port number).
fn backend_exposes(agent: &GatewayAgent) -> Vec<ValidExpose> {
    agent
        .backends
        .iter()
        .map(|(service, port)| ValidExpose {
            name: format!("{}-{}-{port}", service.namespace, service.name),
            dns_label: String::new(),
            alias: false,
            mode: tailnet_api::ingress::ExposeMode::Tcp,
            port: *port,
            backend: ValidBackend {
                service: service.name.clone(),
                namespace: Some(service.namespace.clone()),
                port: BackendPort::Number(*port),
                tls: None,
            },
            timeouts: ValidTimeouts::default(),
        })
        .collect()
}

fn tls_volume(secret: &str) -> (Volume, VolumeMount) {
    (
        Volume {
            name: "tls".to_string(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_string()),
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
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::agent_config::{BackendAddress, IngressListener};
    use tailnet_api::naming::AgentKind;

    fn owner() -> Owner {
        Owner {
            kind: AgentKind::Gateway,
            name: "web".into(),
            namespace: "infra".into(),
            uid: "gw-uid".into(),
            tailnet: "demo".into(),
        }
    }

    #[test]
    fn certificate_copies_are_keyed_by_namespace_and_name_and_never_debug_printed() {
        let pair = KeyPair {
            certificate: b"CERT".to_vec(),
            key: b"PRIVATE".to_vec(),
        };
        assert!(!format!("{pair:?}").contains("PRIVATE"));
        assert_eq!(certificate_secret(&owner(), &BTreeMap::new()), None);
        let secret = certificate_secret(
            &owner(),
            &BTreeMap::from([(ObjectKey::new("apps", "cert"), pair)]),
        )
        .expect("a copy");
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("tailnet-gateway-web-tls")
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("infra"));
        let owners = secret.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners[0].kind, "Gateway");
        assert_eq!(owners[0].api_version, "gateway.networking.k8s.io/v1");
        let data = secret.data.unwrap_or_default();
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["apps.cert.crt", "apps.cert.key"]);
        assert_eq!(
            certificate_files(&ObjectKey::new("apps", "cert")).key_file,
            format!("{TLS_DIR}/apps.cert.key")
        );
    }

    #[test]
    fn backends_become_egress_exposes_and_names_are_precise_only() {
        let agent = GatewayAgent {
            listeners: vec![IngressListener::Tcp {
                port: 5432,
                name: "db".into(),
                backend: BackendAddress {
                    host: "pg.apps.svc.cluster.local".into(),
                    port: 5432,
                },
                backends: Vec::new(),
            }],
            tls: None,
            backends: vec![(ObjectKey::new("apps", "pg"), 5432)],
            notes: Vec::new(),
        };
        let exposes = backend_exposes(&agent);
        assert_eq!(exposes.len(), 1);
        assert_eq!(exposes[0].backend.namespace.as_deref(), Some("apps"));
        assert_eq!(exposes[0].backend.port, BackendPort::Number(5432));
        let http = IngressListener::PlainHttp {
            port: 80,
            routes: vec![tailnet_api::agent_config::HttpRoute {
                name: "r".into(),
                hostnames: vec!["a.example.com".into(), "*.example.com".into(), "*".into()],
                tls: None,
                backend: None,
                backend_tls: None,
                request_timeout_seconds: None,
                backend_request_timeout_seconds: None,
                request_timeout_millis: None,
                backend_request_timeout_millis: None,
                rules: Vec::new(),
            }],
        };
        assert_eq!(listener_hostnames(&http), ["a.example.com"]);
    }
}
