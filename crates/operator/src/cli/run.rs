//! `tailnet-operator run`: flags and environment.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::controllers::config::OperatorConfig;
use crate::runtime::leader::LeaseConfig;
use crate::runtime::{self, RunSettings};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One flat JSON object per line (the event's fields next to timestamp, level, target).
    Json,
}

/// `run --help` examples.
pub const AFTER_HELP: &str = "\
Every flag can also be set by its environment variable, TAILNET_OPERATOR_<FLAG> (e.g.
TAILNET_OPERATOR_OPERATOR_NAMESPACE); a flag on the command line wins. The unprefixed names of
earlier releases (OPERATOR_NAMESPACE, INSTALLATION_ID, POD_NAME, ...) are still read, with a
deprecation warning, when the prefixed one is unset; they go away in the next release.

Examples:
  # In the cluster (what the Helm chart runs):
  tailnet-operator run --operator-namespace tailnet-system

  # Outside the cluster, against the current kubeconfig context, JSON logs:
  RUST_LOG=tailnet_operator=debug tailnet-operator run \\
      --operator-namespace tailnet-system --log-format json --admin-address 127.0.0.1:8080
";

/// Flags added after the environment names got the `TAILNET_OPERATOR_` prefix (no old name).
#[cfg(test)]
pub const ENV_WITHOUT_OLD_NAME: &[&str] = &[
    "watch_namespaces",
    "apply_tailnet",
    "agent_image_pull_policy",
    "tailscale_image_pull_policy",
    "cluster_cidrs",
    "cluster_dns_pods",
    "restrict_agent_egress",
];

/// Flag id, the environment variable of earlier releases, its `TAILNET_OPERATOR_` name.
pub const DEPRECATED_ENV: &[(&str, &str, &str)] = &[
    (
        "operator_namespace",
        "OPERATOR_NAMESPACE",
        "TAILNET_OPERATOR_OPERATOR_NAMESPACE",
    ),
    (
        "installation_id",
        "INSTALLATION_ID",
        "TAILNET_OPERATOR_INSTALLATION_ID",
    ),
    (
        "admin_address",
        "ADMIN_ADDRESS",
        "TAILNET_OPERATOR_ADMIN_ADDRESS",
    ),
    (
        "headscale_poll_interval",
        "HEADSCALE_POLL_INTERVAL",
        "TAILNET_OPERATOR_HEADSCALE_POLL_INTERVAL",
    ),
    (
        "reapply_interval",
        "REAPPLY_INTERVAL",
        "TAILNET_OPERATOR_REAPPLY_INTERVAL",
    ),
    (
        "max_concurrent_reconciles",
        "MAX_CONCURRENT_RECONCILES",
        "TAILNET_OPERATOR_MAX_CONCURRENT_RECONCILES",
    ),
    (
        "headscale_timeout",
        "HEADSCALE_TIMEOUT",
        "TAILNET_OPERATOR_HEADSCALE_TIMEOUT",
    ),
    ("lease_name", "LEASE_NAME", "TAILNET_OPERATOR_LEASE_NAME"),
    (
        "lease_duration",
        "LEASE_DURATION",
        "TAILNET_OPERATOR_LEASE_DURATION",
    ),
    ("identity", "POD_NAME", "TAILNET_OPERATOR_POD_NAME"),
    ("log_format", "LOG_FORMAT", "TAILNET_OPERATOR_LOG_FORMAT"),
    ("agent_image", "AGENT_IMAGE", "TAILNET_OPERATOR_AGENT_IMAGE"),
    (
        "tailscale_image",
        "TAILSCALE_IMAGE",
        "TAILNET_OPERATOR_TAILSCALE_IMAGE",
    ),
    (
        "route_approval",
        "ROUTE_APPROVAL",
        "TAILNET_OPERATOR_ROUTE_APPROVAL",
    ),
    (
        "cluster_domain",
        "CLUSTER_DOMAIN",
        "TAILNET_OPERATOR_CLUSTER_DOMAIN",
    ),
];

