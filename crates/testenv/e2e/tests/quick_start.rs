//! The quick start is executed: the marked blocks of docs/quick-start.md's "Helm install"
//! section run as written against the lab cluster, and what they set up carries traffic.
//!
//! The convention (`tno_testenv::quick_start`; the doc says it in a comment): a line
//! `<!-- quick-start: settings -->` marks the one block a user adapts (`export NAME=…`),
//! `<!-- quick-start: run -->` a shell block run as written (`bash -euo pipefail`, in order,
//! in one directory, each with the settings first), `<!-- quick-start: file NAME -->` a block
//! written to that file. Unmarked blocks (the official tailscale image's values, the `curl`
//! from a laptop) are not run.
//!
//! What the test provides, and only that:
//! - the settings with the lab's values instead of the doc's (the same variables: checked):
//!   the lab registry (`crane registry serve` on loopback) as `$REGISTRY`, Headscale's lab URL,
//!   the lab CA of its certificate and the lab's base policy as the user's files;
//! - on `PATH`: `kubectl` and `helm` from the deps cache, and `headscale`, a wrapper running
//!   the lab's Headscale CLI with its config. helm is wrapped too: the lab registry speaks plain
//!   HTTP (no TLS on loopback), so `helm install/upgrade oci://<lab registry>/…` get
//!   `--plain-http` added; that is the wrapper's only change;
//! - a cluster like the user's: the lab's own copy of our CRDs (installed from deploy/crds at
//!   its start) is deleted first, so the doc's `helm install` creates them;
//! - "your app" (namespace `team-a`, Service `frontend` port 8080) and what a cluster would
//!   have: cert-manager as the [`LabIssuer`] stand-in (a ClusterIssuer object of the name the
//!   settings give, Certificates signed by a lab CA), Headscale reading its extra records from
//!   the operator's ConfigMap mounted as a volume ([`E2eEnv::project_extra_records`]).
//!
//! The blocks run in `target/quick-start/` of this checkout: the doc says to run them from a
//! checkout, and `cargo xtask images --push "$REGISTRY" --chart` builds (in CI: finds built)
//! the release binaries there, pushes the images and the chart with their digests to the lab
//! registry. After the last block: a pod in `team-a` sends bytes through the egress to the
//! remote site (192.0.2.10:5432 behind the site's subnet router) and gets them echoed, and the
//! laptop (a `group:team-a` user) resolves the ingress name through MagicDNS and gets HTTP 200
//! over HTTPS, the certificate verified against the issuer's CA.
//!
//! Editing the doc into something that does not work fails this test: a failing block stops
//! the run with the block's number, line and output. Needs root, the deps and `cargo build
//! --workspace --bins`; skips when `target/images` is missing unless TNO_REQUIRE_REAL_ENV=1.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::json;
use tno_testenv::quick_start::{self, Block, Runner, shell_quote};
use tno_testenv::{E2eEnv, LabCa, LabIssuer};
use tno_testenv_kube::KubeEnvOptions;
use tno_testenv_kube::network::apply_all;
use tno_testenv_kube::oci_registry::LabRegistry;

const DOC: &str = "docs/quick-start.md";
/// What the doc names: the operator namespace, the Tailnet, the app's namespace, the names
/// of the egress target's Service and of the ingress.
const OPERATOR_NAMESPACE: &str = "tailnet-system";
const APP_NAMESPACE: &str = "team-a";
const HOSTS_CONFIG_MAP: &str = "tailnet-hosts";
const INGRESS_DOMAIN: &str = "tailnet.lab.example.net";
const ISSUER: &str = "apps-ca";
const WAIT: Duration = Duration::from_secs(180);

fn root() -> PathBuf {
    tno_testenv_kube::binaries::workspace_root()
}

fn doc_blocks() -> (Vec<Block>, Block) {
    quick_start::read(&root().join(DOC)).unwrap_or_else(|e| panic!("{e}"))
}

