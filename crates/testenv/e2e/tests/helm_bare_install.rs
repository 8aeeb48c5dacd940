//! One `helm install` on a bare cluster, as docs/quick-start.md says: a fresh control plane
//! (etcd + kube-apiserver + kube-controller-manager, no CRDs at all, in particular none of the
//! prometheus-operator's), the quick start's own values file (written by the doc's marked
//! block `cat > values.yaml <<EOF`, run with the doc's example settings: `tailnet.create:
//! true`, DNS, TLS and agent settings and the ServiceMonitor/PrometheusRule turned on). The install must succeed (CRDs created, the
//! monitoring objects skipped because their kinds are not served), and the chart's Tailnet
//! must reach the apiserver through the mechanism the chart ships: the operator binary is run
//! with the Deployment's own arguments (read back from the apiserver), the mounted ConfigMap's
//! manifest and the chart's ServiceAccount token (so only the chart's RBAC), and applies the
//! Tailnet at start. No kubelet here: the operator runs as a process, as the pod would.
//! A second test starts the operator before the CRDs exist: it keeps running, logs the refused
//! attempts, and applies the Tailnet once they are installed.
//!
//! helm or the operator binary missing: skips unless TNO_REQUIRE_REAL_ENV=1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::control_plane::ControlPlane;

const NAMESPACE: &str = "tailnet-system";
const RELEASE: &str = "tailnet-operator";

fn root() -> PathBuf {
    tno_testenv_kube::binaries::workspace_root()
}

fn skip_or_panic(what: &str) {
    assert!(
        std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
        "{what}"
    );
    eprintln!("SKIP: {what}");
}

/// The quick start's values file: the doc's marked block that writes `values.yaml`, run (as
/// `tno_testenv::quick_start` runs every block) with the doc's own example settings.
fn quick_start_values(dir: &Path) -> String {
    use tno_testenv::quick_start::{self, BlockKind, Runner};
    let (blocks, settings) =
        quick_start::read(&root().join("docs/quick-start.md")).unwrap_or_else(|e| panic!("{e}"));
    let block = blocks
        .iter()
        .find(|b| b.kind == BlockKind::Run && b.text.contains("> values.yaml"))
        .expect("docs/quick-start.md has a marked run block writing values.yaml");
    let runner = Runner {
        dir: dir.join("quick-start"),
        settings: settings.text,
        env: Vec::new(),
        doc_name: "docs/quick-start.md".into(),
    };
    runner
        .run(std::slice::from_ref(block))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::read_to_string(runner.dir.join("values.yaml")).expect("values.yaml written")
}

/// Kills the process on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A kubeconfig whose only user is the chart's ServiceAccount (a fresh token).
async fn service_account_kubeconfig(
    admin: &kube::Client,
    control_plane: &ControlPlane,
    dir: &Path,
) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(RELEASE, &PostParams::default(), &request)
        .await
        .expect("token for the chart's ServiceAccount")
        .status
        .expect("token status")
        .token;
    let kubeconfig = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "bare", "cluster": {
            "server": control_plane.server_url(),
            "certificate-authority": control_plane.ca.files.cert}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "bare", "user": "operator"}}],
        "current-context": "operator",
    });
    let path = dir.join("operator.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&kubeconfig).expect("JSON")).expect("kubeconfig");
    path
}

/// `helm install` as the quick start writes it; returns its output.
fn helm_install(helm: &Path, kubeconfig: &Path, dir: &Path, values: &Path) -> String {
    let chart = root().join("charts/tailnet-operator");
    let output = Command::new(helm)
        .args(["install", RELEASE])
        .arg(&chart)
        .args(["-n", NAMESPACE, "-f"])
        .arg(values)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CONFIG_HOME", dir.join("helm/config"))
        .env("HELM_CACHE_HOME", dir.join("helm/cache"))
        .env("HELM_DATA_HOME", dir.join("helm/data"))
        .output()
        .expect("helm runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "$ helm install {RELEASE} charts/tailnet-operator -n {NAMESPACE} -f values.yaml\n{text}"
    );
    assert!(output.status.success(), "helm install failed:\n{text}");
    text
}

/// Step 1 of the quick start: the namespace, the API key Secret, the base policy.
async fn prerequisites(admin: &kube::Client) {
    let params = PostParams::default();
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("namespace");
    Api::<Namespace>::all(admin.clone())
        .create(&params, &namespace)
        .await
        .expect("namespace");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "headscale-api-key", "namespace": NAMESPACE},
        "stringData": {"api-key": "not-a-real-key"}}))
    .expect("secret");
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .create(&params, &secret)
        .await
        .expect("secret");
    let policy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "tailnet-base-policy", "namespace": NAMESPACE},
        "data": {"policy.hujson": "{\"acls\": []}"}}))
    .expect("configmap");
    Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .create(&params, &policy)
        .await
        .expect("configmap");
}

