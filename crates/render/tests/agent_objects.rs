//! The agent objects for the demo egress and ingress: the pod contract of SPEC §2 (security,
//! containerboot env, no SOCKS5), owner references, NetworkPolicies, Services, certificates.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use tailnet_api::agent_config::{ADMIN_PORT, IngressListener};
use tailnet_api::ingress::ExposeMode;
use tailnet_api::validate::ingress_in_context;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_render::RenderContext;
use tailnet_render::egress;
use tailnet_render::images::Images;
use tailnet_render::ingress::{self, IngressInputs};

fn load<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("example file");
    let mut value: serde_json::Value = serde_yaml::from_str(&text).expect("yaml");
    value["metadata"]["uid"] = "uid-1".into();
    serde_json::from_value(value).expect("typed example")
}

fn ctx(tailnet: &Tailnet) -> RenderContext<'_> {
    RenderContext {
        operator_namespace: "tailnet-system",
        tailnet_name: "demo",
        tailnet: &tailnet.spec,
        images: Images::default(),
        cluster_domain: "cluster.local",
        server_ca_pem: None,
        cluster_network: None,
        restrict_agent_egress: true,
    }
}

fn pod(deployment: &k8s_openapi::api::apps::v1::Deployment) -> &PodSpec {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
}

fn container<'a>(pod: &'a PodSpec, name: &str) -> &'a Container {
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .expect("container")
}

fn env(c: &Container) -> BTreeMap<String, String> {
    c.env
        .iter()
        .flatten()
        .map(|e| {
            (
                e.name.clone(),
                e.value.clone().unwrap_or_else(|| "<from>".to_string()),
            )
        })
        .collect()
}

/// The tailscale container runs tailscaled itself (no containerboot supervisor): state in the
/// state Secret, userspace networking, its first login from the auth Secret's optional volume,
/// which the agent container never mounts.
#[test]
fn the_tailscale_container_runs_tailscaled_with_its_login() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let pod = pod(&objects.deployment);
    let tailscale = container(pod, "tailscale");
    assert_eq!(
        tailscale.command.as_deref(),
        Some(&["/usr/local/bin/tailscaled".to_string()][..])
    );
    assert_eq!(
        tailscale.args.as_deref().expect("tailscaled args"),
        [
            "--socket=/var/run/tailscale/tailscaled.sock",
            "--state=kube:tailnet-egress-team-a-state",
            "--statedir=/tmp",
            "--tun=userspace-networking",
            "--no-logs-no-support",
            "--config=optional:/etc/tailscaled/tailscaled.json",
        ]
    );
    let ts_env = env(tailscale);
    assert!(
        ts_env.keys().all(|name| !name.starts_with("TS_")),
        "no containerboot settings: {ts_env:?}"
    );
    let login_volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "tailscaled-login")
        .and_then(|v| v.secret.as_ref())
        .expect("login volume");
    assert_eq!(
        login_volume.secret_name.as_deref(),
        Some("tailnet-egress-team-a-auth")
    );
    assert_eq!(
        login_volume.optional,
        Some(true),
        "gone after the first login"
    );
    assert!(
        container(pod, "tailnet-agent")
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.name != "tailscaled-login"),
        "the agent container never sees the pre-auth key"
    );
    // The login: the egress accepts routes and DNS, under its object name.
    assert_eq!(
        objects.login,
        tailnet_render::pod::TailscaledLogin {
            server: "https://control.example.net".to_string(),
            hostname: "tailnet-egress-team-a".to_string(),
            accept_routes: true,
            accept_dns: true,
        }
    );
}