/// The lab's values of the settings, by name (the doc's settings must name the same).
struct Settings(Vec<(&'static str, String)>);

impl Settings {
    fn script(&self) -> String {
        self.0
            .iter()
            .map(|(name, value)| format!("export {name}={}\n", shell_quote(value)))
            .collect()
    }

    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

const SETTINGS: [&str; 6] = [
    "REGISTRY",
    "HEADSCALE_URL",
    "HEADSCALE_CA",
    "BASE_POLICY",
    "INGRESS_DOMAIN",
    "CLUSTER_ISSUER",
];

/// Runs without the lab: the doc's settings are the ones this test provides, and the
/// official tailscale image it offers as the alternative is the one of the pinned version.
#[test]
fn the_docs_settings_are_the_ones_the_test_provides() {
    let (_, settings) = doc_blocks();
    let names = quick_start::settings_names(&settings.text);
    assert_eq!(
        names, SETTINGS,
        "{DOC}:{}: the settings block sets other variables than this test provides",
        settings.line
    );
    let version = tno_testenv::product::tailscale_version().expect("TAILSCALE_VERSION");
    let doc = std::fs::read_to_string(root().join(DOC)).expect("the quick start");
    assert!(
        doc.contains(&format!("    tag: {version}\n")),
        "{DOC}: the official tailscale image's values name the pinned version {version}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_runs_as_written_and_carries_egress_and_ingress_traffic() {
    let images = root().join("target/images");
    if ["tailnet-operator", "tailnet-agent"]
        .iter()
        .any(|name| !images.join(name).join("index.json").is_file())
    {
        assert!(
            std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
            "{} missing: run `cargo xtask images` first",
            images.display()
        );
        eprintln!("SKIP: {} missing (cargo xtask images)", images.display());
        return;
    }
    let (blocks, _) = doc_blocks();
    let env = E2eEnv::shared_with(KubeEnvOptions::without_our_crds)
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let registry = LabRegistry::start(&env.kube().binaries().crane, &env.dir().join("registry"))
        .await
        .expect("registry");
    let client = env.kube().client().await.expect("client");
    let work = root().join(format!("target/quick-start/run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let work = work.canonicalize().expect("work dir");

    let settings = lab_settings(&env, &registry, &work);
    // What a cluster would have: cert-manager with the ClusterIssuer, Headscale reading the
    // operator's DNS records; and the user's app.
    let ca = LabCa::generate("quick start ClusterIssuer CA").expect("CA");
    let ca_pem = ca.pem().to_string();
    let _issuer = LabIssuer::spawn(client.clone(), ca);
    let _records = env
        .project_extra_records(client.clone(), OPERATOR_NAMESPACE, HOSTS_CONFIG_MAP)
        .expect("extra records mounted into Headscale");
    the_cluster_and_the_app(&client, settings.get("CLUSTER_ISSUER")).await;

    let runner = Runner {
        dir: work.clone(),
        settings: settings.script(),
        env: block_env(&env, &registry, &work),
        doc_name: DOC.into(),
    };
    let run = tokio::task::spawn_blocking(move || runner.run(&blocks))
        .await
        .expect("runner thread");
    if let Err(error) = run {
        panic!(
            "{error}\n(the blocks' directory, kept: {})\n{}\n==== operator namespace ====\n{}",
            work.display(),
            product_status(&env),
            env.diagnostics(Some(OPERATOR_NAMESPACE))
        );
    }

    egress_carries_bytes(&env, &client).await;
    agents_run_the_pushed_tailscaled(&client).await;
    ingress_answers_the_laptop(&env, &client, &ca_pem, settings.get("CLUSTER_ISSUER")).await;
    eprintln!("quick start: every block ran; egress and ingress carried traffic");
    let _ = std::fs::remove_dir_all(&work);
    drop(registry);
}

/// What `kubectl get … -o wide` says about the Tailnet, egress and ingress (each `Reason`
/// column names the first missing precondition), for a failure message.
fn product_status(env: &E2eEnv) -> String {
    let kubectl = env
        .kube()
        .binaries()
        .kube_apiserver
        .with_file_name("kubectl");
    let output = std::process::Command::new(kubectl)
        .args([
            "get",
            "tailnet,tailnetegress,tailnetingress",
            "-A",
            "-o",
            "wide",
        ])
        .env("KUBECONFIG", env.kubeconfig())
        .output();
    match output {
        Ok(output) => format!(
            "$ kubectl get tailnet,tailnetegress,tailnetingress -A -o wide\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => format!("kubectl: {e}"),
    }
}

/// The lab's values of the settings; writes the user's files (Headscale's CA, the base policy).
fn lab_settings(env: &E2eEnv, registry: &LabRegistry, work: &Path) -> Settings {
    let ca_file = work.join("headscale-ca.pem");
    std::fs::write(&ca_file, env.tailnet().headscale.ca_pem()).expect("CA file");
    let policy_file = work.join("policy/base.hujson");
    std::fs::create_dir_all(work.join("policy")).expect("policy dir");
    std::fs::write(&policy_file, env.base_policy().expect("base policy")).expect("policy");
    let path = |p: &Path| p.display().to_string();
    Settings(vec![
        ("REGISTRY", format!("{}/tailnet-operator", registry.host())),
        ("HEADSCALE_URL", env.headscale_url()),
        ("HEADSCALE_CA", path(&ca_file)),
        ("BASE_POLICY", path(&policy_file)),
        ("INGRESS_DOMAIN", INGRESS_DOMAIN.into()),
        ("CLUSTER_ISSUER", ISSUER.into()),
    ])
}

/// `PATH` with kubectl, helm (wrapped: `--plain-http` for the lab registry) and headscale
/// (wrapped: the lab's config), `KUBECONFIG`, helm's directories and an empty Docker config
/// (anonymous pushes to the lab registry) in the run's directory.
fn block_env(env: &E2eEnv, registry: &LabRegistry, work: &Path) -> Vec<(String, String)> {
    let bin = work.join(".bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let kubectl = env
        .kube()
        .binaries()
        .kube_apiserver
        .with_file_name("kubectl");
    let helm = tno_testenv_kube::binaries::helm().expect("helm");
    let tailnet = env.tailnet();
    let wrappers = [
        (
            "kubectl".to_string(),
            format!(
                "exec {} \"$@\"\n",
                shell_quote(&kubectl.display().to_string())
            ),
        ),
        (
            "helm".to_string(),
            format!(
                "# The lab registry speaks plain HTTP on loopback.\n\
                 case \" $* \" in *' oci://{host}/'*) exec {helm} \"$@\" --plain-http ;; esac\n\
                 exec {helm} \"$@\"\n",
                host = registry.host(),
                helm = shell_quote(&helm.display().to_string()),
            ),
        ),
        (
            "headscale".to_string(),
            format!(
                "exec {} -c {} \"$@\"\n",
                shell_quote(&tailnet.binaries.headscale.display().to_string()),
                shell_quote(&tailnet.headscale.config_path().display().to_string()),
            ),
        ),
    ];
    for (name, body) in wrappers {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("wrapper");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let docker_config = work.join(".docker");
    std::fs::create_dir_all(&docker_config).expect("docker config dir");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = |name: &str| work.join(".helm").join(name).display().to_string();
    vec![
        ("PATH".into(), path),
        ("KUBECONFIG".into(), env.kubeconfig().display().to_string()),
        ("HELM_CONFIG_HOME".into(), dir("config")),
        ("HELM_CACHE_HOME".into(), dir("cache")),
        ("HELM_DATA_HOME".into(), dir("data")),
        ("DOCKER_CONFIG".into(), docker_config.display().to_string()),
    ]
}

/// A cluster as the user's: cert-manager's CRDs, none of ours (the environment is started
/// without them: `helm install` creates them and would refuse to adopt existing ones; deleting
/// them here instead once left the apiserver half-way through for minutes). Then the app
/// namespace with "your app" (an HTTP echo as Service `frontend`, port 8080) and the
/// ClusterIssuer object the settings name (the [`LabIssuer`] signs its Certificates).
async fn the_cluster_and_the_app(client: &kube::Client, issuer: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // Every CRD of deploy/crds (what the chart ships).
    let shipped = tno_testenv_kube::crds::yaml_files(
        &tno_testenv_kube::binaries::workspace_root().join("deploy/crds"),
    )
    .and_then(|files| tno_testenv_kube::crds::read_crds(&files))
    .unwrap_or_else(|e| panic!("reading deploy/crds: {e}"));
    let names: Vec<String> = shipped
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect();
    assert!(names.len() >= 4, "deploy/crds: {names:?}");
    for name in &names {
        let existing = crds
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading the CRD {name}: {e}"));
        assert!(
            existing.is_none(),
            "the environment started without our CRDs, yet {name} exists"
        );
    }
    apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APP_NAMESPACE}}),
            json!({"apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
                "metadata": {"name": issuer}, "spec": {"ca": {"secretName": "lab-ca"}}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "frontend", "namespace": APP_NAMESPACE},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "frontend"}},
                    "template": {"metadata": {"labels": {"app": "frontend"}},
                        "spec": {"containers": [{"name": "server",
                            "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
                            "args": ["http-echo", "--listen", "0.0.0.0:8080", "--name", "frontend"]}]}}}}),
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "frontend", "namespace": APP_NAMESPACE},
                "spec": {"selector": {"app": "frontend"},
                         "ports": [{"name": "http", "port": 8080, "targetPort": 8080}]}}),
        ],
    )
    .await
    .expect("the app and the ClusterIssuer");
}

