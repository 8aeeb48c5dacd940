//! The composed environment: the Kubernetes environment and the tailnet in one lab.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::{Value, json};
use tno_netlab::Lab;
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::{KubeEnv, KubeEnvOptions, TestNamespace};
use tno_testenv_tailnet::{Headscale, HeadscaleApi, Node, TailnetEnv};

use crate::error::{E2eError, Result};

/// Guards Headscale's extra-records directory: it has one writer at a time
/// ([`E2eEnv::project_extra_records`]).
pub(crate) type ProjectionSlot = Arc<tokio::sync::Mutex<()>>;

/// Name of the Secret holding the Headscale API key (the Tailnet's `spec.apiSecretRef`).
pub const BOOTSTRAP_SECRET: &str = "headscale-bootstrap";
/// Key of the API key in [`BOOTSTRAP_SECRET`].
pub const API_KEY_KEY: &str = "apiKey";
/// Name of the base-policy ConfigMap (the Tailnet's `spec.policy.baseConfigMap`).
pub const BASE_POLICY_CONFIG_MAP: &str = "tailnet-policy";
/// ConfigMap (operator namespace) with the lab CA that signed Headscale's certificate, under
/// [`tno_testenv_tailnet::LAB_CA_FILE`]: the Tailnet's `spec.serverCA`.
pub const SERVER_CA_CONFIG_MAP: &str = "headscale-ca";
/// Key of the HuJSON document in [`BASE_POLICY_CONFIG_MAP`].
pub const BASE_POLICY_KEY: &str = "policy.hujson";
/// The DNS hosts ConfigMap the operator renders (the Tailnet's `spec.dns.hostsConfigMap`).
pub const HOSTS_CONFIG_MAP: &str = "tailnet-hosts";
/// Owners of the operator's generated tags in [`E2eEnv::base_policy`] (user `admin`).
pub const PLATFORM_GROUP: &str = "group:platform";

/// The Kubernetes environment and a [`TailnetEnv`] sharing its lab: pods, the operator
/// ([`E2eEnv::start_operator`]), the remote site's router and the laptop all reach Headscale
/// at the same URL, [`E2eEnv::headscale_url`].
pub struct E2eEnv {
    // Field order is drop order: the tailnet side leaves the lab before its owner does.
    tailnet: TailnetEnv,
    kube: Arc<KubeEnv>,
    lab_kubeconfig: PathBuf,
    dir: PathBuf,
    startup: Duration,
    pub(crate) next_operator: AtomicU32,
    /// Held by the one projection of a ConfigMap onto Headscale's extra records.
    extra_records_slot: ProjectionSlot,
}

impl E2eEnv {
    /// Starts the tailnet side (Headscale, remote site with its router, laptop) in `kube`'s
    /// lab and writes a kubeconfig for lab processes next to the admin one. Scratch files go to
    /// `<run>/tailnet` and `<run>/e2e`, so the kube env's cleanup removes them too.
    pub async fn start(kube: Arc<KubeEnv>) -> Result<E2eEnv> {
        let started = Instant::now();
        let scratch = kube.run_id().scratch_dir();
        let dir = scratch.join("e2e");
        std::fs::create_dir_all(&dir)
            .map_err(|e| E2eError::io(format!("creating {}", dir.display()), e))?;
        let lab_kubeconfig =
            write_lab_kubeconfig(kube.kubeconfig(), &kube.api_server_url_in_lab())?;
        let tailnet = TailnetEnv::start_in(kube.lab().clone(), scratch.join("tailnet")).await?;
        Ok(E2eEnv {
            tailnet,
            kube,
            lab_kubeconfig,
            dir,
            startup: started.elapsed(),
            next_operator: AtomicU32::new(0),
            extra_records_slot: ProjectionSlot::default(),
        })
    }

    /// The environment shared by all tests of this process: [`tno_testenv_kube::shared`] plus
    /// the tailnet side, started on first use on a dedicated runtime thread (so it outlives
    /// every `#[tokio::test]` runtime) and torn down at process exit.
    pub async fn shared() -> std::result::Result<Arc<E2eEnv>, Arc<E2eError>> {
        Self::shared_with(KubeEnvOptions::from_repository).await
    }

