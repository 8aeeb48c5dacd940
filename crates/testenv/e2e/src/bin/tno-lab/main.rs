//! `tno-lab`: starts the whole local lab (Kubernetes environment and tailnet in one lab netns),
//! prints how to reach it and keeps it up until Ctrl-C.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kube::api::{Api, Patch, PatchParams};
use tno_testenv::E2eEnv;
use tno_testenv_kube::binaries::Binaries;
use tno_testenv_kube::{KubeEnv, KubeEnvOptions};

mod in_cluster;
mod install;
mod lockdown;

use install::DemoOperator;

#[derive(Parser)]
#[command(
    about = "The tailnet-operator local lab: etcd, kube-apiserver, controller-manager, test \
             kubelet, kube-proxy, CoreDNS, Headscale, a remote site behind a subnet router and \
             a laptop node, in one network lab. Needs root and deps/build.sh."
)]
struct Cli {
    /// Only the environment: no operator, no demo resources.
    #[arg(long, conflicts_with = "once")]
    bare: bool,
    /// Run the demo, print the result and stop (exit code 0 only if every demo step worked),
    /// instead of staying up until Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Also start a second cluster on the same Headscale (own control plane, kubelet,
    /// kube-proxy, CoreDNS; pods 10.245/16, Services 10.97/16). With the demo, it runs
    /// examples/second-cluster/: a contributing installation whose egress the owner merges.
    #[arg(long)]
    second_cluster: bool,
    /// Run the operator as a local process from the workspace build (development) instead of
    /// installing the chart from the lab registry.
    #[arg(long)]
    dev: bool,
    /// The OCI layouts of tailnet-operator and tailnet-agent to push and install
    /// (`cargo xtask images` output; scripts/lab.sh builds them with `--profile lab` into
    /// target/lab-images). Relative paths are taken from the repository root.
    #[arg(long, default_value = "target/lab-images")]
    images: std::path::PathBuf,
}

/// How the demo runs the operator.
#[derive(Clone)]
enum OperatorMode {
    /// `helm install` from the lab registry with these image layouts.
    Chart(std::path::PathBuf),
    /// `--dev`: the workspace binary as a process.
    Process,
}

/// The lab's phases and how long each took, printed as they end and summed up at the end.
pub struct Phases {
    started: std::time::Instant,
    last: std::time::Instant,
    done: Vec<(String, std::time::Duration)>,
}

impl Phases {
    fn new() -> Self {
        let now = std::time::Instant::now();
        Self {
            started: now,
            last: now,
            done: Vec::new(),
        }
    }

    /// Ends the current phase as `name`.
    pub fn done(&mut self, name: &str) {
        let now = std::time::Instant::now();
        let took = now - self.last;
        self.last = now;
        eprintln!("[lab] {name}: {:.1} s", took.as_secs_f64());
        self.done.push((name.to_string(), took));
    }

