//! The DNS wiring of docs/dns.md against the default Corefiles of real distributions, with the
//! real CoreDNS binary (v1.14.7 from deps) run as a pod by the lab's kubelet (service-account
//! token, in-cluster config: the `kubernetes` plugin really talks to the apiserver).
//!
//! For each Corefile the operator's DNS ConfigMap (rendered by `tailnet_render`, the code the
//! Tailnet controller uses) is mounted as the docs say, and the test checks: CoreDNS starts
//! (its `ready` plugin answers), the egress alias resolves to the target Service's ClusterIP,
//! an ingress name to its in-cluster Service's ClusterIP (split horizon: never to a tailnet
//! address, nor does a contributor's tailnet record reach the cluster's records), a cluster
//! name still resolves, and on k3s the `NodeHosts` entries still resolve. The old advice (a second `hosts` plugin in k3s's server
//! block) is the negative row: CoreDNS refuses to start, with exactly that error (its container
//! exits non-zero and logs that `hosts` may be used once per server block). Prints the matrix.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tailnet_render::dns::{self, ClaimRank, DnsEntry, DnsInputs};
use tno_testenv_kube::TestNamespace;

const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.7";
const ALIAS: &str = "api.site.example.net";
/// Added later: CoreDNS must pick it up without a restart.
const NEW_ALIAS: &str = "wiki.site.example.net";
const INGRESS_NAME: &str = "portal.team-a.lab.example.net";
const INGRESS_V4: &str = "100.64.0.7";
const INGRESS_V6: &str = "fd7a:115c:a1e0::7";
/// The ClusterIP of the ingress's in-cluster Service (split horizon).
const INGRESS_IN_CLUSTER: &str = "10.96.0.77";
const NODE_HOSTS: &str = "10.244.0.1 tno-node\n";
/// A contributor's record that the owner's check accepts (its own node's address).
const CONTRIBUTED_NAME: &str = "ok.cosmos.example.net";
const CONTRIBUTED_V4: &str = "100.64.0.9";
/// A public name the hostile fragment tries to redirect.
const PUBLIC_NAME: &str = "registry.example.com";
const TIMEOUT: Duration = Duration::from_secs(60);

/// kubeadm v1.36's default (`kubeadm init`, ConfigMap kube-system/coredns), plus the one
/// line docs/dns.md adds at the top level.
const KUBEADM: &str = r#"import /etc/coredns-tailnet/*.server
.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
"#;

