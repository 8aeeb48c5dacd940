//! Routes: with the operator's route approval switched off, an egress whose target's route is
//! advertised but not approved says `RouteNotApproved`, its probe says `NoRoute`, and a pod's
//! connection fails instead of leaking to the pod network; approving the route in Headscale
//! makes it work without touching anything in the cluster.

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tailnet_api::TailnetEgress;
use tno_testenv::{E2eEnv, OperatorArgs};

const WAIT: Duration = Duration::from_secs(180);

async fn condition_becomes(
    egresses: &Api<TailnetEgress>,
    type_: &str,
    status: &str,
    reason: &str,
) -> TailnetEgress {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let e = egresses.get("site").await.expect("egress");
        let conditions = e.status.clone().unwrap_or_default().conditions;
        if conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        {
            return e;
        }
        let seen: Vec<String> = conditions
            .iter()
            .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
            .collect();
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {type_}={status}/{reason}:\n{}",
            seen.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unapproved_route_fails_closed_until_approved() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("rt").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let tailnet_name = format!("t-{ns}");
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(env.tailnet_object(&tailnet_name, "Apply")),
        )
        .await
        .expect("Tailnet");
    let mut args = OperatorArgs::new(&ns);
    args.extra = vec!["--route-approval".into(), "false".into()];
    let mut operator = env
        .start_operator(
            std::path::Path::new(env!("CARGO_BIN_EXE_tailnet-operator")),
            &args.to_args(),
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
                     "targets": [{"name": "remote-db", "address": "192.0.2.10", "port": 5432, "probe": {"interval": "2s"}}]}
        })))
        .await
        .expect("egress");

    // Advertised, not approved: named as such, probed as NoRoute, connections refused.
    let e = condition_becomes(&egresses, "RoutesReady", "False", "RouteNotApproved").await;
    let message = e
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "RoutesReady")
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(message.contains("192.0.2.0/24"), "{message}");
    condition_becomes(&egresses, "NodeOnline", "True", "Online").await;
    condition_becomes(&egresses, "TargetsReachable", "False", "NoRoute").await;
    let target = format!("remote-db.{ns}.svc.cluster.local:5432");
    let run = ops
        .tcp_check("client-unrouted", &target, 3)
        .await
        .expect("client pod");
    assert!(
        !run.succeeded(),
        "an unapproved route must not carry traffic (and nothing may leak to the pod network):\n{run}"
    );
    let router = env
        .node(env.tailnet().site.router.hostname())
        .await
        .expect("router");
    assert!(
        router.approved_routes.is_empty(),
        "the operator must not approve with --route-approval=false"
    );

    // The Headscale admin approves: the same objects start working.
    env.approve_site_routes().await.expect("approve routes");
    condition_becomes(&egresses, "RoutesReady", "True", "Ready").await;
    condition_becomes(&egresses, "TargetsReachable", "True", "Reachable").await;
    let run = ops
        .tcp_check("client-routed", &target, 30)
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "after approval the egress must work:\n{run}"
    );
    operator.terminate().await.expect("operator stops cleanly");
}
