//! Split horizon end to end (SPEC §5, issue 28 item 4), with NetworkPolicies enforced for
//! real (kube-router's firewall controller, as in network_policy_e2e.rs):
//!
//! - the Tailnet writes its DNS entries into the lab CoreDNS's own ConfigMap (key `hosts`,
//!   served by its `hosts` plugin), as docs/dns.md says; the ingress lists one namespace in
//!   `spec.inCluster.namespaces`;
//! - the `hosts` key maps the ingress name to its in-cluster Service's ClusterIP and holds no
//!   tailnet address (100.64.0.0/10, fd7a:115c:a1e0::/48);
//! - a pod of the listed namespace resolves the name through CoreDNS and gets an HTTPS answer
//!   from the portal's backend over a TLS session verified for the name (SNI kept), with no
//!   tailnet identity headers (a forged one dropped);
//! - the same request from the listed namespace's pod netns to the ClusterIP is answered, and
//!   from a pod of an unlisted namespace it is refused while that pod demonstrably reaches the
//!   agent pod (its metrics port) and the listed namespace's pod;
//! - tailnet clients are unchanged: the laptop still gets the portal with its identity;
//! - a Service of the tailnet `loadBalancerClass` with the annotation
//!   `tailnet-operator.dev/in-cluster-namespaces` gets the same: its name maps to its own
//!   in-cluster Service, and a pod of the listed namespace reaches its TCP port by name;
//! - the operator runs with `--cluster-cidrs` (the lab's pod and Service ranges): agents'
//!   egress (issue 29 item 4) goes to their backends, DNS pods, control plane, and for the
//!   tailnet's transport (UDP, TCP 443) only outside those ranges;
//! - the ingress agent reaches its backend (the frontend pod on 8080) but not the listed
//!   namespace's pod on the same port (which the unlisted namespace's pod reaches);
//! - the Service's agent reaches only the Service's pods in-cluster: from its pod netns the
//!   echo pod answers on its target port, while the frontend pod and the listed namespace's pod
//!   are refused; a pod listening on TCP 443 (reached by the unlisted pod) is refused to it,
//!   while the same probe to 443 on the laptop's lab address (outside the ranges) connects;
//! - a Service of the tailnet class without a selector, its EndpointSlice made by hand (an
//!   address outside the cluster, the laptop's lab address, on 15432): its agent reaches that
//!   address and port (the Service becomes Ready through it), not another port there (which a
//!   pod reaches) nor the echo pod;
//! - a Gateway (Gateway API) of a class whose TailnetGatewayParameters list the namespace in
//!   `inCluster.namespaces` gets the same: its listener hostname maps to its own in-cluster
//!   Service, a pod of the listed namespace gets the frontend's answer by name over TLS verified
//!   for it (the Gateway's certificate), the unlisted namespace's pod is refused;
//! - without listed namespaces the in-cluster Service goes and the name leaves the cluster's
//!   records.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::json;
use support::agent::ready_pod_ip;
use support::conditions::{ConditionIs, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, apply_gateway_class, ingress_object, service_object, tailnet_ipv4,
    tailnet_name, test_server_deployment, tls_secret,
};
use support::tailnet::{https_get_hello, ok_200, self_signed};
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetIngress;
use tailnet_api::agent_config::ADMIN_PORT;
use tailnet_gateway_api::{Gateway, HTTPRoute};
use tailnet_render::dns::is_tailnet_address;
use tno_netlab::Netns;
use tno_testenv::{CLIENT_POD_DEADLINE, E2eEnv, OperatorArgs, tls_check_pod};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const COREDNS_CONFIG_MAP: &str = "coredns";
const COREDNS_NAMESPACE: &str = "kube-system";
/// The in-cluster Service of ingress `portal` (the agent's name).
const IN_CLUSTER_SERVICE: &str = "tailnet-ingress-portal";
/// A client-supplied identity header: dropped, and in-cluster clients get none of their own.
const FORGED_LOGIN: &str = "Tailscale-User-Login: forged@evil";
/// Connection attempts that must all fail for "refused".
const DENIED_ATTEMPTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_clients_of_listed_namespaces_reach_the_ingress_by_name() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    // `TNO_NETWORK_POLICY_ENFORCER=off` runs without the enforcer, to see what it catches:
    // the unlisted namespace's connection then gets through and the test fails there.
    let enforcer = if std::env::var("TNO_NETWORK_POLICY_ENFORCER").as_deref() == Ok("off") {
        eprintln!("TNO_NETWORK_POLICY_ENFORCER=off: no NetworkPolicy enforcer in the lab");
        None
    } else {
        Some(
            env.start_network_policy_enforcer()
                .await
                .unwrap_or_else(|e| panic!("kube-router: {e}")),
        )
    };
    let ops = env.namespace("sh").await.expect("namespace");
    let listed = env.namespace("shl").await.expect("listed namespace");
    let unlisted = env.namespace("shu").await.expect("unlisted namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet = tailnet_name(&ns);
    let mut tailnet_object = env.tailnet_object(&tailnet, "Apply");
    tailnet_object["spec"]["dns"]["hostsConfigMap"] = json!(COREDNS_CONFIG_MAP);
    tailnet_object["spec"]["dns"]["hostsConfigMapNamespace"] = json!(COREDNS_NAMESPACE);
    apply(
        &Api::<tailnet_api::Tailnet>::all(client.clone()),
        &tailnet,
        tailnet_object,
    )
    .await
    .expect("Tailnet");
    let mut args = OperatorArgs::new(&ns);
    if with_cluster_cidrs() {
        args.extra = vec!["--cluster-cidrs".into(), lab_cluster_cidrs()];
    }
    // The Gateway API CRDs before the operator: it starts its Gateway controllers only when
    // they are served at its start (docs/gateway-api.md).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    tno_testenv_kube::crds::install_gateway_api_crds(&client, &root, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut operator = start_operator(&env, &args.to_args(), None)
        .await
        .expect("operator");

    let portal = format!("portal.{ns}.lab.example.net");
    let (cert_pem, key_pem) = self_signed(std::slice::from_ref(&portal));
    deploy_portal(&client, &ns, &tailnet, listed.name(), &cert_pem, &key_pem).await;
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    let ready = wait_for_condition(
        &ingresses,
        "portal",
        ConditionIs::new("Ready", "True"),
        Some(&operator),
    )
    .await;
    let status = ready.status.clone().unwrap_or_default();
    let tailnet_ip = tailnet_ipv4(&status.tailnet_ips).expect("tailnet IPv4");
    let cluster_ip = in_cluster_service(&client, &ns).await;
    hosts_point_at_the_service(&client, &portal, &cluster_ip).await;

    // A pod of the listed namespace: the name through CoreDNS, TLS verified for the name.
    let run = env
        .run_pod(
            listed.client(),
            listed.name(),
            https_client_pod("by-name", &portal, &cert_pem),
            CLIENT_POD_DEADLINE,
        )
        .await
        .expect("client pod");
    let log = run.log("client").to_string();
    eprintln!("listed namespace, https://{portal}/ by name:\n{log}");
    assert!(run.succeeded(), "{run}\n{}", env.diagnostics(Some(&ns)));
    no_identity_headers(&log);

    let w = Witnesses::start(&env, &client, &ns, &listed, &unlisted).await;
    let answer = wait_for(
        "the listed namespace's pod answered through the ClusterIP",
        WAIT,
        || async { https_from(&w.listed, &cluster_ip, &portal, &cert_pem).await },
    )
    .await;
    no_identity_headers(&answer);
    unlisted_is_refused(&w, &cluster_ip, &portal, &cert_pem).await;
    ingress_agent_egress(&env, &client, &ns, &w).await;

    // Tailnet clients are unchanged: the laptop gets the portal, with its identity.
    let laptop = env.tailnet().laptop.node.local_api();
    let response = wait_for(
        "https from the laptop through the tailnet",
        WAIT,
        || async {
            https_get_hello(&laptop, &tailnet_ip, &portal, &cert_pem, &[])
                .await
                .and_then(ok_200)
        },
    )
    .await;
    assert!(
        response
            .to_lowercase()
            .contains("tailscale-user-login: alice"),
        "{response}"
    );

    load_balancer_in_cluster(&env, &client, &ns, &tailnet, &listed).await;
    gateway_in_cluster(&env, &client, &ns, &tailnet, &listed, &w).await;
    load_balancer_agent_egress(&env, &client, &ns, &w).await;
    selector_less_service_egress(&env, &client, &ns, &tailnet, &w).await;
    // Read before the policies change again (kube-router rewrites its chains then).
    if let Some(enforcer) = &enforcer {
        let forward = enforcer
            .packets_through("FORWARD")
            .expect("filter counters");
        let input = enforcer.packets_through("INPUT").expect("filter counters");
        eprintln!("kube-router's jumps saw {forward} packets in FORWARD, {input} in INPUT");
        assert!(forward + input > 0, "pod traffic never reached kube-router");
    }
    without_listed_namespaces(&client, &ns, &ingresses, &portal).await;
    if let Some(enforcer) = enforcer {
        enforcer
            .stop()
            .expect("kube-router stops and its rules are removed");
    }
    operator.terminate().await.expect("operator stops cleanly");
}

