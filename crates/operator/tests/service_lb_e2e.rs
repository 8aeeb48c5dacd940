//! Services of `loadBalancerClass: tailnet-operator.dev/tailnet` end to end (issue 29): a
//! Service with two TCP ports and one UDP port gets a tailnet node; the laptop (group:team-a)
//! reaches both TCP ports through the tailnet by IP and by name; the UDP port is reported in
//! the Service's conditions; `status.loadBalancer.ingress` carries the node's tailnet
//! addresses and name. Switching the Service to `ClusterIP` releases it (node, status,
//! finalizer gone); deleting it removes its node and its grant. A Service of another class
//! is never touched. On a Tailnet without `ingressNameTemplate` (issue 29 item 2) the Service
//! is still served and its `hostname` is its node's MagicDNS name, which the laptop resolves.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use serde_json::{Value, json};
use support::conditions::describe;
use support::lab_operator::start_operator;
use support::objects::{apply, bootstrap_applied_tailnet, tailnet_ipv4};
use support::tailnet::{PortAnswer, plaintext_probe, tcp_echo};
use support::wait::{WAIT, wait_for};
use tno_testenv::{E2eEnv, OperatorArgs};
use tno_testenv_tailnet::LocalApi;

const CLASS: &str = "tailnet-operator.dev/tailnet";
const FINALIZER: &str = "tailnet-operator.dev/cleanup";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_of_the_tailnet_class_is_exposed_and_others_are_untouched() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("lb").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    // The Tailnet's extra records reach Headscale through its mounted ConfigMap (names).
    let records = env
        .project_extra_records(client.clone(), &ns, tno_testenv::HOSTS_CONFIG_MAP)
        .expect("extra records mounted into Headscale");
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    deploy_backend(&client, &ns).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    // First a Service of another class: created before ours, so the operator's watch has
    // delivered it by the time ours is served.
    let other = apply(
        &services,
        "other",
        service(&ns, "other", Some("other"), &tailnet_name),
    )
    .await
    .expect("Service of another class");
    let other_version = other.metadata.resource_version.clone();
    apply(
        &services,
        "web",
        service(&ns, "web", Some(CLASS), &tailnet_name),
    )
    .await
    .expect("Service of the tailnet class");
    let laptop = env.tailnet().laptop.node.local_api();
    let hostname = format!("portal.{ns}.lab.example.net");
    let (ip, tag) = served(&services, &laptop, &hostname).await;
    eprintln!("kubectl get svc -o wide\n{}", kubectl_get_svc(&env, &ns));
    untouched(&client, &services, &ns, other_version).await;
    released_when_the_class_goes(&env, &services, &ns, &tailnet_name, &tag).await;
    // Back to the tailnet class: served again, then deleted.
    apply(
        &services,
        "web",
        service(&ns, "web", Some(CLASS), &tailnet_name),
    )
    .await
    .expect("the tailnet class again");
    let (ip_again, _) = served(&services, &laptop, &hostname).await;
    eprintln!("served again at {ip_again} (first {ip})");
    deleted(&env, &services, &ns, &tag).await;
    magic_dns_name_without_a_template(&env, &client, &services, &ns, &tailnet_name, &laptop).await;
    drop(records);
    operator.terminate().await.expect("operator stops cleanly");
}

/// A Deployment `web` with an HTTP echo on 8080 and a TCP echo on 5432.
async fn deploy_backend(client: &kube::Client, ns: &str) {
    let container = |name: &str, args: Value| json!({"name": name, "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE, "args": args});
    apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        "web",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [
                                      container("http", json!(["http-echo", "--listen", "0.0.0.0:8080", "--name", "web"])),
                                      container("tcp", json!(["tcp-echo", "--listen", "0.0.0.0:5432"])),
                                  ]}}}
        }),
    )
    .await
    .expect("backend Deployment");
}

/// Service `name` of type LoadBalancer (class `class`, or ClusterIP without one): http 80 →
/// 8080, 5432, and dns 53/UDP.
fn service(ns: &str, name: &str, class: Option<&str>, tailnet: &str) -> Value {
    let mut spec = json!({
        "type": "ClusterIP",
        "selector": {"app": "web"},
        "ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "db", "port": 5432, "targetPort": 5432, "protocol": "TCP"},
            {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
        ],
    });
    if let Some(class) = class {
        spec["type"] = json!("LoadBalancer");
        spec["loadBalancerClass"] = json!(class);
        spec["allocateLoadBalancerNodePorts"] = json!(false);
    }
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "annotations": {
            "tailnet-operator.dev/tailnet": tailnet,
            "tailnet-operator.dev/allow-from": tno_testenv_tailnet::TEAM_A_GROUP,
            "tailnet-operator.dev/dns-label": "portal",
        }},
        "spec": spec,
    })
}

fn conditions(service: &Service) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
    service
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

fn condition<'a>(
    service: &'a Service,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    conditions(service).iter().find(|c| c.type_ == type_)
}

