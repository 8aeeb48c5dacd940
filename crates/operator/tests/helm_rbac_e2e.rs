//! The operator runs with exactly the Helm chart's RBAC, not as admin: the chart's
//! ServiceAccount, ClusterRole(Binding) and Role(Binding) (rendered by `helm template`) are
//! applied, a token for that ServiceAccount comes from the TokenRequest API, and the operator
//! uses a kubeconfig with only that token. It then takes an egress (operator namespace) and an
//! ingress (another namespace) through their happy paths with real traffic, creates a
//! cert-manager Certificate for an ingress without a TLS Secret, and its log shows no request
//! the apiserver forbade.
//!
//! helm missing (deps/build.sh helm): skips unless TNO_REQUIRE_REAL_ENV=1.

mod support;

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use serde_json::{Value, json};
use support::conditions::{ConditionIs, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    apply, apply_egress, bootstrap_applied_tailnet, ingress_object, remote_db_target,
    service_object, tailnet_ipv4, tailnet_with_default_issuer, test_server_deployment, tls_secret,
};
use support::tailnet::{https_get_hello, ok_200, self_signed};
use support::wait::{WAIT, wait_for};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, E2eNamespace, OperatorArgs, OperatorProcess};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// helm ([`tno_testenv_kube::binaries::helm`]: `TNO_BIN_HELM`, the deps cache, `PATH`);
/// `None` = skip.
fn helm() -> Option<PathBuf> {
    match tno_testenv_kube::binaries::helm() {
        Ok(path) => Some(path),
        Err(missing) => {
            assert!(
                std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
                "{missing}"
            );
            eprintln!("SKIP: {missing}");
            None
        }
    }
}

/// The chart's ServiceAccount and RBAC for release `release` in `namespace` (`extra`: more
/// `helm template` arguments, e.g. `--set watchNamespaces={a}`).
fn chart_rbac(helm: &Path, release: &str, namespace: &str, extra: &[String]) -> Vec<Value> {
    let chart = root().join("charts/tailnet-operator");
    let output = std::process::Command::new(helm)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", namespace])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .args(["--show-only", "templates/clusterrole.yaml"])
        .args(["--show-only", "templates/role.yaml"])
        // Renders nothing (and --show-only fails) without watchNamespaces.
        .args(if extra.is_empty() {
            &[][..]
        } else {
            &["--show-only", "templates/namespace-roles.yaml"][..]
        })
        .args(extra)
        .output()
        .expect("helm");
    assert!(
        output.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc).expect("YAML");
            (!value.is_null()).then_some(value)
        })
        .collect()
}

async fn apply_dynamic(client: &kube::Client, namespace: &str, doc: &Value) -> (String, String) {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let kind = doc["kind"].as_str().expect("kind");
    let name = doc["metadata"]["name"].as_str().expect("name").to_owned();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let (resource, caps) =
        kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
            .await
            .expect("kind served");
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply("helm-rbac-test").force(),
        &Patch::Apply(doc),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
    (kind.to_owned(), name)
}

/// Applies the chart's RBAC for `release` in `ns` (with `extra` helm arguments) and writes a
/// kubeconfig whose only credential is a token of the chart's ServiceAccount. Returns it and
/// the cluster-scoped objects to delete afterwards.
async fn operator_with_chart_rbac(
    env: &E2eEnv,
    admin: &kube::Client,
    helm: &Path,
    release: &str,
    ns: &str,
    extra: &[String],
) -> (PathBuf, Vec<(String, String)>) {
    let mut cluster_objects = Vec::new();
    let mut service_account = None;
    for doc in chart_rbac(helm, release, ns, extra) {
        let namespace = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(ns)
            .to_owned();
        let (kind, name) = apply_dynamic(admin, &namespace, &doc).await;
        match kind.as_str() {
            "ClusterRole" | "ClusterRoleBinding" => cluster_objects.push((kind, name)),
            "ServiceAccount" => service_account = Some(name),
            _ => {}
        }
    }
    let service_account = service_account.expect("the chart renders a ServiceAccount");
    let (_, kubeconfig) =
        tno_testenv::token_kubeconfig(env.lab_kubeconfig(), admin, ns, &service_account)
            .await
            .expect("a token kubeconfig");
    let kubeconfig_path = env.dir().join(format!("{release}-operator.kubeconfig"));
    std::fs::write(&kubeconfig_path, kubeconfig.to_string()).expect("write kubeconfig");
    (kubeconfig_path, cluster_objects)
}

/// The https expose of ingress `portal`: port 443 to the backend Service's port `main`.
fn portal_exposes() -> Value {
    json!([{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
            "backend": {"service": "frontend", "port": "main"}}])
}

