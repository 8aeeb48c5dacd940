//! Ingress end to end: a member of group:team-a (the laptop node) opens
//! https://portal.<ns>.lab.example.net through the tailnet and reaches the `frontend` Service;
//! a tcp expose forwards raw bytes; a node outside allowFrom gets no connection; without a
//! certificate covering the names, http is never served (no plaintext fallback).

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::start_operator;
use support::objects::{
    agent_pods, apply, bootstrap_applied_tailnet, ingress_object, join_client_node, pod_uids,
    service_object, tailnet_ipv4, tailnet_with_default_issuer, test_server_deployment, tls_secret,
};
use support::tailnet::{https_get_hello, ok_200, port_refused, self_signed, tcp_echo};
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetIngress;
use tno_testenv::{E2eEnv, OperatorArgs, OperatorProcess};
use tno_testenv_tailnet::LocalApi;

/// A client-supplied identity header, which the ingress must drop.
const FORGED_LOGIN: (&str, &str) = ("Tailscale-User-Login", "forged@evil");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_serves_https_and_tcp_only_to_allowed_sources() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("in").await.expect("namespace");
    let client = ops.client().clone();
    let ns = ops.name().to_string();
    let tailnet_name = bootstrap_applied_tailnet(&env, &ops).await;
    let mut operator = start_operator(&env, &OperatorArgs::new(&ns).to_args(), None)
        .await
        .expect("operator");
    deploy_backends(&client, &ns).await;
    // The ingress: https portal (named TLS Secret, not created yet) and a tcp expose.
    let portal = format!("portal.{ns}.lab.example.net");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    apply(
        &ingresses,
        "portal",
        ingress_object(
            &ns,
            "portal",
            &tailnet_name,
            Some("portal-tls"),
            json!([
                {"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443, "backend": {"service": "frontend", "port": "main"}},
                {"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432, "backend": {"service": "db", "port": 5432}}
            ]),
        ),
    )
    .await
    .expect("ingress");
    let laptop = env.tailnet().laptop.node.local_api();
    let p = Portal {
        env: &env,
        client: &client,
        ns: &ns,
        tailnet_name: &tailnet_name,
        portal: &portal,
        ingresses: &ingresses,
        laptop: &laptop,
        operator: &operator,
    };
    let (ip, cert_pem, key_pem) = served_only_once_the_secret_exists(&p).await;
    let (secrets, ready) = with_the_certificate(&p, &ip, &cert_pem, &key_pem).await;
    outside_allow_from_nothing(&p, &ip, &cert_pem, &ready).await;

    // Tenant safety (issue 14, the lab's pattern): `<ns>/dev-api`, then `<ns>-dev/api`. Their
    // namespace and name join to the same string; both get an identity of their own and work,
    // and deleting the later one leaves the earlier one's node.
    lab_pair_gets_two_identities(&env, &client, &ns, &tailnet_name, &laptop).await;
    forced_re_mint_leaves_exactly_one_valid_key(&env, &client, &ns, &tailnet_name).await;
    default_issuer_certificate(&p, &secrets).await;
    operator.terminate().await.expect("operator stops cleanly");
}

/// What the phases of the scenario work with.
struct Portal<'a> {
    env: &'a E2eEnv,
    client: &'a kube::Client,
    ns: &'a str,
    tailnet_name: &'a str,
    /// The https expose's name.
    portal: &'a str,
    ingresses: &'a Api<TailnetIngress>,
    /// alice's laptop (group:team-a).
    laptop: &'a LocalApi,
    operator: &'a OperatorProcess,
}

