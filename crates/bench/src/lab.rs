//! The loopback lab of the data-plane benchmarks: one network namespace (its own 127.0.0.1
//! and a non-loopback "pod IP" for the agent's admin listener), the processes started in it,
//! and their memory.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tno_netlab::{ChildProcess, Netns, RunId};

/// The agent's pod IP inside the lab (its admin listener binds it; loopback is refused).
pub const POD_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 2);
pub const AGENT_ADMIN_PORT: u16 = 9180;

pub struct Lab {
    pub netns: Netns,
    pub dir: PathBuf,
    _run: RunId,
}

impl Lab {
    pub fn create(role: &str) -> Result<Lab> {
        let run = RunId::generate().context("run id")?;
        let netns = Netns::create(run.netns_name(role)).context("creating the lab netns")?;
        netns
            .ip(&["addr", "add", &format!("{POD_IP}/32"), "dev", "lo"])
            .context("adding the pod IP")?;
        // Short-connection loads open tens of thousands of connections.
        netns
            .set_sysctl("net.ipv4.ip_local_port_range", "1024 65000")
            .context("port range")?;
        let dir = run.scratch_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
        Ok(Lab {
            netns,
            dir,
            _run: run,
        })
    }

    /// Moves the calling thread (and the threads it starts later) into the lab.
    pub fn enter(&self) -> Result<()> {
        self.netns
            .enter_current_thread()
            .context("entering the lab netns")
    }

    /// Starts `program` in the lab, output to `<dir>/<name>.log`.
    pub fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<ChildProcess> {
        let mut command = self
            .netns
            .command(program)
            .with_context(|| format!("command {}", program.display()))?;
        command.args(args);
        for (key, value) in env {
            command.env(key, value);
        }
        ChildProcess::spawn(name, command, &self.dir.join(format!("{name}.log")))
            .with_context(|| format!("starting {name} ({})", program.display()))
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Waits until something accepts on `address` (from the calling thread's netns).
pub fn wait_for_port(address: SocketAddr, process: &mut ChildProcess) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = process.exit_status() {
            bail!(
                "{} exited ({status}) before listening on {address}:\n{}",
                process.name(),
                process.log_tail(30)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} does not listen on {address} after 20 s:\n{}",
                process.name(),
                process.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Resident memory of a process in KiB (`VmRSS`), 0 when it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "VmRSS:")
}

fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix(field)
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// The pids of `root` and all its descendants (nginx's workers, for one).
pub fn process_tree(root: u32) -> Vec<u32> {
    let mut tree = vec![root];
    let mut index = 0;
    while index < tree.len() {
        let parent = tree[index];
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        tree.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
        index += 1;
    }
    tree
}

/// Summed RSS of a process tree in KiB.
pub fn tree_rss_kib(root: u32) -> u64 {
    process_tree(root).into_iter().map(rss_kib).sum()
}

/// Samples the summed RSS of a process tree every 50 ms and keeps the peak.
pub struct RssPeak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssPeak {
    pub fn start(root: u32) -> RssPeak {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(tree_rss_kib(root), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        RssPeak {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    /// Stops sampling; the peak in KiB.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}