    fn print_summary(&self) {
        println!(
            "
lab phases (tno-lab):"
        );
        for (name, took) in &self.done {
            println!("  {:>6.1} s  {name}", took.as_secs_f64());
        }
        println!(
            "  {:>6.1} s  total",
            (self.last - self.started).as_secs_f64()
        );
    }
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
    let mode = if cli.dev {
        OperatorMode::Process
    } else if cli.images.is_absolute() {
        OperatorMode::Chart(cli.images.clone())
    } else {
        OperatorMode::Chart(tno_testenv_kube::binaries::workspace_root().join(&cli.images))
    };
    let demo = (!cli.bare).then_some(mode);
    match runtime.block_on(up(demo, cli.once, cli.second_cluster)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tno-lab: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn up(
    demo: Option<OperatorMode>,
    once: bool,
    second_cluster: bool,
) -> tno_testenv::Result<()> {
    let mut phases = Phases::new();
    eprintln!("starting the Kubernetes environment…");
    let binaries = Binaries::discover()?;
    let options = KubeEnvOptions::from_repository(&binaries);
    let kube = Arc::new(KubeEnv::start(binaries, options).await?);
    eprintln!(
        "Kubernetes environment up in {:.1?}; starting the tailnet…",
        kube.startup_time()
    );
    phases.done("Kubernetes environment");
    let env = E2eEnv::start(kube.clone()).await?;
    phases.done("tailnet (Headscale, remote site, laptop)");
    print_lab(&kube, &env);
    let cosmos = if second_cluster {
        eprintln!("starting the second cluster…");
        let cosmos = env.start_second_cluster().await?;
        println!(
            "Second cluster is up (pods {}, Services {}, same Headscale).",
            cosmos.network().pod_cidr,
            cosmos.network().service_cidr
        );
        println!(
            "  kubeconfig:          {} (root netns)",
            cosmos.kube().kubeconfig().display()
        );
        println!(
            "  kubeconfig in labs:  {} (valid in both labs)",
            cosmos.lab_kubeconfig().display()
        );
        println!("  apiserver:           {}", cosmos.kube().api_server_url());
        println!(
            "  node netns:          {}",
            cosmos.kube().lab().netns().name()
        );
        println!(
            "  kubectl --kubeconfig {} get pods -A",
            cosmos.kube().kubeconfig().display()
        );
        Some(cosmos)
    } else {
        None
    };
    let mut demo_state = None;
    let mut second_state = None;
    let mut demo_error = None;
    if let Some(mode) = demo {
        match run_demo(&env, mode, &mut phases).await {
            Ok(state) => demo_state = Some(state),
            Err(error) if once => demo_error = Some(error),
            Err(error) => {
                eprintln!("tno-lab: the demo failed: {error}\n(the lab stays up for inspection)")
            }
        }
        if let (Some(cosmos), true) = (&cosmos, demo_state.is_some()) {
            match run_second_cluster_demo(&env, cosmos).await {
                Ok(operator) => second_state = Some(operator),
                Err(error) if once => demo_error = Some(error),
                Err(error) => eprintln!(
                    "tno-lab: the second cluster's demo failed: {error}\n(the lab stays up for inspection)"
                ),
            }
        }
    }
    phases.print_summary();
    if !once {
        println!("Press Ctrl-C to stop.");
        if let Err(error) = tokio::signal::ctrl_c().await {
            eprintln!("tno-lab: waiting for Ctrl-C failed ({error}); stopping");
        }
    }
    eprintln!("stopping…");
    if let Some(mut operator) = second_state {
        let _ = operator.terminate().await;
    }
    drop(cosmos);
    if let Some(DemoState { operator, .. }) = demo_state {
        operator.stop().await;
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
    match demo_error {
        Some(error) => Err(tno_testenv::E2eError::Demo(error)),
        None => Ok(()),
    }
}

/// How to reach the lab: kubeconfigs, URLs, Headscale's CA and key, the tailnet's nodes.
fn print_lab(kube: &KubeEnv, env: &E2eEnv) {
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
    println!(
        "  Headscale's CA:      {}/{} (HTTPS behind the lab CA; ConfigMap {} in the operator namespace, the Tailnet's spec.serverCA)",
        env.tailnet().headscale.ca_dir().display(),
        tno_testenv_tailnet::LAB_CA_FILE,
        tno_testenv::SERVER_CA_CONFIG_MAP,
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
}

/// What keeps the demo going while the lab is up: the operator and the lab plumbing.
struct DemoState {
    operator: DemoOperator,
    _cert_manager: tno_testenv::CertManagerController,
    _records: tno_testenv::ExtraRecordsProjection,
    _enforcer: tno_testenv::NetworkPolicyEnforcer,
}

pub const OPERATOR_NAMESPACE: &str = "tailnet-system";
pub const CONSUMER_NAMESPACE: &str = "team-a";
/// The CA ClusterIssuer of the demo (the default issuer of examples/10-tailnet.yaml).
const DEMO_ISSUER: &str = "apps-ca";

fn example(file: &str) -> Result<serde_json::Value, String> {
    let path = tno_testenv_kube::binaries::workspace_root()
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The demo: the cluster's DNS wired as docs/dns.md says, NetworkPolicies enforced
/// (kube-router), the product installed from the lab registry with `helm install` (or, with
/// `--dev`, the operator as a process), the example Tailnet in Apply mode, the example
/// TailnetEgress and TailnetIngress. Then a pod in team-a sends bytes to
/// remote-db.tailnet-system.svc.cluster.local:5432 and gets them echoed by 192.0.2.10:5432
/// behind the site's subnet router, the laptop (alice, group:team-a) opens
/// https://portal.team-a.lab.example.net through the tailnet, in-cluster clients use the same
/// name and the egress alias ([`in_cluster::demo`]). Last, the lockdown guard
/// ([`lockdown::demo`]).
async fn run_demo(
    env: &E2eEnv,
    mode: OperatorMode,
    phases: &mut Phases,
) -> Result<DemoState, String> {
    let client = env.kube().client().await.map_err(|e| e.to_string())?;
    let apply = PatchParams::apply("tno-lab").force();
    apply_namespaces(&client, &[OPERATOR_NAMESPACE, CONSUMER_NAMESPACE]).await?;
    // What a cluster has before the operator: DNS wired to the Tailnet's ConfigMap, a
    // NetworkPolicy enforcer, cert-manager (its real controller) with a CA ClusterIssuer and the extra-records
    // ConfigMap mounted into Headscale (projected by the test kubelet's volume code).
    in_cluster::wire_coredns(&client).await?;
    let enforcer = env
        .start_network_policy_enforcer()
        .await
        .map_err(|e| format!("the NetworkPolicy enforcer (kube-router): {e}"))?;
    println!(
        "demo: NetworkPolicies are enforced (kube-router's firewall controller, {})",
        enforcer.iptables_backend()
    );
    let ca = tno_testenv::LabCa::generate("tailnet-operator lab CA").map_err(|e| e.to_string())?;
    let ca_pem = ca.pem().to_string();
    let ca_path = env.kube().run_id().scratch_dir().join("lab-ca.pem");
    std::fs::write(&ca_path, &ca_pem).map_err(|e| format!("{}: {e}", ca_path.display()))?;
    let admin_tls = ca
        .tls_secret(
            "admin-tls",
            CONSUMER_NAMESPACE,
            &[format!("admin.{CONSUMER_NAMESPACE}.svc.cluster.local")],
        )
        .map_err(|e| e.to_string())?;
    let cert_manager = env
        .start_cert_manager()
        .await
        .map_err(|e| format!("cert-manager's controller: {e}"))?;
    // The ClusterIssuer examples/10-tailnet.yaml names as the Tailnet's default issuer.
    env.apply_ca_cluster_issuer(&client, DEMO_ISSUER, &ca)
        .await
        .map_err(|e| {
            format!(
                "ClusterIssuer {DEMO_ISSUER}: {e}\n{}",
                cert_manager.log_tail(20)
            )
        })?;
    println!(
        "demo: cert-manager's controller issues Certificates from ClusterIssuer {DEMO_ISSUER} (log {})",
        cert_manager.log_path().display()
    );
    let records = env
        .project_extra_records(
            client.clone(),
            in_cluster::DNS_NAMESPACE,
            tno_testenv::HOSTS_CONFIG_MAP,
        )
        .map_err(|e| format!("the extra-records ConfigMap mounted into Headscale: {e}"))?;
    phases.done("cluster add-ons (CoreDNS wiring, kube-router, cert-manager)");

    apply_demo_tailnet(env, &client, &apply).await?;
    let operator = match mode {
        OperatorMode::Chart(images) => {
            DemoOperator::Pod(install::install_chart(env, &client, &images, phases).await?)
        }
        OperatorMode::Process => {
            let operator = DemoOperator::Process(start_demo_operator(env, None).await?);
            phases.done("operator process Ready (--dev)");
            operator
        }
    };
    println!("demo: {}", operator.describe());
    let state = DemoState {
        operator,
        _cert_manager: cert_manager,
        _records: records,
        _enforcer: enforcer,
    };
    demo_egress(env, &client, &apply).await?;
    phases.done("demo: egress Ready and bytes through");
    demo_ingress(env, &client, &apply, &admin_tls, &ca_pem).await?;
    phases.done("demo: ingress Ready and HTTPS from the laptop");
    in_cluster::demo(env, &client, &ca_pem).await?;
    phases.done("demo: in-cluster clients (split horizon, egress alias)");
    lockdown::demo(env, &client, &state.operator).await?;
    phases.done("demo: lockdown guard");
    print_kubectl(env, &["get", "tailnet,tailnetegress,tailnetingress", "-A"]);
    println!(
        "demo: success — one egress connection and one HTTPS ingress request crossed the tailnet."
    );
    println!(
        "demo: try  kubectl --kubeconfig {} get tailnet,tailnetegress,tailnetingress -A -o wide",
        env.kubeconfig().display()
    );
    println!(
        "demo:      kubectl --kubeconfig {} describe tailnetingress -n {CONSUMER_NAMESPACE} portal",
        env.kubeconfig().display()
    );
    println!("demo:      lab CA for clients: {}", ca_path.display());
    Ok(state)
}

/// The bootstrap objects and the example Tailnet, in Apply mode.
async fn apply_demo_tailnet(
    env: &E2eEnv,
    client: &kube::Client,
    apply: &PatchParams,
) -> Result<(), String> {
    let base = env.base_policy().map_err(|e| e.to_string())?;
    env.create_bootstrap(client, OPERATOR_NAMESPACE, &base)
        .await
        .map_err(|e| e.to_string())?;
    let tailnets: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &tailnet_resource("Tailnet", "tailnets"));
    let mut tailnet = env.tailnet_object("demo", "Apply");
    let example_tailnet = example("10-tailnet.yaml")?;
    tailnet["spec"]["dns"]["ingressAliasTemplate"] =
        example_tailnet["spec"]["dns"]["ingressAliasTemplate"].clone();
    tailnet["spec"]["defaults"] = example_tailnet["spec"]["defaults"].clone();
    // docs/dns.md (kubeadm): the DNS ConfigMap beside CoreDNS, which mounts it.
    tailnet["spec"]["dns"]["hostsConfigMapNamespace"] = in_cluster::DNS_NAMESPACE.into();
    tailnets
        .patch("demo", apply, &Patch::Apply(&tailnet))
        .await
        .map_err(|e| format!("Tailnet demo: {e}"))?;
    println!(
        "\ndemo: Tailnet demo (Apply) → Headscale {}",
        env.headscale_url()
    );
    Ok(())
}

/// examples/20-egress.yaml, then a pod in team-a through it to the remote site.
async fn demo_egress(
    env: &E2eEnv,
    client: &kube::Client,
    apply: &PatchParams,
) -> Result<(), String> {
    // Egress.
    let egress = example("20-egress.yaml")?;
    let egresses: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        OPERATOR_NAMESPACE,
        &tailnet_resource("TailnetEgress", "tailnetegresses"),
    );
    egresses
        .patch("team-a", apply, &Patch::Apply(&egress))
        .await
        .map_err(|e| format!("TailnetEgress team-a: {e}"))?;
    println!("demo: applied examples/20-egress.yaml; waiting for it to become Ready…");
    wait_ready(&egresses, "TailnetEgress", "team-a").await?;
    let target = format!("remote-db.{OPERATOR_NAMESPACE}.svc.cluster.local:5432");
    println!("demo: a pod in {CONSUMER_NAMESPACE} connects to {target} …");
    let run = env
        .tcp_check(client, CONSUMER_NAMESPACE, "demo-client", &target, 30)
        .await
        .map_err(|e| e.to_string())?;
    if !run.succeeded() {
        return Err(format!("the connection through the tailnet failed:\n{run}"));
    }
    println!(
        "demo: OK — egress: bytes from a pod crossed Service → agent → tailnet → subnet router → 192.0.2.10:5432 and came back."
    );
    Ok(())
}

/// The example's backends and examples/30-ingress.yaml, then the laptop through it over
/// HTTPS (MagicDNS name, certificate verified against the lab CA).
async fn demo_ingress(
    env: &E2eEnv,
    client: &kube::Client,
    apply: &PatchParams,
    admin_tls: &k8s_openapi::api::core::v1::Secret,
    ca_pem: &str,
) -> Result<(), String> {
    // Ingress: the example's backends (an HTTP frontend, an HTTPS admin UI with its own
    // certificate), then examples/30-ingress.yaml as is.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), CONSUMER_NAMESPACE);
    secrets
        .patch("admin-tls", apply, &Patch::Apply(&admin_tls))
        .await
        .map_err(|e| format!("Secret admin-tls: {e}"))?;
    let backends = [
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "backend-ca", "namespace": CONSUMER_NAMESPACE},
            "data": {"ca.crt": ca_pem}}),
        backend_deployment(
            "frontend",
            serde_json::json!([
                "http-echo",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "frontend"
            ]),
            None,
        ),
        backend_service("frontend", 8080),
        backend_deployment(
            "admin",
            serde_json::json!([
                "http-backend",
                "--listen",
                "0.0.0.0:8443",
                "--cert",
                "/tls/tls.crt",
                "--key",
                "/tls/tls.key"
            ]),
            Some("admin-tls"),
        ),
        backend_service("admin", 8443),
    ];
    for object in backends {
        apply_object(client, &object).await?;
    }
    let ingress = example("30-ingress.yaml")?;
    let ingresses: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        CONSUMER_NAMESPACE,
        &tailnet_resource("TailnetIngress", "tailnetingresses"),
    );
    ingresses
        .patch("portal", apply, &Patch::Apply(&ingress))
        .await
        .map_err(|e| format!("TailnetIngress portal: {e}"))?;
    println!("demo: applied examples/30-ingress.yaml; waiting for it to become Ready…");
    let ready = wait_ready(&ingresses, "TailnetIngress", "portal").await?;
    let ip = ready.data["status"]["tailnetIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str())
        .find(|a| a.contains('.'))
        .map(str::to_string)
        .ok_or("the ingress reports no tailnet IPv4")?;
    let portal = format!("portal.{CONSUMER_NAMESPACE}.lab.example.net");
    let laptop = env.tailnet().laptop.node.local_api();
    println!("demo: the laptop (alice, group:team-a) resolves {portal} through MagicDNS …");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let resolved = loop {
        let answer = laptop.resolve_ipv4(&portal).await;
        match answer {
            Ok(ips) if ips.iter().any(|a| a.to_string() == ip) => break ip.clone(),
            _ if std::time::Instant::now() > deadline => {
                return Err(format!(
                    "MagicDNS did not resolve {portal} to {ip}: {answer:?}"
                ));
            }
            _ => tokio::time::sleep(std::time::Duration::from_secs(2)).await,
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let response = loop {
        let attempt = tno_testenv::https_get(&laptop, &resolved, 443, &portal, ca_pem, "/").await;
        match attempt {
            Ok(text) if text.starts_with("HTTP/1.1 200") => break text,
            _ if std::time::Instant::now() > deadline => {
                return Err(format!(
                    "https://{portal}/ from the laptop failed: {attempt:?}"
                ));
            }
            _ => tokio::time::sleep(std::time::Duration::from_secs(2)).await,
        }
    };
    let forwarded_for = response
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("x-forwarded-for")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    println!(
        "demo: OK — ingress: laptop → https://{portal}/ ({resolved}, certificate verified against the lab CA) → agent → frontend: {} (X-Forwarded-For {forwarded_for})",
        response.lines().next().unwrap_or_default().trim()
    );
    Ok(())
}

/// The second cluster's demo (examples/second-cluster/): Tailnet `cosmos` in Contribute mode
/// under its own operator, its egress to the remote site; the owner's Tailnet `demo` lists it
/// with a kubeconfig that may only read its fragment. Then a pod in cluster B sends bytes to
/// b-db.tailnet-system.svc.cluster.local:5432 through the grant the owner merged.
async fn run_second_cluster_demo(
    env: &E2eEnv,
    cosmos: &tno_testenv::SecondCluster,
) -> Result<tno_testenv::OperatorProcess, String> {
    use k8s_openapi::api::core::v1::Secret;
    let apply = PatchParams::apply("tno-lab").force();
    let client_b = cosmos.client().await.map_err(|e| e.to_string())?;
    apply_namespaces(&client_b, &[OPERATOR_NAMESPACE, "team-b"]).await?;
    // The namespaces need their default ServiceAccount before pods can start.
    let service_accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client_b.clone(), "team-b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while service_accounts
        .get_opt("default")
        .await
        .ok()
        .flatten()
        .is_none()
    {
        if std::time::Instant::now() > deadline {
            return Err("team-b in B got no default ServiceAccount".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let base = env.base_policy().map_err(|e| e.to_string())?;
    env.create_bootstrap(&client_b, OPERATOR_NAMESPACE, &base)
        .await
        .map_err(|e| e.to_string())?;
    let mut tailnet = example("second-cluster/10-tailnet.yaml")?;
    tailnet["spec"]["server"] = serde_json::json!(env.headscale_url());
    tailnet["spec"]["serverCA"] = serde_json::json!({"configMapRef": {
        "name": tno_testenv::SERVER_CA_CONFIG_MAP,
        "key": tno_testenv_tailnet::LAB_CA_FILE,
    }});
    let tailnets_b: Api<kube::api::DynamicObject> =
        Api::all_with(client_b.clone(), &tailnet_resource("Tailnet", "tailnets"));
    tailnets_b
        .patch("cosmos", &apply, &Patch::Apply(&tailnet))
        .await
        .map_err(|e| format!("Tailnet cosmos in B: {e}"))?;
    let operator = start_demo_operator(env, Some(cosmos)).await?;
    println!(
        "\ndemo B: Tailnet cosmos (Contribute, prefix cob) and its operator in the second cluster (log {})",
        operator.log_path().display()
    );
    let egress = example("second-cluster/20-egress.yaml")?;
    let egresses_b: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client_b.clone(),
        OPERATOR_NAMESPACE,
        &tailnet_resource("TailnetEgress", "tailnetegresses"),
    );
    egresses_b
        .patch("site", &apply, &Patch::Apply(&egress))
        .await
        .map_err(|e| format!("TailnetEgress site in B: {e}"))?;

    // The owner lists cosmos, reading its fragment through B's API with exactly the Role of
    // docs/several-clusters.md.
    let reader = cosmos
        .fragment_reader(
            OPERATOR_NAMESPACE,
            "cosmos-policy-fragment",
            None,
            "policy-owner-reader",
        )
        .await
        .map_err(|e| e.to_string())?;
    let client = env.kube().client().await.map_err(|e| e.to_string())?;
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cosmos-kubeconfig", "namespace": OPERATOR_NAMESPACE},
        "stringData": {"kubeconfig": reader.kubeconfig.to_string()}});
    Api::<Secret>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .patch("cosmos-kubeconfig", &apply, &Patch::Apply(&secret))
        .await
        .map_err(|e| format!("Secret cosmos-kubeconfig: {e}"))?;
    let contributors = example("second-cluster/owner-contributors.yaml")?;
    let tailnets: Api<kube::api::DynamicObject> =
        Api::all_with(client.clone(), &tailnet_resource("Tailnet", "tailnets"));
    tailnets
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(&contributors),
        )
        .await
        .map_err(|e| format!("Tailnet demo, contributors: {e}"))?;
    println!(
        "demo B: applied examples/second-cluster/; the owner (Tailnet demo) reads cosmos's fragment through B's API; waiting for B's egress…"
    );
    wait_ready(&egresses_b, "TailnetEgress", "site").await?;
    let target = format!("b-db.{OPERATOR_NAMESPACE}.svc.cluster.local:5432");
    println!("demo B: a pod in team-b of the second cluster connects to {target} …");
    let run = cosmos
        .tcp_check(&client_b, "team-b", "demo-client-b", &target, 30)
        .await
        .map_err(|e| e.to_string())?;
    if !run.succeeded() {
        return Err(format!(
            "the second cluster's connection through the tailnet failed:\n{run}"
        ));
    }
    println!(
        "demo B: OK — a pod of the second cluster reached 192.0.2.10:5432 through the grant the owner merged."
    );
    print_kubectl_with(env, env.kubeconfig(), &["get", "tailnet", "-o", "wide"]);
    print_kubectl_with(
        env,
        cosmos.kube().kubeconfig(),
        &["get", "tailnet,tailnetegress", "-A", "-o", "wide"],
    );
    Ok(operator)
}

/// The operator of `tailnet-system`, in the first cluster's lab or in `cosmos`'s, once ready.
async fn start_demo_operator(
    env: &E2eEnv,
    cosmos: Option<&tno_testenv::SecondCluster>,
) -> Result<tno_testenv::OperatorProcess, String> {
    let binary = tno_testenv::workspace_operator_binary().map_err(|e| e.to_string())?;
    let args = tno_testenv::OperatorArgs::new(OPERATOR_NAMESPACE).to_args();
    let started = match cosmos {
        Some(cosmos) => env.start_operator_in(cosmos, &binary, &args).await,
        None => env.start_operator(&binary, &args).await,
    };
    let mut operator = started.map_err(|e| e.to_string())?;
    operator
        .wait_ready(std::time::Duration::from_secs(60))
        .await
        .map_err(|e| e.to_string())?;
    Ok(operator)
}

/// Server-side applies the namespaces `names`.
pub async fn apply_namespaces(client: &kube::Client, names: &[&str]) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in names {
        let object =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces
            .patch(
                ns,
                &PatchParams::apply("tno-lab").force(),
                &Patch::Apply(object),
            )
            .await
            .map_err(|e| format!("namespace {ns}: {e}"))?;
    }
    Ok(())
}

