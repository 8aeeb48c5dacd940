//! etcd, kube-apiserver and kube-controller-manager on 127.0.0.1 in the root netns.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::Binaries;
use crate::error::{Error, IoContext, Result};
use crate::network::ClusterNetwork;
use crate::pki::{self, ClusterCa};
use crate::process::{ManagedProcess, free_port, poll_until};

// The first cluster's addresses live with [`ClusterNetwork`]; kept here under their old path.
pub use crate::network::{CLUSTER_CIDR, KUBERNETES_SERVICE_IP, SERVICE_CIDR};
/// Issuer of service-account tokens; also what `TokenReview`s check.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

const STARTUP_DEADLINE: Duration = Duration::from_secs(180);

/// A running control plane. Dropping it kills its processes.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub ca: ClusterCa,
    /// The apiserver's port, on 127.0.0.1 and (through the lab's forwarder) on the gateway.
    pub api_port: u16,
    pub admin_kubeconfig: PathBuf,
    pub service_account_key: pki::ServiceAccountKey,
    etcd: ManagedProcess,
    apiserver: ManagedProcess,
    /// How the apiserver was started, so [`restart_apiserver`] can start it the same way.
    apiserver_binary: PathBuf,
    apiserver_args: Vec<String>,
    controller_manager: ManagedProcess,
}

