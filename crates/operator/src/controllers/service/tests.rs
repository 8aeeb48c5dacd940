//! The Service decision table: `decide` for a Service of the tailnet `loadBalancerClass`,
//! with hand-made observations (no environment): its own reasons (`PortsSupported`), the
//! ingress vocabulary it shares, `status.loadBalancer`, and that other Services are ignored.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Service, ServiceStatus};
use tailnet_api::agent_status::ProbeState;
use tailnet_api::conditions::{reasons, types};
use tailnet_api::naming::{AgentKind, entrance_tag};
use tailnet_headscale::Node;
use tailnet_render::backends::ObservedBackends;

use super::super::agent::decide::{self as agent, Admission, Decide, Decision};
use super::super::agent::observation::{AgentObserved, AuthSecret, Observation};
use super::super::ingress::observation::IngressObserved;
use super::super::reason_coverage::assert_every_reason_has_a_case;
use super::super::test_fixtures as fx;
use super::decide::LoadBalancer;

const NAMESPACE: &str = "team-a";
const RESOURCE: &str = "Service/team-a/web";
const HOSTNAME: &str = "portal.team-a.lab.example.net";

fn tag() -> String {
    entrance_tag(
        AgentKind::Service,
        &fx::tailnet(&[]).spec.policy.tag_prefix,
        NAMESPACE,
        "web",
    )
}

/// Service `web` in team-a: two TCP ports (http 80, 5432) and one UDP port (dns 53).
fn service_with(class: Option<&str>, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web", "namespace": NAMESPACE, "uid": "service-uid", "generation": 1,
            "creationTimestamp": "2026-05-01T00:00:00Z", "annotations": annotations,
        },
        "spec": {
            "type": "LoadBalancer", "loadBalancerClass": class,
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080},
                {"port": 5432, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ],
        },
    }))
    .expect("service fixture")
}

fn service() -> Service {
    service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({
            "tailnet-operator.dev/allow-from": "group:team-a",
            "tailnet-operator.dev/dns-label": "portal",
        }),
    )
}

fn agent_node(online: bool) -> Node {
    fx::node(
        7,
        &tailnet_api::naming::tag_hostname(&tag()),
        &tag(),
        online,
        &["100.64.0.7", "fd7a:115c:a1e0::7"],
    )
}

fn healthy() -> Observation<IngressObserved> {
    let mut backends = ObservedBackends::default();
    backends.add_service(&service());
    Observation {
        access: Ok(fx::access(fx::tailnet(&[RESOURCE]))),
        agent: AgentObserved {
            nodes: Ok(Arc::new(vec![agent_node(true)])),
            auth_secret: AuthSecret::RemovedByUs,
            deployment: Some(fx::deployment(1)),
            report: Some(fx::report(
                vec![],
                vec![
                    fx::probe("http", "web.team-a.svc:80", ProbeState::Reachable),
                    fx::probe("port-5432", "web.team-a.svc:5432", ProbeState::Reachable),
                ],
            )),
        },
        kind: IngressObserved {
            others: Vec::new(),
            entrances: Vec::new(),
            tag: Some(Ok(tag())),
            backends,
            tls_certificate: None,
        },
    }
}

fn with(change: impl FnOnce(&mut Observation<IngressObserved>)) -> Observation<IngressObserved> {
    let mut observed = healthy();
    change(&mut observed);
    observed
}

fn run(service: &Service, observed: &Observation<IngressObserved>) -> Decision<LoadBalancer> {
    let valid = agent::validated::<LoadBalancer>(service, fx::now()).expect("a valid Service");
    agent::decide::<LoadBalancer>(service, &valid, observed, &fx::config(), fx::now())
        .expect("decide")
}

fn conditions(
    status: &ServiceStatus,
) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
    status.conditions.as_deref().unwrap_or_default()
}

/// `ip` and `hostname` of `status.loadBalancer.ingress`, in order.
fn load_balancer(status: &ServiceStatus) -> Vec<String> {
    status
        .load_balancer
        .iter()
        .flat_map(|lb| lb.ingress.iter().flatten())
        .map(|i| {
            i.ip.clone()
                .or_else(|| i.hostname.clone())
                .unwrap_or_default()
        })
        .collect()
}

