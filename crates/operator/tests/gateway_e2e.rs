//! Gateway API end to end (issue 30): the Standard CRDs of v1.6.3, a TailnetGatewayParameters
//! and a GatewayClass of `tailnet-operator.dev/gateway` (Accepted), one Gateway with two HTTPS
//! listeners on one port (`*.` and `admin.` of the domain, each its own certificate Secret,
//! presented by SNI), a TLS passthrough listener and a TCP listener;
//! two HTTPRoutes by hostname and path, a TLSRoute and a TCPRoute; a backend in another
//! namespace allowed by a ReferenceGrant and one refused without it. From the laptop (a
//! tailnet node of group:team-a), real bytes: HTTPS requests reach the backend their host and
//! path select (each backend names itself in its answer), the TLS passthrough reaches a
//! backend that terminates TLS with its own certificate, the TCP echo echoes, and the refused
//! backend gets no request (500). The statuses say so: class Accepted; Gateway
//! Accepted/Programmed with the node's tailnet IPs as `status.addresses`; every listener
//! Accepted/Programmed/ResolvedRefs with its attached routes; the refused route
//! ResolvedRefs=False/RefNotPermitted. Then cert-manager's Gateway integration (its real
//! controller with the gateway-shim): the Gateway annotated with a CA ClusterIssuer gets a
//! listener whose certificate Secret does not exist; cert-manager issues it, and the listener
//! serves it (a client trusting only that CA completes the handshake).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use support::conditions::describe;
use support::lab_operator::start_operator;
use support::objects::{
    apply, apply_gateway_class, bootstrap_applied_tailnet, service_object, test_server_deployment,
};
use support::tailnet::{self_signed, tcp_echo, tls_connect};
use support::wait::wait_for;
use tailnet_gateway_api::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TCPRoute, TLSRoute};
use tno_testenv::{E2eEnv, LabCa, OperatorArgs};
use tno_testenv_tailnet::LocalApi;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONTROLLER: &str = "tailnet-operator.dev/gateway";
/// How long one convergence step may take (agent start, node join, policy sync).
const STEP: Duration = Duration::from_secs(90);
/// The HTTPS listener's names: `*.gw.example.net`; the TLS listener's: `secure.gw.example.net`.
const DOMAIN: &str = "gw.example.net";
const HTTPS_PORT: u16 = 443;
const TLS_PORT: u16 = 8443;
const TCP_PORT: u16 = 5432;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_serves_https_tls_and_tcp_routes_to_the_laptop() {
    let started = Instant::now();
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let env_ready = started.elapsed();
    let ops = env.namespace("gw").await.expect("namespace");
    let other = env.namespace("gwb").await.expect("second namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let ns_b = other.name().to_string();
    let crds = install_gateway_api_crds(&client).await;
    let tailnet = bootstrap_applied_tailnet(&env, &ops).await;
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    let setup = started.elapsed();
    let backend_cert = deploy_backends(&client, &ns, &ns_b).await;
    let class = format!("tailnet-{ns}");
    apply_gateway_class(&client, &ns, &class, &tailnet, &[]).await;
    let (gateway_cert, admin_cert) = apply_gateway(&client, &ns, &ns_b, &class).await;

    class_accepted(&client, &class).await;
    let ips = gateway_programmed(&env, &client, &ns).await;
    let programmed = started.elapsed();
    routes_status(&client, &ns).await;
    let ip = ips
        .iter()
        .find(|a| a.contains('.'))
        .cloned()
        .expect("a tailnet IPv4");

    let laptop = env.tailnet().laptop.node.local_api();
    https_by_host_and_path(&laptop, &ip, &gateway_cert).await;
    each_listener_its_certificate(&laptop, &ip, &admin_cert, &gateway_cert).await;
    tls_passthrough(&laptop, &ip, &backend_cert).await;
    wait_for("the TCP echo through the TCP listener", STEP, || async {
        tcp_echo(&laptop, &ip, TCP_PORT).await
    })
    .await;
    eprintln!("TCP: echoed through {ip}:{TCP_PORT}");
    let issued = Instant::now();
    cert_manager_issues_a_listener_certificate(&env, &client, &ns, &laptop, &ip).await;
    let issued = issued.elapsed();
    eprintln!(
        "timings: environment {env_ready:.1?}, setup ({crds} CRDs, operator) {:.1?}, \
         Gateway programmed {:.1?}, traffic {:.1?} (cert-manager phase {issued:.1?}), \
         total {:.1?}",
        setup - env_ready,
        programmed - setup,
        started.elapsed() - programmed,
        started.elapsed()
    );
    operator.terminate().await.expect("operator stops cleanly");
}

/// The Standard-channel CRDs of `deps/build.sh gateway-api`, installed and Established.
/// Returns how many.
async fn install_gateway_api_crds(client: &kube::Client) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    tno_testenv_kube::crds::install_gateway_api_crds(client, &root, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .len()
}

/// Backends: `alpha`, `beta` (HTTP echo naming itself), `db` (TCP echo) and `secure` (HTTPS
/// echo with its own self-signed certificate for `secure.<DOMAIN>`) in `ns`; `remote` and
/// `forbidden` (HTTP echo) in `ns_b`. Returns `secure`'s certificate (PEM).
async fn deploy_backends(client: &kube::Client, ns: &str, ns_b: &str) -> String {
    let http = |name: &str| json!(["http-echo", "--listen", "0.0.0.0:8080", "--name", name]);
    for (namespace, name, args, port) in [
        (ns, "alpha", http("alpha"), 8080),
        (ns, "beta", http("beta"), 8080),
        (
            ns,
            "db",
            json!(["tcp-echo", "--listen", "0.0.0.0:5432"]),
            5432,
        ),
        (ns_b, "remote", http("remote"), 8080),
        (ns_b, "forbidden", http("forbidden"), 8080),
    ] {
        deploy(
            client,
            namespace,
            name,
            test_server_deployment(namespace, name, args),
            port,
        )
        .await;
    }
    let (cert, key) = self_signed(&[format!("secure.{DOMAIN}")]);
    apply(
        &Api::<Secret>::namespaced(client.clone(), ns),
        "secure-backend-tls",
        serde_json::to_value(tls_secret(ns, "secure-backend-tls", &cert, &key)).expect("json"),
    )
    .await
    .expect("the secure backend's Secret");
    let mut secure = test_server_deployment(
        ns,
        "secure",
        json!([
            "https-echo",
            "--listen",
            "0.0.0.0:8443",
            "--name",
            "secure",
            "--cert",
            "/tls/tls.crt",
            "--key",
            "/tls/tls.key"
        ]),
    );
    let pod = &mut secure["spec"]["template"]["spec"];
    pod["volumes"] = json!([{"name": "tls", "secret": {"secretName": "secure-backend-tls"}}]);
    pod["containers"][0]["volumeMounts"] = json!([{"name": "tls", "mountPath": "/tls"}]);
    deploy(client, ns, "secure", secure, 8443).await;
    cert
}

async fn deploy(client: &kube::Client, ns: &str, name: &str, deployment: Value, port: u16) {
    apply(
        &Api::<Deployment>::namespaced(client.clone(), ns),
        name,
        deployment,
    )
    .await
    .expect("backend Deployment");
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        name,
        service_object(ns, name, port),
    )
    .await
    .expect("backend Service");
}

