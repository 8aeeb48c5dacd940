//! The agent Deployment and its RBAC, shared by egress and ingress agents.
//!
//! Pod contract (SPEC §2): one replica, Recreate ([`agent_pods`]); container `tailscale` is the official image
//! running containerboot with tailscaled in userspace mode, state in a Secret
//! (`TS_KUBE_SECRET`), login once with a pre-auth key; container `tailnet-agent` talks to
//! tailscaled only through the LocalAPI socket in a shared emptyDir. No NET_ADMIN, no
//! `/dev/net/tun`, non-root, read-only root filesystem.
//!
//! Least privilege: the pod does not automount a ServiceAccount token. Only the tailscale
//! container (containerboot reads and writes its state Secret) gets one, through a projected
//! volume at the default path; the agent container, which parses tailnet traffic, has no
//! Kubernetes credentials at all.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, ServiceAccount, ServiceAccountTokenProjection, Sysctl, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tailnet_api::agent_config::{
    ADMIN_PORT, CONFIG_DIR, CONFIG_KEY, CONFIG_PATH, LOCALAPI_SOCKET, SOCKET_DIR,
};
use tailnet_api::naming::{AgentKind, labels};

use crate::RenderContext;
use crate::meta::Owner;

/// Key of the pre-auth key in the auth Secret.
pub const AUTH_KEY: &str = "authkey";
/// Key of the Tailnet's `spec.serverCA` bundle in the agent's ConfigMap.
pub const SERVER_CA_KEY: &str = "server-ca.crt";
/// Where the tailscale container finds that bundle: a directory holding only `ca.crt`.
pub const SERVER_CA_DIR: &str = "/etc/tailnet-operator/server-ca";
/// `SSL_CERT_DIR` of the tailscale container with a server CA: Go's crypto/x509 (tailscaled's
/// control and DERP clients) reads every certificate file in these directories, besides the
/// system bundle file it reads anyway; `/etc/ssl/certs` keeps the image's own directory.
pub const SERVER_CA_CERT_DIRS: &str = "/etc/tailnet-operator/server-ca:/etc/ssl/certs";
/// Non-root UID/GID of both containers.
pub const RUN_AS: i64 = 65532;

/// How an agent's pods run: how many, and how they are replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentPods {
    pub replicas: i32,
    /// The Deployment strategy (`Recreate`: never two pods with the same state at once).
    pub strategy: &'static str,
}

/// How many agent pods a kind runs — the one place that says it. Today every kind runs one
/// pod with one tailnet identity, replaced with `Recreate`: its node state lives in one state
/// Secret, which two pods must never share.
pub fn agent_pods(kind: AgentKind) -> AgentPods {
    match kind {
        AgentKind::Egress | AgentKind::Ingress | AgentKind::Service => AgentPods {
            replicas: 1,
            strategy: "Recreate",
        },
    }
}

/// Agent-specific parts of the pod.
#[derive(Clone, Debug, Default)]
pub struct PodParts {
    /// The node's tailnet hostname (`TS_HOSTNAME`).
    pub hostname: String,
    /// Ports the agent container listens on besides the admin port.
    pub agent_ports: Vec<ContainerPort>,
    /// Extra volumes with their mount in the agent container.
    pub agent_volumes: Vec<(Volume, VolumeMount)>,
    /// `net.ipv4.ip_unprivileged_port_start`, for ingress ports below 1024 on loopback.
    pub unprivileged_port_start: Option<u16>,
    /// Hash of everything the agent reads at start (config, certificates' names), so a change
    /// rolls the pod.
    pub config_hash: String,
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..Default::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn restricted_container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(RUN_AS),
        run_as_group: Some(RUN_AS),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

fn resources(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.to_string())),
            ("memory".to_string(), Quantity(memory.to_string())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_string(),
            Quantity(memory_limit.to_string()),
        )])),
        ..ResourceRequirements::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

/// Where a container finds its ServiceAccount credentials (client-go's and containerboot's
/// in-cluster config).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected token volume, mounted into the tailscale container only.
pub const SERVICE_ACCOUNT_VOLUME: &str = "kube-api-access";
/// Lifetime the kubelet requests for the token (it refreshes it at 80 %); what the
/// admission-injected volume uses.
const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// The volume the ServiceAccount admission would inject with `automountServiceAccountToken`
/// (token, cluster CA, namespace), made explicit so it can go to one container.
fn service_account_volume() -> Volume {
    Volume {
        name: SERVICE_ACCOUNT_VOLUME.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_string(),
                        expiration_seconds: Some(TOKEN_EXPIRATION_SECONDS),
                        audience: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".to_string(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".to_string(),
                            path: "ca.crt".to_string(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..VolumeProjection::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".to_string(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".to_string()),
                                field_path: "metadata.namespace".to_string(),
                            }),
                            ..DownwardAPIVolumeFile::default()
                        }]),
                    }),
                    ..VolumeProjection::default()
                },
            ]),
        }),
        ..Volume::default()
    }
}

/// The volume of the tailscale container's CA directory: the agent ConfigMap's
/// [`SERVER_CA_KEY`] as `ca.crt`.
const SERVER_CA_VOLUME: &str = "server-ca";