#[test]
fn egress_agent_follows_the_pod_contract() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");

    let deployment = &objects.deployment;
    let spec = deployment.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("Recreate")
    );
    let pod = pod(deployment);
    let security = pod.security_context.as_ref().expect("pod security");
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert!(
        security.sysctls.is_none(),
        "egress agents bind high ports only"
    );

    for c in &pod.containers {
        let sc = c.security_context.as_ref().expect("container security");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()]),
            "{}",
            c.name
        );
        assert!(
            sc.capabilities
                .as_ref()
                .and_then(|c| c.add.clone())
                .is_none(),
            "no NET_ADMIN or anything else"
        );
    }
    assert!(
        pod.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "no /dev/net/tun or other host paths"
    );

    // One Service per target, port = target port, targetPort = allocated agent port.
    let services: Vec<(String, i32, String)> = objects
        .services
        .iter()
        .map(|s| {
            let port = &s
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .expect("ports")[0];
            (
                s.metadata.name.clone().unwrap_or_default(),
                port.port,
                format!("{:?}", port.target_port),
            )
        })
        .collect();
    assert_eq!(
        services,
        vec![
            (
                "remote-api".to_string(),
                443,
                "Some(Int(10000))".to_string()
            ),
            (
                "remote-db".to_string(),
                5432,
                "Some(Int(10001))".to_string()
            ),
        ]
    );
    assert_eq!(objects.config.egress.len(), 2);
    assert_eq!(objects.config.egress[1].target_host, "192.0.2.10");
    assert_eq!(objects.config.egress[1].target_port, 5432);

    // NetworkPolicy: consumer namespaces on the listener ports, admin port open for metrics.
    let np = objects.network_policy.spec.as_ref().expect("np");
    let rules = np.ingress.as_ref().expect("rules");
    let from = rules[0].from.as_ref().expect("from")[0]
        .namespace_selector
        .as_ref()
        .expect("ns selector");
    assert_eq!(
        from.match_expressions.as_ref().expect("expr")[0].values,
        Some(vec!["team-a".to_string()])
    );
    assert_eq!(rules[0].ports.as_ref().map(Vec::len), Some(2));
    assert_eq!(
        format!("{:?}", rules[1].ports.as_ref().expect("ports")[0].port),
        format!("Some(Int({ADMIN_PORT}))")
    );

    // Every object is owned by the egress and labelled.
    let metas = [
        &objects.deployment.metadata,
        &objects.service_account.metadata,
        &objects.role.metadata,
        &objects.role_binding.metadata,
        &objects.config_map.metadata,
        &objects.state_secret.metadata,
        &objects.network_policy.metadata,
        &objects.services[0].metadata,
    ];
    for meta in metas {
        let owner = &meta.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("TailnetEgress", "uid-1", Some(true))
        );
        assert_eq!(
            meta.labels.as_ref().expect("labels")["app.kubernetes.io/managed-by"],
            "tailnet-operator"
        );
        assert_eq!(meta.namespace.as_deref(), Some("tailnet-system"));
    }
    // The Role only reaches the agent's own state Secret.
    let rule = &objects.role.rules.as_ref().expect("rules")[0];
    assert_eq!(
        rule.resource_names,
        Some(vec!["tailnet-egress-team-a-state".to_string()])
    );
    assert!(
        !rule.verbs.contains(&"list".to_string()) && !rule.verbs.contains(&"create".to_string())
    );
}

#[test]
fn egress_ports_stay_stable_and_target_changes_leave_the_pod_alone() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let first = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let mut changed = egress.clone();
    changed.spec.targets.insert(
        0,
        serde_json::from_value(
            serde_json::json!({"name": "aaa-first", "address": "192.0.2.11", "port": 22}),
        )
        .expect("target"),
    );
    let second = egress::render(&changed, &ctx(&tailnet), &first.ports).expect("render");
    assert_eq!(second.ports["remote-api"], first.ports["remote-api"]);
    assert_eq!(second.ports["remote-db"], first.ports["remote-db"]);
    assert_eq!(second.ports["aaa-first"], 10002);
    let hash = |o: &egress::EgressObjects| {
        o.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.clone())
            .expect("annotations")["tailnet-operator.dev/config-hash"]
            .clone()
    };
    // A new target changes only the ConfigMap (re-read by the agent) and the Services: the pod
    // template stays, so the running pod, its connections and its node stay.
    assert_eq!(hash(&first), hash(&second));
    assert_eq!(first.deployment, second.deployment);
    assert_ne!(first.config_map, second.config_map);
    // Another Headscale server does need a new pod (tailscaled logs in at start).
    let mut moved = tailnet.clone();
    moved.spec.server = "https://other.example.net".into();
    let third = egress::render(&egress, &ctx(&moved), &first.ports).expect("render");
    assert_ne!(hash(&first), hash(&third));
    // Same input, same output.
    let again = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(hash(&first), hash(&again));
    assert_eq!(first.deployment, again.deployment);
}

