//! Smoke tests of the Kubernetes side against the real binaries (one shared environment per
//! test binary, see `tno_testenv_kube::shared`).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use tno_testenv_kube::env::TEST_SERVERS_IMAGE;
use tno_testenv_kube::process::poll_until;
use tno_testenv_kube::{KubeEnv, shared};

const DEADLINE: Duration = Duration::from_secs(90);

async fn env() -> std::sync::Arc<KubeEnv> {
    shared()
        .await
        .unwrap_or_else(|error| panic!("environment failed to start: {error}"))
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

/// Waits for the pod to reach a terminal phase and returns it.
async fn wait_for_completion(pods: &Api<Pod>, name: &str) -> String {
    poll_until(&format!("pod {name} to complete"), DEADLINE, || async {
        let pod = pods.get_opt(name).await.ok().flatten()?;
        let phase = pod.status?.phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await
    .unwrap_or_else(|error| panic!("{error}"))
}

/// The pod netns names of the run (`<run>-pod-<uid>`) that have processes in them.
fn pod_netns_with_processes(env: &KubeEnv, uid: &str) -> Option<usize> {
    let name = env.run_id().netns_name(&format!("pod-{uid}"));
    if !tno_netlab::list_netns().ok()?.contains(&name) {
        return None;
    }
    Some(tno_netlab::Netns::adopt(name).pids().ok()?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_from_the_repository_and_cert_manager_are_served() {
    let env = env().await;
    let client = env.client().await.expect("client");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let repository_crds = tno_testenv_kube::crds::read_crds(
        &tno_testenv_kube::crds::yaml_files(
            &tno_testenv_kube::binaries::workspace_root().join("deploy/crds"),
        )
        .expect("deploy/crds readable"),
    )
    .expect("deploy/crds parses");
    let mut expected: Vec<String> = repository_crds
        .iter()
        .filter_map(|crd| crd.metadata.name.clone())
        .collect();
    expected.push("certificates.cert-manager.io".into());
    expected.push("issuers.cert-manager.io".into());
    for name in &expected {
        let crd = crds
            .get_opt(name)
            .await
            .expect("CRD lookup")
            .unwrap_or_else(|| panic!("CRD {name} is not installed"));
        let established = crd
            .status
            .and_then(|status| status.conditions)
            .unwrap_or_default()
            .iter()
            .any(|condition| condition.type_ == "Established" && condition.status == "True");
        assert!(established, "CRD {name} is not Established");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_runs_in_its_netns_is_reachable_by_service_name_and_ip_and_is_collected() {
    let env = env().await;
    let namespace = env.namespace("smoke").await.expect("namespace");
    let ns = namespace.name().to_string();
    let client = namespace.client().clone();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    deployments
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "echo" },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "echo" } },
                    "template": {
                        "metadata": { "labels": { "app": "echo" } },
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "containers": [{
                                "name": "echo",
                                "image": TEST_SERVERS_IMAGE,
                                "args": ["tcp-echo", "--listen", "0.0.0.0:7000"],
                                "ports": [{ "containerPort": 7000, "name": "echo" }],
                                "readinessProbe": { "tcpSocket": { "port": "echo" }, "periodSeconds": 1 },
                            }],
                        },
                    },
                },
            })),
        )
        .await
        .expect("deployment created");
    let service = services
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "echo" },
                "spec": {
                    "selector": { "app": "echo" },
                    "ports": [{ "port": 7000, "targetPort": 7000 }],
                },
            })),
        )
        .await
        .expect("service created");
    let cluster_ip = service
        .spec
        .and_then(|spec| spec.cluster_ip)
        .expect("service got a ClusterIP");

    let server = poll_until("the echo pod to be ready", DEADLINE, || async {
        let listed = pods
            .list(&ListParams::default().labels("app=echo"))
            .await
            .ok()?;
        let pod = listed.items.into_iter().next()?;
        let ready = pod
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True");
        ready.then_some(pod)
    })
    .await
    .unwrap_or_else(|error| panic!("{error}"));
    let server_uid = server.metadata.uid.clone().expect("pod uid");
    let processes = pod_netns_with_processes(&env, &server_uid).expect("the pod has its own netns");
    assert!(processes >= 1, "no process runs in the echo pod's netns");

    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "client" },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "by-dns-name",
                        "image": TEST_SERVERS_IMAGE,
                        "args": ["tcp-check", "--target", format!("echo.{ns}.svc.cluster.local:7000"), "--message", "via-dns"],
                    },
                    {
                        "name": "by-cluster-ip",
                        "image": TEST_SERVERS_IMAGE,
                        "args": ["tcp-check", "--target", format!("{cluster_ip}:7000"), "--message", "via-ip"],
                    },
                ],
            },
        })),
    )
    .await
    .expect("client pod created");
    let phase = wait_for_completion(&pods, "client").await;
    assert_eq!(
        phase,
        "Succeeded",
        "client pod failed:\nby-dns-name:\n{}\nby-cluster-ip:\n{}",
        namespace.container_log("client", "by-dns-name"),
        namespace.container_log("client", "by-cluster-ip"),
    );
    assert!(
        namespace
            .container_log("client", "by-dns-name")
            .contains("ok: echo.")
    );

    // Deleting the Deployment lets the garbage collector remove ReplicaSet and Pod, and the
    // kubelet stop the process and remove the netns.
    deployments
        .delete("echo", &DeleteParams::background())
        .await
        .expect("deployment deleted");
    poll_until(
        "the echo pod and its netns to disappear",
        DEADLINE,
        || async {
            let gone = pods
                .get_opt(server.metadata.name.as_deref()?)
                .await
                .ok()?
                .is_none();
            (gone && pod_netns_with_processes(&env, &server_uid).is_none()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_get_volumes_downward_env_sysctls_and_user_like_in_a_cluster() {
    let env = env().await;
    let namespace = env.namespace("volumes").await.expect("namespace");
    let ns = namespace.name().to_string();
    let client = namespace.client().clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    config_maps
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "settings" },
                "data": { "greeting": "hello" },
            })),
        )
        .await
        .expect("configmap created");
    // Every check prints its name; `set -e` makes the first failing one end the pod.
    let script = r#"set -eu
