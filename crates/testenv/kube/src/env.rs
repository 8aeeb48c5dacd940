//! The whole Kubernetes environment, and the process-wide instance tests share.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tno_netlab::{Lab, RunId, TcpForwarder};

use crate::binaries::{Binaries, tool, workspace_binary, workspace_root};
use crate::control_plane::{ControlPlane, client_from_kubeconfig};
use crate::crds::{install_crds, read_crds, yaml_files};
use crate::error::{Error, IoContext, KubeContext, NetlabContext, Result};
use crate::kubelet::{ImageMatcher, ImageTable, Kubelet, KubeletConfig, LocalImage};
use crate::network::{CLUSTER_DOMAIN, ClusterNetwork, deploy_coredns, start_kube_proxy};
use crate::process::{ManagedProcess, log_tail, poll_until};

/// The node the test kubelet registers (in [`ClusterNetwork::PRIMARY`]).
pub const NODE_NAME: &str = ClusterNetwork::PRIMARY.node_name;
/// The image reference of the test servers (`tno-test-servers` binary).
/// A `tailnet-agent` binary that images named `tailnet-agent-baseline…` run (the
/// benchmarks' baseline build next to the workspace's).
pub const BASELINE_AGENT_VAR: &str = "TNO_BIN_TAILNET_AGENT_BASELINE";
/// A `tailscaled` binary that images named `…/tailscale/tailscale-baseline` run (the startup
/// benchmark's baseline, e.g. another build of the same tailscale version).
pub const BASELINE_TAILSCALED_VAR: &str = "TNO_BIN_TAILSCALED_BASELINE";
/// Environment of the [`BASELINE_TAILSCALED_VAR`] image's processes, `KEY=VALUE` pairs
/// separated by spaces (e.g. `GOMEMLIMIT=200MiB GOGC=50`: Go runtime settings side by side).
pub const BASELINE_TAILSCALED_ENV_VAR: &str = "TNO_TAILSCALED_BASELINE_ENV";
/// The tailscale image the pods of [`BASELINE_TAILSCALED_VAR`]'s build name.
pub const BASELINE_TAILSCALE_IMAGE: &str = "ghcr.io/tailscale/tailscale-baseline:bench";

pub const TEST_SERVERS_IMAGE: &str = "tno.local/tno-test-servers:latest";

const NETWORK_DEADLINE: Duration = Duration::from_secs(120);

/// Options for [`KubeEnv::start`].
#[derive(Debug, Clone)]
pub struct KubeEnvOptions {
    /// Directories whose `*.yaml` CRDs are installed (default: the repo's `deploy/crds` and
    /// cert-manager's CRDs from the deps cache).
    pub crd_dirs: Vec<PathBuf>,
    /// Extra image mappings, consulted before the built-in ones.
    pub extra_images: Vec<LocalImage>,
    /// Deploy CoreDNS (and wait for it). Without it, names do not resolve in pods.
    pub cluster_dns: bool,
    /// The cluster's node netns, node name, pod and Service CIDRs.
    pub network: ClusterNetwork,
}

impl KubeEnvOptions {
    pub fn from_repository(binaries: &Binaries) -> Self {
        Self {
            crd_dirs: vec![
                workspace_root().join("deploy/crds"),
                binaries.cert_manager_crds.clone(),
            ],
            extra_images: Vec::new(),
            cluster_dns: true,
            network: ClusterNetwork::PRIMARY,
        }
    }

    /// A cluster as a user's before `helm install`: cert-manager's CRDs, none of ours (the
    /// chart creates them; Helm refuses to adopt CRDs it did not create).
    pub fn without_our_crds(binaries: &Binaries) -> Self {
        Self {
            crd_dirs: vec![binaries.cert_manager_crds.clone()],
            ..Self::from_repository(binaries)
        }
    }

    /// The same, for a second cluster of the lab ([`ClusterNetwork::SECOND`]).
    pub fn second_cluster(binaries: &Binaries) -> Self {
        Self {
            network: ClusterNetwork::SECOND,
            ..Self::from_repository(binaries)
        }
    }
}