fn ingress_inputs(tailnet: &Tailnet, ingress: &TailnetIngress, serve_http: bool) -> IngressInputs {
    let names = ingress_in_context(
        "team-a",
        "tailnet-system",
        &ingress.spec,
        "demo",
        &tailnet.spec,
    )
    .expect("valid");
    IngressInputs {
        names,
        backend_ports: BTreeMap::from([("web".to_string(), 8080), ("admin".to_string(), 8443)]),
        serve_http,
        node_hostname: "tno-ingress-team-a-portal".to_string(),
        kind: tailnet_api::naming::AgentKind::Ingress,
        egress: None,
    }
}

#[test]
fn ingress_agent_serves_vhosts_with_one_certificate() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut ingress: TailnetIngress = load("30-ingress.yaml");
    // The example lists team-a for split horizon; this case is the tailnet-only entrance.
    ingress.spec.in_cluster = None;
    let objects = ingress::render(
        &ingress,
        &ctx(&tailnet),
        &ingress_inputs(&tailnet, &ingress, true),
    )
    .expect("render");

    assert_eq!(
        objects.http_hostnames,
        vec![
            "admin.team-a.lab.example.net",
            "portal.lab.example.net",
            "portal.team-a.lab.example.net"
        ]
    );
    let cert = objects
        .certificate
        .as_ref()
        .expect("certificate from the default issuer");
    assert_eq!(cert.spec.dns_names, objects.http_hostnames);
    assert_eq!(cert.spec.issuer_ref.kind, "ClusterIssuer");
    assert_eq!(cert.spec.secret_name, "tailnet-ingress-portal-tls");
    // The node's hostname is its tag's name (unique like the tag), not the object name.
    assert_eq!(objects.login.hostname, "tno-ingress-team-a-portal");

    // Both exposes are virtual hosts on one listener on port 443.
    assert_eq!(objects.config.ingress.len(), 1);
    let IngressListener::Http { port, routes } = &objects.config.ingress[0] else {
        panic!("http listener")
    };
    assert_eq!(*port, 443);
    assert_eq!(routes.len(), 2);
    let admin = &routes[0];
    let backend = admin.backend.as_ref().expect("backend");
    assert_eq!(backend.host, "admin.team-a.svc.cluster.local");
    assert_eq!(backend.port, 8443);
    let tls = admin.backend_tls.as_ref().expect("verified backend TLS");
    assert_eq!(tls.server_name, "admin.team-a.svc.cluster.local");
    assert_eq!(tls.ca_file, "/etc/tailnet-agent/ca/backend-ca/ca.crt");
    assert_eq!(admin.request_timeout_seconds, Some(600));
    assert_eq!(admin.backend_request_timeout_seconds, Some(60));

    // Port 443 on loopback as non-root: the safe sysctl is set.
    let pod = pod(&objects.deployment);
    let sysctls = pod
        .security_context
        .as_ref()
        .and_then(|s| s.sysctls.clone())
        .expect("sysctls");
    assert_eq!(
        (sysctls[0].name.as_str(), sysctls[0].value.as_str()),
        ("net.ipv4.ip_unprivileged_port_start", "443")
    );
    // Ingress agents accept neither routes nor DNS; the certificate and CA are mounted.
    assert!(!objects.login.accept_routes && !objects.login.accept_dns);
    let mounts: Vec<String> = container(pod, "tailnet-agent")
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .collect();
    assert!(mounts.contains(&"/etc/tailnet-agent/tls".to_string()));
    assert!(mounts.contains(&"/etc/tailnet-agent/ca/backend-ca".to_string()));
    // Nothing in-cluster but the admin port.
    let rules = objects
        .network_policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("rules");
    assert_eq!(rules.len(), 1);
    assert_eq!(
        format!("{:?}", rules[0].ports.as_ref().expect("ports")[0].port),
        format!("Some(Int({ADMIN_PORT}))")
    );
}

