//! containerboot (the official tailscale image's entrypoint) in a pod of the test kubelet keeps
//! its tailnet identity in a Kubernetes Secret: after the pod is deleted and recreated,
//! Headscale still shows the same single node, although the pre-auth key was single-use.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tno_testenv_kube::process::poll_until;
use tno_testenv_kube::{KubeEnv, shared};
use tno_testenv_tailnet::{Headscale, PreAuthKeyRequest};

const DEADLINE: Duration = Duration::from_secs(120);
const HOSTNAME: &str = "kube-pod-node";
const TAG: &str = "tag:k8s";

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

fn tailscale_pod(name: &str, login_server: &str) -> Pod {
    object(serde_json::json!({
        "metadata": { "name": name, "labels": { "app": "ts" } },
        "spec": {
            "serviceAccountName": "tailscale",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "tailscale",
                "image": "ghcr.io/tailscale/tailscale:v1.102.5",
                "env": [
                    { "name": "TS_KUBE_SECRET", "value": "ts-state" },
                    { "name": "TS_USERSPACE", "value": "true" },
                    { "name": "TS_AUTH_ONCE", "value": "true" },
                    { "name": "TS_HOSTNAME", "value": HOSTNAME },
                    { "name": "TS_EXTRA_ARGS", "value": format!("--login-server={login_server}") },
                    { "name": "TS_AUTHKEY", "valueFrom": { "secretKeyRef": { "name": "ts-auth", "key": "authkey" } } },
                    // Headscale serves HTTPS behind the lab CA (as the operator wires it).
                    { "name": "SSL_CERT_DIR", "value": "/etc/headscale-ca:/etc/ssl/certs" },
                ],
                "volumeMounts": [{ "name": "headscale-ca", "mountPath": "/etc/headscale-ca", "readOnly": true }],
                "securityContext": { "runAsUser": 1000, "runAsGroup": 1000 },
            }],
            "volumes": [{ "name": "headscale-ca", "configMap": { "name": "headscale-ca" } }],
        },
    }))
}

async fn state_device_id(secrets: &Api<Secret>) -> Option<String> {
    let secret = secrets.get_opt("ts-state").await.ok().flatten()?;
    let id = secret.data?.get("device_id")?.0.clone();
    String::from_utf8(id).ok().filter(|id| !id.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerboot_keeps_its_node_in_the_state_secret_across_pod_recreation() {
    let env: std::sync::Arc<KubeEnv> = shared()
        .await
        .unwrap_or_else(|error| panic!("environment failed to start: {error}"));
    let tailnet_binaries = tno_testenv_tailnet::Binaries::locate().expect("tailnet binaries");
    let headscale = Headscale::start(&tailnet_binaries, env.lab(), &env.dir().join("headscale"))
        .await
        .expect("headscale starts in the environment's lab");
    let api = headscale.api();
    api.create_user("admin").await.expect("user");
    api.set_policy(
        &serde_json::json!({
            "tagOwners": { TAG: ["admin@"] },
            "grants": [{ "src": [TAG], "dst": [TAG], "ip": ["*"] }],
        })
        .to_string(),
    )
    .await
    .expect("policy");
    let key = api
        .create_preauth_key(&PreAuthKeyRequest::tagged([TAG]))
        .await
        .expect("single-use tagged key");

    let namespace = env.namespace("tailscale").await.expect("namespace");
    let ns = namespace.name().to_string();
    let client = namespace.client().clone();
    let manifests = [
        serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "tailscale", "namespace": ns } }),
        serde_json::json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "tailscale", "namespace": ns },
            "rules": [
                { "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["ts-state"],
                  "verbs": ["get", "update", "patch"] },
                { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "get"] },
            ] }),
        serde_json::json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "tailscale", "namespace": ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tailscale" },
            "subjects": [{ "kind": "ServiceAccount", "name": "tailscale", "namespace": ns }] }),
        serde_json::json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "ts-auth", "namespace": ns },
            "stringData": { "authkey": key.key } }),
        serde_json::json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "ts-state", "namespace": ns } }),
        serde_json::json!({ "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "headscale-ca", "namespace": ns },
            "data": { (tno_testenv_tailnet::LAB_CA_FILE): headscale.ca_pem() } }),
    ];
    tno_testenv_kube::network::apply_all(&client, &manifests)
        .await
        .expect("RBAC and secrets applied");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let login_server = headscale.lab_url();
    let fail = |what: &str, error: &dyn std::fmt::Display| -> ! {
        panic!(
            "{what}: {error}\n----- containerboot (first) -----\n{}\n----- containerboot (second) -----\n{}\n----- headscale -----\n{}",
            namespace.container_log("ts-first", "tailscale"),
            namespace.container_log("ts-second", "tailscale"),
            headscale.log_tail(30)
        )
    };

    pods.create(
        &PostParams::default(),
        &tailscale_pod("ts-first", &login_server),
    )
    .await
    .expect("first pod created");
    let device_id = poll_until(
        "containerboot to record its device in ts-state",
        DEADLINE,
        || state_device_id(&secrets),
    )
    .await
    .unwrap_or_else(|error| fail("first login", &error));
    let first = poll_until("the node to be online in Headscale", DEADLINE, || async {
        let nodes = api.list_nodes().await.ok()?;
        nodes
            .into_iter()
            .find(|node| node.given_name == HOSTNAME || node.name == HOSTNAME)
            .filter(|node| node.online)
    })
    .await
    .unwrap_or_else(|error| fail("first node", &error));
    assert!(
        first.tags.iter().any(|tag| tag == TAG),
        "node is not tagged: {first:?}"
    );

    pods.delete("ts-first", &DeleteParams::default())
        .await
        .expect("first pod deleted");
    poll_until("the first pod to be gone", DEADLINE, || async {
        pods.get_opt("ts-first").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap_or_else(|error| fail("deletion", &error));

    pods.create(
        &PostParams::default(),
        &tailscale_pod("ts-second", &login_server),
    )
    .await
    .expect("second pod created");
    poll_until(
        "containerboot in the second pod to bring the node up",
        DEADLINE,
        || async {
            let log = namespace.container_log("ts-second", "tailscale");
            let nodes = api.list_nodes().await.ok()?;
            let matching: Vec<_> = nodes
                .into_iter()
                .filter(|node| node.given_name == HOSTNAME || node.name == HOSTNAME)
                .collect();
            // Still one node with the same id: the state Secret carried the node key.
            (log.contains("Startup complete") || matching.iter().all(|node| node.online))
                .then_some(())
                .filter(|()| {
                    matching.len() == 1 && matching[0].id == first.id && matching[0].online
                })
        },
    )
    .await
    .unwrap_or_else(|error| fail("second login", &error));
    assert_eq!(
        state_device_id(&secrets).await.as_deref(),
        Some(device_id.as_str()),
        "the device id in the state Secret changed"
    );
}
