//! The test kubelet: registers a Node, keeps its Lease, binds unscheduled Pods to itself (there
//! is no kube-scheduler) and runs each Pod's containers as local processes in a per-pod netns
//! of the lab (see [`container`] for the mount namespace).

mod container;
mod downward;
mod environment;
pub mod images;
mod pod;
mod probes;
pub mod registry;
mod volumes;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tno_netlab::Lab;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{KubeContext, Result};
pub use images::{ImageMatcher, ImageTable, LocalImage};
pub use volumes::{ConfigMapProjection, VOLUME_SYNC};

const FIELD_MANAGER: &str = "tno-kubelet";
const LEASE_DURATION_SECONDS: i32 = 40;
const HEARTBEAT: Duration = Duration::from_secs(10);

/// What the kubelet needs to know about its node and cluster.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    pub node_name: String,
    /// The node's InternalIP: the lab gateway.
    pub node_ip: Ipv4Addr,
    pub pod_cidr: String,
    /// Pod directories and container logs live here.
    pub dir: PathBuf,
    pub images: ImageTable,
    /// The cluster DNS Service IP written into pods' resolv.conf.
    pub cluster_dns: Ipv4Addr,
    pub cluster_domain: String,
    /// ClusterIP and port of the `kubernetes` Service (`KUBERNETES_SERVICE_HOST/PORT`).
    pub kubernetes_service: (Ipv4Addr, u16),
}

/// Shared by the kubelet's loops and pod workers.
pub(crate) struct NodeContext {
    /// Authenticated as `system:node:<name>`, so the Node authorizer and NodeRestriction apply.
    pub client: kube::Client,
    pub lab: Arc<Lab>,
    pub config: KubeletConfig,
    /// Conditions never change while the kubelet runs: they all date from registration.
    pub registered_at: Timestamp,
    /// Images pulled from the lab registry (unpacked under `<dir>/images/`).
    pub image_store: registry::ImageStore,
}

impl NodeContext {
    fn pod_logs_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.config
            .dir
            .join("logs")
            .join(format!("{namespace}_{name}"))
    }
}

type Workers = Arc<Mutex<HashMap<String, watch::Sender<Option<Pod>>>>>;

/// A running test kubelet. Dropping it stops its loops; pod processes die with their netns
/// when the lab is dropped.
pub struct Kubelet {
    context: Arc<NodeContext>,
    workers: Workers,
    tasks: Vec<JoinHandle<()>>,
}

impl Kubelet {
    /// Registers the node and starts the lease, binder and pod loops.
    ///
    /// `scheduler_client` binds pods (as `system:kube-scheduler`); `node_client` does the rest.
    pub async fn start(
        node_client: kube::Client,
        scheduler_client: kube::Client,
        lab: Arc<Lab>,
        config: KubeletConfig,
    ) -> Result<Self> {
        std::fs::create_dir_all(config.dir.join("pods")).map_err(|source| crate::Error::Io {
            context: format!("creating {:?}", config.dir),
            source,
        })?;
        let image_store = registry::ImageStore::new(config.dir.join("images"));
        let context = Arc::new(NodeContext {
            client: node_client,
            lab,
            config,
            registered_at: Timestamp::now(),
            image_store,
        });
        register_node(&context).await?;
        let workers: Workers = Arc::default();
        let tasks = vec![
            tokio::spawn(heartbeat_loop(context.clone())),
            tokio::spawn(bind_loop(
                scheduler_client,
                context.config.node_name.clone(),
            )),
            tokio::spawn(pod_loop(context.clone(), workers.clone())),
        ];
        Ok(Self {
            context,
            workers,
            tasks,
        })
    }

    pub fn node_name(&self) -> &str {
        &self.context.config.node_name
    }

    /// The log file of a container (kept after the pod is gone; restarts append).
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        self.context
            .pod_logs_dir(namespace, pod)
            .join(format!("{container}.log"))
    }

    /// The directory holding all container logs.
    pub fn logs_dir(&self) -> PathBuf {
        self.context.config.dir.join("logs")
    }

    /// Number of pods this kubelet currently runs.
    pub fn running_pods(&self) -> usize {
        self.workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn register_node(context: &NodeContext) -> Result<()> {
    let config = &context.config;
    let nodes: Api<Node> = Api::all(context.client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": config.node_name,
            "labels": {
                "kubernetes.io/hostname": config.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
            },
        },
        "spec": { "podCIDR": config.pod_cidr, "podCIDRs": [config.pod_cidr] },
    }))
    .map_err(|source| crate::Error::Json {
        context: "node object".into(),
        source,
    })?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => {
            return Err(crate::Error::Kube {
                context: format!("registering node {}", config.node_name),
                source: error,
            });
        }
    }
    update_node_status(context).await
}

