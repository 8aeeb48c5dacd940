//! Reads an agent's own report (`GET /status` on its admin port) for the gather step — only
//! from a pod that really belongs to the agent Deployment the operator applied, and bounded
//! in size and time: anyone who can create pods in the namespace can copy the agent's labels
//! (a forged report, or a body meant to exhaust the operator's memory).

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use tailnet_api::agent_status::StatusReport;
use tailnet_render::meta::Owner;

use super::super::context::Context;

/// The largest report read (a real one is a few KiB even with hundreds of targets).
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;

/// The label selector of an agent's pods.
pub fn agent_pod_selector(owner: &Owner) -> String {
    owner
        .selector_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The controller owner reference of an object's metadata.
fn controller_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|o| o.controller == Some(true))
}

/// The IP of a running pod whose owner chain is Pod → ReplicaSet → the Deployment with
/// `deployment_uid` (uids compared, not names: labels and names can be copied).
pub fn owned_pod_ip(
    pods: &[Pod],
    replica_sets: &[ReplicaSet],
    deployment_uid: &str,
) -> Option<String> {
    let ours = |pod: &Pod| {
        let Some(owner) = controller_of(&pod.metadata) else {
            return false;
        };
        owner.kind == "ReplicaSet"
            && replica_sets.iter().any(|rs| {
                rs.metadata.uid.as_deref() == Some(owner.uid.as_str())
                    && controller_of(&rs.metadata)
                        .is_some_and(|d| d.kind == "Deployment" && d.uid == deployment_uid)
            })
    };
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| ours(p))
        .find_map(|p| p.status.as_ref()?.pod_ip.clone())
}

/// Reads the agent's `/status` from a pod of `deployment` (admin port on the pod IP). `None`
/// when no such pod runs, it does not answer in time, its answer is larger than
/// [`MAX_REPORT_BYTES`] or not a report: reachability is then reported as not observed,
/// never guessed.
pub async fn agent_status(
    ctx: &Context,
    owner: &Owner,
    deployment: Option<&Deployment>,
) -> Option<StatusReport> {
    let deployment_uid = deployment?.metadata.uid.clone()?;
    let selector = agent_pod_selector(owner);
    // Both served from the apiserver's watch cache (no etcd read on every poll).
    let params = ListParams::default().labels(&selector).match_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let pods = pods.list(&params).await.ok()?;
    let replica_sets = replica_sets.list(&params).await.ok()?;
    let ip = owned_pod_ip(&pods.items, &replica_sets.items, &deployment_uid)?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    let url = format!(
        "http://{host}:{}/status",
        tailnet_api::agent_config::ADMIN_PORT
    );
    // `agent_http` bounds the whole exchange in time (see Context).
    let mut response = ctx.agent_http.get(&url).send().await.ok()?;
    if response
        .content_length()
        .is_some_and(|length| length > MAX_REPORT_BYTES as u64)
    {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_REPORT_BYTES {
            tracing::warn!(agent = %owner.names().base, namespace = %owner.namespace, "agent report larger than {MAX_REPORT_BYTES} bytes: ignored");
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn owned_by(kind: &str, uid: &str) -> Option<Vec<OwnerReference>> {
        Some(vec![OwnerReference {
            kind: kind.into(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }])
    }

    fn pod(name: &str, owner_uid: &str, ip: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                owner_references: owned_by("ReplicaSet", owner_uid),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    fn replica_set(uid: &str, deployment_uid: &str) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                owner_references: owned_by("Deployment", deployment_uid),
                ..ObjectMeta::default()
            },
            ..ReplicaSet::default()
        }
    }

    #[test]
    fn only_pods_of_our_deployment_are_read() {
        let replica_sets = [
            replica_set("rs-ours", "deploy-ours"),
            replica_set("rs-forged", "deploy-other"),
        ];
        // A forged pod first (sorted first by name), then the real one.
        let pods = [
            pod("aaa-forged", "rs-forged", "10.0.0.66"),
            pod("zzz-no-owner", "", "10.0.0.67"),
            pod("tailnet-ingress-x-abc", "rs-ours", "10.0.0.5"),
        ];
        assert_eq!(
            owned_pod_ip(&pods, &replica_sets, "deploy-ours").as_deref(),
            Some("10.0.0.5")
        );
        // An owner reference to a ReplicaSet uid that does not exist counts for nothing.
        let pods = [pod("aaa-forged", "rs-made-up", "10.0.0.66")];
        assert_eq!(owned_pod_ip(&pods, &replica_sets, "deploy-ours"), None);
        // No pod of ours at all.
        assert_eq!(owned_pod_ip(&[], &replica_sets, "deploy-ours"), None);
    }
}