/// For one release: when a flag's `TAILNET_OPERATOR_*` variable is unset but its old
/// unprefixed name is set, `run` reads the old name (clap cannot alias environment names, so
/// the flag's `env` is switched to it). Returns the deprecation warnings to print.
pub fn with_deprecated_env(
    mut command: clap::Command,
    lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> (clap::Command, Vec<String>) {
    let mut warnings = Vec::new();
    for (id, old, new) in DEPRECATED_ENV {
        if lookup(new).is_none() && lookup(old).is_some() {
            warnings.push(format!(
                "environment variable {old} is deprecated and will be ignored in the next release; set {new} instead"
            ));
            command = command.mut_subcommand("run", |run| run.mut_arg(*id, |arg| arg.env(*old)));
        }
    }
    (command, warnings)
}

fn duration(value: &str) -> Result<Duration, String> {
    tailnet_api::validate::parse_duration("flag", value).map_err(|e| e.message)
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Namespace the operator runs in (egresses, Secrets and ConfigMaps live here; the chart
    /// passes its release namespace).
    #[arg(
        long,
        env = "TAILNET_OPERATOR_OPERATOR_NAMESPACE",
        default_value = "tailnet-system"
    )]
    pub operator_namespace: String,
    /// Identity of this installation in the policy's ownership marker (written as
    /// `<id>/<tailnet>`); default: the uid of namespace kube-system
    /// (`kubectl get ns kube-system -o jsonpath='{.metadata.uid}'`). Pass the same value to
    /// `render --installation-id` to preview the same marker.
    #[arg(long, env = "TAILNET_OPERATOR_INSTALLATION_ID")]
    pub installation_id: Option<String>,
    /// Address of /metrics, /livez, /readyz.
    #[arg(
        long,
        env = "TAILNET_OPERATOR_ADMIN_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub admin_address: SocketAddr,
    /// How often Headscale's state (nodes, routes, live policy) is re-read.
    #[arg(long, env = "TAILNET_OPERATOR_HEADSCALE_POLL_INTERVAL", default_value = "30s", value_parser = duration)]
    pub headscale_poll_interval: Duration,
    /// An unchanged child object (Deployment, Service, ConfigMap, ...) is server-side applied
    /// again after this long at the latest; in between, resyncs send nothing unless the
    /// object changed (drift of watched kinds is repaired at once, of the others within this).
    #[arg(long, env = "TAILNET_OPERATOR_REAPPLY_INTERVAL", default_value = "10m", value_parser = duration)]
    pub reapply_interval: Duration,
    /// How many TailnetEgress (and, separately, TailnetIngress) reconciles may run at once.
    #[arg(long, env = "TAILNET_OPERATOR_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// Work only in these namespaces (comma-separated; the operator namespace is always
    /// included): TailnetIngresses (and egresses) elsewhere are not watched, and the operator
    /// needs the namespaced verbs only there (chart value `watchNamespaces` renders a Role per
    /// namespace). Empty: the whole cluster.
    #[arg(long, env = "TAILNET_OPERATOR_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Timeout of one Headscale API call.
    #[arg(long, env = "TAILNET_OPERATOR_HEADSCALE_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub headscale_timeout: Duration,
    /// Name of the coordination.k8s.io Lease (in the operator namespace) that elects the one
    /// active replica.
    #[arg(
        long,
        env = "TAILNET_OPERATOR_LEASE_NAME",
        default_value = "tailnet-operator-leader"
    )]
    pub lease_name: String,
    /// How long a leader's Lease holds without renewal: a standby takes over after this; the
    /// leader renews every third of it and steps down when it cannot renew within two thirds.
    #[arg(long, env = "TAILNET_OPERATOR_LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// This replica's identity in the Lease (default: the pod name, else hostname and pid).
    #[arg(long, env = "TAILNET_OPERATOR_POD_NAME")]
    pub identity: Option<String>,
    /// Log format on stderr (`RUST_LOG` sets the filter, default `info`).
    #[arg(
        long,
        env = "TAILNET_OPERATOR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Default image of the tailnet-agent container (a Tailnet's spec.agent.image overrides it).
    #[arg(long, env = "TAILNET_OPERATOR_AGENT_IMAGE", default_value = tailnet_render::images::DEFAULT_AGENT_IMAGE)]
    pub agent_image: String,
    /// Default image of the tailscale container (spec.agent.tailscaleImage overrides it).
    #[arg(long, env = "TAILNET_OPERATOR_TAILSCALE_IMAGE", default_value = tailnet_render::images::DEFAULT_TAILSCALE_IMAGE)]
    pub tailscale_image: String,
    /// `imagePullPolicy` of the agent pods' tailnet-agent container (default: Kubernetes'
    /// default, IfNotPresent unless the tag is `latest`).
    #[arg(long, env = "TAILNET_OPERATOR_AGENT_IMAGE_PULL_POLICY", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub agent_image_pull_policy: Option<String>,
    /// `imagePullPolicy` of the agent pods' tailscale container (default as above).
    #[arg(long, env = "TAILNET_OPERATOR_TAILSCALE_IMAGE_PULL_POLICY", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub tailscale_image_pull_policy: Option<String>,
    /// Approve routes that cover IP egress targets: render `autoApprovers` for them and approve
    /// what approver nodes already advertise (Apply mode). `false` leaves route approval to
    /// the Headscale admin.
    #[arg(long, env = "TAILNET_OPERATOR_ROUTE_APPROVAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub route_approval: bool,
    /// Cluster DNS domain (backend Service names).
    #[arg(
        long,
        env = "TAILNET_OPERATOR_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    pub cluster_domain: String,
    /// The cluster's own address ranges, comma-separated: pod and Service CIDRs (IPv4 and, on a
    /// dual-stack cluster, IPv6), e.g. `10.244.0.0/16,10.96.0.0/12`. Set: the agents' egress
    /// NetworkPolicy lets the tailnet's transport (UDP, TCP 443) go to any address outside
    /// these ranges only, and DNS only to the cluster's DNS pods (`--cluster-dns-pods`).
    /// Unset: transport and DNS may go to any address, in-cluster pods and Services included.
    #[arg(long, env = "TAILNET_OPERATOR_CLUSTER_CIDRS", value_delimiter = ',', value_parser = tailnet_render::reach::parse_cidr)]
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    /// The cluster's DNS pods, `namespace/key=value[,key=value...]`: the only DNS servers the
    /// agents may reach when `--cluster-cidrs` is set.
    #[arg(long, env = "TAILNET_OPERATOR_CLUSTER_DNS_PODS", default_value = tailnet_render::reach::DEFAULT_DNS_PODS)]
    pub cluster_dns_pods: tailnet_render::reach::DnsPods,
    /// Restrict the egress of TailnetIngress and Service agents to their backends, DNS, the
    /// Kubernetes API, Headscale and the tailnet's transport. `false`: no egress rules (e.g. on
    /// a CNI whose `ipBlock` does not match node addresses, such as Cilium without
    /// `policy-cidr-match-mode: nodes`, where the Kubernetes API rule would cut agents off).
    #[arg(long, env = "TAILNET_OPERATOR_RESTRICT_AGENT_EGRESS", default_value_t = true, action = clap::ArgAction::Set)]
    pub restrict_agent_egress: bool,
    /// A Tailnet manifest (YAML) to server-side apply at start, retried until the Tailnet CRD
    /// is served (field manager `tailnet-operator-chart`). The Helm chart's `tailnet.create`
    /// mounts its Tailnet here, so CRDs and Tailnet come with one `helm install`.
    #[arg(long, env = "TAILNET_OPERATOR_APPLY_TAILNET")]
    pub apply_tailnet: Option<std::path::PathBuf>,
}

