//! One pod's life on the test node: sandbox (netns, sysctls, resolv.conf, volumes), containers
//! with restarts and readiness, status reports, and graceful deletion.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodStatus, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tno_netlab::PodNet;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, IoContext, NetlabContext, Result, error_chain};
use crate::kubelet::NodeContext;
use crate::kubelet::container::{BindMount, ContainerLaunch, spawn_container};
use crate::kubelet::environment::{EnvironmentContext, container_environment, expand};
use crate::kubelet::images::LocalImage;
use crate::kubelet::probes::{ProbeState, run_probe};
use crate::kubelet::registry::{ImageStore, PulledImage};
use crate::kubelet::volumes::{VOLUME_SYNC, VolumeContext, prepare_volumes};
use crate::process::ManagedProcess;

const TICK: Duration = Duration::from_millis(250);
/// Restart backoff: shorter than the kubelet's 10 s…5 min so tests see restarts quickly.
const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A container that ran this long without exiting starts over with the initial backoff.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

/// What the pod dispatcher tells a worker: the latest object, or `None` once it is gone.
pub type PodUpdates = watch::Receiver<Option<Pod>>;

struct ContainerRuntime {
    spec: Container,
    process: Option<ManagedProcess>,
    restart_count: i32,
    started_at: Option<Timestamp>,
    started_instant: Option<Instant>,
    waiting: Option<(String, String)>,
    last_termination: Option<ContainerStateTerminated>,
    /// Terminated for good (restart policy says no).
    finished: Option<ContainerStateTerminated>,
    next_start: Option<Instant>,
    backoff: Duration,
    ready: bool,
    probe: ProbeState,
}

impl ContainerRuntime {
    fn new(spec: Container) -> Self {
        Self {
            spec,
            process: None,
            restart_count: 0,
            started_at: None,
            started_instant: None,
            waiting: Some(("ContainerCreating".into(), String::new())),
            last_termination: None,
            finished: None,
            next_start: Some(Instant::now()),
            backoff: INITIAL_BACKOFF,
            ready: false,
            probe: ProbeState::default(),
        }
    }
}

struct PodWorker {
    node: Arc<NodeContext>,
    pod: Pod,
    name: String,
    namespace: String,
    uid: String,
    dir: PathBuf,
    logs_dir: PathBuf,
    net: Option<PodNet>,
    volumes: HashMap<String, PathBuf>,
    containers: Vec<ContainerRuntime>,
    conditions: HashMap<&'static str, (bool, Timestamp)>,
    start_time: Timestamp,
    last_reported: Option<serde_json::Value>,
    phase_override: Option<&'static str>,
}

/// Where a container's programs come from.
enum ImageSource {
    /// Host binaries of the image table.
    Local(LocalImage),
    /// An image pulled from the lab registry: its own root file system and config.
    Pulled(Arc<PulledImage>),
}

#[derive(Clone, Copy)]
enum ProbeKind {
    Startup,
    Readiness,
}

/// The probe of `container` due at `now`, if any (a container without a readiness probe is
/// ready once started).
fn probe_due(container: &mut ContainerRuntime, now: Instant) -> Option<(ProbeKind, Probe)> {
    let started_instant = container.started_instant.unwrap_or(now);
    if !container.probe.started {
        match container.spec.startup_probe.clone() {
            Some(probe) => {
                let next_at = *container.probe.startup_next_at.get_or_insert_with(|| {
                    let delay = probe.initial_delay_seconds.unwrap_or(0).max(0) as u64;
                    started_instant + Duration::from_secs(delay)
                });
                return (next_at <= now).then_some((ProbeKind::Startup, probe));
            }
            None => container.probe.started = true,
        }
    }
    let Some(probe) = container.spec.readiness_probe.clone() else {
        container.ready = true;
        return None;
    };
    let next_at = *container.probe.next_at.get_or_insert_with(|| {
        let delay = probe.initial_delay_seconds.unwrap_or(0).max(0) as u64;
        started_instant + Duration::from_secs(delay)
    });
    (next_at <= now).then_some((ProbeKind::Readiness, probe))
}

