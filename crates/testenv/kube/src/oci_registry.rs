//! The lab's OCI registry: `crane registry serve` (go-containerregistry, built by
//! `deps/build.sh crane`) on `127.0.0.1:<free port>`, blobs on disk in the run directory. The
//! test kubelet pulls every image whose reference names this registry (see
//! `kubelet::registry`); `helm push/install --plain-http` use it for charts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{Error, IoContext, Result};
use crate::process::{ManagedProcess, free_port, poll_until};

/// A running registry; dropping it stops the process.
#[derive(Debug)]
pub struct LabRegistry {
    process: ManagedProcess,
    host: String,
}

impl LabRegistry {
    /// Starts `crane registry serve --address 127.0.0.1:<port> --disk <dir>/blobs` and waits
    /// until `GET /v2/` answers.
    pub async fn start(crane: &Path, dir: &Path) -> Result<Self> {
        if !crane.is_file() {
            return Err(Error::MissingBinary {
                name: crane.display().to_string(),
                hint: "build it with deps/build.sh crane (or set TNO_BIN_CRANE)".into(),
            });
        }
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).io_context(|| format!("creating {}", blobs.display()))?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let mut command = Command::new(crane);
        command
            .args(["registry", "serve", "--address", &host, "--disk"])
            .arg(&blobs);
        let process = ManagedProcess::spawn("crane-registry", command, &dir.join("registry.log"))?;
        let registry = Self { process, host };
        let url = format!("http://{}/v2/", registry.host);
        poll_until(
            &format!("the registry at {url} to answer"),
            Duration::from_secs(20),
            || async {
                let (host, port) = registry.host.split_once(':')?;
                let port: u16 = port.parse().ok()?;
                tokio::net::TcpStream::connect((host, port)).await.ok()?;
                Some(())
            },
        )
        .await?;
        Ok(registry)
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}