/// Split horizon for a Gateway: TailnetGatewayParameters with `inCluster.namespaces: [listed]`
/// and allowFrom group:team-a, a GatewayClass naming them, a Gateway with one HTTPS listener
/// (`gw.<ns>.lab.example.net`, its own certificate) routed to the frontend. Its name maps to
/// the Gateway's in-cluster Service in the cluster's hosts (no tailnet address); a pod of the
/// listed namespace gets the frontend by name over TLS verified for it; the unlisted
/// namespace's pod is refused at the ClusterIP.
async fn gateway_in_cluster(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    listed: &tno_testenv::E2eNamespace<'_>,
    w: &Witnesses,
) {
    let class = format!("tailnet-{ns}");
    apply_gateway_class(client, ns, &class, tailnet, &[listed.name()]).await;
    let host = format!("gw.{ns}.lab.example.net");
    let (cert_pem, key_pem) = self_signed(std::slice::from_ref(&host));
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &tls_secret("gw-tls", &cert_pem, &key_pem),
        )
        .await
        .expect("the Gateway's TLS Secret");
    apply(
        &Api::<Gateway>::namespaced(client.clone(), ns),
        "web",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"gatewayClassName": class, "listeners": [
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": host,
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "gw-tls"}]}}]}
        }),
    )
    .await
    .expect("Gateway");
    apply(
        &Api::<HTTPRoute>::namespaced(client.clone(), ns),
        "web",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"parentRefs": [{"name": "web"}], "hostnames": [host],
                     "rules": [{"backendRefs": [{"name": "frontend", "port": 8080}]}]}
        }),
    )
    .await
    .expect("HTTPRoute");
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let service = wait_for("the Gateway's in-cluster Service", WAIT, || async {
        services
            .get_opt("tailnet-gateway-web")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let cluster_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the in-cluster Service's ClusterIP");
    hosts_point_at_the_service(client, &host, &cluster_ip).await;
    // The pod's check retries within its own deadline (the agent's in-cluster twin starts
    // with its next config read).
    let run = env
        .run_pod(
            listed.client(),
            listed.name(),
            https_client_pod("gw-by-name", &host, &cert_pem),
            CLIENT_POD_DEADLINE,
        )
        .await
        .expect("client pod");
    assert!(run.succeeded(), "{run}\n{}", env.diagnostics(Some(ns)));
    let log = run.log("client").to_string();
    eprintln!("listed namespace, https://{host}/ through the Gateway by name:\n{log}");
    no_identity_headers(&log);
    let addr: SocketAddr = format!("{cluster_ip}:443").parse().expect("ClusterIP");
    refused(
        &w.unlisted,
        addr,
        "the unlisted namespace's pod (Gateway in-cluster Service)",
    )
    .await;
}

/// The frontend (HTTP echo naming itself), its certificate and the ingress listing `listed`.
async fn deploy_portal(
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    listed: &str,
    cert_pem: &str,
    key_pem: &str,
) {
    apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        "frontend",
        test_server_deployment(
            ns,
            "frontend",
            json!([
                "http-echo",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "frontend"
            ]),
        ),
    )
    .await
    .expect("frontend");
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        "frontend",
        service_object(ns, "frontend", 8080),
    )
    .await
    .expect("frontend Service");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", cert_pem, key_pem),
        )
        .await
        .expect("TLS Secret");
    let mut ingress = ingress_object(
        ns,
        "portal",
        tailnet,
        Some("portal-tls"),
        json!([{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                "backend": {"service": "frontend", "port": "main"}}]),
    );
    ingress["spec"]["inCluster"] = json!({"namespaces": [listed]});
    apply(
        &Api::<TailnetIngress>::namespaced(client.clone(), ns),
        "portal",
        ingress,
    )
    .await
    .expect("ingress");
}

