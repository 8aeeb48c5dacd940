//! Operator metrics (Prometheus text on the admin port's `/metrics`).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tailnet_headscale::{CallObserver, Endpoint};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiCallLabels {
    pub endpoint: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub tailnet: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TailnetLabels {
    pub tailnet: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub kind: String,
    pub condition: String,
    pub status: String,
}

/// All operator metrics; cheap to clone (every family is reference-counted).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Arc<Registry>,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub headscale_calls: Family<ApiCallLabels, Counter>,
    pub headscale_call_duration: Family<ApiCallLabels, Histogram>,
    /// `result`: applied, unchanged, rejected, dry_run, owned_elsewhere.
    pub policy_syncs: Family<PolicyLabels, Counter>,
    pub policy_size_bytes: Family<TailnetLabels, Gauge>,
    pub headscale_reachable: Family<TailnetLabels, Gauge>,
    pub routes_approved: Family<TailnetLabels, Counter>,
    pub resources_by_condition: Family<ConditionLabels, Gauge>,
    pub leader: Gauge,
}

fn duration_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.0, 14)
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tailnet_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(duration_buckets())
            });
        let headscale_calls = Family::<ApiCallLabels, Counter>::default();
        let headscale_call_duration =
            Family::<ApiCallLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(duration_buckets())
            });
        let policy_syncs = Family::<PolicyLabels, Counter>::default();
        let policy_size_bytes = Family::<TailnetLabels, Gauge>::default();
        let headscale_reachable = Family::<TailnetLabels, Gauge>::default();
        let routes_approved = Family::<TailnetLabels, Counter>::default();
        let resources_by_condition = Family::<ConditionLabels, Gauge>::default();
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Reconciliations by controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciliations by controller and reason",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconciliations",
            reconcile_duration.clone(),
        );
        registry.register(
            "headscale_api_calls",
            "Headscale API calls by endpoint and outcome (HTTP status or transport error)",
            headscale_calls.clone(),
        );
        registry.register(
            "headscale_api_call_duration_seconds",
            "Duration of Headscale API calls",
            headscale_call_duration.clone(),
        );
        registry.register("policy_syncs", "Policy synchronisations by result (applied, unchanged, rejected, dry_run, owned_elsewhere)", policy_syncs.clone());
        registry.register(
            "policy_size_bytes",
            "Size of the rendered policy document",
            policy_size_bytes.clone(),
        );
        registry.register(
            "headscale_reachable",
            "1 when Headscale answers and accepts the API key",
            headscale_reachable.clone(),
        );
        registry.register(
            "routes_approved",
            "Routes approved by the operator's catch-up",
            routes_approved.clone(),
        );
        registry.register(
            "resources_by_condition",
            "Resources by kind, condition and status",
            resources_by_condition.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            reconciles,
            reconcile_errors,
            reconcile_duration,
            headscale_calls,
            headscale_call_duration,
            policy_syncs,
            policy_size_bytes,
            headscale_reachable,
            routes_approved,
            resources_by_condition,
            leader,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    pub fn policy_sync(&self, tailnet: &str, result: &str) {
        self.policy_syncs
            .get_or_create(&PolicyLabels {
                tailnet: tailnet.to_string(),
                result: result.to_string(),
            })
            .inc();
    }
}

impl CallObserver for Metrics {
    fn observe(&self, endpoint: Endpoint, outcome: &str, elapsed: Duration) {
        let labels = ApiCallLabels {
            endpoint: endpoint.label().to_string(),
            outcome: outcome.to_string(),
        };
        self.headscale_calls.get_or_create(&labels).inc();
        self.headscale_call_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }
}
