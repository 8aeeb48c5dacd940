//! How the Tailnet controller wires itself: the Tailnets (debounced: one policy render serves
//! a burst of changes), the operator namespace's ConfigMaps (base policy, hosts, contributor
//! fragments) and Secrets (API keys), the egress Services (cluster IPs for DNS), and the
//! objects of every registered agent kind (their Tailnet's policy and DNS depend on them).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::{PredicateConfig, WatchStreamExt};
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;

use super::super::agent::wiring::Wired;
use super::super::context::Context;
use crate::runtime::caches::{Stop, WatchBackoff, log_result};

/// How long the Tailnet controller waits for more changes before reconciling (hundreds of
/// resources applied at once each trigger the Tailnet; without a pause every change rendered
/// and compared again).
const TAILNET_DEBOUNCE: Duration = Duration::from_millis(500);

/// The Tailnet controller before its context exists (its store is part of the context).
/// Triggered by a Tailnet only when [`not_status`] changes: its own status writes (every
/// reconcile may write one) do not trigger it again.
pub fn controller(client: &kube::Client) -> Controller<Tailnet> {
    let (reader, writer) = reflector::store();
    let tailnets = watcher(
        Api::<Tailnet>::all(client.clone()),
        watcher::Config::default(),
    )
    .reflect(writer)
    .applied_objects()
    .predicate_filter(not_status, PredicateConfig::default());
    Controller::for_stream(tailnets, reader)
        .with_config(controller::Config::default().debounce(TAILNET_DEBOUNCE))
        .trigger_backoff(WatchBackoff::default())
}

/// The predicate of the Tailnet watch: a hash of what the controller reads besides the
/// status (generation: the spec; labels, annotations, deletion). A change of the status
/// alone (resourceVersion and managedFields move with it) hashes the same.
pub fn not_status(tailnet: &Tailnet) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = &tailnet.metadata;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// The Tailnet controller with every watch, ready to be polled.
pub fn run(
    controller: Controller<Tailnet>,
    ctx: Arc<Context>,
    kinds: &[Box<dyn Wired>],
    stop: Stop,
) -> BoxFuture<'static, ()> {
    let client = ctx.client.clone();
    let ns = ctx.config.operator_namespace.clone();
    let tailnets = controller.store();
    let mut controller = controller
        .watches(
            Api::<ConfigMap>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_config_map(tailnets.clone()),
        )
        .watches(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
            by_secret(tailnets),
        )
        .watches(
            Api::<Service>::namespaced(client.clone(), &ns),
            watcher::Config::default().labels(&format!(
                "{}=TailnetEgress",
                tailnet_api::naming::labels::OWNER_KIND
            )),
            |s: Service| {
                s.labels()
                    .get(tailnet_api::naming::labels::TAILNET)
                    .map(|t| ObjectRef::new(t))
            },
        );
    for kind in kinds {
        controller = kind.tailnet_watches(controller, &client);
    }
    controller
        .graceful_shutdown_on(stop)
        .run(super::reconcile, super::error_policy, ctx)
        .for_each(log_result)
        .boxed()
}

/// The Tailnets a ConfigMap feeds: base policy, hosts, or a contributor's fragment.
fn by_config_map(
    tailnets: Store<Tailnet>,
) -> impl Fn(ConfigMap) -> Vec<ObjectRef<Tailnet>> + Send + Sync + 'static {
    move |cm: ConfigMap| {
        let name = cm.name_any();
        tailnets
            .state()
            .iter()
            .filter(|t| {
                t.spec.policy.base_config_map.as_deref() == Some(name.as_str())
                    || t.spec
                        .server_ca
                        .as_ref()
                        .is_some_and(|ca| ca.config_map_ref.name == name)
                    || t.spec
                        .dns
                        .as_ref()
                        .and_then(|d| d.hosts_config_map.as_deref())
                        == Some(name.as_str())
                    // A contributor's fragment delivered into this cluster (also the
                    // fragment another Tailnet of this cluster publishes).
                    || t.spec
                        .policy
                        .contributors
                        .iter()
                        .any(|c| c.source.config_map.as_deref() == Some(name.as_str()))
            })
            .map(|t| ObjectRef::from_obj(&**t))
            .collect::<Vec<_>>()
    }
}

/// The Tailnets whose API key a Secret holds, or (a contributor without a key) whose owner's
/// feed it is.
fn by_secret(
    tailnets: Store<Tailnet>,
) -> impl Fn(Secret) -> Vec<ObjectRef<Tailnet>> + Send + Sync + 'static {
    move |secret: Secret| {
        let name = secret.name_any();
        tailnets
            .state()
            .iter()
            .filter(|t| match &t.spec.api_secret_ref {
                Some(reference) => reference.name == name,
                None => tailnet_api::owner_feed::owner_keys_secret(&t.name_any()) == name,
            })
            .map(|t| ObjectRef::from_obj(&**t))
            .collect::<Vec<_>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tailnet() -> Tailnet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "Tailnet",
            "metadata": {"name": "t", "uid": "u-1", "generation": 3, "resourceVersion": "10"},
            "spec": {"server": "https://headscale.example.net",
                     "apiSecretRef": {"name": "s", "key": "k"},
                     "policy": {"tagOwners": ["group:platform"]}}
        }))
        .expect("tailnet")
    }

    /// Issue 26 item 5: a status write (new resourceVersion, new status) is not a trigger;
    /// a spec change (generation), a label or annotation change, or deletion is.
    #[test]
    fn only_changes_besides_the_status_trigger_the_tailnet_controller() {
        let before = tailnet();
        let mut status_write = before.clone();
        status_write.metadata.resource_version = Some("11".into());
        status_write.status = Some(tailnet_api::tailnet::TailnetStatus {
            observed_generation: Some(3),
            ..Default::default()
        });
        assert_eq!(not_status(&before), not_status(&status_write));
        let mut spec = before.clone();
        spec.metadata.generation = Some(4);
        let mut labelled = before.clone();
        labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        let mut deleted = before.clone();
        deleted.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        for changed in [spec, labelled, deleted] {
            assert_ne!(not_status(&before), not_status(&changed));
        }
    }
}