fn server_ca_volume(config_map: &str) -> Volume {
    Volume {
        name: SERVER_CA_VOLUME.to_string(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_string(),
            items: Some(vec![KeyToPath {
                key: SERVER_CA_KEY.to_string(),
                path: "ca.crt".to_string(),
                mode: None,
            }]),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

fn tailscale_container(owner: &Owner, ctx: &RenderContext, parts: &PodParts) -> Container {
    let names = owner.names();
    let mut extra_args = format!("--login-server={}", ctx.tailnet.server);
    if owner.kind == AgentKind::Egress {
        // Targets behind subnet routers are only dialable with accepted routes.
        extra_args.push_str(" --accept-routes");
    }
    // An egress resolves DNS-name targets the pod's DNS does not know through tailscaled's
    // resolver (MagicDNS, Headscale's extra records and split DNS), which only has the
    // tailnet's DNS configuration when it accepts it. In userspace networking tailscaled never
    // touches the pod's /etc/resolv.conf, so the pod's own resolution is unchanged.
    let accept_dns = if owner.kind == AgentKind::Egress {
        "true"
    } else {
        "false"
    };
    let overrides = ctx.tailnet.agent.as_ref();
    Container {
        name: "tailscale".to_string(),
        image: Some(ctx.images.tailscale.clone()),
        image_pull_policy: ctx.images.tailscale_pull_policy.clone(),
        env: Some(
            vec![
                env("TS_KUBE_SECRET", &names.state_secret),
                env("TS_AUTH_ONCE", "true"),
                env("TS_USERSPACE", "true"),
                env("TS_SOCKET", LOCALAPI_SOCKET),
                env("TS_HOSTNAME", &parts.hostname),
                env("TS_EXTRA_ARGS", extra_args),
                env("TS_ACCEPT_DNS", accept_dns),
                // Self-hosted control: never upload logs to a third party.
                env("TS_NO_LOGS_NO_SUPPORT", "true"),
                EnvVar {
                    name: "TS_AUTHKEY".to_string(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: names.auth_secret.clone(),
                            key: AUTH_KEY.to_string(),
                            // After the first login the key is gone; the node key lives in the
                            // state Secret.
                            optional: Some(true),
                        }),
                        ..EnvVarSource::default()
                    }),
                    ..EnvVar::default()
                },
                env_field("POD_IP", "status.podIP"),
                env_field("POD_NAME", "metadata.name"),
                env_field("POD_UID", "metadata.uid"),
            ]
            .into_iter()
            .chain(
                ctx.server_ca_pem
                    .map(|_| env("SSL_CERT_DIR", SERVER_CA_CERT_DIRS)),
            )
            .collect(),
        ),
        volume_mounts: Some(
            [
                mount("tailscale-socket", SOCKET_DIR, false),
                mount("tailscale-tmp", "/tmp", false),
                // containerboot keeps the node state in its Secret (`TS_KUBE_SECRET`).
                mount(SERVICE_ACCOUNT_VOLUME, SERVICE_ACCOUNT_DIR, true),
            ]
            .into_iter()
            .chain(
                ctx.server_ca_pem
                    .map(|_| mount(SERVER_CA_VOLUME, SERVER_CA_DIR, true)),
            )
            .collect(),
        ),
        security_context: Some(restricted_container_security()),
        resources: Some(
            overrides
                .and_then(|o| o.tailscale_resources.clone())
                .unwrap_or_else(|| resources("20m", "64Mi", "256Mi")),
        ),
        ..Container::default()
    }
}