/// The in-cluster Service's ClusterIP, once it exists (printed as `kubectl get svc` would).
async fn in_cluster_service(client: &kube::Client, ns: &str) -> String {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let service = wait_for("the in-cluster Service", WAIT, || async {
        services
            .get_opt(IN_CLUSTER_SERVICE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let spec = service.spec.clone().unwrap_or_default();
    let cluster_ip = spec.cluster_ip.clone().expect("ClusterIP");
    let ports: Vec<String> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| format!("{}/TCP", p.port))
        .collect();
    eprintln!(
        "kubectl -n {ns} get svc {IN_CLUSTER_SERVICE}: TYPE={} CLUSTER-IP={cluster_ip} PORT(S)={}",
        spec.type_.unwrap_or_default(),
        ports.join(",")
    );
    assert_eq!(ports, ["443/TCP"]);
    cluster_ip
}

/// The `hosts` key maps the name to the ClusterIP, and no line carries a tailnet address.
async fn hosts_point_at_the_service(client: &kube::Client, portal: &str, cluster_ip: &str) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), COREDNS_NAMESPACE);
    let want = format!("{cluster_ip} {portal}");
    let hosts = wait_for("the name in the cluster's hosts", WAIT, || async {
        let hosts = hosts_of(&config_maps).await?;
        if hosts.lines().any(|l| l == want) {
            Ok(hosts)
        } else {
            Err(hosts)
        }
    })
    .await;
    eprintln!("{COREDNS_NAMESPACE}/{COREDNS_CONFIG_MAP} hosts:\n{hosts}");
    assert_no_tailnet_address(&hosts);
}