/// A pod in team-a → remote-db.tailnet-system.svc.cluster.local:5432 → agent → tailnet →
/// subnet router → 192.0.2.10:5432, echoed back.
async fn egress_carries_bytes(env: &E2eEnv, client: &kube::Client) {
    let target = format!("remote-db.{OPERATOR_NAMESPACE}.svc.cluster.local:5432");
    let run = env
        .tcp_check(client, APP_NAMESPACE, "quick-start-client", &target, 30)
        .await
        .expect("client pod");
    assert!(run.succeeded(), "echo through the egress failed:\n{run}");
    eprintln!("egress: a pod in {APP_NAMESPACE} got its bytes echoed by {target}");
}

/// Every agent pod's tailscale container runs the `tailnet-tailscaled` image step 3 pushed,
/// by the digest `cargo xtask images` assembled (the chart's default, filled in on push).
async fn agents_run_the_pushed_tailscaled(client: &kube::Client) {
    let layout = root().join("target/images/tailnet-tailscaled");
    let digest = tno_oci::layout::Layout::read(&layout)
        .unwrap_or_else(|e| panic!("{}: {e}", layout.display()))
        .digest()
        .to_string();
    let mut seen = Vec::new();
    for namespace in [OPERATOR_NAMESPACE, APP_NAMESPACE] {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
        for pod in pods.list(&ListParams::default()).await.expect("pods").items {
            let containers = pod.spec.map(|spec| spec.containers).unwrap_or_default();
            for container in containers.iter().filter(|c| c.name == "tailscale") {
                let image = container.image.clone().unwrap_or_default();
                assert!(
                    image.contains("/tailnet-operator/tailnet-tailscaled:")
                        && image.ends_with(&format!("@{digest}")),
                    "{namespace}/{}: tailscale image {image}, expected the pushed \
                     tailnet-tailscaled@{digest}",
                    pod.metadata.name.clone().unwrap_or_default()
                );
                seen.push(image);
            }
        }
    }
    assert!(
        seen.len() >= 2,
        "the egress and the ingress agent have a tailscale container: {seen:?}"
    );
    eprintln!(
        "agents: {} tailscale containers run {}",
        seen.len(),
        seen[0]
    );
}

