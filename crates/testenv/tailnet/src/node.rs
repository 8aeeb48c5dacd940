//! Real tailscaled nodes inside a lab netns: userspace networking (the default) or a kernel
//! TUN device ([`TunMode::Kernel`]).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tno_netlab::{ChildProcess, Netns};

use crate::binaries::Binaries;
use crate::error::{Result, TailnetError};
use crate::localapi::{LocalApi, Status};

const SOCKET_TIMEOUT: Duration = Duration::from_secs(20);
const LOGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The TUN device of a [`TunMode::Kernel`] node (one per netns, so always this name).
pub const KERNEL_TUN_DEVICE: &str = "tailscale0";

/// How tailscaled carries a node's traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TunMode {
    /// `--tun=userspace-networking`: no device; other processes reach the tailnet only
    /// through the LocalAPI (`dial`), and connections to the node's tailnet IPs are delivered
    /// to its loopback.
    #[default]
    Userspace,
    /// `--tun=tailscale0`: a kernel TUN device in the node's netns with tailscaled's routes
    /// to the tailnet (policy table 52), so any process of that netns reaches tailnet IPs with
    /// plain sockets (a program that cannot use the LocalAPI, e.g. a conformance suite).
    /// tailscaled runs with `--accept-dns=false` in a private mount namespace whose
    /// `/etc/resolv.conf` is a copy: it can never rewrite the host's DNS configuration.
    Kernel,
}

/// How a node joins the tailnet.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Also the directory name under the run's `nodes/`.
    pub hostname: String,
    /// `https://10.244.0.1:<port>` ([`crate::Headscale::lab_url`]).
    pub login_server: String,
    /// A directory of CA certificates tailscaled trusts besides the system roots
    /// (`SSL_CERT_DIR`; [`crate::Headscale::ca_dir`] for the lab's HTTPS Headscale).
    pub server_ca_dir: Option<PathBuf>,
    pub auth_key: String,
    pub advertise_routes: Vec<String>,
    pub accept_routes: bool,
    pub tun: TunMode,
}

