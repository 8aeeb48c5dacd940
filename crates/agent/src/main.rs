use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tailnet_agent::dial::error_chain;
use tailnet_agent::run::{Options, run};
use tracing::{error, info};

// A thread-caching allocator: the HTTP path allocates a few small blocks per request on each
// connection thread. The image's static musl binary would otherwise use musl's malloc, which
// costs ~3 us per proxied request more; glibc's ~0.7 us more (docs/benchmarks.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Data plane of tailnet-operator: egress listeners through tailscaled's LocalAPI, ingress
/// TCP forward and HTTPS reverse proxy, admin endpoints on the pod IP.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The agent config (JSON, rendered by the operator); re-read when it changes.
    #[arg(long, default_value = tailnet_api::agent_config::CONFIG_PATH)]
    config: PathBuf,
    /// The pod IP; admin and egress listeners bind it (never loopback).
    #[arg(long, env = "POD_IP")]
    pod_ip: IpAddr,
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Bound for one egress dial through the tailnet (resolution, LocalAPI, TCP connect).
    #[arg(long, default_value_t = 10)]
    dial_timeout_seconds: u64,
    /// How often the config file and the certificate files are checked for changes.
    #[arg(long, default_value_t = 5)]
    reload_interval_seconds: u64,
    /// How often tailscaled's LocalAPI status is read.
    #[arg(long, default_value_t = 5)]
    status_interval_seconds: u64,
    /// How long shutdown waits for open connections (keep below the pod's grace period).
    #[arg(long, default_value_t = 25)]
    drain_timeout_seconds: u64,
    #[arg(long, default_value_t = 30)]
    backend_probe_interval_seconds: u64,
    #[arg(long, default_value_t = 10)]
    backend_connect_timeout_seconds: u64,
    /// Wait for response headers for routes without backendRequestTimeoutSeconds.
    #[arg(long, default_value_t = 60)]
    backend_request_timeout_seconds: u64,
    /// Egress: after the client's EOF (tailscaled's dial tunnel cannot carry a half-close),
    /// the tunnel stays open while the target keeps sending, and closes after this much
    /// silence. Also how long a fully closed client keeps an idle target connection.
    #[arg(long, default_value_t = 5)]
    half_closed_idle_seconds: u64,
    /// Threads that serve connections, each a single-threaded runtime (0: one per CPU the
    /// process may use).
    #[arg(long, default_value_t = 0)]
    connection_threads: usize,
}

/// Logs on stdout; `RUST_LOG` filters (default `info`); JSON is flat, as the operator's.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    use tailnet_telemetry::logging;
    let format = match format {
        LogFormat::Json => logging::LogFormat::Json,
        LogFormat::Text => logging::LogFormat::Text,
    };
    logging::init(format, std::io::stdout, std::io::stdout().is_terminal());
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => info!("SIGTERM"),
                _ = int.recv() => info!("SIGINT"),
            }
        }
        (term, int) => {
            // Without signal handlers the only stop is SIGKILL; say so and run on.
            error!(?term, ?int, "cannot install signal handlers");
            std::future::pending::<()>().await;
        }
    }
}

/// The `tcp` forward holds two pipes (four descriptors) per connection next to its two
/// sockets (src/splice.rs): at the connection limits' maximum (2048) that is beyond a soft
/// limit of 1024. The hard limit is what the container allows; without it the relay falls
/// back to copying when a pipe cannot be created.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                info!(%error, soft, hard, "could not raise the open files limit");
            }
        }
        Ok(_) => {}
        Err(error) => info!(%error, "could not read the open files limit"),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_format);
    raise_open_files_limit();
    let options = Options {
        config_path: args.config,
        pod_ip: args.pod_ip,
        dial_timeout: Duration::from_secs(args.dial_timeout_seconds.max(1)),
        reload_interval: Duration::from_secs(args.reload_interval_seconds.max(1)),
        status_interval: Duration::from_secs(args.status_interval_seconds.max(1)),
        drain_timeout: Duration::from_secs(args.drain_timeout_seconds),
        backend_probe_interval: Duration::from_secs(args.backend_probe_interval_seconds.max(1)),
        backend_connect_timeout: Duration::from_secs(args.backend_connect_timeout_seconds.max(1)),
        backend_request_timeout: Duration::from_secs(args.backend_request_timeout_seconds.max(1)),
        half_closed_idle: Duration::from_secs(args.half_closed_idle_seconds.max(1)),
        connection_threads: args.connection_threads,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(options, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            error!(error = %error_chain(&error), "tailnet-agent stopped");
            ExitCode::FAILURE
        }
    }
}
