//! Installable for real: the images that `cargo xtask images` built (OCI layouts under
//! `target/images/`) are pushed by digest to the lab's OCI registry (`crane registry serve` on
//! loopback), the chart is packaged and pushed there as an OCI artifact (`helm push`), and
//! `helm install oci://…/tailnet-operator --version <chart version>` installs it with the images
//! by digest. The test kubelet pulls the operator's image (and the agents': tailnet-agent and
//! tailnet-tailscaled) from the registry and runs each from its own root file
//! system: two replicas, one leader. Through that install
//! an egress carries bytes to the remote site and an ingress serves HTTPS to the laptop; then
//! `helm upgrade` with a changed value rolls the operator pods while the agents keep their
//! Headscale nodes and keep serving, and `helm uninstall` removes the operator's own objects
//! and leaves what docs/upgrades.md says it leaves (CRDs, the custom resources, their agents).
//!
//! The transcript of the helm commands is printed and written to `<run>/e2e/helm-transcript.txt`.
//! Needs `target/images/` (`cargo xtask images`); skips without it unless TNO_REQUIRE_REAL_ENV=1.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::json;
use tno_testenv::{E2eEnv, E2eNamespace, LabCa};
use tno_testenv_kube::network::apply_all;
use tno_testenv_kube::oci_registry::LabRegistry;

const WAIT: Duration = Duration::from_secs(240);

fn root() -> PathBuf {
    tno_testenv_kube::binaries::workspace_root()
}

/// helm through [`tno_testenv::product::Helm`]: each command printed as it runs, a failure
/// fails the test.
struct Helm(tno_testenv::product::Helm);

impl Helm {
    fn run(&mut self, args: &[&str]) -> String {
        let result = self.0.run(args);
        eprintln!("{}", self.0.last_entry());
        result.unwrap_or_else(|e| panic!("{e}"))
    }
}

async fn poll<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    tno_testenv_kube::process::poll_until(what, WAIT, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tailnet_resource(kind: &str, plural: &str) -> ApiResource {
    let mut resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tailnet-operator.dev",
        "v1alpha1",
        kind,
    ));
    resource.plural = plural.to_string();
    resource
}

