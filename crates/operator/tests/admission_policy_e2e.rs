//! The chart's ValidatingAdmissionPolicy in a real kube-apiserver: `helm template` renders it
//! for a release in namespace A (the operator namespace), it is applied, and then
//! - a TailnetEgress in namespace B is refused at apply time, the message naming the field
//!   and the rule; one in A passes;
//! - a TailnetIngress in B whose `spec.exposes[].backend.namespace` names another namespace
//!   is refused, naming the expose; the same ingress without it passes in B, and with it in A
//!   (administrative ingress) passes.
//!
//! - a Service of `loadBalancerClass: tailnet-operator.dev/tailnet` without the
//!   `tailnet-operator.dev/allow-from` annotation is refused naming it; with it, and Services
//!   of another class or none, pass.
//!
//! - a GatewayClass of `controllerName: tailnet-operator.dev/gateway` whose `parametersRef`
//!   names another kind or no namespace is refused naming the field; with our
//!   TailnetGatewayParameters or without `parametersRef` it passes, and another controller's
//!   class passes whatever it names (the Gateway API CRDs of `deps/build.sh gateway-api`).
//!
//! helm missing (deps/build.sh helm): skips unless TNO_REQUIRE_REAL_ENV=1.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::discovery::Scope;
use serde_json::{Value, json};

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

fn admission_policy(helm: &Path, release: &str, namespace: &str) -> Vec<Value> {
    let output = std::process::Command::new(helm)
        .args(["template", release])
        .arg(root().join("charts/tailnet-operator"))
        .args(["--namespace", namespace])
        .args(["--show-only", "templates/validatingadmissionpolicy.yaml"])
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

fn resource(kind: &str, plural: &str) -> ApiResource {
    let mut r = ApiResource::from_gvk(&GroupVersionKind::gvk(
        tailnet_api::GROUP,
        tailnet_api::VERSION,
        kind,
    ));
    r.plural = plural.to_string();
    r
}

fn egress(name: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetEgress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tailnetRef": {"name": "demo"},
            "consumerNamespaces": ["team-a"],
            "targets": [{"name": "remote-db", "address": "192.0.2.10", "port": 5432}],
        },
    })
}

fn ingress(name: &str, namespace: &str, backend_namespace: Option<&str>) -> Value {
    let mut admin = json!({"service": "admin", "port": 8443});
    if let Some(ns) = backend_namespace {
        admin["namespace"] = ns.into();
    }
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetIngress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "tailnetRef": {"name": "demo"},
            "allowFrom": ["group:team-a"],
            "exposes": [
                {"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443,
                 "backend": {"service": "frontend", "port": 8080}},
                {"name": "admin", "dnsLabel": "admin", "mode": "tcp", "port": 8443,
                 "backend": admin},
            ],
        },
    })
}