#[test]
fn without_a_ready_certificate_http_is_not_served_but_tcp_is() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut ingress: TailnetIngress = load("30-ingress.yaml");
    ingress.spec.exposes.push(
        serde_json::from_value(serde_json::json!({
            "name": "kube", "dnsLabel": "kube", "mode": "tcp", "port": 6443,
            "backend": {"service": "kubernetes", "port": 443, "namespace": "default"}
        }))
        .expect("expose"),
    );
    // Administrative ingress in the operator namespace may reach other namespaces.
    ingress.metadata.namespace = Some("tailnet-system".to_string());
    let names = ingress_in_context(
        "tailnet-system",
        "tailnet-system",
        &ingress.spec,
        "demo",
        &tailnet.spec,
    )
    .expect("valid");
    let inputs = IngressInputs {
        names,
        backend_ports: BTreeMap::from([
            ("web".to_string(), 8080),
            ("admin".to_string(), 8443),
            ("kube".to_string(), 443),
        ]),
        serve_http: false,
        node_hostname: "tno-ingress-team-a-portal".to_string(),
        kind: tailnet_api::naming::AgentKind::Ingress,
        egress: None,
    };
    let objects = ingress::render(&ingress, &ctx(&tailnet), &inputs).expect("render");
    assert_eq!(objects.config.ingress.len(), 1, "only the tcp listener");
    let IngressListener::Tcp { port, backend, .. } = &objects.config.ingress[0] else {
        panic!("tcp listener")
    };
    assert_eq!(
        (*port, backend.host.as_str(), backend.port),
        (6443, "kubernetes.default.svc.cluster.local", 443)
    );
    assert!(
        ingress
            .spec
            .exposes
            .iter()
            .any(|e| e.mode == ExposeMode::Http)
    );
    // The certificate is still requested, so http can start once it is ready.
    assert!(objects.certificate.is_some());
}

#[test]
fn existing_secret_replaces_the_certificate() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut ingress: TailnetIngress = load("30-ingress.yaml");
    ingress.spec.tls = Some(tailnet_api::ingress::IngressTls {
        secret_name: Some("portal-tls".to_string()),
    });
    let objects = ingress::render(
        &ingress,
        &ctx(&tailnet),
        &ingress_inputs(&tailnet, &ingress, true),
    )
    .expect("render");
    assert!(objects.certificate.is_none());
    assert_eq!(objects.tls_secret.as_deref(), Some("portal-tls"));
}

#[test]
fn objects_without_uid_are_refused() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut egress: TailnetEgress = load("20-egress.yaml");
    egress.metadata.uid = None;
    let err = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect_err("no uid");
    assert!(err.to_string().contains("no metadata.uid"));
}

