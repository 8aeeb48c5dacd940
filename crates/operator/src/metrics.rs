//! Operator metrics (the admin port's `/metrics`, OpenMetrics or Prometheus text as the
//! scraper asks: [`tailnet_telemetry::exposition`]), with `tailnet_operator_build_info` and
//! the `process_*` metrics.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use crate::scope::ScopedStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tailnet_headscale::{CallObserver, Endpoint};
use tailnet_telemetry::exposition::Format;

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

/// `decision`: why a child object was applied, or `unchanged` when the apply was skipped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub kind: String,
    pub decision: String,
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

/// One condition of one resource (`tailnet_operator_resource_condition`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceConditionLabels {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub condition: String,
    pub status: String,
    pub reason: String,
}

/// The objects of one kind and their conditions, read at scrape time (one per registered
/// kind, and the Tailnets).
pub struct ConditionSource {
    kind: String,
    each: Box<VisitConditions>,
}

/// Calls its argument with (namespace, name, conditions) of every object.
type VisitConditions = dyn Fn(&mut dyn FnMut(&str, &str, &[Condition])) + Send + Sync;

impl ConditionSource {
    /// The objects in `store` (of any watch part) with their conditions (`None`: no status).
    pub fn scoped<K>(
        store: ScopedStore<K>,
        conditions: impl Fn(&K) -> Option<&[Condition]> + Send + Sync + 'static,
    ) -> Self
    where
        K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        ConditionSource {
            kind: K::kind(&()).to_string(),
            each: Box::new(move |emit| {
                for object in store.state() {
                    emit(
                        &object.namespace().unwrap_or_default(),
                        &object.name_any(),
                        conditions(&object).unwrap_or_default(),
                    );
                }
            }),
        }
    }
}

/// Emits, at scrape time, one `resource_condition` sample (value 1) per condition of every
/// Tailnet, TailnetEgress and TailnetIngress in the caches, so alerts can name the object and
/// the condition's reason. Only the leader emits (standbys would duplicate every series).
struct ConditionCollector {
    sources: Arc<OnceLock<Vec<ConditionSource>>>,
    leader: Gauge,
}

impl std::fmt::Debug for ConditionCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConditionCollector")
            .field("watching", &self.sources.get().is_some())
            .finish()
    }
}

fn condition_samples(
    family: &Family<ResourceConditionLabels, Gauge>,
    kind: &str,
    namespace: &str,
    name: &str,
    conditions: &[Condition],
) {
    for c in conditions {
        family
            .get_or_create(&ResourceConditionLabels {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                condition: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
            })
            .set(1);
    }
}

impl Collector for ConditionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = Family::<ResourceConditionLabels, Gauge>::default();
        if let Some(sources) = self.sources.get().filter(|_| self.leader.get() == 1) {
            for source in sources {
                (source.each)(&mut |namespace, name, conditions| {
                    condition_samples(&family, &source.kind, namespace, name, conditions);
                });
            }
        }
        let metric = encoder.encode_descriptor(
            "resource_condition",
            "1 for each condition (type, status, reason) of each Tailnet, TailnetEgress and TailnetIngress (leader only)",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

/// All operator metrics; cheap to clone (every family is reference-counted).
#[derive(Clone)]
pub struct Metrics {
    pub registry: Arc<Registry>,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    /// Reconciles running now (kube-runtime's scheduler queue itself is not observable).
    pub reconciles_in_flight: Family<ControllerLabels, Gauge>,
    pub headscale_calls: Family<ApiCallLabels, Counter>,
    pub headscale_call_duration: Family<ApiCallLabels, Histogram>,
    pub child_applies: Family<ApplyLabels, Counter>,
    /// `result`: applied, unchanged, rejected, dry_run, owned_elsewhere, would_lock_down.
    pub policy_syncs: Family<PolicyLabels, Counter>,
    pub policy_size_bytes: Family<TailnetLabels, Gauge>,
    pub headscale_reachable: Family<TailnetLabels, Gauge>,
    /// Expiry of the operator's own Headscale API key (Unix seconds); no series when the
    /// key does not expire or its expiry is unknown.
    pub api_key_expiry: Family<TailnetLabels, Gauge>,
    pub routes_approved: Family<TailnetLabels, Counter>,
    pub resources_by_condition: Family<ConditionLabels, Gauge>,
    pub leader: Gauge,
    condition_sources: Arc<OnceLock<Vec<ConditionSource>>>,
}

fn duration_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(0.005, 2.0, 14)
}

