//! The operator runs with exactly the Helm chart's RBAC, not as admin: the chart's
//! ServiceAccount, ClusterRole(Binding) and Role(Binding) (rendered by `helm template`) are
//! applied, a token for that ServiceAccount comes from the TokenRequest API, and the operator
//! uses a kubeconfig with only that token. It then takes an egress (operator namespace) and an
//! ingress (another namespace) through their happy paths with real traffic, creates a
//! cert-manager Certificate for an ingress without a TLS Secret, and its log shows no request
//! the apiserver forbade.
//!
//! helm missing (deps/build.sh helm): skips unless TNO_REQUIRE_REAL_ENV=1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use serde_json::{Value, json};
use tailnet_api::{TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, OperatorArgs};
use tno_testenv_tailnet::Dialed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(180);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// helm from the deps cache (`TNO_BIN_HELM` overrides); `None` = skip.
fn helm() -> Option<PathBuf> {
    let path = match std::env::var_os("TNO_BIN_HELM") {
        Some(path) => PathBuf::from(path),
        None => {
            let versions =
                std::fs::read_to_string(root().join("deps/versions.env")).expect("versions.env");
            let version = versions
                .lines()
                .find_map(|l| l.strip_prefix("HELM_VERSION="))
                .expect("HELM_VERSION");
            let cache = std::env::var_os("TNO_DEPS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                        .join(".cache/tailnet-operator/deps")
                });
            cache.join(format!("helm-{version}/bin/helm"))
        }
    };
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
        "{} missing: run deps/build.sh helm",
        path.display()
    );
    eprintln!("SKIP: {} missing (deps/build.sh helm)", path.display());
    None
}

