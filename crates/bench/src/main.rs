//! `tno-bench`: runs the benchmarks (see the crate docs) and prints Markdown tables.
//! Normally started by `cargo xtask bench`, which builds the release binaries first.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tno_bench::{Settings, control, egress, ingress, tailnet};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Benchmark {
    Egress,
    Ingress,
    Control,
    Tailnet,
    /// Policy render time only (in-process, no environment).
    Policy,
}

#[derive(Subcommand)]
enum Command {
    /// Run benchmarks and print their tables (Markdown).
    Run {
        /// The tailnet-agent binary to measure (a release build for real numbers).
        #[arg(long)]
        agent: PathBuf,
        /// Another tailnet-agent build (e.g. of the previous commit) measured in the same run
        /// as an extra column of the egress and ingress tables.
        #[arg(long)]
        baseline_agent: Option<PathBuf>,
        /// Caddy, for the ingress comparison (left out when not given).
        #[arg(long)]
        caddy: Option<PathBuf>,
        /// The tailnet-operator binary, for the control-plane benchmark.
        #[arg(long)]
        operator: Option<PathBuf>,
        /// Every workload once and briefly: checks that bytes and requests arrive.
        #[arg(long)]
        smoke: bool,
        /// Only these benchmarks (default: all).
        #[arg(long, value_delimiter = ',')]
        only: Vec<Benchmark>,
        /// Repetitions (default 3, smoke 1).
        #[arg(long)]
        repeat: Option<usize>,
        /// Control plane: cumulative resource totals (default 10,100,400).
        #[arg(long, value_delimiter = ',')]
        scale_steps: Vec<usize>,
        /// Through the tailnet: MiB of the bulk echo workloads (default 64).
        #[arg(long)]
        tailnet_bulk_mib: Option<usize>,
    },
    /// Internal: the TCP backend of the forwarding benchmark.
    ServeTcp {
        #[arg(long)]
        port: u16,
    },
    /// Internal: the HTTP backend of the ingress benchmark and a LocalAPI `whois` stand-in.
    ServeHttp {
        #[arg(long)]
        port: u16,
        #[arg(long)]
        localapi_socket: PathBuf,
    },
}

#[allow(clippy::too_many_arguments)]
fn run(
    agent: PathBuf,
    baseline_agent: Option<PathBuf>,
    caddy: Option<PathBuf>,
    operator: Option<PathBuf>,
    smoke: bool,
    only: Vec<Benchmark>,
    repeat: Option<usize>,
    scale_steps: Vec<usize>,
    tailnet_bulk_mib: Option<usize>,
) -> Result<()> {
    let mut settings = if smoke {
        Settings::smoke(agent, caddy)
    } else {
        Settings::full(agent, caddy)
    };
    settings.operator = operator;
    settings.baseline_agent = baseline_agent;
    if !scale_steps.is_empty() {
        settings.scale_steps = scale_steps;
    }
    if let Some(repeat) = repeat {
        settings.repeat = repeat.max(1);
        settings.tailnet.repeat = repeat.max(1);
    }
    if let Some(mib) = tailnet_bulk_mib {
        settings.tailnet.bulk_bytes = mib.max(1) << 20;
    }
    let bench_exe = std::env::current_exe().context("own executable")?;
    raise_open_files_limit();
    // tno-netlab forks every child from one helper thread, created on first use, and a thread
    // inherits its creator's netns: create it now, from the root netns, before the data-plane
    // benchmarks move their threads into lab namespaces (else the test environment's etcd
    // and apiserver would start inside a lab netns).
    tno_netlab::ChildProcess::spawn(
        "netlab-spawner-warm-up",
        std::process::Command::new("true"),
        Path::new("/dev/null"),
    )
    .context("starting the process spawner")?;
    let wanted = |b: Benchmark| only.is_empty() || only.contains(&b);
    if wanted(Benchmark::Egress) {
        let (settings, bench_exe) = (settings.clone(), bench_exe.clone());
        // The benchmark moves its thread into a netns of its own.
        let table = std::thread::spawn(move || egress::run(&settings, &bench_exe))
            .join()
            .map_err(|_| anyhow::anyhow!("egress benchmark panicked"))??;
        println!("{}", table.markdown());
    }
    if wanted(Benchmark::Ingress) {
        let (settings, bench_exe) = (settings.clone(), bench_exe.clone());
        let tables = std::thread::spawn(move || ingress::run(&settings, &bench_exe))
            .join()
            .map_err(|_| anyhow::anyhow!("ingress benchmark panicked"))??;
        for table in tables {
            println!("{}", table.markdown());
        }
    }
    let operator_binary = || {
        settings
            .operator
            .clone()
            .context("--operator is needed for the control-plane and tailnet benchmarks")
    };
    // The tailnet and control-plane benchmarks each need a test environment of their own:
    // one Headscale accepts policy writes from one installation only. So with both wanted,
    // each runs in a child process.
    if wanted(Benchmark::Tailnet) && wanted(Benchmark::Control) {
        for only in ["tailnet", "control"] {
            let mut child = std::process::Command::new(&bench_exe);
            child.arg("run").arg("--agent").arg(&settings.agent);
            if let Some(operator) = &settings.operator {
                child.arg("--operator").arg(operator);
            }
            if smoke {
                child.arg("--smoke");
            }
            if let Some(repeat) = repeat {
                child.arg("--repeat").arg(repeat.to_string());
            }
            let steps: Vec<String> = settings.scale_steps.iter().map(usize::to_string).collect();
            let status = child
                .arg("--scale-steps")
                .arg(steps.join(","))
                .args(["--only", only])
                .status()
                .with_context(|| format!("running the {only} benchmark"))?;
            if !status.success() {
                anyhow::bail!("the {only} benchmark failed: {status}");
            }
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if wanted(Benchmark::Tailnet) {
        let operator = operator_binary()?;
        let tables = runtime.block_on(tailnet::run(&operator, settings.tailnet))?;
        for table in tables {
            println!("{}", table.markdown());
        }
    }
    if wanted(Benchmark::Policy) {
        let table = control::policy_table(&settings.policy_sizes, settings.policy_runs)?;
        println!("{}", table.markdown());
    }
    if wanted(Benchmark::Control) {
        let operator = operator_binary()?;
        let tables = runtime.block_on(control::run(
            &operator,
            &settings.scale_steps,
            settings.steady_window,
        ))?;
        for table in tables {
            println!("{}", table.markdown());
        }
    }
    Ok(())
}

/// The test environment's TCP forwarders (e.g. to Headscale) live in this process: at a few
/// hundred resources the operator's connections exceed the default 1024 descriptors.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn main() -> ExitCode {
    let result = match Args::parse().command {
        Command::Run {
            agent,
            baseline_agent,
            caddy,
            operator,
            smoke,
            only,
            repeat,
            scale_steps,
            tailnet_bulk_mib,
        } => run(
            agent,
            baseline_agent,
            caddy,
            operator,
            smoke,
            only,
            repeat,
            scale_steps,
            tailnet_bulk_mib,
        ),
        Command::ServeTcp { port } => tno_bench::tcpload::serve(port),
        Command::ServeHttp {
            port,
            localapi_socket,
        } => tno_bench::httpload::serve(port, &localapi_socket),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
