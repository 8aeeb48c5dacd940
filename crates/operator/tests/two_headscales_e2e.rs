//! Two Tailnets on two Headscale servers, one operator process. Headscale A is the lab's
//! usual one; Headscale B is a second, independent server in the same lab
//! (`TailnetEnv::start_second_headscale`: own port, own CA, own API key, its own subnet router
//! in the remote site and its own laptop node for alice). Each Tailnet gets one egress (the
//! site's echo 192.0.2.10:5432 behind its own router) and one tcp ingress (an echo backend in
//! the cluster, reached from its own laptop); bytes cross all four. Then Headscale B is
//! stopped: Tailnet B says `HeadscaleReachable=False`, the operator's per-Tailnet metrics name
//! B (and only B) unreachable, Tailnet A stays reachable with its resources Ready, and a new
//! egress on A becomes Ready and carries bytes while B is still down. B is started again and
//! its Tailnet, egress and ingress recover and carry bytes.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use serde_json::{Value, json};
use support::conditions::{ConditionIs, WithConditions, condition_becomes, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    apply, apply_egress, ingress_object, service_object, tailnet_ipv4, test_server_deployment,
};
use support::tailnet::tcp_echo;
use support::wait::{WAIT, wait_for};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, E2eNamespace, OperatorProcess};
use tno_testenv_tailnet::{HeadscaleApi, LocalApi};

/// The tcp port both ingresses expose (backend: the `echo` Service on 5432).
const INGRESS_PORT: u16 = 6000;
/// How long Tailnet B may take to report the stopped server: the operator polls Headscale
/// every 2 s in the e2e args, plus its client timeout.
const UNREACHABLE_WITHIN: Duration = Duration::from_secs(60);

fn site_echo(target: &str) -> Value {
    json!([{"name": target, "address": "192.0.2.10", "port": 5432}])
}

/// One Tailnet of the scenario and what it needs to prove traffic.
struct Side<'a> {
    label: &'static str,
    tailnet: String,
    egress: &'static str,
    egress_target: &'static str,
    ingress: &'static str,
    /// alice's laptop on this Tailnet's Headscale.
    laptop: LocalApi,
    headscale: HeadscaleApi,
    ops: &'a E2eNamespace<'a>,
}