/// Least privilege: only the tailscale container (tailscaled keeps the node state in a
/// Secret, `--state=kube:`) holds a Kubernetes token; the agent container, which parses
/// tailnet traffic, holds none.
#[test]
fn only_the_tailscale_container_holds_a_kubernetes_token() {
    const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let egress_objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let ingress_cr: TailnetIngress = load("30-ingress.yaml");
    let ingress_objects = ingress::render(
        &ingress_cr,
        &ctx(&tailnet),
        &ingress_inputs(&tailnet, &ingress_cr, true),
    )
    .expect("render");
    for deployment in [&egress_objects.deployment, &ingress_objects.deployment] {
        let pod = pod(deployment);
        assert_eq!(
            pod.automount_service_account_token,
            Some(false),
            "no token for every container"
        );
        let agent = container(pod, "tailnet-agent");
        assert!(
            agent
                .volume_mounts
                .iter()
                .flatten()
                .all(|m| !m.mount_path.starts_with("/var/run/secrets")),
            "agent container mounts a token: {:?}",
            agent.volume_mounts
        );
        let tailscale = container(pod, "tailscale");
        let token_mount = tailscale
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == TOKEN_DIR)
            .expect("tailscale container has the token mount");
        assert_eq!(token_mount.read_only, Some(true));
        let volume = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == token_mount.name)
            .expect("token volume");
        let sources = volume
            .projected
            .as_ref()
            .and_then(|p| p.sources.as_ref())
            .expect("projected token volume");
        let token = sources
            .iter()
            .find_map(|s| s.service_account_token.as_ref())
            .expect("serviceAccountToken source");
        assert_eq!(token.path, "token");
        assert!(
            token.expiration_seconds.is_some_and(|s| s <= 3607),
            "short-lived token: {token:?}"
        );
        let ca = sources
            .iter()
            .find_map(|s| s.config_map.as_ref())
            .expect("configMap source");
        assert_eq!(ca.name, "kube-root-ca.crt");
        assert_eq!(
            ca.items
                .as_ref()
                .map(|i| (i[0].key.as_str(), i[0].path.as_str())),
            Some(("ca.crt", "ca.crt"))
        );
        let namespace = sources
            .iter()
            .find_map(|s| s.downward_api.as_ref())
            .and_then(|d| d.items.as_ref())
            .and_then(|items| items.first())
            .expect("downwardAPI source");
        assert_eq!(namespace.path, "namespace");
        assert_eq!(
            namespace.field_ref.as_ref().map(|f| f.field_path.as_str()),
            Some("metadata.namespace")
        );
        // No other container than tailscale mounts it.
        for other in pod.containers.iter().filter(|c| c.name != "tailscale") {
            assert!(
                other
                    .volume_mounts
                    .iter()
                    .flatten()
                    .all(|m| m.name != token_mount.name),
                "{} mounts the token",
                other.name
            );
        }
    }
}

/// `spec.limits` reaches the agent's config; without it the agent's defaults apply (and the
/// config leaves them out).
#[test]
fn connection_limits_reach_the_agent_config() {
    use tailnet_api::agent_config::{
        ConnectionLimits, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
    };
    use tailnet_api::egress::AgentLimits;
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut egress: TailnetEgress = load("20-egress.yaml");
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(
        objects.config.limits,
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_listener: DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
            ..ConnectionLimits::default()
        }
    );
    egress.spec.limits = Some(AgentLimits {
        max_connections: Some(300),
        max_connections_per_listener: Some(1000),
    });
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    // The per-listener limit never exceeds the agent's.
    assert_eq!(
        objects.config.limits,
        ConnectionLimits {
            max_connections: 300,
            max_connections_per_listener: 300,
            ..ConnectionLimits::default()
        }
    );
    let json = objects
        .config_map
        .data
        .as_ref()
        .and_then(|d| d.get("config.json"))
        .expect("config.json");
    assert!(
        json.contains("\"maxConnectionsPerListener\": 300"),
        "{json}"
    );
    egress.spec.limits = Some(AgentLimits {
        max_connections: Some(0),
        max_connections_per_listener: None,
    });
    let Err(error) = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()) else {
        panic!("a limit of 0 is refused");
    };
    assert!(
        error.to_string().contains("spec.limits.maxConnections"),
        "{error}"
    );

    let mut ingress_cr: TailnetIngress = load("30-ingress.yaml");
    ingress_cr.spec.limits = Some(AgentLimits {
        max_connections: None,
        max_connections_per_listener: Some(64),
    });
    let objects = ingress::render(
        &ingress_cr,
        &ctx(&tailnet),
        &ingress_inputs(&tailnet, &ingress_cr, true),
    )
    .expect("render");
    assert_eq!(objects.config.limits.max_connections_per_listener, 64);
    assert_eq!(
        objects.config.limits.max_connections,
        DEFAULT_MAX_CONNECTIONS
    );
}