sa=/var/run/secrets/kubernetes.io/serviceaccount
echo "check: token";      test -s "$sa/token"
echo "check: ca";         grep -q "BEGIN CERTIFICATE" "$sa/ca.crt"
echo "check: namespace";  test "$(cat "$sa/namespace")" = "$MY_NAMESPACE"
echo "check: configmap";  test "$(cat /config/greeting)" = hello
echo "check: pod ip";     grep -q "^$MY_POD_IP" /etc/hosts
echo "check: resolv";     grep -q "nameserver 10.96.0.10" /etc/resolv.conf
echo "check: sysctl";     test "$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)" = 0
echo "check: user";       test "$(id -u)" = 65534
echo "check: ro root";    if touch /rootfs-write 2>/dev/null; then exit 1; fi
echo "check: emptyDir";   touch /scratch/file
echo "check: init ran";   test "$(cat /scratch/init)" = done
echo "check: service env"; test "$KUBERNETES_SERVICE_HOST" = 10.96.0.1
echo "all checks passed""#;
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "inspect" },
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {
                    "sysctls": [{ "name": "net.ipv4.ip_unprivileged_port_start", "value": "0" }],
                },
                "initContainers": [{
                    "name": "init",
                    "image": TEST_SERVERS_IMAGE,
                    "command": ["sh", "-c", "echo done > /scratch/init"],
                    "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }],
                }],
                "containers": [{
                    "name": "inspect",
                    "image": TEST_SERVERS_IMAGE,
                    "command": ["sh", "-c", script],
                    "env": [
                        { "name": "MY_POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "MY_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } },
                    ],
                    "securityContext": { "runAsUser": 65534, "runAsGroup": 65534, "readOnlyRootFilesystem": true },
                    "volumeMounts": [
                        { "name": "config", "mountPath": "/config" },
                        { "name": "scratch", "mountPath": "/scratch" },
                    ],
                }],
                "volumes": [
                    { "name": "config", "configMap": { "name": "settings" } },
                    { "name": "scratch", "emptyDir": {} },
                ],
            },
        })),
    )
    .await
    .expect("pod created");
    let phase = wait_for_completion(&pods, "inspect").await;
    let log = namespace.container_log("inspect", "inspect");
    assert_eq!(phase, "Succeeded", "inspect pod failed; its log:\n{log}");
    assert!(log.contains("all checks passed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_containers_restart_with_backoff_and_probes_gate_readiness() {
    let env = env().await;
    let namespace = env.namespace("restarts").await.expect("namespace");
    let ns = namespace.name().to_string();
    let pods: Api<Pod> = Api::namespaced(namespace.client().clone(), &ns);
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "mixed" },
            "spec": {
                "terminationGracePeriodSeconds": 3,
                "containers": [
                    {
                        "name": "crash",
                        "image": TEST_SERVERS_IMAGE,
                        "command": ["sh", "-c", "echo started; exit 3"],
                    },
                    {
                        "name": "web",
                        "image": TEST_SERVERS_IMAGE,
                        "args": ["http-echo", "--listen", "0.0.0.0:8080"],
                        "readinessProbe": {
                            "httpGet": { "path": "/healthz", "port": 8080 },
                            "periodSeconds": 1,
                        },
                    },
                ],
            },
        })),
    )
    .await
    .expect("pod created");

    let statuses = poll_until(
        "two restarts of the crashing container",
        DEADLINE,
        || async {
            let pod = pods.get_opt("mixed").await.ok().flatten()?;
            let statuses = pod.status?.container_statuses?;
            let crash = statuses.iter().find(|status| status.name == "crash")?;
            (crash.restart_count >= 2).then_some(statuses)
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
    let crash = statuses
        .iter()
        .find(|status| status.name == "crash")
        .expect("crash status");
    let last_exit = crash
        .last_state
        .as_ref()
        .and_then(|state| state.terminated.as_ref())
        .map(|terminated| terminated.exit_code);
    assert_eq!(last_exit, Some(3), "{crash:?}");

    poll_until(
        "the web container to become ready by its httpGet probe",
        DEADLINE,
        || async {
            let pod = pods.get_opt("mixed").await.ok().flatten()?;
            let status = pod.status?;
            let web_ready = status
                .container_statuses?
                .iter()
                .any(|container| container.name == "web" && container.ready);
            let pod_ready = status
                .conditions?
                .iter()
                .any(|condition| condition.type_ == "Ready" && condition.status == "True");
            // The pod stays unready while one of its containers crash-loops.
            (web_ready && !pod_ready).then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
    assert!(
        namespace
            .container_log("mixed", "crash")
            .contains("started")
    );

    let uid = pods
        .get("mixed")
        .await
        .expect("pod")
        .metadata
        .uid
        .expect("uid");
    pods.delete("mixed", &DeleteParams::default())
        .await
        .expect("pod deleted");
    poll_until(
        "the pod object and its netns to be gone",
        DEADLINE,
        || async {
            let gone = pods.get_opt("mixed").await.ok()?.is_none();
            (gone && pod_netns_with_processes(&env, &uid).is_none()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}"));
}

/// Inside the container: the ConfigMap volume has the kubelet's layout (`greeting ->
/// ..data/greeting`, `..data -> ..<UTC time>.<n>`); after the update `greeting` reads the new
/// value through a new `..data` target, the previous directory is gone and the removed key's
/// link with it.
const SWAP_WATCHER: &str = r#"
fail() { echo "$1"; ls -la /config; exit 1; }
[ "$(readlink /config/greeting)" = "..data/greeting" ] || fail "greeting is not a ..data link"
[ -e /config/farewell ] || fail "farewell missing before the update"
first=$(readlink /config/..data)
case "$first" in ..20*) ;; *) fail "..data -> $first" ;; esac
for i in $(seq 1 120); do
  if grep -q two /config/greeting; then
    second=$(readlink /config/..data)
    [ "$second" != "$first" ] || fail "new contents without a new ..data target"
    [ ! -e "/config/$first" ] || fail "the previous directory $first is still there"
    [ ! -e /config/farewell ] && [ ! -L /config/farewell ] || fail "the removed key is still visible"
    echo "swapped $first -> $second"
    exit 0
  fi
  sleep 0.5
done
fail "greeting never became two"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_changes_reach_running_pods_and_coredns_serves_extra_hosts() {
    let env = env().await;
    let namespace = env.namespace("updates").await.expect("namespace");
    let ns = namespace.name().to_string();
    let client = namespace.client().clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    config_maps
        .create(
            &PostParams::default(),
            &object(serde_json::json!({
                "metadata": { "name": "settings" },
                "data": { "greeting": "one", "farewell": "bye" },
            })),
        )
        .await
        .expect("configmap created");
    let wait_for = |condition: &str| {
        format!(
            "for i in $(seq 1 120); do if {condition}; then echo seen; exit 0; fi; sleep 0.5; done; exit 1"
        )
    };
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "watcher" },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "config",
                        "image": TEST_SERVERS_IMAGE,
                        "command": ["sh", "-c", SWAP_WATCHER],
                        "volumeMounts": [{ "name": "config", "mountPath": "/config" }],
                    },
                    {
                        "name": "dns",
                        "image": TEST_SERVERS_IMAGE,
                        "command": ["sh", "-c", wait_for("getent hosts lab-gateway.tno.test | grep -q 10.244.0.1")],
                    },
                ],
                "volumes": [{ "name": "config", "configMap": { "name": "settings" } }],
            },
        })),
    )
    .await
    .expect("pod created");
    poll_until("the watcher pod to run", DEADLINE, || async {
        let phase = pods
            .get_opt("watcher")
            .await
            .ok()
            .flatten()?
            .status?
            .phase?;
        (phase == "Running").then_some(())
    })
    .await
    .unwrap_or_else(|error| panic!("{error}"));

    let merge = kube::api::PatchParams::default();
    config_maps
        .patch(
            "settings",
            &merge,
            &kube::api::Patch::Merge(
                serde_json::json!({ "data": { "greeting": "two", "farewell": null } }),
            ),
        )
        .await
        .expect("configmap updated");
    let system_config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-system");
    system_config_maps
        .patch(
            "coredns",
            &merge,
            &kube::api::Patch::Merge(
                serde_json::json!({ "data": { "hosts": "10.244.0.1 lab-gateway.tno.test\n" } }),
            ),
        )
        .await
        .expect("coredns hosts updated");

    let phase = wait_for_completion(&pods, "watcher").await;
    assert_eq!(
        phase,
        "Succeeded",
        "config:\n{}\ndns:\n{}",
        namespace.container_log("watcher", "config"),
        namespace.container_log("watcher", "dns")
    );
}

