//! Shared pieces of the agent's integration tests: the real `tailnet-agent` binary in its own
//! network namespace (so it has a non-loopback "pod IP" and its own 127.0.0.1), a small PKI,
//! TLS clients and raw HTTP helpers. Needs root (network namespaces) and iproute2.

#![allow(dead_code)] // each test binary uses a different subset

pub mod backend;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use tno_netlab::{ChildProcess, Netns, RunId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The agent's "pod IP" inside its netns.
pub const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
pub const ADMIN_PORT: u16 = 9180;

/// The real binary, in a netns of its own. Killed (and the netns deleted) on drop.
pub struct Agent {
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub process: Option<ChildProcess>,
    pub netns: Netns,
    pub run: RunId,
}

impl Agent {
    /// A netns with loopback up and [`POD_IP`] (not the agent yet).
    pub fn netns(role: &str) -> (RunId, Netns, PathBuf) {
        let run = RunId::generate().unwrap_or_else(|e| panic!("run id: {e}"));
        let netns = Netns::create(run.netns_name(role)).unwrap_or_else(|e| panic!("netns: {e}"));
        netns
            .ip(&["addr", "add", &format!("{POD_IP}/32"), "dev", "lo"])
            .unwrap_or_else(|e| panic!("pod ip: {e}"));
        let dir = run.scratch_dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("scratch dir: {e}"));
        (run, netns, dir)
    }

    /// Writes `config` and starts the agent in a fresh netns.
    pub fn start(role: &str, config: &serde_json::Value, extra_args: &[&str]) -> Agent {
        let (run, netns, dir) = Agent::netns(role);
        let config_path = dir.join("config.json");
        write_json(&config_path, config);
        let mut agent = Agent {
            dir,
            config_path,
            process: None,
            netns,
            run,
        };
        agent.spawn(extra_args);
        agent
    }

    /// Starts the agent in an existing netns (e.g. one that hosts a tailscaled).
    pub fn start_in(
        run: RunId,
        netns: Netns,
        dir: PathBuf,
        config: &serde_json::Value,
        extra_args: &[&str],
    ) -> Agent {
        let config_path = dir.join("config.json");
        write_json(&config_path, config);
        let mut agent = Agent {
            dir,
            config_path,
            process: None,
            netns,
            run,
        };
        agent.spawn(extra_args);
        agent
    }

    /// The agent with one TLS `http` listener on 127.0.0.1:`port` serving `routes`, its
    /// certificate for `hostnames` from a fresh CA (returned for the clients), no tailscaled.
    pub fn start_https(
        role: &str,
        port: u16,
        hostnames: &[&str],
        routes: serde_json::Value,
    ) -> (Agent, Arc<Pki>) {
        let (run, netns, dir) = Agent::netns(role);
        let pki = Pki::new(&format!("{role} test CA"));
        let (cert, key) = pki.leaf(hostnames);
        std::fs::write(dir.join("tls.crt"), cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("tls.key"), key).unwrap_or_else(|e| panic!("{e}"));
        let config = serde_json::json!({
            "localapiSocket": dir.join("no-tailscaled.sock"),
            "adminPort": ADMIN_PORT,
            "ingress": [{"mode": "http", "port": port, "routes": routes}],
            "tls": {"certFile": dir.join("tls.crt"), "keyFile": dir.join("tls.key")},
        });
        let agent = Agent::start_in(run, netns, dir, &config, &[]);
        (agent, Arc::new(pki))
    }

    fn spawn(&mut self, extra_args: &[&str]) {
        self.spawn_with_pod_ip(&POD_IP.to_string(), extra_args);
    }