#[test]
fn agent_pods_get_the_tailnets_scheduling() {
    let mut tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let plain = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let plain_pod = pod(&plain.deployment);
    assert!(plain_pod.node_selector.is_none() && plain_pod.tolerations.is_none());
    assert!(plain_pod.image_pull_secrets.is_none() && plain_pod.priority_class_name.is_none());
    let agent: tailnet_api::tailnet::AgentOverrides = serde_json::from_value(serde_json::json!({
        "imagePullSecrets": [{"name": "mirror"}],
        "nodeSelector": {"pool": "edge"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "tailnet", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        "priorityClassName": "tailnet-agents"
    }))
    .expect("spec.agent");
    tailnet.spec.agent = Some(agent);
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let pod = pod(&objects.deployment);
    assert_eq!(
        pod.image_pull_secrets.as_ref().map(|s| s[0].name.as_str()),
        Some("mirror")
    );
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|m| m.get("pool"))
            .map(String::as_str),
        Some("edge")
    );
    assert_eq!(
        pod.tolerations.as_ref().and_then(|t| t[0].key.as_deref()),
        Some("dedicated")
    );
    assert!(
        pod.affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .is_some()
    );
    assert_eq!(pod.priority_class_name.as_deref(), Some("tailnet-agents"));
}

/// `spec.agent.logLevel`/`logFormat` of the Tailnet reach the tailnet-agent container
/// (`RUST_LOG`, `--log-format`) of egress and ingress agents; unset, the container is what it
/// was (RUST_LOG=info, no flag), so an operator upgrade restarts no agent.
#[test]
fn agent_log_level_and_format_come_from_the_tailnet() {
    let mut tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let ingress_cr: TailnetIngress = load("30-ingress.yaml");
    let agent_log = |deployment: &k8s_openapi::api::apps::v1::Deployment| {
        let agent = container(pod(deployment), "tailnet-agent");
        (
            env(agent).get("RUST_LOG").cloned(),
            agent.args.clone().unwrap_or_default(),
        )
    };
    let plain = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    let config = tailnet_api::agent_config::CONFIG_PATH.to_string();
    assert_eq!(
        agent_log(&plain.deployment),
        (Some("info".into()), vec!["--config".into(), config.clone()])
    );
    tailnet.spec.agent = Some(
        serde_json::from_value(serde_json::json!({
            "logLevel": "info,tailnet_agent::proxy=debug", "logFormat": "json"
        }))
        .expect("spec.agent"),
    );
    let json_args = vec![
        "--config".to_string(),
        config.clone(),
        "--log-format".into(),
        "json".into(),
    ];
    let set = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(
        agent_log(&set.deployment),
        (
            Some("info,tailnet_agent::proxy=debug".into()),
            json_args.clone()
        )
    );
    let ingress = ingress::render(
        &ingress_cr,
        &ctx(&tailnet),
        &ingress_inputs(&tailnet, &ingress_cr, true),
    )
    .expect("render");
    assert_eq!(
        agent_log(&ingress.deployment),
        (Some("info,tailnet_agent::proxy=debug".into()), json_args)
    );
    // Only the tailnet-agent container: tailscaled keeps its own logging.
    let tailscale = container(pod(&set.deployment), "tailscale");
    assert!(!env(tailscale).contains_key("RUST_LOG"));
    // Text given explicitly is passed on; the level alone leaves the format flag out.
    tailnet.spec.agent =
        Some(serde_json::from_value(serde_json::json!({"logLevel": "debug"})).expect("spec.agent"));
    let level_only = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(
        agent_log(&level_only.deployment),
        (
            Some("debug".into()),
            vec!["--config".into(), config.clone()]
        )
    );
    tailnet.spec.agent =
        Some(serde_json::from_value(serde_json::json!({"logFormat": "text"})).expect("spec.agent"));
    let text = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(
        agent_log(&text.deployment),
        (
            Some("info".into()),
            vec![
                "--config".into(),
                config,
                "--log-format".into(),
                "text".into()
            ]
        )
    );
}

#[test]
fn agent_containers_get_the_operators_pull_policies_or_the_kubernetes_default() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let policies = |deployment: &k8s_openapi::api::apps::v1::Deployment| {
        let pod = pod(deployment);
        (
            container(pod, "tailnet-agent").image_pull_policy.clone(),
            container(pod, "tailscale").image_pull_policy.clone(),
        )
    };
    let objects = egress::render(&egress, &ctx(&tailnet), &BTreeMap::new()).expect("render");
    assert_eq!(policies(&objects.deployment), (None, None));
    let mut with_policies = ctx(&tailnet);
    with_policies.images.agent_pull_policy = Some("Always".into());
    with_policies.images.tailscale_pull_policy = Some("Never".into());
    let objects = egress::render(&egress, &with_policies, &BTreeMap::new()).expect("render");
    assert_eq!(
        policies(&objects.deployment),
        (Some("Always".into()), Some("Never".into()))
    );
}

