use super::*;
use crate::backends::SliceEndpoints;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use pretty_assertions::assert_eq;
use tailnet_api::TailnetIngressSpec;
use tailnet_api::validate::valid_ingress;

/// The exposes of an ingress from YAML (validated like the controller does).
fn exposes(yaml: &str) -> Vec<ValidExpose> {
    let spec: TailnetIngressSpec = serde_yaml::from_str(&format!(
        "tailnetRef: {{name: demo}}\nallowFrom: [\"group:team-a\"]\nexposes:\n{yaml}"
    ))
    .expect("fixture");
    valid_ingress(&spec).expect("valid fixture").exposes
}

fn service(yaml: &str) -> Service {
    serde_yaml::from_str(yaml).expect("service fixture")
}

fn slice(yaml: &str) -> EndpointSlice {
    serde_yaml::from_str(yaml).expect("slice fixture")
}

fn key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(namespace, name)
}

fn control_plane() -> Vec<SocketAddr> {
    vec![
        "192.0.2.1:6443".parse().expect("addr"),
        "[2001:db8::1]:443".parse().expect("addr"),
    ]
}

/// Services `team-a/frontend` (selector app=web, http→8080 and a UDP port),
/// `team-a/manual` (no selector, its slice 10.0.0.5/6 on 5432 named db), `other/shared`
/// (selector app=shared, https→named target `tls`), `team-a/external` (ExternalName).
fn observed() -> ObservedBackends {
    let mut observed = ObservedBackends::default();
    for yaml in [
        "metadata: {name: frontend, namespace: team-a}\nspec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: 8080}, {name: metrics, port: 9090}, {name: dns, port: 53, protocol: UDP}]}",
        "metadata: {name: manual, namespace: team-a}\nspec: {ports: [{name: db, port: 5432}, {name: admin, port: 9000}]}",
        "metadata: {name: shared, namespace: other}\nspec: {selector: {app: shared}, ports: [{name: https, port: 443, targetPort: tls}]}",
        "metadata: {name: external, namespace: team-a}\nspec: {type: ExternalName, externalName: db.example.net}",
    ] {
        observed.add_service(&service(yaml));
    }
    observed.add_endpoint_slices(
        key("team-a", "manual"),
        &[slice(
            "metadata: {name: manual-1, namespace: team-a}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.5]}, {addresses: [10.0.0.6]}]\nports: [{name: db, port: 5432, protocol: TCP}, {name: admin, port: 9000, protocol: UDP}]",
        )],
    );
    observed.control_plane = control_plane();
    observed
}

fn pods(namespace: &str, app: &str, ports: &[IntOrString]) -> BackendPeer {
    BackendPeer::Pods {
        namespace: namespace.to_string(),
        selector: BTreeMap::from([("app".to_string(), app.to_string())]),
        ports: ports.to_vec(),
    }
}

fn addresses(list: &[&str], ports: &[u16]) -> BackendPeer {
    BackendPeer::Addresses {
        addresses: list.iter().map(|a| a.parse().expect("ip")).collect(),
        ports: ports.to_vec(),
    }
}

const WEB: &str = "  - {name: web, dnsLabel: web, mode: http, port: 443, backend: {service: frontend, port: http}}\n";
const METRICS: &str =
    "  - {name: m, dnsLabel: m, mode: tcp, port: 9090, backend: {service: frontend, port: 9090}}\n";
const DB: &str =
    "  - {name: db, dnsLabel: db, mode: tcp, port: 5432, backend: {service: manual, port: 5432}}\n";
const SHARED: &str = "  - {name: s, dnsLabel: s, mode: tcp, port: 8443, backend: {service: shared, namespace: other, port: https}}\n";