#[test]
fn two_tcp_ports_are_served_and_udp_is_refused() {
    let decision = run(&service(), &healthy());
    let list = conditions(&decision.status);
    let seen = |type_: &str| fx::condition(list, type_);
    assert_eq!(seen(types::READY), ("True", reasons::READY), "{list:#?}");
    assert_eq!(
        seen(types::PORTS_SUPPORTED),
        ("False", reasons::UNSUPPORTED_PROTOCOL)
    );
    let ports = tailnet_api::conditions::find(list, types::PORTS_SUPPORTED).expect("ports");
    assert!(ports.message.contains("dns (53/UDP)"), "{}", ports.message);
    assert_eq!(seen(types::CERTIFICATE_READY), ("absent", "absent"));
    assert_eq!(
        load_balancer(&decision.status),
        ["100.64.0.7", "fd7a:115c:a1e0::7", HOSTNAME]
    );
    let plan = decision.agent.expect("agent plan");
    assert_eq!(plan.tag, tag());
    assert!(
        plan.tag.starts_with("tag:tno-svc-team-a-web"),
        "{}",
        plan.tag
    );
    let objects = plan.objects.expect("agent objects");
    let ports: Vec<u16> = objects
        .config
        .ingress
        .iter()
        .filter_map(|l| match l {
            tailnet_api::agent_config::IngressListener::Tcp { port, .. } => Some(*port),
            _ => None,
        })
        .collect();
    assert_eq!(ports, [80, 5432]);
    let owner = &objects
        .deployment
        .metadata
        .owner_references
        .as_ref()
        .expect("owner")[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Service", "service-uid")
    );
    assert!(objects.certificate.is_none());
    assert_eq!(objects.hostnames, [HOSTNAME]);
}

#[test]
fn services_of_other_classes_or_types_are_ignored() {
    let config = fx::config();
    for service in [
        service_with(Some("other"), serde_json::json!({})),
        service_with(None, serde_json::json!({})),
        {
            let mut cluster_ip = service();
            if let Some(spec) = cluster_ip.spec.as_mut() {
                spec.type_ = Some("ClusterIP".into());
            }
            cluster_ip
        },
    ] {
        assert_eq!(
            LoadBalancer::admit(&service, &config, fx::now()),
            Admission::Ignore
        );
    }
    assert_eq!(
        LoadBalancer::admit(&service(), &config, fx::now()),
        Admission::Handle
    );
}

#[test]
fn without_allow_from_the_spec_is_invalid_naming_the_annotation() {
    let service = service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({}),
    );
    let refused = agent::validated::<LoadBalancer>(&service, fx::now()).expect_err("invalid");
    let list = conditions(&refused.status);
    assert_eq!(
        fx::condition(list, types::READY),
        ("False", reasons::INVALID_SPEC)
    );
    let spec = tailnet_api::conditions::find(list, types::SPEC_VALID).expect("SpecValid");
    assert!(
        spec.message
            .contains("metadata.annotations[tailnet-operator.dev/allow-from]"),
        "{}",
        spec.message
    );
    assert!(refused.agent.is_none());
}

#[test]
fn only_udp_ports_is_an_invalid_spec() {
    let mut service = service();
    if let Some(spec) = service.spec.as_mut() {
        spec.ports
            .as_mut()
            .expect("ports")
            .retain(|p| p.protocol.as_deref() == Some("UDP"));
    }
    let refused = agent::validated::<LoadBalancer>(&service, fx::now()).expect_err("invalid");
    let spec = tailnet_api::conditions::find(conditions(&refused.status), types::SPEC_VALID)
        .expect("SpecValid");
    assert!(spec.message.contains("no TCP port"), "{}", spec.message);
}

#[test]
fn sources_outside_the_allowlist_are_refused_and_named() {
    let service = service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({"tailnet-operator.dev/allow-from": "group:team-a, group:everyone"}),
    );
    let decision = run(&service, &healthy());
    let list = conditions(&decision.status);
    assert_eq!(
        fx::condition(list, types::SOURCES_ALLOWED),
        ("False", reasons::SOURCE_NOT_ALLOWED)
    );
    let sources = tailnet_api::conditions::find(list, types::SOURCES_ALLOWED).expect("sources");
    assert!(
        sources.message.contains("group:everyone"),
        "{}",
        sources.message
    );
    let plan = decision.agent.expect("plan");
    assert_eq!(plan.kind.ingress.not_allowed(), ["group:everyone"]);
}

