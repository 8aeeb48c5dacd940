//! The agent Deployment and its RBAC, shared by egress and ingress agents.
//!
//! Pod contract: one replica, Recreate ([`agent_pods`]); container `tailscale` is the official
//! image running `tailscaled` itself (no containerboot supervisor) in userspace mode, its state
//! in a Secret (`--state=kube:<secret>`), logging in once from a config file the auth Secret
//! carries with the pre-auth key ([`TailscaledLogin`]); container `tailnet-agent` talks to
//! tailscaled only through the LocalAPI socket in a shared emptyDir. No NET_ADMIN, no
//! `/dev/net/tun`, non-root, read-only root filesystem.
//!
//! Least privilege: the pod does not automount a ServiceAccount token. Only the tailscale
//! container (tailscaled reads and writes its state Secret) gets one, through a projected
//! volume at the default path; the agent container, which parses tailnet traffic, has no
//! Kubernetes credentials at all.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapProjection, ConfigMapVolumeSource, Container, ContainerPort,
    DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretVolumeSource,
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
/// Key of tailscaled's login config (with the same key) in the auth Secret.
pub const LOGIN_CONFIG_KEY: &str = "tailscaled.json";
/// Where the tailscale container finds the auth Secret's login config (an optional volume:
/// once the node exists the operator deletes the Secret and tailscaled boots from its state).
pub const LOGIN_CONFIG_DIR: &str = "/etc/tailscaled";
/// The auth Secret's volume.
const LOGIN_VOLUME: &str = "tailscaled-login";
/// The official image's tailscaled.
pub const TAILSCALED: &str = "/usr/local/bin/tailscaled";
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
        AgentKind::Egress | AgentKind::Ingress | AgentKind::Service | AgentKind::Gateway => {
            AgentPods {
                replicas: 1,
                strategy: "Recreate",
            }
        }
    }
}

/// Agent-specific parts of the pod.
#[derive(Clone, Debug, Default)]
pub struct PodParts {
    /// The node's tailnet hostname (in tailscaled's login config, [`TailscaledLogin`]).
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

/// What tailscaled needs for its first login besides the key, written with the key into the
/// auth Secret as tailscaled's config file (`--config`, format `alpha0`). The file is read at
/// start only while the Secret exists; afterwards these settings live in the node's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailscaledLogin {
    /// Headscale's URL (the Tailnet's `spec.server`).
    pub server: String,
    pub hostname: String,
    /// Egress agents dial targets behind subnet routers, which needs the routes accepted.
    pub accept_routes: bool,
    /// Egress agents resolve DNS-name targets through tailscaled's resolver (MagicDNS,
    /// Headscale's extra records, split DNS), which only has the tailnet's DNS configuration
    /// when it accepts it. In userspace networking tailscaled never touches the pod's
    /// /etc/resolv.conf, so the pod's own resolution is unchanged.
    pub accept_dns: bool,
}

impl TailscaledLogin {
    /// The login of an agent of `kind` with tailnet `hostname` on `server`.
    pub fn for_agent(kind: AgentKind, server: &str, hostname: &str) -> Self {
        let egress = kind == AgentKind::Egress;
        Self {
            server: server.to_string(),
            hostname: hostname.to_string(),
            accept_routes: egress,
            accept_dns: egress,
        }
    }

