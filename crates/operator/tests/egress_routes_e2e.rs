//! Routes: with the operator's route approval switched off, an egress whose target's route is
//! advertised but not approved says `RouteNotApproved`, its probe says `NoRoute`, and a pod's
//! connection fails instead of leaking to the pod network; approving the route in Headscale
//! makes it work without touching anything in the cluster.

mod support;

use kube::Api;
use serde_json::json;
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{apply_egress, bootstrap_applied_tailnet, remote_db_target};
use tailnet_api::TailnetEgress;
use tno_testenv::{E2eEnv, OperatorArgs};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unapproved_route_fails_closed_until_approved() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("rt").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    let mut args = OperatorArgs::new(&ns);
    args.extra = vec!["--route-approval".into(), "false".into()];
    let mut operator = start_operator(&env, &args.to_args(), None)
        .await
        .expect("operator");

    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    let mut target = remote_db_target();
    target["probe"] = json!({"interval": "2s"});
    apply_egress(&egresses, &ns, "site", &tailnet_name, json!([target]))
        .await
        .expect("egress");
    let site_becomes = |type_, status, reason| {
        wait_for_condition(
            &egresses,
            "site",
            ConditionIs::new(type_, status).reason(reason),
            None,
        )
    };

    // Advertised, not approved: named as such, probed as NoRoute, connections refused.
    let e = site_becomes("RoutesReady", "False", "RouteNotApproved").await;
    let message = e.condition_message("RoutesReady");
    assert!(message.contains("192.0.2.0/24"), "{message}");
    site_becomes("NodeOnline", "True", "Online").await;
    site_becomes("TargetsReachable", "False", "NoRoute").await;
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
    site_becomes("RoutesReady", "True", "Ready").await;
    site_becomes("TargetsReachable", "True", "Reachable").await;
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