async fn create(client: &kube::Client, object: &Value) -> Result<(), String> {
    let namespace = object["metadata"]["namespace"].as_str().expect("namespace");
    let api: Api<DynamicObject> = match object["kind"].as_str() {
        Some("TailnetEgress") => Api::namespaced_with(
            client.clone(),
            namespace,
            &resource("TailnetEgress", "tailnetegresses"),
        ),
        _ => Api::namespaced_with(
            client.clone(),
            namespace,
            &resource("TailnetIngress", "tailnetingresses"),
        ),
    };
    let object: DynamicObject = serde_json::from_value(object.clone()).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_admission_policy_refuses_what_only_the_operator_namespace_may_hold() {
    let Some(helm) = helm() else {
        return;
    };
    let env = tno_testenv_kube::shared()
        .await
        .unwrap_or_else(|e| panic!("kube environment: {e}"));
    let operator_ns = env.namespace("ops").await.expect("namespace");
    let team_ns = env.namespace("team").await.expect("namespace");
    let client = operator_ns.client().clone();
    let (ops, team) = (operator_ns.name(), team_ns.name());
    tno_testenv_kube::crds::install_gateway_api_crds(&client, &root(), Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    // The admissionregistration v1 API is served (GA since 1.30, on by default).
    let docs = admission_policy(&helm, "tno", ops);
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    for doc in &docs {
        let kind = doc["kind"].as_str().expect("kind");
        let name = doc["metadata"]["name"].as_str().expect("name");
        let (resource, caps) = kube::discovery::pinned_kind(
            &client,
            &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind),
        )
        .await
        .unwrap_or_else(|e| panic!("admissionregistration.k8s.io/v1 {kind} not served: {e}"));
        assert!(matches!(caps.scope, Scope::Cluster));
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .patch(
                name,
                &PatchParams::apply("admission-policy-test").force(),
                &Patch::Apply(doc),
            )
            .await
            .unwrap_or_else(|e| panic!("applying {kind} {name}: {e}"));
    }

    // The policy takes effect once the apiserver has compiled it (asynchronously): wait for
    // the first refusal.
    let misplaced = egress("misplaced", team);
    let deadline = Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        match create(&client, &misplaced).await {
            Err(e) if e.contains("ValidatingAdmissionPolicy") => break e,
            Err(e) => panic!("unexpected error: {e}"),
            Ok(()) => {
                assert!(
                    Instant::now() < deadline,
                    "the policy never refused a TailnetEgress outside the operator namespace"
                );
                // Let it in, then try again with another name.
                let api: Api<DynamicObject> = Api::namespaced_with(
                    client.clone(),
                    team,
                    &resource("TailnetEgress", "tailnetegresses"),
                );
                let _ = api.delete("misplaced", &Default::default()).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    eprintln!("egress refusal: {refusal}");
    for expected in [
        "metadata.namespace: TailnetEgress is only honoured in the operator namespace",
        &format!("{ops:?}"),
        "rule: egresses live in the operator namespace",
    ] {
        assert!(refusal.contains(expected), "{expected:?} not in {refusal}");
    }
    create(&client, &egress("team-a", ops))
        .await
        .unwrap_or_else(|e| panic!("an egress in the operator namespace was refused: {e}"));

    let refusal = create(&client, &ingress("portal", team, Some("other")))
        .await
        .expect_err("a cross-namespace backend outside the operator namespace");
    eprintln!("ingress refusal: {refusal}");
    for expected in [
        "spec.exposes[admin].backend.namespace: a backend in another namespace is only allowed for TailnetIngress objects in the operator namespace",
        &format!("{ops:?}"),
        "rule: cross-namespace backends are administrative",
    ] {
        assert!(refusal.contains(expected), "{expected:?} not in {refusal}");
    }
    // Its own namespace spelled out is not another namespace.
    create(&client, &ingress("portal-own", team, Some(team)))
        .await
        .unwrap_or_else(|e| panic!("backend.namespace = own namespace was refused: {e}"));
    create(&client, &ingress("portal", team, None))
        .await
        .unwrap_or_else(|e| panic!("an ordinary ingress was refused: {e}"));
    // An update that introduces the cross-namespace backend is refused as well.
    let ingresses: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        team,
        &resource("TailnetIngress", "tailnetingresses"),
    );
    let refusal = ingresses
        .patch(
            "portal",
            &PatchParams::apply("admission-policy-test").force(),
            &Patch::Apply(ingress("portal", team, Some("other"))),
        )
        .await
        .expect_err("an update adding a cross-namespace backend")
        .to_string();
    assert!(
        refusal.contains("spec.exposes[admin].backend.namespace"),
        "{refusal}"
    );
    create(&client, &ingress("admin-portal", ops, Some(team)))
        .await
        .unwrap_or_else(|e| panic!("an administrative ingress was refused: {e}"));
    services_of_the_tailnet_class_name_their_sources(&client, team).await;
    gateway_classes_of_ours_name_our_parameters(&client, ops).await;
}

/// A GatewayClass `name` of `controller` naming `parameters_ref` (JSON; none: no reference).
fn gateway_class(name: &str, controller: &str, parameters_ref: Option<Value>) -> Value {
    let mut spec = json!({"controllerName": controller});
    if let Some(reference) = parameters_ref {
        spec["parametersRef"] = reference;
    }
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
        "metadata": {"name": name}, "spec": spec,
    })
}