/// The operator container's arguments as the apiserver holds them, with the mounted manifest
/// and the admin address pointed at local stand-ins.
async fn operator_args(admin: &kube::Client, dir: &Path) -> Vec<String> {
    let deployment = Api::<Deployment>::namespaced(admin.clone(), NAMESPACE)
        .get(RELEASE)
        .await
        .expect("the chart's Deployment");
    let pod = deployment.spec.expect("spec").template.spec.expect("pod");
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == "tailnet")
        .expect("the Tailnet manifest volume");
    let config_map = volume.config_map.expect("a ConfigMap volume").name;
    let data = Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .get(&config_map)
        .await
        .expect("the Tailnet manifest ConfigMap")
        .data
        .unwrap_or_default();
    let manifest = dir.join("tailnet.yaml");
    std::fs::write(
        &manifest,
        data.get("tailnet.yaml").expect("tailnet.yaml key"),
    )
    .expect("write");
    let container = pod.containers.into_iter().next().expect("container");
    let mount = container
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.name == "tailnet")
        .expect("the manifest is mounted")
        .mount_path;
    let port = tno_testenv_kube::process::free_port().expect("port");
    let args: Vec<String> = container
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|arg| {
            if let Some(path) = arg.strip_prefix("--apply-tailnet=") {
                assert!(path.starts_with(&mount), "{path} is under {mount}");
                format!("--apply-tailnet={}", manifest.display())
            } else if arg.starts_with("--admin-address=") {
                format!("--admin-address=127.0.0.1:{port}")
            } else {
                arg
            }
        })
        .collect();
    assert!(
        args.iter().any(|a| a.starts_with("--apply-tailnet=")),
        "the chart passes --apply-tailnet: {args:?}"
    );
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_start_helm_install_on_a_bare_cluster_creates_the_crds_and_the_tailnet() {
    let Ok(helm) = tno_testenv_kube::binaries::helm() else {
        return skip_or_panic("helm missing (deps/build.sh helm or TNO_BIN_HELM)");
    };
    let Ok(operator) = tno_testenv_kube::binaries::workspace_binary("tailnet-operator") else {
        return skip_or_panic("tailnet-operator missing (cargo build -p tailnet-operator)");
    };
    let binaries = Binaries::discover().expect("deps/versions.env");
    let dir = std::env::temp_dir().join(format!("tno-helm-bare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let control_plane = ControlPlane::start(
        &binaries,
        &dir.join("cluster"),
        std::net::Ipv4Addr::LOCALHOST,
        &tno_testenv_kube::network::ClusterNetwork::PRIMARY,
    )
    .await
    .expect("a bare control plane");
    let admin = control_plane.admin_client().await.expect("admin client");
    prerequisites(&admin).await;

    let values = dir.join("values.yaml");
    std::fs::write(&values, quick_start_values(&dir)).expect("values");
    let installed = helm_install(&helm, &control_plane.admin_kubeconfig, &dir, &values);
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(
            installed.contains(&format!("Skipped the {kind}")),
            "the NOTES say the {kind} was skipped: {installed}"
        );
    }
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in [
        "tailnets.tailnet-operator.dev",
        "tailnetegresses.tailnet-operator.dev",
        "tailnetingresses.tailnet-operator.dev",
    ] {
        crds.get(name).await.expect("the release created the CRD");
    }

    let args = operator_args(&admin, &dir).await;
    let kubeconfig = service_account_kubeconfig(&admin, &control_plane, &dir).await;
    let log = dir.join("operator.log");
    let child = Command::new(&operator)
        .args(&args)
        .env("KUBECONFIG", &kubeconfig)
        .env("TAILNET_OPERATOR_POD_NAME", "operator-0")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("the operator starts");
    let _operator = Running(child);

    let mut resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tailnet-operator.dev",
        "v1alpha1",
        "Tailnet",
    ));
    resource.plural = "tailnets".into();
    let tailnets: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    let tailnet = tno_testenv_kube::process::poll_until(
        "the chart's Tailnet `main` on the apiserver",
        Duration::from_secs(60),
        || async { tailnets.get_opt("main").await.ok().flatten() },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\noperator log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    check_tailnet(&tailnet.data["spec"]);
    let managers: Vec<&str> = tailnet
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert!(
        managers.contains(&"tailnet-operator-chart"),
        "applied by the operator's chart field manager: {managers:?}"
    );
    let operator_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !operator_log.contains("forbidden"),
        "the chart's RBAC covers the apply:\n{operator_log}"
    );
    drop(control_plane);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the quick start's values put into the Tailnet.