#[test]
fn each_backend_is_reached_on_the_ports_its_exposes_use() {
    use IntOrString::{Int, String as Named};
    let table: Vec<(&str, String, Vec<BackendPeer>)> = vec![
        (
            "selector: the pods on the targetPort of the port named",
            WEB.to_string(),
            vec![pods("team-a", "web", &[Int(8080)])],
        ),
        (
            "two exposes of one Service: one peer, both target ports",
            format!("{WEB}{METRICS}"),
            vec![pods("team-a", "web", &[Int(8080), Int(9090)])],
        ),
        (
            "no selector: the slice's addresses on the slice port of the Service port's name",
            DB.to_string(),
            vec![addresses(&["10.0.0.5", "10.0.0.6"], &[5432])],
        ),
        (
            "no selector, a port the slices carry only as UDP: nothing to reach",
            "  - {name: a, dnsLabel: a, mode: tcp, port: 9000, backend: {service: manual, port: admin}}\n".to_string(),
            vec![],
        ),
        (
            "another namespace (administrative ingress): a named target port there",
            SHARED.to_string(),
            vec![pods("other", "shared", &[Named("tls".to_string())])],
        ),
        (
            "a UDP Service port: no TCP to dial there",
            "  - {name: u, dnsLabel: u, mode: tcp, port: 53, backend: {service: frontend, port: dns}}\n".to_string(),
            vec![],
        ),
        (
            "all of them, in expose order",
            format!("{DB}{WEB}{SHARED}{METRICS}"),
            vec![
                addresses(&["10.0.0.5", "10.0.0.6"], &[5432]),
                pods("team-a", "web", &[Int(8080), Int(9090)]),
                pods("other", "shared", &[Named("tls".to_string())]),
            ],
        ),
    ];
    for (case, yaml, want) in table {
        let egress = agent_egress("team-a", &exposes(&yaml), &observed(), None)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(egress.backends, want, "{case}");
        assert_eq!(egress.control_plane, control_plane(), "{case}");
        assert_eq!(egress.namespace, "team-a", "{case}");
        assert_eq!(egress.cluster, None, "{case}");
    }
}

#[test]
fn unrestricted_when_something_the_agent_needs_is_not_known() {
    let many = |count: usize| {
        let endpoints: Vec<String> = (0..count)
            .map(|i| format!("{{addresses: [10.1.{}.{}]}}", i / 250, i % 250 + 1))
            .collect();
        slice(&format!(
            "metadata: {{name: manual-1}}\naddressType: IPv4\nendpoints: [{}]\nports: [{{name: db, port: 5432}}]",
            endpoints.join(", ")
        ))
    };
    type Change = Box<dyn Fn(&mut ObservedBackends)>;
    let table: Vec<(&str, &str, Change, Unrestricted)> = vec![
        (
            "control plane unknown (offline, or not observed)",
            WEB,
            Box::new(|o| o.control_plane.clear()),
            Unrestricted::ControlPlaneUnknown,
        ),
        (
            "backend Service not observed",
            "  - {name: x, dnsLabel: x, mode: tcp, port: 1, backend: {service: gone, port: 1}}\n",
            Box::new(|_| {}),
            Unrestricted::ServiceUnobserved(key("team-a", "gone")),
        ),
        (
            "ExternalName backend",
            "  - {name: x, dnsLabel: x, mode: tcp, port: 1, backend: {service: external, port: 1}}\n",
            Box::new(|_| {}),
            Unrestricted::ExternalName(key("team-a", "external")),
        ),
        (
            "slices of a selector-less Service not read",
            DB,
            Box::new(|o| {
                o.endpoint_slices.clear();
            }),
            Unrestricted::SlicesUnread(key("team-a", "manual")),
        ),
        (
            "FQDN slice",
            DB,
            Box::new(|o| {
                o.add_endpoint_slices(
                    key("team-a", "manual"),
                    &[slice("metadata: {name: m}\naddressType: FQDN\nendpoints: [{addresses: [db.example.net]}]\nports: [{name: db, port: 5432}]")],
                );
            }),
            Unrestricted::FqdnEndpoints(key("team-a", "manual")),
        ),
        (
            "more addresses than the bound",
            DB,
            Box::new(move |o| {
                o.add_endpoint_slices(key("team-a", "manual"), &[many(MAX_ENDPOINT_ADDRESSES + 1)]);
            }),
            Unrestricted::TooManyAddresses {
                count: MAX_ENDPOINT_ADDRESSES + 1,
            },
        ),
    ];
    for (case, yaml, change, want) in table {
        let mut o = observed();
        change(&mut o);
        assert_eq!(
            agent_egress("team-a", &exposes(yaml), &o, None),
            Err(want),
            "{case}"
        );
    }
    // At the bound it is restricted.
    let mut o = observed();
    o.add_endpoint_slices(key("team-a", "manual"), &[many(MAX_ENDPOINT_ADDRESSES)]);
    let egress = agent_egress("team-a", &exposes(DB), &o, None).expect("restricted at the bound");
    assert!(
        matches!(&egress.backends[..], [BackendPeer::Addresses { addresses, .. }] if addresses.len() == MAX_ENDPOINT_ADDRESSES)
    );
}

