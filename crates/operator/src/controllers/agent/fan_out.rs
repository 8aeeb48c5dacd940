//! Which of a kind's resources a Tailnet change reconciles (the Tailnet trigger of every
//! agent-backed controller).

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tailnet_api::Tailnet;

use super::super::status::WithConditions;
use super::decide::Decide;

/// Which of a kind's resources a Tailnet event should reconcile now.
///
/// Every change of a Tailnet's status (each policy apply, each resource that becomes
/// effective, the pending-DNS message) used to trigger every egress and ingress of the
/// Tailnet. kube-runtime's scheduler moves each triggered object to "now" and pops objects
/// scheduled for the same instant last-in first-out, so while these fan-outs came faster
/// than a saturated controller drained them, the same objects (the first of the cache's
/// iteration order) stayed at the back: at 1,000 resources 46 ingresses were not reconciled
/// once in 10 minutes (benchmark 4, the tail beyond 400). Now all of them are triggered only
/// when the Tailnet itself changes (new uid or generation, a condition's status or reason);
/// on any other status change only those whose `PolicyEffective` disagrees with the
/// Tailnet's `effective_for`. Each resource's own poll still sees everything else.
#[derive(Default)]
pub struct TailnetFanOut {
    /// Per Tailnet name: a hash of uid, generation and conditions (type, status, reason).
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl TailnetFanOut {
    pub fn affected<K>(
        &self,
        tailnet: &Tailnet,
        resources: Vec<Arc<K>>,
        kind: &str,
        tailnet_of: impl Fn(&K) -> Option<&str>,
        conditions_of: impl Fn(
            &K,
        )
            -> Option<&[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]>,
    ) -> Vec<ObjectRef<K>>
    where
        K: kube::Resource<DynamicType = ()> + 'static,
    {
        use std::hash::{Hash, Hasher};
        let name = tailnet.name_any();
        let status = tailnet.status.as_ref();
        let shape = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            tailnet.metadata.uid.hash(&mut hasher);
            tailnet.metadata.generation.hash(&mut hasher);
            for c in status.iter().flat_map(|s| &s.conditions) {
                (c.type_.as_str(), c.status.as_str(), c.reason.as_str()).hash(&mut hasher);
            }
            hasher.finish()
        };
        let changed = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), shape)
            != Some(shape);
        let effective: std::collections::HashSet<&str> = status
            .and_then(|s| s.policy.as_ref())
            .map(|p| p.effective_for.iter().map(String::as_str).collect())
            .unwrap_or_default();
        resources
            .iter()
            // No name: the default Tailnet (the only one), so any Tailnet's.
            .filter(|r| tailnet_of(r).is_none_or(|t| t == name))
            .filter(|r| {
                changed || {
                    let key = format!(
                        "{kind}/{}/{}",
                        r.meta().namespace.as_deref().unwrap_or_default(),
                        r.meta().name.as_deref().unwrap_or_default()
                    );
                    let shown = conditions_of(r).unwrap_or_default().iter().any(|c| {
                        c.type_ == tailnet_api::conditions::types::POLICY_EFFECTIVE
                            && c.status == "True"
                    });
                    effective.contains(key.as_str()) != shown
                }
            })
            .map(|r| ObjectRef::from_obj(&**r))
            .collect()
    }
}

/// The Tailnet trigger of kind `K`'s controller over the objects in `store`.
pub fn of_kind<K: Decide>(
    store: Store<K::Object>,
) -> impl Fn(Tailnet) -> Vec<ObjectRef<K::Object>> + Send + Sync + 'static {
    let fan_out = TailnetFanOut::default();
    let kind = <K::Object as kube::Resource>::kind(&()).to_string();
    move |tailnet: Tailnet| {
        fan_out.affected(
            &tailnet,
            store.state(),
            &kind,
            |o| K::tailnet_name(o),
            |o| K::status(o).map(WithConditions::conditions),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::TailnetIngress;

    fn ingress(name: &str, effective: bool) -> Arc<TailnetIngress> {
        let mut ingress: TailnetIngress = serde_json::from_value(serde_json::json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": name, "namespace": "apps"},
            "spec": {"tailnetRef": {"name": "demo"}, "allowFrom": ["group:team-a"], "exposes": []}
        }))
        .expect("ingress fixture");
        if effective {
            let mut status = ingress.status.clone().unwrap_or_default();
            status
                .conditions
                .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: "PolicyEffective".into(),
                    status: "True".into(),
                    reason: "Ready".into(),
                    message: String::new(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Default::default(),
                    ),
                    observed_generation: None,
                });
            ingress.status = Some(status);
        }
        Arc::new(ingress)
    }

    fn names(refs: Vec<ObjectRef<TailnetIngress>>) -> Vec<String> {
        let mut names: Vec<String> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn a_tailnet_status_change_triggers_only_the_resources_whose_policy_effect_changed() {
        let fan_out = TailnetFanOut::default();
        let affected = |tailnet: &Tailnet, resources: Vec<Arc<TailnetIngress>>| {
            names(fan_out.affected(
                tailnet,
                resources,
                "TailnetIngress",
                |i: &TailnetIngress| Some(i.spec.tailnet_ref.name.as_str()),
                |i| i.status.as_ref().map(|s| s.conditions.as_slice()),
            ))
        };
        let resources = || vec![ingress("a", true), ingress("b", false), ingress("c", false)];
        let tailnet = crate::controllers::test_fixtures::tailnet(&["TailnetIngress/apps/a"]);
        // First sight of the Tailnet: all of its resources.
        assert_eq!(affected(&tailnet, resources()), ["a", "b", "c"]);
        // Only effective_for changed (b became live): only b.
        let tailnet = crate::controllers::test_fixtures::tailnet(&[
            "TailnetIngress/apps/a",
            "TailnetIngress/apps/b",
        ]);
        assert_eq!(affected(&tailnet, resources()), ["b"]);
        // A new generation (spec change): all again.
        let mut changed = tailnet.clone();
        changed.metadata.generation = Some(2);
        assert_eq!(affected(&changed, resources()), ["a", "b", "c"]);
        // Another Tailnet's resources are never triggered.
        let mut other = tailnet.clone();
        other.metadata.name = Some("other".into());
        assert!(affected(&other, resources()).is_empty());
    }
}