fn resource(kind: &str, group: &str, version: &str, plural: &str) -> ApiResource {
    let mut resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    resource.plural = plural.to_string();
    resource
}

/// The laptop (alice, group:team-a) resolves the ingress name through MagicDNS and gets 200
/// over HTTPS, verified against the ClusterIssuer's CA; the certificate came from the issuer
/// the settings name.
async fn ingress_answers_the_laptop(
    env: &E2eEnv,
    client: &kube::Client,
    ca_pem: &str,
    issuer: &str,
) {
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        APP_NAMESPACE,
        &resource("Certificate", "cert-manager.io", "v1", "certificates"),
    );
    let issuers: Vec<String> = certificates
        .list(&ListParams::default())
        .await
        .expect("Certificates")
        .items
        .iter()
        .filter_map(|c| {
            c.data["spec"]["issuerRef"]["name"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(
        issuers,
        [issuer],
        "the ingress's Certificate names the issuer"
    );
    let ingresses: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        APP_NAMESPACE,
        &resource(
            "TailnetIngress",
            "tailnet-operator.dev",
            "v1alpha1",
            "tailnetingresses",
        ),
    );
    let ingress = ingresses
        .get("portal")
        .await
        .expect("TailnetIngress portal");
    let ip = ingress.data["status"]["tailnetIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str())
        .find(|a| a.contains('.'))
        .expect("tailnet IPv4")
        .to_string();
    let name = format!("portal.{APP_NAMESPACE}.{INGRESS_DOMAIN}");
    let laptop = env.tailnet().laptop.node.local_api();
    tno_testenv_kube::process::poll_until(
        &format!("the laptop's MagicDNS to answer {name} with {ip}"),
        WAIT,
        || async {
            let ips = laptop.resolve_ipv4(&name).await.ok()?;
            ips.iter().any(|a| a.to_string() == ip).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let response = tno_testenv_kube::process::poll_until(
        &format!("https://{name}/ from the laptop"),
        WAIT,
        || async {
            tno_testenv::https_get(&laptop, &ip, 443, &name, ca_pem, "/")
                .await
                .ok()
                .filter(|text| text.starts_with("HTTP/1.1 200"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(response.contains("frontend"), "{response}");
    eprintln!(
        "ingress: the laptop → https://{name}/ ({ip}, certificate verified) → {}",
        response.lines().next().unwrap_or_default().trim()
    );
}