/// `status.loadBalancer.ingress` as (ips, hostnames).
fn load_balancer(service: &Service) -> (Vec<String>, Vec<String>) {
    let entries: Vec<_> = service
        .status
        .iter()
        .flat_map(|s| s.load_balancer.iter())
        .flat_map(|lb| lb.ingress.iter().flatten())
        .cloned()
        .collect();
    (
        entries.iter().filter_map(|e| e.ip.clone()).collect(),
        entries.iter().filter_map(|e| e.hostname.clone()).collect(),
    )
}

/// `kubectl get svc -o wide`, as the operator's user sees it (the deps build's kubectl).
fn kubectl_get_svc(env: &E2eEnv, ns: &str) -> String {
    let versions = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deps/versions.env"),
    )
    .unwrap_or_default();
    let version = versions
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .unwrap_or_default();
    let cache = std::env::var_os("TNO_DEPS_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/tailnet-operator/deps"))
        })
        .unwrap_or_default();
    let kubectl = std::env::var_os("TNO_BIN_KUBECTL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cache.join(format!("kubernetes-{version}/bin/kubectl")));
    std::process::Command::new(kubectl)
        .arg(format!("--kubeconfig={}", env.kubeconfig().display()))
        .args(["get", "svc", "-o", "wide", "-n", ns])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_else(|e| format!("kubectl: {e}"))
}

/// Waits until `web` is Ready with its addresses, then the laptop reaches both TCP ports by
/// IP and by name. Returns the tailnet IPv4 and the node's tag.
async fn served(services: &Api<Service>, laptop: &LocalApi, hostname: &str) -> (String, String) {
    let web = wait_for(
        "Service web Ready with status.loadBalancer",
        WAIT,
        || async {
            let s = services.get("web").await.map_err(|e| e.to_string())?;
            let ready = condition(&s, "Ready").is_some_and(|c| c.status == "True");
            let (ips, names) = load_balancer(&s);
            if ready && tailnet_ipv4(&ips).is_some() && names == [hostname] {
                Ok(s)
            } else {
                Err(format!(
                    "{}\nloadBalancer: {ips:?} {names:?}",
                    describe(conditions(&s))
                ))
            }
        },
    )
    .await;
    let (ips, names) = load_balancer(&web);
    let ip = tailnet_ipv4(&ips).expect("tailnet IPv4");
    assert!(ips.iter().any(|i| i.contains(':')), "an IPv6 too: {ips:?}");
    let ports = condition(&web, "PortsSupported").expect("PortsSupported");
    assert_eq!(
        (ports.status.as_str(), ports.reason.as_str()),
        ("False", "UnsupportedProtocol")
    );
    assert!(ports.message.contains("dns (53/UDP)"), "{}", ports.message);
    eprintln!(
        "Service web: loadBalancer ips {ips:?} hostnames {names:?}\nconditions:\n{}",
        describe(conditions(&web))
    );
    wait_for("the laptop's TCP echo on 5432 by IP", WAIT, || async {
        tcp_echo(laptop, &ip, 5432).await
    })
    .await;
    wait_for("the laptop's HTTP on 80 by IP", WAIT, || async {
        http_hello(laptop, &ip, hostname).await
    })
    .await;
    let by_name = wait_for("the name to resolve to the tailnet IPv4", WAIT, || async {
        let answer = laptop
            .resolve_ipv4(hostname)
            .await
            .map_err(|e| e.to_string())?;
        answer
            .iter()
            .map(ToString::to_string)
            .find(|a| *a == ip)
            .ok_or_else(|| format!("{hostname} -> {answer:?}, expected {ip}"))
    })
    .await;
    tcp_echo(laptop, &by_name, 5432)
        .await
        .expect("TCP echo by name");
    let answer = http_hello(laptop, &by_name, hostname)
        .await
        .expect("HTTP by name");
    eprintln!(
        "by name {hostname} -> {by_name}: {}",
        answer.lines().next().unwrap_or_default()
    );
    let tag = tailnet_api::naming::entrance_tag(
        tailnet_api::naming::AgentKind::Service,
        &tailnet_api::tailnet::default_tag_prefix(),
        &web.metadata.namespace.clone().unwrap_or_default(),
        "web",
    );
    (ip, tag)
}

/// A plaintext `GET /` to `ip:80` answered 200 by the HTTP echo behind the Service.
async fn http_hello(laptop: &LocalApi, ip: &str, host: &str) -> Result<String, String> {
    match plaintext_probe(laptop, ip, 80, host).await {
        PortAnswer::Connected(bytes) => {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if text.starts_with("HTTP/1.1 200") {
                Ok(text)
            } else {
                Err(format!("answered {text:?}"))
            }
        }
        other => Err(format!("{other:?}")),
    }
}

/// The Service of another class: never written (its resourceVersion is the one it was
/// created with), no finalizer, no status, no agent.
async fn untouched(
    client: &kube::Client,
    services: &Api<Service>,
    ns: &str,
    created_version: Option<String>,
) {
    let other = services.get("other").await.expect("Service other");
    assert_eq!(
        other.metadata.resource_version, created_version,
        "nobody wrote to the Service of another class"
    );
    assert!(other.metadata.finalizers.is_none(), "{other:?}");
    assert!(conditions(&other).is_empty(), "{other:?}");
    assert_eq!(load_balancer(&other), (vec![], vec![]));
    let agent = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_opt("tailnet-service-other")
        .await
        .expect("get");
    assert!(agent.is_none(), "no agent for the Service of another class");
    eprintln!(
        "Service other (loadBalancerClass: other): untouched, resourceVersion {created_version:?}"
    );
}

