//! The Gateway API Standard-channel CRDs (`deps/build.sh gateway-api`: the files of
//! `config/crd/standard/` of `sigs.k8s.io/gateway-api` at the version of `deps/versions.env`)
//! on the lab's real kube-apiserver (one shared environment per test binary): every CRD
//! installs and is `Established`, each as written (the CEL rules included), the upstream
//! safe-upgrades ValidatingAdmissionPolicy applies and is enforced, and a GatewayClass and an
//! HTTPRoute make a real round trip (schema defaults, CEL validation, status subresource).
//!
//! The CRD directory missing: skips unless TNO_REQUIRE_REAL_ENV=1.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde::Deserialize;
use serde_json::{Value, json};
use tno_testenv_kube::binaries::workspace_root;
use tno_testenv_kube::crds::{install_crds, read_crds, yaml_files};
use tno_testenv_kube::process::poll_until;
use tno_testenv_kube::{KubeEnv, shared};

const DEADLINE: Duration = Duration::from_secs(60);
const GROUP: &str = "gateway.networking.k8s.io";
const FIELD_MANAGER: &str = "gateway-api-crds-test";
/// The Standard channel of v1.6: GA kinds plus TLSRoute, ListenerSet (v1.5), TCPRoute and
/// UDPRoute (v1.6), BackendTLSPolicy.
const STANDARD_KINDS: [&str; 10] = [
    "backendtlspolicies",
    "gatewayclasses",
    "gateways",
    "grpcroutes",
    "httproutes",
    "listenersets",
    "referencegrants",
    "tcproutes",
    "tlsroutes",
    "udproutes",
];

/// The CRD directory, or `None` (the test then skips) when it was not built.
fn crd_dir() -> Option<PathBuf> {
    let dir = tno_deps::gateway_api_crds(&workspace_root())
        .unwrap_or_else(|why| panic!("no Gateway API CRD directory: {why}"));
    if dir.is_dir() {
        return Some(dir);
    }
    assert!(
        std::env::var("TNO_REQUIRE_REAL_ENV").as_deref() != Ok("1"),
        "{} missing: run deps/build.sh gateway-api (or set {})",
        dir.display(),
        tno_deps::GATEWAY_API_CRDS_VAR
    );
    eprintln!(
        "SKIPPED: {} missing (deps/build.sh gateway-api)",
        dir.display()
    );
    None
}

fn pinned_version() -> String {
    tno_deps::pinned_version(&workspace_root(), "gateway-api").expect("deps/versions.env")
}

/// Every YAML document of the directory's files, in file order.
fn documents(dir: &std::path::Path) -> Vec<Value> {
    let mut out = Vec::new();
    for path in yaml_files(dir).expect("CRD directory readable") {
        let text = std::fs::read_to_string(&path).expect("CRD file readable");
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(document).expect("YAML document");
            if !value.is_null() {
                out.push(value);
            }
        }
    }
    out
}

/// Installs the directory once per test binary (the CRDs with the environment's own
/// `install_crds`, then every other document by server-side apply) and returns the shared
/// environment and the CRD names.
async fn installed() -> Option<(Arc<KubeEnv>, PathBuf, Vec<String>)> {
    static INSTALLED: tokio::sync::OnceCell<Vec<String>> = tokio::sync::OnceCell::const_new();
    let dir = crd_dir()?;
    let env = shared()
        .await
        .unwrap_or_else(|error| panic!("environment failed to start: {error}"));
    let names = INSTALLED
        .get_or_init(|| async {
            // Built inside: the client's connections belong to the runtime that runs this.
            let client = env.client().await.expect("client");
            let crds = read_crds(&yaml_files(&dir).expect("readable")).expect("CRDs parse");
            let names = install_crds(&client, &crds, DEADLINE)
                .await
                .expect("every Gateway API CRD is applied and Established");
            for document in documents(&dir) {
                if document["kind"] != "CustomResourceDefinition" {
                    apply_document(&client, &document).await;
                }
            }
            names
        })
        .await
        .clone();
    Some((env, dir, names))
}

/// Server-side applies a cluster-scoped object of any kind the apiserver serves.
async fn apply_document(client: &kube::Client, document: &Value) {
    let object: DynamicObject = serde_json::from_value(document.clone()).expect("an object");
    let types = object.types.clone().expect("apiVersion and kind");
    let gvk = GroupVersionKind::try_from(&types).expect("a group/version/kind");
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|error| panic!("the apiserver serves {gvk:?}: {error}"));
    let name = object.metadata.name.clone().expect("a name");
    Api::<DynamicObject>::all_with(client.clone(), &resource)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|error| panic!("applying {} {name}: {error}", types.kind));
}