/// A running environment. Dropping it stops everything it started.
pub struct KubeEnv {
    run_id: RunId,
    dir: PathBuf,
    binaries: Binaries,
    startup: Duration,
    installed_crds: Vec<String>,
    network: ClusterNetwork,
    runtime: tokio::runtime::Handle,
    // Field order is drop order: pods and kube-proxy go before the lab and the control plane.
    kubelet: Kubelet,
    kube_proxy: Mutex<ManagedProcess>,
    _api_forwarder: TcpForwarder,
    lab: Arc<Lab>,
    control_plane: Mutex<ControlPlane>,
    admin_kubeconfig: PathBuf,
}

impl KubeEnv {
    /// Starts everything: lab netns, control plane, CRDs, kubelet, kube-proxy, CoreDNS.
    /// Must run on a runtime that outlives the environment (its loops are spawned there).
    pub async fn start(binaries: Binaries, options: KubeEnvOptions) -> Result<Self> {
        let started = Instant::now();
        binaries.require_kubernetes()?;
        tno_netlab::cleanup_stale_runs().netlab_context(|| "cleaning up stale runs".into())?;
        let run_id = RunId::generate().netlab_context(|| "generating a run id".into())?;
        let dir = run_id.scratch_dir().join("kube");
        std::fs::create_dir_all(&dir).io_context(|| format!("creating {dir:?}"))?;
        let network = options.network;
        let lab = Arc::new(
            Lab::create_named(&run_id, network.lab_name, network.pod_network)
                .netlab_context(|| "creating the lab".into())?,
        );
        let gateway = lab.gateway();

        let control_plane = ControlPlane::start(&binaries, &dir, gateway, &network).await?;
        let api_forwarder = lab
            .expose_root_port(control_plane.api_port)
            .netlab_context(|| "exposing the apiserver in the lab".into())?;
        let admin_kubeconfig = control_plane.admin_kubeconfig.clone();
        let admin = control_plane.admin_client().await?;

        let mut crd_files = Vec::new();
        for crd_dir in &options.crd_dirs {
            crd_files.extend(yaml_files(crd_dir)?);
        }
        let installed_crds =
            install_crds(&admin, &read_crds(&crd_files)?, Duration::from_secs(60)).await?;

        let lab_server = format!("https://{gateway}:{}", control_plane.api_port);
        let node_kubeconfig = control_plane.kubeconfig_for(
            "kubelet",
            &format!("system:node:{}", network.node_name),
            &["system:nodes"],
        )?;
        let scheduler_kubeconfig =
            control_plane.kubeconfig_for("scheduler", "system:kube-scheduler", &[])?;
        let proxy_kubeconfig = control_plane.kubeconfig_for_server(
            "kube-proxy",
            "system:kube-proxy",
            &[],
            &lab_server,
        )?;

        let mut images = ImageTable::new();
        for image in options.extra_images {
            images.add(image);
        }
        for image in builtin_images(&binaries) {
            images.add(image);
        }
        let kubelet = Kubelet::start(
            client_from_kubeconfig(&node_kubeconfig).await?,
            client_from_kubeconfig(&scheduler_kubeconfig).await?,
            lab.clone(),
            KubeletConfig {
                node_name: network.node_name.into(),
                node_ip: gateway,
                pod_cidr: network.pod_cidr.into(),
                dir: dir.join("kubelet"),
                images,
                cluster_dns: network.cluster_dns_ip,
                cluster_domain: CLUSTER_DOMAIN.into(),
                kubernetes_service: (network.kubernetes_service_ip, 443),
            },
        )
        .await?;
        let kube_proxy = start_kube_proxy(
            &binaries.kube_proxy,
            &lab,
            &proxy_kubeconfig,
            &network,
            &dir,
        )?;

        let mut env = Self {
            run_id,
            dir,
            binaries,
            startup: Duration::ZERO,
            installed_crds,
            network,
            runtime: tokio::runtime::Handle::current(),
            kubelet,
            kube_proxy: Mutex::new(kube_proxy),
            _api_forwarder: api_forwarder,
            lab,
            control_plane: Mutex::new(control_plane),
            admin_kubeconfig,
        };
        if options.cluster_dns
            && let Err(error) =
                deploy_coredns(&admin, network.cluster_dns_ip, NETWORK_DEADLINE).await
        {
            return Err(env.with_logs(error));
        }
        env.startup = started.elapsed();
        Ok(env)
    }