async fn hosts_of(config_maps: &Api<ConfigMap>) -> Result<String, String> {
    let cm = config_maps
        .get(COREDNS_CONFIG_MAP)
        .await
        .map_err(|e| e.to_string())?;
    Ok(cm
        .data
        .unwrap_or_default()
        .get("hosts")
        .cloned()
        .unwrap_or_default())
}

fn assert_no_tailnet_address(hosts: &str) {
    for line in hosts.lines().filter(|l| !l.starts_with('#')) {
        let address = line.split_whitespace().next().unwrap_or_default();
        let ip: std::net::IpAddr = address.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
        assert!(
            !is_tailnet_address(&ip),
            "a tailnet address in the cluster's records: {line:?}"
        );
    }
}

/// `tls-check` with an HTTPS request: the name resolved through cluster DNS, the session
/// verified for it against the portal's certificate, the frontend's echo expected.
fn https_client_pod(name: &str, portal: &str, cert_pem: &str) -> serde_json::Value {
    let mut pod = tls_check_pod(
        name,
        &format!("{portal}:443"),
        portal,
        cert_pem,
        "server: frontend",
        60,
    );
    if let Some(args) = pod["spec"]["containers"][0]["args"].as_array_mut() {
        args.push("--send".into());
        args.push(request(portal).into());
    }
    pod
}

fn request(portal: &str) -> String {
    format!(
        "GET /in-cluster HTTP/1.1\r\nHost: {portal}\r\n{FORGED_LOGIN}\r\nConnection: close\r\n\r\n"
    )
}

/// The frontend answered, and neither the forged identity nor any identity reached it.
fn no_identity_headers(answer: &str) {
    let lower = answer.to_lowercase();
    assert!(lower.contains("server: frontend"), "{answer}");
    assert!(lower.contains("get /in-cluster"), "{answer}");
    assert!(
        !lower.contains("forged@evil"),
        "forged identity passed: {answer}"
    );
    assert!(
        !lower.contains("tailscale-user-") && !lower.contains("tailscale-node-name"),
        "an in-cluster client got tailnet identity headers: {answer}"
    );
}

/// `TNO_CLUSTER_CIDRS=off` runs the operator without `--cluster-cidrs`, to see what the
/// setting catches: the Service's agent then reaches the pod on TCP 443 and the test fails
/// there.
fn with_cluster_cidrs() -> bool {
    let off = std::env::var("TNO_CLUSTER_CIDRS").as_deref() == Ok("off");
    if off {
        eprintln!("TNO_CLUSTER_CIDRS=off: the operator runs without --cluster-cidrs");
    }
    !off
}

/// The lab's cluster ranges for `--cluster-cidrs` ([`tno_testenv::lab_cluster_cidrs`]).
fn lab_cluster_cidrs() -> String {
    tno_testenv::lab_cluster_cidrs().join(",")
}

/// The client pods' network namespaces and the agent pod's IP and uid.
struct Witnesses {
    listed: Arc<Netns>,
    unlisted: Arc<Netns>,
    listed_ip: String,
    agent_ip: String,
    agent_uid: String,
}

impl Witnesses {
    async fn start(
        env: &E2eEnv,
        client: &kube::Client,
        ns: &str,
        listed: &tno_testenv::E2eNamespace<'_>,
        unlisted: &tno_testenv::E2eNamespace<'_>,
    ) -> Self {
        let listed_pod = witness_pod(listed.client(), listed.name(), "witness", 8080).await;
        let unlisted_pod = witness_pod(unlisted.client(), unlisted.name(), "witness", 8080).await;
        let netns_of =
            |pod: &Pod| Arc::new(env.pod_netns(pod.metadata.uid.as_deref().expect("pod uid")));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (agent_ip, agent_uid) = wait_for("the agent pod Ready", WAIT, || async {
            let found = agent_pods(&pods, IN_CLUSTER_SERVICE)
                .await
                .map_err(|e| e.to_string())?;
            found
                .iter()
                .find_map(|p| Some((ready_pod_ip(p).ok()?, p.metadata.uid.clone()?)))
                .ok_or_else(|| format!("{} agent pods, none Ready", found.len()))
        })
        .await;
        Witnesses {
            listed: netns_of(&listed_pod),
            unlisted: netns_of(&unlisted_pod),
            listed_ip: ready_pod_ip(&listed_pod).expect("listed pod IP"),
            agent_ip,
            agent_uid,
        }
    }
}