fn record_readiness(
    container: &mut ContainerRuntime,
    probe: &Probe,
    success: bool,
    period: Duration,
) {
    container.probe.next_at = Some(Instant::now() + period);
    if success {
        container.probe.successes += 1;
        container.probe.failures = 0;
        if container.probe.successes >= probe.success_threshold.unwrap_or(1) {
            container.ready = true;
        }
    } else {
        container.probe.failures += 1;
        container.probe.successes = 0;
        if container.probe.failures >= probe.failure_threshold.unwrap_or(3) {
            container.ready = false;
        }
    }
}

/// Runs the pod until it is deleted; returns once the object is finalized.
pub async fn run_pod(node: Arc<NodeContext>, pod: Pod, mut updates: PodUpdates) {
    let mut worker = PodWorker::new(node, pod);
    let full_name = format!("{}/{}", worker.namespace, worker.name);
    if let Err(error) = worker.live(&mut updates).await {
        tracing::warn!(pod = %full_name, error = %error_chain(&error), "pod failed");
        worker.record_pod_error(&error).await;
        // Keep the sandbox until deletion so the failure stays inspectable.
        while !worker.deletion_requested(&mut updates).await {}
    }
    worker.terminate().await;
    worker.finalize(&updates).await;
}

impl PodWorker {
    fn new(node: Arc<NodeContext>, pod: Pod) -> Self {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = node.config.dir.join("pods").join(&uid);
        let logs_dir = node.pod_logs_dir(&namespace, &name);
        let containers = pod
            .spec
            .as_ref()
            .map(|spec| spec.containers.clone())
            .unwrap_or_default()
            .into_iter()
            .map(ContainerRuntime::new)
            .collect();
        Self {
            node,
            pod,
            name,
            namespace,
            uid,
            dir,
            logs_dir,
            net: None,
            volumes: HashMap::new(),
            containers,
            conditions: HashMap::new(),
            start_time: Timestamp::now(),
            last_reported: None,
            phase_override: None,
        }
    }

    fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn pod_error(&self, reason: impl Into<String>) -> Error {
        Error::Pod {
            pod: self.full_name(),
            reason: reason.into(),
        }
    }

    /// Takes the newest object; `true` once the pod is being deleted or gone.
    async fn deletion_requested(&mut self, updates: &mut PodUpdates) -> bool {
        if updates.changed().await.is_err() {
            return true;
        }
        let latest = updates.borrow_and_update().clone();
        match latest {
            Some(pod) => {
                let deleting = pod.metadata.deletion_timestamp.is_some();
                self.pod = pod;
                deleting
            }
            None => true,
        }
    }

    fn is_deleting(&self, updates: &PodUpdates) -> bool {
        match &*updates.borrow() {
            Some(pod) => pod.metadata.deletion_timestamp.is_some(),
            None => true,
        }
    }

    async fn live(&mut self, updates: &mut PodUpdates) -> Result<()> {
        if self.is_deleting(updates) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir).io_context(|| format!("creating {:?}", self.dir))?;
        std::fs::create_dir_all(&self.logs_dir)
            .io_context(|| format!("creating {:?}", self.logs_dir))?;
        self.create_sandbox().await?;
        self.set_condition("PodReadyToStartContainers", true);
        self.set_condition("PodScheduled", true);
        self.report().await;