async fn deploy_backends(client: &kube::Client, ns: &str) {
    // Backends: an HTTP echo (frontend) and a TCP echo (db), as Deployments with Services.
    for (name, args, port) in [
        (
            "frontend",
            json!([
                "http-echo",
                "--listen",
                "0.0.0.0:8080",
                "--name",
                "frontend"
            ]),
            8080,
        ),
        ("db", json!(["tcp-echo", "--listen", "0.0.0.0:5432"]), 5432),
    ] {
        apply(
            &Api::<Deployment>::namespaced(client.clone(), ns),
            name,
            test_server_deployment(ns, name, args),
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
}

/// Returns the ingress's tailnet IPv4 and a certificate (PEM) and key for the portal.
async fn served_only_once_the_secret_exists(p: &Portal<'_>) -> (String, String, String) {
    let &Portal {
        portal,
        ingresses,
        laptop,
        operator,
        ..
    } = p;
    // Without the Secret: SecretMissing, tcp works, https gets no plaintext and no TLS.
    let secret_missing = ConditionIs::new("CertificateReady", "False").reason("SecretMissing");
    let ingress = wait_for(
        "the node online and CertificateReady=False/SecretMissing",
        WAIT,
        || async {
            let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
            if secret_missing.holds_for(&i)
                && ConditionIs::new("NodeOnline", "True").holds_for(&i)
                && ConditionIs::new("PolicyEffective", "True").holds_for(&i)
            {
                Ok(i)
            } else {
                Err(format!(
                    "{}\n--- operator ---\n{}",
                    i.describe(),
                    operator.log_tail(10)
                ))
            }
        },
    )
    .await;
    assert_eq!(
        ingress.condition("Ready").map(|c| c.reason.as_str()),
        Some("SecretMissing")
    );
    let ip = tailnet_ipv4(&ingress.status.clone().unwrap_or_default().tailnet_ips)
        .expect("tailnet IPv4");
    wait_for("the tcp expose to echo for the laptop", WAIT, || async {
        tcp_echo(laptop, &ip, 5432).await
    })
    .await;
    let (cert_pem, key_pem) = self_signed(&[portal.to_string()]);
    // Port 443 is closed, not merely silent: the laptop's dial reaches the node (its tcp
    // expose just echoed) and is refused, so neither TLS nor a plaintext answer can come back.
    let refused = port_refused(laptop, &ip, 443, portal, WAIT).await;
    assert!(
        refused.is_ok(),
        "http must not be served without a certificate: {refused:?}"
    );
    eprintln!(
        "without a certificate, 443: {}",
        refused.unwrap_or_default()
    );
    // The same probe tells a listener apart: the tcp expose accepts (and echoes the request).
    let listening = port_refused(laptop, &ip, 5432, portal, WAIT).await;
    assert!(
        listening
            .as_ref()
            .is_err_and(|e| e.contains("accepted a connection")),
        "the probe must see the tcp expose's listener: {listening:?}"
    );
    (ip, cert_pem, key_pem)
}

async fn with_the_certificate(
    p: &Portal<'_>,
    ip: &str,
    cert_pem: &str,
    key_pem: &str,
) -> (Api<Secret>, TailnetIngress) {
    let &Portal {
        client,
        ns,
        portal,
        ingresses,
        laptop,
        ..
    } = p;
    // With a certificate covering the name: served, identity added, forged header dropped.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("portal-tls", cert_pem, key_pem),
        )
        .await
        .expect("TLS Secret");
    let response = wait_for("https through the ingress", WAIT, || async {
        https_get_hello(laptop, ip, portal, cert_pem, &[FORGED_LOGIN])
            .await
            .and_then(ok_200)
    })
    .await;
    let lower = response.to_lowercase();
    assert!(
        response.contains("frontend"),
        "reached the frontend Service: {response}"
    );
    assert!(
        lower.contains("tailscale-user-login: alice"),
        "the peer identity is passed on: {response}"
    );
    assert!(
        !lower.contains("forged@evil"),
        "a client-supplied identity header must be dropped: {response}"
    );
    assert!(lower.contains("x-forwarded-proto: https"), "{response}");
    let ready =
        wait_for_condition(ingresses, "portal", ConditionIs::new("Ready", "True"), None).await;
    assert_eq!(
        ready
            .condition("BackendsReachable")
            .map(|c| c.reason.as_str()),
        Some("Reachable"),
        "{}",
        ready.describe()
    );
    let status = ready.status.clone().unwrap_or_default();
    assert!(
        status.urls.contains(&format!("https://{portal}/")),
        "{:?}",
        status.urls
    );
    assert!(
        status
            .urls
            .contains(&format!("tcp://db.{ns}.lab.example.net:5432")),
        "{:?}",
        status.urls
    );
    (secrets, ready)
}

async fn outside_allow_from_nothing(
    p: &Portal<'_>,
    ip: &str,
    cert_pem: &str,
    ready: &TailnetIngress,
) {
    let &Portal {
        env,
        ns,
        portal,
        laptop,
        ..
    } = p;
    // A node outside allowFrom (tag:client) gets no connection at all.
    let outsider = join_client_node(env, "outsider", ns).await;
    let denied = tcp_echo(&outsider.node.local_api(), ip, 5432).await;
    assert!(
        denied.is_err(),
        "a node outside allowFrom must not get a TCP connection: {denied:?}"
    );
    let denied_https = https_get_hello(
        &outsider.node.local_api(),
        ip,
        portal,
        cert_pem,
        &[FORGED_LOGIN],
    )
    .await;
    assert!(denied_https.is_err(), "{denied_https:?}");
    // ... while the laptop still does (the policy did not just break everything).
    tcp_echo(laptop, ip, 5432)
        .await
        .expect("laptop still allowed");
    assert_eq!(ready.name_any(), "portal");
}

async fn default_issuer_certificate(p: &Portal<'_>, secrets: &Api<Secret>) {
    let &Portal {
        env,
        client,
        ns,
        tailnet_name,
        ingresses,
        laptop,
        ..
    } = p;
    // Without tls.secretName: a cert-manager Certificate for every http name, and http stays
    // unserved (Issuing) until it is issued.
    apply(
        &Api::<tailnet_api::Tailnet>::all(client.clone()),
        tailnet_name,
        tailnet_with_default_issuer(env, tailnet_name),
    )
    .await
    .expect("Tailnet with a default issuer");
    apply(
        ingresses,
        "issued",
        ingress_object(
            ns,
            "issued",
            tailnet_name,
            None,
            json!([{"name": "web", "dnsLabel": "issued", "mode": "http", "port": 443, "backend": {"service": "frontend", "port": 8080}}]),
        ),
    )
    .await
    .expect("ingress with issuer");
    let issuing = wait_for_condition(
        ingresses,
        "issued",
        ConditionIs::new("CertificateReady", "False").reason("Issuing"),
        None,
    )
    .await;
    assert_eq!(
        issuing.condition("Ready").map(|c| c.reason.as_str()),
        Some("Issuing")
    );
    let certificates: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "cert-manager.io",
            "v1",
            "Certificate",
        )),
    );
    let issued_certificate = certificates
        .get("tailnet-ingress-issued-tls")
        .await
        .expect("cert-manager Certificate");
    assert_eq!(
        issued_certificate.data["spec"]["dnsNames"],
        json!([format!("issued.{ns}.lab.example.net")])
    );
    assert_eq!(
        issued_certificate.data["spec"]["issuerRef"]["kind"],
        "ClusterIssuer"
    );
    assert_eq!(
        issued_certificate.data["spec"]["secretName"],
        "tailnet-ingress-issued-tls"
    );
    // While Issuing, port 443 gives no HTTP answer of any kind.
    let issued_name = format!("issued.{ns}.lab.example.net");
    let issued = wait_for("the issued ingress's node online", WAIT, || async {
        let i = ingresses.get("issued").await.map_err(|e| e.to_string())?;
        match tailnet_ipv4(&i.status.clone().unwrap_or_default().tailnet_ips) {
            Some(ip) if ConditionIs::new("NodeOnline", "True").holds_for(&i) => Ok(ip),
            _ => Err(i.describe()),
        }
    })
    .await;
    let (issued_cert, issued_key) = self_signed(std::slice::from_ref(&issued_name));
    // A closed port (the dial reaches the node and is refused), told apart from a dropped dial
    // (grant not live yet: polled through) and from any listener answering, plaintext or not.
    let unserved = port_refused(laptop, &issued, 443, &issued_name, WAIT).await;
    assert!(
        unserved.is_ok(),
        "no listener on 443 while Issuing: {unserved:?}"
    );
    eprintln!("while Issuing, 443: {}", unserved.unwrap_or_default());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let agent = "tailnet-ingress-issued";
    let before = pod_uids(&agent_pods(&pods, agent).await.expect("agent pods"));
    assert!(!before.is_empty(), "the issued ingress has an agent pod");
    // cert-manager (not run here: its controller is not buildable from the module proxy)
    // would now write the Secret; the test writes it the same way.
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("tailnet-ingress-issued-tls", &issued_cert, &issued_key),
        )
        .await
        .expect("issued TLS Secret");
    let answer = wait_for("https once the certificate is issued", WAIT, || async {
        https_get_hello(laptop, &issued, &issued_name, &issued_cert, &[FORGED_LOGIN])
            .await
            .and_then(ok_200)
    })
    .await;
    assert!(answer.contains("frontend"), "{answer}");
    let after = pod_uids(&agent_pods(&pods, agent).await.expect("agent pods"));
    assert_eq!(before, after, "served without restarting the agent pod");
}