async fn gateway_classes_of_ours_name_our_parameters(client: &kube::Client, ops: &str) {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "gateway.networking.k8s.io",
            "v1",
            "GatewayClass",
        )),
    );
    let ours = "tailnet-operator.dev/gateway";
    let reference = |group: &str, kind: &str, namespace: Option<&str>| {
        let mut r = json!({"group": group, "kind": kind, "name": "tailnet"});
        if let Some(ns) = namespace {
            r["namespace"] = json!(ns);
        }
        r
    };
    // Class names are cluster-wide: unique per run through the operator namespace's name.
    let name = |suffix: &str| format!("{ops}-{suffix}");
    let create = |class: Value| {
        let api = api.clone();
        async move {
            let class: DynamicObject = serde_json::from_value(class).expect("GatewayClass");
            api.create(&PostParams::default(), &class)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let refused = [
        (
            "foreign-kind",
            reference("example.com", "Params", Some(ops)),
        ),
        (
            "no-namespace",
            reference("tailnet-operator.dev", "TailnetGatewayParameters", None),
        ),
    ];
    for (suffix, reference) in refused {
        let refusal = create(gateway_class(&name(suffix), ours, Some(reference)))
            .await
            .expect_err(suffix);
        eprintln!("GatewayClass {suffix} refusal: {refusal}");
        assert!(
            refusal.contains("spec.parametersRef: a GatewayClass of controllerName tailnet-operator.dev/gateway names {group: tailnet-operator.dev, kind: TailnetGatewayParameters"),
            "{refusal}"
        );
    }
    let accepted = [
        (
            "ours",
            ours,
            Some(reference(
                "tailnet-operator.dev",
                "TailnetGatewayParameters",
                Some(ops),
            )),
        ),
        ("default", ours, None),
        (
            "other",
            "example.com/gateway",
            Some(reference("example.com", "Params", None)),
        ),
    ];
    for (suffix, controller, reference) in accepted {
        create(gateway_class(&name(suffix), controller, reference))
            .await
            .unwrap_or_else(|e| panic!("GatewayClass {suffix} was refused: {e}"));
        let _ = api.delete(&name(suffix), &Default::default()).await;
    }
}

/// A Service of type LoadBalancer of `class` (none: ClusterIP), annotated with `allow_from`.
fn service(
    name: &str,
    class: Option<&str>,
    allow_from: Option<&str>,
) -> k8s_openapi::api::core::v1::Service {
    let mut value = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"port": 80}], "selector": {"app": name}},
    });
    if let Some(class) = class {
        value["spec"]["type"] = json!("LoadBalancer");
        value["spec"]["loadBalancerClass"] = json!(class);
    }
    if let Some(sources) = allow_from {
        value["metadata"]["annotations"] = json!({"tailnet-operator.dev/allow-from": sources});
    }
    serde_json::from_value(value).expect("service")
}

async fn services_of_the_tailnet_class_name_their_sources(client: &kube::Client, team: &str) {
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), team);
    let create = |s: k8s_openapi::api::core::v1::Service| {
        let services = services.clone();
        async move {
            services
                .create(&PostParams::default(), &s)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let refusal = create(service(
        "anonymous",
        Some("tailnet-operator.dev/tailnet"),
        None,
    ))
    .await
    .expect_err("a Service of the tailnet class without allow-from");
    eprintln!("service refusal: {refusal}");
    assert!(
        refusal.contains("metadata.annotations[tailnet-operator.dev/allow-from]"),
        "{refusal}"
    );
    create(service(
        "named",
        Some("tailnet-operator.dev/tailnet"),
        Some("group:team-a"),
    ))
    .await
    .unwrap_or_else(|e| panic!("a Service of the tailnet class with allow-from was refused: {e}"));
    create(service("other-class", Some("other"), None))
        .await
        .unwrap_or_else(|e| panic!("a Service of another class was refused: {e}"));
    create(service("plain", None, None))
        .await
        .unwrap_or_else(|e| panic!("a ClusterIP Service was refused: {e}"));
}
