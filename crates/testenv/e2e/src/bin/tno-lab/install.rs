//! The product installed the way users install it: the images (`cargo xtask images`, OCI
//! layouts: operator, agent, the agents' tailscaled) pushed by digest to the lab registry, the chart pushed
//! there as an OCI artifact, then `helm install` from the registry with a values file; the
//! operator runs as a pod from its image, its agents from theirs. `--dev` keeps the operator as
//! a local process instead ([`DemoOperator::Process`]).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use tno_testenv::E2eEnv;
use tno_testenv::product::{Helm, ProductImages, push_product_images};
use tno_testenv_kube::oci_registry::LabRegistry;

use crate::OPERATOR_NAMESPACE;

/// The Helm release (and so the operator's Deployment) name.
pub const RELEASE: &str = "tailnet-operator";

/// The demo's operator: the chart's pod, or (`--dev`) the workspace binary as a process.
pub enum DemoOperator {
    Process(tno_testenv::OperatorProcess),
    Pod(Installed),
}

impl DemoOperator {
    /// The value of the first sample line of `/metrics` starting with `prefix`.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let text = match self {
            DemoOperator::Process(operator) => operator.metrics().await.ok()?,
            DemoOperator::Pod(installed) => installed.metrics().await.ok()?,
        };
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
    }

    /// Where its log is: a file (`--dev`) or `kubectl logs`.
    pub fn describe(&self) -> String {
        match self {
            DemoOperator::Process(operator) => format!(
                "operator running in the lab as a process (--dev; log {}, metrics {})",
                operator.log_path().display(),
                operator.metrics_url()
            ),
            DemoOperator::Pod(installed) => format!(
                "operator running as pod {OPERATOR_NAMESPACE}/{} from image {}@{} (kubectl -n {OPERATOR_NAMESPACE} logs deploy/{RELEASE})",
                installed.pod,
                installed.images.operator.repository,
                installed.images.operator.digest
            ),
        }
    }

    pub async fn stop(self) {
        if let DemoOperator::Process(mut operator) = self {
            let _ = operator.terminate().await;
        }
    }
}

/// A release installed from the lab registry; the registry stays up while it lives (the
/// kubelet pulls from it when pods restart).
pub struct Installed {
    pub pod: String,
    pub images: ProductImages,
    /// `kubectl port-forward` to the operator pod's admin port: listens in the root netns,
    /// connects from the lab (the node), where pod addresses are routed.
    admin: tno_netlab::TcpForwarder,
    _registry: LabRegistry,
}

impl Installed {
    /// The operator pod's `/metrics`.
    async fn metrics(&self) -> Result<String, String> {
        let url = format!("http://{}/metrics", self.admin.local_addr());
        reqwest::get(&url)
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("{url}: {e}"))?
            .text()
            .await
            .map_err(|e| format!("{url}: {e}"))
    }
}

/// Pushes the images of `images_dir` and the chart to a new lab registry, writes the values
/// file and runs `helm install` from the registry; waits for the operator pod. Prints each
/// helm command with its output.
pub async fn install_chart(
    env: &E2eEnv,
    client: &kube::Client,
    images_dir: &Path,
    phases: &mut crate::Phases,
) -> Result<Installed, String> {
    let registry_dir = env.dir().join("registry");
    let registry = LabRegistry::start(&env.kube().binaries().crane, &registry_dir)
        .await
        .map_err(|e| e.to_string())?;
    let images = push_product_images(&registry, images_dir)
        .await
        .map_err(|e| e.to_string())?;
    for image in [&images.operator, &images.agent, &images.tailscale] {
        println!("install: pushed {}@{}", image.repository, image.digest);
    }
    let mut helm =
        Helm::new(env.kubeconfig(), &env.dir().join("helm-home")).map_err(|e| e.to_string())?;
    let chart = helm
        .publish_chart(&env.dir().join("chart"), &registry)
        .map_err(|e| format!("{e}\n{}", helm.transcript.join("\n")))?;
    for entry in &helm.transcript {
        println!("install: {}", entry.trim_end());
    }
    phases.done("images and chart pushed to the lab registry");
    let values = env.dir().join("lab-values.yaml");
    std::fs::write(&values, values_file(&images)?)
        .map_err(|e| format!("{}: {e}", values.display()))?;
    let version = tno_testenv::product::chart_version().map_err(|e| e.to_string())?;
    let values_arg = values.display().to_string();
    let install = [
        "install",
        RELEASE,
        chart.as_str(),
        "--version",
        version.as_str(),
        "--plain-http",
        "--namespace",
        OPERATOR_NAMESPACE,
        "--wait",
        "--timeout",
        "4m",
        // The lab installed the CRDs from deploy/crds when it started; the release adopts
        // them, as it would adopt CRDs applied by hand before a first install.
        "--take-ownership",
        "-f",
        values_arg.as_str(),
    ];
    let installed = helm.run(&install);
    println!("install: {}", helm.last_entry().trim_end());
    installed.map_err(|e| e.to_string())?;
    let (pod, admin) = ready_operator_pod(client).await?;
    let admin = tno_netlab::TcpForwarder::start(
        None,
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        Some(env.lab().netns()),
        admin,
    )
    .map_err(|e| format!("forwarding to the operator pod's admin port {admin}: {e}"))?;
    phases.done("helm install (operator pod Ready)");
    crate::print_kubectl(
        env,
        &["get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "wide"],
    );
    Ok(Installed {
        pod,
        images,
        admin,
        _registry: registry,
    })
}

/// The values the lab installs with: the pushed images by digest, the cluster's own address
/// ranges (agents' transport and DNS stay out of them), a short Headscale poll interval (the
/// demo waits on Headscale; the chart's default is 30s) and text logs.
fn values_file(images: &ProductImages) -> Result<String, String> {
    let tag = tno_testenv::product::tailscale_version().map_err(|e| e.to_string())?;
    let cidrs = tno_testenv::lab_cluster_cidrs().join(", ");
    Ok(format!(
        "# tno-lab: the images pushed to the lab registry, by digest\n\
         image:\n  repository: {}\n  digest: {}\n\
         agent:\n  image:\n    repository: {}\n    digest: {}\n  \
         tailscaleImage:\n    repository: {}\n    tag: {tag}\n    digest: {}\n\
         operator:\n  headscalePollInterval: 2s\n  logFormat: text\n  clusterCIDRs: [{cidrs}]\n",
        images.operator.repository,
        images.operator.digest,
        images.agent.repository,
        images.agent.digest,
        images.tailscale.repository,
        images.tailscale.digest,
    ))
}

/// The release's Ready operator pod and the address of its admin port.
async fn ready_operator_pod(
    client: &kube::Client,
) -> Result<(String, std::net::SocketAddr), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let selector =
        format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=tailnet-operator");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?;
        let ready = list.items.into_iter().find(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        if let Some(pod) = ready {
            let port = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.containers.first())
                .and_then(|c| c.ports.as_ref())
                .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some("admin")))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or("the operator container has no port named admin")?;
            let ip: std::net::IpAddr = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|ip| ip.parse().ok())
                .ok_or("the operator pod has no IP")?;
            return Ok((
                pod.metadata.name.unwrap_or_default(),
                std::net::SocketAddr::new(ip, port),
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("no Ready operator pod ({selector}) after 120 s"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