impl Side<'_> {
    fn egresses(&self) -> Api<TailnetEgress> {
        Api::namespaced(self.ops.client().clone(), self.ops.name())
    }

    fn ingresses(&self) -> Api<TailnetIngress> {
        Api::namespaced(self.ops.client().clone(), self.ops.name())
    }

    async fn apply_resources(&self) {
        apply_egress(
            &self.egresses(),
            self.ops.name(),
            self.egress,
            &self.tailnet,
            site_echo(self.egress_target),
        )
        .await
        .unwrap_or_else(|e| panic!("egress {}: {e}", self.egress));
        let expose = json!([{"name": "echo", "dnsLabel": self.ingress, "mode": "tcp",
                             "port": INGRESS_PORT, "backend": {"service": "echo", "port": 5432}}]);
        apply(
            &self.ingresses(),
            self.ingress,
            ingress_object(self.ops.name(), self.ingress, &self.tailnet, None, expose),
        )
        .await
        .unwrap_or_else(|e| panic!("ingress {}: {e}", self.ingress));
    }

    /// Both resources Ready; returns the ingress's tailnet IPv4.
    async fn ready(&self, operator: &OperatorProcess) -> String {
        let ready = ConditionIs::new("Ready", "True");
        wait_for_condition(&self.egresses(), self.egress, ready, Some(operator)).await;
        let ingress =
            wait_for_condition(&self.ingresses(), self.ingress, ready, Some(operator)).await;
        tailnet_ipv4(&ingress.status.unwrap_or_default().tailnet_ips)
            .unwrap_or_else(|| panic!("{}: ingress {} has no IPv4", self.label, self.ingress))
    }

    /// Bytes through the egress (a pod's echo via the target's Service) and through the
    /// ingress (the laptop's echo via the ingress node).
    async fn traffic(&self, target: &str, ingress_ip: &str, pod: &str) {
        let address = format!("{target}.{}.svc.cluster.local:5432", self.ops.name());
        let run = self
            .ops
            .tcp_check(pod, &address, 30)
            .await
            .unwrap_or_else(|e| panic!("{}: tcp-check pod {pod}: {e}", self.label));
        assert!(
            run.succeeded(),
            "{}: egress echo via {address}: {run}",
            self.label
        );
        wait_for(
            &format!(
                "{}: the laptop's echo through ingress {}",
                self.label, self.ingress
            ),
            WAIT,
            || async { tcp_echo(&self.laptop, ingress_ip, INGRESS_PORT).await },
        )
        .await;
    }

    /// The node ids of the egress and the ingress are nodes of this side's Headscale, tagged
    /// with the resources' tags.
    async fn nodes_on_own_server(&self) -> Vec<String> {
        let egress = self.egresses().get(self.egress).await.expect("egress");
        let ingress = self.ingresses().get(self.ingress).await.expect("ingress");
        let nodes = self.headscale.list_nodes().await.expect("list nodes");
        let mut found = Vec::new();
        for (what, status_node, tag) in [
            (
                self.egress,
                egress.status.as_ref().and_then(|s| s.node_id.clone()),
                egress.status.as_ref().and_then(|s| s.tag.clone()),
            ),
            (
                self.ingress,
                ingress.status.as_ref().and_then(|s| s.node_id.clone()),
                ingress.status.as_ref().and_then(|s| s.tag.clone()),
            ),
        ] {
            let id = status_node.unwrap_or_else(|| panic!("{what}: no node id"));
            let tag = tag.unwrap_or_else(|| panic!("{what}: no tag"));
            let node = nodes
                .iter()
                .find(|n| n.id.to_string() == id && n.tags.contains(&tag))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: node {id} tagged {tag} ({what}) is not on its own Headscale: {:?}",
                        self.label,
                        nodes
                            .iter()
                            .map(|n| (n.id, &n.given_name, &n.tags))
                            .collect::<Vec<_>>()
                    )
                });
            found.push(format!(
                "{what}: node {} {} {tag}",
                node.id, node.given_name
            ));
        }
        found
    }

    /// No node of this side's Headscale carries one of `tags` (the other side's).
    async fn has_none_of(&self, tags: &[String]) {
        let nodes = self.headscale.list_nodes().await.expect("list nodes");
        let strays: Vec<_> = nodes
            .iter()
            .filter(|n| n.tags.iter().any(|t| tags.contains(t)))
            .map(|n| (n.id, n.given_name.clone(), n.tags.clone()))
            .collect();
        assert!(
            strays.is_empty(),
            "{}: nodes of the other Tailnet's resources here: {strays:?}",
            self.label
        );
    }

    async fn tags(&self) -> Vec<String> {
        let egress = self.egresses().get(self.egress).await.expect("egress");
        let ingress = self.ingresses().get(self.ingress).await.expect("ingress");
        [
            egress.status.and_then(|s| s.tag),
            ingress.status.and_then(|s| s.tag),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

async fn deploy_echo_backend(ops: &E2eNamespace<'_>) {
    let ns = ops.name();
    apply(
        &Api::<Deployment>::namespaced(ops.client().clone(), ns),
        "echo",
        test_server_deployment(ns, "echo", json!(["tcp-echo", "--listen", "0.0.0.0:5432"])),
    )
    .await
    .expect("echo Deployment");
    apply(
        &Api::<Service>::namespaced(ops.client().clone(), ns),
        "echo",
        service_object(ns, "echo", 5432),
    )
    .await
    .expect("echo Service");
}

/// The sample of `series` (a full `name{labels}` prefix) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_headscales_one_operator_fault_on_one_leaves_the_other_working() {
    let started = Instant::now();
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let second = env
        .tailnet()
        .start_second_headscale("b")
        .await
        .unwrap_or_else(|e| panic!("second Headscale: {e}"));
    println!(
        "Headscale A {} and B {} up after {:.1} s",
        env.headscale_url(),
        second.headscale.lab_url(),
        started.elapsed().as_secs_f64()
    );
    assert_ne!(env.headscale_url(), second.headscale.lab_url());
    assert_ne!(env.tailnet().headscale.ca_pem(), second.headscale.ca_pem());

    let ops = env.namespace("two").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap A");
    env.create_server_inputs(&client, &ns, &second.headscale, "b")
        .await
        .expect("bootstrap B");
    let tailnets: Api<Tailnet> = Api::all(client.clone());
    let (name_a, name_b) = (format!("t-{ns}-a"), format!("t-{ns}-b"));
    apply(&tailnets, &name_a, env.tailnet_object(&name_a, "Apply"))
        .await
        .expect("Tailnet A");
    apply(
        &tailnets,
        &name_b,
        env.tailnet_object_on(&name_b, "Apply", &second.headscale, "b"),
    )
    .await
    .expect("Tailnet B");
    let mut operator = start_operator(&env, &tno_testenv::OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    deploy_echo_backend(&ops).await;

    let a = Side {
        label: "A",
        tailnet: name_a.clone(),
        egress: "egress-a",
        egress_target: "db-a",
        ingress: "ingress-a",
        laptop: env.tailnet().laptop.node.local_api(),
        headscale: env.headscale_api(),
        ops: &ops,
    };
    let b = Side {
        label: "B",
        tailnet: name_b.clone(),
        egress: "egress-b",
        egress_target: "db-b",
        ingress: "ingress-b",
        laptop: second.laptop.local_api(),
        headscale: second.headscale.api(),
        ops: &ops,
    };
    a.apply_resources().await;
    b.apply_resources().await;
    let reachable = ConditionIs::new("HeadscaleReachable", "True");
    for name in [&name_a, &name_b] {
        wait_for_condition(&tailnets, name, reachable, Some(&operator)).await;
    }
    let (ip_a, ip_b) = tokio::join!(a.ready(&operator), b.ready(&operator));
    a.traffic("db-a", &ip_a, "check-a").await;
    b.traffic("db-b", &ip_b, "check-b").await;
    let on_a = a.nodes_on_own_server().await;
    let on_b = b.nodes_on_own_server().await;
    a.has_none_of(&b.tags().await).await;
    b.has_none_of(&a.tags().await).await;
    println!(
        "both Tailnets carry bytes after {:.1} s; A: {on_a:?}; B: {on_b:?}",
        started.elapsed().as_secs_f64()
    );

    b_down_leaves_a_working(&env, &second, &a, &b, &tailnets, &operator).await;

    let restarted = Instant::now();
    second.headscale.restart().await.expect("Headscale B back");
    wait_for_condition(&tailnets, &name_b, reachable, Some(&operator)).await;
    let ready = ConditionIs::new("Ready", "True");
    wait_for_condition(&tailnets, &name_b, ready, Some(&operator)).await;
    let ip_b_after = b.ready(&operator).await;
    b.traffic("db-b", &ip_b_after, "check-b-after").await;
    println!(
        "B recovered (Tailnet Ready, egress and ingress Ready, bytes through both) {:.1} s after its restart",
        restarted.elapsed().as_secs_f64()
    );
    let tailnet_b = tailnets.get(&name_b).await.expect("Tailnet B");
    println!("Tailnet B after the restart:\n{}", tailnet_b.describe());
    operator.terminate().await.expect("operator stops cleanly");
    println!(
        "two_headscales wall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Headscale B stopped: B unreachable (condition and metric), A reachable with its resources
/// Ready, and a new egress on A Ready with bytes through it while B is still down.
async fn b_down_leaves_a_working(
    env: &E2eEnv,
    second: &tno_testenv_tailnet::SecondHeadscale,
    a: &Side<'_>,
    b: &Side<'_>,
    tailnets: &Api<Tailnet>,
    operator: &OperatorProcess,
) {
    second.headscale.kill();
    let down_at = Instant::now();
    let unreachable = ConditionIs::new("HeadscaleReachable", "False");
    let tailnet_b = condition_becomes(
        tailnets,
        &b.tailnet,
        unreachable,
        UNREACHABLE_WITHIN,
        Some(operator),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    println!(
        "Tailnet B HeadscaleReachable=False {:.1} s after Headscale B stopped: {}",
        down_at.elapsed().as_secs_f64(),
        tailnet_b.condition_message("HeadscaleReachable")
    );

    // A positive witness on A while B is down: a new egress becomes Ready and carries bytes.
    apply_egress(
        &a.egresses(),
        a.ops.name(),
        "egress-a2",
        &a.tailnet,
        site_echo("db-a2"),
    )
    .await
    .expect("egress-a2");
    let ready = ConditionIs::new("Ready", "True");
    wait_for_condition(&a.egresses(), "egress-a2", ready, Some(operator)).await;
    let run = a
        .ops
        .tcp_check(
            "check-a2",
            &format!("db-a2.{}.svc.cluster.local:5432", a.ops.name()),
            30,
        )
        .await
        .expect("tcp-check pod check-a2");
    assert!(run.succeeded(), "new egress on A while B is down: {run}");
    let ingress_a = a.ingresses().get(a.ingress).await.expect("ingress A");
    let ip_a = tailnet_ipv4(&ingress_a.status.clone().unwrap_or_default().tailnet_ips)
        .expect("ingress A IPv4");
    tcp_echo(&a.laptop, &ip_a, INGRESS_PORT)
        .await
        .expect("the laptop's echo through ingress A while B is down");
    let witness_at = down_at.elapsed();

    // Read everything after the witness: B must still be down, A untouched.
    let tailnet_a = tailnets.get(&a.tailnet).await.expect("Tailnet A");
    let tailnet_b = tailnets.get(&b.tailnet).await.expect("Tailnet B");
    let egress_a = a.egresses().get(a.egress).await.expect("egress A");
    let egress_b = b.egresses().get(b.egress).await.expect("egress B");
    let ingress_b = b.ingresses().get(b.ingress).await.expect("ingress B");
    println!(
        "---- during the fault ({:.1} s after B stopped; new egress on A Ready with bytes) ----\n\
         Tailnet A {}:\n{}\n\nTailnet B {}:\n{}\n\negress A:\n{}\n\ningress A:\n{}\n\negress B:\n{}\n\ningress B:\n{}",
        witness_at.as_secs_f64(),
        a.tailnet,
        tailnet_a.describe(),
        b.tailnet,
        tailnet_b.describe(),
        egress_a.describe(),
        ingress_a.describe(),
        egress_b.describe(),
        ingress_b.describe(),
    );
    assert!(
        unreachable.holds_for(&tailnet_b),
        "B still down after the witness"
    );
    // B's egress cannot see routes now: its target's route is unknown, not "not advertised"
    // (its router is fine, only the node list is unreadable).
    let target_b = egress_b
        .status
        .as_ref()
        .and_then(|s| s.targets.first())
        .expect("egress B target status");
    assert!(
        target_b.state.as_deref() != Some("RouteNotAdvertised")
            && ConditionIs::new("RoutesReady", "Unknown").holds_for(&egress_b),
        "egress B while its Headscale is down: {}",
        egress_b.describe()
    );
    for (what, holds) in [
        (
            "Tailnet A HeadscaleReachable=True",
            ConditionIs::new("HeadscaleReachable", "True").holds_for(&tailnet_a),
        ),
        ("Tailnet A Ready=True", ready.holds_for(&tailnet_a)),
        ("egress A Ready=True", ready.holds_for(&egress_a)),
        ("ingress A Ready=True", ready.holds_for(&ingress_a)),
    ] {
        assert!(holds, "{what} while B is down");
    }
    // A's reachability names A's server, never B's.
    let a_reachable = tailnet_a.condition_message("HeadscaleReachable");
    assert!(
        a_reachable.contains(&env.headscale_url())
            && !tailnet_a.describe().contains(&second.headscale.lab_url()),
        "Tailnet A's conditions name A's server only: {}",
        tailnet_a.describe()
    );
    per_tailnet_metrics(operator, &a.tailnet, &b.tailnet).await;
}

/// `headscale_reachable` and `resource_condition` name A reachable and B not.
async fn per_tailnet_metrics(operator: &OperatorProcess, tailnet_a: &str, tailnet_b: &str) {
    let text = operator.metrics().await.expect("operator metrics");
    let reachable = |name: &str| {
        sample(
            &text,
            &format!("tailnet_operator_headscale_reachable{{tailnet=\"{name}\"}}"),
        )
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            (l.starts_with("tailnet_operator_headscale_reachable{")
                || (l.starts_with("tailnet_operator_resource_condition{")
                    && l.contains("kind=\"Tailnet\"")
                    && l.contains("HeadscaleReachable")))
                && (l.contains(tailnet_a) || l.contains(tailnet_b))
        })
        .collect();
    println!("operator metrics during the fault:\n{}", lines.join("\n"));
    assert_eq!(
        reachable(tailnet_a),
        Some(1.0),
        "A reachable:\n{}",
        lines.join("\n")
    );
    assert_eq!(
        reachable(tailnet_b),
        Some(0.0),
        "B unreachable:\n{}",
        lines.join("\n")
    );
    let condition = |name: &str, status: &str| {
        lines.iter().any(|l| {
            l.starts_with("tailnet_operator_resource_condition{")
                && l.contains(&format!("name=\"{name}\""))
                && l.contains(&format!("status=\"{status}\""))
                && l.ends_with(" 1")
        })
    };
    assert!(
        condition(tailnet_a, "True") && !condition(tailnet_a, "False"),
        "A's condition series"
    );
    assert!(
        condition(tailnet_b, "False") && !condition(tailnet_b, "True"),
        "B's condition series"
    );
}