/// `<ns>/dev-api` (first) and `<ns>-dev/api` (second): distinct tags and nodes, both forward
/// tcp for the laptop; deleting the second deletes only its own node.
async fn lab_pair_gets_two_identities(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    tailnet_name: &str,
    laptop: &tno_testenv_tailnet::LocalApi,
) {
    let other_ns = format!("{ns}-dev");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(other_ns.clone());
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace <ns>-dev");
    apply(
        &Api::<Deployment>::namespaced(client.clone(), &other_ns),
        "db",
        test_server_deployment(
            &other_ns,
            "db",
            json!(["tcp-echo", "--listen", "0.0.0.0:5432"]),
        ),
    )
    .await
    .expect("backend Deployment in <ns>-dev");
    apply(
        &Api::<Service>::namespaced(client.clone(), &other_ns),
        "db",
        service_object(&other_ns, "db", 5432),
    )
    .await
    .expect("backend Service in <ns>-dev");
    let expose = |label: &str| json!([{"name": "db", "dnsLabel": label, "mode": "tcp", "port": 6000, "backend": {"service": "db", "port": 5432}}]);
    let first: Api<TailnetIngress> = Api::namespaced(client.clone(), ns);
    let second: Api<TailnetIngress> = Api::namespaced(client.clone(), &other_ns);
    apply(
        &first,
        "dev-api",
        ingress_object(ns, "dev-api", tailnet_name, None, expose("devapi")),
    )
    .await
    .expect("ingress <ns>/dev-api");
    let online = |api: Api<TailnetIngress>, name: &'static str| async move {
        wait_for(&format!("{name} online with its grant"), WAIT, || async {
            let i = api.get(name).await.map_err(|e| e.to_string())?;
            let status = i.status.clone().unwrap_or_default();
            match (
                tailnet_ipv4(&status.tailnet_ips),
                status.tag.clone(),
                status.node_id.clone(),
            ) {
                (Some(ip), Some(tag), Some(node))
                    if ConditionIs::new("NodeOnline", "True").holds_for(&i)
                        && ConditionIs::new("PolicyEffective", "True").holds_for(&i) =>
                {
                    Ok((ip, tag, node))
                }
                _ => Err(i.describe()),
            }
        })
        .await
    };
    let (first_ip, first_tag, first_node) = online(first.clone(), "dev-api").await;
    assert_eq!(
        first_tag,
        format!("tag:tno-ingress-{ns}-dev-api"),
        "the first keeps today's tag"
    );
    apply(
        &second,
        "api",
        ingress_object(&other_ns, "api", tailnet_name, None, expose("api")),
    )
    .await
    .expect("ingress <ns>-dev/api");
    let (second_ip, second_tag, second_node) = online(second.clone(), "api").await;
    eprintln!("lab pair: {first_tag} (node {first_node}) and {second_tag} (node {second_node})");
    assert_ne!(second_tag, first_tag, "distinct tags");
    assert!(
        second_tag.starts_with(&format!("{first_tag}-")),
        "{second_tag}"
    );
    assert_ne!(second_node, first_node, "distinct nodes");
    assert_ne!(second_ip, first_ip);
    for ip in [&first_ip, &second_ip] {
        wait_for("the tcp expose to echo for the laptop", WAIT, || async {
            tcp_echo(laptop, ip, 6000).await
        })
        .await;
    }
    second
        .delete("api", &Default::default())
        .await
        .expect("delete <ns>-dev/api");
    wait_for("<ns>-dev/api to be gone", WAIT, || async {
        match second.get_opt("api").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there (finalizer)".to_string()),
        }
    })
    .await;
    let nodes = env.headscale_api().list_nodes().await.expect("nodes");
    let ids: Vec<String> = nodes.iter().map(|n| n.id.to_string()).collect();
    assert!(
        ids.contains(&first_node),
        "the first one's node survives: {ids:?}"
    );
    assert!(
        !ids.contains(&second_node),
        "the second one's node is gone: {ids:?}"
    );
    tcp_echo(laptop, &first_ip, 6000)
        .await
        .expect("the first still forwards");
    hand_tagged_device_is_not_the_ingress(
        env, ns, laptop, &first, first_tag, first_node, &first_ip,
    )
    .await;
    let _ = namespaces.delete(&other_ns, &Default::default()).await;
}