    /// A fresh cluster-admin client (build one per runtime: connections belong to the runtime
    /// that opened them).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// The cluster-admin kubeconfig (usable with `kubectl --kubeconfig`).
    pub fn kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// Everything of this run (logs, certificates, pod directories).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn lab(&self) -> &Arc<Lab> {
        &self.lab
    }

    pub fn kubelet(&self) -> &Kubelet {
        &self.kubelet
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// How long [`KubeEnv::start`] took.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Names of the CRDs installed at start.
    pub fn installed_crds(&self) -> &[String] {
        &self.installed_crds
    }

    /// `https://127.0.0.1:<port>` (root netns).
    pub fn api_server_url(&self) -> String {
        self.control_plane
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .server_url()
    }

    /// The apiserver's port, on 127.0.0.1 and on the lab gateway.
    pub fn api_port(&self) -> u16 {
        self.control_plane
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .api_port
    }

    /// The apiserver as pods and lab processes reach it: `https://<gateway>:<port>`.
    pub fn api_server_url_in_lab(&self) -> String {
        format!("https://{}:{}", self.lab.gateway(), self.api_port())
    }

    /// The cluster's addresses (node netns, pod and Service CIDRs).
    pub fn network(&self) -> &ClusterNetwork {
        &self.network
    }

    /// Stops kube-apiserver (SIGTERM, SIGKILL after `grace`) until [`Self::start_apiserver`]:
    /// the cluster's API is gone while its pods, etcd and the tailnet keep running.
    pub async fn stop_apiserver(&self, grace: Duration) {
        crate::control_plane::stop_apiserver(&self.control_plane, grace).await;
    }

    /// Starts the apiserver stopped by [`Self::stop_apiserver`] and waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<Duration> {
        crate::control_plane::start_apiserver(&self.control_plane).await
    }

    /// Restarts kube-apiserver (SIGTERM, SIGKILL after `grace`, same flags and etcd) and waits
    /// until it is ready again; returns how long it was unavailable. Clients, watches and
    /// the kubelet see what a control-plane upgrade looks like.
    pub async fn restart_apiserver(&self, grace: Duration) -> Result<Duration> {
        crate::control_plane::restart_apiserver(&self.control_plane, grace).await
    }

    /// The runtime the environment's loops run on.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Creates a namespace `<prefix>-<random>` and waits until pods can start in it (default
    /// ServiceAccount and `kube-root-ca.crt` published).
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace<'_>> {
        let client = self.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let mut namespace = Namespace::default();
        namespace.metadata.generate_name = Some(format!("{prefix}-"));
        let created = namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .kube_context(|| format!("creating a namespace {prefix}-*"))?;
        let name = created.metadata.name.unwrap_or_default();
        let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
        poll_until(
            &format!("namespace {name} to get its default ServiceAccount and root CA"),
            Duration::from_secs(60),
            || async {
                let sa = service_accounts.get_opt("default").await.ok().flatten();
                let ca = config_maps.get_opt("kube-root-ca.crt").await.ok().flatten();
                (sa.is_some() && ca.is_some()).then_some(())
            },
        )
        .await?;
        Ok(TestNamespace {
            env: self,
            name,
            client,
        })
    }

    /// The log of a pod's container as the test kubelet wrote it.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        std::fs::read_to_string(self.kubelet.container_log(namespace, pod, container))
            .unwrap_or_default()
    }

    /// Tails of every component log and of every container log in `namespace` (all if `None`).
    pub fn diagnostics(&self, namespace: Option<&str>, lines: usize) -> String {
        let mut report = self
            .control_plane
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .log_tails(lines);
        let proxy = self
            .kube_proxy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        report.push_str(&format!(
            "\n----- kube-proxy ({}) -----\n{}",
            proxy.log_path().display(),
            proxy.log_tail(lines)
        ));
        let logs_dir = self.kubelet.logs_dir();
        let mut pod_dirs: Vec<PathBuf> = std::fs::read_dir(&logs_dir)
            .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default();
        pod_dirs.sort();
        for pod_dir in pod_dirs {
            let pod_name = pod_dir
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default();
            if namespace.is_some_and(|namespace| !pod_name.starts_with(&format!("{namespace}_"))) {
                continue;
            }
            for log in std::fs::read_dir(&pod_dir).into_iter().flatten().flatten() {
                report.push_str(&format!(
                    "\n----- container {pod_name}/{} -----\n{}",
                    log.file_name().to_string_lossy(),
                    log_tail(&log.path(), lines)
                ));
            }
        }
        report
    }

    fn with_logs(&self, error: Error) -> Error {
        match error {
            Error::Timeout {
                what,
                seconds,
                details,
            } => Error::Timeout {
                what,
                seconds,
                details: format!("{details}\n{}", self.diagnostics(None, 30)),
            },
            other => other,
        }
    }
}