/// A running tailscaled (killed on drop) that has logged in.
#[derive(Debug)]
pub struct TailscaleNode {
    hostname: String,
    netns_name: String,
    state_dir: PathBuf,
    process: Mutex<ChildProcess>,
    local_api: LocalApi,
    /// How tailscaled reaches the control server (kept for restarts).
    control_env: Vec<(&'static str, String)>,
    tun: TunMode,
}

impl TailscaleNode {
    /// Starts tailscaled (in `config.tun` mode) inside `netns` with state and LocalAPI socket
    /// under `dir/<hostname>/`, runs `tailscale up` with the pre-auth key and waits until the
    /// backend is `Running` with a tailnet address.
    pub async fn start(
        binaries: &Binaries,
        netns: &Netns,
        dir: &Path,
        config: &NodeConfig,
    ) -> Result<TailscaleNode> {
        let state_dir = dir.join(&config.hostname);
        std::fs::create_dir_all(&state_dir)
            .map_err(|e| TailnetError::io(format!("creating {}", state_dir.display()), e))?;
        let socket = state_dir.join("tailscaled.sock");
        let control_env = control_env(config);
        let process = spawn_tailscaled(
            binaries,
            netns,
            &config.hostname,
            &state_dir,
            &control_env,
            config.tun,
        )?;
        let node = TailscaleNode {
            hostname: config.hostname.clone(),
            netns_name: netns.name().to_owned(),
            state_dir,
            process: Mutex::new(process),
            local_api: LocalApi::new(socket),
            control_env,
            tun: config.tun,
        };
        node.wait_for(SOCKET_TIMEOUT, "tailscaled LocalAPI socket", |_| true)
            .await?;
        node.up(binaries, config).await?;
        node.wait_for(
            LOGIN_TIMEOUT,
            "tailscaled Running with an address",
            |status| {
                status.backend_state == "Running"
                    && status
                        .tailscale_ips
                        .as_ref()
                        .is_some_and(|ips| !ips.is_empty())
            },
        )
        .await?;
        Ok(node)
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    pub fn netns_name(&self) -> &str {
        &self.netns_name
    }

    pub fn tun_mode(&self) -> TunMode {
        self.tun
    }

    /// tailscaled's process id (e.g. to look at its namespaces under `/proc`).
    pub fn pid(&self) -> u32 {
        self.process().pid()
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn local_api(&self) -> LocalApi {
        self.local_api.clone()
    }

    /// The node's first tailnet IPv4 address.
    pub async fn tailnet_ipv4(&self) -> Result<String> {
        let status = self.local_api.status().await?;
        status
            .tailscale_ips
            .unwrap_or_default()
            .into_iter()
            .find(|ip| ip.contains('.'))
            .ok_or_else(|| TailnetError::NoTailnetAddress {
                hostname: self.hostname.clone(),
            })
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process().log_tail(lines)
    }

    pub fn log_path(&self) -> PathBuf {
        self.process().log_path().to_owned()
    }

    /// Kills tailscaled now (also happens on drop).
    pub fn kill(&self) {
        self.process().kill();
    }

    /// Starts tailscaled again (after [`TailscaleNode::kill`]) from its state directory, as a
    /// device that is switched back on: no new login, the same node; waits until it is
    /// `Running` with an address.
    pub async fn restart(&self, binaries: &Binaries) -> Result<()> {
        self.kill();
        let netns = Netns::adopt(self.netns_name.clone());
        let process = spawn_tailscaled(
            binaries,
            &netns,
            &self.hostname,
            &self.state_dir,
            &self.control_env,
            self.tun,
        )?;
        *self.process() = process;
        self.wait_for(LOGIN_TIMEOUT, "tailscaled Running again", |status| {
            status.backend_state == "Running"
                && status
                    .tailscale_ips
                    .as_ref()
                    .is_some_and(|ips| !ips.is_empty())
        })
        .await?;
        Ok(())
    }

    /// Runs `tailscale set <args>` against this node, as an admin on it would (e.g.
    /// `--advertise-routes=` withdraws every advertised route).
    pub async fn tailscale_set(&self, binaries: &Binaries, args: &[&str]) -> Result<()> {
        let output = tokio::process::Command::new(&binaries.tailscale)
            .arg(format!("--socket={}", self.local_api.socket().display()))
            .arg("set")
            .args(args)
            .output()
            .await
            .map_err(|e| TailnetError::io("running tailscale set", e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(TailnetError::CommandFailed {
            command: format!("tailscale set {} ({})", args.join(" "), self.hostname),
            status: output.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }

    /// Polls the LocalAPI status until `ready` holds, failing early if tailscaled exits.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Status) -> bool,
    ) -> Result<Status> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.local_api.status().await {
                Ok(status) if ready(&status) => return Ok(status),
                Ok(status) => format!(
                    "state {} health {:?}",
                    status.backend_state,
                    status.health.unwrap_or_default()
                ),
                Err(error) => error.to_string(),
            };
            self.fail_if_exited()?;
            if Instant::now() > deadline {
                return Err(TailnetError::Timeout {
                    what: format!("{what} ({})", self.hostname),
                    seconds: timeout.as_secs(),
                    last: format!("{last}\n{}", self.log_tail(30)),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn up(&self, binaries: &Binaries, config: &NodeConfig) -> Result<()> {
        let mut command = tokio::process::Command::new(&binaries.tailscale);
        command
            .arg(format!("--socket={}", self.local_api.socket().display()))
            .arg("up")
            .arg(format!("--login-server={}", config.login_server))
            .arg(format!("--authkey={}", config.auth_key))
            .arg(format!("--hostname={}", config.hostname))
            .arg(format!("--accept-routes={}", config.accept_routes))
            .arg(format!("--timeout={}s", LOGIN_TIMEOUT.as_secs()));
        if config.tun == TunMode::Kernel {
            // A kernel-mode node would otherwise configure the OS resolver (MagicDNS).
            command.arg("--accept-dns=false");
        }
        if !config.advertise_routes.is_empty() {
            command.arg(format!(
                "--advertise-routes={}",
                config.advertise_routes.join(",")
            ));
        }
        let output = command
            .output()
            .await
            .map_err(|e| TailnetError::io("running tailscale up", e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(TailnetError::CommandFailed {
            // Not the full command line: it carries the auth key.
            command: format!("tailscale up ({})", config.hostname),
            status: output.status,
            output: format!(
                "{}{}\ntailscaled log:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                self.log_tail(30)
            ),
        })
    }

    fn fail_if_exited(&self) -> Result<()> {
        let mut process = self.process();
        match process.exit_status()? {
            Some(status) => Err(TailnetError::ExitedEarly {
                process: process.name().to_owned(),
                status,
                log_tail: process.log_tail(40),
            }),
            None => Ok(()),
        }
    }

    fn process(&self) -> MutexGuard<'_, ChildProcess> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The environment that lets tailscaled trust the control server: the CA directory as
/// `SSL_CERT_DIR` (Go's crypto/x509 reads every file there besides the system bundle); for a
/// plain-http server `TS_DEBUG_USE_DERP_HTTP=1`, as its embedded DERP then has no TLS either.
fn control_env(config: &NodeConfig) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(dir) = &config.server_ca_dir {
        env.push(("SSL_CERT_DIR", dir.display().to_string()));
    }
    if config.login_server.starts_with("http://") {
        env.push(("TS_DEBUG_USE_DERP_HTTP", "1".to_owned()));
    }
    env
}

/// The `--tun` value of tailscaled for `mode`.
fn tun_flag(mode: TunMode) -> String {
    match mode {
        TunMode::Userspace => "--tun=userspace-networking".to_owned(),
        TunMode::Kernel => format!("--tun={KERNEL_TUN_DEVICE}"),
    }
}

/// tailscaled in `netns` (`--tun` by `tun`) with its state and socket in `state_dir`, logging
/// to `state_dir/tailscaled.log` (appended). A kernel-mode one gets its private
/// `/etc/resolv.conf` ([`private_resolv_conf`]).
fn spawn_tailscaled(
    binaries: &Binaries,
    netns: &Netns,
    hostname: &str,
    state_dir: &Path,
    control_env: &[(&'static str, String)],
    tun: TunMode,
) -> Result<ChildProcess> {
    let socket = state_dir.join("tailscaled.sock");
    let mut command = netns.command(&binaries.tailscaled)?;
    if tun == TunMode::Kernel {
        private_resolv_conf(&mut command, state_dir)?;
    }
    command
        .arg(tun_flag(tun))
        .arg(format!("--statedir={}", state_dir.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg("--port=0")
        .arg("--no-logs-no-support")
        .envs(control_env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("TS_NO_LOGS_NO_SUPPORT", "true");
    Ok(ChildProcess::spawn(
        format!("tailscaled {hostname}"),
        command,
        &state_dir.join("tailscaled.log"),
    )?)
}

/// Starts `command` in a mount namespace of its own in which `/etc/resolv.conf` is a bind
/// mount of `<state_dir>/resolv.conf` (a copy of the host's): tailscaled's DNS manager
/// (direct mode: it renames files over `/etc/resolv.conf` and restores backups on exit)
/// cannot change the host's resolver, whatever its configuration says.
fn private_resolv_conf(command: &mut std::process::Command, state_dir: &Path) -> Result<()> {
    const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";
    let copy = state_dir.join("resolv.conf");
    let host = std::fs::read(HOST_RESOLV_CONF).unwrap_or_default();
    std::fs::write(&copy, host)
        .map_err(|e| TailnetError::io(format!("writing {}", copy.display()), e))?;
    let nul = |what: &Path| {
        CString::new(what.as_os_str().as_bytes()).map_err(|e| {
            TailnetError::io(
                format!("path {} has a NUL byte", what.display()),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })
    };
    let source = nul(&copy)?;
    let target = nul(Path::new(HOST_RESOLV_CONF))?;
    let root = nul(Path::new("/"))?;
    // SAFETY: between fork and exec the closure only makes the syscalls unshare(2) and
    // mount(2) (async-signal-safe) on C strings allocated before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Nothing mounted here propagates back to the host's namespace.
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                private,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tun_flag_names_the_device_or_userspace_networking() {
        assert_eq!(tun_flag(TunMode::Userspace), "--tun=userspace-networking");
        assert_eq!(tun_flag(TunMode::Kernel), "--tun=tailscale0");
        assert_eq!(TunMode::default(), TunMode::Userspace);
    }
}
