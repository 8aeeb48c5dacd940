//! The objects the e2e tests apply, in the shape every test uses: server-side apply as field
//! manager `test`, TailnetEgress/TailnetIngress specs, backends from the test-servers image,
//! TLS Secrets, and the agent pods the operator creates.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tailnet_api::TailnetEgress;
use tno_testenv::{E2eEnv, E2eNamespace};
use tno_testenv_tailnet::{JoinOptions, JoinedNode};

/// Server-side apply, forced (the test owns every field it sets).
pub async fn apply<K>(api: &Api<K>, name: &str, object: Value) -> kube::Result<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(object),
    )
    .await
}

/// The Tailnet every e2e test gets: `t-<namespace>`.
pub fn tailnet_name(namespace: &str) -> String {
    format!("t-{namespace}")
}

/// The usual start: the bootstrap Secret and the lab's base policy in `ops`, and the Tailnet
/// of [`tailnet_name`] in Apply mode. Returns the Tailnet's name.
pub async fn bootstrap_applied_tailnet(env: &E2eEnv, ops: &E2eNamespace<'_>) -> String {
    ops.create_bootstrap(&env.base_policy().expect("base policy"))
        .await
        .expect("bootstrap");
    let name = tailnet_name(ops.name());
    apply(
        &Api::<tailnet_api::Tailnet>::all(ops.client().clone()),
        &name,
        env.tailnet_object(&name, "Apply"),
    )
    .await
    .expect("Tailnet");
    name
}

/// A TailnetEgress in `namespace` whose only consumer namespace is its own.
pub fn egress_object(namespace: &str, name: &str, tailnet: &str, targets: Value) -> Value {
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetEgress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tailnetRef": {"name": tailnet}, "consumerNamespaces": [namespace],
                 "targets": targets}
    })
}

/// A TailnetIngress open to group:team-a (the laptop's user), with `exposes` and, when
/// given, a TLS Secret of its own (otherwise the Tailnet's default issuer applies).
pub fn ingress_object(
    namespace: &str,
    name: &str,
    tailnet: &str,
    tls_secret: Option<&str>,
    exposes: Value,
) -> Value {
    let mut object = json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tailnetRef": {"name": tailnet}, "allowFrom": ["group:team-a"],
                 "exposes": exposes}
    });
    if let Some(secret) = tls_secret {
        object["spec"]["tls"] = json!({"secretName": secret});
    }
    object
}

/// A one-replica Deployment of the test-servers image running `args`, its pods labelled
/// `app: <name>`.
pub fn test_server_deployment(namespace: &str, name: &str, args: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "server",
                                       "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE, "args": args}]}}}
    })
}

/// A Service selecting `app: <name>` with one port named `main`.
pub fn service_object(namespace: &str, name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": name}, "ports": [{"name": "main", "port": port, "targetPort": port}]}
    })
}

/// A `kubernetes.io/tls` Secret, as cert-manager would write it.
pub fn tls_secret(name: &str, cert_pem: &str, key_pem: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (
                "tls.crt".to_string(),
                ByteString(cert_pem.as_bytes().to_vec()),
            ),
            (
                "tls.key".to_string(),
                ByteString(key_pem.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    }
}

/// The pods of the agent `instance` (its Deployment name, e.g. `tailnet-egress-site`).
pub async fn agent_pods(pods: &Api<Pod>, instance: &str) -> kube::Result<Vec<Pod>> {
    let selector = format!("app.kubernetes.io/instance={instance}");
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// The pods' uids, sorted: equal lists mean no pod was replaced.
pub fn pod_uids(pods: &[Pod]) -> Vec<String> {
    let mut uids: Vec<String> = pods.iter().filter_map(|p| p.uid()).collect();
    uids.sort();
    uids
}

/// The IPv4 address among a node's tailnet IPs.
pub fn tailnet_ipv4(ips: &[String]) -> Option<String> {
    ips.iter().find(|a| a.contains('.')).cloned()
}

/// Applies a TailnetEgress ([`egress_object`]) named `name` in `namespace`.
pub async fn apply_egress(
    egresses: &Api<TailnetEgress>,
    namespace: &str,
    name: &str,
    tailnet: &str,
    targets: Value,
) -> kube::Result<TailnetEgress> {
    apply(
        egresses,
        name,
        egress_object(namespace, name, tailnet, targets),
    )
    .await
}

/// The remote site's echo server, the usual single egress target.
pub fn remote_db_target() -> Value {
    json!({"name": "remote-db", "address": "192.0.2.10", "port": 5432})
}

/// The lab's Tailnet whose ingresses without a TLS Secret get a cert-manager Certificate from
/// ClusterIssuer `apps-ca`.
pub fn tailnet_with_default_issuer(env: &E2eEnv, name: &str) -> Value {
    let mut tailnet = env.tailnet_object(name, "Apply");
    tailnet["spec"]["defaults"] =
        json!({"tls": {"issuerRef": {"name": "apps-ca", "kind": "ClusterIssuer"}}});
    tailnet
}

/// A new tailnet node tagged `tag:client` (outside every ingress's allowFrom), named
/// `<prefix>-<end of the namespace>` so that parallel runs do not collide.
pub async fn join_client_node(env: &E2eEnv, prefix: &str, namespace: &str) -> JoinedNode {
    env.tailnet()
        .join_node(
            &format!("{prefix}-{}", &namespace[namespace.len() - 5..]),
            JoinOptions {
                tags: vec!["tag:client".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{prefix} node: {e}"))
}

/// TailnetGatewayParameters `tailnet` in `ns` (Tailnet `tailnet`, open to group:team-a, in-cluster
/// for `in_cluster` namespaces when any) and the GatewayClass `class` of
/// `tailnet-operator.dev/gateway` naming them.
pub async fn apply_gateway_class(
    client: &kube::Client,
    ns: &str,
    class: &str,
    tailnet: &str,
    in_cluster: &[&str],
) {
    let mut spec = json!({"tailnetRef": {"name": tailnet},
                          "allowFrom": [tno_testenv_tailnet::TEAM_A_GROUP]});
    if !in_cluster.is_empty() {
        spec["inCluster"] = json!({"namespaces": in_cluster});
    }
    apply(
        &Api::<tailnet_api::gateway_parameters::TailnetGatewayParameters>::namespaced(
            client.clone(),
            ns,
        ),
        "tailnet",
        json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetGatewayParameters",
            "metadata": {"name": "tailnet", "namespace": ns},
            "spec": spec,
        }),
    )
    .await
    .expect("TailnetGatewayParameters");
    apply(
        &Api::<tailnet_gateway_api::GatewayClass>::all(client.clone()),
        class,
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": class},
            "spec": {"controllerName": "tailnet-operator.dev/gateway",
                     "parametersRef": {"group": "tailnet-operator.dev",
                                       "kind": "TailnetGatewayParameters",
                                       "name": "tailnet", "namespace": ns}}
        }),
    )
    .await
    .expect("GatewayClass");
}
