//! The operator as a real process inside the lab, where a Deployment's pod would run it: it
//! reaches the apiserver and Headscale at their lab addresses, the same URLs pods use.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tno_netlab::{ChildProcess, Lab, TcpForwarder};

use crate::env::E2eEnv;
use crate::error::{E2eError, Result};

/// Port of the operator's admin server inside its netns (private to it, so always free).
const ADMIN_PORT: u16 = 8080;
/// How long [`OperatorProcess::terminate`] waits after SIGTERM before SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(20);

/// Agent image for e2e runs: the test kubelet maps any `*/tailnet-agent*` image to the
/// workspace's freshly built `target/<profile>/tailnet-agent`.
pub const E2E_AGENT_IMAGE: &str = "tno.local/tailnet-agent:workspace";
/// Tailscale image of the agents in e2e runs (the operator's default image's repository): the
/// test kubelet maps `*/tailnet-tailscaled` (any tag) to `deps/build.sh tailscale-minimal`'s
/// tailscaled, the program that image ships.
pub const E2E_TAILSCALE_IMAGE: &str = "ghcr.io/tailnet-operator/tailnet-tailscaled:from-deps";
/// Tailscale's official image (containerboot as entrypoint, `tailscaled` and `tailscale`):
/// the test kubelet maps `*/tailscale/tailscale` (any tag) to the full build of
/// `deps/versions.env`'s version.
pub const OFFICIAL_TAILSCALE_IMAGE: &str = "ghcr.io/tailscale/tailscale:from-deps";

/// The usual flags of `tailnet-operator run` in e2e tests; [`OperatorArgs::to_args`] gives the
/// argument list for [`E2eEnv::start_operator`] (which adds `--admin-address` itself).
#[derive(Clone, Debug)]
pub struct OperatorArgs {
    pub operator_namespace: String,
    pub installation_id: String,
    pub lease_name: String,
    pub identity: String,
    /// e.g. `2s`: fast enough that tests need not wait for the default 30 s.
    pub headscale_poll_interval: String,
    pub agent_image: String,
    pub tailscale_image: String,
    /// Appended as they are (e.g. `["--lease-duration", "6s"]`).
    pub extra: Vec<String>,
}

impl OperatorArgs {
    /// Defaults for an operator whose namespace is `operator_namespace`: installation id
    /// `e2e-<ns>`, lease `tailnet-operator-leader`, identity `operator-0`, poll every 2 s, the
    /// e2e images.
    pub fn new(operator_namespace: &str) -> Self {
        OperatorArgs {
            operator_namespace: operator_namespace.to_owned(),
            installation_id: format!("e2e-{operator_namespace}"),
            lease_name: "tailnet-operator-leader".into(),
            identity: "operator-0".into(),
            headscale_poll_interval: "2s".into(),
            agent_image: E2E_AGENT_IMAGE.into(),
            tailscale_image: E2E_TAILSCALE_IMAGE.into(),
            extra: Vec::new(),
        }
    }

    pub fn identity(mut self, identity: &str) -> Self {
        self.identity = identity.to_owned();
        self
    }

