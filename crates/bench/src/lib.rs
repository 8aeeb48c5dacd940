//! Benchmarks of tailnet-operator (issue 8), run by `cargo xtask bench`.
//!
//! Every benchmark measures the project's component and its baselines side by side in one
//! run (interleaved, repeated), so the ratios hold even on a shared, noisy machine. Nothing
//! here asserts speed; every workload checks that its bytes and requests arrived, which is
//! what the CI smoke ([`Settings::smoke`]) relies on.
//!
//! - [`control`]: the operator at scale against the real apiserver and Headscale, and the
//!   policy renderer;
//! - [`egress`]: the agent's TCP forwarder against socat and a direct connection (loopback);
//! - [`ingress`]: the agent's TLS termination + reverse proxy against nginx and Caddy;
//! - [`tailnet`]: pod → agent → tailscaled → remote site, against a direct LocalAPI dial;
//! - [`startup`]: apply → each step, Ready and first byte of an egress and an ingress,
//!   against a baseline build;
//! - [`lab`]: the network namespace, processes and their memory;
//! - [`tcpload`], [`httpload`]: the backends and load generators.

pub mod control;
pub mod egress;
pub mod footprint;
pub mod forwarding_headers;
pub mod httpload;
pub mod hyper_floor;
pub mod ingress;
pub mod lab;
pub mod raw_backend;
pub mod report;
pub mod startup;
pub mod stats;
pub mod tailnet;
pub mod tcpload;

use std::path::PathBuf;
use std::time::Duration;

/// How big and how often; the CI smoke uses tiny values.
#[derive(Clone, Debug)]
pub struct Settings {
    pub repeat: usize,
    /// Bytes of the single-stream transfer (and the total of the parallel one).
    pub stream_bytes: u64,
    pub parallel_streams: usize,
    /// How long each rate or keep-alive load runs.
    pub load_duration: Duration,
    pub ping_pongs: usize,
    /// Bytes of the HTTPS download.
    pub download_bytes: u64,
    pub http_connections: Vec<usize>,
    pub agent: PathBuf,
    /// Another agent build (e.g. of the previous commit), measured in the same run as an
    /// extra column of the data-plane benchmarks: before/after ratios from one run.
    pub baseline_agent: Option<PathBuf>,
    /// Measure the floor of the agent's HTTP stack ([`hyper_floor`]) in the ingress table.
    pub hyper_floor: bool,
    /// Caddy binary; its column is left out when `None`.
    pub caddy: Option<PathBuf>,
    /// tailnet-operator binary (control-plane benchmark).
    pub operator: Option<PathBuf>,
    /// Cumulative resource totals of the control-plane growth steps.
    pub scale_steps: Vec<usize>,
    /// Steady-state window in which API writes are counted.
    pub steady_window: Duration,
    /// Egress counts (× 5 targets) of the policy render measurement.
    pub policy_sizes: Vec<usize>,
    pub policy_runs: usize,
    /// Through the tailnet (benchmark 2).
    pub tailnet: tailnet::Workload,
}

pub const GIB: u64 = 1024 * 1024 * 1024;

impl Settings {
    pub fn full(agent: PathBuf, caddy: Option<PathBuf>) -> Settings {
        Settings {
            repeat: 3,
            stream_bytes: GIB,
            parallel_streams: 64,
            load_duration: Duration::from_secs(8),
            ping_pongs: 20_000,
            download_bytes: GIB,
            http_connections: vec![1, 16, 128],
            agent,
            baseline_agent: None,
            hyper_floor: false,
            caddy,
            operator: None,
            // 400 = the 200 + 200; `--scale-steps 10,100,400,1000` for the growth to
            // 1,000 (about 6 min on two cores, docs/benchmarks.md).
            scale_steps: vec![10, 100, 400],
            steady_window: Duration::from_secs(30),
            policy_sizes: vec![10, 100, 1000],
            policy_runs: 20,
            tailnet: tailnet::Workload {
                bulk_bytes: 64 << 20,
                parallel_streams: 8,
                ping_pongs: 2000,
                rate_duration: Duration::from_secs(5),
                repeat: 3,
            },
        }
    }

    /// Every workload once, briefly: proves the benchmarks still run and their bytes
    /// arrive. Measures nothing.
    pub fn smoke(agent: PathBuf, caddy: Option<PathBuf>) -> Settings {
        Settings {
            repeat: 1,
            stream_bytes: 8 * 1024 * 1024,
            parallel_streams: 8,
            load_duration: Duration::from_millis(500),
            ping_pongs: 200,
            download_bytes: 8 * 1024 * 1024,
            http_connections: vec![1, 4],
            agent,
            baseline_agent: None,
            hyper_floor: false,
            caddy,
            operator: None,
            scale_steps: vec![4],
            steady_window: Duration::from_secs(5),
            policy_sizes: vec![10],
            policy_runs: 2,
            tailnet: tailnet::Workload {
                bulk_bytes: 1 << 20,
                parallel_streams: 2,
                ping_pongs: 50,
                rate_duration: Duration::from_millis(500),
                repeat: 1,
            },
        }
    }
}