fn tls_secret(ns: &str, name: &str, cert: &str, key: &str) -> Secret {
    let mut secret = support::objects::tls_secret(name, cert, key);
    secret.metadata.namespace = Some(ns.to_string());
    secret
}

/// The Gateway `web` (HTTPS 443 for `*.<DOMAIN>` with the test's certificate, TLS
/// passthrough 8443 for `secure.<DOMAIN>`, TCP 5432), its routes and the ReferenceGrant.
/// Returns the HTTPS listener's certificate and key (PEM).
async fn apply_gateway(
    client: &kube::Client,
    ns: &str,
    ns_b: &str,
    class: &str,
) -> (String, String) {
    let (cert, key) = self_signed(&[format!("*.{DOMAIN}")]);
    apply(
        &Api::<Secret>::namespaced(client.clone(), ns),
        "web-tls",
        serde_json::to_value(tls_secret(ns, "web-tls", &cert, &key)).expect("json"),
    )
    .await
    .expect("the HTTPS listener's Secret");
    let (admin_cert, admin_key) = self_signed(&[format!("admin.{DOMAIN}")]);
    apply(
        &Api::<Secret>::namespaced(client.clone(), ns),
        "admin-tls",
        serde_json::to_value(tls_secret(ns, "admin-tls", &admin_cert, &admin_key)).expect("json"),
    )
    .await
    .expect("the admin HTTPS listener's Secret");
    let gateways = Api::<Gateway>::namespaced(client.clone(), ns);
    apply(
        &gateways,
        "web",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"gatewayClassName": class, "listeners": [
                {"name": "https", "port": HTTPS_PORT, "protocol": "HTTPS",
                 "hostname": format!("*.{DOMAIN}"),
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "web-tls"}]}},
                {"name": "https-admin", "port": HTTPS_PORT, "protocol": "HTTPS",
                 "hostname": format!("admin.{DOMAIN}"),
                 "tls": {"mode": "Terminate", "certificateRefs": [{"name": "admin-tls"}]}},
                {"name": "tls", "port": TLS_PORT, "protocol": "TLS",
                 "hostname": format!("secure.{DOMAIN}"), "tls": {"mode": "Passthrough"}},
                {"name": "tcp", "port": TCP_PORT, "protocol": "TCP"},
            ]}
        }),
    )
    .await
    .expect("Gateway");
    let parent = |section: &str| json!([{"name": "web", "sectionName": section}]);
    let backend = |name: &str, namespace: Option<&str>, port: u16| {
        let mut r = json!({"name": name, "port": port});
        if let Some(namespace) = namespace {
            r["namespace"] = json!(namespace);
        }
        r
    };
    let prefix = |path: &str| json!([{"path": {"type": "PathPrefix", "value": path}}]);
    let http_routes = Api::<HTTPRoute>::namespaced(client.clone(), ns);
    // app.<DOMAIN>: `/` → alpha, `/remote` → remote in ns_b (granted).
    apply(
        &http_routes,
        "app",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "app", "namespace": ns},
            "spec": {"parentRefs": parent("https"), "hostnames": [format!("app.{DOMAIN}")],
                     "rules": [
                         {"matches": prefix("/"), "backendRefs": [backend("alpha", None, 8080)]},
                         {"matches": prefix("/remote"),
                          "backendRefs": [backend("remote", Some(ns_b), 8080)]},
                     ]}
        }),
    )
    .await
    .expect("HTTPRoute app");
    // other.<DOMAIN>: `/` → beta, `/forbidden` → forbidden in ns_b (not granted).
    apply(
        &http_routes,
        "other",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "other", "namespace": ns},
            "spec": {"parentRefs": parent("https"), "hostnames": [format!("other.{DOMAIN}")],
                     "rules": [
                         {"matches": prefix("/"), "backendRefs": [backend("beta", None, 8080)]},
                         {"matches": prefix("/forbidden"),
                          "backendRefs": [backend("forbidden", Some(ns_b), 8080)]},
                     ]}
        }),
    )
    .await
    .expect("HTTPRoute other");
    // admin.<DOMAIN> on its own listener (own certificate): `/` → beta.
    apply(
        &http_routes,
        "admin",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "admin", "namespace": ns},
            "spec": {"parentRefs": parent("https-admin"), "hostnames": [format!("admin.{DOMAIN}")],
                     "rules": [{"matches": prefix("/"), "backendRefs": [backend("beta", None, 8080)]}]}
        }),
    )
    .await
    .expect("HTTPRoute admin");
    apply(
        &Api::<TLSRoute>::namespaced(client.clone(), ns),
        "secure",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TLSRoute",
            "metadata": {"name": "secure", "namespace": ns},
            "spec": {"parentRefs": parent("tls"), "hostnames": [format!("secure.{DOMAIN}")],
                     "rules": [{"backendRefs": [backend("secure", None, 8443)]}]}
        }),
    )
    .await
    .expect("TLSRoute");
    apply(
        &Api::<TCPRoute>::namespaced(client.clone(), ns),
        "db",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
            "metadata": {"name": "db", "namespace": ns},
            "spec": {"parentRefs": parent("tcp"),
                     "rules": [{"backendRefs": [backend("db", None, 5432)]}]}
        }),
    )
    .await
    .expect("TCPRoute");
    // Routes of `ns` may use the Service `remote` of ns_b, and only that one.
    apply(
        &Api::<ReferenceGrant>::namespaced(client.clone(), ns_b),
        "from-gw",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "ReferenceGrant",
            "metadata": {"name": "from-gw", "namespace": ns_b},
            "spec": {"from": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                               "namespace": ns}],
                     "to": [{"group": "", "kind": "Service", "name": "remote"}]}
        }),
    )
    .await
    .expect("ReferenceGrant");
    (cert, admin_cert)
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