/// A Tailnet with `spec.serverCA`: the bundle is copied into the agent's ConfigMap and only
/// the tailscale container mounts it, with `SSL_CERT_DIR` pointing at it; another bundle rolls
/// the pod; without one nothing of it is rendered.
#[test]
fn the_server_ca_reaches_only_the_tailscale_container() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let with_ca = |pem: &'static str| RenderContext {
        server_ca_pem: Some(pem),
        ..ctx(&tailnet)
    };
    let objects = egress::render(&egress, &with_ca(ca), &BTreeMap::new()).expect("render");
    let data = objects.config_map.data.clone().expect("data");
    assert_eq!(data.get("server-ca.crt").map(String::as_str), Some(ca));
    let spec = pod(&objects.deployment);
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "server-ca")
        .expect("server-ca volume");
    let source = volume
        .config_map
        .as_ref()
        .expect("from the agent ConfigMap");
    assert_eq!(
        source.name,
        objects.config_map.metadata.name.clone().expect("name")
    );
    let items = source.items.clone().unwrap_or_default();
    assert_eq!(
        (items[0].key.as_str(), items[0].path.as_str()),
        ("server-ca.crt", "ca.crt")
    );
    let tailscale = container(spec, "tailscale");
    assert_eq!(
        env(tailscale).get("SSL_CERT_DIR").map(String::as_str),
        Some("/etc/tailnet-operator/server-ca:/etc/ssl/certs")
    );
    assert!(
        tailscale
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "server-ca"
                && m.mount_path == "/etc/tailnet-operator/server-ca"
                && m.read_only == Some(true))
    );
    let agent = container(spec, "tailnet-agent");
    assert!(!env(agent).contains_key("SSL_CERT_DIR"));
    assert!(
        !agent
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "server-ca")
    );

    let hash = |o: &egress::EgressObjects| {
        o.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.clone())
            .expect("annotations")["tailnet-operator.dev/config-hash"]
            .clone()
    };
    let rotated = egress::render(
        &egress,
        &with_ca("-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"),
        &objects.ports,
    )
    .expect("render");
    assert_ne!(hash(&objects), hash(&rotated), "a new CA rolls the pod");

    let without = egress::render(&egress, &ctx(&tailnet), &objects.ports).expect("render");
    assert_ne!(hash(&objects), hash(&without));
    assert!(
        !without
            .config_map
            .data
            .clone()
            .unwrap_or_default()
            .contains_key("server-ca.crt")
    );
    let spec = pod(&without.deployment);
    assert!(!spec.volumes.iter().flatten().any(|v| v.name == "server-ca"));
    assert!(!env(container(spec, "tailscale")).contains_key("SSL_CERT_DIR"));
}