    /// [`E2eEnv::shared`] on a cluster started with the options `options` makes (see
    /// [`tno_testenv_kube::shared_with`]: the first call in the process decides).
    pub async fn shared_with(
        options: fn(&Binaries) -> KubeEnvOptions,
    ) -> std::result::Result<Arc<E2eEnv>, Arc<E2eError>> {
        type Ready = Option<std::result::Result<Arc<E2eEnv>, Arc<E2eError>>>;
        static SHARED: OnceLock<tokio::sync::watch::Receiver<Ready>> = OnceLock::new();
        let receiver = SHARED.get_or_init(|| {
            let (sender, receiver) = tokio::sync::watch::channel(None);
            let spawned = std::thread::Builder::new()
                .name("tno-e2e-env".into())
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .enable_all()
                        .thread_name("tno-e2e-rt")
                        .build()
                    {
                        Ok(runtime) => runtime,
                        Err(source) => {
                            let error = E2eError::io("building the e2e runtime", source);
                            let _ = sender.send(Some(Err(Arc::new(error))));
                            return;
                        }
                    };
                    runtime.block_on(async move {
                        let started = async {
                            let kube = tno_testenv_kube::shared_with(options).await?;
                            E2eEnv::start(kube).await
                        }
                        .await;
                        let result = started.map(Arc::new).map_err(Arc::new);
                        if let Ok(env) = &result {
                            register_exit_teardown(env.clone());
                        }
                        let _ = sender.send(Some(result));
                        // Helpers may spawn onto this runtime; keep it for the process.
                        std::future::pending::<()>().await;
                    });
                });
            if let Err(source) = spawned {
                let error = E2eError::io("spawning the e2e environment thread", source);
                let (_, receiver) = tokio::sync::watch::channel(Some(Err(Arc::new(error))));
                return receiver;
            }
            receiver
        });
        let mut receiver = receiver.clone();
        let ready = receiver.wait_for(Option::is_some).await.map_err(|_| {
            Arc::new(E2eError::SharedStartFailed(
                "the environment thread ended before reporting".into(),
            ))
        })?;
        match &*ready {
            Some(result) => result.clone(),
            None => Err(Arc::new(E2eError::SharedStartFailed("no result".into()))),
        }
    }

    pub fn kube(&self) -> &Arc<KubeEnv> {
        &self.kube
    }

    pub fn tailnet(&self) -> &TailnetEnv {
        &self.tailnet
    }

    pub(crate) fn extra_records_slot(&self) -> ProjectionSlot {
        self.extra_records_slot.clone()
    }

    /// The one lab of both sides.
    pub fn lab(&self) -> &Arc<Lab> {
        self.kube.lab()
    }

    /// Scratch directory of the e2e helpers (operator logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long [`E2eEnv::start`] took (the tailnet side; see also
    /// [`KubeEnv::startup_time`]).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// `https://10.244.0.1:<port>`: Headscale as pods, the operator and tailnet nodes reach it
    /// (its `server_url`, and the Tailnet's `spec.server` in e2e tests).
    pub fn headscale_url(&self) -> String {
        self.tailnet.headscale.lab_url()
    }

    /// `https://127.0.0.1:<port>`: Headscale as the test process reaches it.
    pub fn headscale_root_url(&self) -> String {
        self.tailnet.headscale.root_url()
    }

    /// The Headscale admin API key. Never log it.
    pub fn api_key(&self) -> &str {
        self.tailnet.headscale.api_key()
    }

    /// A Headscale REST client for the test process (create one per test runtime).
    pub fn headscale_api(&self) -> HeadscaleApi {
        self.tailnet.headscale.api()
    }

    /// The cluster-admin kubeconfig for the root netns (`kubectl`, the test process).
    pub fn kubeconfig(&self) -> &Path {
        self.kube.kubeconfig()
    }

    /// The same credentials pointing at [`KubeEnv::api_server_url_in_lab`], for processes in
    /// the lab such as the operator.
    pub fn lab_kubeconfig(&self) -> &Path {
        &self.lab_kubeconfig
    }

    /// A fresh namespace (deleted on drop) that prints the kube diagnostics and the tailnet's
    /// log tails if the test panics.
    pub async fn namespace(&self, prefix: &str) -> Result<E2eNamespace<'_>> {
        let inner = self.kube.namespace(prefix).await?;
        Ok(E2eNamespace { env: self, inner })
    }

    /// The tailnet's base policy (tag owners `tag:router`, `tag:client`, `tag:server`,
    /// `group:team-a` = alice) plus [`PLATFORM_GROUP`] = admin, as JSON (valid HuJSON), for the
    /// operator's base-policy ConfigMap.
    pub fn base_policy(&self) -> Result<String> {
        let text = self.tailnet.base_policy()?;
        let mut policy: Value = serde_json::from_str(&text).map_err(|source| E2eError::Json {
            what: "the tailnet base policy".into(),
            source,
        })?;
        policy["groups"][PLATFORM_GROUP] = json!([format!("{}@", tno_testenv_tailnet::ADMIN_USER)]);
        serde_json::to_string_pretty(&policy).map_err(|source| E2eError::Json {
            what: "the e2e base policy".into(),
            source,
        })
    }

    /// Creates the operator's inputs in `namespace`: Secret [`BOOTSTRAP_SECRET`] with the API
    /// key under [`API_KEY_KEY`] and ConfigMap [`BASE_POLICY_CONFIG_MAP`] with `base_policy`
    /// under [`BASE_POLICY_KEY`].
    pub async fn create_bootstrap(
        &self,
        client: &kube::Client,
        namespace: &str,
        base_policy: &str,
    ) -> Result<()> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(BOOTSTRAP_SECRET.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                API_KEY_KEY.to_owned(),
                ByteString(self.api_key().as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|e| {
                E2eError::kube(format!("creating Secret {namespace}/{BOOTSTRAP_SECRET}"), e)
            })?;
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(BASE_POLICY_CONFIG_MAP.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                BASE_POLICY_KEY.to_owned(),
                base_policy.to_owned(),
            )])),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &config_map)
            .await
            .map_err(|e| {
                E2eError::kube(
                    format!("creating ConfigMap {namespace}/{BASE_POLICY_CONFIG_MAP}"),
                    e,
                )
            })?;
        self.create_server_ca(client, namespace).await
    }

    /// The ConfigMap [`SERVER_CA_CONFIG_MAP`] with the lab CA of Headscale's certificate.
    pub async fn create_server_ca(&self, client: &kube::Client, namespace: &str) -> Result<()> {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(SERVER_CA_CONFIG_MAP.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                tno_testenv_tailnet::LAB_CA_FILE.to_owned(),
                self.tailnet.headscale.ca_pem().to_owned(),
            )])),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &config_map)
            .await
            .map_err(|e| {
                E2eError::kube(
                    format!("creating ConfigMap {namespace}/{SERVER_CA_CONFIG_MAP}"),
                    e,
                )
            })?;
        Ok(())
    }

    /// A Tailnet object for this environment (apply it with server-side apply): `spec.server`
    /// is [`E2eEnv::headscale_url`] (HTTPS), `spec.serverCA` the lab CA's ConfigMap, the
    /// bootstrap names of [`E2eEnv::create_bootstrap`], tag
    /// owners [`PLATFORM_GROUP`], route approvers `tag:router`, ingress sources
    /// `group:team-a`. `mode` is `DryRun` or `Apply`.
    pub fn tailnet_object(&self, name: &str, mode: &str) -> Value {
        json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1",
            "kind": "Tailnet",
            "metadata": { "name": name },
            "spec": {
                "server": self.headscale_url(),
                "serverCA": { "configMapRef": {
                    "name": SERVER_CA_CONFIG_MAP,
                    "key": tno_testenv_tailnet::LAB_CA_FILE,
                } },
                "apiSecretRef": { "name": BOOTSTRAP_SECRET, "key": API_KEY_KEY },
                "dns": {
                    "hostsConfigMap": HOSTS_CONFIG_MAP,
                    "ingressNameTemplate": "{name}.{namespace}.lab.example.net",
                },
                "policy": {
                    "baseConfigMap": BASE_POLICY_CONFIG_MAP,
                    "mode": mode,
                    "tagOwners": [PLATFORM_GROUP],
                    "routeApprovers": [tno_testenv_tailnet::ROUTER_TAG],
                    "ingressSourceAllowlist": [tno_testenv_tailnet::TEAM_A_GROUP],
                },
            },
        })
    }

    /// The inputs of a Tailnet on another Headscale (e.g. a
    /// [`tno_testenv_tailnet::SecondHeadscale`]) in `namespace`: Secret
    /// `<BOOTSTRAP_SECRET>-<suffix>` with its API key under [`API_KEY_KEY`] and ConfigMap
    /// `<SERVER_CA_CONFIG_MAP>-<suffix>` with its CA. The base policy ConfigMap of
    /// [`E2eEnv::create_bootstrap`] serves both Tailnets.
    pub async fn create_server_inputs(
        &self,
        client: &kube::Client,
        namespace: &str,
        headscale: &Headscale,
        suffix: &str,
    ) -> Result<()> {
        let secret_name = format!("{BOOTSTRAP_SECRET}-{suffix}");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(secret_name.clone()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                API_KEY_KEY.to_owned(),
                ByteString(headscale.api_key().as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|e| E2eError::kube(format!("creating Secret {namespace}/{secret_name}"), e))?;
        let ca_name = format!("{SERVER_CA_CONFIG_MAP}-{suffix}");
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(ca_name.clone()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                tno_testenv_tailnet::LAB_CA_FILE.to_owned(),
                headscale.ca_pem().to_owned(),
            )])),
            ..ConfigMap::default()
        };
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &config_map)
            .await
            .map_err(|e| E2eError::kube(format!("creating ConfigMap {namespace}/{ca_name}"), e))?;
        Ok(())
    }

    /// [`E2eEnv::tailnet_object`] on another Headscale: its lab URL as `spec.server`, the
    /// Secret and CA ConfigMap of [`E2eEnv::create_server_inputs`] with `suffix`, and a hosts
    /// ConfigMap of its own (`<HOSTS_CONFIG_MAP>-<suffix>`).
    pub fn tailnet_object_on(
        &self,
        name: &str,
        mode: &str,
        headscale: &Headscale,
        suffix: &str,
    ) -> Value {
        let mut tailnet = self.tailnet_object(name, mode);
        let spec = &mut tailnet["spec"];
        spec["server"] = Value::from(headscale.lab_url());
        spec["serverCA"]["configMapRef"]["name"] =
            Value::from(format!("{SERVER_CA_CONFIG_MAP}-{suffix}"));
        spec["apiSecretRef"]["name"] = Value::from(format!("{BOOTSTRAP_SECRET}-{suffix}"));
        spec["dns"]["hostsConfigMap"] = Value::from(format!("{HOSTS_CONFIG_MAP}-{suffix}"));
        tailnet
    }

    /// Headscale's node with this hostname (given name or name).
    pub async fn node(&self, hostname: &str) -> Result<Node> {
        self.headscale_api()
            .list_nodes()
            .await?
            .into_iter()
            .find(|node| node.given_name == hostname || node.name == hostname)
            .ok_or_else(|| E2eError::UnknownNode {
                hostname: hostname.to_owned(),
            })
    }

    /// Sets the approved routes of the node `hostname` to exactly `routes`.
    pub async fn approve_routes(&self, hostname: &str, routes: &[&str]) -> Result<Node> {
        let node = self.node(hostname).await?;
        Ok(self.headscale_api().approve_routes(node.id, routes).await?)
    }

    /// Approves everything the remote site's router advertises
    /// ([`tno_testenv_tailnet::SITE_ROUTES`]); tests of the operator's own route approval
    /// should not call this.
    pub async fn approve_site_routes(&self) -> Result<Node> {
        let hostname = self.tailnet.site.router.hostname().to_owned();
        self.approve_routes(&hostname, &tno_testenv_tailnet::SITE_ROUTES)
            .await
    }

    /// Everything a failing test should print: component and container logs (of `namespace`
    /// only, if given) and the tailnet's log tails.
    pub fn diagnostics(&self, namespace: Option<&str>) -> String {
        format!(
            "{}\n{}",
            self.kube.diagnostics(namespace, 40),
            self.tailnet.log_report(&[])
        )
    }
}