/// A pod of the test-servers image echoing on `port` (labelled `app: <name>`): a client
/// netns, and a peer to reach.
async fn witness_pod(client: &kube::Client, namespace: &str, name: &str, port: u16) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "echo", "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
            "args": ["tcp-echo", "--listen", format!("0.0.0.0:{port}")],
            "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1}}]}
    }))
    .expect("witness pod manifest");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("witness pod");
    wait_for(
        &format!("pod {name} in {namespace} Ready"),
        WAIT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            ready_pod_ip(&pod).map(|_| pod)
        },
    )
    .await
}

/// Every one of [`DENIED_ATTEMPTS`] connections from `netns` to `target` is refused.
async fn refused(netns: &Arc<Netns>, target: SocketAddr, who: &str) {
    let mut seen = Vec::new();
    for _ in 0..DENIED_ATTEMPTS {
        match connect_from(netns, target).await {
            Ok(_) => panic!("{who} reached {target}"),
            Err(error) => seen.push(error),
        }
    }
    eprintln!("{who} → {target} refused: {seen:?}");
}

/// The egress rules of an agent's NetworkPolicy, printed; they must restrict egress, and the
/// transport rule must keep out of the cluster's ranges (`--cluster-cidrs`).
async fn egress_policy(client: &kube::Client, ns: &str, name: &str) {
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), ns);
    let spec = wait_for(
        &format!("NetworkPolicy {name} with egress rules"),
        WAIT,
        || async {
            let policy = policies.get(name).await.map_err(|e| e.to_string())?;
            let spec = policy.spec.unwrap_or_default();
            if spec.egress.is_some() {
                Ok(spec)
            } else {
                Err(format!("policyTypes {:?}", spec.policy_types))
            }
        },
    )
    .await;
    let egress = serde_json::to_string(&spec.egress).unwrap_or_default();
    eprintln!(
        "NetworkPolicy {name}: policyTypes {:?}, egress {egress}",
        spec.policy_types
    );
    assert_eq!(
        spec.policy_types,
        Some(vec!["Ingress".to_string(), "Egress".to_string()])
    );
    if !with_cluster_cidrs() {
        return;
    }
    assert!(
        egress.contains(r#"{"ipBlock":{"cidr":"0.0.0.0/0","except":["10.244.1.0/24""#),
        "the transport rule excludes the cluster's ranges: {egress}"
    );
    assert!(
        egress.contains(r#""podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}"#),
        "DNS only to the cluster's DNS pods: {egress}"
    );
}

/// The ingress agent's egress (TailnetIngress kind): it reaches its backend pod on its target
/// port, not another pod on the same port (which the unlisted namespace's pod reaches).
async fn ingress_agent_egress(env: &E2eEnv, client: &kube::Client, ns: &str, w: &Witnesses) {
    egress_policy(client, ns, IN_CLUSTER_SERVICE).await;
    let agent = Arc::new(env.pod_netns(&w.agent_uid));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let frontend: SocketAddr = format!("{}:8080", ready_ip_of(&pods, "frontend").await)
        .parse()
        .expect("address");
    wait_for(
        "the ingress agent reaching its backend pod",
        WAIT,
        || async { connect_from(&agent, frontend).await.map(|_| ()) },
    )
    .await;
    let listed: SocketAddr = format!("{}:8080", w.listed_ip).parse().expect("address");
    echo_from(&w.unlisted, listed)
        .await
        .expect("the unlisted pod reaches the listed pod on 8080");
    refused(&agent, listed, "the ingress agent (not its backend)").await;
}

/// The IP of a Ready pod labelled `app=<app>`.
async fn ready_ip_of(pods: &Api<Pod>, app: &str) -> String {
    let list = pods
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("pods");
    list.items
        .iter()
        .find_map(|p| ready_pod_ip(p).ok())
        .unwrap_or_else(|| panic!("a Ready {app} pod"))
}

/// A TCP connection from `netns` (blocking, so off the runtime), as a tokio stream.
async fn connect_from(
    netns: &Arc<Netns>,
    addr: SocketAddr,
) -> Result<tokio::net::TcpStream, String> {
    let netns = netns.clone();
    let stream = tokio::task::spawn_blocking(move || {
        netns
            .connect_tcp(addr, Duration::from_secs(3))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("connect {addr}: {e}"))
    })
    .await
    .map_err(|e| e.to_string())??;
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    tokio::net::TcpStream::from_std(stream).map_err(|e| e.to_string())
}