/// Waits until `kind namespace/name` has Ready=True, printing each new Ready line.
async fn wait_ready(
    api: &kube::Api<kube::api::DynamicObject>,
    kind: &str,
    name: &str,
) -> Result<kube::api::DynamicObject, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
    let mut last = String::new();
    loop {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
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
            return Ok(object);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{kind} {name} did not become Ready; last: {last}"));
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

fn backend_deployment(
    name: &str,
    args: serde_json::Value,
    tls_secret: Option<&str>,
) -> serde_json::Value {
    let mut pod = serde_json::json!({"containers": [{"name": "server",
        "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE, "args": args}]});
    if let Some(secret) = tls_secret {
        pod["containers"][0]["volumeMounts"] =
            serde_json::json!([{"name": "tls", "mountPath": "/tls", "readOnly": true}]);
        pod["volumes"] = serde_json::json!([{"name": "tls", "secret": {"secretName": secret}}]);
    }
    serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": CONSUMER_NAMESPACE},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": pod}}})
}

fn backend_service(name: &str, port: u16) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": CONSUMER_NAMESPACE},
        "spec": {"selector": {"app": name}, "ports": [{"name": "main", "port": port, "targetPort": port}]}})
}

async fn apply_object(client: &kube::Client, object: &serde_json::Value) -> Result<(), String> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let (group, version) = match object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
    {
        Some((group, version)) => (group.to_string(), version.to_string()),
        None => (
            String::new(),
            object["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ),
    };
    let resource =
        kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(&group, &version, kind));
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), CONSUMER_NAMESPACE, &resource);
    api.patch(
        name,
        &PatchParams::apply("tno-lab").force(),
        &Patch::Apply(object),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{kind} {name}: {e}"))
}

/// Runs the deps-built kubectl against the lab and prints its output (a note if it is missing).
pub fn print_kubectl(env: &E2eEnv, args: &[&str]) {
    print_kubectl_with(env, env.kubeconfig(), args);
}

/// [`print_kubectl`] against the cluster of `kubeconfig`.
fn print_kubectl_with(env: &E2eEnv, kubeconfig: &std::path::Path, args: &[&str]) {
    let kubectl = env
        .kube()
        .binaries()
        .kube_apiserver
        .with_file_name("kubectl");
    println!("\n$ kubectl {}", args.join(" "));
    let output = std::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output();
    match output {
        Ok(output) => {
            print!("{}", String::from_utf8_lossy(&output.stdout));
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
        }
        Err(error) => println!(
            "(kubectl not available at {}: {error}; run deps/build.sh kubernetes)",
            kubectl.display()
        ),
    }
    println!();
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
