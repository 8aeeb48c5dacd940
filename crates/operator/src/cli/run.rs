//! `tailnet-operator run`: flags and environment.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::controllers::context::OperatorConfig;
use crate::runtime::leader::LeaseConfig;
use crate::runtime::{self, RunSettings};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn duration(value: &str) -> Result<Duration, String> {
    tailnet_api::validate::parse_duration("flag", value).map_err(|e| e.message)
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Namespace the operator runs in (egresses, Secrets and ConfigMaps live here).
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "tailnet-system")]
    pub operator_namespace: String,
    /// Ownership marker identity; default: the uid of namespace kube-system.
    #[arg(long, env = "INSTALLATION_ID")]
    pub installation_id: Option<String>,
    /// Address of /metrics, /livez, /readyz.
    #[arg(long, env = "ADMIN_ADDRESS", default_value = "0.0.0.0:8080")]
    pub admin_address: SocketAddr,
    /// How often Headscale's state (nodes, routes, live policy) is re-read.
    #[arg(long, env = "HEADSCALE_POLL_INTERVAL", default_value = "30s", value_parser = duration)]
    pub headscale_poll_interval: Duration,
    /// An unchanged child object (Deployment, Service, ConfigMap, ...) is server-side applied
    /// again after this long at the latest; in between, resyncs send nothing unless the
    /// object changed (drift of watched kinds is repaired at once, of the others within this).
    #[arg(long, env = "REAPPLY_INTERVAL", default_value = "10m", value_parser = duration)]
    pub reapply_interval: Duration,
    /// How many TailnetEgress (and, separately, TailnetIngress) reconciles may run at once.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// Timeout of one Headscale API call.
    #[arg(long, env = "HEADSCALE_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub headscale_timeout: Duration,
    #[arg(long, env = "LEASE_NAME", default_value = "tailnet-operator-leader")]
    pub lease_name: String,
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// This replica's identity in the Lease (default: POD_NAME, else hostname and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Default image of the tailnet-agent container (a Tailnet's spec.agent.image overrides it).
    #[arg(long, env = "AGENT_IMAGE", default_value = tailnet_render::images::DEFAULT_AGENT_IMAGE)]
    pub agent_image: String,
    /// Default image of the tailscale container (spec.agent.tailscaleImage overrides it).
    #[arg(long, env = "TAILSCALE_IMAGE", default_value = tailnet_render::images::DEFAULT_TAILSCALE_IMAGE)]
    pub tailscale_image: String,
    /// Approve routes that cover IP egress targets: render `autoApprovers` for them and approve
    /// what approver nodes already advertise (Apply mode). `false` leaves route approval to
    /// the Headscale admin.
    #[arg(long, env = "ROUTE_APPROVAL", default_value_t = true, action = clap::ArgAction::Set)]
    pub route_approval: bool,
    /// Cluster DNS domain (backend Service names).
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    init_tracing(args.log_format);
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
            },
            cluster_domain: args.cluster_domain.clone(),
            approve_routes: args.route_approval,
            reapply_interval: args.reapply_interval,
            max_concurrent_reconciles: args.max_concurrent_reconciles,
        },
        installation_id: args.installation_id.clone(),
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