async fn class_accepted(client: &kube::Client, class: &str) {
    let classes = Api::<GatewayClass>::all(client.clone());
    let accepted = wait_for("GatewayClass Accepted=True", STEP, || async {
        let c = classes.get(class).await.map_err(|e| e.to_string())?;
        let conditions = c.status.clone().unwrap_or_default().conditions;
        if is_true(&conditions, "Accepted") {
            Ok(c)
        } else {
            Err(describe(&conditions))
        }
    })
    .await;
    let status = accepted.status.unwrap_or_default();
    let condition = condition(&status.conditions, "Accepted").expect("Accepted");
    assert_eq!(condition.reason, "Accepted");
    assert_eq!(condition.observed_generation, accepted.metadata.generation);
    eprintln!("GatewayClass {class}: {}", describe(&status.conditions));
}

/// Waits until the Gateway is Accepted and Programmed with addresses, then checks that those
/// are the tailnet IPs of its node and that every listener is Accepted, Programmed and
/// ResolvedRefs with its routes attached. Returns the addresses.
async fn gateway_programmed(env: &E2eEnv, client: &kube::Client, ns: &str) -> Vec<String> {
    let gateways = Api::<Gateway>::namespaced(client.clone(), ns);
    let gateway = wait_for("Gateway web Accepted and Programmed", STEP, || async {
        let g = gateways.get("web").await.map_err(|e| e.to_string())?;
        let status = g.status.clone().unwrap_or_default();
        if is_true(&status.conditions, "Accepted")
            && is_true(&status.conditions, "Programmed")
            && !status.addresses.is_empty()
        {
            Ok(g)
        } else {
            Err(format!(
                "{}\naddresses {:?}",
                describe(&status.conditions),
                status.addresses
            ))
        }
    })
    .await;
    let status = gateway.status.clone().unwrap_or_default();
    eprintln!("Gateway web:\n{}", describe(&status.conditions));
    let addresses: Vec<String> = status.addresses.iter().map(|a| a.value.clone()).collect();
    assert!(
        status
            .addresses
            .iter()
            .all(|a| a.type_.as_deref() == Some("IPAddress")),
        "{:?}",
        status.addresses
    );
    let tag = tailnet_api::naming::entrance_tag(
        tailnet_api::naming::AgentKind::Gateway,
        &tailnet_api::tailnet::default_tag_prefix(),
        ns,
        "web",
    );
    let nodes = env.headscale_api().list_nodes().await.expect("nodes");
    let node = nodes
        .iter()
        .find(|n| n.tags.contains(&tag))
        .unwrap_or_else(|| panic!("a node tagged {tag}"));
    let mut node_ips = node.ip_addresses.clone();
    node_ips.sort();
    let mut sorted = addresses.clone();
    sorted.sort();
    assert_eq!(
        sorted, node_ips,
        "status.addresses are the node's tailnet IPs"
    );
    for (listener, attached) in [("https", 2), ("https-admin", 1), ("tls", 1), ("tcp", 1)] {
        let l = status
            .listeners
            .iter()
            .find(|l| l.name == listener)
            .unwrap_or_else(|| panic!("listener {listener} in {:?}", status.listeners));
        eprintln!(
            "listener {listener}: attachedRoutes {}, kinds {:?}\n{}",
            l.attached_routes,
            l.supported_kinds
                .iter()
                .map(|k| k.kind.as_str())
                .collect::<Vec<_>>(),
            describe(&l.conditions)
        );
        for type_ in ["Accepted", "Programmed", "ResolvedRefs"] {
            assert!(
                is_true(&l.conditions, type_),
                "{listener} {type_}: {}",
                describe(&l.conditions)
            );
        }
        let conflicted = condition(&l.conditions, "Conflicted");
        assert!(
            conflicted.is_none_or(|c| c.status == "False"),
            "{conflicted:?}"
        );
        assert_eq!(l.attached_routes, attached, "listener {listener}");
    }
    eprintln!(
        "status.addresses {addresses:?} = node {} ({tag})",
        node.given_name
    );
    addresses
}