impl Default for Metrics {
    fn default() -> Self {
        let mut root = Registry::default();
        tailnet_telemetry::register_common(
            &mut root,
            "tailnet_operator",
            env!("CARGO_PKG_VERSION"),
        );
        let registry = root.sub_registry_with_prefix("tailnet_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(duration_buckets())
            });
        let reconciles_in_flight = Family::<ControllerLabels, Gauge>::default();
        let headscale_calls = Family::<ApiCallLabels, Counter>::default();
        let headscale_call_duration =
            Family::<ApiCallLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(duration_buckets())
            });
        let child_applies = Family::<ApplyLabels, Counter>::default();
        let policy_syncs = Family::<PolicyLabels, Counter>::default();
        let policy_size_bytes = Family::<TailnetLabels, Gauge>::default();
        let headscale_reachable = Family::<TailnetLabels, Gauge>::default();
        let api_key_expiry = Family::<TailnetLabels, Gauge>::default();
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
            "reconciles_in_flight",
            "Reconciliations running now, by controller (at --max-concurrent-reconciles more due objects wait)",
            reconciles_in_flight.clone(),
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
        registry.register(
            "child_applies",
            "Child objects by kind and decision: applied because not_applied (by this process), changed, drifted (edited or deleted by someone else) or due (re-apply interval), or skipped as unchanged",
            child_applies.clone(),
        );
        registry.register("policy_syncs", "Policy synchronisations by result (applied, unchanged, rejected, dry_run, owned_elsewhere, would_lock_down)", policy_syncs.clone());
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
            "headscale_api_key_expiry_timestamp_seconds",
            "Expiry of the operator's Headscale API key as Headscale lists it (Unix seconds; absent when it does not expire or is not listed)",
            api_key_expiry.clone(),
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
        let condition_sources = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(ConditionCollector {
            sources: condition_sources.clone(),
            leader: leader.clone(),
        }));
        Metrics {
            registry: Arc::new(root),
            reconciles,
            reconcile_errors,
            reconcile_duration,
            reconciles_in_flight,
            headscale_calls,
            headscale_call_duration,
            child_applies,
            policy_syncs,
            policy_size_bytes,
            headscale_reachable,
            api_key_expiry,
            routes_approved,
            resources_by_condition,
            leader,
            condition_sources,
        }
    }
}

impl Metrics {
    /// Makes `/metrics` report the conditions of the objects of these sources, in this order
    /// (`tailnet_operator_resource_condition`); the first call wins.
    pub fn watch_conditions(&self, sources: Vec<ConditionSource>) {
        let _ = self.condition_sources.set(sources);
    }

    /// `/metrics` in `format` (empty if encoding fails, which only a broken collector does).
    pub fn encode_as(&self, format: Format) -> String {
        format.encode(&self.registry).unwrap_or_default()
    }

