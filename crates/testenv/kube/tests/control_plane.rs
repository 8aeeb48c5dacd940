//! The control plane alone: etcd + kube-apiserver + kube-controller-manager really start,
//! authorize by RBAC and run controllers (Deployment → ReplicaSet → Pod objects, no kubelet).

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::control_plane::ControlPlane;
use tno_testenv_kube::process::poll_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_turn_a_deployment_into_pods_and_rbac_denies_strangers() {
    let binaries = Binaries::discover().expect("deps/versions.env readable");
    let dir = tempfile::tempdir().expect("temp dir");
    let control_plane = ControlPlane::start(
        &binaries,
        dir.path(),
        std::net::Ipv4Addr::LOCALHOST,
        &tno_testenv_kube::network::ClusterNetwork::PRIMARY,
    )
    .await
    .expect("control plane starts");
    let client = control_plane.admin_client().await.expect("admin client");

    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web", "namespace": "default" },
        "spec": {
            "replicas": 2,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "example/web:1" }] },
            },
        },
    }))
    .expect("valid deployment");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("deployment created");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    poll_until(
        "two pods from the ReplicaSet",
        Duration::from_secs(60),
        || async {
            let sets = replica_sets
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let listed = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            (sets.items.len() == 1 && listed.items.len() == 2).then_some(())
        },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}\n{}", control_plane.log_tails(30)));

    // A user without bindings is authenticated but not authorized.
    let stranger_config = control_plane
        .kubeconfig_for("stranger", "stranger", &[])
        .expect("stranger kubeconfig");
    let stranger = tno_testenv_kube::control_plane::client_from_kubeconfig(&stranger_config)
        .await
        .expect("stranger client");
    let denied = Api::<Pod>::namespaced(stranger, "default")
        .list(&ListParams::default())
        .await;
    match denied {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403 for an unbound user, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_apiserver_keeps_its_objects_and_serves_again() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let binaries = Binaries::discover().expect("deps/versions.env readable");
    let dir = tempfile::tempdir().expect("temp dir");
    let control_plane = ControlPlane::start(
        &binaries,
        dir.path(),
        std::net::Ipv4Addr::LOCALHOST,
        &tno_testenv_kube::network::ClusterNetwork::PRIMARY,
    )
    .await
    .expect("control plane starts");
    let client = control_plane.admin_client().await.expect("admin client");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let before: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "before-restart" }, "data": { "k": "v" },
    }))
    .expect("config map");
    config_maps
        .create(&PostParams::default(), &before)
        .await
        .expect("created before the restart");
    let old_pid = control_plane.apiserver_pid();
    let control_plane = std::sync::Mutex::new(control_plane);

    let unavailable =
        tno_testenv_kube::control_plane::restart_apiserver(&control_plane, Duration::from_secs(10))
            .await
            .expect("apiserver restarts");
    eprintln!("apiserver unavailable for {unavailable:?}");
    let control_plane = control_plane.into_inner().expect("lock");
    assert_ne!(
        control_plane.apiserver_pid(),
        old_pid,
        "a new process serves"
    );
    // The old client reconnects; the object written before the restart is still there.
    let kept = poll_until(
        "the ConfigMap after the restart",
        Duration::from_secs(30),
        || async { config_maps.get_opt("before-restart").await.ok().flatten() },
    )
    .await
    .unwrap_or_else(|error| panic!("{error}\n{}", control_plane.log_tails(30)));
    assert_eq!(
        kept.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v")
    );
}
