//! `tno-testenv up`: starts the Kubernetes side of the lab and keeps it up until Ctrl-C.

use clap::{Parser, Subcommand};
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::{KubeEnv, KubeEnvOptions, error_chain};

#[derive(Parser)]
#[command(about = "The tailnet-operator test environment (Kubernetes side)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd, kube-apiserver, kube-controller-manager, the test kubelet, kube-proxy and
    /// CoreDNS; print how to reach them; stop everything on Ctrl-C.
    Up,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The client logs every refused /readyz poll during startup as an error.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
                }),
        )
        .init();
    let Cli {
        command: Command::Up,
    } = Cli::parse();
    match up().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-testenv: {}", error_chain(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn up() -> tno_testenv_kube::Result<()> {
    let binaries = Binaries::discover()?;
    let options = KubeEnvOptions::from_repository(&binaries);
    let env = KubeEnv::start(binaries, options).await?;
    println!(
        "Kubernetes test environment is up ({:.1?}).",
        env.startup_time()
    );
    println!("  kubeconfig:        {}", env.kubeconfig().display());
    println!("  apiserver:         {} (root netns)", env.api_server_url());
    println!("  apiserver in lab:  {}", env.api_server_url_in_lab());
    println!("  lab netns:         {}", env.lab().netns().name());
    println!(
        "  cluster DNS:       {}",
        tno_testenv_kube::network::CLUSTER_DNS_IP
    );
    println!("  run directory:     {} (logs, pods)", env.dir().display());
    println!("  CRDs installed:    {}", env.installed_crds().len());
    println!();
    println!(
        "  kubectl --kubeconfig {} get pods -A",
        env.kubeconfig().display()
    );
    println!("Press Ctrl-C to stop.");
    let _ = tokio::signal::ctrl_c().await;
    println!("stopping…");
    let scratch = env.run_id().scratch_dir();
    drop(env);
    if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}
