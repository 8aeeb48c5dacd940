//! Helpers of the operator's real-environment tests: running the operator binary against the
//! test apiserver and Headscale, polling conditions, scraping metrics.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The operator as a real process (what a Deployment would run), logging to a file.
pub struct OperatorProcess {
    child: Child,
    pub log: PathBuf,
    pub admin: String,
}

impl OperatorProcess {
    pub fn start(
        kubeconfig: &Path,
        namespace: &str,
        installation: &str,
        lease: &str,
        log_dir: &Path,
        name: &str,
    ) -> OperatorProcess {
        let port = free_port();
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("operator log file");
        let child = Command::new(env!("CARGO_BIN_EXE_tailnet-operator"))
            .args([
                "run",
                "--operator-namespace",
                namespace,
                "--installation-id",
                installation,
            ])
            .args(["--admin-address", &format!("127.0.0.1:{port}")])
            .args([
                "--headscale-poll-interval",
                "2s",
                "--headscale-timeout",
                "3s",
            ])
            .args([
                "--lease-name",
                lease,
                "--lease-duration",
                "6s",
                "--identity",
                name,
            ])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,tailnet_operator=debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start tailnet-operator");
        OperatorProcess {
            child,
            log,
            admin: format!("http://127.0.0.1:{port}"),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The value of a metric sample line starting with `prefix` (name and labels).
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.admin))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `check` until it returns `Some`, or fails with `what` and the last observation.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(observed) => observed,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {timeout:?} waiting for {what}; last observed: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn describe(conditions: &[Condition]) -> String {
    conditions
        .iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join("\n")
}