    /// `run --operator-namespace … --tailscale-image …` followed by [`OperatorArgs::extra`].
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--operator-namespace",
            &self.operator_namespace,
            "--installation-id",
            &self.installation_id,
            "--headscale-poll-interval",
            &self.headscale_poll_interval,
            "--lease-name",
            &self.lease_name,
            "--identity",
            &self.identity,
            "--agent-image",
            &self.agent_image,
            "--tailscale-image",
            &self.tailscale_image,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A running `tailnet-operator` in its own netns on the lab (killed and its netns removed on
/// drop; its log tail is printed if the test is panicking).
#[derive(Debug)]
pub struct OperatorProcess {
    name: String,
    // Field order is drop order: the process before the forwarder into its netns.
    process: ChildProcess,
    admin_forwarder: TcpForwarder,
    /// The lab files the operator's netns under its name.
    lab: Arc<Lab>,
    lab_ip: Ipv4Addr,
}

impl E2eEnv {
    /// Runs `binary` (tests pass `env!("CARGO_BIN_EXE_tailnet-operator")`) with `args` (e.g.
    /// [`OperatorArgs::to_args`]) plus `--admin-address <netns ip>:8080`, inside a new netns
    /// attached to the lab like a pod's, with `KUBECONFIG` = [`E2eEnv::lab_kubeconfig`] and
    /// `RUST_LOG` = `info,tailnet_operator=debug` unless the test process sets `RUST_LOG`.
    /// stdout and stderr go to `<run>/e2e/operator-<n>.log`; the admin server is forwarded to
    /// a root-netns `127.0.0.1` port ([`OperatorProcess::metrics_url`]).
    pub async fn start_operator(&self, binary: &Path, args: &[String]) -> Result<OperatorProcess> {
        self.start_operator_with_kubeconfig(binary, args, self.lab_kubeconfig())
            .await
    }

    /// [`E2eEnv::start_operator`] with the credentials of `kubeconfig` instead of the admin's
    /// (e.g. a ServiceAccount token, so the operator runs with exactly the chart's RBAC). Its
    /// server must be [`tno_testenv_kube::KubeEnv::api_server_url_in_lab`].
    pub async fn start_operator_with_kubeconfig(
        &self,
        binary: &Path,
        args: &[String],
        kubeconfig: &Path,
    ) -> Result<OperatorProcess> {
        let seq = self.next_operator.fetch_add(1, Ordering::Relaxed);
        let name = format!("operator-{seq}");
        let log_path = self.dir().join(format!("{name}.log"));
        spawn_operator(
            self.lab().clone(),
            name,
            binary,
            args,
            kubeconfig,
            &log_path,
        )
        .await
    }
}

/// Checks the arguments and runs the operator in a new netns on `lab` (see
/// [`E2eEnv::start_operator`]).
pub(crate) async fn spawn_operator(
    lab: Arc<Lab>,
    name: String,
    binary: &Path,
    args: &[String],
    kubeconfig: &Path,
    log_path: &Path,
) -> Result<OperatorProcess> {
    if args.iter().any(|arg| arg.starts_with("--admin-address")) {
        return Err(E2eError::OperatorArgs(
            "--admin-address is chosen by start_operator (the netns address)".into(),
        ));
    }
    if !binary.is_file() {
        return Err(E2eError::MissingBinary {
            name: binary.display().to_string(),
            hint: "build it first (cargo build -p tailnet-operator)".into(),
        });
    }
    let kubeconfig = kubeconfig.to_owned();
    let binary = binary.to_owned();
    let args = args.to_vec();
    let log_path = log_path.to_owned();
    // `ip` calls and fork/exec block; keep them off the test's async workers.
    tokio::task::spawn_blocking(move || {
        spawn_in_lab(lab, name, &binary, &args, &kubeconfig, &log_path)
    })
    .await
    .map_err(|e| E2eError::io("starting the operator", std::io::Error::other(e)))?
}

fn spawn_in_lab(
    lab: Arc<Lab>,
    name: String,
    binary: &Path,
    args: &[String],
    kubeconfig: &Path,
    log_path: &Path,
) -> Result<OperatorProcess> {
    // A pod-pool address: it cannot collide with pods or the tailnet side's fixed addresses.
    let pod = lab.add_pod_netns(&name)?;
    let admin = SocketAddr::V4(SocketAddrV4::new(pod.ip, ADMIN_PORT));
    let started = (|| {
        let mut command = pod.netns.command(binary)?;
        command
            .args(args)
            .arg("--admin-address")
            .arg(admin.to_string())
            .env("KUBECONFIG", kubeconfig)
            // Plain text in the log file, no ANSI colours.
            .env("NO_COLOR", "1")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,tailnet_operator=debug".into()),
            );
        // Not in a cluster, and nothing of the host's proxy settings applies inside the lab.
        for variable in [
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            command.env_remove(variable);
        }
        let forwarder = TcpForwarder::start(
            None,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            Some(&pod.netns),
            admin,
        )?;
        let process = ChildProcess::spawn(format!("tailnet-operator {name}"), command, log_path)?;
        Ok::<_, tno_netlab::NetlabError>((process, forwarder))
    })();
    match started {
        Ok((process, admin_forwarder)) => Ok(OperatorProcess {
            name,
            process,
            admin_forwarder,
            lab,
            lab_ip: pod.ip,
        }),
        Err(error) => {
            let _ = lab.remove_pod_netns(&name);
            Err(error.into())
        }
    }
}

impl OperatorProcess {
    /// `operator-<n>`, also the log file's stem.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The operator's address in the lab (its admin server listens on `<ip>:8080`).
    pub fn lab_ip(&self) -> Ipv4Addr {
        self.lab_ip
    }

