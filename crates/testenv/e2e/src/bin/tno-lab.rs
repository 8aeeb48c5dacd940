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
struct Cli {
    /// Only the environment: no operator, no demo resources.
    #[arg(long)]
    bare: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    match runtime.block_on(up(!cli.bare)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-lab: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn up(demo: bool) -> tno_testenv::Result<()> {
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
    let mut operator = None;
    if demo {
        match run_demo(&env).await {
            Ok(process) => operator = Some(process),
            Err(error) => {
                eprintln!("tno-lab: the demo failed: {error}\n(the lab stays up for inspection)")
            }
        }
    }
    println!("Press Ctrl-C to stop.");
    if let Err(error) = tokio::signal::ctrl_c().await {
        eprintln!("tno-lab: waiting for Ctrl-C failed ({error}); stopping");
    }
    eprintln!("stopping…");
    if let Some(mut operator) = operator {
        let _ = operator.terminate().await;
    }
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

const OPERATOR_NAMESPACE: &str = "tailnet-system";
const CONSUMER_NAMESPACE: &str = "team-a";

fn example(file: &str) -> Result<serde_json::Value, String> {
    let path = tno_testenv_kube::binaries::workspace_root()
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The demo: the operator (in the lab, like a pod), the example Tailnet in Apply mode and the
/// example TailnetEgress; then a pod in team-a sends bytes to
/// remote-db.tailnet-system.svc.cluster.local:5432 and gets them echoed by 192.0.2.10:5432
/// behind the site's subnet router.
async fn run_demo(env: &E2eEnv) -> Result<tno_testenv::OperatorProcess, String> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    let client = env.kube().client().await.map_err(|e| e.to_string())?;
    let apply = PatchParams::apply("tno-lab").force();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [OPERATOR_NAMESPACE, CONSUMER_NAMESPACE] {
        let object =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces
            .patch(ns, &apply, &Patch::Apply(object))
            .await
            .map_err(|e| format!("namespace {ns}: {e}"))?;
    }
    let base = env.base_policy().map_err(|e| e.to_string())?;
    env.create_bootstrap(&client, OPERATOR_NAMESPACE, &base)
        .await
        .map_err(|e| e.to_string())?;
    let tailnets: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &tailnet_resource("Tailnet", "tailnets"));
    let mut tailnet = env.tailnet_object("demo", "Apply");
    tailnet["spec"]["dns"]["ingressAliasTemplate"] = "{name}.lab.example.net".into();
    tailnets
        .patch("demo", &apply, &Patch::Apply(&tailnet))
        .await
        .map_err(|e| format!("Tailnet demo: {e}"))?;
    println!(
        "\ndemo: Tailnet demo (Apply) → Headscale {}",
        env.headscale_url()
    );

    let binary = tno_testenv::workspace_operator_binary().map_err(|e| e.to_string())?;
    let mut operator = env
        .start_operator(
            &binary,
            &tno_testenv::OperatorArgs::new(OPERATOR_NAMESPACE).to_args(),
        )
        .await
        .map_err(|e| e.to_string())?;
    operator
        .wait_ready(std::time::Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "demo: operator running in the lab (log {}, metrics {})",
        operator.log_path().display(),
        operator.metrics_url()
    );

    let egress = example("20-egress.yaml")?;
    let egresses: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        OPERATOR_NAMESPACE,
        &tailnet_resource("TailnetEgress", "tailnetegresses"),
    );
    egresses
        .patch("team-a", &apply, &Patch::Apply(&egress))
        .await
        .map_err(|e| format!("TailnetEgress team-a: {e}"))?;
    println!("demo: applied examples/20-egress.yaml; waiting for it to become Ready…");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut last = String::new();
    loop {
        let object = egresses.get("team-a").await.map_err(|e| e.to_string())?;
        let conditions = object.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ready = conditions.iter().find(|c| c["type"] == "Ready");
        let line = ready
            .map(|c| {
                format!(
                    "Ready={} {}: {}",
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_default();
        if line != last && !line.is_empty() {
            println!("demo:   {line}");
            last = line;
        }
        if ready.is_some_and(|c| c["status"] == "True") {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "TailnetEgress team-a did not become Ready; last: {last}"
            ));
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    let target = format!("remote-db.{OPERATOR_NAMESPACE}.svc.cluster.local:5432");
    println!("demo: a pod in {CONSUMER_NAMESPACE} connects to {target} …");
    let run = env
        .tcp_check(&client, CONSUMER_NAMESPACE, "demo-client", &target, 30)
        .await
        .map_err(|e| e.to_string())?;
    if !run.succeeded() {
        return Err(format!("the connection through the tailnet failed:\n{run}"));
    }
    println!(
        "demo: OK — bytes from a pod crossed Service → agent → tailnet → subnet router → 192.0.2.10:5432 and came back."
    );
    println!(
        "demo: try  kubectl --kubeconfig {} get tailnet,tailnetegress -A -o wide",
        env.kubeconfig().display()
    );
    println!(
        "demo:      kubectl --kubeconfig {} describe tailnetegress -n {OPERATOR_NAMESPACE} team-a",
        env.kubeconfig().display()
    );
    Ok(operator)
}

fn tailnet_resource(kind: &str, plural: &str) -> kube::api::ApiResource {
    let mut resource = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "tailnet-operator.dev",
        "v1alpha1",
        kind,
    ));
    resource.plural = plural.to_string();
    resource
}