/// The HTTPS request of [`request`] from `netns` to `ip:443`, TLS verified for `portal`
/// against `cert_pem` only; the whole response.
async fn https_from(
    netns: &Arc<Netns>,
    ip: &str,
    portal: &str,
    cert_pem: &str,
) -> Result<String, String> {
    let addr: SocketAddr = format!("{ip}:443").parse().map_err(|e| format!("{e}"))?;
    let stream = connect_from(netns, addr).await?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(cert_pem.as_bytes()).flatten() {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = ServerName::try_from(portal.to_string()).map_err(|e| e.to_string())?;
    let step = Duration::from_secs(5);
    let mut tls = tokio::time::timeout(
        step,
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream),
    )
    .await
    .map_err(|_| "TLS handshake timed out".to_string())?
    .map_err(|e| format!("TLS: {e}"))?;
    tls.write_all(request(portal).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(step, tls.read_to_end(&mut response))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    ok_200(String::from_utf8_lossy(&response).into_owned())
}

/// Plain TCP with an echo: `Ok` when the line comes back.
async fn echo_from(netns: &Arc<Netns>, addr: SocketAddr) -> Result<(), String> {
    let mut stream = connect_from(netns, addr).await?;
    stream
        .write_all(b"ping\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut back = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back))
        .await
        .map_err(|_| "echo timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The unlisted namespace's pod reaches the agent pod (its metrics port) and the listed
/// namespace's pod, so its network works; the in-cluster Service and the agent's listener on
/// its pod IP refuse it, every attempt.
async fn unlisted_is_refused(w: &Witnesses, cluster_ip: &str, portal: &str, cert_pem: &str) {
    let metrics: SocketAddr = format!("{}:{ADMIN_PORT}", w.agent_ip)
        .parse()
        .expect("address");
    wait_for(
        "the unlisted pod reaching the agent's metrics port",
        WAIT,
        || async { connect_from(&w.unlisted, metrics).await.map(|_| ()) },
    )
    .await;
    let peer: SocketAddr = format!("{}:8080", w.listed_ip).parse().expect("address");
    wait_for("the unlisted pod reaching the listed pod", WAIT, || async {
        echo_from(&w.unlisted, peer).await
    })
    .await;
    for target in [cluster_ip, w.agent_ip.as_str()] {
        let mut seen = Vec::new();
        for _ in 0..DENIED_ATTEMPTS {
            match https_from(&w.unlisted, target, portal, cert_pem).await {
                Ok(answer) => {
                    panic!("the unlisted namespace got through to {target}:443: {answer}")
                }
                Err(error) => seen.push(error),
            }
        }
        eprintln!("unlisted namespace → {target}:443 refused: {seen:?}");
    }
    // And the listed one still gets through directly to the agent's pod IP as well.
    let answer = https_from(&w.listed, &w.agent_ip, portal, cert_pem)
        .await
        .expect("the listed pod reaching the agent's pod IP");
    no_identity_headers(&answer);
}

/// Without listed namespaces: the in-cluster Service goes, the name leaves the cluster's
/// records (tailnet clients keep it through the extra records).
async fn without_listed_namespaces(
    client: &kube::Client,
    ns: &str,
    ingresses: &Api<TailnetIngress>,
    portal: &str,
) {
    ingresses
        .patch(
            "portal",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"inCluster": null}})),
        )
        .await
        .expect("inCluster removed");
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    wait_for("the in-cluster Service deleted", WAIT, || async {
        match services
            .get_opt(IN_CLUSTER_SERVICE)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), COREDNS_NAMESPACE);
    let hosts = wait_for("the name out of the cluster's records", WAIT, || async {
        let hosts = hosts_of(&config_maps).await?;
        if hosts.contains(portal) {
            Err(hosts)
        } else {
            Ok(hosts)
        }
    })
    .await;
    assert_no_tailnet_address(&hosts);
    let records = config_maps
        .get(COREDNS_CONFIG_MAP)
        .await
        .expect("ConfigMap")
        .data
        .unwrap_or_default()
        .get("extra-records.json")
        .cloned()
        .unwrap_or_default();
    assert!(
        records.contains(portal),
        "tailnet clients keep the name: {records}"
    );
}