#[test]
fn slices_are_read_as_kube_proxy_matches_them() {
    let slices = [
        slice(
            "metadata: {name: a}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.5], conditions: {ready: false}}, {addresses: [not-an-ip]}]\nports: [{port: 80}, {name: db, port: 5432}, {name: db, port: 5432}, {name: dns, port: 53, protocol: UDP}]",
        ),
        slice(
            "metadata: {name: b}\naddressType: IPv6\nendpoints: [{addresses: [\"2001:db8::5\"]}]\nports: [{name: db, port: 5433}]",
        ),
    ];
    let found = SliceEndpoints::from_slices(&slices);
    assert_eq!(
        found,
        SliceEndpoints {
            addresses: ["10.0.0.5", "2001:db8::5"]
                .iter()
                .map(|a| a.parse().expect("ip"))
                .collect(),
            tcp_ports: BTreeMap::from([
                (String::new(), vec![80]),
                ("db".to_string(), vec![5432, 5433]),
            ]),
            fqdn: false,
        }
    );
    let mut observed = ObservedBackends::default();
    observed.add_service(&service(
        "metadata: {name: manual, namespace: team-a}\nspec: {ports: [{port: 5432}]}",
    ));
    observed.add_service(&service(
        "metadata: {name: picked, namespace: team-a}\nspec: {selector: {app: x}, ports: [{port: 80}]}",
    ));
    observed.add_service(&service(
        "metadata: {name: empty-selector, namespace: team-a}\nspec: {selector: {}, ports: [{port: 80}]}",
    ));
    observed.add_service(&service(
        "metadata: {name: external, namespace: team-a}\nspec: {type: ExternalName, externalName: x.example.net}",
    ));
    assert_eq!(
        observed.without_selector(),
        vec![key("team-a", "empty-selector"), key("team-a", "manual")],
        "only these need their slices read"
    );
}

