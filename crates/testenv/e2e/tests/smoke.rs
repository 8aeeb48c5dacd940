//! Smoke tests of the composed environment (one shared [`E2eEnv`] per test binary): a pod of
//! the test kubelet joins the tailnet and keeps its node across recreation, the operator runs
//! in the lab and reaches the apiserver and Headscale at their lab URLs, and Headscale accepts
//! the policy `tailnet-operator render` produces for `examples/`.
//!
//! Needs the workspace's binaries (`cargo build --workspace --bins`; `scripts/test.sh` builds
//! them before running tests).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use tailnet_api::Tailnet;
use tno_testenv::{E2eEnv, OperatorArgs, workspace_operator_binary};
use tno_testenv_kube::process::poll_until;
use tno_testenv_tailnet::{CLIENT_TAG, PreAuthKeyRequest};

const DEADLINE: Duration = Duration::from_secs(120);

async fn env() -> Arc<E2eEnv> {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|error| panic!("e2e environment failed to start: {error}"));
    eprintln!(
        "e2e environment: kube started in {:.1?}, tailnet side in {:.1?}",
        env.kube().startup_time(),
        env.startup_time()
    );
    env
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

/// A pod running the official tailscale image (containerboot) the way an agent pod does:
/// userspace networking, state in a Secret, log in once with a pre-auth key.
fn tailscale_pod(login_server: &str, hostname: &str) -> Pod {
    object(json!({
        "metadata": { "name": "ts", "labels": { "app": "ts" } },
        "spec": {
            "serviceAccountName": "tailscale",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "tailscale",
                "image": tno_testenv::OFFICIAL_TAILSCALE_IMAGE,
                "env": [
                    { "name": "TS_KUBE_SECRET", "value": "ts-state" },
                    { "name": "TS_USERSPACE", "value": "true" },
                    { "name": "TS_AUTH_ONCE", "value": "true" },
                    { "name": "TS_HOSTNAME", "value": hostname },
                    { "name": "TS_EXTRA_ARGS", "value": format!("--login-server={login_server}") },
                    { "name": "TS_AUTHKEY", "valueFrom": { "secretKeyRef": { "name": "ts-auth", "key": "authkey" } } },
                    // Headscale serves HTTPS behind the lab CA: trusted the way the operator
                    // gives it to agents (spec.serverCA mounted, SSL_CERT_DIR).
                    { "name": "SSL_CERT_DIR", "value": "/etc/tailnet-operator/server-ca:/etc/ssl/certs" },
                ],
                "volumeMounts": [{ "name": "server-ca", "mountPath": "/etc/tailnet-operator/server-ca", "readOnly": true }],
                "securityContext": { "runAsUser": 1000, "runAsGroup": 1000 },
            }],
            "volumes": [{ "name": "server-ca", "configMap": { "name": tno_testenv::SERVER_CA_CONFIG_MAP } }],
        },
    }))
}