    /// tailscaled's config file holding `pre_auth_key` (a Secret's content: never logged).
    /// `Locked: false` keeps `tailscale set` usable for debugging.
    pub fn config_json(&self, pre_auth_key: &str) -> String {
        serde_json::json!({
            "version": "alpha0",
            "Locked": false,
            "ServerURL": self.server,
            "AuthKey": pre_auth_key,
            "Enabled": true,
            "Hostname": self.hostname,
            "acceptRoutes": self.accept_routes,
            "acceptDNS": self.accept_dns,
        })
        .to_string()
    }
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

/// tailscaled's arguments: LocalAPI socket shared with the agent, state in the state Secret,
/// userspace networking, no log upload to a third party (self-hosted control), the login
/// config from the auth Secret when it exists.
fn tailscaled_args(state_secret: &str) -> Vec<String> {
    vec![
        format!("--socket={LOCALAPI_SOCKET}"),
        format!("--state=kube:{state_secret}"),
        "--statedir=/tmp".to_string(),
        "--tun=userspace-networking".to_string(),
        "--no-logs-no-support".to_string(),
        format!("--config=optional:{LOGIN_CONFIG_DIR}/{LOGIN_CONFIG_KEY}"),
    ]
}

fn tailscale_container(owner: &Owner, ctx: &RenderContext) -> Container {
    let names = owner.names();
    let overrides = ctx.tailnet.agent.as_ref();
    let resources = overrides
        .and_then(|o| o.tailscale_resources.clone())
        .unwrap_or_else(|| resources("20m", "64Mi", "256Mi"));
    // The Go runtime's soft limit below the container's: tailscaled collects harder near
    // the limit instead of being OOM-killed (see go_memory).
    let go_memory_limit = resources
        .limits
        .as_ref()
        .and_then(|limits| limits.get("memory"))
        .and_then(crate::go_memory::go_memory_limit);
    Container {
        name: "tailscale".to_string(),
        image: Some(ctx.images.tailscale.clone()),
        image_pull_policy: ctx.images.tailscale_pull_policy.clone(),
        command: Some(vec![TAILSCALED.to_string()]),
        args: Some(tailscaled_args(&names.state_secret)),
        env: Some(
            // POD_NAME/POD_UID: tailscaled's Secret store names the pod in its Events.
            [
                env_field("POD_IP", "status.podIP"),
                env_field("POD_NAME", "metadata.name"),
                env_field("POD_UID", "metadata.uid"),
            ]
            .into_iter()
            .chain(
                ctx.server_ca_pem
                    .map(|_| env("SSL_CERT_DIR", SERVER_CA_CERT_DIRS)),
            )
            .chain(go_memory_limit.map(|limit| env("GOMEMLIMIT", limit)))
            .collect(),
        ),
        volume_mounts: Some(
            [
                mount("tailscale-socket", SOCKET_DIR, false),
                mount("tailscale-tmp", "/tmp", false),
                mount(LOGIN_VOLUME, LOGIN_CONFIG_DIR, true),
                // tailscaled keeps the node state in its Secret (`--state=kube:`).
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
        resources: Some(resources),
        ..Container::default()
    }
}

/// tailscaled's first login for the agent of `owner` (see [`TailscaledLogin`]).
pub fn login(owner: &Owner, ctx: &RenderContext, parts: &PodParts) -> TailscaledLogin {
    TailscaledLogin::for_agent(owner.kind, &ctx.tailnet.server, &parts.hostname)
}

/// The auth Secret's login config, if the Secret exists (optional: after the first login the
/// operator deletes it and tailscaled boots from its state). Mounted into the tailscale
/// container only, like the ingress's certificate into the agent's.
fn login_volume(auth_secret: &str) -> Volume {
    Volume {
        name: LOGIN_VOLUME.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(auth_secret.to_string()),
            items: Some(vec![KeyToPath {
                key: LOGIN_CONFIG_KEY.to_string(),
                path: LOGIN_CONFIG_KEY.to_string(),
                mode: None,
            }]),
            default_mode: None,
            optional: Some(true),
        }),
        ..Volume::default()
    }
}

/// The agent's `RUST_LOG` when the Tailnet sets no `spec.agent.logLevel`.
pub const DEFAULT_AGENT_LOG_LEVEL: &str = "info";

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
    let overrides = ctx.tailnet.agent.as_ref();
    // The Tailnet's spec.agent.logLevel/logFormat; unset: info, text (the agent's default,
    // so no flag: an upgrade does not restart agents whose Tailnet sets neither).
    let log_level = overrides.and_then(|o| o.log_level.as_deref());
    let mut args = vec!["--config".to_string(), CONFIG_PATH.to_string()];
    if let Some(format) = overrides.and_then(|o| o.log_format) {
        args.extend(["--log-format".to_string(), format.as_str().to_string()]);
    }
    Container {
        name: "tailnet-agent".to_string(),
        image: Some(ctx.images.agent.clone()),
        image_pull_policy: ctx.images.agent_pull_policy.clone(),
        args: Some(args),
        env: Some(vec![
            env_field("POD_IP", "status.podIP"),
            env("RUST_LOG", log_level.unwrap_or(DEFAULT_AGENT_LOG_LEVEL)),
        ]),
        ports: Some(ports),
        // `/readyz` every second until the agent is first ready, so the pod turns ready the
        // moment it is: the kubelet probes readiness right after a startup probe succeeds,
        // and the readiness change wakes the operator. (`/readyz` and not an endpoint of its
        // own: an agent image pinned to an older release has it too.)
        startup_probe: Some(Probe {
            period_seconds: Some(1),
            failure_threshold: Some(STARTUP_PROBE_FAILURES),
            ..probe("/readyz")
        }),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(Probe {
            period_seconds: Some(10),
            ..probe("/livez")
        }),
        volume_mounts: Some(mounts),
        security_context: Some(restricted_container_security()),
        resources: Some(
            overrides
                .and_then(|o| o.resources.clone())
                .unwrap_or_else(|| resources("10m", "32Mi", "256Mi")),
        ),
        ..Container::default()
    }
}

