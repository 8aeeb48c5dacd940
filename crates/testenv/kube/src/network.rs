//! Cluster networking like a real node: kube-proxy (nftables mode) inside the lab netns, and
//! CoreDNS as a Deployment run by the test kubelet behind the `kube-dns` Service.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::discovery::{ApiResource, Discovery};
use tno_netlab::Lab;

use crate::error::{Error, IoContext, KubeContext, NetlabContext, Result};
use crate::process::{ManagedProcess, poll_until};

/// The Service CIDR; the apiserver takes the first address (10.96.0.1) for `kubernetes`.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The ClusterIP of the `kubernetes` Service.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The pod CIDR of the lab (see `tno_netlab::Lab`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The ClusterIP of the `kube-dns` Service.
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The image reference CoreDNS is deployed with (mapped to the local binary by the kubelet).
pub const COREDNS_IMAGE: &str = "registry.k8s.io/coredns/coredns:v1.14.7";

const FIELD_MANAGER: &str = "tno-testenv";

/// The addresses of one cluster of the lab: its node netns, pod and Service CIDRs. Two
/// clusters on one machine (a Headscale shared by several installations) differ in all of
/// them, as two real clusters would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterNetwork {
    /// The node netns is `<run>-<lab_name>`.
    pub lab_name: &'static str,
    pub node_name: &'static str,
    /// Passed to kube-controller-manager (`--cluster-name`).
    pub cluster_name: &'static str,
    /// `10.<pod_network>.0.0/16`; pods get `10.<pod_network>.1.1` upwards.
    pub pod_network: u8,
    pub pod_cidr: &'static str,
    pub service_cidr: &'static str,
    /// The first address of `service_cidr` (the `kubernetes` Service).
    pub kubernetes_service_ip: Ipv4Addr,
    /// The `kube-dns` Service.
    pub cluster_dns_ip: Ipv4Addr,
}

impl ClusterNetwork {
    /// The lab's first cluster (what every single-cluster test runs in).
    pub const PRIMARY: ClusterNetwork = ClusterNetwork {
        lab_name: "lab",
        node_name: "tno-node",
        cluster_name: "tno",
        pod_network: tno_netlab::DEFAULT_POD_NETWORK,
        pod_cidr: CLUSTER_CIDR,
        service_cidr: SERVICE_CIDR,
        kubernetes_service_ip: KUBERNETES_SERVICE_IP,
        cluster_dns_ip: CLUSTER_DNS_IP,
    };

    /// A second cluster beside [`Self::PRIMARY`]: node netns `<run>-lab-b`, pods in
    /// 10.245.0.0/16, Services in 10.97.0.0/16.
    pub const SECOND: ClusterNetwork = ClusterNetwork {
        lab_name: "lab-b",
        node_name: "tno-node-b",
        cluster_name: "tno-b",
        pod_network: 245,
        pod_cidr: "10.245.0.0/16",
        service_cidr: "10.97.0.0/16",
        kubernetes_service_ip: Ipv4Addr::new(10, 97, 0, 1),
        cluster_dns_ip: Ipv4Addr::new(10, 97, 0, 10),
    };
}