/// Renders the rules of one expose's egress as (peers, ports) in short text.
fn summary(rules: &[NetworkPolicyEgressRule]) -> Vec<(Vec<String>, Vec<String>)> {
    rules
        .iter()
        .map(|r| {
            let peers =
                r.to.iter()
                    .flatten()
                    .map(|p| serde_json::to_string(p).expect("json"))
                    .collect();
            let ports = r
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let number = match &p.port {
                        Some(IntOrString::Int(n)) => n.to_string(),
                        Some(IntOrString::String(s)) => s.clone(),
                        None => "*".to_string(),
                    };
                    format!("{}/{number}", p.protocol.as_deref().unwrap_or("?"))
                })
                .collect();
            (peers, ports)
        })
        .collect()
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn rules_without_the_cluster_ranges_leave_transport_and_dns_open() {
    let egress = agent_egress(
        "team-a",
        &exposes(&format!("{DB}{WEB}{SHARED}")),
        &observed(),
        None,
    )
    .expect("restricted");
    assert_eq!(
        summary(&egress_rules(&egress)),
        vec![
            (
                strings(&[
                    r#"{"ipBlock":{"cidr":"10.0.0.5/32"}}"#,
                    r#"{"ipBlock":{"cidr":"10.0.0.6/32"}}"#
                ]),
                strings(&["TCP/5432"])
            ),
            (
                strings(&[r#"{"podSelector":{"matchLabels":{"app":"web"}}}"#]),
                strings(&["TCP/8080"])
            ),
            (
                strings(&[
                    r#"{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"other"}},"podSelector":{"matchLabels":{"app":"shared"}}}"#
                ]),
                strings(&["TCP/tls"])
            ),
            (vec![], strings(&["UDP/53", "TCP/53"])),
            (vec![], strings(&["UDP/*", "TCP/443"])),
            (
                strings(&[r#"{"ipBlock":{"cidr":"192.0.2.1/32"}}"#]),
                strings(&["TCP/6443"])
            ),
            (
                strings(&[r#"{"ipBlock":{"cidr":"2001:db8::1/128"}}"#]),
                strings(&["TCP/443"])
            ),
        ]
    );
}

#[test]
fn with_the_cluster_ranges_transport_goes_outside_them_and_dns_to_the_dns_pods() {
    let cluster = ClusterNetwork {
        cidrs: ["10.244.0.0/16", "fd00:10:244::/56", "10.96.0.0/12"]
            .iter()
            .map(|c| parse_cidr(c).expect("cidr"))
            .collect(),
        dns: "kube-system/k8s-app=kube-dns".parse().expect("dns pods"),
    };
    let egress =
        agent_egress("team-a", &exposes(WEB), &observed(), Some(&cluster)).expect("restricted");
    let rules = summary(&egress_rules(&egress));
    assert_eq!(rules.len(), 5, "{rules:?}");
    assert_eq!(
        rules[1],
        (
            strings(&[
                r#"{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}"#
            ]),
            strings(&["UDP/53", "TCP/53"])
        )
    );
    assert_eq!(
        rules[2],
        (
            strings(&[
                r#"{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.244.0.0/16","10.96.0.0/12"]}}"#,
                r#"{"ipBlock":{"cidr":"::/0","except":["fd00:10:244::/56"]}}"#
            ]),
            strings(&["UDP/*", "TCP/443"])
        )
    );
    // The control plane stays reachable even inside the ranges (rules add up).
    assert_eq!(rules[3].1, strings(&["TCP/6443"]));
    // Only IPv4 ranges: ::/0 has no exceptions (and is not left out).
    let v4_only = ClusterNetwork {
        cidrs: vec![parse_cidr("10.0.0.0/8").expect("cidr")],
        dns: DnsPods::default(),
    };
    let egress = agent_egress("team-a", &exposes(WEB), &observed(), Some(&v4_only)).expect("ok");
    assert_eq!(
        summary(&egress_rules(&egress))[2].0,
        strings(&[
            r#"{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.0.0.0/8"]}}"#,
            r#"{"ipBlock":{"cidr":"::/0"}}"#
        ])
    );
}

#[test]
fn settings_parse_or_name_what_is_wrong() {
    assert_eq!(
        parse_cidr(" 10.96.0.0/12").map(|n| n.to_string()),
        Ok("10.96.0.0/12".to_string())
    );
    assert_eq!(
        parse_cidr("fd00::/64").map(|n| n.to_string()),
        Ok("fd00::/64".to_string())
    );
    assert_eq!(
        parse_cidr("10.244.0.1/16"),
        Err("\"10.244.0.1/16\" is not a network address; did you mean 10.244.0.0/16?".to_string())
    );
    for bad in ["10.244.0.0", "", "ten/8", "10.0.0.0/33"] {
        assert!(parse_cidr(bad).is_err(), "{bad:?}");
    }
    let default: DnsPods = DEFAULT_DNS_PODS.parse().expect("default");
    assert_eq!(default, DnsPods::default());
    assert_eq!(default.to_string(), DEFAULT_DNS_PODS);
    let two: DnsPods = "dns/app=coredns, tier=node".parse().expect("two labels");
    assert_eq!(two.to_string(), "dns/app=coredns,tier=node");
    for bad in [
        "kube-system",
        "/k8s-app=kube-dns",
        "kube-system/",
        "kube-system/k8s-app",
        "kube-system/=x",
        "kube-system/a=b,",
    ] {
        assert!(bad.parse::<DnsPods>().is_err(), "{bad:?}");
    }
}
