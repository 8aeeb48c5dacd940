//! A real Headscale server for one test run: root netns, 127.0.0.1 with free ports, exposed in
//! the lab on the gateway address so tailscaled in any netns reaches it. It serves HTTPS with a
//! certificate of the run's own [`LabCa`] (for `127.0.0.1` and the lab gateway), as real
//! installations with a home or company CA do; its embedded DERP server rides on the same TLS
//! listener.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;
use tno_netlab::{ChildProcess, Lab, StunResponder, TcpForwarder};

use crate::api::HeadscaleApi;
use crate::binaries::Binaries;
use crate::error::{Result, TailnetError};
use crate::lab_ca::LabCa;

/// MagicDNS base domain of the test tailnet.
pub const BASE_DOMAIN: &str = "tailnet.test";
/// The remote site's DNS server (UDP), authoritative for [`SITE_DNS_ZONE`]; Headscale hands
/// it to every node as split DNS (`dns.nameservers.split`), so tailscaled resolves the zone
/// through the tailnet (the route to it must be approved and the node granted `udp:53`).
pub const SITE_DNS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 53), 53);
pub const SITE_DNS_ZONE: &str = "site.internal";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running Headscale (killed on drop) with an admin API key.
#[derive(Debug)]
pub struct Headscale {
    process: Mutex<ChildProcess>,
    _lab_forwarder: TcpForwarder,
    /// STUN at the gateway (Headscale's own STUN socket is not reachable from the lab).
    _lab_stun: StunResponder,
    binary: PathBuf,
    config_path: PathBuf,
    extra_records_path: PathBuf,
    port: u16,
    lab_gateway: Ipv4Addr,
    api_key: String,
    ca: LabCa,
}

/// The directory of Headscale's `dns.extra_records_path` (below its own directory): a
/// ConfigMap volume's layout, see [`Headscale::extra_records_dir`].
const EXTRA_RECORDS_DIR: &str = "extra-records";
/// The file in it, as the key `extra-records.json` of the operator's DNS ConfigMap.
pub const EXTRA_RECORDS_FILE: &str = "extra-records.json";

/// One entry of Headscale's `dns.extra_records_path` file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ExtraRecord {
    pub name: String,
    #[serde(rename = "type")]
    pub record_type: String,
    pub value: String,
}

impl ExtraRecord {
    /// An `A` record.
    pub fn a(name: impl Into<String>, ip: Ipv4Addr) -> Self {
        ExtraRecord {
            name: name.into(),
            record_type: "A".into(),
            value: ip.to_string(),
        }
    }
}

impl Headscale {
    /// Writes a config into `dir`, starts `headscale serve`, waits for `/health`, exposes the
    /// port on the lab gateway and creates an API key with the CLI.
    pub async fn start(binaries: &Binaries, lab: &Lab, dir: &Path) -> Result<Headscale> {
        std::fs::create_dir_all(dir)
            .map_err(|e| TailnetError::io(format!("creating {}", dir.display()), e))?;
        let port = free_tcp_port()?;
        let ca = LabCa::generate(&dir.join("ca"), "tno lab CA")?;
        let tls = ca.issue_server(
            dir,
            "headscale-tls",
            &["headscale.lab.test"],
            &[Ipv4Addr::LOCALHOST.into(), lab.gateway().into()],
        )?;
        let config = HeadscaleConfig {
            dir,
            tls_cert: &tls.cert,
            tls_key: &tls.key,
            port,
            lab_gateway: lab.gateway(),
            metrics_port: free_tcp_port()?,
            grpc_port: free_tcp_port()?,
            stun_port: free_udp_port()?,
        };
        let config_path = dir.join("config.yaml");
        write_file(&config_path, &config.render())?;
        // A ConfigMap volume's layout from the start (an empty list, as a ConfigMap the
        // operator has not filled yet): projections swap `..data` in this directory later.
        let extra_records_dir = dir.join(EXTRA_RECORDS_DIR);
        std::fs::create_dir_all(&extra_records_dir).map_err(|e| {
            TailnetError::io(format!("creating {}", extra_records_dir.display()), e)
        })?;
        let extra_records_path = extra_records_dir.join(EXTRA_RECORDS_FILE);
        write_records_volume(&extra_records_dir, "[]\n")?;

        let lab_forwarder = lab.expose_root_port(port)?;
        let lab_stun = lab.serve_stun(config.stun_port)?;
        let mut command = Command::new(&binaries.headscale);
        command.arg("-c").arg(&config_path).arg("serve");
        let process = ChildProcess::spawn("headscale", command, &dir.join("headscale.log"))?;
        let mut headscale = Headscale {
            process: Mutex::new(process),
            _lab_forwarder: lab_forwarder,
            _lab_stun: lab_stun,
            binary: binaries.headscale.clone(),
            config_path,
            extra_records_path,
            port,
            lab_gateway: lab.gateway(),
            api_key: String::new(),
            ca,
        };
        headscale.wait_healthy().await?;
        headscale.api_key = headscale.create_api_key().await?;
        Ok(headscale)
    }