impl ControlPlane {
    /// Starts the control plane in `dir`. `advertise_address` is the address pods reach the
    /// apiserver at (the lab gateway): it becomes the `kubernetes` Service's endpoint.
    pub async fn start(
        bins: &Binaries,
        dir: &Path,
        advertise_address: Ipv4Addr,
        network: &ClusterNetwork,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).io_context(|| format!("creating {dir:?}"))?;
        let pki_dir = dir.join("pki");
        std::fs::create_dir_all(&pki_dir).io_context(|| format!("creating {pki_dir:?}"))?;
        let ca = ClusterCa::generate(&pki_dir)?;
        let serving = ca.issue_server(
            &pki_dir,
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(advertise_address),
                IpAddr::V4(network.kubernetes_service_ip),
            ],
        )?;
        let service_account_key = pki::generate_service_account_key(&pki_dir)?;

        let (etcd, etcd_port) = start_etcd(&bins.etcd, dir).await?;
        let api_port = free_port()?;
        let controller_manager_port = free_port()?;
        let server = format!("https://127.0.0.1:{api_port}");

        let admin_cert = ca.issue_client(&pki_dir, "admin", "tno-admin", &["system:masters"])?;
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        pki::write_kubeconfig(
            &admin_kubeconfig,
            &server,
            &ca.files.cert,
            &admin_cert,
            "tno-admin",
        )?;

        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--advertise-address={advertise_address}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving.cert.display()),
            format!("--tls-private-key-file={}", serving.key.display()),
            format!("--client-ca-file={}", ca.files.cert.display()),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!(
                "--service-account-key-file={}",
                service_account_key.public.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                service_account_key.private.display()
            ),
            format!("--service-cluster-ip-range={}", network.service_cidr),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        let mut apiserver_cmd = Command::new(&bins.kube_apiserver);
        apiserver_cmd.args(&apiserver_args);
        let mut apiserver = ManagedProcess::spawn(
            "kube-apiserver",
            apiserver_cmd,
            &dir.join("kube-apiserver.log"),
        )?;

        let admin = client_from_kubeconfig(&admin_kubeconfig).await?;
        wait_for_readyz(&admin, &mut apiserver).await?;

        let kcm_cert = ca.issue_client(
            &pki_dir,
            "kube-controller-manager",
            "system:kube-controller-manager",
            &[],
        )?;
        let kcm_kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        pki::write_kubeconfig(
            &kcm_kubeconfig,
            &server,
            &ca.files.cert,
            &kcm_cert,
            "system:kube-controller-manager",
        )?;
        let mut kcm_cmd = Command::new(&bins.kube_controller_manager);
        let kcm_kubeconfig_arg = kcm_kubeconfig.display().to_string();
        kcm_cmd.args([
            &format!("--kubeconfig={kcm_kubeconfig_arg}"),
            &format!("--authentication-kubeconfig={kcm_kubeconfig_arg}"),
            &format!("--authorization-kubeconfig={kcm_kubeconfig_arg}"),
            "--bind-address=127.0.0.1",
            &format!("--secure-port={controller_manager_port}"),
            &format!("--cert-dir={}", dir.join("kcm-certs").display()),
            "--controllers=*",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            &format!("--root-ca-file={}", ca.files.cert.display()),
            &format!(
                "--service-account-private-key-file={}",
                service_account_key.private.display()
            ),
            &format!("--cluster-signing-cert-file={}", ca.files.cert.display()),
            &format!("--cluster-signing-key-file={}", ca.files.key.display()),
            &format!("--service-cluster-ip-range={}", network.service_cidr),
            &format!("--cluster-cidr={}", network.pod_cidr),
            &format!("--cluster-name={}", network.cluster_name),
        ]);
        let controller_manager = ManagedProcess::spawn(
            "kube-controller-manager",
            kcm_cmd,
            &dir.join("kube-controller-manager.log"),
        )?;

        let mut control_plane = Self {
            dir: dir.to_path_buf(),
            ca,
            api_port,
            admin_kubeconfig,
            service_account_key,
            etcd,
            apiserver,
            apiserver_binary: bins.kube_apiserver.clone(),
            apiserver_args,
            controller_manager,
        };
        control_plane.wait_for_controllers(&admin).await?;
        Ok(control_plane)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// A client with cluster-admin rights (group `system:masters`).
    pub async fn admin_client(&self) -> Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// Issues a client certificate for `user` in `groups` and writes a kubeconfig for it.
    pub fn kubeconfig_for(&self, file_stem: &str, user: &str, groups: &[&str]) -> Result<PathBuf> {
        self.kubeconfig_for_server(file_stem, user, groups, &self.server_url())
    }

    /// Like [`Self::kubeconfig_for`], pointing at another URL of the same apiserver.
    pub fn kubeconfig_for_server(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
        server: &str,
    ) -> Result<PathBuf> {
        let pki_dir = self.dir.join("pki");
        let cert = self.ca.issue_client(&pki_dir, file_stem, user, groups)?;
        let path = self.dir.join(format!("{file_stem}.kubeconfig"));
        pki::write_kubeconfig(&path, server, &self.ca.files.cert, &cert, user)?;
        Ok(path)
    }

    /// Fails with a log tail if a component died.
    pub fn check_alive(&mut self) -> Result<()> {
        self.etcd.ensure_running()?;
        self.apiserver.ensure_running()?;
        self.controller_manager.ensure_running()
    }

    /// The apiserver's process id (changes with [`restart_apiserver`]).
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.pid()
    }

    /// Starts the apiserver again with the same flags (same port, certificates and etcd);
    /// the old process must have exited. Its output is appended to the same log.
    fn respawn_apiserver(&mut self) -> Result<()> {
        let mut command = Command::new(&self.apiserver_binary);
        command.args(&self.apiserver_args);
        let log = self.apiserver.log_path().to_owned();
        self.apiserver = ManagedProcess::spawn("kube-apiserver", command, &log)?;
        Ok(())
    }

    /// Process ids (and process groups) of the components.
    pub fn pids(&self) -> Vec<u32> {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .iter()
            .map(|process| process.pid())
            .collect()
    }

    /// Log tails of all components, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .iter()
            .map(|process| {
                format!(
                    "----- {} ({}) -----\n{}",
                    process.name(),
                    process.log_path().display(),
                    process.log_tail(lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The controller-manager is up once the token and root-CA publishers have done their work
    /// in `default`: every later namespace needs them before pods can start.
    async fn wait_for_controllers(&mut self, admin: &kube::Client) -> Result<()> {
        let service_accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
        let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
        let result = poll_until(
            "kube-controller-manager to publish the default ServiceAccount and kube-root-ca.crt",
            STARTUP_DEADLINE,
            || async {
                let sa = service_accounts.get_opt("default").await.ok().flatten();
                let ca = config_maps.get_opt("kube-root-ca.crt").await.ok().flatten();
                (sa.is_some() && ca.is_some()).then_some(())
            },
        )
        .await;
        self.with_logs_on_error(result)
    }

    fn with_logs_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        match result {
            Err(Error::Timeout { what, seconds, .. }) => {
                self.check_alive()?;
                Err(Error::Timeout {
                    what,
                    seconds,
                    details: format!("\n{}", self.log_tails(30)),
                })
            }
            other => other,
        }
    }
}

/// Restarts the apiserver of `control_plane` as an operator would: SIGTERM, SIGKILL after
/// `grace`, start it again with the same flags (etcd keeps every object), wait for
/// `/readyz`. The lock is only held for moments, so others can use the control plane (and
/// fail to reach the apiserver) meanwhile. Returns how long the apiserver was unavailable.
pub async fn restart_apiserver(
    control_plane: &std::sync::Mutex<ControlPlane>,
    grace: Duration,
) -> Result<Duration> {
    let started = tokio::time::Instant::now();
    stop_apiserver(control_plane, grace).await;
    start_apiserver(control_plane).await?;
    Ok(started.elapsed())
}

/// Stops the apiserver of `control_plane` (SIGTERM, SIGKILL after `grace`) and returns once
/// it has exited; etcd, the controller-manager and everything in the lab keep running.
pub async fn stop_apiserver(control_plane: &std::sync::Mutex<ControlPlane>, grace: Duration) {
    let lock = || {
        control_plane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let started = tokio::time::Instant::now();
    lock().apiserver.signal(nix::sys::signal::Signal::SIGTERM);
    let mut killed = false;
    while lock().apiserver.try_exited().is_none() {
        if !killed && started.elapsed() >= grace {
            lock().apiserver.signal(nix::sys::signal::Signal::SIGKILL);
            killed = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Starts the apiserver stopped by [`stop_apiserver`] again with the same flags (same port,
/// certificates and etcd) and waits for `/readyz`; returns how long that took.
pub async fn start_apiserver(control_plane: &std::sync::Mutex<ControlPlane>) -> Result<Duration> {
    let lock = || {
        control_plane
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    let started = tokio::time::Instant::now();
    lock().respawn_apiserver()?;
    let admin_kubeconfig = lock().admin_kubeconfig.clone();
    let admin = client_from_kubeconfig(&admin_kubeconfig).await?;
    loop {
        lock().apiserver.ensure_running()?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|source| Error::Setup {
                what: "kube-apiserver".into(),
                reason: format!("building the /readyz request: {source}"),
            })?;
        let last_answer = match admin.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(started.elapsed()),
            Ok(body) => body,
            Err(error) => error.to_string(),
        };
        if started.elapsed() > STARTUP_DEADLINE {
            return Err(Error::Timeout {
                what: "kube-apiserver /readyz after a restart".into(),
                seconds: STARTUP_DEADLINE.as_secs(),
                details: format!(
                    "; last answer: {last_answer}\n{}",
                    lock().apiserver.log_tail(30)
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    kube::Client::try_from(config).map_err(Error::ClientBuild)
}

/// etcd on two probed ports. Another process can take a probed port before etcd binds it
/// (`free_port`'s race, seen when test groups run side by side): a start that fails with
/// "address already in use" is retried on fresh ports and a fresh data directory, up to three
/// times. Returns etcd and its client port.
async fn start_etcd(binary: &Path, dir: &Path) -> Result<(ManagedProcess, u16)> {
    let mut attempt = 1;
    loop {
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let data_dir = if attempt == 1 {
            dir.join("etcd-data")
        } else {
            dir.join(format!("etcd-data-{attempt}"))
        };
        let mut cmd = Command::new(binary);
        cmd.args([
            "--name=tno",
            &format!("--data-dir={}", data_dir.display()),
            &format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=tno=http://127.0.0.1:{peer_port}"),
            // A throwaway store: durability costs time and buys nothing here.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        let mut etcd = ManagedProcess::spawn("etcd", cmd, &dir.join("etcd.log"))?;
        match wait_for_tcp(&mut etcd, client_port).await {
            Ok(()) => return Ok((etcd, client_port)),
            Err(error) if attempt < 3 && error.to_string().contains("address already in use") => {
                tracing::warn!(attempt, %error, "etcd lost a probed port; retrying on fresh ports");
                drop(etcd);
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

async fn wait_for_tcp(process: &mut ManagedProcess, port: u16) -> Result<()> {
    let started = tokio::time::Instant::now();
    loop {
        process.ensure_running()?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if started.elapsed() > STARTUP_DEADLINE {
            return Err(Error::Timeout {
                what: format!("{} to listen on port {port}", process.name()),
                seconds: STARTUP_DEADLINE.as_secs(),
                details: format!("\n{}", process.log_tail(30)),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_readyz(client: &kube::Client, apiserver: &mut ManagedProcess) -> Result<()> {
    let started = tokio::time::Instant::now();
    loop {
        apiserver.ensure_running()?;
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|source| Error::Setup {
                what: "kube-apiserver".into(),
                reason: format!("building the /readyz request: {source}"),
            })?;
        let last_answer = match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(error) => error.to_string(),
        };
        if started.elapsed() > STARTUP_DEADLINE {
            return Err(Error::Timeout {
                what: "kube-apiserver /readyz".into(),
                seconds: STARTUP_DEADLINE.as_secs(),
                details: format!("; last answer: {last_answer}\n{}", apiserver.log_tail(30)),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
