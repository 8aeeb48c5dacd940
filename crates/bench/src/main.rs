//! `tno-bench`: runs the benchmarks (see the crate docs) and prints Markdown tables.
//! Normally started by `cargo xtask bench`, which builds the release binaries first.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use tno_bench::{Settings, control, egress, ingress, startup, tailnet};

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
    /// Apply → Ready and apply → first byte of an egress and an ingress, one at a time.
    Startup,
    /// Policy render time only (in-process, no environment).
    Policy,
}

impl Benchmark {
    /// Those that need a test environment (and its Headscale) of their own.
    const WITH_ENVIRONMENT: [Benchmark; 3] =
        [Benchmark::Tailnet, Benchmark::Control, Benchmark::Startup];

    fn name(self) -> &'static str {
        match self {
            Benchmark::Egress => "egress",
            Benchmark::Ingress => "ingress",
            Benchmark::Control => "control",
            Benchmark::Tailnet => "tailnet",
            Benchmark::Startup => "startup",
            Benchmark::Policy => "policy",
        }
    }
}

// Parsed once at start: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
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
        /// Another tailnet-operator build, measured with `--baseline-agent` in the same run
        /// by the startup benchmark (repetitions alternate between the two).
        #[arg(long)]
        baseline_operator: Option<PathBuf>,
        /// Another tailscaled build for the startup benchmark's baseline (its agent pods run
        /// it; with no other baseline build, the baseline's operator and agent are this
        /// build's): e.g. a build with other Go settings or build tags, side by side.
        #[arg(long)]
        baseline_tailscaled: Option<PathBuf>,
        /// Environment of the baseline's tailscaled, `KEY=VALUE` (repeatable; e.g.
        /// `GOMEMLIMIT=200MiB`): Go runtime settings side by side with the same binary.
        #[arg(long, value_name = "KEY=VALUE", requires = "baseline_tailscaled", value_parser = parse_env_pair)]
        baseline_tailscaled_env: Vec<String>,
        /// Also measure, in the ingress table, the floor of the agent's HTTP stack: a bare
        /// reverse proxy of the same libraries and connection model (`serve-proxy`).
        #[arg(long)]
        hyper_floor: bool,
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
    /// Internal: the ingress benchmark's floor of the agent's HTTP stack (`--hyper-floor`).
    ServeProxy {
        #[arg(long)]
        port: u16,
        #[arg(long)]
        backend_port: u16,
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        /// The backend exchange written by hand instead of hyper's client (an experiment:
        /// what leaving hyper's client would gain; src/raw_backend.rs).
        #[arg(long)]
        raw_backend: bool,
    },
}

/// The other builds measured beside this one (`--baseline-*`).
struct Baselines {
    agent: Option<PathBuf>,
    operator: Option<PathBuf>,
    tailscaled: Option<PathBuf>,
    tailscaled_env: Vec<String>,
    /// The bare proxy of the agent's libraries beside it in the ingress table.
    hyper_floor: bool,
}

/// `KEY=VALUE` with a non-empty key and no whitespace (the pairs travel space-separated).
fn parse_env_pair(pair: &str) -> Result<String, String> {
    match pair.split_once('=') {
        Some((key, _)) if !key.is_empty() && !pair.contains(char::is_whitespace) => {
            Ok(pair.to_string())
        }
        _ => Err(format!("{pair:?}: expected KEY=VALUE without spaces")),
    }
}

