//! Egress end to end: the operator (in the lab, like a pod), a real agent pod (containerboot +
//! tailscaled + tailnet-agent) and real Headscale. A pod connects to
//! `remote-db.<ns>.svc.cluster.local:5432` and its bytes reach the echo server at
//! 192.0.2.10:5432 behind the site's subnet router.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tailnet_api::TailnetEgress;
use tno_testenv::{E2eEnv, OperatorArgs};

const WAIT: Duration = Duration::from_secs(180);

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn describe(e: &TailnetEgress) -> String {
    let status = e.status.clone().unwrap_or_default();
    let mut lines: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    lines.push(format!("targets: {:?}", status.targets));
    lines.join("\n")
}

fn condition(e: &TailnetEgress, type_: &str) -> Option<(String, String)> {
    e.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_reaches_the_remote_site_through_the_tailnet() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("eg").await.expect("operator namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet_name = format!("t-{ns}");
    let tailnets: Api<tailnet_api::Tailnet> = Api::all(client.clone());
    tailnets
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(env.tailnet_object(&tailnet_name, "DryRun")),
        )
        .await
        .expect("Tailnet");
    let mut operator = env
        .start_operator(
            std::path::Path::new(env!("CARGO_BIN_EXE_tailnet-operator")),
            &OperatorArgs::new(&ns).to_args(),
        )
        .await
        .expect("operator");
    operator
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("operator ready");

    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    egresses
        .patch("site", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
            "metadata": {"name": "site", "namespace": ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "consumerNamespaces": [ns],
                     "targets": [
                        {"name": "remote-db", "address": "192.0.2.10", "port": 5432, "probe": {"interval": "2s"}},
                        {"name": "remote-api", "address": "198.51.100.20", "port": 443, "aliases": ["api.site.example.net"]}
                     ]}
        })))
        .await
        .expect("egress");

    // DryRun: the agent runs, but the grant is not live, so the egress is not effective and
    // connections fail.
    let dry = eventually("PolicyEffective=False/DryRun", || async {
        let e = egresses.get("site").await.map_err(|e| e.to_string())?;
        match condition(&e, "PolicyEffective") {
            Some((s, r)) if s == "False" && r == "DryRun" => Ok(e),
            _ => Err(describe(&e)),
        }
    })
    .await;
    assert_eq!(
        condition(&dry, "Ready").map(|c| c.0).as_deref(),
        Some("False")
    );
    let target = format!("remote-db.{ns}.svc.cluster.local:5432");
    let run = ops
        .tcp_check("client-dry", &target, 3)
        .await
        .expect("client pod in DryRun");
    assert!(
        !run.succeeded(),
        "DryRun must not let traffic through:\n{run}"
    );

    // Apply: nothing is restarted; the grant and route approval make it work.
    tailnets
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(env.tailnet_object(&tailnet_name, "Apply")),
        )
        .await
        .expect("Tailnet to Apply");

    // Every precondition turns true: tailnet, Services, agent, node, grants, routes.
    let ready = eventually("the egress to become Ready", || async {
        let e = egresses.get("site").await.map_err(|e| e.to_string())?;
        match condition(&e, "Ready") {
            Some((s, _)) if s == "True" => Ok(e),
            _ => Err(format!(
                "{}\n--- operator ---\n{}",
                describe(&e),
                operator.log_tail(15)
            )),
        }
    })
    .await;
    let status = ready.status.clone().unwrap_or_default();
    let db = status
        .targets
        .iter()
        .find(|t| t.name == "remote-db")
        .expect("remote-db status");
    assert_eq!(db.route.as_deref(), Some("192.0.2.0/24"));
    assert!(db.cluster_ip.is_some() && db.agent_port >= 10000, "{db:?}");
    assert_eq!(status.tailnet_ips.len(), 2, "{status:?}");
    let node_id = status.node_id.clone().expect("node id");

    // The agent's probes reach both targets through the tailnet.
    eventually("TargetsReachable=True", || async {
        let e = egresses.get("site").await.map_err(|e| e.to_string())?;
        match condition(&e, "TargetsReachable") {
            Some((s, r)) if s == "True" && r == "Reachable" => Ok(()),
            _ => Err(describe(&e)),
        }
    })
    .await;

    // The bytes cross the tailnet: a pod uses the Service like any other.
    let run = ops
        .tcp_check("client-1", &target, 30)
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "echo through the egress failed:\n{run}\n{}",
        env.diagnostics(Some(&ns))
    );

    // The pre-auth key is gone once the node exists; the alias is in the hosts ConfigMap.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    eventually("the spent auth Secret to be removed", || async {
        match secrets
            .get_opt("tailnet-egress-site-auth")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("auth Secret still there".to_string()),
        }
    })
    .await;
    let hosts: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let api_ip = status
        .targets
        .iter()
        .find(|t| t.name == "remote-api")
        .and_then(|t| t.cluster_ip.clone())
        .expect("remote-api ClusterIP");
    eventually("the alias in the hosts ConfigMap", || async {
        let cm = hosts
            .get("tailnet-hosts")
            .await
            .map_err(|e| e.to_string())?;
        let text = cm
            .data
            .unwrap_or_default()
            .get("hosts")
            .cloned()
            .unwrap_or_default();
        if text.contains(&format!("{api_ip} api.site.example.net")) {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;

    // A restarted agent keeps its identity: same node, no second node, no new key.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for pod in pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=tailnet-egress-site"))
        .await
        .expect("pods")
        .items
    {
        pods.delete(&pod.name_any(), &DeleteParams::default())
            .await
            .expect("delete agent pod");
    }
    let run = ops
        .tcp_check("client-2", &target, 60)
        .await
        .expect("client pod after restart");
    assert!(run.succeeded(), "echo after agent restart failed:\n{run}");
    let nodes = env.headscale_api().list_nodes().await.expect("nodes");
    let tagged: Vec<_> = nodes
        .iter()
        .filter(|n| n.tags.iter().any(|t| t == "tag:tno-egress-site"))
        .collect();
    assert_eq!(
        tagged.len(),
        1,
        "exactly one node carries the egress tag: {tagged:?}"
    );
    assert_eq!(
        tagged[0].id.to_string(),
        node_id,
        "the restarted agent kept its node"
    );

    // A Service name owned by someone else: that target is skipped, nothing foreign touched.
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    egresses
        .patch(
            "other",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
                "metadata": {"name": "other", "namespace": ns},
                "spec": {"tailnetRef": {"name": tailnet_name}, "consumerNamespaces": [ns],
                         "targets": [{"name": "remote-db", "address": "192.0.2.11", "port": 5432}]}
            })),
        )
        .await
        .expect("conflicting egress");
    let other = eventually("ServiceNameConflict on the second egress", || async {
        let e = egresses.get("other").await.map_err(|e| e.to_string())?;
        match condition(&e, "ServicesReady") {
            Some((s, r)) if s == "False" && r == "ServiceNameConflict" => Ok(e),
            _ => Err(describe(&e)),
        }
    })
    .await;
    assert_eq!(
        condition(&other, "Ready").map(|c| c.1).as_deref(),
        Some("ServiceNameConflict")
    );
    let svc = services.get("remote-db").await.expect("remote-db Service");
    assert_eq!(
        svc.owner_references()[0].name,
        "site",
        "the first egress keeps its Service"
    );

    // Deletion: node removed from Headscale, Services collected.
    egresses
        .delete("other", &DeleteParams::default())
        .await
        .expect("delete other");
    egresses
        .delete("site", &DeleteParams::default())
        .await
        .expect("delete site");
    eventually("the node to leave Headscale", || async {
        let nodes = env
            .headscale_api()
            .list_nodes()
            .await
            .map_err(|e| e.to_string())?;
        let left: Vec<_> = nodes
            .iter()
            .filter(|n| n.tags.iter().any(|t| t.starts_with("tag:tno-egress-")))
            .map(|n| n.id)
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    eventually("the egress objects to be gone", || async {
        let list = egresses
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if list.items.is_empty() {
            Ok(())
        } else {
            Err(format!("{} left", list.items.len()))
        }
    })
    .await;
    operator.terminate().await.expect("operator stops cleanly");
}