/// `path → leaf value` of a JSON value (objects by key, arrays by index).
fn leaves(value: &Value) -> BTreeMap<String, Value> {
    fn walk(value: &Value, path: String, out: &mut BTreeMap<String, Value>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    walk(child, format!("{path}/{key}"), out);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for (index, child) in items.iter().enumerate() {
                    walk(child, format!("{path}/{index}"), out);
                }
            }
            leaf => {
                out.insert(path, leaf.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(value, String::new(), &mut out);
    out
}

/// The same value; numbers by value (k8s-openapi keeps a schema's `minimum`/`maximum` as
/// `f64`, so the file's `65535` comes back as `65535.0`).
fn same_value(written: &Value, served: &Value) -> bool {
    match (written, served) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => written == served,
    }
}

/// The leaves of `written` that `served` lacks or has with another value.
fn not_served_as_written(written: &Value, served: &Value) -> Vec<String> {
    let served = leaves(served);
    leaves(written)
        .into_iter()
        .filter(|(path, value)| !served.get(path).is_some_and(|got| same_value(value, got)))
        .map(|(path, value)| format!("{path} = {value}"))
        .collect()
}

/// A `gateway.networking.k8s.io/v1` kind (no discovery round trip: the CRDs name them).
fn gateway_api(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", kind), plural)
}

/// A `kube::Error::Api` response's code and message.
fn refusal(result: Result<DynamicObject, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        Err(other) => panic!("expected a refusal by the apiserver, got {other}"),
        Ok(object) => panic!("expected a refusal, the apiserver accepted {object:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_standard_crd_is_established_as_written_at_the_pinned_bundle_version() {
    let Some((env, dir, names)) = installed().await else {
        return;
    };
    let mut expected: Vec<String> = STANDARD_KINDS
        .iter()
        .map(|plural| format!("{plural}.{GROUP}"))
        .collect();
    expected.sort();
    let mut installed_names = names.clone();
    installed_names.sort();
    assert_eq!(installed_names, expected);

    let crds: Api<CustomResourceDefinition> = Api::all(env.client().await.expect("client"));
    let version = pinned_version();
    for document in documents(&dir) {
        if document["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let name = document["metadata"]["name"].as_str().expect("named");
        let served = crds.get(name).await.expect("CRD served");
        let annotations = served.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(&format!("{GROUP}/bundle-version")),
            Some(&version),
            "{name}"
        );
        assert_eq!(
            annotations
                .get(&format!("{GROUP}/channel"))
                .map(String::as_str),
            Some("standard"),
            "{name}"
        );
        let established = served
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        assert!(established, "{name} is not Established");
        // Installed through k8s-openapi's typed CRD: nothing of the file may be lost on the
        // way (an unknown field would be dropped silently), the CEL rules least of all.
        let served_spec = serde_json::to_value(&served.spec).expect("spec serializes");
        let lost = not_served_as_written(&document["spec"], &served_spec);
        assert!(lost.is_empty(), "{name}: not served as written: {lost:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_class_round_trips_with_its_default_status_and_immutable_controller() {
    let Some((env, _, _)) = installed().await else {
        return;
    };
    let namespace = env.namespace("gwc").await.expect("namespace");
    let client = namespace.client().clone();
    let resource = gateway_api("GatewayClass", "gatewayclasses");
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    // Cluster-scoped: named after the test's own namespace, so parallel runs never meet.
    let name = format!("{}-class", namespace.name());
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1"),
        "kind": "GatewayClass",
        "metadata": { "name": name },
        "spec": {
            "controllerName": "tailnet-operator.dev/gateway",
            "description": "round trip of the Gateway API CRD test",
        },
    }))
    .expect("object");
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("GatewayClass created");

    let read = classes.get(&name).await.expect("GatewayClass read back");
    assert_eq!(
        read.data["spec"]["controllerName"],
        "tailnet-operator.dev/gateway"
    );
    assert_eq!(
        read.data["spec"]["description"],
        "round trip of the Gateway API CRD test"
    );
    // The schema's default status: what a GatewayClass shows until its controller answers.
    let condition = &read.data["status"]["conditions"][0];
    assert_eq!(condition["type"], "Accepted");
    assert_eq!(condition["status"], "Unknown");
    assert_eq!(condition["reason"], "Pending");
    assert_eq!(condition["message"], "Waiting for controller");

    // `controllerName` is immutable (a CEL transition rule of the CRD).
    let changed = classes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "controllerName": "example.com/other" } })),
        )
        .await;
    let (code, message) = refusal(changed);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("Value is immutable"), "{message}");

    // The controller's answer goes through the status subresource.
    let accepted = json!({ "status": { "conditions": [{
        "type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
        "observedGeneration": read.metadata.generation.unwrap_or(1),
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }] } });
    classes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&accepted))
        .await
        .expect("status written through the status subresource");
    let read = classes.get(&name).await.expect("read back");
    assert_eq!(read.data["status"]["conditions"][0]["status"], "True");
    assert_eq!(
        read.data["spec"]["controllerName"],
        "tailnet-operator.dev/gateway"
    );
    classes
        .delete(&name, &DeleteParams::default())
        .await
        .expect("GatewayClass deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_route_round_trips_with_schema_defaults_and_is_validated() {
    let Some((env, _, _)) = installed().await else {
        return;
    };
    let namespace = env.namespace("httproute").await.expect("namespace");
    let client = namespace.client().clone();
    let resource = gateway_api("HTTPRoute", "httproutes");
    let routes: Api<DynamicObject> = Api::namespaced_with(client, namespace.name(), &resource);
    let route = |name: &str, path: Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/v1"),
            "kind": "HTTPRoute",
            "metadata": { "name": name },
            "spec": {
                "parentRefs": [{ "name": "gateway", "sectionName": "http" }],
                "hostnames": ["portal.team-a.example.net"],
                "rules": [
                    { "backendRefs": [{ "name": "web", "port": 8080 }] },
                    {
                        "matches": [{ "path": path }],
                        "backendRefs": [{ "name": "api", "port": 8080, "weight": 3 }],
                    },
                ],
            },
        }))
        .expect("object")
    };
    routes
        .create(
            &PostParams::default(),
            &route("web", json!({ "type": "PathPrefix", "value": "/api" })),
        )
        .await
        .expect("HTTPRoute created");

    let read = routes.get("web").await.expect("HTTPRoute read back");
    let spec = &read.data["spec"];
    assert_eq!(spec["hostnames"], json!(["portal.team-a.example.net"]));
    // parentRefs default to a Gateway of the Gateway API group.
    assert_eq!(
        spec["parentRefs"][0],
        json!({ "group": GROUP, "kind": "Gateway", "name": "gateway", "sectionName": "http" })
    );
    // A rule without matches matches every path; backendRefs default to weight 1 Services.
    assert_eq!(
        spec["rules"][0]["matches"],
        json!([{ "path": { "type": "PathPrefix", "value": "/" } }])
    );
    assert_eq!(
        spec["rules"][0]["backendRefs"][0],
        json!({ "group": "", "kind": "Service", "name": "web", "port": 8080, "weight": 1 })
    );
    assert_eq!(
        spec["rules"][1]["matches"][0]["path"],
        json!({ "type": "PathPrefix", "value": "/api" })
    );
    assert_eq!(spec["rules"][1]["backendRefs"][0]["weight"], 3);

    // The CRD's CEL rules run in this apiserver: a prefix that is not an absolute path is
    // refused, and nothing is stored.
    let refused = routes
        .create(
            &PostParams::default(),
            &route("bad", json!({ "type": "PathPrefix", "value": "api" })),
        )
        .await;
    let (code, message) = refusal(refused);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("value must be an absolute path and start with '/'"),
        "{message}"
    );
    assert!(
        routes.get_opt("bad").await.expect("lookup").is_none(),
        "a refused HTTPRoute was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safe_upgrades_policy_refuses_an_experimental_crd_over_a_standard_one() {
    let Some((env, _, _)) = installed().await else {
        return;
    };
    let crds: Api<CustomResourceDefinition> = Api::all(env.client().await.expect("client"));
    let name = format!("gatewayclasses.{GROUP}");
    // A dry run goes through admission but stores nothing, so the other tests never see it.
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let to_experimental =
        json!({ "metadata": { "annotations": { format!("{GROUP}/channel"): "experimental" } } });
    // The policy is enforced once the apiserver has loaded it (a few seconds after it is
    // written): retry until the refusal comes.
    let message = poll_until(
        "the safe-upgrades ValidatingAdmissionPolicy to refuse the experimental channel",
        DEADLINE,
        || async {
            match crds
                .patch(&name, &dry_run, &Patch::Merge(&to_experimental))
                .await
            {
                Err(kube::Error::Api(status)) => Some(status.message.clone()),
                _ => None,
            }
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        message
            .contains("Installing experimental CRDs on top of standard channel CRDs is prohibited"),
        "{message}"
    );
    assert!(
        message.contains("safe-upgrades.gateway.networking.k8s.io"),
        "{message}"
    );
    // The same dry run without the channel change passes the policy.
    let harmless = json!({ "metadata": { "annotations": { "example.com/touched": "yes" } } });
    crds.patch(&name, &dry_run, &Patch::Merge(&harmless))
        .await
        .expect("a standard-channel update is admitted");
}

#[test]
fn leaves_compare_values_path_by_path() {
    let written = json!({ "a": { "b": [1, { "c": "x" }] }, "d": true, "e": {} });
    let same_plus_defaults = json!({ "a": { "b": [1, { "c": "x", "z": 0 }] }, "d": true, "e": {} });
    assert!(not_served_as_written(&written, &same_plus_defaults).is_empty());
    let changed = json!({ "a": { "b": [1, { "c": "y" }] }, "e": {} });
    assert_eq!(
        not_served_as_written(&written, &changed),
        vec!["/a/b/1/c = \"x\"".to_string(), "/d = true".to_string()]
    );
    // Numbers compare by value, not by representation.
    assert!(not_served_as_written(&json!({ "max": 65535 }), &json!({ "max": 65535.0 })).is_empty());
    assert_eq!(
        not_served_as_written(&json!({ "max": 65535 }), &json!({ "max": 65536.0 })),
        vec!["/max = 65535".to_string()]
    );
    assert_eq!(
        leaves(&json!({ "e": {}, "f": [] })),
        BTreeMap::from([("/e".to_string(), json!({})), ("/f".to_string(), json!([]))])
    );
}