/// A backend answering with its `name`, a self-signed TLS Secret and ingress `portal` in
/// `namespace`: the ingress becomes Ready and https from the laptop reaches the backend.
async fn serve_https_portal(
    env: &E2eEnv,
    admin: &kube::Client,
    namespace: &str,
    tailnet_name: &str,
    name: &str,
    operator: &tno_testenv::OperatorProcess,
) {
    apply(
        &Api::<Deployment>::namespaced(admin.clone(), namespace),
        "frontend",
        test_server_deployment(
            namespace,
            "frontend",
            json!(["http-echo", "--listen", "0.0.0.0:8080", "--name", name]),
        ),
    )
    .await
    .expect("backend Deployment");
    apply(
        &Api::<Service>::namespaced(admin.clone(), namespace),
        "frontend",
        service_object(namespace, "frontend", 8080),
    )
    .await
    .expect("backend Service");
    let portal = format!("portal.{namespace}.lab.example.net");
    let (cert_pem, key_pem) = self_signed(std::slice::from_ref(&portal));
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", &cert_pem, &key_pem),
        )
        .await
        .expect("TLS Secret");
    let ingresses: Api<TailnetIngress> = Api::namespaced(admin.clone(), namespace);
    apply(
        &ingresses,
        "portal",
        ingress_object(
            namespace,
            "portal",
            tailnet_name,
            Some("portal-tls"),
            portal_exposes(),
        ),
    )
    .await
    .expect("ingress");
    let ingress = wait_for_condition(
        &ingresses,
        "portal",
        ConditionIs::new("Ready", "True"),
        Some(operator),
    )
    .await;
    let ip = tailnet_ipv4(&ingress.status.clone().unwrap_or_default().tailnet_ips)
        .expect("tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    let response = wait_for("https through the ingress", WAIT, || async {
        https_get_hello(&laptop, &ip, &portal, &cert_pem, &[])
            .await
            .and_then(ok_200)
    })
    .await;
    assert!(response.contains(name), "{response}");
}

/// No line of the operator's log mentions a refused request.
fn assert_nothing_forbidden(log: &str, what: &str) {
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "{what}: the chart's RBAC refused requests:\n{}",
        forbidden.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_with_the_charts_rbac_serves_egress_and_ingress() {
    let Some(helm) = helm() else {
        return;
    };
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("rbac").await.expect("operator namespace");
    let apps = env.namespace("rbac-app").await.expect("app namespace");
    let admin = ops.client().clone();
    let ns = ops.name().to_string();
    let app_ns = apps.name().to_string();

    // The chart's RBAC, for real, with the release named after the namespace.
    let (kubeconfig_path, mut cluster_objects) =
        operator_with_chart_rbac(&env, &admin, &helm, &ns, &ns, &[]).await;

    // Inputs, as an admin would create them.
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;

    // No --installation-id: the operator reads kube-system's uid, as in a default install.
    let mut args = OperatorArgs::new(&ns).to_args();
    if let Some(at) = args.iter().position(|a| a == "--installation-id") {
        args.drain(at..at + 2);
    }
    let mut operator = start_operator(&env, &args, Some(&kubeconfig_path))
        .await
        .expect("operator");
    let install = Install {
        env: &env,
        ops: &ops,
        admin: &admin,
        ns: &ns,
        app_ns: &app_ns,
        tailnet_name: &tailnet_name,
    };
    let egresses = egress_serves(&install, &operator).await;
    let ingresses = ingress_and_its_certificate(&install, &operator).await;
    // Nothing the operator asked for was refused along the way.
    assert_nothing_forbidden(&operator.log_text(), "cluster-wide install");
    operator.terminate().await.expect("operator exits");
    let scoped_objects = namespace_scoped_install(&install, &helm, &egresses, &ingresses).await;
    cluster_objects.extend(scoped_objects);
    delete_cluster_objects(&admin, cluster_objects).await;
}

/// The installation under test.
struct Install<'a> {
    env: &'a E2eEnv,
    ops: &'a E2eNamespace<'a>,
    admin: &'a kube::Client,
    ns: &'a str,
    app_ns: &'a str,
    tailnet_name: &'a str,
}

async fn egress_serves(install: &Install<'_>, operator: &OperatorProcess) -> Api<TailnetEgress> {
    let &Install {
        env,
        ops,
        admin,
        ns,
        tailnet_name,
        ..
    } = install;
    // Egress in the operator namespace: Ready, and bytes reach the remote site.
    let egresses: Api<TailnetEgress> = Api::namespaced(admin.clone(), ns);
    apply_egress(
        &egresses,
        ns,
        "site",
        tailnet_name,
        json!([remote_db_target()]),
    )
    .await
    .expect("egress");
    wait_for_condition(
        &egresses,
        "site",
        ConditionIs::new("Ready", "True"),
        Some(operator),
    )
    .await;
    let run = ops
        .tcp_check(
            "client",
            &format!("remote-db.{ns}.svc.cluster.local:5432"),
            30,
        )
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "echo through the egress failed:\n{run}\n{}",
        env.diagnostics(Some(ns))
    );
    egresses
}