fn check_tailnet(spec: &Value) {
    assert_eq!(spec["server"], "https://headscale.example.net", "{spec}");
    assert_eq!(spec["policy"]["mode"], "DryRun", "{spec}");
    assert_eq!(
        spec["policy"]["tagOwners"],
        json!(["group:platform"]),
        "{spec}"
    );
    assert!(
        spec["dns"]["ingressNameTemplate"]
            .as_str()
            .is_some_and(|t| t.contains("{name}")),
        "dns.ingressNameTemplate: {spec}"
    );
    assert!(
        spec["dns"]["hostsConfigMap"].is_string(),
        "dns.hostsConfigMap: {spec}"
    );
    assert!(
        spec["defaults"]["tls"]["issuerRef"]["name"].is_string(),
        "defaults.tls.issuerRef: {spec}"
    );
    assert!(
        spec["agent"]["resources"]["requests"].is_object(),
        "agent.resources: {spec}"
    );
}

/// The order a real `helm install` cannot promise: the operator starts before the Tailnet CRD
/// is served. It keeps running, logs each refused attempt, and applies the Tailnet once the
/// CRDs are installed (no restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_applies_the_chart_tailnet_once_the_crds_appear() {
    let Ok(operator) = tno_testenv_kube::binaries::workspace_binary("tailnet-operator") else {
        return skip_or_panic("tailnet-operator missing (cargo build -p tailnet-operator)");
    };
    let binaries = Binaries::discover().expect("deps/versions.env");
    let dir = std::env::temp_dir().join(format!("tno-helm-late-crds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let control_plane = ControlPlane::start(
        &binaries,
        &dir.join("cluster"),
        std::net::Ipv4Addr::LOCALHOST,
        &tno_testenv_kube::network::ClusterNetwork::PRIMARY,
    )
    .await
    .expect("a bare control plane");
    let admin = control_plane.admin_client().await.expect("admin client");
    prerequisites(&admin).await;
    let manifest = dir.join("tailnet.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: tailnet-operator.dev/v1alpha1\nkind: Tailnet\nmetadata:\n  name: late\n\
         spec:\n  server: https://headscale.example.net\n  apiSecretRef: {name: headscale-api-key, key: api-key}\n\
         \x20 dns: {ingressNameTemplate: \"{name}.{namespace}.example.net\"}\n\
         \x20 policy: {mode: DryRun, tagOwners: [\"group:platform\"]}\n",
    )
    .expect("manifest");
    let port = tno_testenv_kube::process::free_port().expect("port");
    let log = dir.join("operator.log");
    let child = Command::new(&operator)
        .args([
            "run",
            "--operator-namespace",
            NAMESPACE,
            "--log-format",
            "text",
        ])
        .arg(format!("--admin-address=127.0.0.1:{port}"))
        .arg(format!("--apply-tailnet={}", manifest.display()))
        .env("KUBECONFIG", &control_plane.admin_kubeconfig)
        .env("TAILNET_OPERATOR_POD_NAME", "operator-0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("the operator starts");
    let mut operator = Running(child);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    tno_testenv_kube::process::poll_until(
        "a refused attempt in the operator's log (no Tailnet CRD yet)",
        Duration::from_secs(60),
        || async {
            read_log()
                .contains("cannot apply the chart's Tailnet yet")
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    assert!(
        operator.0.try_wait().expect("status").is_none(),
        "the operator keeps running without the CRDs:\n{}",
        read_log()
    );

    let crds = tno_testenv_kube::crds::read_crds(
        &tno_testenv_kube::crds::yaml_files(&root().join("deploy/crds")).expect("CRD files"),
    )
    .expect("CRDs");
    tno_testenv_kube::crds::install_crds(&admin, &crds, Duration::from_secs(60))
        .await
        .expect("CRDs installed");
    let mut resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tailnet-operator.dev",
        "v1alpha1",
        "Tailnet",
    ));
    resource.plural = "tailnets".into();
    let tailnets: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    // The retry backoff is capped at 30 s.
    let tailnet = tno_testenv_kube::process::poll_until(
        "the Tailnet `late` after the CRDs appeared",
        Duration::from_secs(90),
        || async { tailnets.get_opt("late").await.ok().flatten() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", read_log()));
    assert_eq!(
        tailnet.data["spec"]["dns"]["ingressNameTemplate"],
        "{name}.{namespace}.example.net"
    );
    assert!(
        read_log().contains("applied the chart's Tailnet"),
        "{}",
        read_log()
    );
    drop(operator);
    drop(control_plane);
    let _ = std::fs::remove_dir_all(&dir);
}