async fn wait_ready(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    poll(&format!("{name} to be Ready"), || async {
        let object = api.get_opt(name).await.ok().flatten()?;
        let ready = object.data["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(object)
    })
    .await
}

/// The operator pods of the release that are Ready, with the image IDs the kubelet pulled.
async fn ready_operator_pods(pods: &Api<Pod>, release: &str) -> Vec<(String, String)> {
    let selector =
        format!("app.kubernetes.io/instance={release},app.kubernetes.io/name=tailnet-operator");
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|list| list.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter_map(|pod| {
            let status = pod.status?;
            let ready = status
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let image_id = status.container_statuses?.first()?.image_id.clone();
            ready.then(|| (pod.metadata.name.unwrap_or_default(), image_id))
        })
        .collect()
}

async fn egress_echo(ns: &E2eNamespace<'_>, pod: &str) {
    let target = format!("remote-db.{}.svc.cluster.local:5432", ns.name());
    let run = ns.tcp_check(pod, &target, 30).await.expect("client pod");
    assert!(run.succeeded(), "echo through the egress failed:\n{run}");
}

async fn ingress_https(env: &E2eEnv, ip: &str, portal: &str, ca_pem: &str) -> String {
    let laptop = env.tailnet().laptop.node.local_api();
    poll(&format!("https://{portal}/ from the laptop"), || async {
        tno_testenv::https_get(&laptop, ip, 443, portal, ca_pem, "/")
            .await
            .ok()
            .filter(|text| text.starts_with("HTTP/1.1 200"))
    })
    .await
}

/// Headscale nodes tagged as agents of this test's Tailnet: id by hostname.
async fn agent_nodes(env: &E2eEnv) -> BTreeSet<(u64, String)> {
    env.headscale_api()
        .list_nodes()
        .await
        .expect("Headscale nodes")
        .into_iter()
        .filter(|node| {
            node.tags
                .iter()
                .any(|tag| tag.contains("-egress-") || tag.contains("-ingress-"))
        })
        .map(|node| (node.id, node.given_name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_installed_from_the_lab_registry_serves_egress_and_ingress_then_upgrades_and_uninstalls()
 {
    let images = root().join("target/images");
    let layouts: Vec<PathBuf> = ["tailnet-operator", "tailnet-agent"]
        .iter()
        .map(|name| images.join(name))
        .collect();
    if layouts.iter().any(|dir| !dir.join("index.json").is_file()) {
        assert!(
            std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "{} missing: run `cargo xtask images` first",
            images.display()
        );
        eprintln!("SKIP: {} missing (cargo xtask images)", images.display());
        return;
    }
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let registry_dir = env.dir().join("registry");
    let registry = LabRegistry::start(&env.kube().binaries().crane, &registry_dir)
        .await
        .expect("registry");
    let chart_version = chart_version();

    let pushed = push_images(&registry).await;
    let mut helm = Helm(
        tno_testenv::product::Helm::new(env.kubeconfig(), &env.dir().join("helm-home"))
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let chart_ref = helm
        .0
        .publish_chart(&env.dir().join("chart"), &registry)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", helm.0.transcript.join("\n"));

    // Inputs an admin creates: namespace, API key Secret, base policy, a Tailnet.
    let ops = env.namespace("helm").await.expect("operator namespace");
    let apps = env.namespace("helm-app").await.expect("app namespace");
    let ns = ops.name().to_string();
    let app_ns = apps.name().to_string();
    let admin = ops.client().clone();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet_name = format!("t-{ns}");
    apply_all(&admin, &[env.tailnet_object(&tailnet_name, "Apply")])
        .await
        .expect("Tailnet");

    let release = ns.clone();
    // The chart's fullname: <release>-tailnet-operator.
    let fullname = format!("{release}-tailnet-operator");
    let r = Release {
        env: &env,
        ops: &ops,
        admin,
        ns,
        app_ns,
        tailnet_name,
        release,
        fullname,
        chart_ref,
        chart_version,
        pushed,
    };
    install_release(&mut helm, &r);
    let pods: Api<Pod> = Api::namespaced(r.admin.clone(), &r.ns);
    let leases: Api<Lease> = Api::namespaced(r.admin.clone(), &r.ns);
    let first = operator_pods_and_leader(&r, &pods, &leases).await;
    let egresses = egress_through_the_release(&r).await;
    let served = ingress_through_the_release(&r).await;
    let (agent_uids, nodes_before) = agents_run_the_pushed_images(&r).await;
    upgrade_keeps_the_agents(&mut helm, &r, &pods, &leases, &first, &served, nodes_before).await;
    uninstall_leaves_the_resources(&mut helm, &r, &pods, &egresses, &served, agent_uids).await;

    let transcript = helm.0.transcript.join("\n");
    let path = env.dir().join("helm-transcript.txt");
    std::fs::write(&path, &transcript).expect("transcript");
    eprintln!("transcript: {}", path.display());
    // The agents of the custom resources left behind: deleting them is the admin's call.
    drop(apps);
    drop(ops);
    drop(registry);
}

/// The images CI built, pushed to the lab registry: repository and digest of each.
struct Pushed {
    operator_repo: String,
    operator_digest: String,
    agent_repo: String,
    agent_digest: String,
    tailscale_repo: String,
    tailscale_digest: String,
}

/// The release under test and where it lives.
struct Release<'a> {
    env: &'a E2eEnv,
    ops: &'a E2eNamespace<'a>,
    admin: kube::Client,
    /// The operator's namespace (also the release name).
    ns: String,
    app_ns: String,
    tailnet_name: String,
    release: String,
    /// The chart's fullname: <release>-tailnet-operator.
    fullname: String,
    chart_ref: String,
    chart_version: String,
    pushed: Pushed,
}

/// The ingress the release serves, as the laptop reaches it.
struct Served {
    ingresses: Api<DynamicObject>,
    ip: String,
    portal: String,
    ca: LabCa,
}

/// Pushes what CI built, by digest.
async fn push_images(registry: &LabRegistry) -> Pushed {
    let images = tno_testenv::product::push_product_images(registry, &root().join("target/images"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for image in [&images.operator, &images.agent, &images.tailscale] {
        eprintln!("pushed {}@{}", image.repository, image.digest);
    }
    Pushed {
        operator_repo: images.operator.repository,
        operator_digest: images.operator.digest,
        agent_repo: images.agent.repository,
        agent_digest: images.agent.digest,
        tailscale_repo: images.tailscale.repository,
        tailscale_digest: images.tailscale.digest,
    }
}

/// `helm install` from the registry, two replicas, the pushed images by digest.
fn install_release(helm: &mut Helm, r: &Release<'_>) {
    let Release {
        release,
        chart_ref,
        chart_version,
        ns,
        ..
    } = r;
    let Pushed {
        operator_repo,
        operator_digest,
        agent_repo,
        agent_digest,
        tailscale_repo,
        tailscale_digest,
        ..
    } = &r.pushed;
    let operator_image = [
        format!("image.repository={operator_repo}"),
        format!("image.digest={operator_digest}"),
        format!("agent.image.repository={agent_repo}"),
        format!("agent.image.digest={agent_digest}"),
        format!("agent.tailscaleImage.repository={tailscale_repo}"),
        format!("agent.tailscaleImage.digest={tailscale_digest}"),
    ];
    let mut install = vec![
        "install",
        release.as_str(),
        chart_ref.as_str(),
        "--version",
        chart_version.as_str(),
        "--plain-http",
        "--namespace",
        ns.as_str(),
        "--wait",
        "--timeout",
        "4m",
        // The CRDs are templates of the release (crds.install, crds.keep). The lab installed
        // the same CRDs from deploy/crds when it started: the release adopts them, as it would
        // adopt CRDs applied by hand before a first `helm install`.
        "--take-ownership",
        "--set",
        "replicaCount=2",
        "--set",
        "operator.headscalePollInterval=2s",
        "--set",
        "operator.logFormat=text",
    ];
    for value in &operator_image {
        install.extend(["--set", value.as_str()]);
    }
    let installed = helm.run(&install);
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    assert!(
        installed.contains("NOTES"),
        "the chart prints its NOTES: {installed}"
    );
}

async fn operator_pods_and_leader(
    r: &Release<'_>,
    pods: &Api<Pod>,
    leases: &Api<Lease>,
) -> Vec<(String, String)> {
    let Release {
        admin,
        ns,
        release,
        fullname,
        ..
    } = r;
    let Pushed {
        operator_repo,
        operator_digest,
        ..
    } = &r.pushed;
    // Two replicas from the pulled image, one leader.
    let first = poll("two Ready operator pods", || async {
        let ready = ready_operator_pods(pods, release).await;
        (ready.len() == 2).then_some(ready)
    })
    .await;
    for (pod, image_id) in &first {
        assert_eq!(
            image_id,
            &format!("{operator_repo}@{operator_digest}"),
            "{pod} runs the pushed image"
        );
    }
    let leader = poll("an operator leader", || async {
        let lease = leases
            .get_opt("tailnet-operator-leader")
            .await
            .ok()
            .flatten()?;
        let holder = lease.spec?.holder_identity?;
        first
            .iter()
            .any(|(pod, _)| *pod == holder)
            .then_some(holder)
    })
    .await;
    eprintln!("leader: {leader}");
    let pdb = Api::<PodDisruptionBudget>::namespaced(admin.clone(), ns)
        .get(fullname)
        .await
        .expect("a PodDisruptionBudget with 2 replicas");
    assert!(pdb.spec.and_then(|spec| spec.min_available).is_some());
    first
}

async fn egress_through_the_release(r: &Release<'_>) -> Api<DynamicObject> {
    let Release {
        ops,
        admin,
        ns,
        tailnet_name,
        ..
    } = r;
    // Egress: bytes reach the remote site.
    let egresses: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &tailnet_resource("TailnetEgress", "tailnetegresses"),
    );
    apply_all(
        admin,
        &[json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
            "metadata": {"name": "site", "namespace": ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "consumerNamespaces": [ns],
                     "targets": [{"name": "remote-db", "address": "192.0.2.10", "port": 5432}]}
        })],
    )
    .await
    .expect("egress");
    wait_ready(&egresses, "site").await;
    egress_echo(ops, "client-1").await;
    egresses
}

async fn ingress_through_the_release(r: &Release<'_>) -> Served {
    let Release {
        env,
        admin,
        app_ns,
        tailnet_name,
        ..
    } = r;
    // Ingress: HTTPS from the laptop, certificate verified.
    let ca = LabCa::generate("helm e2e CA").expect("CA");
    let portal = format!("portal.{app_ns}.lab.example.net");
    let tls: Secret = ca
        .tls_secret("portal-tls", app_ns, std::slice::from_ref(&portal))
        .expect("TLS Secret");
    apply_all(
        admin,
        &[
            serde_json::to_value(&tls).expect("Secret JSON"),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "frontend", "namespace": app_ns},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "frontend"}},
                    "template": {"metadata": {"labels": {"app": "frontend"}},
                        "spec": {"containers": [{"name": "server",
                            "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
                            "args": ["http-echo", "--listen", "0.0.0.0:8080", "--name", "frontend"]}]}}}}),
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "frontend", "namespace": app_ns},
                "spec": {"selector": {"app": "frontend"},
                         "ports": [{"name": "main", "port": 8080, "targetPort": 8080}]}}),
            json!({"apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
                "metadata": {"name": "portal", "namespace": app_ns},
                "spec": {"tailnetRef": {"name": tailnet_name}, "allowFrom": ["group:team-a"],
                         "tls": {"secretName": "portal-tls"},
                         "exposes": [{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                                      "backend": {"service": "frontend", "port": "main"}}]}}),
        ],
    )
    .await
    .expect("ingress and its backend");
    let ingresses: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        app_ns,
        &tailnet_resource("TailnetIngress", "tailnetingresses"),
    );
    let ingress = wait_ready(&ingresses, "portal").await;
    let ip = ingress.data["status"]["tailnetIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str())
        .find(|a| a.contains('.'))
        .expect("tailnet IPv4")
        .to_string();
    let response = ingress_https(env, &ip, &portal, ca.pem()).await;
    assert!(response.contains("frontend"), "{response}");
    Served {
        ingresses,
        ip,
        portal,
        ca,
    }
}