/// The same entrance for a Service of the tailnet `loadBalancerClass`: a TCP echo behind it,
/// the annotation listing `listed`; a pod there reaches the port by the Service's name.
async fn load_balancer_in_cluster(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    listed: &tno_testenv::E2eNamespace<'_>,
) {
    apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        "echo",
        test_server_deployment(ns, "echo", json!(["tcp-echo", "--listen", "0.0.0.0:5432"])),
    )
    .await
    .expect("echo Deployment");
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    apply(
        &services,
        "echo",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "echo", "namespace": ns, "annotations": {
                "tailnet-operator.dev/tailnet": tailnet,
                "tailnet-operator.dev/allow-from": tno_testenv_tailnet::TEAM_A_GROUP,
                "tailnet-operator.dev/in-cluster-namespaces": listed.name(),
            }},
            "spec": {"type": "LoadBalancer",
                     "loadBalancerClass": "tailnet-operator.dev/tailnet",
                     "allocateLoadBalancerNodePorts": false,
                     "selector": {"app": "echo"},
                     "ports": [{"name": "db", "port": 5432, "targetPort": 5432}]},
        }),
    )
    .await
    .expect("Service of the tailnet class");
    let in_cluster = wait_for("the Service's in-cluster Service", WAIT, || async {
        services
            .get_opt("tailnet-service-echo")
            .await
            .map_err(|e| e.to_string())?
            .and_then(|s| s.spec.and_then(|s| s.cluster_ip))
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let name = format!("echo.{ns}.lab.example.net");
    hosts_point_at_the_service(client, &name, &in_cluster).await;
    let run = env
        .tcp_check(
            listed.client(),
            listed.name(),
            "lb-by-name",
            &format!("{name}:5432"),
            60,
        )
        .await
        .expect("tcp-check pod");
    eprintln!(
        "listed namespace, tcp {name}:5432 by name (Service of the tailnet class):\n{}",
        run.log("client")
    );
    assert!(run.succeeded(), "{run}\n{}", env.diagnostics(Some(ns)));
}

/// The egress NetworkPolicy of the Service's agent: it reaches the Service's pods (the echo
/// on 5432; also what served the by-name check above), not other pods; with the cluster's
/// ranges configured, not a pod's TCP 443 either, while 443 outside the ranges connects.
async fn load_balancer_agent_egress(env: &E2eEnv, client: &kube::Client, ns: &str, w: &Witnesses) {
    egress_policy(client, ns, "tailnet-service-echo").await;
    // Under that policy the agent still logs in (Kubernetes API for its state Secret,
    // Headscale): the Service becomes Ready (NodeOnline, PolicyEffective, BackendsReachable).
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    wait_for(
        "Service echo Ready under the egress policy",
        WAIT,
        || async {
            let service = services.get("echo").await.map_err(|e| e.to_string())?;
            let conditions = service
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                Ok(())
            } else {
                Err(support::conditions::describe(&conditions))
            }
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let agent = wait_for("the Service's agent pod Ready", WAIT, || async {
        let found = agent_pods(&pods, "tailnet-service-echo")
            .await
            .map_err(|e| e.to_string())?;
        found
            .into_iter()
            .find(|p| ready_pod_ip(p).is_ok())
            .ok_or_else(|| "no Ready agent pod".to_string())
    })
    .await;
    let agent_netns = Arc::new(env.pod_netns(agent.metadata.uid.as_deref().expect("uid")));
    let echo: SocketAddr = format!("{}:5432", ready_ip_of(&pods, "echo").await)
        .parse()
        .expect("address");
    wait_for("the agent reaching the Service's pod", WAIT, || async {
        echo_from(&agent_netns, echo).await
    })
    .await;
    let frontend: SocketAddr = format!("{}:8080", ready_ip_of(&pods, "frontend").await)
        .parse()
        .expect("address");
    let listed: SocketAddr = format!("{}:8080", w.listed_ip).parse().expect("address");
    for target in [frontend, listed] {
        refused(
            &agent_netns,
            target,
            "the Service's agent (not its endpoint)",
        )
        .await;
    }
    // TCP 443, the DERP port every agent may use: a pod listening there (the unlisted pod
    // reaches it) is refused to the agent, while the laptop's lab address, outside the
    // cluster's ranges, accepts the same probe.
    let https_pod = witness_pod(client, ns, "https-witness", 443).await;
    let in_cluster: SocketAddr = format!("{}:443", ready_pod_ip(&https_pod).expect("pod IP"))
        .parse()
        .expect("address");
    wait_for("the unlisted pod reaching the 443 pod", WAIT, || async {
        echo_from(&w.unlisted, in_cluster).await
    })
    .await;
    let outside = SocketAddr::from((tno_testenv_tailnet::LAPTOP_LAB_ADDR, 443));
    let _listener = env
        .tailnet()
        .laptop
        .netns
        .bind_tcp(outside)
        .expect("a listener on the laptop's lab address");
    wait_for(
        "the Service's agent reaching 443 outside the cluster",
        WAIT,
        || async { connect_from(&agent_netns, outside).await.map(|_| ()) },
    )
    .await;
    eprintln!("the Service's agent → {outside} (outside the cluster's ranges) connected");
    refused(
        &agent_netns,
        in_cluster,
        "the Service's agent (a pod on 443)",
    )
    .await;
}

/// Accepts and drops connections on `addr` inside `netns` until the test ends (a stand-in for
/// a machine outside the cluster behind hand-made endpoints).
fn listen_outside(netns: &Netns, addr: SocketAddr) {
    let listener = netns.bind_tcp(addr).expect("listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
}

/// A Service of the tailnet class without a selector (issue 29 item 4, hand-made endpoints):
/// its EndpointSlice names the laptop's lab address on 15432; its agent's egress admits that
/// address on that port only.
async fn selector_less_service_egress(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    tailnet: &str,
    w: &Witnesses,
) {
    let laptop = &env.tailnet().laptop.netns;
    let endpoint = SocketAddr::from((tno_testenv_tailnet::LAPTOP_LAB_ADDR, 15432));
    let other_port = SocketAddr::from((tno_testenv_tailnet::LAPTOP_LAB_ADDR, 15433));
    listen_outside(laptop, endpoint);
    listen_outside(laptop, other_port);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    apply(
        &services,
        "manual",
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "manual", "namespace": ns, "annotations": {
                "tailnet-operator.dev/tailnet": tailnet,
                "tailnet-operator.dev/allow-from": tno_testenv_tailnet::TEAM_A_GROUP,
            }},
            "spec": {"type": "LoadBalancer",
                     "loadBalancerClass": "tailnet-operator.dev/tailnet",
                     "allocateLoadBalancerNodePorts": false,
                     "ports": [{"name": "db", "port": 5432, "targetPort": 15432}]},
        }),
    )
    .await
    .expect("selector-less Service");
    apply(
        &Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client.clone(), ns),
        "manual-1",
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "manual-1", "namespace": ns, "labels": {
                "kubernetes.io/service-name": "manual",
                "endpointslice.kubernetes.io/managed-by": "split-horizon-e2e",
            }},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [endpoint.ip().to_string()]}],
            "ports": [{"name": "db", "port": 15432, "protocol": "TCP"}],
        }),
    )
    .await
    .expect("hand-made EndpointSlice");
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), ns);
    let egress = wait_for("the endpoint's ipBlock in the agent's policy", WAIT, || async {
        let policy = policies
            .get_opt("tailnet-service-manual")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no NetworkPolicy yet".to_string())?;
        let egress = serde_json::to_string(&policy.spec.unwrap_or_default().egress)
            .map_err(|e| e.to_string())?;
        let rule = format!(
            r#"{{"ports":[{{"port":15432,"protocol":"TCP"}}],"to":[{{"ipBlock":{{"cidr":"{}/32"}}}}]}}"#,
            endpoint.ip()
        );
        if egress.contains(&rule) {
            Ok(egress)
        } else {
            Err(egress)
        }
    })
    .await;
    eprintln!("NetworkPolicy tailnet-service-manual: egress {egress}");
    wait_for(
        "Service manual Ready through its hand-made endpoint",
        WAIT,
        || async {
            let service = services.get("manual").await.map_err(|e| e.to_string())?;
            let conditions = service
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                Ok(())
            } else {
                Err(support::conditions::describe(&conditions))
            }
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let agent = wait_for(
        "the selector-less Service's agent pod Ready",
        WAIT,
        || async {
            let found = agent_pods(&pods, "tailnet-service-manual")
                .await
                .map_err(|e| e.to_string())?;
            found
                .into_iter()
                .find_map(|p| p.metadata.uid.clone().filter(|_| ready_pod_ip(&p).is_ok()))
                .ok_or_else(|| "no Ready agent pod".to_string())
        },
    )
    .await;
    let agent = Arc::new(env.pod_netns(&agent));
    connect_from(&agent, endpoint)
        .await
        .expect("the agent reaches its hand-made endpoint");
    eprintln!("the selector-less Service's agent → {endpoint} connected");
    connect_from(&w.unlisted, other_port)
        .await
        .expect("a pod reaches the other port");
    refused(
        &agent,
        other_port,
        "the selector-less Service's agent (another port)",
    )
    .await;
    let echo: SocketAddr = format!("{}:5432", ready_ip_of(&pods, "echo").await)
        .parse()
        .expect("address");
    refused(&agent, echo, "the selector-less Service's agent (a pod)").await;
}