    /// Counts a reconcile of `labels`' controller in `reconciles_in_flight` until the returned
    /// guard is dropped.
    pub fn reconcile_started(&self, labels: &ControllerLabels) -> InFlight {
        let gauge = self.reconciles_in_flight.get_or_create(labels).clone();
        gauge.inc();
        InFlight(gauge)
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

/// One running reconcile; dropping it (also with the reconcile future, at shutdown) ends it.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    #[tokio::test]
    async fn in_flight_counts_running_reconciles_also_when_one_is_dropped() {
        let metrics = Metrics::default();
        let egress = ControllerLabels {
            controller: "egress".into(),
        };
        let in_flight = |m: &Metrics| m.reconciles_in_flight.get_or_create(&egress).get();
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let running = {
            let metrics = metrics.clone();
            let egress = egress.clone();
            tokio::spawn(async move {
                let _guard = metrics.reconcile_started(&egress);
                let _ = wait.await;
            })
        };
        let second = metrics.reconcile_started(&egress);
        tokio::task::yield_now().await;
        while in_flight(&metrics) < 2 {
            tokio::task::yield_now().await;
        }
        let text = metrics.encode_as(Format::Prometheus);
        assert!(
            text.contains("tailnet_operator_reconciles_in_flight{controller=\"egress\"} 2"),
            "{text}"
        );
        drop(second);
        assert_eq!(in_flight(&metrics), 1);
        // Cancelled (as at shutdown): the guard goes with the future.
        running.abort();
        let _ = running.await;
        drop(release);
        assert_eq!(in_flight(&metrics), 0);
    }

    /// Every family has HELP and TYPE where promtool and the Prometheus text format expect
    /// them, and the common metrics are there.
    #[test]
    fn text_exposition_has_help_for_every_family_and_the_common_metrics() {
        let metrics = Metrics::default();
        let labels = ControllerLabels {
            controller: "tailnet".into(),
        };
        metrics.reconciles.get_or_create(&labels).inc();
        metrics
            .routes_approved
            .get_or_create(&TailnetLabels {
                tailnet: "t".into(),
            })
            .inc();
        let text = metrics.encode_as(Format::Prometheus);
        for family in [
            "tailnet_operator_reconciles_total",
            "tailnet_operator_routes_approved_total",
            "tailnet_operator_build_info",
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
        ] {
            let help = format!("# HELP {family} ");
            assert!(
                text.lines().any(|line| line.starts_with(&help)),
                "no HELP for {family}:\n{text}"
            );
        }
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            text.contains(&format!(
                "tailnet_operator_build_info{{version=\"{version}\",git_commit="
            )),
            "{text}"
        );
        let open = metrics.encode_as(Format::OpenMetrics);
        assert!(
            open.contains("# HELP tailnet_operator_reconciles Reconciliations by controller."),
            "{open}"
        );
        assert!(open.ends_with("# EOF\n"), "{open}");
    }

    #[test]
    fn resource_conditions_are_exported_by_the_leader_only() {
        let metrics = Metrics::default();
        let (tailnets, _) = store::<tailnet_api::Tailnet>();
        let (ingresses, _) = store::<tailnet_api::TailnetIngress>();
        let (egresses, mut egress_writer) = store::<tailnet_api::TailnetEgress>();
        let mut egress: tailnet_api::TailnetEgress = serde_json::from_value(serde_json::json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
            "metadata": {"name": "site", "namespace": "tailnet-system"},
            "spec": {"tailnetRef": {"name": "t"}, "consumerNamespaces": [], "targets": []}
        }))
        .expect("egress JSON");
        egress.status = Some(tailnet_api::TailnetEgressStatus {
            conditions: vec![condition("RoutesReady", "False", "RouteNotApproved")],
            ..Default::default()
        });
        egress_writer.apply_watcher_event(&Event::Apply(egress));
        metrics.watch_conditions(vec![
            ConditionSource::scoped(
                ScopedStore::cluster(tailnets),
                |t: &tailnet_api::Tailnet| t.status.as_ref().map(|s| s.conditions.as_slice()),
            ),
            ConditionSource::scoped(
                ScopedStore::cluster(egresses),
                |e: &tailnet_api::TailnetEgress| e.status.as_ref().map(|s| s.conditions.as_slice()),
            ),
            ConditionSource::scoped(
                ScopedStore::cluster(ingresses),
                |i: &tailnet_api::TailnetIngress| {
                    i.status.as_ref().map(|s| s.conditions.as_slice())
                },
            ),
        ]);
        let sample = r#"tailnet_operator_resource_condition{kind="TailnetEgress",namespace="tailnet-system",name="site",condition="RoutesReady",status="False",reason="RouteNotApproved"} 1"#;
        assert!(
            !metrics.encode_as(Format::Prometheus).contains(sample),
            "a standby must not export"
        );
        metrics.leader.set(1);
        let text = metrics.encode_as(Format::Prometheus);
        assert!(text.contains(sample), "{text}");
        assert!(
            text.contains("# TYPE tailnet_operator_resource_condition gauge"),
            "{text}"
        );
    }
}
