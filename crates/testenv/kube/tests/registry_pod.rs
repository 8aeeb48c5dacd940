//! The test kubelet runs images from the lab's OCI registry for real: an image built with
//! `tno-oci` (the static, Go-built `crane` binary on an empty base with passwd/group, user
//! 65532, entrypoint and cmd in the config) is pushed to `crane registry serve` on loopback,
//! and a pod with it is pulled by digest, unpacked, and run from the image's own root file
//! system (read-only), as the image's user, with its entrypoint.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use tno_oci::Platform;
use tno_oci::image::{PlatformImage, RunConfig};
use tno_oci::layer::LayerSpec;
use tno_testenv_kube::binaries::workspace_root;
use tno_testenv_kube::env::{KubeEnv, TestNamespace};
use tno_testenv_kube::oci_registry::LabRegistry;
use tno_testenv_kube::process::poll_until;
use tno_testenv_kube::shared;

const DEADLINE: Duration = Duration::from_secs(90);

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("test object matches its type")
}

/// Pushes a one-binary image of `crane` and returns its reference by digest.
async fn push_crane_image(registry: &LabRegistry, crane: &std::path::Path) -> String {
    let root = workspace_root();
    let mut base = LayerSpec::new();
    base.host_file("etc/passwd", 0o644, &root.join("images/rootfs/etc/passwd"))
        .expect("passwd");
    base.host_file("etc/group", 0o644, &root.join("images/rootfs/etc/group"))
        .expect("group");
    base.dir("tmp", 0o1777, 0, 0).expect("tmp");
    let mut binary = LayerSpec::new();
    binary
        .host_file("usr/local/bin/crane", 0o755, crane)
        .expect("crane binary");
    let platform = Platform::host().expect("amd64 or arm64 host");
    let image = PlatformImage::build(
        platform,
        vec![
            (base.build(0).expect("base layer"), "base".into()),
            (binary.build(0).expect("binary layer"), "crane".into()),
        ],
        &RunConfig {
            entrypoint: vec!["/usr/local/bin/crane".into()],
            cmd: vec![
                "registry".into(),
                "serve".into(),
                "--address".into(),
                ":7000".into(),
            ],
            env: vec!["PATH=/usr/local/bin".into()],
            user: "65532:65532".into(),
            working_dir: "/tmp".into(),
            labels: BTreeMap::new(),
        },
        "1970-01-01T00:00:00Z",
        &BTreeMap::new(),
    )
    .expect("image");
    let index =
        tno_oci::image::index(std::slice::from_ref(&image), &BTreeMap::new()).expect("index");
    let dir = tempfile::tempdir().expect("tempdir");
    tno_oci::layout::write(dir.path(), &index, std::slice::from_ref(&image), "test")
        .expect("layout");
    let layout = tno_oci::layout::Layout::read(dir.path()).expect("layout reads back");
    tno_oci::registry::Client::new()
        .push_layout(&layout, registry.host(), "lab/crane", None)
        .await
        .unwrap_or_else(|e| panic!("push: {e}\n{}", registry.log_tail(20)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_run_images_pulled_from_the_lab_registry_with_their_own_root_user_and_entrypoint() {
    let env = shared()
        .await
        .unwrap_or_else(|e| panic!("environment: {e}"));
    let crane = env.binaries().crane.clone();
    let registry_dir = tempfile::tempdir().expect("tempdir");
    let registry = LabRegistry::start(&crane, registry_dir.path())
        .await
        .expect("registry starts");
    let reference = push_crane_image(&registry, &crane).await;
    let digest = reference
        .rsplit_once('@')
        .map(|(_, digest)| digest.to_string())
        .expect("reference by digest");

    let namespace = env.namespace("registry").await.expect("namespace");
    let ns = namespace.name().to_string();
    let pods: Api<Pod> = Api::namespaced(namespace.client().clone(), &ns);
    // No runAsUser: runAsNonRoot is satisfied only by the image's USER 65532.
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "served" },
            "spec": {
                "containers": [{
                    "name": "registry",
                    "image": reference,
                    "securityContext": { "runAsNonRoot": true, "readOnlyRootFilesystem": true },
                    "readinessProbe": { "tcpSocket": { "port": 7000 }, "periodSeconds": 1 },
                }],
            },
        })),
    )
    .await
    .expect("pod created");
    let pod = poll_until(
        "the pod from the registry to be ready",
        DEADLINE,
        || async {
            let pod = pods.get_opt("served").await.ok().flatten()?;
            let ready = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(pod)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", namespace.container_log("served", "registry")));
    let status = pod.status.expect("status");
    let container = &status.container_statuses.expect("container statuses")[0];
    assert_eq!(
        container.image_id,
        format!("{}/lab/crane@{digest}", registry.host()),
        "imageID names the pulled digest"
    );
    let uid = pod.metadata.uid.expect("uid");
    image_process_is_contained(&env, &uid);
    args_replace_the_cmd(&pods, &namespace, &reference).await;
    host_programs_are_not_found(&pods, &reference).await;
}

/// The container's process: its root is the image (no host /bin, /lib), read-only, and it
/// runs as the image's user.
fn image_process_is_contained(env: &KubeEnv, uid: &str) {
    let netns = tno_netlab::Netns::adopt(env.run_id().netns_name(&format!("pod-{uid}")));
    let pids = netns.pids().expect("pids of the pod netns");
    let pid = pids
        .iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.starts_with(b"/usr/local/bin/crane\0registry"))
        })
        .expect("the image's entrypoint + cmd runs in the pod");
    let root = format!("/proc/{pid}/root");
    assert!(std::path::Path::new(&format!("{root}/usr/local/bin/crane")).is_file());
    for host_only in ["bin", "lib", "usr/bin", "root"] {
        assert!(
            !std::path::Path::new(&format!("{root}/{host_only}")).exists(),
            "/{host_only} of the host is visible in the container"
        );
    }
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        proc_status
            .lines()
            .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("65532")),
        "{proc_status}"
    );
    // Seen from the host, the cwd is the container root's /tmp (the image's WorkingDir).
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd");
    let container_root = std::fs::read_link(&root).expect("root");
    assert_eq!(cwd, container_root.join("tmp"), "the image's WorkingDir");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let root_mount = mountinfo
        .lines()
        .rfind(|line| line.split_whitespace().nth(4) == Some("/"))
        .expect("a root mount");
    let options = root_mount.split_whitespace().nth(5).unwrap_or_default();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "root not read-only: {root_mount}"
    );
}

