//! `tno-lab`: starts the whole local lab (Kubernetes environment and tailnet in one lab netns),
//! prints how to reach it and keeps it up until Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tno_testenv::E2eEnv;
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::{KubeEnv, KubeEnvOptions};

#[derive(Parser)]
#[command(
    about = "The tailnet-operator local lab: etcd, kube-apiserver, controller-manager, test \
             kubelet, kube-proxy, CoreDNS, Headscale, a remote site behind a subnet router and \
             a laptop node, in one network lab. Needs root and deps/build.sh."
)]
struct Cli {}

fn main() -> ExitCode {
    let Cli {} = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tno-lab: cannot build the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(up()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-lab: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn up() -> tno_testenv::Result<()> {
    eprintln!("starting the Kubernetes environment…");
    let binaries = Binaries::discover()?;
    let options = KubeEnvOptions::from_repository(&binaries);
    let kube = Arc::new(KubeEnv::start(binaries, options).await?);
    eprintln!(
        "Kubernetes environment up in {:.1?}; starting the tailnet…",
        kube.startup_time()
    );
    let env = E2eEnv::start(kube.clone()).await?;
    let tailnet = env.tailnet();
    println!(
        "Lab is up (kube {:.1?}, tailnet {:.1?}).",
        kube.startup_time(),
        env.startup_time()
    );
    println!(
        "  kubeconfig:          {} (root netns)",
        env.kubeconfig().display()
    );
    println!(
        "  kubeconfig in lab:   {} (for processes in the lab netns)",
        env.lab_kubeconfig().display()
    );
    println!("  apiserver:           {}", kube.api_server_url());
    println!("  apiserver in lab:    {}", kube.api_server_url_in_lab());
    println!(
        "  Headscale:           {} (root netns)",
        env.headscale_root_url()
    );
    println!(
        "  Headscale in lab:    {} (server_url; use it as the Tailnet's spec.server)",
        env.headscale_url()
    );
    // A throwaway key of a throwaway Headscale: printing it is the point.
    println!("  Headscale API key:   {}", env.api_key());
    println!(
        "  headscale CLI:       {} -c {}",
        tailnet.binaries.headscale.display(),
        tailnet.headscale.config_path().display()
    );
    println!(
        "  remote site:         {} behind router `{}` (routes {} advertised, not approved)",
        tno_testenv_tailnet::SITE_ECHO,
        tailnet.site.router.hostname(),
        tno_testenv_tailnet::SITE_ROUTES.join(", ")
    );
    println!(
        "  laptop:              user {} in {} (netns {})",
        tno_testenv_tailnet::LAPTOP_USER,
        tno_testenv_tailnet::TEAM_A_GROUP,
        tailnet.laptop.netns.name()
    );
    println!(
        "  lab netns:           {} (ip netns exec {} …)",
        env.lab().netns().name(),
        env.lab().netns().name()
    );
    println!(
        "  run directory:       {} (logs)",
        kube.run_id().scratch_dir().display()
    );
    println!();
    println!(
        "  kubectl --kubeconfig {} get pods -A",
        env.kubeconfig().display()
    );
    println!("Press Ctrl-C to stop.");
    if let Err(error) = tokio::signal::ctrl_c().await {
        eprintln!("tno-lab: waiting for Ctrl-C failed ({error}); stopping");
    }
    eprintln!("stopping…");
    let scratch = kube.run_id().scratch_dir();
    // The tailnet side leaves the lab before the kube env (its owner) deletes it.
    drop(env);
    drop(kube);
    if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    } else {
        eprintln!("kept {}", scratch.display());
    }
    Ok(())
}