#[test]
fn no_node_yet_means_no_load_balancer_address() {
    let mut previous = service();
    previous.status = Some(ServiceStatus {
        load_balancer: Some(k8s_openapi::api::core::v1::LoadBalancerStatus {
            ingress: Some(vec![k8s_openapi::api::core::v1::LoadBalancerIngress {
                ip: Some("100.64.0.1".into()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    let decision = run(
        &previous,
        &with(|o| o.agent.nodes = Ok(Arc::new(Vec::new()))),
    );
    assert!(load_balancer(&decision.status).is_empty());
    assert_eq!(
        fx::condition(conditions(&decision.status), types::READY).0,
        "False"
    );
}

#[test]
fn a_tailnet_annotation_or_the_default_tailnet() {
    assert_eq!(LoadBalancer::tailnet_name(&service()), None);
    let named = service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({"tailnet-operator.dev/tailnet": "demo"}),
    );
    assert_eq!(LoadBalancer::tailnet_name(&named), Some("demo"));
}

#[test]
fn every_reason_of_the_service_decisions_has_a_case() {
    let mut seen = BTreeSet::new();
    let mut record = |decision: &Decision<LoadBalancer>| {
        for c in conditions(&decision.status) {
            seen.insert(c.reason.clone());
        }
    };
    let all_tcp = {
        let mut s = service();
        if let Some(spec) = s.spec.as_mut() {
            spec.ports
                .as_mut()
                .expect("ports")
                .retain(|p| p.protocol.as_deref() != Some("UDP"));
        }
        s
    };
    record(&run(&service(), &healthy()));
    record(&run(&all_tcp, &healthy()));
    let refusing = service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({"tailnet-operator.dev/allow-from": "group:everyone"}),
    );
    record(&run(&refusing, &healthy()));
    record(&run(
        &service(),
        &with(|o| o.agent.nodes = Ok(Arc::new(Vec::new()))),
    ));
    // Its own reasons (decide.rs, mod.rs's Events) and the shared ones this table drives;
    // the ingress's other reasons are the ingress table's.
    const SHARED: &str = "reasons::ONLINE reasons::REACHABLE reasons::NODE_NOT_REGISTERED";
    assert_every_reason_has_a_case(
        &seen,
        &[include_str!("decide.rs"), include_str!("mod.rs"), SHARED],
    );
}

/// Issue 29 item 2: on a Tailnet without `ingressNameTemplate` a Service's tcp ports are
/// still served, and `hostname` is its node's MagicDNS name (`<givenName>.<magicDNSDomain>`);
/// without the domain only the addresses are published.
#[test]
fn without_a_name_template_the_hostname_is_the_nodes_magic_dns_name() {
    let untemplated = |domain: Option<&str>| {
        with(|o| {
            if let Ok(access) = o.access.as_mut()
                && let Some(dns) = access.tailnet.spec.dns.as_mut()
            {
                dns.ingress_name_template = None;
                dns.ingress_alias_template = None;
                dns.magic_dns_domain = domain.map(str::to_string);
            }
        })
    };
    let decision = run(&service(), &untemplated(Some("ts.example.net")));
    let list = conditions(&decision.status);
    assert_eq!(
        fx::condition(list, types::READY),
        ("True", reasons::READY),
        "{list:#?}"
    );
    let magic = format!(
        "{}.ts.example.net",
        tailnet_api::naming::tag_hostname(&tag())
    );
    assert_eq!(
        load_balancer(&decision.status),
        ["100.64.0.7", "fd7a:115c:a1e0::7", magic.as_str()]
    );
    let objects = decision.agent.and_then(|p| p.objects).expect("objects");
    assert!(objects.hostnames.is_empty(), "{:?}", objects.hostnames);
    assert_eq!(objects.config.ingress.len(), 2);

    let decision = run(&service(), &untemplated(None));
    assert_eq!(
        load_balancer(&decision.status),
        ["100.64.0.7", "fd7a:115c:a1e0::7"]
    );
    // Nothing Headscale sends is published unchecked.
    let mut odd = agent_node(true);
    odd.given_name = "bad name".into();
    assert_eq!(
        super::decide::magic_dns_name(&odd, Some("ts.example.net")),
        None
    );
}

/// Split horizon for Services: the annotation lists the namespaces; the agent gets its
/// in-cluster Service and serves the ports on its pod IP.
#[test]
fn the_in_cluster_annotation_adds_the_in_cluster_service() {
    let listed = service_with(
        Some(tailnet_api::service::LOAD_BALANCER_CLASS),
        serde_json::json!({
            "tailnet-operator.dev/allow-from": "group:team-a",
            "tailnet-operator.dev/dns-label": "portal",
            "tailnet-operator.dev/in-cluster-namespaces": "team-b",
        }),
    );
    let decision = run(&listed, &healthy());
    let objects = decision.agent.and_then(|p| p.objects).expect("objects");
    assert!(objects.config.in_cluster);
    let in_cluster = objects.in_cluster_service.expect("in-cluster Service");
    assert_eq!(
        in_cluster.metadata.name.as_deref(),
        Some("tailnet-service-web")
    );
    let ports: Vec<i32> = in_cluster
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [80, 5432]);
    let plain = run(&service(), &healthy());
    assert!(
        plain
            .agent
            .and_then(|p| p.objects)
            .expect("objects")
            .in_cluster_service
            .is_none()
    );
}

/// Issue 29 item 4: the agent of a Service reaches the Service's pods on their target ports,
/// DNS, the observed control plane (Kubernetes API, Headscale) and the tailnet's transport
/// (UDP, TCP 443) only; without the control plane's addresses its egress is left open rather
/// than cut off.
#[test]
fn the_agent_of_a_service_reaches_only_its_endpoints_and_the_control_plane() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let open = run(&service(), &healthy());
    let policy = open
        .agent
        .and_then(|p| p.objects)
        .expect("objects")
        .network_policy;
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    assert!(spec.egress.is_none());

    let observed = with(|o| {
        o.kind.backends.control_plane = vec![
            "192.0.2.1:6443".parse().expect("addr"),
            "192.0.2.2:8443".parse().expect("addr"),
        ];
    });
    let decision = run(&service(), &observed);
    let spec = decision
        .agent
        .and_then(|p| p.objects)
        .expect("objects")
        .network_policy
        .spec
        .expect("spec");
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    let rules = spec.egress.expect("egress rules");
    let backend = &rules[0];
    let peer = &backend.to.as_ref().expect("to")[0];
    assert_eq!(
        peer.pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone()),
        Some(std::collections::BTreeMap::from([(
            "app".to_string(),
            "web".to_string()
        )]))
    );
    assert!(peer.namespace_selector.is_none() && peer.ip_block.is_none());
    let ports: Vec<(Option<String>, Option<IntOrString>)> = backend
        .ports
        .iter()
        .flatten()
        .map(|p| (p.protocol.clone(), p.port.clone()))
        .collect();
    assert_eq!(
        ports,
        vec![
            (Some("TCP".into()), Some(IntOrString::Int(8080))),
            (Some("TCP".into()), Some(IntOrString::Int(5432))),
        ],
        "the TCP target ports, not the UDP one"
    );
    let blocks: Vec<(String, Option<IntOrString>)> = rules
        .iter()
        .filter_map(|r| {
            let block = r.to.as_ref()?.first()?.ip_block.as_ref()?;
            Some((block.cidr.clone(), r.ports.as_ref()?.first()?.port.clone()))
        })
        .collect();
    assert_eq!(
        blocks,
        vec![
            ("192.0.2.1/32".to_string(), Some(IntOrString::Int(6443))),
            ("192.0.2.2/32".to_string(), Some(IntOrString::Int(8443))),
        ]
    );
    // Nothing else names a peer: DNS and the transport rules restrict ports only.
    let peerless: Vec<Vec<(Option<String>, Option<IntOrString>)>> = rules
        .iter()
        .filter(|r| r.to.is_none())
        .map(|r| {
            r.ports
                .iter()
                .flatten()
                .map(|p| (p.protocol.clone(), p.port.clone()))
                .collect()
        })
        .collect();
    assert_eq!(
        peerless,
        vec![
            vec![
                (Some("UDP".into()), Some(IntOrString::Int(53))),
                (Some("TCP".into()), Some(IntOrString::Int(53))),
            ],
            vec![
                (Some("UDP".into()), None),
                (Some("TCP".into()), Some(IntOrString::Int(443))),
            ],
        ]
    );
}