/// Starts kube-proxy in the lab netns. `kubeconfig` must point at the apiserver through the
/// lab (`https://<gateway>:<port>`), since the lab cannot reach the root netns's loopback.
pub fn start_kube_proxy(
    binary: &Path,
    lab: &Lab,
    kubeconfig: &Path,
    network: &ClusterNetwork,
    dir: &Path,
) -> Result<ManagedProcess> {
    let config_path = dir.join("kube-proxy.yaml");
    let config = serde_json::json!({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": { "kubeconfig": kubeconfig },
        "mode": "nftables",
        "clusterCIDR": network.pod_cidr,
        "hostnameOverride": network.node_name,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        // nf_conntrack_max is global to the machine: leave it, and the timeouts, alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    });
    std::fs::write(&config_path, config.to_string())
        .io_context(|| format!("writing {config_path:?}"))?;
    let mut command = lab
        .netns()
        .command(binary)
        .netlab_context(|| "preparing kube-proxy in the lab netns".into())?;
    command.arg(format!("--config={}", config_path.display()));
    ManagedProcess::spawn("kube-proxy", command, &dir.join("kube-proxy.log"))
}

/// Server-side applies the CoreDNS objects (RBAC, Corefile, Deployment, `kube-dns` Service)
/// and waits until the Deployment is available.
pub async fn deploy_coredns(
    client: &kube::Client,
    cluster_dns_ip: Ipv4Addr,
    deadline: Duration,
) -> Result<()> {
    let manifests = coredns_manifests(cluster_dns_ip);
    apply_all(client, &manifests).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    poll_until("CoreDNS to become available", deadline, || async {
        let deployment = deployments.get_opt("coredns").await.ok().flatten()?;
        let ready = deployment.status?.available_replicas.unwrap_or(0);
        (ready >= 1).then_some(())
    })
    .await
}

/// How long [`apply_all`] waits for the apiserver to serve every kind it applies: a CRD
/// created or another group deleted a moment ago leaves discovery in flux for a while
/// (a group still listed under `/apis` answers 404 on its version).
const DISCOVERY_DEADLINE: Duration = Duration::from_secs(30);

/// Server-side applies arbitrary objects (resolved through discovery of only the API groups
/// the objects name, retried until every kind resolves or [`DISCOVERY_DEADLINE`] passes).
pub async fn apply_all(client: &kube::Client, objects: &[serde_json::Value]) -> Result<()> {
    let gvks: Vec<kube::api::GroupVersionKind> = objects.iter().map(group_version_kind).collect();
    let mut groups: Vec<&str> = gvks.iter().map(|gvk| gvk.group.as_str()).collect();
    groups.sort_unstable();
    groups.dedup();
    let discovery = discover_until_served(client, &groups, &gvks).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for (object, gvk) in objects.iter().zip(&gvks) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let (resource, capabilities): (ApiResource, _) =
            discovery.resolve_gvk(gvk).ok_or_else(|| Error::Setup {
                what: name.to_string(),
                reason: format!("the apiserver does not serve {gvk:?}"),
            })?;
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(namespace) if capabilities.scope == kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .kube_context(|| format!("applying {} {name}", gvk.kind))?;
    }
    Ok(())
}

/// Discovery of `groups` once every one of `gvks` resolves, tried again every half second
/// until [`DISCOVERY_DEADLINE`]; the error names what was still missing.
async fn discover_until_served(
    client: &kube::Client,
    groups: &[&str],
    gvks: &[kube::api::GroupVersionKind],
) -> Result<Discovery> {
    let started = tokio::time::Instant::now();
    loop {
        let problem = match Discovery::new(client.clone()).filter(groups).run().await {
            Ok(discovery) => match gvks.iter().find(|gvk| discovery.resolve_gvk(gvk).is_none()) {
                None => return Ok(discovery),
                Some(gvk) => format!(
                    "the apiserver does not serve {}/{} {}",
                    gvk.group, gvk.version, gvk.kind
                ),
            },
            Err(error) => format!("discovery failed: {error}"),
        };
        if started.elapsed() >= DISCOVERY_DEADLINE {
            return Err(Error::Setup {
                what: "API discovery".into(),
                reason: format!("{problem} (after {DISCOVERY_DEADLINE:?})"),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// An object's group, version and kind from its `apiVersion` and `kind` (empty when absent).
fn group_version_kind(object: &serde_json::Value) -> kube::api::GroupVersionKind {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    };
    kube::api::GroupVersionKind::gvk(group, version, kind)
}

const COREFILE: &str = r#".:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    hosts /etc/coredns/hosts {
        fallthrough
    }
    cache 5
    reload 2s
}
"#;

/// The objects a kubeadm cluster has for CoreDNS, trimmed to what the lab needs. Extra names
/// can be served by editing the `hosts` key of the `coredns` ConfigMap (reloaded by CoreDNS).
fn coredns_manifests(cluster_dns_ip: Ipv4Addr) -> Vec<serde_json::Value> {
    use serde_json::json;
    let labels = json!({ "k8s-app": "kube-dns" });
    vec![
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "coredns", "namespace": "kube-system" },
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": { "name": "system:coredns" },
            "rules": [
                { "apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"] },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"] },
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": { "name": "system:coredns" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns" },
            "subjects": [{ "kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system" }],
        }),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "coredns", "namespace": "kube-system" },
            "data": { "Corefile": COREFILE, "hosts": "" },
        }),
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "coredns", "namespace": "kube-system", "labels": labels },
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": labels },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "terminationGracePeriodSeconds": 5,
                        "containers": [{
                            "name": "coredns",
                            "image": COREDNS_IMAGE,
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                { "name": "dns", "containerPort": 53, "protocol": "UDP" },
                                { "name": "dns-tcp", "containerPort": 53, "protocol": "TCP" },
                            ],
                            "readinessProbe": {
                                "httpGet": { "path": "/ready", "port": 8181 },
                                "periodSeconds": 1,
                            },
                            "volumeMounts": [{ "name": "config", "mountPath": "/etc/coredns", "readOnly": true }],
                        }],
                        "volumes": [{ "name": "config", "configMap": { "name": "coredns" } }],
                    },
                },
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": "kube-dns", "namespace": "kube-system", "labels": labels },
            "spec": {
                "clusterIP": cluster_dns_ip.to_string(),
                "selector": labels,
                "ports": [
                    { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53 },
                    { "name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53 },
                ],
            },
        }),
    ]
}