/// Split horizon: without `spec.inCluster` nothing in-cluster is added (no Service, no
/// listener on the pod IP, only the admin port admitted); with it a ClusterIP Service in
/// front of the agent, the listeners on the pod IP too, and the expose ports admitted from
/// the listed namespaces only.
#[test]
fn in_cluster_namespaces_add_a_service_and_admit_only_those_namespaces() {
    let tailnet: Tailnet = load("10-tailnet.yaml");
    let mut ingress: TailnetIngress = load("30-ingress.yaml");
    // The example lists team-a; start from an ingress without `spec.inCluster`.
    let listed = ingress.spec.in_cluster.take();
    assert!(
        listed.is_some(),
        "examples/30-ingress.yaml lists a namespace in spec.inCluster"
    );
    let inputs = ingress_inputs(&tailnet, &ingress, true);
    let plain = ingress::render(&ingress, &ctx(&tailnet), &inputs).expect("render");
    assert!(plain.in_cluster_service.is_none());
    assert!(!plain.config.in_cluster);
    let rules = plain
        .network_policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("rules");
    assert_eq!(rules.len(), 1, "only the admin port: {rules:?}");

    ingress.spec.in_cluster = Some(tailnet_api::ingress::InCluster {
        namespaces: vec!["team-b".into(), "team-a".into(), "team-b".into()],
    });
    let objects = ingress::render(&ingress, &ctx(&tailnet), &inputs).expect("render");
    assert!(objects.config.in_cluster);
    let service = objects
        .in_cluster_service
        .as_ref()
        .expect("in-cluster Service");
    assert_eq!(
        service.metadata.name.as_deref(),
        Some("tailnet-ingress-portal")
    );
    assert_eq!(service.metadata.namespace.as_deref(), Some("team-a"));
    let spec = service.spec.as_ref().expect("spec");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(
        spec.selector,
        objects
            .deployment
            .spec
            .as_ref()
            .and_then(|d| d.selector.match_labels.clone())
    );
    let ports: Vec<(i32, Option<String>)> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.port,
                p.target_port.as_ref().map(|t| match t {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) => {
                        i.to_string()
                    }
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                        s.clone()
                    }
                }),
            )
        })
        .collect();
    assert_eq!(ports, vec![(443, Some("443".to_string()))]);
    let rules = objects
        .network_policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("rules");
    assert_eq!(rules.len(), 2);
    let from = rules[1].from.as_ref().expect("peers");
    let selector = from[0].namespace_selector.as_ref().expect("namespaces");
    let expression = &selector.match_expressions.as_ref().expect("expressions")[0];
    assert_eq!(expression.key, "kubernetes.io/metadata.name");
    assert_eq!(expression.operator, "In");
    assert_eq!(
        expression.values,
        Some(vec!["team-a".to_string(), "team-b".to_string()])
    );
    assert!(from[0].pod_selector.is_none() && from[0].ip_block.is_none());
    let admitted: Vec<_> = rules[1]
        .ports
        .iter()
        .flatten()
        .map(|p| p.port.clone())
        .collect();
    assert_eq!(
        admitted,
        vec![Some(
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(443)
        )]
    );
    let json = serde_json::to_value(&objects.config).expect("json");
    assert_eq!(json["inCluster"], serde_json::json!(true));
    assert!(
        serde_json::to_value(&plain.config)
            .expect("json")
            .get("inCluster")
            .is_none(),
        "configs without it stay what older agents read"
    );
}

/// tailscaled's Go runtime gets a soft limit of 90 % of its container's memory limit (the
/// default 256 Mi, or the Tailnet's `spec.agent.tailscaleResources`); without a memory limit
/// none, and the agent container never gets one.
#[test]
fn tailscaled_gets_a_go_memory_limit_below_its_container_limit() {
    let mut tailnet: Tailnet = load("10-tailnet.yaml");
    let egress: TailnetEgress = load("20-egress.yaml");
    let gomemlimit = |tailnet: &Tailnet| {
        let objects = egress::render(&egress, &ctx(tailnet), &BTreeMap::new()).expect("render");
        let spec = pod(&objects.deployment);
        assert!(!env(container(spec, "tailnet-agent")).contains_key("GOMEMLIMIT"));
        env(container(spec, "tailscale")).get("GOMEMLIMIT").cloned()
    };
    assert_eq!(gomemlimit(&tailnet).as_deref(), Some("230MiB"));

    let with_resources = |resources: serde_json::Value| {
        serde_json::from_value::<tailnet_api::tailnet::AgentOverrides>(
            serde_json::json!({ "tailscaleResources": resources }),
        )
        .expect("overrides")
    };
    tailnet.spec.agent = Some(with_resources(
        serde_json::json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "128Mi"}}),
    ));
    assert_eq!(gomemlimit(&tailnet).as_deref(), Some("921MiB"));
    tailnet.spec.agent = Some(with_resources(
        serde_json::json!({"requests": {"memory": "128Mi"}}),
    ));
    assert_eq!(gomemlimit(&tailnet), None);
}