/// Starts the built-in image table: the tailscale image, our agent, CoreDNS, the test servers.
fn builtin_images(binaries: &Binaries) -> Vec<LocalImage> {
    let dir_of = |path: &Path| {
        path.parent()
            .map(Path::to_path_buf)
            .into_iter()
            .collect::<Vec<_>>()
    };
    let mut images = vec![
        // This release's agent tailscale image (`cargo xtask images`): the minimal build's
        // tailscaled, which the agent pods run as `/usr/local/bin/tailscaled` (their command).
        LocalImage::new(
            "tailnet-tailscaled",
            ImageMatcher::RepositorySuffix("tailnet-tailscaled".into()),
            dir_of(&binaries.tailscaled_minimal),
            &["tailscaled"],
        ),
        LocalImage::new(
            "tailscale",
            ImageMatcher::RepositorySuffix("tailscale/tailscale".into()),
            // containerboot runs `tailscaled` and `tailscale` from PATH.
            [
                dir_of(&binaries.containerboot),
                dir_of(&binaries.tailscaled),
            ]
            .concat(),
            &["containerboot"],
        )
        // The lab has no Internet: no log uploads (nor DNS bootstrap for them). The test
        // Headscale serves HTTPS (its DERP too) behind the lab CA, which the pod must be given
        // (the operator mounts a Tailnet's `spec.serverCA` and sets `SSL_CERT_DIR`).
        .with_env("TS_NO_LOGS_NO_SUPPORT", "true"),
        LocalImage::new(
            "coredns",
            ImageMatcher::RepositorySuffix("coredns/coredns".into()),
            dir_of(&binaries.coredns),
            &["coredns"],
        ),
    ];
    // The Gateway API conformance suite's backend (`deps/build.sh gateway-api-conformance`,
    // an optional component): its manifests name registry.k8s.io/gateway-api/echo-basic:<tag>
    // (several tags), upstream's image runs `/echo-basic`. The pods set everything else it
    // reads (POD_NAME, NAMESPACE, TCP_ECHO_SERVER, TLS_SERVER_CERT, ...) themselves.
    images.push(echo_basic_image(tool(
        ECHO_BASIC_COMPONENT,
        ECHO_BASIC_BINARY,
    )));
    // A second tailscaled build (the startup benchmark's baseline): the pods' command
    // `/usr/local/bin/tailscaled` resolves in its directory first.
    if let Some(path) = std::env::var_os(BASELINE_TAILSCALED_VAR) {
        let mut image = LocalImage::new(
            "tailscale-baseline",
            ImageMatcher::RepositorySuffix("tailscale/tailscale-baseline".into()),
            [dir_of(Path::new(&path)), dir_of(&binaries.containerboot)].concat(),
            &["containerboot"],
        )
        .with_env("TS_NO_LOGS_NO_SUPPORT", "true");
        let extra = std::env::var(BASELINE_TAILSCALED_ENV_VAR).unwrap_or_default();
        for (name, value) in extra.split_whitespace().filter_map(|kv| kv.split_once('=')) {
            image = image.with_env(name, value);
        }
        images.push(image);
    }
    // A second agent build (the benchmarks' baseline), for images named
    // `tailnet-agent-baseline…`; listed first, the first matching image wins.
    if let Some(path) = std::env::var_os(BASELINE_AGENT_VAR) {
        images.push(LocalImage::new(
            "tailnet-agent-baseline",
            ImageMatcher::NamePrefix("tailnet-agent-baseline".into()),
            dir_of(Path::new(&path)),
            &["tailnet-agent"],
        ));
    }
    // Our own binaries may not be built yet: the image is still known, and its pods report
    // how to build the program instead of "image not in the table".
    for (binary, package) in [
        ("tailnet-agent", "tailnet-agent"),
        ("tno-test-servers", "tno-testenv-kube"),
    ] {
        let image = match workspace_binary(binary) {
            Ok(path) => LocalImage::new(
                binary,
                ImageMatcher::NamePrefix(binary.into()),
                dir_of(&path),
                &[binary],
            ),
            Err(error) => LocalImage::new(
                binary,
                ImageMatcher::NamePrefix(binary.into()),
                Vec::new(),
                &[binary],
            )
            .with_hint(format!(
                "{}; build it first: cargo build -p {package} --bins",
                crate::error_chain(&error)
            )),
        };
        images.push(image);
    }
    images
}