/// The agent's startup probe may fail this often (once a second): an agent not ready within
/// 10 minutes of its start (e.g. Headscale unreachable all along) has its container restarted
/// by the kubelet, tailscaled's container not.
const STARTUP_PROBE_FAILURES: i32 = 600;

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
        login_volume(&names.auth_secret),
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
                    containers: vec![tailscale_container(owner, ctx), agent_container(ctx, parts)],
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

/// Role limited to the agent's own state Secret (tailscaled reads and writes it).
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

/// The state Secret, created empty so the Role can name it; tailscaled fills it.
pub fn state_secret(owner: &Owner) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: owner.meta(&owner.names().state_secret),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    }
}

/// The auth Secret carrying a freshly minted single-use pre-auth key, alone and in tailscaled's
/// login config. Only the controller calls this (never the offline renderer), and the key is
/// never logged.
pub fn auth_secret(
    owner: &Owner,
    pre_auth_key: &str,
    login: &TailscaledLogin,
) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: owner.meta(&owner.names().auth_secret),
        type_: Some("Opaque".to_string()),
        string_data: Some(BTreeMap::from([
            (AUTH_KEY.to_string(), pre_auth_key.to_string()),
            (
                LOGIN_CONFIG_KEY.to_string(),
                login.config_json(pre_auth_key),
            ),
        ])),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// tailscaled's `alpha0` config: the field names its parser reads (`ipn.ConfigVAlpha`),
    /// booleans as JSON booleans (its `opt.Bool` refuses strings), per kind.
    #[test]
    fn login_config_is_tailscaleds_alpha0_format() {
        let egress = TailscaledLogin::for_agent(
            AgentKind::Egress,
            "https://headscale.example.net",
            "tailnet-egress-team-a",
        );
        let parsed: serde_json::Value =
            serde_json::from_str(&egress.config_json("hskey-auth-1")).expect("JSON");
        assert_eq!(
            parsed,
            serde_json::json!({
                "version": "alpha0",
                "Locked": false,
                "ServerURL": "https://headscale.example.net",
                "AuthKey": "hskey-auth-1",
                "Enabled": true,
                "Hostname": "tailnet-egress-team-a",
                "acceptRoutes": true,
                "acceptDNS": true,
            })
        );
        for kind in [AgentKind::Ingress, AgentKind::Service] {
            let login = TailscaledLogin::for_agent(kind, "https://h", "n");
            assert!(!login.accept_routes && !login.accept_dns, "{kind:?}");
        }
    }
}