/// Per route: its parent entry of our controller, Accepted; `other` with
/// ResolvedRefs=False/RefNotPermitted, the others ResolvedRefs=True.
async fn routes_status(client: &kube::Client, ns: &str) {
    for (kind, plural, name, resolved) in [
        ("HTTPRoute", "httproutes", "app", ("True", "ResolvedRefs")),
        (
            "HTTPRoute",
            "httproutes",
            "other",
            ("False", "RefNotPermitted"),
        ),
        ("TLSRoute", "tlsroutes", "secure", ("True", "ResolvedRefs")),
        ("TCPRoute", "tcproutes", "db", ("True", "ResolvedRefs")),
    ] {
        let resource = kube::core::ApiResource {
            group: "gateway.networking.k8s.io".into(),
            version: "v1".into(),
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
        let parent = wait_for(
            &format!("{kind} {name} status of our controller"),
            STEP,
            || async {
                let route = api.get(name).await.map_err(|e| e.to_string())?;
                let parents = route.data["status"]["parents"].clone();
                let ours = parents
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["controllerName"] == CONTROLLER)
                    .cloned()
                    .ok_or_else(|| format!("parents {parents}"))?;
                let conditions: Vec<Condition> = serde_json::from_value(ours["conditions"].clone())
                    .map_err(|e| e.to_string())?;
                let resolved_now = condition(&conditions, "ResolvedRefs")
                    .map(|c| (c.status.as_str(), c.reason.as_str()));
                if is_true(&conditions, "Accepted") && resolved_now == Some(resolved) {
                    Ok(ours)
                } else {
                    Err(describe(&conditions))
                }
            },
        )
        .await;
        assert_eq!(parent["parentRef"]["name"], "web", "{parent}");
        eprintln!("{kind} {name}: {}", parent["conditions"]);
    }
}