/// The deps component and binary of the Gateway API conformance suite's echo backend.
pub const ECHO_BASIC_COMPONENT: &str = "gateway-api-conformance";
pub const ECHO_BASIC_BINARY: &str = "echo-basic";
/// Images of the repository `*/gateway-api/echo-basic` run [`ECHO_BASIC_BINARY`].
pub const ECHO_BASIC_REPOSITORY: &str = "gateway-api/echo-basic";

/// The echo-basic image: the binary's directory, or (not built) a hint naming the build.
fn echo_basic_image(binary: Result<PathBuf>) -> LocalImage {
    let matcher = ImageMatcher::RepositorySuffix(ECHO_BASIC_REPOSITORY.into());
    match binary {
        Ok(path) => LocalImage::new(
            ECHO_BASIC_BINARY,
            matcher,
            path.parent().map(Path::to_path_buf).into_iter().collect(),
            &[ECHO_BASIC_BINARY],
        ),
        Err(error) => LocalImage::new(ECHO_BASIC_BINARY, matcher, Vec::new(), &[ECHO_BASIC_BINARY])
            .with_hint(format!(
                "{}; build it first: deps/build.sh {ECHO_BASIC_COMPONENT}",
                crate::error_chain(&error)
            )),
    }
}

/// A namespace for one test. Dropping it deletes the namespace (in the background) and, if
/// the test is panicking, prints the logs that explain why.
pub struct TestNamespace<'env> {
    env: &'env KubeEnv,
    name: String,
    client: kube::Client,
}

impl TestNamespace<'_> {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A cluster-admin client made on the caller's runtime.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub fn env(&self) -> &KubeEnv {
        self.env
    }

    /// The log of one of this namespace's containers.
    pub fn container_log(&self, pod: &str, container: &str) -> String {
        self.env.container_log(&self.name, pod, container)
    }
}

impl Drop for TestNamespace<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== tno-testenv diagnostics for namespace {} (run dir {}) ====\n{}",
                self.name,
                self.env.dir.display(),
                self.env.diagnostics(Some(&self.name), 40)
            );
        }
        let name = self.name.clone();
        let kubeconfig = self.env.admin_kubeconfig.clone();
        // The test's runtime may be shutting down; the environment's runtime lives on.
        self.env.runtime.spawn(async move {
            if let Ok(client) = client_from_kubeconfig(&kubeconfig).await {
                let namespaces: Api<Namespace> = Api::all(client);
                let _ = namespaces.delete(&name, &DeleteParams::default()).await;
            }
        });
    }
}

/// Process-wide environment state: started once, on its own runtime thread, for every test
/// of the test binary.
struct Shared {
    ready: tokio::sync::watch::Receiver<Option<std::result::Result<Arc<KubeEnv>, Arc<Error>>>>,
}

/// The environment shared by all tests of this process, started on first use.
///
/// It runs on a dedicated thread with its own tokio runtime, so it outlives each
/// `#[tokio::test]` runtime. At process exit its netns, processes and (unless `TNO_KEEP_SCRATCH`
/// is set) its scratch directory are removed; a killed run is cleaned up by the next one.
pub async fn shared() -> std::result::Result<Arc<KubeEnv>, Arc<Error>> {
    shared_with(KubeEnvOptions::from_repository).await
}

