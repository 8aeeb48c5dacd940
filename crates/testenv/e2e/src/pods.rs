//! Short-lived client pods: run a command in a pod netns of the test kubelet, exactly where an
//! application pod would (cluster DNS, Services through kube-proxy), and collect the outcome.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use tno_testenv_kube::KubeEnv;
use tno_testenv_kube::env::TEST_SERVERS_IMAGE;

use crate::env::{E2eEnv, E2eNamespace};
use crate::error::{E2eError, Result};

/// How long a client pod may take from creation to a terminal phase.
pub const CLIENT_POD_DEADLINE: Duration = Duration::from_secs(120);

/// The outcome of a pod run to completion.
#[derive(Clone, Debug)]
pub struct PodRun {
    pub pod: String,
    /// `Succeeded` or `Failed`.
    pub phase: String,
    /// (container, log) in spec order.
    pub logs: Vec<(String, String)>,
}

impl PodRun {
    pub fn succeeded(&self) -> bool {
        self.phase == "Succeeded"
    }

    /// The log of one container (empty if unknown).
    pub fn log(&self, container: &str) -> &str {
        self.logs
            .iter()
            .find(|(name, _)| name == container)
            .map_or("", |(_, log)| log.as_str())
    }
}

impl fmt::Display for PodRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pod {} {}", self.pod, self.phase)?;
        for (container, log) in &self.logs {
            write!(f, "\n----- {container} -----\n{log}")?;
        }
        Ok(())
    }
}

/// A pod that runs the test-servers client `tcp-check`: connect to `target` (`host:port`,
/// names through cluster DNS), send a line, expect it echoed; `attempts` one second apart.
pub fn tcp_check_pod(name: &str, target: &str, attempts: u32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "e2e-client" } },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client",
                "image": TEST_SERVERS_IMAGE,
                "args": [
                    "tcp-check",
                    "--target", target,
                    "--message", format!("hello-from-{name}"),
                    "--attempts", attempts.to_string(),
                ],
            }],
        },
    })
}

/// A pod running `tno-test-servers tls-check`: connects to `target` (`host:port`, resolved
/// through cluster DNS), completes a TLS handshake with SNI `server_name` verified against
/// `ca_pem` only, and succeeds if the server's text contains `expect`.
pub fn tls_check_pod(
    name: &str,
    target: &str,
    server_name: &str,
    ca_pem: &str,
    expect: &str,
    attempts: u32,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "e2e-client" } },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "client",
                "image": TEST_SERVERS_IMAGE,
                "args": [
                    "tls-check",
                    "--target", target,
                    "--server-name", server_name,
                    "--ca-pem", ca_pem,
                    "--expect", expect,
                    "--attempts", attempts.to_string(),
                ],
            }],
        },
    })
}

impl E2eEnv {
    /// Creates `pod` (a Pod manifest as JSON) in `namespace`, waits until it reaches
    /// `Succeeded` or `Failed` (at most `deadline`) and returns its phase and container logs.
    /// A pod that does not finish is an error carrying what it logged so far.
    pub async fn run_pod(
        &self,
        client: &kube::Client,
        namespace: &str,
        pod: Value,
        deadline: Duration,
    ) -> Result<PodRun> {
        run_pod_in(self.kube(), client, namespace, pod, deadline).await
    }

    /// Runs [`tcp_check_pod`] in `namespace` and returns its outcome (success = the echo came
    /// back), e.g. `target = "remote-db.<ns>.svc.cluster.local:5432"`.
    pub async fn tcp_check(
        &self,
        client: &kube::Client,
        namespace: &str,
        pod_name: &str,
        target: &str,
        attempts: u32,
    ) -> Result<PodRun> {
        tcp_check_in(self.kube(), client, namespace, pod_name, target, attempts).await
    }
}

/// [`E2eEnv::tcp_check`] in the cluster of `kube`.
pub(crate) async fn tcp_check_in(
    kube: &KubeEnv,
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    target: &str,
    attempts: u32,
) -> Result<PodRun> {
    run_pod_in(
        kube,
        client,
        namespace,
        tcp_check_pod(pod_name, target, attempts),
        CLIENT_POD_DEADLINE + Duration::from_secs(u64::from(attempts)),
    )
    .await
}

/// [`E2eEnv::run_pod`] in the cluster of `kube` (whose kubelet holds the container logs).
pub(crate) async fn run_pod_in(
    kube: &KubeEnv,
    client: &kube::Client,
    namespace: &str,
    pod: Value,
    deadline: Duration,
) -> Result<PodRun> {
    let pod: Pod = serde_json::from_value(pod).map_err(|source| E2eError::Json {
        what: "a client pod manifest".into(),
        source,
    })?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.containers.iter().map(|c| c.name.clone()))
        .collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &pod)
        .await
        .map_err(|e| E2eError::kube(format!("creating pod {namespace}/{name}"), e))?;
    let logs = || {
        containers
            .iter()
            .map(|container| {
                let log = kube.container_log(namespace, &name, container);
                (container.clone(), log)
            })
            .collect::<Vec<_>>()
    };
    let started = tokio::time::Instant::now();
    loop {
        let phase = match pods.get_opt(&name).await {
            Ok(pod) => pod.and_then(|pod| pod.status?.phase),
            Err(error) => Some(format!("(read failed: {error})")),
        };
        if let Some(phase) = phase.as_deref()
            && matches!(phase, "Succeeded" | "Failed")
        {
            return Ok(PodRun {
                pod: name.clone(),
                phase: phase.to_owned(),
                logs: logs(),
            });
        }
        if started.elapsed() >= deadline {
            let run = PodRun {
                pod: name.clone(),
                phase: phase.unwrap_or_else(|| "(none)".into()),
                logs: logs(),
            };
            return Err(E2eError::Timeout {
                what: format!("pod {namespace}/{name} to complete"),
                seconds: deadline.as_secs(),
                last: run.to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

impl E2eNamespace<'_> {
    /// [`E2eEnv::run_pod`] in this namespace.
    pub async fn run_pod(&self, pod: Value, deadline: Duration) -> Result<PodRun> {
        self.e2e()
            .run_pod(self.client(), self.name(), pod, deadline)
            .await
    }

    /// [`E2eEnv::tcp_check`] from a pod of this namespace.
    pub async fn tcp_check(&self, pod_name: &str, target: &str, attempts: u32) -> Result<PodRun> {
        self.e2e()
            .tcp_check(self.client(), self.name(), pod_name, target, attempts)
            .await
    }
}
