//! Several installations on one Headscale: Tailnet `t-<ns>` owns the policy (Apply) and lists
//! contributor `cosmos`; Tailnet `t-<ns>-b` runs `mode: Contribute` (prefix `cob`), never
//! writes to Headscale and publishes its fragment, which is delivered to the owner as a
//! ConfigMap (the Git variant; here copied by the test). Both run under one operator against
//! the real apiserver, Headscale and tailscale nodes (a second control plane is not part of
//! the lab yet).
//!
//! Checked: the contributor's egress carries bytes to the remote site once the owner merged
//! its grant, while the owner's own egress keeps working; an egress grant outside
//! `egressDestinations` is refused and reported on both sides (owner: ContributionRefused,
//! contributor: FragmentNotLive, the egress: PolicyEffective=False/Contributing); the owner
//! then reads the contributor's own ConfigMap through the API with a kubeconfig whose
//! ServiceAccount may only get/watch that ConfigMap (the documented Role); that access
//! revoked → ContributorStale, the merged grant stays live; an owner restart meanwhile
//! changes nothing in the live policy; the contributor removed from the list → its grant
//! goes.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::kubeconfig::token_kubeconfig;
use support::lab_operator::start_operator;
use support::objects::{
    apply, apply_egress, bootstrap_applied_tailnet, ingress_object, remote_db_target,
    service_object, tailnet_ipv4, test_server_deployment,
};
use support::tailnet::tcp_echo;
use support::wait::{WAIT, wait_for};
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tno_testenv::{E2eEnv, OperatorArgs};