/// [`shared`], started with the options `options` makes (e.g.
/// [`KubeEnvOptions::without_our_crds`]). The first call in the process starts the
/// environment, so a test binary uses one kind of environment throughout.
pub async fn shared_with(
    options: fn(&Binaries) -> KubeEnvOptions,
) -> std::result::Result<Arc<KubeEnv>, Arc<Error>> {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    let shared = SHARED.get_or_init(|| {
        let (sender, ready) = tokio::sync::watch::channel(None);
        let spawned = std::thread::Builder::new()
            .name("tno-testenv".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .thread_name("tno-testenv-rt")
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(source) => {
                        let _ = sender.send(Some(Err(Arc::new(Error::Io {
                            context: "building the environment's runtime".into(),
                            source,
                        }))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let started = async {
                        let binaries = Binaries::discover()?;
                        let options = options(&binaries);
                        KubeEnv::start(binaries, options).await
                    }
                    .await;
                    let result = started.map(Arc::new).map_err(Arc::new);
                    if let Ok(env) = &result {
                        register_exit_cleanup(env);
                    }
                    let _ = sender.send(Some(result));
                    // Keep the runtime (and with it the kubelet) alive for the process.
                    std::future::pending::<()>().await;
                });
            });
        if let Err(source) = spawned {
            let (sender, ready) = tokio::sync::watch::channel(Some(Err(Arc::new(Error::Io {
                context: "spawning the environment thread".into(),
                source,
            }))));
            drop(sender);
            return Shared { ready };
        }
        Shared { ready }
    });
    let mut ready = shared.ready.clone();
    let result = ready
        .wait_for(Option::is_some)
        .await
        .map_err(|_| {
            Arc::new(Error::Setup {
                what: "environment".into(),
                reason: "the environment thread ended before reporting".into(),
            })
        })?
        .clone();
    result.unwrap_or_else(|| {
        Err(Arc::new(Error::Setup {
            what: "environment".into(),
            reason: "no result".into(),
        }))
    })
}

/// What the exit hook removes: the run's netns (killing every pod and kube-proxy) and its
/// scratch directory. Root-netns servers die by their parent-death signal.
static EXIT_CLEANUP: Mutex<Option<(String, PathBuf, Vec<u32>)>> = Mutex::new(None);

fn register_exit_cleanup(env: &KubeEnv) {
    let scratch = env.run_id.scratch_dir();
    let pids = env
        .control_plane
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pids();
    *EXIT_CLEANUP.lock().unwrap_or_else(PoisonError::into_inner) =
        Some((env.run_id.as_str().to_string(), scratch, pids));
    extern "C" fn cleanup_at_exit() {
        let Some((run_id, scratch, pids)) = EXIT_CLEANUP
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        for pid in pids {
            // Each component leads its own process group; stop it before its files go.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Ok(names) = tno_netlab::list_netns() {
            for name in names.into_iter().filter(|name| name.starts_with(&run_id)) {
                let _ = tno_netlab::Netns::adopt(name).delete();
            }
        }
        if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&scratch);
        } else {
            eprintln!("tno-testenv: kept {}", scratch.display());
        }
    }
    // SAFETY: registering a plain extern "C" function has no preconditions.
    unsafe {
        libc::atexit(cleanup_at_exit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_basic_image_maps_every_tag_the_suite_names_to_the_binary() {
        let table = ImageTable::new().with(echo_basic_image(Ok(PathBuf::from(
            "/deps/gateway-api-conformance-v1.6.3/bin/echo-basic",
        ))));
        for reference in [
            "registry.k8s.io/gateway-api/echo-basic:v1.5.1",
            "registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.2",
            "registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.3",
            "gateway-api/echo-basic",
        ] {
            let image = table
                .lookup(reference)
                .unwrap_or_else(|| panic!("{reference} is mapped"));
            assert_eq!(image.entrypoint, vec![ECHO_BASIC_BINARY.to_string()]);
            assert_eq!(
                image.path_dirs,
                vec![PathBuf::from("/deps/gateway-api-conformance-v1.6.3/bin")]
            );
            assert!(image.hint.is_none());
        }
        for other in [
            "registry.k8s.io/gateway-api/echo-advanced:v1.5.1",
            "registry.k8s.io/echo-basic:v1",
            "registry.k8s.io/coredns/coredns:v1.12.2",
        ] {
            assert!(table.lookup(other).is_none(), "{other} must not map");
        }
    }

    #[test]
    fn missing_echo_basic_names_the_build_command() {
        let image = echo_basic_image(Err(Error::MissingBinary {
            name: ECHO_BASIC_BINARY.into(),
            hint: "not in the deps cache".into(),
        }));
        assert!(image.path_dirs.is_empty());
        let hint = image.hint.expect("a hint");
        assert!(
            hint.contains("deps/build.sh gateway-api-conformance"),
            "{hint}"
        );
        assert!(hint.contains("not in the deps cache"), "{hint}");
    }
}