/// A test namespace of the e2e environment: everything of [`TestNamespace`] (via `Deref`),
/// plus the tailnet's log tails on panic.
pub struct E2eNamespace<'env> {
    env: &'env E2eEnv,
    inner: TestNamespace<'env>,
}

impl<'env> E2eNamespace<'env> {
    pub fn e2e(&self) -> &'env E2eEnv {
        self.env
    }

    /// [`E2eEnv::create_bootstrap`] in this namespace.
    pub async fn create_bootstrap(&self, base_policy: &str) -> Result<()> {
        self.env
            .create_bootstrap(self.inner.client(), self.inner.name(), base_policy)
            .await
    }
}

impl<'env> std::ops::Deref for E2eNamespace<'env> {
    type Target = TestNamespace<'env>;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl Drop for E2eNamespace<'_> {
    fn drop(&mut self) {
        // The inner namespace prints the Kubernetes side right after this.
        if std::thread::panicking() {
            eprintln!(
                "==== tailnet logs (run {}) ====\n{}",
                self.env.tailnet.run_id,
                self.env.tailnet.log_report(&[])
            );
        }
    }
}

/// Writes `<admin kubeconfig dir>/admin-lab.kubeconfig`: the admin kubeconfig with every
/// cluster's `server` replaced by `server` (same CA and client certificate files).
pub(crate) fn write_lab_kubeconfig(admin: &Path, server: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(admin)
        .map_err(|e| E2eError::io(format!("reading {}", admin.display()), e))?;
    // YAML parses JSON too, whichever of the two the kube env writes.
    let mut config: Value = serde_yaml::from_str(&text).map_err(|source| E2eError::Kubeconfig {
        path: admin.to_owned(),
        source,
    })?;
    if let Some(clusters) = config["clusters"].as_array_mut() {
        for cluster in clusters {
            cluster["cluster"]["server"] = Value::from(server);
        }
    }
    let path = admin.with_file_name("admin-lab.kubeconfig");
    let text = serde_json::to_string_pretty(&config).map_err(|source| E2eError::Json {
        what: "the lab kubeconfig".into(),
        source,
    })?;
    std::fs::write(&path, text)
        .map_err(|e| E2eError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// At exit, the tailnet side goes first (this hook is registered after the kube env's, so it
/// runs before it); the kube env's own hook then removes the lab and the scratch directory.
fn register_exit_teardown(env: Arc<E2eEnv>) {
    static AT_EXIT: OnceLock<Arc<E2eEnv>> = OnceLock::new();
    if AT_EXIT.set(env).is_err() {
        return;
    }
    extern "C" fn teardown_at_exit() {
        if let Some(env) = AT_EXIT.get() {
            env.tailnet.teardown();
        }
    }
    // SAFETY: registers a plain function that only touches the static above.
    unsafe {
        libc::atexit(teardown_at_exit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_kubeconfig_keeps_credentials_and_replaces_the_server() {
        let dir = std::env::temp_dir().join(format!("tno-e2e-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let admin = dir.join("admin.kubeconfig");
        let original = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "tno", "cluster": {
                "server": "https://127.0.0.1:6443", "certificate-authority": "/pki/ca.crt"}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": "/pki/admin.crt", "client-key": "/pki/admin.key"}}],
            "contexts": [{"name": "tno", "context": {"cluster": "tno", "user": "admin"}}],
            "current-context": "tno",
        });
        std::fs::write(&admin, original.to_string()).expect("write admin kubeconfig");
        let path = write_lab_kubeconfig(&admin, "https://10.244.0.1:6443").expect("lab kubeconfig");
        let text = std::fs::read_to_string(&path).expect("read lab kubeconfig");
        let written: Value = serde_json::from_str(&text).expect("json");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some("admin-lab.kubeconfig")
        );
        assert_eq!(
            written["clusters"][0]["cluster"]["server"],
            "https://10.244.0.1:6443"
        );
        assert_eq!(
            written["clusters"][0]["cluster"]["certificate-authority"],
            "/pki/ca.crt"
        );
        assert_eq!(written["users"], original["users"]);
    }
}