fn agent_container(ctx: &RenderContext, parts: &PodParts) -> Container {
    let mut ports = vec![ContainerPort {
        name: Some("admin".to_string()),
        container_port: i32::from(ADMIN_PORT),
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    }];
    ports.extend(parts.agent_ports.iter().cloned());
    let mut mounts = vec![
        mount("config", CONFIG_DIR, true),
        mount("tailscale-socket", SOCKET_DIR, false),
    ];
    mounts.extend(parts.agent_volumes.iter().map(|(_, m)| m.clone()));
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("admin".to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    Container {
        name: "tailnet-agent".to_string(),
        image: Some(ctx.images.agent.clone()),
        image_pull_policy: ctx.images.agent_pull_policy.clone(),
        args: Some(vec!["--config".to_string(), CONFIG_PATH.to_string()]),
        env: Some(vec![
            env_field("POD_IP", "status.podIP"),
            env("RUST_LOG", "info"),
        ]),
        ports: Some(ports),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(Probe {
            period_seconds: Some(10),
            ..probe("/livez")
        }),
        volume_mounts: Some(mounts),
        security_context: Some(restricted_container_security()),
        resources: Some(
            ctx.tailnet
                .agent
                .as_ref()
                .and_then(|o| o.resources.clone())
                .unwrap_or_else(|| resources("10m", "32Mi", "256Mi")),
        ),
        ..Container::default()
    }
}

/// The agent Deployment.
pub fn deployment(owner: &Owner, ctx: &RenderContext, parts: &PodParts) -> Deployment {
    let names = owner.names();
    let mut volumes = vec![
        Volume {
            name: "config".to_string(),
            config_map: Some(ConfigMapVolumeSource {
                name: names.config.clone(),
                items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                    key: CONFIG_KEY.to_string(),
                    path: CONFIG_KEY.to_string(),
                    mode: None,
                }]),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        empty_dir("tailscale-socket"),
        empty_dir("tailscale-tmp"),
        service_account_volume(),
    ];
    if ctx.server_ca_pem.is_some() {
        volumes.push(server_ca_volume(&names.config));
    }
    volumes.extend(parts.agent_volumes.iter().map(|(v, _)| v.clone()));
    // A new CA bundle restarts the pod: Go reads its roots once, at the first TLS dial.
    let config_hash = match ctx.server_ca_pem {
        Some(pem) => config_hash(&[&parts.config_hash, pem]),
        None => parts.config_hash.clone(),
    };
    let scheduling = ctx.tailnet.agent.as_ref();
    let sysctls = parts.unprivileged_port_start.map(|start| {
        vec![Sysctl {
            name: "net.ipv4.ip_unprivileged_port_start".to_string(),
            value: start.to_string(),
        }]
    });
    let pods = agent_pods(owner.kind);
    Deployment {
        metadata: owner.meta(&names.base),
        spec: Some(DeploymentSpec {
            replicas: Some(pods.replicas),
            strategy: Some(DeploymentStrategy {
                type_: Some(pods.strategy.to_string()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some(owner.selector_labels()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(owner.labels()),
                    annotations: Some(BTreeMap::from([(
                        labels::CONFIG_HASH.to_string(),
                        config_hash,
                    )])),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names.base.clone()),
                    // Only the tailscale container gets the token (`service_account_volume`).
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        fs_group: Some(RUN_AS),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_string(),
                            localhost_profile: None,
                        }),
                        sysctls,
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![
                        tailscale_container(owner, ctx, parts),
                        agent_container(ctx, parts),
                    ],
                    volumes: Some(volumes),
                    // Scheduling from the Tailnet's spec.agent.
                    image_pull_secrets: scheduling
                        .map(|o| o.image_pull_secrets.clone())
                        .filter(|v| !v.is_empty()),
                    node_selector: scheduling
                        .map(|o| o.node_selector.clone())
                        .filter(|m| !m.is_empty()),
                    tolerations: scheduling
                        .map(|o| o.tolerations.clone())
                        .filter(|v| !v.is_empty()),
                    affinity: scheduling.and_then(|o| o.affinity.clone()),
                    priority_class_name: scheduling.and_then(|o| o.priority_class_name.clone()),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    }
}

/// ServiceAccount of the agent pod.
pub fn service_account(owner: &Owner) -> ServiceAccount {
    ServiceAccount {
        metadata: owner.meta(&owner.names().base),
        ..ServiceAccount::default()
    }
}

/// Role limited to the agent's own state Secret (containerboot reads and writes it).
pub fn role(owner: &Owner) -> Role {
    let names = owner.names();
    Role {
        metadata: owner.meta(&names.base),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".to_string()]),
            resource_names: Some(vec![names.state_secret.clone()]),
            verbs: vec!["get".to_string(), "update".to_string(), "patch".to_string()],
            ..PolicyRule::default()
        }]),
    }
}

pub fn role_binding(owner: &Owner) -> RoleBinding {
    let names = owner.names();
    RoleBinding {
        metadata: owner.meta(&names.base),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: names.base.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name: names.base.clone(),
            namespace: Some(owner.namespace.clone()),
            ..Subject::default()
        }]),
    }
}

/// The state Secret, created empty so the Role can name it; containerboot fills it.
pub fn state_secret(owner: &Owner) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: owner.meta(&owner.names().state_secret),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}

/// The auth Secret carrying a freshly minted single-use pre-auth key. Only the controller
/// calls this (never the offline renderer), and the key is never logged.
pub fn auth_secret(owner: &Owner, pre_auth_key: &str) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: owner.meta(&owner.names().auth_secret),
        type_: Some("Opaque".to_string()),
        string_data: Some(BTreeMap::from([(
            AUTH_KEY.to_string(),
            pre_auth_key.to_string(),
        )])),
        ..Default::default()
    }
}

/// The agent's ConfigMap: its config, and the Tailnet's server CA bundle when it has one
/// (copied: the agent may run in another namespace than the operator's ConfigMap).
pub fn config_map(
    owner: &Owner,
    config_json: &str,
    server_ca_pem: Option<&str>,
) -> k8s_openapi::api::core::v1::ConfigMap {
    let mut data = BTreeMap::from([(CONFIG_KEY.to_string(), config_json.to_string())]);
    if let Some(pem) = server_ca_pem {
        data.insert(SERVER_CA_KEY.to_string(), pem.to_string());
    }
    k8s_openapi::api::core::v1::ConfigMap {
        metadata: owner.meta(&owner.names().config),
        data: Some(data),
        ..Default::default()
    }
}

/// SHA-256 (hex, first 16 chars) of the inputs that require a pod restart.
pub fn config_hash(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}