async fn state_device_id(secrets: &Api<Secret>) -> Option<String> {
    let secret = secrets.get_opt("ts-state").await.ok().flatten()?;
    let id = secret.data?.get("device_id")?.0.clone();
    String::from_utf8(id).ok().filter(|id| !id.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerboot_pod_joins_the_tailnet_and_keeps_its_node_across_recreation() {
    let env = env().await;
    let namespace = env.namespace("ts-pod").await.expect("namespace");
    let ns = namespace.name().to_owned();
    let client = namespace.client().clone();
    let api = env.headscale_api();
    let hostname = format!("e2e-{ns}");
    let key = api
        .create_preauth_key(&PreAuthKeyRequest::tagged([CLIENT_TAG]))
        .await
        .expect("single-use tagged pre-auth key");
    assert!(!key.reusable, "the pre-auth key must be single-use");

    // What an agent's RBAC grants containerboot: its state Secret and events.
    let manifests = [
        json!({ "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "tailscale", "namespace": ns } }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": { "name": "tailscale", "namespace": ns },
            "rules": [
                { "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["ts-state"],
                  "verbs": ["get", "update", "patch"] },
                { "apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "get"] },
            ] }),
        json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": { "name": "tailscale", "namespace": ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tailscale" },
            "subjects": [{ "kind": "ServiceAccount", "name": "tailscale", "namespace": ns }] }),
        json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "ts-auth", "namespace": ns },
            "stringData": { "authkey": key.key } }),
        json!({ "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "ts-state", "namespace": ns } }),
    ];
    tno_testenv_kube::network::apply_all(&client, &manifests)
        .await
        .expect("RBAC and Secrets applied");
    env.create_server_ca(&client, &ns)
        .await
        .expect("the lab CA ConfigMap");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pod = tailscale_pod(&env.headscale_url(), &hostname);
    let fail = |what: &str, error: &dyn std::fmt::Display| -> ! {
        panic!(
            "{what}: {error}\n----- containerboot -----\n{}",
            namespace.container_log("ts", "tailscale")
        )
    };

    pods.create(&PostParams::default(), &pod)
        .await
        .expect("first pod created");
    let device_id = poll_until(
        "containerboot to record its device in ts-state",
        DEADLINE,
        || state_device_id(&secrets),
    )
    .await
    .unwrap_or_else(|error| fail("first login", &error));
    let first = poll_until(
        "the pod's node to be online in Headscale",
        DEADLINE,
        || async { env.node(&hostname).await.ok().filter(|node| node.online) },
    )
    .await
    .unwrap_or_else(|error| fail("first node", &error));
    assert!(
        first.tags.iter().any(|tag| tag == CLIENT_TAG),
        "the node does not carry the key's tag: {first:?}"
    );
    // Pods, the router and the laptop are nodes of one tailnet.
    let router = env
        .node(env.tailnet().site.router.hostname())
        .await
        .expect("router node");
    assert!(
        router.online,
        "the remote site's router is offline: {router:?}"
    );

    pods.delete("ts", &DeleteParams::default())
        .await
        .expect("first pod deleted");
    poll_until(
        "the first pod to be gone and its node offline",
        DEADLINE,
        || async {
            let gone = pods.get_opt("ts").await.ok()?.is_none();
            let offline = !env.node(&hostname).await.ok()?.online;
            (gone && offline).then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| fail("deletion", &error));
    let ids_before: BTreeSet<u64> = api
        .list_nodes()
        .await
        .expect("nodes")
        .iter()
        .map(|node| node.id)
        .collect();

    pods.create(&PostParams::default(), &pod)
        .await
        .expect("second pod created");
    let second = poll_until(
        "the recreated pod's node to be online",
        DEADLINE,
        || async { env.node(&hostname).await.ok().filter(|node| node.online) },
    )
    .await
    .unwrap_or_else(|error| fail("second login", &error));
    assert_eq!(
        second.id, first.id,
        "the recreated pod came up as another node"
    );
    let new_nodes: Vec<_> = api
        .list_nodes()
        .await
        .expect("nodes")
        .into_iter()
        .filter(|node| !ids_before.contains(&node.id))
        .collect();
    assert!(
        new_nodes.is_empty(),
        "a second node appeared: {new_nodes:?}"
    );
    assert_eq!(
        state_device_id(&secrets).await.as_deref(),
        Some(device_id.as_str()),
        "the device id in the state Secret changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_in_the_lab_reaches_the_apiserver_and_headscale_at_their_lab_urls() {
    let binary = workspace_operator_binary().unwrap_or_else(|error| panic!("{error}"));
    let env = env().await;
    let namespace = env.namespace("op").await.expect("namespace");
    let ns = namespace.name().to_owned();
    let client = namespace.client().clone();
    namespace
        .create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap Secret and base policy");
    let tailnet_name = format!("e2e-{ns}");
    // Control: the root-netns URL is the operator's own loopback inside the lab.
    let root_url_name = format!("e2e-{ns}-root-url");
    let mut root_url_tailnet = env.tailnet_object(&root_url_name, "DryRun");
    root_url_tailnet["spec"]["server"] = env.headscale_root_url().into();
    tno_testenv_kube::network::apply_all(
        &client,
        &[
            env.tailnet_object(&tailnet_name, "DryRun"),
            root_url_tailnet,
        ],
    )
    .await
    .expect("Tailnets applied");

    let mut operator = env
        .start_operator(&binary, &OperatorArgs::new(&ns).to_args())
        .await
        .expect("operator started");
    operator
        .wait_ready(DEADLINE)
        .await
        .unwrap_or_else(|error| panic!("{error}"));

    // spec.server is the lab URL, which only resolves inside the lab: a True condition proves
    // the operator reached Headscale there, and it read the Tailnet through the lab apiserver.
    let tailnets: Api<Tailnet> = Api::all(client.clone());
    let conditions = poll_until(
        "the Tailnet to report HeadscaleReachable=True",
        DEADLINE,
        || async {
            let tailnet = tailnets.get(&tailnet_name).await.ok()?;
            let conditions = tailnet.status?.conditions;
            conditions
                .iter()
                .any(|c| c.type_ == "HeadscaleReachable" && c.status == "True")
                .then_some(conditions)
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}\n==== operator log ====\n{}", operator.log_tail(80)));
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "BaseValid" && c.status == "True"),
        "the e2e base policy is not valid for the operator: {conditions:?}"
    );

    poll_until(
        "the root-URL Tailnet to report HeadscaleReachable=False",
        DEADLINE,
        || async {
            let tailnet = tailnets.get(&root_url_name).await.ok()?;
            tailnet
                .status?
                .conditions
                .iter()
                .any(|c| c.type_ == "HeadscaleReachable" && c.status == "False")
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}\n==== operator log ====\n{}", operator.log_tail(80)));

    // The Prometheus text format by default (curl, promtool), OpenMetrics when asked for (as
    // Prometheus does).
    let metrics = operator.metrics().await.expect("metrics scraped");
    assert!(
        metrics.contains("# TYPE tailnet_operator_reconciles_total counter")
            && !metrics.contains("# EOF"),
        "not the Prometheus text format: {metrics}"
    );
    let open = reqwest::Client::new()
        .get(operator.metrics_url())
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )
        .send()
        .await
        .expect("OpenMetrics scrape");
    assert_eq!(
        open.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let open = open.text().await.expect("OpenMetrics body");
    assert!(
        open.contains("# TYPE tailnet_operator_reconciles counter") && open.ends_with("# EOF\n"),
        "not OpenMetrics text: {open}"
    );

    let status = operator
        .terminate()
        .await
        .expect("graceful exit on SIGTERM");
    assert!(
        status.success(),
        "operator exited with {status}; log:\n{}",
        operator.log_tail(60)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headscale_accepts_the_policy_rendered_for_the_examples() {
    let binary = workspace_operator_binary().unwrap_or_else(|error| panic!("{error}"));
    let examples = tno_testenv_kube::binaries::workspace_root().join("examples");
    let output = tokio::process::Command::new(&binary)
        .arg("render")
        .arg(&examples)
        // The backends' Services and the nodes are not among the manifests: render needs the
        // observed state for them (as the controller reads them from the cluster).
        .arg("--observed")
        .arg(examples.join("observed/headscale-state.json"))
        .args(["--only", "policy"])
        .output()
        .await
        .expect("tailnet-operator render runs");
    assert!(
        output.status.success(),
        "render failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered = String::from_utf8(output.stdout).expect("rendered policy is UTF-8");
    assert!(
        rendered.contains("\"grants\""),
        "no policy rendered: {rendered}"
    );

    let env = env().await;
    let api = env.headscale_api();
    if let Err(error) = api.check_policy(&rendered).await {
        panic!("POST /api/v1/policy/check rejected the rendered policy: {error}\n{rendered}");
    }
    let path = env.dir().join("rendered-examples.hujson");
    std::fs::write(&path, &rendered).expect("write the rendered policy");
    let path_text = path.to_string_lossy().into_owned();
    if let Err(error) = env
        .tailnet()
        .headscale
        .cli(&["policy", "check", "--file", &path_text])
        .await
    {
        panic!("`headscale policy check` rejected the rendered policy: {error}\n{rendered}");
    }

    // The check does check: an unknown top-level key is refused.
    match api.check_policy(r#"{"notAPolicyField": 1}"#).await {
        Err(tno_testenv_tailnet::ApiError::Status { .. }) => {}
        other => panic!("an invalid policy was not rejected: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_have_no_path_to_the_remote_site_outside_the_tailnet() {
    let env = env().await;
    let namespace = env.namespace("no-path").await.expect("namespace");
    let target = tno_testenv_tailnet::SITE_ECHO.to_string();
    let run = namespace
        .tcp_check("direct", &target, 2)
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    let log = run.log("client");
    assert!(!run.succeeded(), "a pod reached {target} directly:\n{run}");
    // Failed for the right reason: tcp-check ran and could not connect.
    assert!(
        log.contains("attempt 2:") && log.contains(&target),
        "the client did not try to connect:\n{run}"
    );
}