async fn update_node_status(context: &NodeContext) -> Result<()> {
    let config = &context.config;
    let now = Time(Timestamp::now());
    let since = Time(context.registered_at);
    let condition = |kind: &str, status: &str, reason: &str| {
        serde_json::json!({
            "type": kind, "status": status, "reason": reason,
            "lastHeartbeatTime": now, "lastTransitionTime": since,
        })
    };
    let resources = serde_json::json!({"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "50Gi"});
    let status = serde_json::json!({ "status": {
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": config.node_ip.to_string()},
            {"type": "Hostname", "address": config.node_name},
        ],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": "tno", "systemUUID": "tno", "bootID": "tno",
            "kernelVersion": "", "osImage": "tno test kubelet",
            "containerRuntimeVersion": "tno://processes", "kubeletVersion": "v1.36.0-tno",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
        },
    }});
    let nodes: Api<Node> = Api::all(context.client.clone());
    // The node lifecycle controller reads lastHeartbeatTime (with the Lease) as liveness.
    nodes
        .patch_status(
            &config.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .kube_context(|| format!("reporting the status of node {}", config.node_name))?;
    Ok(())
}

async fn renew_lease(context: &NodeContext) -> Result<()> {
    let name = &context.config.node_name;
    let leases: Api<Lease> = Api::namespaced(context.client.clone(), "kube-node-lease");
    let lease = serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": name, "namespace": "kube-node-lease" },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now()),
        },
    });
    leases
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&lease),
        )
        .await
        .kube_context(|| format!("renewing the lease of node {name}"))?;
    Ok(())
}

async fn heartbeat_loop(context: Arc<NodeContext>) {
    loop {
        if let Err(error) = renew_lease(&context).await {
            tracing::warn!(%error, "lease renewal failed");
        }
        if let Err(error) = update_node_status(&context).await {
            tracing::warn!(%error, "node status update failed");
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// The scheduler's job, reduced to one node: every pending pod goes here.
async fn bind_loop(scheduler_client: kube::Client, node_name: String) {
    let pods: Api<Pod> = Api::all(scheduler_client.clone());
    let config = watcher::Config::default().fields("spec.nodeName=");
    let mut events = watcher(pods, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(error) => {
                tracing::debug!(%error, "binder watch error");
                continue;
            }
        };
        let spec = pod.spec.as_ref();
        let ours = spec
            .and_then(|spec| spec.scheduler_name.as_deref())
            .is_none_or(|scheduler| scheduler == "default-scheduler");
        if !ours || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
            continue;
        };
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": name, "namespace": namespace, "uid": pod.metadata.uid },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node_name },
        });
        let api: Api<Pod> = Api::namespaced(scheduler_client.clone(), namespace);
        let bound: std::result::Result<serde_json::Value, _> = api
            .create_subresource("binding", name, &PostParams::default(), &binding)
            .await;
        if let Err(error) = bound {
            // Already bound (a replayed event) or deleted meanwhile.
            tracing::debug!(pod = %format!("{namespace}/{name}"), %error, "binding failed");
        }
    }
}

/// Dispatches the node's pods to one worker task each.
async fn pod_loop(context: Arc<NodeContext>, workers: Workers) {
    let pods: Api<Pod> = Api::all(context.client.clone());
    let config =
        watcher::Config::default().fields(&format!("spec.nodeName={}", context.config.node_name));
    let mut events = watcher(pods, config).default_backoff().boxed();
    let mut listed = HashSet::new();
    let mut finished: Arc<Mutex<HashSet<String>>> = Arc::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    listed.insert(uid.clone());
                }
                dispatch(&context, &workers, &mut finished, pod);
            }
            Ok(watcher::Event::Apply(pod)) => dispatch(&context, &workers, &mut finished, pod),
            Ok(watcher::Event::InitDone) => {
                // Pods that vanished while the watch was down.
                let locked = workers.lock().unwrap_or_else(PoisonError::into_inner);
                for (uid, sender) in locked.iter() {
                    if !listed.contains(uid) {
                        let _ = sender.send(None);
                    }
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    let locked = workers.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(sender) = locked.get(uid) {
                        let _ = sender.send(None);
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "pod watch error"),
        }
    }
}

fn dispatch(
    context: &Arc<NodeContext>,
    workers: &Workers,
    finished: &mut Arc<Mutex<HashSet<String>>>,
    pod: Pod,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    let mut locked = workers.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(sender) = locked.get(&uid) {
        let _ = sender.send(Some(pod));
        return;
    }
    if finished
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(&uid)
    {
        return;
    }
    let (sender, receiver) = watch::channel(Some(pod.clone()));
    locked.insert(uid.clone(), sender);
    let context = context.clone();
    let workers = workers.clone();
    let finished = finished.clone();
    tokio::spawn(async move {
        pod::run_pod(context, pod, receiver).await;
        finished
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.clone());
        workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&uid);
    });
}