/// k3s's default (manifests/coredns.yaml), unchanged: the operator's ConfigMap *is*
/// `coredns-custom`, whose `*.server` keys k3s imports at the top level.
const K3S: &str = r#".:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    hosts /etc/coredns/NodeHosts {
      ttl 60
      reload 15s
      fallthrough
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
    import /etc/coredns/custom/*.override
}
import /etc/coredns/custom/*.server
"#;

/// What docs/dns.md used to say, applied to k3s: a second `hosts` block in `.:53`.
const K3S_OLD_ADVICE: &str = r#".:53 {
    errors
    health
    ready
    hosts /etc/coredns/custom/hosts {
        fallthrough
        reload 10s
    }
    kubernetes cluster.local in-addr.arpa ip6.arpa {
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }
    hosts /etc/coredns/NodeHosts {
      ttl 60
      reload 15s
      fallthrough
    }
    prometheus :9153
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
    import /etc/coredns/custom/*.override
}
import /etc/coredns/custom/*.server
"#;

/// RKE2's rke2-coredns chart default, plus the top-level import (the chart's
/// `extraConfig.import.parameters`).
const RKE2: &str = r#".:53 {
    errors 
    health  {
        lameduck 5s
    }
    ready 
    kubernetes   cluster.local  cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    prometheus   0.0.0.0:9153
    forward   . /etc/resolv.conf
    cache   30
    loop 
    reload 
    loadbalance 
}
import /etc/coredns-tailnet/*.server
"#;

/// Talos's default (its CoreDNS manifest), plus the top-level import.
const TALOS: &str = r#".:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    log . {
        class error
    }
    prometheus :9153
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
        disable success cluster.local
        disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
import /etc/coredns-tailnet/*.server
"#;

struct Case {
    name: &'static str,
    corefile: &'static str,
    /// k3s layout (NodeHosts beside the Corefile, the operator's keys as `coredns-custom` at
    /// /etc/coredns/custom) or the docs' layout for the others (/etc/coredns-tailnet).
    k3s: bool,
    /// `None`: CoreDNS starts and serves. `Some(error)`: CoreDNS refuses the Corefile — its
    /// container exits non-zero with this error in its log (any other failure fails the row).
    refusal: Option<&'static str>,
}

/// What CoreDNS v1.14.7 logs for a second `hosts` plugin in one server block
/// (`plugin.Error("hosts", plugin.ErrOnce)`).
const HOSTS_TWICE: &str = "plugin/hosts: this plugin can only be used once per Server Block";

fn entry(hostname: &str, address: IpAddr, owner: &str) -> DnsEntry {
    DnsEntry {
        hostname: hostname.into(),
        address,
        owner: owner.into(),
        rank: ClaimRank::default(),
    }
}

/// Issue 26 item 1: what a hostile contributor sends as DNS records (a space that would make
/// the block authoritative for `svc.cluster.local` or a public name, a newline that would
/// inject Corefile text, a wildcard, a brace, an over-long label), plus one valid record.
fn hostile_records() -> Vec<tailnet_api::fragment::FragmentDnsRecord> {
    let long_label = format!("{}.cosmos.example.net", "a".repeat(64));
    [
        "svc.cluster.local x.cosmos.example.net",
        "registry.example.com x.cosmos.example.net",
        "a.cosmos.example.net\n}\n. {\n    whoami\n}\nb.cosmos.example.net",
        "*.cosmos.example.net",
        "{.cosmos.example.net",
        long_label.as_str(),
        CONTRIBUTED_NAME,
    ]
    .iter()
    .map(|name| tailnet_api::fragment::FragmentDnsRecord {
        name: name.to_string(),
        type_: "A".into(),
        value: CONTRIBUTED_V4.into(),
    })
    .collect()
}

/// The hostile records twice: through the owner's check (only the valid one passes; a valid
/// name in the cluster domain is refused there too) and straight into the renderer, as if a
/// check had missed them (the renderer drops every malformed one).
fn contributed_entries() -> Vec<DnsEntry> {
    use tailnet_api::fragment::{FRAGMENT_API_VERSION, FRAGMENT_KIND, PolicyFragment};
    use tailnet_render::fragment::{OwnerContext, check_fragment};
    let contributor: tailnet_api::tailnet::Contributor = serde_json::from_value(json!({
        "name": "cosmos", "tagPrefix": "cos", "source": {"configMap": "cosmos-fragment"},
        "limits": {"dnsSuffixes": ["cosmos.example.net", "cluster.local", "example.com"]}
    }))
    .expect("contributor");
    let fragment = PolicyFragment {
        api_version: FRAGMENT_API_VERSION.into(),
        kind: FRAGMENT_KIND.into(),
        installation_id: "cosmos/main".into(),
        tag_prefix: "cos".into(),
        tags: vec![],
        grants: vec![],
        routes: vec![],
        dns_records: hostile_records()
            .into_iter()
            .chain([tailnet_api::fragment::FragmentDnsRecord {
                name: "kubernetes.default.svc.cluster.local".into(),
                type_: "A".into(),
                value: CONTRIBUTED_V4.into(),
            }])
            .collect(),
    };
    let nodes = [tailnet_policy::ObservedNode {
        id: 9,
        name: "cos-portal".into(),
        tags: vec!["tag:cos-ingress-apps-portal".into()],
        ip_addresses: vec![CONTRIBUTED_V4.parse().expect("ip")],
        ..Default::default()
    }];
    let checked = check_fragment(
        &contributor,
        &fragment,
        &OwnerContext {
            tag_prefix: "tno",
            route_approvers: &[],
            taken_tags: &Default::default(),
            taken_names: &Default::default(),
            cluster_domain: "cluster.local",
            nodes: Some(&nodes),
        },
    );
    let accepted: Vec<&str> = checked
        .dns_records
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(accepted, [CONTRIBUTED_NAME], "{:#?}", checked.refused);
    let address: IpAddr = CONTRIBUTED_V4.parse().expect("ip");
    checked
        .dns_records
        .iter()
        .chain(hostile_records().iter())
        .map(|r| entry(&r.name, address, "contributor cosmos"))
        .collect()
}

/// A DNS query for `name` (`qtype` 1 = A, 28 = AAAA) sent to `server` from the lab netns
/// (the node); the addresses of the answer, or why not.
fn query(
    lab: &tno_netlab::Netns,
    server: IpAddr,
    name: &str,
    qtype: u16,
) -> Result<Vec<IpAddr>, String> {
    let mut q = vec![0x4a, 0x11, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).map_err(|e| e.to_string())?);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    let answer = lab
        .in_netns(move || -> std::io::Result<Vec<u8>> {
            let socket = UdpSocket::bind("0.0.0.0:0")?;
            socket.set_read_timeout(Some(Duration::from_secs(2)))?;
            socket.send_to(&q, SocketAddr::new(server, 53))?;
            let mut buffer = [0u8; 1500];
            let (len, _) = socket.recv_from(&mut buffer)?;
            Ok(buffer[..len].to_vec())
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let rcode = answer.get(3).map(|b| b & 0x0F).unwrap_or(0xFF);
    if rcode != 0 {
        return Err(format!("rcode {rcode}"));
    }
    parse_addresses(&answer).ok_or_else(|| "truncated answer".into())
}

fn parse_addresses(m: &[u8]) -> Option<Vec<IpAddr>> {
    let u16_at = |at: usize| Some(u16::from_be_bytes([*m.get(at)?, *m.get(at + 1)?]));
    let skip = |mut at: usize| -> Option<usize> {
        loop {
            let len = *m.get(at)?;
            if len == 0 {
                return Some(at + 1);
            }
            if len & 0xC0 == 0xC0 {
                return Some(at + 2);
            }
            at += 1 + usize::from(len);
        }
    };
    let mut at = 12;
    for _ in 0..u16_at(4)? {
        at = skip(at)? + 4;
    }
    let mut out = Vec::new();
    for _ in 0..u16_at(6)? {
        at = skip(at)?;
        let rtype = u16_at(at)?;
        let len = usize::from(u16_at(at + 8)?);
        let data = m.get(at + 10..at + 10 + len)?;
        match rtype {
            1 => out.push(IpAddr::from(<[u8; 4]>::try_from(data).ok()?)),
            28 => out.push(IpAddr::from(<[u8; 16]>::try_from(data).ok()?)),
            _ => {}
        }
        at += 10 + len;
    }
    Some(out)
}

/// The answer for `name` once it is `expected` (CoreDNS may still be syncing with the API).
fn resolves(lab: &tno_netlab::Netns, server: IpAddr, name: &str, qtype: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = query(lab, server, name, qtype);
        if matches!(&got, Ok(a) if !a.is_empty()) || Instant::now() > deadline {
            return match got {
                Ok(a) => a
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                Err(e) => format!("<{e}>"),
            };
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn coredns_pod(case: &Case) -> Value {
    let config_volume = if case.k3s {
        json!({"name": "config-volume", "configMap": {"name": format!("{}-coredns", case.name),
               "items": [{"key": "Corefile", "path": "Corefile"}, {"key": "NodeHosts", "path": "NodeHosts"}]}})
    } else {
        json!({"name": "config-volume", "configMap": {"name": format!("{}-coredns", case.name),
               "items": [{"key": "Corefile", "path": "Corefile"}]}})
    };
    // The operator's ConfigMap: k3s mounts coredns-custom whole at /etc/coredns/custom; the
    // docs mount the server block at /etc/coredns-tailnet for the others.
    let (tailnet_volume, tailnet_mount) = if case.k3s {
        (
            json!({"name": "custom-config-volume", "configMap": {"name": "tailnet-hosts", "optional": true}}),
            json!({"name": "custom-config-volume", "mountPath": "/etc/coredns/custom", "readOnly": true}),
        )
    } else {
        (
            json!({"name": "tailnet", "configMap": {"name": "tailnet-hosts", "optional": true,
                   "items": [{"key": dns::SERVER_BLOCK_KEY, "path": dns::SERVER_BLOCK_KEY}]}}),
            json!({"name": "tailnet", "mountPath": "/etc/coredns-tailnet", "readOnly": true}),
        )
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("coredns-{}", case.name), "labels": {"app": "coredns-matrix"}},
        "spec": {
            "serviceAccountName": "coredns-matrix",
            "dnsPolicy": "None",
            // The node's upstream resolver; the lab has none, so this one never answers.
            "dnsConfig": {"nameservers": ["192.0.2.1"]},
            "containers": [{
                "name": "coredns",
                "image": COREDNS_IMAGE,
                "args": ["-conf", "/etc/coredns/Corefile"],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                "volumeMounts": [
                    {"name": "config-volume", "mountPath": "/etc/coredns", "readOnly": true},
                    tailnet_mount,
                ],
            }],
            "volumes": [config_volume, tailnet_volume],
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_corefiles_serve_the_rendered_server_block() {
    let env = tno_testenv_kube::shared()
        .await
        .unwrap_or_else(|e| panic!("kube environment: {e}"));
    let ns = env.namespace("coredns").await.expect("namespace");
    let client = ns.client().clone();
    let name = ns.name().to_string();
    let apply = PatchParams::apply("test").force();

    // The egress Service the alias points at, and the RBAC CoreDNS needs.
    let cluster_ip = egress_service_and_rbac(&client, &name).await;
    // The operator's DNS ConfigMap, rendered by the code the Tailnet controller runs.
    let render = |aliases: &[&str]| {
        dns::render(&DnsInputs {
            egress_aliases: aliases
                .iter()
                .map(|a| entry(a, cluster_ip, "TailnetEgress/tailnet-system/team-a"))
                .collect(),
            ingress_names: [
                entry(
                    INGRESS_NAME,
                    INGRESS_V4.parse().expect("ip"),
                    "TailnetIngress/team-a/portal",
                ),
                entry(
                    INGRESS_NAME,
                    INGRESS_V6.parse().expect("ip"),
                    "TailnetIngress/team-a/portal",
                ),
            ]
            .into_iter()
            .chain(contributed_entries())
            .collect(),
            in_cluster_names: vec![entry(
                INGRESS_NAME,
                INGRESS_IN_CLUSTER.parse().expect("ip"),
                "TailnetIngress/team-a/portal",
            )],
            pending: vec![],
        })
    };
    let rendered = render(&[ALIAS]);
    let tailnet: tailnet_api::Tailnet = serde_json::from_value(json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "Tailnet",
        "metadata": {"name": "demo"},
        "spec": {"server": "https://headscale.example.net",
                 "apiSecretRef": {"name": "s", "key": "k"},
                 "dns": {"hostsConfigMap": "tailnet-hosts", "hostsConfigMapNamespace": name},
                 "policy": {"tagOwners": ["group:platform"]}}
    }))
    .expect("tailnet");
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &name);
    let write_dns = |rendered: dns::RenderedDns| {
        let (config_maps, apply, tailnet, name) = (
            config_maps.clone(),
            apply.clone(),
            tailnet.clone(),
            name.clone(),
        );
        async move {
            let dns_config_map =
                tailnet_render::desired::dns_config_map(&tailnet, &name, &rendered, None)
                    .expect("DNS");
            let mut cm = serde_json::to_value(&dns_config_map).expect("json");
            cm["apiVersion"] = json!("v1");
            cm["kind"] = json!("ConfigMap");
            config_maps
                .patch("tailnet-hosts", &apply, &Patch::Apply(cm))
                .await
                .expect("DNS ConfigMap");
        }
    };
    write_dns(rendered).await;
    let cases = corefile_cases();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &name);
    start_coredns_pods(&config_maps, &pods, &apply, &cases).await;
    let lab = env.lab().netns();
    let serving = answers_per_corefile(&ns, lab, &pods, &cases, cluster_ip).await;
    // A new alias: the kubelet updates the mounted file, CoreDNS's `reload` (30 s, as in
    // every default Corefile) re-reads the imported server block. Nothing restarts.
    let changed = Instant::now();
    write_dns(render(&[ALIAS, NEW_ALIAS])).await;
    reloaded_everywhere(lab, serving, cluster_ip, changed).await;
}

/// The egress Service the alias points at (its ClusterIP is returned), and the RBAC CoreDNS
/// needs.
async fn egress_service_and_rbac(client: &kube::Client, name: &str) -> IpAddr {
    let services: Api<Service> = Api::namespaced(client.clone(), name);
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "remote-api"},
        "spec": {"ports": [{"port": 443}]}
    }))
    .expect("service");
    let service = services
        .create(&PostParams::default(), &service)
        .await
        .expect("Service");
    let cluster_ip: IpAddr = service
        .spec
        .and_then(|s| s.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .expect("ClusterIP");
    tno_testenv_kube::network::apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "coredns-matrix", "namespace": name}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": format!("coredns-matrix-{name}")},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
                   "subjects": [{"kind": "ServiceAccount", "name": "coredns-matrix", "namespace": name}]}),
        ],
    )
    .await
    .expect("RBAC");
    cluster_ip
}

/// The default Corefiles of each distribution, with the operator's block imported as its docs
/// say (`k3s-old-advice`: the earlier advice, which breaks CoreDNS on k3s).
fn corefile_cases() -> [Case; 5] {
    [
        Case {
            name: "kubeadm",
            corefile: KUBEADM,
            k3s: false,
            refusal: None,
        },
        Case {
            name: "k3s",
            corefile: K3S,
            k3s: true,
            refusal: None,
        },
        Case {
            name: "rke2",
            corefile: RKE2,
            k3s: false,
            refusal: None,
        },
        Case {
            name: "talos",
            corefile: TALOS,
            k3s: false,
            refusal: None,
        },
        Case {
            name: "k3s-old-advice",
            corefile: K3S_OLD_ADVICE,
            k3s: true,
            refusal: Some(HOSTS_TWICE),
        },
    ]
}

/// One CoreDNS pod per case, with its Corefile (and k3s's NodeHosts) in a ConfigMap.
async fn start_coredns_pods(
    config_maps: &Api<k8s_openapi::api::core::v1::ConfigMap>,
    pods: &Api<Pod>,
    apply: &PatchParams,
    cases: &[Case],
) {
    for case in cases {
        let mut data = json!({"Corefile": case.corefile});
        if case.k3s {
            data["NodeHosts"] = json!(NODE_HOSTS);
        }
        config_maps
            .patch(
                &format!("{}-coredns", case.name),
                apply,
                &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("{}-coredns", case.name)}, "data": data})),
            )
            .await
            .expect("Corefile ConfigMap");
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(coredns_pod(case)).expect("pod"),
        )
        .await
        .expect("CoreDNS pod");
    }
}

/// Each CoreDNS queried for the alias, the ingress name, a cluster name and NodeHosts: the
/// matrix is printed, failures fail the test; returns the CoreDNS pods that serve.
async fn answers_per_corefile(
    ns: &TestNamespace<'_>,
    lab: &tno_netlab::Netns,
    pods: &Api<Pod>,
    cases: &[Case],
    cluster_ip: IpAddr,
) -> Vec<(&'static str, IpAddr)> {
    let mut matrix = vec![format!(
        "| Corefile | CoreDNS starts | {ALIAS} A (ClusterIP {cluster_ip}) | {INGRESS_NAME} A (in-cluster Service) | kubernetes.default.svc.cluster.local A | NodeHosts tno-node |"
    )];
    matrix.push("| --- | --- | --- | --- | --- | --- |".into());
    let mut failures = Vec::new();
    let mut serving: Vec<(&str, IpAddr)> = Vec::new();
    for case in cases {
        let pod_name = format!("coredns-{}", case.name);
        // Ready (the `ready` plugin answers), or — for the negative row — its container
        // exited (CoreDNS refused the Corefile).
        let deadline = Instant::now() + TIMEOUT;
        let (ready, pod_ip, exit_code) = ready_or_exited(pods, &pod_name, deadline).await;
        let log = ns.container_log(&pod_name, "coredns");
        if let Some(problem) = row_problem(case, ready, exit_code, &log) {
            failures.push(format!("{}: {problem}; log:\n{log}", case.name));
        }
        if !ready {
            let why = log
                .lines()
                .find(|l| case.refusal.is_some_and(|r| l.contains(r)))
                .or_else(|| {
                    log.lines()
                        .find(|l| l.contains("plugin/") || l.contains("rror"))
                })
                .unwrap_or("not ready")
                .to_string();
            matrix.push(format!(
                "| {} | no (exit code {}): `{}` | – | – | – | – |",
                case.name,
                exit_code.map_or("none".into(), |c| c.to_string()),
                why.trim()
            ));
            continue;
        }
        let Some(ip) = pod_ip else {
            failures.push(format!("{}: no pod IP", case.name));
            continue;
        };
        let lab_netns = lab.name().to_string();
        let k3s = case.k3s;
        let ((alias, ingress, cluster, node), (contributed, public)) =
            tokio::task::spawn_blocking(move || {
                let lab = tno_netlab::Netns::adopt(lab_netns);
                (
                    (
                        resolves(&lab, ip, ALIAS, 1),
                        resolves(&lab, ip, INGRESS_NAME, 1),
                        resolves(&lab, ip, "kubernetes.default.svc.cluster.local", 1),
                        // Only k3s has NodeHosts (elsewhere the name is unknown: no answer).
                        if k3s {
                            resolves(&lab, ip, "tno-node", 1)
                        } else {
                            String::new()
                        },
                    ),
                    (
                        resolves(&lab, ip, CONTRIBUTED_NAME, 1),
                        // Not ours: the lab has no upstream, so anything but the
                        // contributor's address (an error, no answer) is right.
                        query(&lab, ip, PUBLIC_NAME, 1),
                    ),
                )
            })
            .await
            .expect("queries");
        // Split horizon: a contributor's record is a tailnet address, for tailnet clients only.
        if contributed == CONTRIBUTED_V4 {
            failures.push(format!(
                "{}: the contributed name answered its tailnet address {contributed} in-cluster",
                case.name
            ));
        }
        if matches!(&public, Ok(a) if a.iter().any(|a| a.to_string() == CONTRIBUTED_V4)) {
            failures.push(format!(
                "{}: {PUBLIC_NAME} was redirected to the contributor: {public:?}",
                case.name
            ));
        }
        let expect = [
            ("alias", &alias, cluster_ip.to_string()),
            ("ingress name", &ingress, INGRESS_IN_CLUSTER.to_string()),
            ("cluster name", &cluster, "10.96.0.1".to_string()),
        ];
        for (what, got, want) in expect {
            if *got != want {
                failures.push(format!(
                    "{}: {what} answered {got}, expected {want}; log:\n{log}",
                    case.name
                ));
            }
        }
        if case.k3s && node != "10.244.0.1" {
            failures.push(format!("{}: NodeHosts answered {node}", case.name));
        }
        serving.push((case.name, ip));
        matrix.push(format!(
            "| {} | yes | {alias} | {ingress} | {cluster} | {} |",
            case.name,
            if case.k3s { node.as_str() } else { "(n/a)" }
        ));
    }
    eprintln!("CoreDNS Corefile matrix:\n{}", matrix.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    serving
}

/// What is wrong with a row: a serving row that is not ready, or a refusing row that did not
/// exit non-zero with its refusal in the log (another failure to start is not the refusal).
fn row_problem(case: &Case, ready: bool, exit_code: Option<i32>, log: &str) -> Option<String> {
    match case.refusal {
        None if ready => None,
        None => Some(format!("not ready (exit code {exit_code:?})")),
        Some(_) if ready => Some("ready, expected CoreDNS to refuse the Corefile".into()),
        Some(refusal) => match exit_code {
            Some(code) if code != 0 && log.contains(refusal) => None,
            Some(code) if code != 0 => Some(format!(
                "exited with {code}, but not for the expected reason `{refusal}`"
            )),
            other => Some(format!(
                "expected an exit with `{refusal}`, container exit code {other:?}"
            )),
        },
    }
}

#[test]
fn a_refusal_row_needs_its_reason() {
    let refusing = Case {
        name: "refusing",
        corefile: "",
        k3s: true,
        refusal: Some(HOSTS_TWICE),
    };
    let log = format!("Error during parsing: {HOSTS_TWICE}\n");
    assert_eq!(row_problem(&refusing, false, Some(1), &log), None);
    // CoreDNS failing for another reason (a missing file, a crash) is not the refusal.
    let other = "plugin/hosts: open /etc/coredns/NodeHosts: no such file or directory";
    assert!(row_problem(&refusing, false, Some(1), other).is_some());
    assert!(
        row_problem(&refusing, false, None, &log).is_some(),
        "never exited"
    );
    assert!(
        row_problem(&refusing, false, Some(0), &log).is_some(),
        "exit 0"
    );
    assert!(
        row_problem(&refusing, true, None, "").is_some(),
        "it served"
    );
    let serving = Case {
        refusal: None,
        ..refusing
    };
    assert_eq!(row_problem(&serving, true, None, ""), None);
    assert!(row_problem(&serving, false, Some(1), &log).is_some());
}

/// Ready (the `ready` plugin answers), or its container exited (the exit code of the current
/// or last termination), or the deadline passed; and the pod's IP.
async fn ready_or_exited(
    pods: &Api<Pod>,
    pod_name: &str,
    deadline: Instant,
) -> (bool, Option<IpAddr>, Option<i32>) {
    loop {
        let pod = pods.get(pod_name).await.expect("pod");
        let status = pod.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let exit_code = status.container_statuses.iter().flatten().find_map(|c| {
            let terminated = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
                s.as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| t.exit_code)
            };
            terminated(&c.state).or_else(|| terminated(&c.last_state))
        });
        let ip: Option<IpAddr> = status.pod_ip.and_then(|ip| ip.parse().ok());
        if ready || exit_code.is_some() || Instant::now() > deadline {
            break (ready, ip, exit_code);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A new alias: the kubelet updates the mounted file, CoreDNS's `reload` (30 s, as in every
/// default Corefile) re-reads the imported server block; every serving CoreDNS answers it
/// within 120 s. Nothing restarts.
async fn reloaded_everywhere(
    lab: &tno_netlab::Netns,
    serving: Vec<(&'static str, IpAddr)>,
    cluster_ip: IpAddr,
    changed: Instant,
) {
    let lab_netns = lab.name().to_string();
    let seen = tokio::task::spawn_blocking(move || {
        let lab = tno_netlab::Netns::adopt(lab_netns);
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut pending: Vec<(&str, IpAddr)> = serving;
        let mut seen = Vec::new();
        while !pending.is_empty() && Instant::now() < deadline {
            pending.retain(|(case, ip)| {
                let answered = matches!(query(&lab, *ip, NEW_ALIAS, 1), Ok(a) if a == [cluster_ip]);
                if answered {
                    seen.push(format!("{case}: {:?}", changed.elapsed()));
                }
                !answered
            });
            std::thread::sleep(Duration::from_millis(500));
        }
        (seen, pending)
    })
    .await
    .expect("reload queries");
    eprintln!(
        "{NEW_ALIAS} added to the ConfigMap, served by: {}",
        seen.0.join(", ")
    );
    assert!(seen.1.is_empty(), "not reloaded within 120 s: {:?}", seen.1);
}