/// `args` replace the image's cmd, the entrypoint stays.
async fn args_replace_the_cmd(pods: &Api<Pod>, namespace: &TestNamespace<'_>, reference: &str) {
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "version" },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "crane", "image": reference, "args": ["version"] }],
            },
        })),
    )
    .await
    .expect("pod created");
    let phase = poll_until("the version pod to complete", DEADLINE, || async {
        let phase = pods
            .get_opt("version")
            .await
            .ok()
            .flatten()?
            .status?
            .phase?;
        matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let log = namespace.container_log("version", "crane");
    assert_eq!(phase, "Succeeded", "{log}");
    let want = std::fs::read_to_string(workspace_root().join("deps/versions.env"))
        .expect("versions")
        .lines()
        .find_map(|line| line.strip_prefix("CRANE_VERSION=").map(str::to_string))
        .expect("CRANE_VERSION");
    assert!(
        log.contains(&want),
        "crane version printed {log:?}, expected {want}"
    );
}

/// A program that only the host has is not found (the host's file system is not the
/// container's).
async fn host_programs_are_not_found(pods: &Api<Pod>, reference: &str) {
    pods.create(
        &PostParams::default(),
        &object(serde_json::json!({
            "metadata": { "name": "shell" },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{ "name": "sh", "image": reference, "command": ["sh", "-c", "true"] }],
            },
        })),
    )
    .await
    .expect("pod created");
    let message = poll_until("the shell pod to report its error", DEADLINE, || async {
        let status = pods.get_opt("shell").await.ok().flatten()?.status?;
        let state = status.container_statuses?.first()?.state.clone()?;
        let waiting = state.waiting?;
        waiting
            .message
            .filter(|message| message.contains("not found"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        message.contains("sh not found on the PATH of image"),
        "{message}"
    );
}