/// `web` switched to ClusterIP: its node goes from Headscale, its grant from the policy, its
/// conditions and addresses from its status, and the finalizer goes.
async fn released_when_the_class_goes(
    env: &E2eEnv,
    services: &Api<Service>,
    ns: &str,
    tailnet: &str,
    tag: &str,
) {
    let headscale = env.headscale_api();
    let node_ids = |tag: String| async move {
        let nodes = env
            .headscale_api()
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?;
        Ok::<Vec<u64>, String>(
            nodes
                .iter()
                .filter(|n| n.tags.contains(&tag))
                .map(|n| n.id)
                .collect(),
        )
    };
    assert!(
        !node_ids(tag.to_string()).await.expect("nodes").is_empty(),
        "web has a node tagged {tag}"
    );
    apply(services, "web", service(ns, "web", None, tailnet))
        .await
        .expect("web as ClusterIP");
    let released = wait_for("web released", WAIT, || async {
        let s = services.get("web").await.map_err(|e| e.to_string())?;
        let finalized = s
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER);
        let (ips, names) = load_balancer(&s);
        let nodes = node_ids(tag.to_string()).await?;
        if !finalized
            && conditions(&s).is_empty()
            && ips.is_empty()
            && names.is_empty()
            && nodes.is_empty()
        {
            Ok(s)
        } else {
            Err(format!(
                "finalizer {finalized}, conditions {:?}, lb {ips:?} {names:?}, nodes {nodes:?}",
                conditions(&s).len()
            ))
        }
    })
    .await;
    wait_for("the grant of web out of the policy", WAIT, || async {
        let policy = headscale.get_policy().await.map_err(|e| e.to_string())?;
        if policy.contains(tag) {
            Err(format!("the policy still names {tag}"))
        } else {
            Ok(())
        }
    })
    .await;
    eprintln!(
        "released: {:?}\n{}",
        released.status,
        kubectl_get_svc(env, ns)
    );
}

/// Deleting `web` removes its node and its grant.
async fn deleted(env: &E2eEnv, services: &Api<Service>, ns: &str, tag: &str) {
    eprintln!("kubectl get svc -o wide\n{}", kubectl_get_svc(env, ns));
    services
        .delete("web", &Default::default())
        .await
        .expect("delete web");
    wait_for("web gone with its node", WAIT, || async {
        let gone = services
            .get_opt("web")
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        let nodes = env
            .headscale_api()
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?;
        let left: Vec<u64> = nodes
            .iter()
            .filter(|n| n.tags.iter().any(|t| t == tag))
            .map(|n| n.id)
            .collect();
        if gone && left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "Service gone: {gone}, nodes tagged {tag}: {left:?}"
            ))
        }
    })
    .await;
    wait_for("the grant out of the policy", WAIT, || async {
        let policy = env
            .headscale_api()
            .get_policy()
            .await
            .map_err(|e| e.to_string())?;
        if policy.contains(tag) {
            Err(format!("the policy still names {tag}"))
        } else {
            Ok(())
        }
    })
    .await;
    eprintln!("deleted: no node tagged {tag} and no grant left");
}

/// Issue 29 item 2: the Tailnet loses its `ingressNameTemplate` and names its MagicDNS domain;
/// the Service is served again, its `hostname` is `<node>.<magicDNSDomain>` (Headscale's given
/// name), and the laptop reaches both TCP ports by that name through MagicDNS.
async fn magic_dns_name_without_a_template(
    env: &E2eEnv,
    client: &kube::Client,
    services: &Api<Service>,
    ns: &str,
    tailnet: &str,
    laptop: &LocalApi,
) {
    use kube::api::{Patch, PatchParams};
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            tailnet,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"dns": {
                "ingressNameTemplate": null,
                "magicDNSDomain": tno_testenv_tailnet::BASE_DOMAIN,
            }}})),
        )
        .await
        .expect("Tailnet without ingressNameTemplate");
    apply(services, "web", service(ns, "web", Some(CLASS), tailnet))
        .await
        .expect("the tailnet class on a Tailnet without a name template");
    let tag = tailnet_api::naming::entrance_tag(
        tailnet_api::naming::AgentKind::Service,
        &tailnet_api::tailnet::default_tag_prefix(),
        ns,
        "web",
    );
    let magic = format!(
        "{}.{}",
        tailnet_api::naming::tag_hostname(&tag),
        tno_testenv_tailnet::BASE_DOMAIN
    );
    let (ip, _) = served(services, laptop, &magic).await;
    eprintln!(
        "without ingressNameTemplate: hostname {magic} at {ip}\nkubectl get svc -o wide\n{}",
        kubectl_get_svc(env, ns)
    );
    deleted(env, services, ns, &tag).await;
}
