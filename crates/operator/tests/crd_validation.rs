//! The CRDs in a real kube-apiserver: the examples are accepted, and each invalid field is
//! rejected by the schema or a CEL rule with a message naming the field.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn resource(kind: &str, plural: &str) -> ApiResource {
    let mut r = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tailnet-operator.dev",
        "v1alpha1",
        kind,
    ));
    r.plural = plural.to_string();
    r
}

fn examples() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut docs = Vec::new();
    for file in [
        "10-tailnet.yaml",
        "20-egress.yaml",
        "21-egress-devices.yaml",
        "30-ingress.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect("example");
        docs.push(serde_yaml::from_str(&text).expect("yaml"));
    }
    docs
}

/// Server-side apply with dryRun=All: the apiserver validates (schema + CEL) without storing.
async fn dry_run(client: &kube::Client, namespace: &str, object: &Value) -> Result<(), String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let (api, name) = match kind {
        "Tailnet" => (
            Api::<DynamicObject>::all_with(client.clone(), &resource("Tailnet", "tailnets")),
            object["metadata"]["name"].as_str(),
        ),
        "TailnetEgress" => (
            Api::namespaced_with(
                client.clone(),
                namespace,
                &resource("TailnetEgress", "tailnetegresses"),
            ),
            object["metadata"]["name"].as_str(),
        ),
        _ => (
            Api::namespaced_with(
                client.clone(),
                namespace,
                &resource("TailnetIngress", "tailnetingresses"),
            ),
            object["metadata"]["name"].as_str(),
        ),
    };
    let mut object = object.clone();
    if kind != "Tailnet" {
        object["metadata"]["namespace"] = namespace.into();
    }
    api.patch(
        name.unwrap_or_default(),
        &PatchParams::apply("crd-test").dry_run(),
        &Patch::Apply(&object),
    )
    .await
    .map(|_| ())
    .map_err(|e| e.to_string())
}

fn edit(mut object: Value, f: impl FnOnce(&mut Value)) -> Value {
    f(&mut object);
    object
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_and_cel_reject_bad_input_by_field() {
    let env = tno_testenv_kube::shared()
        .await
        .unwrap_or_else(|e| panic!("kube environment: {e}"));
    let ns = env.namespace("crd").await.expect("namespace");
    let client = ns.client();
    let [tailnet, egress, devices, ingress]: [Value; 4] =
        examples().try_into().expect("four examples");

    for object in [&tailnet, &egress, &devices, &ingress] {
        dry_run(client, ns.name(), object)
            .await
            .unwrap_or_else(|e| panic!("valid example rejected: {e}"));
    }

    let cases = bad_inputs(&tailnet, &egress, &ingress);
    let mut failures = Vec::new();
    for (case, object, expected) in cases {
        match dry_run(client, ns.name(), &object).await {
            Ok(()) => failures.push(format!("{case}: accepted")),
            Err(message) if message.contains(expected) => {}
            Err(message) => failures.push(format!(
                "{case}: message does not contain {expected:?}: {message}"
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each bad input (an example with one field broken) and what the rejection must name.
fn bad_inputs(
    tailnet: &Value,
    egress: &Value,
    ingress: &Value,
) -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "port 0",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][0]["port"] = 0.into()
            }),
            "spec.targets[0].port",
        ),
        (
            "port 70000",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][0]["port"] = 70000.into()
            }),
            "spec.targets[0].port",
        ),
        (
            "invalid IP",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][0]["address"] = "192.0.2.300".into()
            }),
            "must be an IPv4/IPv6 address or a lowercase DNS name",
        ),
        (
            "duplicate target",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][1]["name"] = "remote-db".into()
            }),
            "duplicate entries for key [name=\"remote-db\"]",
        ),
        (
            "no targets",
            edit(egress.clone(), |v| v["spec"]["targets"] = json!([])),
            "spec.targets",
        ),
        (
            "bad service name",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][0]["name"] = "Remote_DB".into()
            }),
            "spec.targets[0].name",
        ),
        (
            "bad alias",
            edit(egress.clone(), |v| {
                v["spec"]["targets"][1]["aliases"] = json!(["not a host"])
            }),
            "spec.targets[1].aliases[0]",
        ),
        (
            "no consumers",
            edit(egress.clone(), |v| {
                v["spec"]["consumerNamespaces"] = json!([])
            }),
            "spec.consumerNamespaces",
        ),
        (
            "backend tls on tcp",
            edit(ingress.clone(), |v| {
                v["spec"]["exposes"][1]["mode"] = "tcp".into();
                v["spec"]["exposes"][1]["port"] = 8443.into();
                v["spec"]["exposes"][1]
                    .as_object_mut()
                    .map(|o| o.remove("timeouts"));
            }),
            "backend.tls requires mode: http",
        ),
        (
            "tcp sharing a port",
            edit(ingress.clone(), |v| {
                v["spec"]["exposes"][0]["mode"] = "tcp".into()
            }),
            "a tcp expose needs a port of its own",
        ),
        (
            "unknown mode",
            edit(ingress.clone(), |v| {
                v["spec"]["exposes"][0]["mode"] = "udp".into()
            }),
            "spec.exposes[0].mode",
        ),
        (
            "bad duration",
            edit(ingress.clone(), |v| {
                v["spec"]["exposes"][1]["timeouts"]["request"] = "10 minutes".into()
            }),
            "spec.exposes[1].timeouts.request",
        ),
        (
            "bad principal",
            edit(ingress.clone(), |v| {
                v["spec"]["allowFrom"] = json!(["team a"])
            }),
            "spec.allowFrom[0]",
        ),
        (
            "template without {name}",
            edit(tailnet.clone(), |v| {
                v["spec"]["dns"]["ingressAliasTemplate"] = "{namespace}.example.net".into()
            }),
            "must contain the {name} placeholder",
        ),
        (
            "template with unknown placeholder",
            edit(tailnet.clone(), |v| {
                v["spec"]["dns"]["ingressNameTemplate"] = "{name}.{cluster}.example.net".into()
            }),
            "spec.dns.ingressNameTemplate",
        ),
        (
            "unknown policy mode",
            edit(tailnet.clone(), |v| {
                v["spec"]["policy"]["mode"] = "Enforce".into()
            }),
            "spec.policy.mode",
        ),
        (
            "server not a URL",
            edit(tailnet.clone(), |v| {
                v["spec"]["server"] = "control.example.net".into()
            }),
            "spec.server",
        ),
        (
            "no tag owners",
            edit(tailnet.clone(), |v| {
                v["spec"]["policy"]["tagOwners"] = json!([])
            }),
            "spec.policy.tagOwners",
        ),
    ]
}