/// A device tagged by hand with the first one's tag (another hostname): named on the
/// ingress, not taken for its node, and left alone when the ingress is deleted (before:
/// the device, online and newer, became the ingress's node, and the delete removed it).
async fn hand_tagged_device_is_not_the_ingress(
    env: &E2eEnv,
    ns: &str,
    laptop: &tno_testenv_tailnet::LocalApi,
    first: &Api<TailnetIngress>,
    first_tag: String,
    first_node: String,
    first_ip: &str,
) {
    let hostname = format!("hand-tagged-{}", &ns[ns.len() - 5..]);
    let device = env
        .tailnet()
        .join_node(
            &hostname,
            tno_testenv_tailnet::JoinOptions {
                tags: vec![first_tag.clone()],
                ..Default::default()
            },
        )
        .await
        .expect("a device carrying the ingress's tag");
    let device_id = env
        .tailnet()
        .node_id(&hostname)
        .await
        .expect("nodes")
        .expect("the device is registered")
        .to_string();
    let conflicted = wait_for_condition(
        first,
        "dev-api",
        ConditionIs::new("AgentReady", "False").reason("TagConflict"),
        None,
    )
    .await;
    let message = conflicted
        .condition("AgentReady")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("id {device_id}")) && message.contains(&hostname),
        "{message}"
    );
    assert_eq!(
        conflicted.status.clone().unwrap_or_default().node_id,
        Some(first_node.clone()),
        "the ingress keeps its own node"
    );
    tcp_echo(laptop, first_ip, 6000)
        .await
        .expect("the first still forwards beside the device");
    first
        .delete("dev-api", &Default::default())
        .await
        .expect("delete <ns>/dev-api");
    wait_for("<ns>/dev-api to be gone", WAIT, || async {
        match first.get_opt("dev-api").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there (finalizer)".to_string()),
        }
    })
    .await;
    let ids: Vec<String> = env
        .headscale_api()
        .list_nodes()
        .await
        .expect("nodes")
        .iter()
        .map(|n| n.id.to_string())
        .collect();
    assert!(
        ids.contains(&device_id),
        "the hand-tagged device survives the ingress: {ids:?}"
    );
    assert!(
        !ids.contains(&first_node),
        "the ingress's node is gone: {ids:?}"
    );
    drop(device);
}