#[allow(clippy::too_many_arguments)]
fn run(
    agent: PathBuf,
    baselines: Baselines,
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
    settings.baseline_agent = baselines.agent.clone();
    settings.hyper_floor = baselines.hyper_floor;
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
    // The tailnet, control-plane and startup benchmarks each need a test environment of
    // their own: one Headscale accepts policy writes from one installation only. So with
    // more than one wanted, each runs in a child process.
    let with_environment: Vec<Benchmark> = Benchmark::WITH_ENVIRONMENT
        .into_iter()
        .filter(|b| wanted(*b))
        .collect();
    if with_environment.len() > 1 {
        for only in with_environment {
            let mut child = std::process::Command::new(&bench_exe);
            child.arg("run").arg("--agent").arg(&settings.agent);
            if let Some(operator) = &settings.operator {
                child.arg("--operator").arg(operator);
            }
            if let Some(agent) = &settings.baseline_agent {
                child.arg("--baseline-agent").arg(agent);
            }
            if let Some(operator) = &baselines.operator {
                child.arg("--baseline-operator").arg(operator);
            }
            if let Some(tailscaled) = &baselines.tailscaled {
                child.arg("--baseline-tailscaled").arg(tailscaled);
            }
            for pair in &baselines.tailscaled_env {
                child.arg("--baseline-tailscaled-env").arg(pair);
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
                .args(["--only", only.name()])
                .status()
                .with_context(|| format!("running the {} benchmark", only.name()))?;
            if !status.success() {
                anyhow::bail!("the {} benchmark failed: {status}", only.name());
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
    if wanted(Benchmark::Startup) {
        let builds = startup_builds(&settings.agent, operator_binary()?, baselines)?;
        let repeat = repeat.unwrap_or(if smoke { 1 } else { 5 });
        for table in runtime.block_on(startup::run(&builds, repeat))? {
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

/// The startup benchmark's builds: the one measured (its pods run `agent`), and the baseline
/// when both its agent and operator are given (its agent runs from images named
/// `tailnet-agent-baseline…`) and/or another tailscaled (its pods name the image
/// `…/tailscale-baseline`).
fn startup_builds(
    agent: &Path,
    operator: PathBuf,
    baselines: Baselines,
) -> Result<Vec<startup::Build>> {
    // The test kubelet runs an image's program by its name (`tailnet-agent`) from the image's
    // directory: each given file gets a directory where it has that name.
    let this_agent = agent_as_image_program(agent, "this-build")?;
    // SAFETY: set before the test environment (and the threads that read the environment)
    // starts; the data-plane benchmarks do not read it.
    unsafe {
        std::env::set_var(tno_deps::override_var("tailnet-agent"), this_agent);
    }
    let this_build = startup::Build {
        label: "this build".into(),
        operator,
        agent_image: tno_testenv::E2E_AGENT_IMAGE.into(),
        tailscale_image: None,
    };
    let mut baseline = match (baselines.agent, baselines.operator) {
        (Some(agent), Some(operator)) => {
            let agent = agent_as_image_program(&agent, "baseline")?;
            // SAFETY: as above.
            unsafe {
                std::env::set_var(tno_testenv_kube::env::BASELINE_AGENT_VAR, agent);
            }
            Some(startup::Build {
                label: "baseline".into(),
                operator,
                agent_image: "tno.local/tailnet-agent-baseline:bench".into(),
                tailscale_image: None,
            })
        }
        (None, None) => None,
        _ => anyhow::bail!("--baseline-agent and --baseline-operator go together for startup"),
    };
    if let Some(tailscaled) = baselines.tailscaled {
        // SAFETY: as above.
        unsafe {
            std::env::set_var(tno_testenv_kube::env::BASELINE_TAILSCALED_VAR, tailscaled);
            std::env::set_var(
                tno_testenv_kube::env::BASELINE_TAILSCALED_ENV_VAR,
                baselines.tailscaled_env.join(" "),
            );
        }
        let build = baseline.get_or_insert_with(|| startup::Build {
            label: "baseline".into(),
            ..this_build.clone()
        });
        build.tailscale_image = Some(tno_testenv_kube::env::BASELINE_TAILSCALE_IMAGE.into());
    }
    Ok(baseline.into_iter().chain([this_build]).collect())
}

/// `agent` under the name `tailnet-agent`, in a directory of its own (a symbolic link to the
/// file, so any build's file name works: `agent-main-musl`, `target/…/tailnet-agent`).
fn agent_as_image_program(agent: &Path, label: &str) -> Result<PathBuf> {
    let agent = agent
        .canonicalize()
        .with_context(|| format!("agent binary {}", agent.display()))?;
    let dir = std::env::temp_dir().join(format!("tno-bench-{}/{label}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let program = dir.join("tailnet-agent");
    let _ = std::fs::remove_file(&program);
    std::os::unix::fs::symlink(&agent, &program)
        .with_context(|| format!("linking {} to {}", program.display(), agent.display()))?;
    Ok(program)
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
            baseline_operator,
            baseline_tailscaled,
            baseline_tailscaled_env,
            hyper_floor,
            smoke,
            only,
            repeat,
            scale_steps,
            tailnet_bulk_mib,
        } => run(
            agent,
            Baselines {
                agent: baseline_agent,
                operator: baseline_operator,
                tailscaled: baseline_tailscaled,
                tailscaled_env: baseline_tailscaled_env,
                hyper_floor,
            },
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
        Command::ServeProxy {
            port,
            backend_port,
            cert,
            key,
            raw_backend,
        } => tno_bench::hyper_floor::serve(port, backend_port, &cert, &key, raw_backend),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