        // Volumes may reference objects that are created a moment later: retry like the kubelet.
        loop {
            match self.prepare_volumes().await {
                Ok(()) => break,
                Err(error) => {
                    for container in &mut self.containers {
                        container.waiting = Some(("ContainerCreating".into(), error_chain(&error)));
                    }
                    self.report().await;
                }
            }
            tokio::select! {
                deleting = self.deletion_requested(updates) => if deleting { return Ok(()) },
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        if !self.run_init_containers(updates).await? {
            return Ok(());
        }
        self.set_condition("Initialized", true);

        let mut ticker = tokio::time::interval(TICK);
        let mut last_volume_sync = Instant::now();
        loop {
            tokio::select! {
                deleting = self.deletion_requested(updates) => if deleting { return Ok(()) },
                _ = ticker.tick() => {}
            }
            if last_volume_sync.elapsed() >= VOLUME_SYNC {
                last_volume_sync = Instant::now();
                // A vanished object keeps the last contents, as in Kubernetes.
                if let Err(error) = self.prepare_volumes().await {
                    tracing::debug!(pod = %self.full_name(), error = %error_chain(&error), "volume sync failed");
                }
            }
            self.step_containers().await;
            self.run_due_probes().await;
            self.report().await;
            if self
                .containers
                .iter()
                .all(|container| container.finished.is_some())
            {
                // Completed pod (restartPolicy Never/OnFailure): its sandbox goes away.
                self.remove_sandbox().await;
                while !self.deletion_requested(updates).await {}
                return Ok(());
            }
        }
    }

    async fn create_sandbox(&mut self) -> Result<()> {
        let lab = self.node.lab.clone();
        let uid = self.uid.clone();
        let net = tokio::task::spawn_blocking(move || lab.add_pod_netns(&uid))
            .await
            .map_err(|join| self.pod_error(format!("netns setup panicked: {join}")))?
            .netlab_context(|| format!("creating the netns of pod {}", self.full_name()))?;
        let sysctls = self
            .pod
            .spec
            .as_ref()
            .and_then(|spec| spec.security_context.as_ref())
            .and_then(|context| context.sysctls.clone())
            .unwrap_or_default();
        for sysctl in sysctls {
            let netns = net.netns.clone();
            let full_name = self.full_name();
            tokio::task::spawn_blocking(move || netns.set_sysctl(&sysctl.name, &sysctl.value))
                .await
                .map_err(|join| self.pod_error(format!("sysctl panicked: {join}")))?
                .netlab_context(|| format!("setting a sysctl of pod {full_name}"))?;
        }
        self.write_dns_files(net.ip)?;
        self.net = Some(net);
        Ok(())
    }

    fn write_dns_files(&self, pod_ip: Ipv4Addr) -> Result<()> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let hostname = spec.hostname.clone().unwrap_or_else(|| self.name.clone());
        let hosts = format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{pod_ip}\t{hostname}\n"
        );
        let domain = &self.node.config.cluster_domain;
        let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
        let mut nameservers = Vec::new();
        let mut searches = Vec::new();
        let mut options = Vec::new();
        if policy == "ClusterFirst" || policy == "ClusterFirstWithHostNet" {
            nameservers.push(self.node.config.cluster_dns.to_string());
            searches = vec![
                format!("{}.svc.{domain}", self.namespace),
                format!("svc.{domain}"),
                domain.clone(),
            ];
            options.push("ndots:5".to_string());
        }
        // "Default": the node's resolver; the lab node has none, so nothing resolves upstream.
        if let Some(config) = &spec.dns_config {
            nameservers.extend(config.nameservers.iter().flatten().cloned());
            searches.extend(config.searches.iter().flatten().cloned());
            options.extend(
                config
                    .options
                    .iter()
                    .flatten()
                    .map(|option| match &option.value {
                        Some(value) => {
                            format!("{}:{value}", option.name.clone().unwrap_or_default())
                        }
                        None => option.name.clone().unwrap_or_default(),
                    }),
            );
        }
        let mut resolv = String::new();
        if !searches.is_empty() {
            resolv.push_str(&format!("search {}\n", searches.join(" ")));
        }
        for server in nameservers {
            resolv.push_str(&format!("nameserver {server}\n"));
        }
        if !options.is_empty() {
            resolv.push_str(&format!("options {}\n", options.join(" ")));
        }
        let hosts_path = self.dir.join("etc-hosts");
        std::fs::write(&hosts_path, hosts).io_context(|| format!("writing {hosts_path:?}"))?;
        let resolv_path = self.dir.join("resolv.conf");
        std::fs::write(&resolv_path, resolv).io_context(|| format!("writing {resolv_path:?}"))
    }

    fn pod_ip(&self) -> String {
        self.net
            .as_ref()
            .map(|net| net.ip.to_string())
            .unwrap_or_default()
    }

    async fn prepare_volumes(&mut self) -> Result<()> {
        let pod_ip = self.pod_ip();
        let host_ip = self.node.config.node_ip.to_string();
        let context = VolumeContext {
            client: &self.node.client,
            pod: &self.pod,
            namespace: &self.namespace,
            pod_ip: &pod_ip,
            host_ip: &host_ip,
        };
        self.volumes = prepare_volumes(&context, &self.dir.join("volumes")).await?;
        Ok(())
    }

    /// Runs init containers one after another; `false` if the pod is deleted meanwhile.
    async fn run_init_containers(&mut self, updates: &mut PodUpdates) -> Result<bool> {
        let init_containers = self
            .pod
            .spec
            .as_ref()
            .and_then(|spec| spec.init_containers.clone())
            .unwrap_or_default();
        for spec in init_containers {
            let mut backoff = INITIAL_BACKOFF;
            loop {
                let mut process = self.start_process(&spec).await?;
                // Other updates of the pod object do not disturb the running init container.
                let status = loop {
                    tokio::select! {
                        status = process.wait() => break status,
                        deleting = self.deletion_requested(updates) => if deleting {
                            process.stop(self.grace_period()).await;
                            return Ok(false);
                        },
                    }
                };
                if status.success() {
                    break;
                }
                if self.restart_policy() == "Never" {
                    self.phase_override = Some("Failed");
                    self.report().await;
                    return Err(
                        self.pod_error(format!("init container {} failed ({status})", spec.name))
                    );
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        Ok(true)
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|spec| spec.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn grace_period(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(seconds.max(0) as u64)
    }

    async fn start_process(&self, spec: &Container) -> Result<ManagedProcess> {
        let net = self
            .net
            .as_ref()
            .ok_or_else(|| self.pod_error("no sandbox"))?;
        let image_name = spec.image.clone().unwrap_or_default();
        let source = self.image_source(&image_name).await?;
        let pod_ip = self.pod_ip();
        let host_ip = self.node.config.node_ip.to_string();
        let path = match &source {
            ImageSource::Local(image) => image.path_env(),
            ImageSource::Pulled(image) => image.path_env(),
        };
        let image_env = match &source {
            ImageSource::Local(image) => image.env.clone(),
            ImageSource::Pulled(image) => image.env.clone(),
        };
        let kubernetes_host = self.node.config.kubernetes_service.0.to_string();
        let env_context = EnvironmentContext {
            client: &self.node.client,
            pod: &self.pod,
            namespace: &self.namespace,
            pod_ip: &pod_ip,
            host_ip: &host_ip,
            path: &path,
            kubernetes_service: (&kubernetes_host, self.node.config.kubernetes_service.1),
            image_env: &image_env,
        };
        let env = container_environment(&env_context, spec).await?;
        let (program, args) = self.command_line(spec, &source, &image_name, &env)?;
        let mounts = self.bind_mounts(spec)?;
        let (run_as, read_only_root) = self.process_identity(spec, &source)?;

        let launch = ContainerLaunch {
            name: format!("{}/{}", self.full_name(), spec.name),
            program,
            args,
            env,
            working_dir: spec.working_dir.clone().or_else(|| match &source {
                ImageSource::Pulled(image) => image.working_dir.clone(),
                ImageSource::Local(_) => None,
            }),
            hostname: self
                .pod
                .spec
                .as_ref()
                .and_then(|spec| spec.hostname.clone())
                .unwrap_or_else(|| self.name.clone()),
            run_as,
            read_only_root,
            scratch_dir: self.dir.join("containers").join(&spec.name),
            pod_dir: self.dir.clone(),
            image_dirs: match &source {
                ImageSource::Local(image) => image.path_dirs.clone(),
                ImageSource::Pulled(_) => Vec::new(),
            },
            root_dir: match &source {
                ImageSource::Pulled(image) => Some(image.root.clone()),
                ImageSource::Local(_) => None,
            },
            mounts,
            log_path: self.logs_dir.join(format!("{}.log", spec.name)),
        };
        spawn_container(&net.netns, &launch)
    }

    /// The image a container names: pulled from the lab registry, or host binaries of the
    /// image table.
    async fn image_source(&self, image_name: &str) -> Result<ImageSource> {
        let source = if ImageStore::handles(image_name) {
            ImageSource::Pulled(self.node.image_store.get(image_name).await?)
        } else {
            ImageSource::Local(
                self.node
                    .config
                    .images
                    .lookup(image_name)
                    .ok_or_else(|| {
                        self.pod_error(format!(
                            "image {image_name} is not in the test kubelet's image table"
                        ))
                    })?
                    .clone(),
            )
        };
        Ok(source)
    }

    /// The program and its arguments, as the kubelet builds them from the image and the
    /// container's `command`/`args`, with `$(VAR)` expanded.
    fn command_line(
        &self,
        spec: &Container,
        source: &ImageSource,
        image_name: &str,
        env: &[(String, String)],
    ) -> Result<(PathBuf, Vec<String>)> {
        // As the kubelet: `command` replaces the entrypoint (and drops the image's cmd),
        // `args` replace the cmd.
        let mut argv: Vec<String> = match (&spec.command, &source) {
            (Some(command), _) if !command.is_empty() => command.clone(),
            (_, ImageSource::Local(image)) => image.entrypoint.clone(),
            (_, ImageSource::Pulled(image)) => image.entrypoint.clone(),
        };
        match (&spec.args, &spec.command, &source) {
            (Some(args), _, _) if !args.is_empty() => argv.extend(args.iter().cloned()),
            (_, None, ImageSource::Pulled(image)) => argv.extend(image.cmd.iter().cloned()),
            _ => {}
        }
        let argv: Vec<String> = argv.iter().map(|arg| expand(arg, env)).collect();
        let (program_name, args) = argv
            .split_first()
            .ok_or_else(|| self.pod_error(format!("container {} has no command", spec.name)))?;
        let program = match &source {
            ImageSource::Local(image) => image.resolve_program(program_name).ok_or_else(|| {
                self.pod_error(format!(
                    "{program_name} not found in image {image_name} ({}){}",
                    image.label,
                    image
                        .hint
                        .as_deref()
                        .map(|hint| format!("; {hint}"))
                        .unwrap_or_default()
                ))
            })?,
            ImageSource::Pulled(image) => image.resolve_program(program_name).ok_or_else(|| {
                self.pod_error(format!(
                    "{program_name} not found on the PATH of image {image_name} ({})",
                    image.manifest_digest
                ))
            })?,
        };
        Ok((program, args.to_vec()))
    }

    /// `/etc/hosts`, `/etc/resolv.conf` and the container's volume mounts.
    fn bind_mounts(&self, spec: &Container) -> Result<Vec<BindMount>> {
        let mut mounts = vec![
            BindMount {
                source: self.dir.join("etc-hosts"),
                target: "/etc/hosts".into(),
                read_only: false,
            },
            BindMount {
                source: self.dir.join("resolv.conf"),
                target: "/etc/resolv.conf".into(),
                read_only: false,
            },
        ];
        for mount in spec.volume_mounts.iter().flatten() {
            let volume_dir = self.volumes.get(&mount.name).ok_or_else(|| {
                self.pod_error(format!("volumeMount {} names no volume", mount.name))
            })?;
            let source = match mount.sub_path.as_deref() {
                Some(sub_path) if !sub_path.is_empty() => safe_join(volume_dir, sub_path)
                    .ok_or_else(|| self.pod_error(format!("bad subPath {sub_path}")))?,
                _ => volume_dir.clone(),
            };
            mounts.push(BindMount {
                source,
                target: mount.mount_path.clone(),
                read_only: mount.read_only.unwrap_or(false),
            });
        }
        Ok(mounts)
    }

    /// The user and group the process runs as, and whether its root is read-only.
    fn process_identity(
        &self,
        spec: &Container,
        source: &ImageSource,
    ) -> Result<(Option<(u32, u32)>, bool)> {
        let pod_security = self
            .pod
            .spec
            .as_ref()
            .and_then(|spec| spec.security_context.clone());
        let container_security = spec.security_context.clone();
        let image_user = match &source {
            ImageSource::Pulled(image) => image.user,
            ImageSource::Local(_) => None,
        };
        let uid = container_security
            .as_ref()
            .and_then(|context| context.run_as_user)
            .or_else(|| {
                pod_security
                    .as_ref()
                    .and_then(|context| context.run_as_user)
            })
            .or(image_user.map(|(uid, _)| i64::from(uid)));
        let gid = container_security
            .as_ref()
            .and_then(|context| context.run_as_group)
            .or_else(|| {
                pod_security
                    .as_ref()
                    .and_then(|context| context.run_as_group)
            })
            .or(image_user.map(|(_, gid)| i64::from(gid)));
        let run_as_non_root = container_security
            .as_ref()
            .and_then(|context| context.run_as_non_root)
            .or_else(|| {
                pod_security
                    .as_ref()
                    .and_then(|context| context.run_as_non_root)
            })
            .unwrap_or(false);
        // The mapped images have no USER, so like the kubelet with a root image we refuse to
        // guess: runAsNonRoot needs an explicit non-zero runAsUser (or a pulled image's USER).
        if run_as_non_root && uid.is_none_or(|uid| uid == 0) {
            return Err(self.pod_error(format!(
                "container {} has runAsNonRoot and image will run as root",
                spec.name
            )));
        }
        let run_as = uid.map(|uid| (uid as u32, gid.unwrap_or(uid) as u32));
        let read_only_root = container_security
            .as_ref()
            .and_then(|context| context.read_only_root_filesystem)
            .unwrap_or(false);
        Ok((run_as, read_only_root))
    }

    async fn step_containers(&mut self) {
        let restart_policy = self.restart_policy();
        let now = Instant::now();
        for index in 0..self.containers.len() {
            let container = &mut self.containers[index];
            if container.finished.is_some() {
                continue;
            }
            if let Some(process) = &mut container.process
                && let Some(status) = process.try_exited()
            {
                let exit_code = exit_code(&status);
                let termination = ContainerStateTerminated {
                    exit_code,
                    signal: std::os::unix::process::ExitStatusExt::signal(&status),
                    reason: Some(if exit_code == 0 { "Completed" } else { "Error" }.into()),
                    started_at: container.started_at.map(Time),
                    finished_at: Some(Time(Timestamp::now())),
                    ..ContainerStateTerminated::default()
                };
                container.process = None;
                container.ready = false;
                container.probe = ProbeState::default();
                let restart = match restart_policy.as_str() {
                    "Never" => false,
                    "OnFailure" => exit_code != 0,
                    _ => true,
                };
                if restart {
                    if container
                        .started_instant
                        .is_some_and(|started| started.elapsed() > BACKOFF_RESET_AFTER)
                    {
                        container.backoff = INITIAL_BACKOFF;
                    }
                    container.next_start = Some(now + container.backoff);
                    container.backoff = (container.backoff * 2).min(MAX_BACKOFF);
                    container.waiting = Some((
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off restarting failed container {}",
                            container.spec.name
                        ),
                    ));
                    container.last_termination = Some(termination);
                } else {
                    container.finished = Some(termination);
                }
            }
            let container = &self.containers[index];
            if container.process.is_none()
                && container.finished.is_none()
                && container.next_start.is_some_and(|at| at <= now)
            {
                let spec = container.spec.clone();
                let started = self.start_process(&spec).await;
                let container = &mut self.containers[index];
                match started {
                    Ok(process) => {
                        if container.started_at.is_some() {
                            container.restart_count += 1;
                        }
                        container.process = Some(process);
                        container.started_at = Some(Timestamp::now());
                        container.started_instant = Some(Instant::now());
                        container.waiting = None;
                        container.next_start = None;
                    }
                    Err(error) => {
                        let message = error_chain(&error);
                        tracing::warn!(pod = %format!("{}/{}", self.namespace, self.name), container = %spec.name, error = %message, "container did not start");
                        container.waiting = Some(("CreateContainerError".into(), message));
                        container.next_start = Some(now + container.backoff);
                        container.backoff = (container.backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    }

    /// Runs the startup and readiness probes that are due. As in the kubelet: readiness is
    /// not probed before the startup probe succeeded, and is probed at once after it did; a
    /// startup probe that fails `failureThreshold` times restarts the container.
    async fn run_due_probes(&mut self) {
        // A startup probe that succeeds has readiness probed at once (the kubelet triggers it
        // right away), not a tick later.
        if self.probe_round().await {
            self.probe_round().await;
        }
    }

    /// One round of due probes; `true` when a startup probe succeeded in it.
    async fn probe_round(&mut self) -> bool {
        let Some(net) = &self.net else {
            return false;
        };
        let node_netns = Arc::new(tno_netlab::Netns::adopt(self.node.lab.netns().name()));
        let pod_ip = net.ip;
        let now = Instant::now();
        let mut due = Vec::new();
        for (index, container) in self.containers.iter_mut().enumerate() {
            if container.process.is_none() {
                continue;
            }
            if let Some(probe) = probe_due(container, now) {
                due.push((index, container.spec.clone(), probe));
            }
        }
        let results = futures::future::join_all(
            due.iter()
                .map(|(_, spec, (_, probe))| run_probe(node_netns.clone(), pod_ip, spec, probe)),
        )
        .await;
        let mut started = false;
        for ((index, _, (kind, probe)), success) in due.into_iter().zip(results) {
            let container = &mut self.containers[index];
            let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
            match kind {
                ProbeKind::Startup if success => {
                    container.probe.started = true;
                    container.probe.next_at = Some(Instant::now());
                    started = true;
                }
                ProbeKind::Startup => {
                    container.probe.startup_failures += 1;
                    container.probe.startup_next_at = Some(Instant::now() + period);
                    if container.probe.startup_failures >= probe.failure_threshold.unwrap_or(3) {
                        tracing::info!(pod = %format!("{}/{}", self.namespace, self.name), container = %container.spec.name, "startup probe failed: restarting the container");
                        if let Some(process) = container.process.as_ref() {
                            process.signal(nix::sys::signal::Signal::SIGTERM);
                        }
                    }
                }
                ProbeKind::Readiness => record_readiness(container, &probe, success, period),
            }
        }
        started
    }

    fn set_condition(&mut self, kind: &'static str, status: bool) {
        let entry = self
            .conditions
            .entry(kind)
            .or_insert((status, Timestamp::now()));
        if entry.0 != status {
            *entry = (status, Timestamp::now());
        }
    }

    fn phase(&self) -> &'static str {
        if let Some(phase) = self.phase_override {
            return phase;
        }
        let all_finished = self
            .containers
            .iter()
            .all(|container| container.finished.is_some());
        if all_finished && !self.containers.is_empty() {
            let all_succeeded = self
                .containers
                .iter()
                .filter_map(|container| container.finished.as_ref())
                .all(|termination| termination.exit_code == 0);
            return if all_succeeded { "Succeeded" } else { "Failed" };
        }
        if self
            .containers
            .iter()
            .any(|container| container.started_at.is_some())
        {
            "Running"
        } else {
            "Pending"
        }
    }

    fn build_status(&mut self) -> PodStatus {
        let all_ready =
            !self.containers.is_empty() && self.containers.iter().all(|container| container.ready);
        self.set_condition("ContainersReady", all_ready);
        self.set_condition("Ready", all_ready);
        let container_statuses = self
            .containers
            .iter()
            .map(|container| {
                let state = if let Some(termination) = &container.finished {
                    ContainerState {
                        terminated: Some(termination.clone()),
                        ..ContainerState::default()
                    }
                } else if container.process.is_some() {
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: container.started_at.map(Time),
                        }),
                        ..ContainerState::default()
                    }
                } else {
                    let (reason, message) = container.waiting.clone().unwrap_or_default();
                    ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason),
                            message: (!message.is_empty()).then_some(message),
                        }),
                        ..ContainerState::default()
                    }
                };
                ContainerStatus {
                    name: container.spec.name.clone(),
                    image: container.spec.image.clone().unwrap_or_default(),
                    image_id: self
                        .node
                        .image_store
                        .image_id(container.spec.image.as_deref().unwrap_or_default())
                        .unwrap_or_default(),
                    container_id: container
                        .started_at
                        .map(|_| format!("tno://{}/{}", self.uid, container.spec.name)),
                    ready: container.ready,
                    started: Some(container.process.is_some() && container.probe.started),
                    restart_count: container.restart_count,
                    state: Some(state),
                    last_state: container.last_termination.clone().map(|termination| {
                        ContainerState {
                            terminated: Some(termination),
                            ..ContainerState::default()
                        }
                    }),
                    ..ContainerStatus::default()
                }
            })
            .collect();
        let mut conditions: Vec<PodCondition> = self
            .conditions
            .iter()
            .map(|(kind, (status, since))| PodCondition {
                type_: (*kind).to_string(),
                status: if *status { "True" } else { "False" }.into(),
                last_transition_time: Some(Time(*since)),
                ..PodCondition::default()
            })
            .collect();
        conditions.sort_by(|left, right| left.type_.cmp(&right.type_));
        let pod_ip = self.pod_ip();
        let host_ip = self.node.config.node_ip.to_string();
        PodStatus {
            phase: Some(self.phase().into()),
            pod_ip: (!pod_ip.is_empty()).then(|| pod_ip.clone()),
            pod_ips: (!pod_ip.is_empty())
                .then(|| vec![k8s_openapi::api::core::v1::PodIP { ip: pod_ip }]),
            host_ip: Some(host_ip.clone()),
            host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP { ip: host_ip }]),
            start_time: Some(Time(self.start_time)),
            conditions: Some(conditions),
            container_statuses: Some(container_statuses),
            ..PodStatus::default()
        }
    }

    /// Sends the status if it changed since the last report.
    async fn report(&mut self) {
        let status = self.build_status();
        let Ok(value) = serde_json::to_value(&status) else {
            return;
        };
        if self.last_reported.as_ref() == Some(&value) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.node.client.clone(), &self.namespace);
        let patch = serde_json::json!({ "status": value });
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => self.last_reported = Some(value),
            Err(error) => {
                tracing::debug!(pod = %self.full_name(), %error, "status update failed; retrying next tick");
            }
        }
    }

    async fn record_pod_error(&mut self, error: &Error) {
        for container in &mut self.containers {
            if container.process.is_none() && container.finished.is_none() {
                container.waiting =
                    Some(("CreateContainerConfigError".into(), error_chain(&error)));
            }
        }
        self.report().await;
    }

    async fn terminate(&mut self) {
        let grace = self.grace_period();
        let stops = self
            .containers
            .iter_mut()
            .filter_map(|container| container.process.as_mut())
            .map(|process| process.stop(grace));
        futures::future::join_all(stops).await;
        for container in &mut self.containers {
            container.process = None;
        }
        self.remove_sandbox().await;
    }

    async fn remove_sandbox(&mut self) {
        if self.net.take().is_some() {
            let lab = self.node.lab.clone();
            let uid = self.uid.clone();
            let removed = tokio::task::spawn_blocking(move || lab.remove_pod_netns(&uid)).await;
            if let Ok(Err(error)) = removed {
                tracing::warn!(pod = %self.full_name(), %error, "removing the pod netns failed");
            }
        }
        // Logs stay (they are outside the pod dir); volumes and scratch go.
        if let Err(error) = std::fs::remove_dir_all(&self.dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(pod = %self.full_name(), %error, "removing the pod directory failed");
        }
    }

    /// Deletes the object for good, as the kubelet does once the containers are gone.
    async fn finalize(&self, updates: &PodUpdates) {
        if updates.borrow().is_none() {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.node.client.clone(), &self.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(error) = api.delete(&self.name, &params).await {
            tracing::debug!(pod = %self.full_name(), %error, "final pod deletion failed");
        }
    }
}

fn exit_code(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(-1)
}

/// `base/relative` if `relative` stays inside `base`.
fn safe_join(base: &Path, relative: &str) -> Option<PathBuf> {
    let relative = Path::new(relative);
    let escapes = relative.is_absolute()
        || relative
            .components()
            .any(|part| matches!(part, std::path::Component::ParentDir));
    (!escapes).then(|| base.join(relative))
}