/// HTTPS through the listener: each host and path reaches its backend (named in the answer);
/// the refused cross-namespace backend is never reached (500).
async fn https_by_host_and_path(laptop: &LocalApi, ip: &str, cert: &str) {
    let cases = [
        ("app", "/hello", "alpha"),
        ("app", "/remote/x", "remote"),
        ("other", "/hello", "beta"),
    ];
    for (host, path, backend) in cases {
        let sni = format!("{host}.{DOMAIN}");
        let answer = answered_200_by(laptop, ip, &sni, path, cert, backend).await;
        eprintln!("https://{sni}{path} -> {backend}: {}", first_line(&answer));
    }
    let sni = format!("other.{DOMAIN}");
    let refused = https_get(laptop, ip, &sni, "/forbidden/x", cert)
        .await
        .expect("an answer for the refused backend");
    assert!(refused.starts_with("HTTP/1.1 500"), "{refused}");
    assert_eq!(answered_by(&refused), None, "{refused}");
    eprintln!("https://{sni}/forbidden/x -> {}", first_line(&refused));
}

/// Two HTTPS listeners on one port, each with its own certificate: `admin.<DOMAIN>` is
/// answered with the admin listener's certificate (a client trusting only it completes the
/// handshake and reaches beta), not the `*.<DOMAIN>` listener's (which covers the name too: a
/// client trusting only that one is refused), and `app.<DOMAIN>` still gets the wildcard's.
async fn each_listener_its_certificate(laptop: &LocalApi, ip: &str, admin: &str, wildcard: &str) {
    let sni = format!("admin.{DOMAIN}");
    let answer = answered_200_by(laptop, ip, &sni, "/", admin, "beta").await;
    eprintln!(
        "https://{sni}/ (admin certificate) -> beta: {}",
        first_line(&answer)
    );
    let refused = https_get(laptop, ip, &sni, "/", wildcard).await;
    assert!(
        refused.is_err(),
        "admin.{DOMAIN} was served with the wildcard listener's certificate: {refused:?}"
    );
    eprintln!("https://{sni}/ trusting only the wildcard certificate: {refused:?}");
    let app = format!("app.{DOMAIN}");
    assert!(
        https_get(laptop, ip, &app, "/", admin).await.is_err(),
        "app.{DOMAIN} was served with the admin listener's certificate"
    );
}