/// An ingress whose agent can never log in (its namespace allows no pods): the operator mints
/// a key into the auth Secret; the Secret is deleted, the operator mints again. Afterwards
/// exactly one valid key of the tag exists, the one in the Secret, and it stays one.
async fn forced_re_mint_leaves_exactly_one_valid_key(
    env: &E2eEnv,
    client: &kube::Client,
    ns: &str,
    tailnet_name: &str,
) {
    let quota_ns = format!("{ns}-q");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(quota_ns.clone());
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace <ns>-q");
    let quota: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "no-pods", "namespace": quota_ns},
        "spec": {"hard": {"pods": "0"}}
    }))
    .expect("quota");
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), &quota_ns)
        .create(&PostParams::default(), &quota)
        .await
        .expect("ResourceQuota pods=0");
    apply(
        &Api::<Service>::namespaced(client.clone(), &quota_ns),
        "db",
        service_object(&quota_ns, "db", 5432),
    )
    .await
    .expect("backend Service in <ns>-q");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &quota_ns);
    apply(
        &ingresses,
        "keyed",
        ingress_object(
            &quota_ns,
            "keyed",
            tailnet_name,
            None,
            json!([{"name": "db", "dnsLabel": "keyed", "mode": "tcp", "port": 6000, "backend": {"service": "db", "port": 5432}}]),
        ),
    )
    .await
    .expect("ingress <ns>-q/keyed");
    let headscale = tailnet_headscale::Client::new(
        &env.tailnet().headscale.root_url(),
        tailnet_headscale::Secret::new(env.tailnet().headscale.api_key()),
        tailnet_headscale::ClientOptions {
            server_ca_pem: Some(env.tailnet().headscale.ca_pem().to_owned()),
            ..Default::default()
        },
    )
    .expect("headscale client");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &quota_ns);
    let key_in_secret = || async {
        let s = secrets
            .get_opt("tailnet-ingress-keyed-auth")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no auth Secret")?;
        s.annotations()
            .get("tailnet-operator.dev/pre-auth-key-id")
            .and_then(|id| id.parse::<u64>().ok())
            .ok_or("no key id".to_string())
    };
    let tag = wait_for("the ingress's tag", WAIT, || async {
        let i = ingresses.get("keyed").await.map_err(|e| e.to_string())?;
        i.status
            .and_then(|s| s.tag)
            .ok_or("no tag in the status".to_string())
    })
    .await;
    let valid_keys = || async {
        let now = jiff::Timestamp::now();
        Ok::<Vec<u64>, String>(
            headscale
                .list_pre_auth_keys()
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|k| k.acl_tags.contains(&tag))
                .filter(|k| !k.used && k.expiration.is_some_and(|e| e > now))
                .map(|k| k.id)
                .collect(),
        )
    };
    let first = wait_for("a key in the auth Secret", WAIT, key_in_secret).await;
    secrets
        .delete("tailnet-ingress-keyed-auth", &Default::default())
        .await
        .expect("delete the auth Secret");
    let second = wait_for("a new key in the auth Secret", WAIT, || async {
        match key_in_secret().await {
            Ok(id) if id != first => Ok(id),
            Ok(id) => Err(format!("still key {id}")),
            Err(e) => Err(e),
        }
    })
    .await;
    wait_for("exactly one valid key of the tag", WAIT, || async {
        let valid = valid_keys().await?;
        if valid == vec![second] {
            Ok(())
        } else {
            Err(format!("valid keys {valid:?}, the Secret holds {second}"))
        }
    })
    .await;
    // A few polls later: still the one (no mint from a stale read).
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(valid_keys().await.expect("keys"), vec![second]);
    assert_eq!(key_in_secret().await.expect("key"), second);
    eprintln!("forced re-mint: key {first} → {second}, valid keys of {tag}: [{second}]");
    ingresses
        .delete("keyed", &Default::default())
        .await
        .expect("delete keyed");
    wait_for("<ns>-q/keyed to be gone", WAIT, || async {
        match ingresses
            .get_opt("keyed")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there (finalizer)".to_string()),
        }
    })
    .await;
    assert!(
        valid_keys().await.expect("keys").is_empty(),
        "deletion expires the key"
    );
    let _ = namespaces.delete(&quota_ns, &Default::default()).await;
}