    pub fn spawn_with_pod_ip(&mut self, pod_ip: &str, extra_args: &[&str]) {
        let mut command: Command = self
            .netns
            .command(env!("CARGO_BIN_EXE_tailnet-agent"))
            .unwrap_or_else(|e| panic!("command: {e}"));
        command
            .arg("--config")
            .arg(&self.config_path)
            .args(["--log-format", "json", "--reload-interval-seconds", "1"])
            .args(extra_args)
            .env("POD_IP", pod_ip)
            .env("RUST_LOG", "info,tailnet_agent=debug");
        let process = ChildProcess::spawn("tailnet-agent", command, &self.log_path())
            .unwrap_or_else(|e| panic!("spawn agent: {e}"));
        self.process = Some(process);
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn rewrite_config(&self, config: &serde_json::Value) {
        // Write-then-rename, like kubelet's atomic ConfigMap update.
        let temporary = self.dir.join("config.json.new");
        write_json(&temporary, config);
        std::fs::rename(&temporary, &self.config_path).unwrap_or_else(|e| panic!("rename: {e}"));
    }

    pub fn pid(&self) -> i32 {
        let pid = self.process.as_ref().map_or(0, ChildProcess::pid);
        i32::try_from(pid).unwrap_or_else(|_| panic!("pid {pid}"))
    }

    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.process
            .as_mut()
            .and_then(|process| process.exit_status().ok().flatten())
    }

    /// Runs `test` on a tokio runtime whose sockets live in the agent's netns.
    pub fn run<F, Fut>(&self, test: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let outcome = self.netns.in_netns(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("runtime: {e}"));
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(test())))
        });
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(panic)) => {
                eprintln!("==== agent log ====\n{}", tail(&self.log(), 80));
                std::panic::resume_unwind(panic);
            }
            Err(error) => panic!("netns thread: {error}"),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("==== agent log ====\n{}", tail(&self.log(), 80));
        }
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn write_json(path: &Path, value: &serde_json::Value) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|e| panic!("json: {e}"));
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

pub fn admin_address() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(POD_IP), ADMIN_PORT)
}

/// `GET path` on the admin listener: (status, body).
pub async fn admin_get(path: &str) -> (u16, String) {
    raw_http(
        admin_address(),
        &format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"),
    )
    .await
    .unwrap_or_else(|e| panic!("admin {path}: {e}"))
}

/// Sends a raw HTTP/1.1 request over plain TCP and reads to EOF.
pub async fn raw_http(address: SocketAddr, request: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(address).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(parse_answer(&answer))
}

pub fn parse_answer(answer: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A metric sample's value from the admin listener (sum over matching series).
pub async fn metric(name: &str, label_filter: &[(&str, &str)]) -> f64 {
    let (_, body) = admin_get("/metrics").await;
    metric_in(&body, name, label_filter)
}

pub fn metric_in(body: &str, name: &str, label_filter: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.split(['{', ' ']).next() == Some(name)
                && label_filter
                    .iter()
                    .all(|(key, value)| line.contains(&format!("{key}=\"{value}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `check` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() > deadline {
            panic!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A CA and leaf certificates signed by it.
pub struct Pki {
    pub ca_pem: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("ca params: {e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("ca key: {e}"));
        let issuer =
            CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("ca cert: {e}"));
        Pki {
            ca_pem: issuer.pem(),
            issuer,
        }
    }

    /// (certificate PEM, key PEM) for `names`.
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap_or_else(|e| panic!("leaf params: {e}"));
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("leaf key: {e}"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("leaf cert: {e}"));
        (cert.pem(), key.serialize_pem())
    }

    /// A rustls client trusting only this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots
                .add(cert.unwrap_or_else(|e| panic!("ca pem: {e}")))
                .unwrap_or_else(|e| panic!("root: {e}"));
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("versions: {e}"))
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A rustls server config presenting a leaf for `names` (for HTTPS test backends).
    pub fn server_config(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let (cert, key) = self.leaf(names);
        let chain = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("chain: {e}"));
        let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
            .unwrap_or_else(|e| panic!("key: {e}"));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("versions: {e}"))
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap_or_else(|e| panic!("server cert: {e}"));
        Arc::new(config)
    }
}

use rustls_pki_types::pem::PemObject;

/// A TLS connection to `address` with SNI `server_name`.
pub async fn tls_connect(
    address: SocketAddr,
    server_name: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(address).await?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}