/// `kubectl <args>` against the lab (output for the log; empty when kubectl is not built).
fn kubectl(env: &E2eEnv, args: &[&str]) -> String {
    let versions = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deps/versions.env"),
    )
    .unwrap_or_default();
    let Some(version) = versions
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
    else {
        return String::new();
    };
    let cache = std::env::var_os("TNO_DEPS_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| std::path::PathBuf::from(h).join(".cache/tailnet-operator/deps"))
        })
        .unwrap_or_default();
    let binary = cache.join(format!("kubernetes-{version}/bin/kubectl"));
    std::process::Command::new(binary)
        .arg(format!("--kubeconfig={}", env.kubeconfig().display()))
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contributing_installation_gets_what_its_limits_allow() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("contrib").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let owner = bootstrap_applied_tailnet(&env, &ops).await;
    let contributor = format!("{owner}-b");
    let tailnets: Api<Tailnet> = Api::all(client.clone());
    let mut cosmos = env.tailnet_object(&contributor, "Contribute");
    cosmos["spec"]["policy"]["tagPrefix"] = json!("cob");
    // The owner writes the DNS entries; the contributor's ingress names go in its fragment.
    cosmos["spec"]["dns"] =
        json!({"ingressNameTemplate": "{name}.{namespace}.cosmos.lab.example.net"});
    if let Some(policy) = cosmos["spec"]["policy"].as_object_mut() {
        policy.remove("baseConfigMap");
    }
    apply(&tailnets, &contributor, cosmos)
        .await
        .expect("contributor Tailnet");
    let mut owner_spec = env.tailnet_object(&owner, "Apply");
    owner_spec["spec"]["policy"]["contributors"] = json!([{
        "name": "cosmos", "tagPrefix": "cob", "source": {"configMap": "cosmos-fragment"},
        "limits": {"egressDestinations": ["192.0.2.0/24"], "ingressSourceAllowlist": ["group:team-a"],
                   "dnsSuffixes": ["cosmos.lab.example.net"]}
    }]);
    apply(&tailnets, &owner, owner_spec.clone())
        .await
        .expect("owner Tailnet with a contributor");

    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    let egresses: Api<TailnetEgress> = Api::namespaced(client.clone(), &ns);
    apply_egress(&egresses, &ns, "site", &owner, json!([remote_db_target()]))
        .await
        .expect("owner's egress");
    apply_egress(
        &egresses,
        &ns,
        "b-site",
        &contributor,
        json!([{"name": "b-db", "address": "192.0.2.10", "port": 5432}]),
    )
    .await
    .expect("contributor's egress");
    apply_egress(
        &egresses,
        &ns,
        "b-outside",
        &contributor,
        json!([{"name": "b-outside", "address": "198.51.100.7", "port": 22}]),
    )
    .await
    .expect("contributor's egress outside its limits");

    // The contributor publishes its fragment; deliver it to the owner (Git, in real life).
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let fragment_name = format!("{contributor}-policy-fragment");
    let fragment = wait_for(
        "the contributor's fragment with both egresses",
        WAIT,
        || async {
            let cm = config_maps
                .get_opt(&fragment_name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("not published yet")?;
            let text = cm
                .data
                .and_then(|d| d.get("fragment.json").cloned())
                .ok_or("no fragment.json")?;
            if text.contains("198.51.100.7") && text.contains("192.0.2.10") {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await;
    let deliver = |text: String| {
        let config_maps = config_maps.clone();
        async move {
            config_maps
                .patch(
                    "cosmos-fragment",
                    &PatchParams::apply("git-delivery").force(),
                    &Patch::Apply(json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "cosmos-fragment"},
                        "data": {"fragment.json": text}
                    })),
                )
                .await
                .expect("deliver the fragment")
        }
    };
    deliver(fragment).await;

    // Owner: one refused entry, named; the rest merged.
    let owner_tailnet = wait_for(
        "the owner to merge cosmos's fragment, partly",
        WAIT,
        || async {
            let t = tailnets.get(&owner).await.map_err(|e| e.to_string())?;
            let merged = t
                .status
                .as_ref()
                .and_then(|s| s.contributors.first())
                .is_some_and(|c| c.state == "PartlyRefused");
            if merged
                && ConditionIs::new("ContributionsAccepted", "False")
                    .reason("ContributionRefused")
                    .holds_for(&t)
            {
                Ok(t)
            } else {
                Err(t.describe())
            }
        },
    )
    .await;
    let status = owner_tailnet.status.clone().unwrap_or_default();
    let cosmos_status = &status.contributors[0];
    assert_eq!(cosmos_status.state, "PartlyRefused", "{cosmos_status:?}");
    assert!(
        cosmos_status
            .refused
            .iter()
            .any(|r| r.contains("198.51.100.7") && r.contains("limits.egressDestinations")),
        "{cosmos_status:?}"
    );
    eprintln!("owner's contributors: {:?}", status.contributors);
    // The contributor's egress inside its limits: live, and bytes reach the remote site.
    wait_for_condition(
        &egresses,
        "b-site",
        ConditionIs::new("Ready", "True"),
        Some(&operator),
    )
    .await;
    let run = ops
        .tcp_check("client-b", &format!("b-db.{ns}.svc.cluster.local:5432"), 30)
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "echo through the contributor's egress failed:\n{run}\n{}",
        env.diagnostics(Some(&ns))
    );
    // The refused one: not live, named on the egress and on the contributor's Tailnet.
    wait_for_condition(
        &egresses,
        "b-outside",
        ConditionIs::new("PolicyEffective", "False").reason("Contributing"),
        None,
    )
    .await;
    let contributor_tailnet = wait_for_condition(
        &tailnets,
        &contributor,
        ConditionIs::new("FragmentLive", "False").reason("FragmentNotLive"),
        None,
    )
    .await;
    let not_live = contributor_tailnet
        .status
        .clone()
        .unwrap_or_default()
        .fragment
        .map(|f| f.not_live)
        .unwrap_or_default();
    assert!(
        not_live.iter().any(|e| e.contains("198.51.100.7"))
            && !not_live.iter().any(|e| e.contains("192.0.2.10")),
        "{not_live:?}"
    );
    eprintln!(
        "--- kubectl get tailnet -o wide\n{}--- kubectl describe tailnet {owner} (status)\n{}--- kubectl describe tailnet {contributor} (status)\n{}",
        kubectl(
            &env,
            &["get", "tailnet", &owner, &contributor, "-o", "wide"]
        ),
        kubectl(
            &env,
            &["get", "tailnet", &owner, "-o", "jsonpath={.status}"]
        ),
        kubectl(
            &env,
            &["get", "tailnet", &contributor, "-o", "jsonpath={.status}"]
        ),
    );
    // The owner's own egress is unaffected.
    wait_for_condition(&egresses, "site", ConditionIs::new("Ready", "True"), None).await;
    let headscale = env.headscale_api();
    let live = headscale.get_policy().await.expect("live policy");
    assert!(
        live.contains("contributor cosmos: TailnetEgress/"),
        "{live}"
    );
    assert!(
        !live.contains("198.51.100.7"),
        "a refused grant is not live:\n{live}"
    );

    // The kubeconfig variant: the owner reads the contributor's own ConfigMap through the API
    // with a ServiceAccount whose Role allows get/watch on that one ConfigMap (the documented
    // Role). The delivered copy is deleted first, so only the kubeconfig path can serve it.
    config_maps
        .delete("cosmos-fragment", &DeleteParams::default())
        .await
        .expect("delete the delivered fragment");
    let reader = "policy-owner-reader";
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), &ns),
        reader,
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": reader}}),
    )
    .await
    .expect("reader ServiceAccount");
    apply(
        &Api::<Role>::namespaced(client.clone(), &ns),
        reader,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": reader},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                          "resourceNames": [fragment_name.clone()], "verbs": ["get", "watch"]}]}),
    )
    .await
    .expect("reader Role");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &ns);
    apply(
        &bindings,
        reader,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": reader},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": reader},
               "subjects": [{"kind": "ServiceAccount", "name": reader, "namespace": ns.clone()}]}),
    )
    .await
    .expect("reader RoleBinding");
    let (token, kubeconfig) = token_kubeconfig(&env, &client, &ns, reader).await;
    apply(
        &Api::<Secret>::namespaced(client.clone(), &ns),
        "cosmos-kubeconfig",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cosmos-kubeconfig"},
               "stringData": {"kubeconfig": kubeconfig.to_string()}}),
    )
    .await
    .expect("kubeconfig Secret");
    owner_spec["spec"]["policy"]["contributors"][0]["source"] = json!({"kubeconfig": {
        "secretRef": {"name": "cosmos-kubeconfig", "key": "kubeconfig"},
        "namespace": ns.clone(), "configMap": fragment_name.clone()}});
    let generation = apply(&tailnets, &owner, owner_spec.clone())
        .await
        .expect("owner Tailnet reading through the kubeconfig")
        .metadata
        .generation;
    wait_for("the owner to read cosmos through its API", WAIT, || async {
        let t = tailnets.get(&owner).await.map_err(|e| e.to_string())?;
        let state = t
            .status
            .as_ref()
            .and_then(|s| s.contributors.first())
            .map(|c| (c.state.clone(), c.error.clone()));
        let judged = t.status.as_ref().and_then(|s| s.observed_generation) == generation;
        match state {
            Some((state, None)) if judged && state == "PartlyRefused" => Ok(()),
            other => Err(format!("{other:?}\n{}", t.describe())),
        }
    })
    .await;
    let log = operator.log_text();
    assert!(
        !log.contains(&token),
        "the kubeconfig's token reached the operator's log"
    );

    // An ingress of the contributor: its grant and its DNS record come through the live
    // fragment (read through the API), the laptop reaches it, the owner's extra records
    // carry its name.
    apply(
        &Api::<Deployment>::namespaced(client.clone(), &ns),
        "b-echo",
        test_server_deployment(
            &ns,
            "b-echo",
            json!(["tcp-echo", "--listen", "0.0.0.0:5432"]),
        ),
    )
    .await
    .expect("backend Deployment");
    apply(
        &Api::<Service>::namespaced(client.clone(), &ns),
        "b-echo",
        service_object(&ns, "b-echo", 5432),
    )
    .await
    .expect("backend Service");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    apply(
        &ingresses,
        "b-db",
        ingress_object(
            &ns,
            "b-db",
            &contributor,
            None,
            json!([{"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 6000,
                    "backend": {"service": "b-echo", "port": 5432}}]),
        ),
    )
    .await
    .expect("contributor's ingress");
    let ingress = wait_for_condition(
        &ingresses,
        "b-db",
        ConditionIs::new("Ready", "True"),
        Some(&operator),
    )
    .await;
    let ip = tailnet_ipv4(&ingress.status.clone().unwrap_or_default().tailnet_ips)
        .expect("tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    wait_for(
        "the contributor's tcp ingress to echo for the laptop",
        WAIT,
        || async { tcp_echo(&laptop, &ip, 6000).await },
    )
    .await;
    let record = format!("db.{ns}.cosmos.lab.example.net");
    wait_for(
        "the owner's extra records to carry the contributor's name",
        WAIT,
        || async {
            let hosts = config_maps
                .get_opt(tno_testenv::HOSTS_CONFIG_MAP)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|cm| cm.data)
                .and_then(|d| d.get("extra-records.json").cloned())
                .unwrap_or_default();
            if hosts.contains(&record) && hosts.contains(&ip) {
                Ok(())
            } else {
                Err(hosts)
            }
        },
    )
    .await;

    let live = headscale.get_policy().await.expect("live policy");
    assert!(
        live.contains("contributor cosmos: TailnetIngress/"),
        "{live}"
    );

    // Access revoked: stale, the merged grant stays (also across an owner restart).
    bindings
        .delete(reader, &DeleteParams::default())
        .await
        .expect("revoke the reader");
    wait_for_condition(
        &tailnets,
        &owner,
        ConditionIs::new("ContributionsAccepted", "False").reason("ContributorStale"),
        Some(&operator),
    )
    .await;
    operator.terminate().await.expect("operator stops");
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator restarted");
    // A new generation (a limit that changes nothing here) as the witness that the restarted
    // operator judged the owner again.
    owner_spec["spec"]["policy"]["contributors"][0]["limits"]["dnsSuffixes"] =
        json!(["cosmos.example.net"]);
    let generation = apply(&tailnets, &owner, owner_spec.clone())
        .await
        .expect("owner Tailnet, next generation")
        .metadata
        .generation;
    let restarted = wait_for(
        "the restarted owner to judge the stale contributor",
        WAIT,
        || async {
            let t = tailnets.get(&owner).await.map_err(|e| e.to_string())?;
            let judged = t.status.as_ref().and_then(|s| s.observed_generation) == generation
                && ConditionIs::new("ContributionsAccepted", "False")
                    .reason("ContributorStale")
                    .holds_for(&t)
                && ConditionIs::new("PolicyApplied", "True").holds_for(&t);
            if judged { Ok(t) } else { Err(t.describe()) }
        },
    )
    .await;
    let stale = &restarted.status.clone().unwrap_or_default().contributors[0];
    assert_eq!(stale.state, "Stale", "{stale:?}");
    assert_eq!(
        headscale.get_policy().await.expect("live policy"),
        live,
        "the owner's restart changed the live policy"
    );
    let run = ops
        .tcp_check(
            "client-b-stale",
            &format!("b-db.{ns}.svc.cluster.local:5432"),
            30,
        )
        .await
        .expect("client pod");
    assert!(
        run.succeeded(),
        "the stale contributor's grant must stay live:\n{run}"
    );

    // Removed from the list: its entries go, its egress says so.
    owner_spec["spec"]["policy"]["contributors"] = json!([]);
    apply(&tailnets, &owner, owner_spec)
        .await
        .expect("owner without contributors");
    wait_for_condition(
        &egresses,
        "b-site",
        ConditionIs::new("PolicyEffective", "False").reason("Contributing"),
        Some(&operator),
    )
    .await;
    let live = headscale.get_policy().await.expect("live policy");
    assert!(!live.contains("contributor cosmos"), "{live}");
    wait_for_condition(&egresses, "site", ConditionIs::new("Ready", "True"), None).await;
    operator.terminate().await.expect("operator stops");
}
