//! Child processes of the environment: output goes to a log file, the process gets its own
//! process group (so helpers it starts stop with it) and dies with the test process.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tno_netlab::ChildProcess;

use crate::error::{Error, IoContext, NetlabContext, Result};

/// A running child in its own process group, with its log file. Dropping it kills the group.
///
/// Spawning goes through [`tno_netlab::ChildProcess`]: one process-wide spawner thread forks
/// every child, so `PR_SET_PDEATHSIG` fires only when the test process dies.
#[derive(Debug)]
pub struct ManagedProcess {
    inner: ChildProcess,
    group: Pid,
}

impl ManagedProcess {
    /// Spawns `command` (possibly already set up to enter namespaces), appending its stdout and
    /// stderr to `log_path`.
    pub fn spawn(name: &str, mut command: Command, log_path: &Path) -> Result<Self> {
        // Helpers the program starts (tailscaled under containerboot) stop with it.
        command.process_group(0);
        let inner = ChildProcess::spawn(name, command, log_path)
            .netlab_context(|| format!("starting {name}"))?;
        let group = Pid::from_raw(inner.pid() as i32);
        Ok(Self { inner, group })
    }

    pub fn name(&self) -> &str {
        self.inner.name()
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    pub fn log_path(&self) -> &Path {
        self.inner.log_path()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(self.inner.log_path(), lines)
    }

    /// `Some(status)` once the process has exited (and is reaped).
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.inner.exit_status().ok().flatten()
    }

    /// Waits for the process to exit (polls: the child is a std process, not a tokio one).
    pub async fn wait(&mut self) -> ExitStatus {
        loop {
            if let Some(status) = self.try_exited() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails with the log tail if the process has already exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.try_exited() {
            None => Ok(()),
            Some(status) => Err(Error::ProcessExited {
                component: self.name().to_string(),
                status: status.to_string(),
                log_tail: self.log_tail(40),
            }),
        }
    }

    /// Sends `signal` to the whole process group.
    pub fn signal(&self, signal: Signal) {
        // ESRCH only means the group is already gone.
        let _ = killpg(self.group, signal);
    }

    /// SIGTERM, then SIGKILL after `grace`: the kubelet's stop protocol.
    pub async fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::SIGTERM);
        let status = tokio::time::timeout(grace, self.wait()).await.ok();
        // Also reaches helpers left behind in the group.
        self.signal(Signal::SIGKILL);
        self.inner.kill();
        status.or_else(|| self.try_exited())
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// The last `lines` lines of a log file (reads at most the last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    const WINDOW: u64 = 64 * 1024;
    let Ok(mut file) = std::fs::File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|meta| meta.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free TCP port outside the ephemeral range, so a server restarted on it (the apiserver in
/// the fault tests) finds it free again (see [`tno_netlab::ports`]).
pub fn free_port() -> Result<u16> {
    tno_netlab::ports::free_tcp_port().io_context(|| "finding a free TCP port".into())
}

/// Polls `check` until it returns `Some`, or fails after `deadline` with `what`.
pub async fn poll_until<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if started.elapsed() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                seconds: deadline.as_secs(),
                details: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