    /// `https://127.0.0.1:<port>`: for the test process (root netns).
    pub fn root_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// `https://10.244.0.1:<port>`: Headscale's `server_url`, for tailscaled in any lab netns.
    pub fn lab_url(&self) -> String {
        format!("https://{}:{}", self.lab_gateway, self.port)
    }

    /// The lab CA that signed Headscale's certificate (PEM): what a Tailnet's `spec.serverCA`
    /// ConfigMap holds.
    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// The lab CA itself (to issue certificates for test proxies in front of Headscale).
    pub fn ca(&self) -> &LabCa {
        &self.ca
    }

    /// A directory holding only the lab CA's `ca.crt`: `SSL_CERT_DIR` of tailscaled.
    pub fn ca_dir(&self) -> &Path {
        self.ca.dir()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The admin API key (Bearer token for REST v1). Never log it.
    pub fn api_key(&self) -> &str {
        &self.api_key
    }

    /// A fresh REST client (create one per test; see [`HeadscaleApi::new`]).
    pub fn api(&self) -> HeadscaleApi {
        HeadscaleApi::with_ca(self.root_url(), self.api_key.clone(), self.ca_pem())
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The file named by `dns.extra_records_path`; Headscale watches it. It is the link
    /// `extra-records.json -> ..data/extra-records.json` of [`Self::extra_records_dir`].
    pub fn extra_records_path(&self) -> &Path {
        &self.extra_records_path
    }

    /// The directory holding [`Self::extra_records_path`], laid out as the kubelet lays out a
    /// ConfigMap volume mounted into a Headscale pod (`tno_atomic_writer`: timestamped
    /// directory, `..data` link, key link). A ConfigMap is projected into it (the kube side's
    /// `ConfigMapProjection`); nothing else may write it meanwhile.
    pub fn extra_records_dir(&self) -> &Path {
        self.extra_records_path.parent().unwrap_or(Path::new("."))
    }

    /// Replaces the extra DNS records as the kubelet updates a mounted ConfigMap (new data
    /// directory, `..data` swapped, old directory removed), for tests without a cluster.
    pub fn write_extra_records(&self, records: &[ExtraRecord]) -> Result<()> {
        let text = serde_json::to_string_pretty(records).map_err(TailnetError::Policy)?;
        write_records_volume(self.extra_records_dir(), &text)
    }

    /// Runs the `headscale` CLI against this server (e.g. `["policy", "check", "--file", …]`).
    pub async fn cli(&self, args: &[&str]) -> Result<String> {
        let mut command = tokio::process::Command::new(&self.binary);
        command.arg("-c").arg(&self.config_path).args(args);
        let description = format!("headscale {}", args.join(" "));
        let output = command
            .output()
            .await
            .map_err(|e| TailnetError::io(format!("running {description}"), e))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            return Err(TailnetError::CommandFailed {
                command: description,
                status: output.status,
                output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
            });
        }
        Ok(stdout)
    }

    /// The last lines of Headscale's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process().log_tail(lines)
    }

    pub fn log_path(&self) -> PathBuf {
        self.process().log_path().to_owned()
    }

    /// Kills the server now (also happens on drop).
    pub fn kill(&self) {
        self.process().kill();
    }

    /// Starts Headscale again after [`Headscale::kill`] (or while it runs: it is killed
    /// first) with the same config and database: same port, same nodes, same API key — what
    /// a crash or an upgrade looks like to its clients.
    pub async fn restart(&self) -> Result<()> {
        self.kill();
        let log = self.config_path.with_file_name("headscale.restarted.log");
        let mut command = Command::new(&self.binary);
        command.arg("-c").arg(&self.config_path).arg("serve");
        let process = ChildProcess::spawn("headscale", command, &log)?;
        *self.process() = process;
        self.wait_healthy().await
    }