/// cert-manager's Gateway integration: its controller with the gateway-shim and a CA
/// ClusterIssuer; the Gateway, annotated `cert-manager.io/cluster-issuer`, gets a listener
/// `issued.<DOMAIN>` whose certificate Secret `issued-tls` does not exist yet. cert-manager
/// creates the Certificate for the listener's hostname and issues the Secret; the operator
/// copies it to the agent and the listener serves it: a client trusting only the issuer's CA
/// reaches alpha.
async fn cert_manager_issues_a_listener_certificate(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    laptop: &LocalApi,
    ip: &str,
) {
    let started = Instant::now();
    let cert_manager = env
        .start_cert_manager_with_gateway_api()
        .await
        .unwrap_or_else(|e| panic!("cert-manager controller: {e}"));
    let ca = LabCa::generate("gateway e2e ClusterIssuer CA").expect("CA");
    env.apply_ca_cluster_issuer(client, "gateway-ca", &ca)
        .await
        .unwrap_or_else(|e| panic!("ClusterIssuer: {e}\n{}", cert_manager.log_tail(30)));
    let gateways = Api::<Gateway>::namespaced(client.clone(), ns);
    let gateway = gateways.get("web").await.expect("Gateway web");
    let mut listeners = serde_json::to_value(&gateway.spec.listeners).expect("listeners");
    let hostname = format!("issued.{DOMAIN}");
    listeners.as_array_mut().expect("a list").push(
        json!({"name": "https-issued", "port": HTTPS_PORT, "protocol": "HTTPS",
                     "hostname": hostname,
                     "tls": {"mode": "Terminate", "certificateRefs": [{"name": "issued-tls"}]}}),
    );
    gateways
        .patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({
                "metadata": {"annotations": {"cert-manager.io/cluster-issuer": "gateway-ca"}},
                "spec": {"listeners": listeners},
            })),
        )
        .await
        .expect("Gateway annotated, listener added");
    apply(
        &Api::<HTTPRoute>::namespaced(client.clone(), ns),
        "issued",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "issued", "namespace": ns},
            "spec": {"parentRefs": [{"name": "web", "sectionName": "https-issued"}],
                     "hostnames": [hostname],
                     "rules": [{"backendRefs": [{"name": "alpha", "port": 8080}]}]}
        }),
    )
    .await
    .expect("HTTPRoute issued");
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &tno_testenv::cert_manager_resource("Certificate"),
    );
    let certificate = wait_for(
        "cert-manager's Certificate issued-tls for the listener Ready",
        STEP,
        || async {
            let c = certificates
                .get_opt("issued-tls")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no Certificate yet\n{}", cert_manager.log_tail(10)))?;
            if tno_testenv::condition_status(&c.data, "Ready") == Some("True") {
                Ok(c)
            } else {
                Err(c.data["status"].to_string())
            }
        },
    )
    .await;
    let issued_after = started.elapsed();
    assert_eq!(
        certificate.data["spec"]["dnsNames"],
        json!([hostname]),
        "the Certificate covers the listener's hostname"
    );
    let answer = answered_200_by(laptop, ip, &hostname, "/", ca.pem(), "alpha").await;
    eprintln!(
        "cert-manager: Certificate issued-tls ({:?}) Ready {issued_after:.1?} after the \
         controller's start, https://{hostname}/ served {:.1?} after: {}",
        certificate.data["spec"]["dnsNames"],
        started.elapsed() - issued_after,
        first_line(&answer)
    );
    cert_manager.stop();
}

