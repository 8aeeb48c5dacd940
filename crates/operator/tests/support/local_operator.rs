//! The operator as a plain process on the host, with its own kubeconfig (for tests without
//! the e2e lab, e.g. the Tailnet controller against the shared kube env).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The operator as a real process (what a Deployment would run), logging to a file.
pub struct LocalOperator {
    child: Child,
    pub log: PathBuf,
    pub admin: String,
}

impl LocalOperator {
    pub fn start(
        kubeconfig: &Path,
        namespace: &str,
        installation: &str,
        lease: &str,
        log_dir: &Path,
        name: &str,
    ) -> LocalOperator {
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
        LocalOperator {
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

impl Drop for LocalOperator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port outside the ephemeral range (see [`tno_netlab::ports`]).
pub fn free_port() -> u16 {
    tno_netlab::ports::free_tcp_port().expect("free port")
}