    /// `http://127.0.0.1:<port>`: the admin server, forwarded into the root netns.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_forwarder.local_addr())
    }

    pub fn metrics_url(&self) -> String {
        format!("{}/metrics", self.admin_url())
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The whole log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.process.log_path()).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// `Some(status)` once the process has exited.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.process.exit_status()?)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.process.exit_status(), Ok(None))
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        let url = self.metrics_url();
        let admin_error = |source| E2eError::Admin {
            url: url.clone(),
            source,
        };
        reqwest::get(&url)
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(admin_error)?
            .text()
            .await
            .map_err(admin_error)
    }

    /// The value of the first sample line starting with `prefix` (name and labels), `None`
    /// if there is none or the admin server does not answer.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let text = self.metrics().await.ok()?;
        text.lines()
            .find(|line| line.starts_with(prefix))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse().ok())
    }

    /// Polls `/readyz` until it answers 200; fails early (with the log tail) if the process
    /// exits.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let url = format!("{}/readyz", self.admin_url());
        let started = tokio::time::Instant::now();
        loop {
            let last = match reqwest::get(&url).await {
                Ok(response) if response.status().is_success() => return Ok(()),
                Ok(response) => format!("HTTP {}", response.status()),
                Err(error) => error.to_string(),
            };
            if let Some(status) = self.exit_status()? {
                return Err(E2eError::Timeout {
                    what: format!("{} to become ready", self.name),
                    seconds: timeout.as_secs(),
                    last: format!("it exited ({status}); log tail:\n{}", self.log_tail(60)),
                });
            }
            if started.elapsed() >= timeout {
                return Err(E2eError::Timeout {
                    what: format!("{} to become ready", self.name),
                    seconds: timeout.as_secs(),
                    last: format!("{last}; log tail:\n{}", self.log_tail(60)),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, then waits up to 20 s for the exit (a graceful shutdown); SIGKILL and a
    /// `Timeout` error if it does not come.
    pub async fn terminate(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.exit_status()? {
            return Ok(status);
        }
        if let Ok(pid) = libc::pid_t::try_from(self.process.pid()) {
            // SAFETY: kill(2) has no memory-safety preconditions; the child is not reaped yet,
            // so the pid is still ours.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let started = tokio::time::Instant::now();
        while started.elapsed() < TERMINATE_GRACE {
            if let Some(status) = self.exit_status()? {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.process.kill();
        Err(E2eError::Timeout {
            what: format!("{} to exit after SIGTERM", self.name),
            seconds: TERMINATE_GRACE.as_secs(),
            last: format!("killed; log tail:\n{}", self.log_tail(40)),
        })
    }

    /// SIGKILL and reap (a crash, as far as Kubernetes and Headscale can tell).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== {} ({}) ====\n{}",
                self.name,
                self.log_path().display(),
                self.log_tail(80)
            );
        }
        self.process.kill();
        if let Err(error) = self.lab.remove_pod_netns(&self.name) {
            eprintln!("tno-testenv: removing the netns of {}: {error}", self.name);
        }
    }
}

/// Where `tailnet-operator` was built for tests that cannot use `CARGO_BIN_EXE_*` (it is only
/// set for the package's own tests): next to the running test binary, or `TNO_BIN_TAILNET_OPERATOR`.
pub fn workspace_operator_binary() -> Result<PathBuf> {
    const HINT: &str = "the e2e tests run the workspace's binaries: build them first with \
                        `cargo build --workspace --bins` (scripts/test.sh does)";
    let path =
        tno_testenv_kube::binaries::workspace_binary("tailnet-operator").map_err(|error| {
            E2eError::MissingBinary {
                name: "tailnet-operator".into(),
                hint: format!("{error}; {HINT}"),
            }
        })?;
    // TNO_BIN_TAILNET_OPERATOR is taken as given by the lookup; check it here.
    if !path.is_file() {
        return Err(E2eError::MissingBinary {
            name: "tailnet-operator".into(),
            hint: format!("{} is not a file; {HINT}", path.display()),
        });
    }
    Ok(path)
}