/// Waits (up to [`STEP`]) until `GET https://<sni><path>` over TLS trusting only `ca_pem` is
/// answered 200 by `backend`; returns the response.
async fn answered_200_by(
    laptop: &LocalApi,
    ip: &str,
    sni: &str,
    path: &str,
    ca_pem: &str,
    backend: &str,
) -> String {
    wait_for(
        &format!("https://{sni}{path} answered by {backend}"),
        STEP,
        || async {
            let response = https_get(laptop, ip, sni, path, ca_pem).await?;
            if response.starts_with("HTTP/1.1 200") && answered_by(&response) == Some(backend) {
                Ok(response)
            } else {
                Err(response)
            }
        },
    )
    .await
}

/// The name a test backend writes first in its answer body (`server: <name>`).
fn answered_by(response: &str) -> Option<&str> {
    let body = response.split_once("\r\n\r\n")?.1;
    ["alpha", "beta", "remote", "forbidden", "secure"]
        .into_iter()
        .find(|name| body.starts_with(&format!("server: {name}\n")))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// `GET path` over TLS to `ip:443` with SNI and Host `sni`, trusting only `ca_pem`.
async fn https_get(
    laptop: &LocalApi,
    ip: &str,
    sni: &str,
    path: &str,
    ca_pem: &str,
) -> Result<String, String> {
    let mut tls = tls_connect(laptop, ip, HTTPS_PORT, sni, ca_pem).await?;
    request(&mut tls, sni, path).await
}

async fn request<S>(stream: &mut S, host: &str, path: &str) -> Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let text = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(text.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // Until the connection closes or the Content-Length is complete (a backend may keep the
    // connection open after its answer).
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    while !complete(&response) {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .map_err(|_| "response timed out".to_string())?
            .map_err(|e| format!("read: {e}"))?;
        if read == 0 {
            break;
        }
        response.extend_from_slice(&chunk[..read]);
    }
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// Whether `response` holds a whole answer with a `content-length`.
fn complete(response: &[u8]) -> bool {
    let text = String::from_utf8_lossy(response);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.lines()
        .find_map(|l| {
            l.to_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|length| body.len() >= length)
}

/// TLS passthrough: the handshake on the TLS listener is the backend's (its certificate, the
/// only root the client trusts) and the request is answered by it.
async fn tls_passthrough(laptop: &LocalApi, ip: &str, backend_cert: &str) {
    let sni = format!("secure.{DOMAIN}");
    let answer = wait_for("TLS passthrough to the secure backend", STEP, || async {
        let mut tls = tls_connect(laptop, ip, TLS_PORT, &sni, backend_cert).await?;
        let presented = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| support::tailnet::der_serial(leaf.as_ref()))
            .ok_or("no peer certificate")??;
        let wanted = support::tailnet::pem_serial(backend_cert)?;
        if presented != wanted {
            return Err(format!(
                "certificate {presented}, the backend's is {wanted}"
            ));
        }
        let response = request(&mut tls, &sni, "/hello").await?;
        if answered_by(&response) == Some("secure") {
            Ok(response)
        } else {
            Err(response)
        }
    })
    .await;
    eprintln!(
        "TLS passthrough {sni}:{TLS_PORT}: the backend's certificate; {}",
        first_line(&answer)
    );
}