/// Logs on stderr; JSON is flat (fields at the top level), as the agent's.
fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal as _;
    use tailnet_telemetry::logging;
    let format = match format {
        LogFormat::Json => logging::LogFormat::Json,
        LogFormat::Text => logging::LogFormat::Text,
    };
    logging::init(format, std::io::stderr, std::io::stderr().is_terminal());
}

pub fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    init_tracing(args.log_format);
    // A bad manifest is a configuration error: refused at start, before anything runs.
    let apply_tailnet = args
        .apply_tailnet
        .as_deref()
        .map(runtime::chart_tailnet::ChartTailnet::read)
        .transpose()?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let settings = RunSettings {
        operator: OperatorConfig {
            operator_namespace: args.operator_namespace.clone(),
            installation_id: String::new(),
            headscale_poll: args.headscale_poll_interval,
            headscale_timeout: args.headscale_timeout,
            images: tailnet_render::images::Images {
                agent: args.agent_image.clone(),
                tailscale: args.tailscale_image.clone(),
                agent_pull_policy: args.agent_image_pull_policy.clone(),
                tailscale_pull_policy: args.tailscale_image_pull_policy.clone(),
            },
            cluster_domain: args.cluster_domain.clone(),
            approve_routes: args.route_approval,
            reapply_interval: args.reapply_interval,
            max_concurrent_reconciles: args.max_concurrent_reconciles,
            scope: crate::scope::WatchScope::new(&args.operator_namespace, &args.watch_namespaces),
            cluster_network: (!args.cluster_cidrs.is_empty()).then(|| {
                tailnet_render::reach::ClusterNetwork {
                    cidrs: args.cluster_cidrs.clone(),
                    dns: args.cluster_dns_pods.clone(),
                }
            }),
            restrict_agent_egress: args.restrict_agent_egress,
        },
        installation_id: args.installation_id.clone(),
        apply_tailnet,
        admin_address: args.admin_address,
        lease: LeaseConfig {
            name: args.lease_name.clone(),
            namespace: args.operator_namespace.clone(),
            identity,
            duration: args.lease_duration,
            renew_every: args.lease_duration / 3,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(runtime::run(settings))?;
    Ok(())
}