/// The chart's ServiceAccount and RBAC for release `release` in `namespace`.
fn chart_rbac(helm: &Path, release: &str, namespace: &str) -> Vec<Value> {
    let chart = root().join("charts/tailnet-operator");
    let output = std::process::Command::new(helm)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", namespace])
        .args(["--show-only", "templates/serviceaccount.yaml"])
        .args(["--show-only", "templates/clusterrole.yaml"])
        .args(["--show-only", "templates/role.yaml"])
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

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn conditions(list: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    list.iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ready(list: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
    list.iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// HTTPS GET /hello through a LocalAPI dial from `node` to `ip:443`, trusting only `ca_pem`.
async fn https_get(
    node: &tno_testenv_tailnet::LocalApi,
    ip: &str,
    sni: &str,
    ca_pem: &str,
) -> Result<String, String> {
    let stream = match tokio::time::timeout(Duration::from_secs(10), node.dial(ip, 443)).await {
        Ok(Ok(Dialed::Tailnet(stream))) => stream,
        Ok(Ok(Dialed::DialSelf { addr })) => return Err(format!("dial-self {addr}")),
        Ok(Err(e)) => return Err(format!("dial: {e}")),
        Err(_) => return Err("dial timed out".to_string()),
    };
    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name =
        rustls_pki_types::ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, stream))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS: {e}"))?;
    let request = format!("GET /hello HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&response).into_owned())
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
    let mut cluster_objects = Vec::new();
    let mut service_account = None;
    for doc in chart_rbac(&helm, &ns, &ns) {
        let (kind, name) = apply_dynamic(&admin, &ns, &doc).await;
        match kind.as_str() {
            "ClusterRole" | "ClusterRoleBinding" => cluster_objects.push((kind, name)),
            "ServiceAccount" => service_account = Some(name),
            _ => {}
        }
    }
    let service_account = service_account.expect("the chart renders a ServiceAccount");
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create_token_request(
            &service_account,
            &PostParams::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: vec![],
                    expiration_seconds: Some(3600),
                    ..TokenRequestSpec::default()
                },
                ..TokenRequest::default()
            },
        )
        .await
        .expect("TokenRequest")
        .status
        .expect("token status")
        .token;
    // The lab kubeconfig (apiserver address and CA) with the token as the only credential.
    let mut kubeconfig: Value =
        serde_yaml::from_str(&std::fs::read_to_string(env.lab_kubeconfig()).expect("kubeconfig"))
            .expect("kubeconfig YAML");
    kubeconfig["users"] = json!([{"name": "operator", "user": {"token": token}}]);
    for context in kubeconfig["contexts"].as_array_mut().expect("contexts") {
        context["context"]["user"] = json!("operator");
    }
    let kubeconfig_path = env.dir().join(format!("{ns}-operator.kubeconfig"));
    std::fs::write(&kubeconfig_path, kubeconfig.to_string()).expect("write kubeconfig");

    // Inputs, as an admin would create them.
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet_name = format!("t-{ns}");
    Api::<tailnet_api::Tailnet>::all(admin.clone())
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(env.tailnet_object(&tailnet_name, "Apply")),
        )
        .await
        .expect("Tailnet");

    // No --installation-id: the operator reads kube-system's uid, as in a default install.
    let mut args = OperatorArgs::new(&ns).to_args();
    if let Some(at) = args.iter().position(|a| a == "--installation-id") {
        args.drain(at..at + 2);
    }
    let mut operator = env
        .start_operator_with_kubeconfig(
            Path::new(env!("CARGO_BIN_EXE_tailnet-operator")),
            &args,
            &kubeconfig_path,
        )
        .await
        .expect("operator");
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("operator ready");

    // Egress in the operator namespace: Ready, and bytes reach the remote site.
    let egresses: Api<TailnetEgress> = Api::namespaced(admin.clone(), &ns);
    egresses
        .patch(
            "site",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
                "metadata": {"name": "site", "namespace": ns},
                "spec": {"tailnetRef": {"name": tailnet_name}, "consumerNamespaces": [ns],
                         "targets": [{"name": "remote-db", "address": "192.0.2.10", "port": 5432}]}
            })),
        )
        .await
        .expect("egress");
    eventually("the egress to become Ready", || async {
        let e = egresses.get("site").await.map_err(|e| e.to_string())?;
        let list = e.status.clone().unwrap_or_default().conditions;
        if is_ready(&list) {
            Ok(())
        } else {
            Err(format!(
                "{}\n--- operator ---\n{}",
                conditions(&list),
                operator.log_tail(10)
            ))
        }
    })
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
        env.diagnostics(Some(&ns))
    );

    // Ingress in another namespace: https from the laptop (group:team-a) reaches the backend.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), &app_ns);
    deployments
        .patch("frontend", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "frontend", "namespace": app_ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "frontend"}},
                     "template": {"metadata": {"labels": {"app": "frontend"}},
                                  "spec": {"containers": [{"name": "server", "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE,
                                           "args": ["http-echo", "--listen", "0.0.0.0:8080", "--name", "frontend"]}]}}}
        })))
        .await
        .expect("backend Deployment");
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &app_ns)
        .patch("frontend", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "frontend", "namespace": app_ns},
            "spec": {"selector": {"app": "frontend"}, "ports": [{"name": "main", "port": 8080, "targetPort": 8080}]}
        })))
        .await
        .expect("backend Service");
    let portal = format!("portal.{app_ns}.lab.example.net");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec![portal.clone()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let cert_pem = cert.pem();
    Api::<Secret>::namespaced(admin.clone(), &app_ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("portal-tls".into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(cert_pem.clone().into_bytes()),
                    ),
                    (
                        "tls.key".to_string(),
                        ByteString(key.serialize_pem().into_bytes()),
                    ),
                ])),
                ..Default::default()
            },
        )
        .await
        .expect("TLS Secret");
    let ingresses: Api<TailnetIngress> = Api::namespaced(admin.clone(), &app_ns);
    ingresses
        .patch("portal", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": "portal", "namespace": app_ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "allowFrom": ["group:team-a"],
                     "tls": {"secretName": "portal-tls"},
                     "exposes": [{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                                  "backend": {"service": "frontend", "port": "main"}}]}
        })))
        .await
        .expect("ingress");
    let ingress = eventually("the ingress to become Ready", || async {
        let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
        let list = i.status.clone().unwrap_or_default().conditions;
        if is_ready(&list) {
            Ok(i)
        } else {
            Err(format!(
                "{}\n--- operator ---\n{}",
                conditions(&list),
                operator.log_tail(10)
            ))
        }
    })
    .await;
    let ip = ingress
        .status
        .clone()
        .unwrap_or_default()
        .tailnet_ips
        .into_iter()
        .find(|a| a.contains('.'))
        .expect("tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    let response = eventually("https through the ingress", || async {
        let text = https_get(&laptop, &ip, &portal, &cert_pem).await?;
        if text.starts_with("HTTP/1.1 200") {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    assert!(response.contains("frontend"), "{response}");

    // Without tls.secretName the operator creates a cert-manager Certificate (a failure there
    // only shows as CertificateReady=False/CertificateNotCreated, so check it explicitly).
    let mut tailnet = env.tailnet_object(&tailnet_name, "Apply");
    tailnet["spec"]["defaults"] =
        json!({"tls": {"issuerRef": {"name": "apps-ca", "kind": "ClusterIssuer"}}});
    Api::<tailnet_api::Tailnet>::all(admin.clone())
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(tailnet),
        )
        .await
        .expect("Tailnet with a default issuer");
    ingresses
        .patch("portal", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": "portal", "namespace": app_ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "allowFrom": ["group:team-a"],
                     "exposes": [{"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                                  "backend": {"service": "frontend", "port": "main"}}]}
        })))
        .await
        .expect("ingress without tls.secretName");
    eventually("CertificateReady=False/Issuing", || async {
        let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
        let list = i.status.clone().unwrap_or_default().conditions;
        let issuing = list
            .iter()
            .any(|c| c.type_ == "CertificateReady" && c.reason == "Issuing");
        if issuing {
            Ok(())
        } else {
            Err(conditions(&list))
        }
    })
    .await;
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &app_ns,
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

    // Nothing the operator asked for was refused along the way.
    let log = operator.log_text();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "the chart's RBAC refused requests:\n{}",
        forbidden.join("\n")
    );

    operator.terminate().await.expect("operator exits");
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
