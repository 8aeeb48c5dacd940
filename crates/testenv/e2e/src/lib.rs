//! The end-to-end test environment (SPEC §9): one lab holding the Kubernetes environment
//! ([`tno_testenv_kube`]) and the tailnet ([`tno_testenv_tailnet`]), so agent pods, the remote
//! site's subnet router, the laptop and the operator all reach Headscale at the same URL.
//!
//! - [`E2eEnv::shared`]: the kube env of [`tno_testenv_kube::shared`] plus a
//!   [`tno_testenv_tailnet::TailnetEnv`] started in its lab, once per test process, torn down
//!   at exit. [`E2eEnv::start`] composes one around any [`tno_testenv_kube::KubeEnv`] (the
//!   `tno-lab` binary does).
//! - [`E2eEnv::start_operator`]: runs a `tailnet-operator` binary in a netns on the lab with a
//!   kubeconfig for the apiserver's lab address; [`OperatorProcess`] forwards its admin server
//!   to the root netns and can SIGTERM/SIGKILL it.
//! - Operator inputs: [`E2eEnv::create_bootstrap`] (API-key Secret and base-policy ConfigMap),
//!   [`E2eEnv::base_policy`], [`E2eEnv::tailnet_object`].
//! - Tailnet helpers: [`E2eEnv::headscale_url`], [`E2eEnv::api_key`], [`E2eEnv::node`],
//!   [`E2eEnv::approve_routes`], [`E2eEnv::approve_site_routes`].
//! - Client pods: [`E2eEnv::run_pod`] and [`E2eEnv::tcp_check`] (the test-servers image's
//!   `tcp-check`, e.g. against `remote-db.<ns>.svc.cluster.local:5432`).
//!
//! - [`E2eEnv::start_second_cluster`]: a second cluster ([`SecondCluster`]: own control plane,
//!   kubelet, kube-proxy, CoreDNS, other pod and Service CIDRs) on the same Headscale;
//!   [`E2eEnv::start_operator_in`] runs an operator in it.
//! - [`E2eEnv::start_network_policy_enforcer`]: kube-router's firewall controller in the lab
//!   netns, so NetworkPolicies are enforced for the test that starts it ([`NetworkPolicyEnforcer`]).
//! - [`quick_start`]: the marked blocks of docs/quick-start.md, extracted and run in order.
//! - [`E2eEnv::start_prometheus`]: a real Prometheus in the lab scraping the operator and the
//!   agents through Kubernetes SD with the chart's ServiceMonitor/PodMonitor
//!   ([`ChartMonitoring`], [`scrape_configs`]) and evaluating the chart's PrometheusRule.
//! - [`promtool_check_metrics`]: `promtool check metrics` on a live scrape (zero problems or
//!   an error with promtool's report).
//! - [`E2eEnv::start_cert_manager`]: cert-manager's real controller (our wrapper main over its
//!   controller packages, `deps/build.sh cert-manager-controller`) against the lab's API server;
//!   [`E2eEnv::apply_ca_cluster_issuer`] and [`trigger_renewal`] (what `cmctl renew` does).
//! - Lab plumbing: [`LabIssuer`] (cert-manager stand-in signing Certificates with a [`LabCa`])
//!   and [`E2eEnv::project_extra_records`] (the operator's DNS ConfigMap mounted into Headscale
//!   by the test kubelet's volume code: [`ExtraRecordsProjection`]).
//!
//! - [`gateway_conformance`]: the upstream Gateway API conformance suite run against the lab
//!   from a kernel-mode tailnet node (`tests/gateway_conformance.rs`, opt-in).
//!
//! Needs root, the binaries of `deps/build.sh` and the workspace's own binaries
//! (`cargo build --workspace --bins`: `tailnet-agent`, `tno-test-servers`, `tailnet-operator`).

mod apiserver_metrics;
mod cert_manager;
mod env;
mod error;
mod extra_records;
pub mod gateway_conformance;
mod network_policy;
mod operator;
mod pods;
pub mod product;
mod prometheus;
mod promtool;
pub mod quick_start;
mod second_cluster;
mod stand_ins;
mod tailnet_client;

pub use apiserver_metrics::{
    ApiserverRequests, apiserver_requests, apiserver_writes, writes_between,
};
pub use cert_manager::{
    CLUSTER_RESOURCE_NAMESPACE, CertManagerController, cert_manager_resource, condition_status,
    trigger_renewal,
};
pub use env::{
    API_KEY_KEY, BASE_POLICY_CONFIG_MAP, BASE_POLICY_KEY, BOOTSTRAP_SECRET, E2eEnv, E2eNamespace,
    HOSTS_CONFIG_MAP, PLATFORM_GROUP, SERVER_CA_CONFIG_MAP,
};
pub use error::{E2eError, Result};
pub use extra_records::{EXTRA_RECORDS_KEY, ExtraRecordsProjection};
pub use network_policy::{NetworkPolicyEnforcer, lab_cluster_cidrs};
pub use operator::{
    E2E_AGENT_IMAGE, E2E_TAILSCALE_IMAGE, OFFICIAL_TAILSCALE_IMAGE, OperatorArgs, OperatorProcess,
    workspace_operator_binary,
};
pub use pods::{CLIENT_POD_DEADLINE, PodRun, tcp_check_pod, tls_check_pod};
pub use prometheus::{ChartMonitoring, LabPrometheus, scrape_configs};
pub use promtool::{http_body, promtool_check_metrics};
pub use second_cluster::{FragmentReader, SecondCluster, token_kubeconfig};
pub use stand_ins::{LabCa, LabIssuer};
pub use tailnet_client::https_get;