async fn ingress_and_its_certificate(
    install: &Install<'_>,
    operator: &OperatorProcess,
) -> Api<TailnetIngress> {
    let &Install {
        env,
        admin,
        app_ns,
        tailnet_name,
        ..
    } = install;
    // Ingress in another namespace: https from the laptop (group:team-a) reaches the backend.
    serve_https_portal(env, admin, app_ns, tailnet_name, "frontend", operator).await;
    let ingresses: Api<TailnetIngress> = Api::namespaced(admin.clone(), app_ns);
    let web = portal_exposes();
    let portal = format!("portal.{app_ns}.lab.example.net");

    // Without tls.secretName the operator creates a cert-manager Certificate (a failure there
    // only shows as CertificateReady=False/CertificateNotCreated, so check it explicitly).
    apply(
        &Api::<tailnet_api::Tailnet>::all(admin.clone()),
        tailnet_name,
        tailnet_with_default_issuer(env, tailnet_name),
    )
    .await
    .expect("Tailnet with a default issuer");
    apply(
        &ingresses,
        "portal",
        ingress_object(app_ns, "portal", tailnet_name, None, web),
    )
    .await
    .expect("ingress without tls.secretName");
    wait_for_condition(
        &ingresses,
        "portal",
        ConditionIs::new("CertificateReady", "False").reason("Issuing"),
        None,
    )
    .await;
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        app_ns,
        &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cert-manager.io",
            "v1",
            "Certificate",
        )),
    );
    let certificate = certificates
        .get("tailnet-ingress-portal-tls")
        .await
        .expect("the operator created the cert-manager Certificate");
    assert_eq!(certificate.data["spec"]["dnsNames"], json!([portal]));
    ingresses
}

/// Returns the cluster-scoped objects of the second release, for the cleanup.
async fn namespace_scoped_install(
    install: &Install<'_>,
    helm: &Path,
    egresses: &Api<TailnetEgress>,
    ingresses: &Api<TailnetIngress>,
) -> Vec<(String, String)> {
    let &Install {
        env,
        ops,
        admin,
        ns,
        app_ns,
        tailnet_name,
        ..
    } = install;
    // The same operator namespace, now namespace-scoped: the chart with watchNamespaces (a
    // ServiceAccount of another release, so none of the ClusterRole above applies). The old
    // ingress's namespace is not listed: its next generation must stay unreconciled while an
    // ingress in the listed namespace becomes Ready and serves.
    let scoped_apps = env
        .namespace("rbac-scoped")
        .await
        .expect("scoped app namespace");
    let scoped_ns = scoped_apps.name().to_string();
    let (scoped_kubeconfig, scoped_objects) = operator_with_chart_rbac(
        env,
        admin,
        helm,
        &format!("{ns}-scoped"),
        ns,
        &[
            "--set".to_string(),
            format!("watchNamespaces={{{scoped_ns}}}"),
        ],
    )
    .await;
    let unwatched_generation = {
        let mut old = ingresses.get("portal").await.expect("old ingress");
        old.spec.allow_from.push("group:platform".to_string());
        old.metadata.managed_fields = None;
        let patched = ingresses
            .patch(
                "portal",
                &PatchParams::apply("helm-rbac-test").force(),
                &Patch::Apply(serde_json::to_value(&old).expect("ingress JSON")),
            )
            .await
            .expect("new generation of the unwatched ingress");
        patched.metadata.generation
    };
    let mut args = OperatorArgs::new(ns).to_args();
    if let Some(at) = args.iter().position(|a| a == "--installation-id") {
        args.drain(at..at + 2);
    }
    args.extend(["--watch-namespaces".to_string(), scoped_ns.clone()]);
    let mut operator = start_operator(env, &args, Some(&scoped_kubeconfig))
        .await
        .expect("namespace-scoped operator");
    // The egress in the operator namespace keeps working.
    wait_for_condition(
        egresses,
        "site",
        ConditionIs::new("Ready", "True"),
        Some(&operator),
    )
    .await;
    let run = ops
        .tcp_check(
            "client-scoped",
            &format!("remote-db.{ns}.svc.cluster.local:5432"),
            30,
        )
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "echo through the egress (namespace-scoped operator) failed:\n{run}\n{}",
        env.diagnostics(Some(ns))
    );
    // An ingress in the watched namespace: Ready, and https from the laptop reaches it.
    serve_https_portal(
        env,
        admin,
        &scoped_ns,
        tailnet_name,
        "scoped-frontend",
        &operator,
    )
    .await;
    // Meanwhile the ingress outside the watched namespaces was not reconciled.
    let old = ingresses.get("portal").await.expect("old ingress");
    let observed = old.status.as_ref().and_then(|s| s.observed_generation);
    assert!(
        observed < unwatched_generation,
        "the namespace-scoped operator reconciled {app_ns}/portal (observed generation {observed:?}, generation {unwatched_generation:?})"
    );
    assert_nothing_forbidden(&operator.log_text(), "namespace-scoped install");
    operator.terminate().await.expect("operator exits");
    scoped_objects
}

async fn delete_cluster_objects(admin: &kube::Client, cluster_objects: Vec<(String, String)>) {
    for (kind, name) in cluster_objects {
        let result = match kind.as_str() {
            "ClusterRole" => Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
            _ => Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        };
        if let Err(e) = result {
            eprintln!("cleanup of {kind} {name}: {e}");
        }
    }
}