    fn process(&self) -> std::sync::MutexGuard<'_, ChildProcess> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn wait_healthy(&self) -> Result<()> {
        let api = HeadscaleApi::with_ca(self.root_url(), String::new(), self.ca_pem());
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let last = match api.health().await {
                Ok(()) => return Ok(()),
                Err(error) => error.to_string(),
            };
            {
                let mut process = self.process();
                if let Some(status) = process.exit_status()? {
                    return Err(TailnetError::ExitedEarly {
                        process: "headscale".into(),
                        status,
                        log_tail: process.log_tail(40),
                    });
                }
            }
            if Instant::now() > deadline {
                return Err(TailnetError::Timeout {
                    what: "headscale /health".into(),
                    seconds: STARTUP_TIMEOUT.as_secs(),
                    last: format!("{last}\n{}", self.log_tail(40)),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn create_api_key(&self) -> Result<String> {
        let output = self
            // Headscale's default lifetime: a key that expires within 14 days is what the
            // chart's TailnetHeadscaleApiKeyExpiring alert is for, and the lab is healthy.
            .cli(&["apikeys", "create", "--expiration", "90d"])
            .await?;
        // The key is the last line printed; anything before it is log noise.
        output
            .lines()
            .map(str::trim)
            .rfind(|line| !line.is_empty())
            .filter(|line| !line.contains(' '))
            .map(str::to_owned)
            .ok_or(TailnetError::NoApiKey { output })
    }
}

struct HeadscaleConfig<'a> {
    dir: &'a Path,
    tls_cert: &'a Path,
    tls_key: &'a Path,
    port: u16,
    lab_gateway: Ipv4Addr,
    metrics_port: u16,
    grpc_port: u16,
    stun_port: u16,
}

impl HeadscaleConfig<'_> {
    /// Minimal Headscale 0.29 config: HTTPS (the lab CA's certificate), sqlite, database
    /// policy, embedded DERP (on the same TLS listener), MagicDNS with an extra-records file.
    fn render(&self) -> String {
        let path = |name: &str| quoted(&self.dir.join(name).to_string_lossy());
        let HeadscaleConfig {
            port,
            lab_gateway,
            metrics_port,
            grpc_port,
            stun_port,
            ..
        } = self;
        format!(
            r#"server_url: "https://{lab_gateway}:{port}"
listen_addr: "127.0.0.1:{port}"
tls_cert_path: {tls_cert}
tls_key_path: {tls_key}
metrics_listen_addr: "127.0.0.1:{metrics_port}"
grpc_listen_addr: "127.0.0.1:{grpc_port}"
grpc_allow_insecure: false
noise:
  private_key_path: {noise_key}
prefixes:
  v4: 100.64.0.0/10
  v6: fd7a:115c:a1e0::/48
  allocation: sequential
derp:
  server:
    enabled: true
    region_id: 999
    region_code: "headscale"
    region_name: "Headscale Embedded DERP"
    verify_clients: true
    stun_listen_addr: "127.0.0.1:{stun_port}"
    private_key_path: {derp_key}
    automatically_add_embedded_derp_region: true
    ipv4: "{lab_gateway}"
  urls: []
  paths: []
  auto_update_enabled: false
disable_check_updates: true
database:
  type: sqlite
  sqlite:
    path: {database}
    write_ahead_log: true
log:
  level: info
  format: text
policy:
  mode: database
dns:
  magic_dns: true
  base_domain: {BASE_DOMAIN}
  override_local_dns: false
  nameservers:
    global: []
    split:
      {split_zone}: ["{split_server}"]
  search_domains: []
  extra_records_path: {extra_records}
unix_socket: {socket}
unix_socket_permission: "0770"
logtail:
  enabled: false
"#,
            tls_cert = quoted(&self.tls_cert.to_string_lossy()),
            tls_key = quoted(&self.tls_key.to_string_lossy()),
            noise_key = path("noise_private.key"),
            derp_key = path("derp_server_private.key"),
            database = path("db.sqlite"),
            extra_records = quoted(
                &self
                    .dir
                    .join(EXTRA_RECORDS_DIR)
                    .join(EXTRA_RECORDS_FILE)
                    .to_string_lossy()
            ),
            socket = path("headscale.sock"),
            split_zone = SITE_DNS_ZONE,
            split_server = SITE_DNS.ip(),
        )
    }
}

/// A YAML double-quoted scalar (JSON string syntax is valid YAML).
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

/// `dir` holding only `extra-records.json` = `text`, written by the kubelet's `AtomicWriter`.
fn write_records_volume(dir: &Path, text: &str) -> Result<()> {
    let payload = tno_atomic_writer::Payload::from([(
        EXTRA_RECORDS_FILE.to_string(),
        tno_atomic_writer::FileProjection::new(text, 0o644),
    )]);
    tno_atomic_writer::AtomicWriter::new(dir)
        .and_then(|writer| writer.write(&payload))
        .map(|_| ())
        .map_err(TailnetError::RecordsVolume)
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)
        .map_err(|e| TailnetError::io(format!("writing {}", path.display()), e))
}

/// A free port outside the ephemeral range: Headscale restarts on it (see
/// [`tno_netlab::ports`]).
pub(crate) fn free_tcp_port() -> Result<u16> {
    tno_netlab::ports::free_tcp_port().map_err(|e| TailnetError::io("finding a free TCP port", e))
}

fn free_udp_port() -> Result<u16> {
    tno_netlab::ports::free_udp_port().map_err(|e| TailnetError::io("finding a free UDP port", e))
}