/// A ConfigMap projected onto a host directory (what Headscale's extra records use) by the
/// kubelet's volume code: required and missing → nothing written and the sync reports why;
/// created → the kubelet's layout; changed → a new `..data` target; the listed key removed →
/// its link goes (the volume is required, so a missing listed key fails and the directory
/// keeps its contents, as a pod's volume would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_map_projection_follows_its_object() {
    use k8s_openapi::api::core::v1::{ConfigMap, ConfigMapVolumeSource, KeyToPath};
    use tno_testenv_kube::kubelet::ConfigMapProjection;

    let env = env().await;
    let namespace = env.namespace("projection").await.expect("namespace");
    let client = namespace.client().clone();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace.name());
    let dir = tempfile::tempdir().expect("tempdir");
    let source = ConfigMapVolumeSource {
        name: "records".into(),
        items: Some(vec![KeyToPath {
            key: "extra-records.json".into(),
            path: "extra-records.json".into(),
            mode: None,
        }]),
        ..ConfigMapVolumeSource::default()
    };
    let projection = ConfigMapProjection::start(client, namespace.name(), source, dir.path())
        .expect("projection");
    let wait = Duration::from_secs(15);
    // Two sync periods: long enough to see the failing syncs.
    let negative = tno_testenv_kube::kubelet::VOLUME_SYNC * 2 + Duration::from_secs(1);
    let missing = projection
        .wait_synced(negative)
        .await
        .expect_err("no ConfigMap yet");
    assert!(missing.to_string().contains("not found"), "{missing}");
    assert!(std::fs::read_link(dir.path().join("..data")).is_err());

    let apply = |records: serde_json::Value| {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .patch(
                    "records",
                    &kube::api::PatchParams::apply("smoke").force(),
                    &kube::api::Patch::Apply(serde_json::json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "records"}, "data": records,
                    })),
                )
                .await
                .expect("ConfigMap applied");
        }
    };
    let file = dir.path().join("extra-records.json");
    apply(serde_json::json!({"extra-records.json": "[1]", "hosts": "h"})).await;
    projection.wait_synced(wait).await.expect("first sync");
    assert_eq!(
        std::fs::read_link(&file).expect("link"),
        std::path::Path::new("..data/extra-records.json")
    );
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "[1]");
    assert!(!dir.path().join("hosts").exists(), "only the listed key");
    let first = std::fs::read_link(dir.path().join("..data")).expect("..data");

    apply(serde_json::json!({"extra-records.json": "[2]", "hosts": "h"})).await;
    projection.wait_synced(wait).await.expect("second sync");
    let second = std::fs::read_link(dir.path().join("..data")).expect("..data");
    assert_ne!(first, second, "a change is a new data directory");
    assert!(!dir.path().join(&first).exists(), "the old one is removed");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "[2]");

    // The listed key removed from a required volume: the sync fails, the contents stay.
    apply(serde_json::json!({"hosts": "h"})).await;
    let gone = projection
        .wait_synced(negative)
        .await
        .expect_err("key missing");
    assert!(
        gone.to_string()
            .contains("key extra-records.json is not in the referenced object"),
        "{gone}"
    );
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "[2]");
    assert_eq!(
        std::fs::read_link(dir.path().join("..data")).expect("..data"),
        second
    );
}