async fn agents_run_the_pushed_images(
    r: &Release<'_>,
) -> (BTreeSet<String>, BTreeSet<(u64, String)>) {
    let Release {
        env,
        admin,
        ns,
        app_ns,
        ..
    } = r;
    let Pushed {
        agent_repo,
        agent_digest,
        tailscale_repo,
        tailscale_digest,
        ..
    } = &r.pushed;
    // The agents run the pushed agent image.
    let agent_pods: Vec<Pod> = Api::<Pod>::namespaced(admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .chain(
            Api::<Pod>::namespaced(admin.clone(), app_ns)
                .list(&ListParams::default())
                .await
                .expect("pods")
                .items,
        )
        .filter(|pod| {
            pod.spec.as_ref().is_some_and(|spec| {
                spec.containers.iter().any(|c| {
                    c.image
                        .as_deref()
                        .is_some_and(|i| i.starts_with(agent_repo.as_str()))
                })
            })
        })
        .collect();
    assert_eq!(agent_pods.len(), 2, "one agent pod per egress and ingress");
    for pod in &agent_pods {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        assert!(
            statuses
                .iter()
                .any(|s| s.image_id == format!("{agent_repo}@{agent_digest}")),
            "agent pod {:?} runs the pushed agent image: {statuses:?}",
            pod.metadata.name
        );
        assert!(
            statuses
                .iter()
                .any(|s| s.image_id == format!("{tailscale_repo}@{tailscale_digest}")),
            "agent pod {:?} runs the pushed tailnet-tailscaled image: {statuses:?}",
            pod.metadata.name
        );
    }
    let agent_uids: BTreeSet<String> = agent_pods
        .iter()
        .filter_map(|pod| pod.metadata.uid.clone())
        .collect();
    let nodes_before = agent_nodes(env).await;
    assert!(nodes_before.len() >= 2, "agent nodes: {nodes_before:?}");
    (agent_uids, nodes_before)
}

async fn upgrade_keeps_the_agents(
    helm: &mut Helm,
    r: &Release<'_>,
    pods: &Api<Pod>,
    leases: &Api<Lease>,
    first: &[(String, String)],
    served: &Served,
    nodes_before: BTreeSet<(u64, String)>,
) {
    let Release {
        env,
        ops,
        ns,
        release,
        chart_ref,
        chart_version,
        ..
    } = r;
    let Served { ip, portal, ca, .. } = served;
    // helm upgrade with a changed value: the operator pods roll, the agents keep their nodes.
    let upgraded = helm.run(&[
        "upgrade",
        release,
        chart_ref,
        "--version",
        chart_version,
        "--plain-http",
        "--namespace",
        ns,
        "--reuse-values",
        "--set",
        "operator.logLevel=debug",
        "--wait",
        "--timeout",
        "4m",
    ]);
    assert!(upgraded.contains("REVISION: 2"), "{upgraded}");
    let second = poll("two new Ready operator pods", || async {
        let ready = ready_operator_pods(pods, release).await;
        let all_new = ready
            .iter()
            .all(|(pod, _)| first.iter().all(|(old, _)| old != pod));
        (ready.len() == 2 && all_new).then_some(ready)
    })
    .await;
    poll("a leader among the new pods", || async {
        let lease = leases
            .get_opt("tailnet-operator-leader")
            .await
            .ok()
            .flatten()?;
        let holder = lease.spec?.holder_identity?;
        second.iter().any(|(pod, _)| *pod == holder).then_some(())
    })
    .await;
    egress_echo(ops, "client-2").await;
    let response = ingress_https(env, ip, portal, ca.pem()).await;
    assert!(response.contains("frontend"), "{response}");
    let nodes_after = agent_nodes(env).await;
    assert_eq!(
        nodes_before, nodes_after,
        "the agents kept their Headscale nodes across the upgrade"
    );
}

async fn uninstall_leaves_the_resources(
    helm: &mut Helm,
    r: &Release<'_>,
    pods: &Api<Pod>,
    egresses: &Api<DynamicObject>,
    served: &Served,
    agent_uids: BTreeSet<String>,
) {
    let Release {
        ops,
        admin,
        ns,
        app_ns,
        release,
        fullname,
        ..
    } = r;
    let Served { ingresses, .. } = served;
    // helm uninstall: the operator's own objects go; CRDs, custom resources and their agents
    // stay (docs/upgrades.md "Uninstalling").
    let uninstalled = helm.run(&["uninstall", release, "--namespace", ns, "--wait"]);
    assert!(uninstalled.contains("uninstalled"), "{uninstalled}");
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    assert!(
        deployments.get_opt(fullname).await.expect("get").is_none(),
        "the operator Deployment is gone"
    );
    assert!(
        Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .get_opt(fullname)
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        Api::<ClusterRole>::all(admin.clone())
            .get_opt(fullname)
            .await
            .expect("get")
            .is_none()
    );
    poll("the operator pods to be gone", || async {
        ready_operator_pods(pods, release)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(admin.clone());
    for name in [
        "tailnets.tailnet-operator.dev",
        "tailnetegresses.tailnet-operator.dev",
        "tailnetingresses.tailnet-operator.dev",
    ] {
        let crd = crds.get(name).await.expect("the CRDs stay (crds.keep)");
        assert_eq!(
            crd.metadata
                .annotations
                .unwrap_or_default()
                .get("helm.sh/resource-policy")
                .map(String::as_str),
            Some("keep"),
            "{name}"
        );
    }
    assert!(egresses.get_opt("site").await.expect("get").is_some());
    assert!(ingresses.get_opt("portal").await.expect("get").is_some());
    let remaining_agents: BTreeSet<String> = Api::<Pod>::namespaced(admin.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .into_iter()
        .chain(
            Api::<Pod>::namespaced(admin.clone(), app_ns)
                .list(&ListParams::default())
                .await
                .expect("pods")
                .items,
        )
        .filter_map(|pod| pod.metadata.uid)
        .filter(|uid| agent_uids.contains(uid))
        .collect();
    assert_eq!(
        remaining_agents, agent_uids,
        "agent pods are neither restarted by the upgrade nor deleted by the uninstall"
    );
    // The data plane does not need the operator.
    egress_echo(ops, "client-3").await;
}

fn chart_version() -> String {
    tno_testenv::product::chart_version().unwrap_or_else(|e| panic!("{e}"))
}
