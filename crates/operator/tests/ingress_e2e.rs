//! Ingress end to end: a member of group:team-a (the laptop node) opens
//! https://portal.<ns>.lab.example.net through the tailnet and reaches the `frontend` Service;
//! a tcp expose forwards raw bytes; a node outside allowFrom gets no connection; without a
//! certificate covering the names, http is never served (no plaintext fallback). With a default
//! issuer, cert-manager's real controller issues the ingress's Certificate from a CA
//! ClusterIssuer and renews it; the agent serves the renewed certificate to new connections
//! while a connection opened before keeps working.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{DynamicObject, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Instant;
use support::conditions::{ConditionIs, WithConditions, wait_for_condition};
use support::lab_operator::{reconciles, start_operator};
use support::objects::{
    agent_pods, apply, bootstrap_applied_tailnet, ingress_object, join_client_node, pod_uids,
    service_object, tailnet_ipv4, tailnet_with_default_issuer, test_server_deployment, tls_secret,
};
use support::tailnet::{
    KeptConnection, https_get_hello, ok_200, pem_serial, port_refused, self_signed, tcp_echo,
};
use support::wait::{WAIT, wait_for};
use tailnet_api::TailnetIngress;
use tno_testenv::{
    CertManagerController, E2eEnv, LabCa, OperatorArgs, OperatorProcess, cert_manager_resource,
    condition_status, trigger_renewal,
};
use tno_testenv_tailnet::LocalApi;

/// The Certificate (and its Secret) the operator creates for the `issued` ingress.
const ISSUED_CERTIFICATE: &str = "tailnet-ingress-issued-tls";

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
    forced_re_mint_leaves_exactly_one_valid_key(&env, &client, &ns, &tailnet_name, &operator).await;
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
    let certificates: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &cert_manager_resource("Certificate"));
    let issued_certificate = certificates
        .get(ISSUED_CERTIFICATE)
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
    // Now cert-manager comes up (its real controller) with the CA ClusterIssuer the Tailnet
    // names, and issues the Certificate.
    let started = Instant::now();
    let cert_manager = env
        .start_cert_manager()
        .await
        .unwrap_or_else(|e| panic!("cert-manager controller: {e}"));
    let ca = LabCa::generate("ingress e2e ClusterIssuer CA").expect("CA");
    env.apply_ca_cluster_issuer(client, "apps-ca", &ca)
        .await
        .unwrap_or_else(|e| panic!("ClusterIssuer: {e}\n{}", cert_manager.log_tail(30)));
    let issuer_ready = started.elapsed();
    let issued_secret = issued_by_cert_manager(&certificates, secrets, &cert_manager, 1).await;
    eprintln!(
        "cert-manager: controllers started in {:?}, ClusterIssuer Ready after {issuer_ready:?}, \
         Certificate issued after {:?} (serial {})",
        cert_manager.started_in(),
        started.elapsed(),
        issued_secret.1
    );
    let answer = wait_for("https once the certificate is issued", WAIT, || async {
        https_get_hello(laptop, &issued, &issued_name, ca.pem(), &[FORGED_LOGIN])
            .await
            .and_then(ok_200)
    })
    .await;
    assert!(answer.contains("frontend"), "{answer}");
    let after = pod_uids(&agent_pods(&pods, agent).await.expect("agent pods"));
    assert_eq!(before, after, "served without restarting the agent pod");
    let renewal = Renewal {
        certificates: &certificates,
        secrets,
        cert_manager: &cert_manager,
        ip: &issued,
        name: &issued_name,
        ca_pem: ca.pem(),
        issued_serial: &issued_secret.1,
    };
    renewal_keeps_open_connections(p, &renewal).await;
    let after = pod_uids(&agent_pods(&pods, agent).await.expect("agent pods"));
    assert_eq!(before, after, "renewed without restarting the agent pod");
    cert_manager.stop();
}

/// The issued Certificate's Secret and serial (hex) once cert-manager reports revision
/// `revision` Ready=True.
async fn issued_by_cert_manager(
    certificates: &Api<DynamicObject>,
    secrets: &Api<Secret>,
    cert_manager: &CertManagerController,
    revision: u64,
) -> (Secret, String) {
    wait_for(
        &format!("cert-manager to issue revision {revision}"),
        WAIT,
        || async {
            let certificate = certificates
                .get(ISSUED_CERTIFICATE)
                .await
                .map_err(|e| e.to_string())?;
            let ready = condition_status(&certificate.data, "Ready") == Some("True");
            if !ready || certificate.data["status"]["revision"].as_u64() != Some(revision) {
                return Err(format!(
                    "{}\n--- cert-manager ---\n{}",
                    certificate.data["status"],
                    cert_manager.log_tail(15)
                ));
            }
            let secret = secrets
                .get(ISSUED_CERTIFICATE)
                .await
                .map_err(|e| e.to_string())?;
            let pem = secret
                .data
                .as_ref()
                .and_then(|data| data.get("tls.crt"))
                .map(|crt| String::from_utf8_lossy(&crt.0).into_owned())
                .ok_or("Secret without tls.crt")?;
            let serial = pem_serial(&pem)?;
            Ok((secret, serial))
        },
    )
    .await
}

/// The issued ingress and what renewing its certificate involves.
struct Renewal<'a> {
    certificates: &'a Api<DynamicObject>,
    secrets: &'a Api<Secret>,
    cert_manager: &'a CertManagerController,
    ip: &'a str,
    name: &'a str,
    ca_pem: &'a str,
    issued_serial: &'a str,
}

/// cert-manager renews the certificate (what `cmctl renew` asks for: Issuing=True); the agent
/// serves the new one to new connections while a connection opened before keeps working.
async fn renewal_keeps_open_connections(p: &Portal<'_>, r: &Renewal<'_>) {
    let mut kept = wait_for("a kept-open https connection", WAIT, || async {
        let mut kept = KeptConnection::open(p.laptop, r.ip, r.name, r.ca_pem).await?;
        kept.get_hello().await.and_then(ok_200)?;
        Ok(kept)
    })
    .await;
    assert_eq!(
        kept.peer_serial().as_deref(),
        Ok(r.issued_serial),
        "the first connection sees the issued certificate"
    );
    let started = Instant::now();
    trigger_renewal(p.client, p.ns, ISSUED_CERTIFICATE)
        .await
        .expect("Issuing=True on the Certificate");
    let (_, renewed_serial) =
        issued_by_cert_manager(r.certificates, r.secrets, r.cert_manager, 2).await;
    let renewed_in = started.elapsed();
    assert_ne!(renewed_serial, r.issued_serial, "a new certificate");
    let fresh = wait_for(
        "a new connection to see the renewed certificate",
        WAIT,
        || async {
            let fresh = KeptConnection::open(p.laptop, r.ip, r.name, r.ca_pem).await?;
            match fresh.peer_serial()? {
                serial if serial == renewed_serial => Ok(fresh),
                serial => Err(format!("still serial {serial}")),
            }
        },
    )
    .await;
    let served_in = started.elapsed();
    drop(fresh);
    let again = kept.get_hello().await.and_then(ok_200);
    assert!(
        again
            .as_ref()
            .is_ok_and(|answer| answer.contains("frontend")),
        "the connection opened before the renewal keeps working: {again:?}"
    );
    assert_eq!(
        kept.peer_serial().as_deref(),
        Ok(r.issued_serial),
        "the kept connection is the one from before the renewal"
    );
    eprintln!(
        "renewal: Secret rewritten by cert-manager after {renewed_in:?}, new connections get \
         serial {renewed_serial} after {served_in:?}; the connection opened before still answers"
    );
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
    operator: &OperatorProcess,
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
    let keyed = |port: u16| {
        ingress_object(
            &quota_ns,
            "keyed",
            tailnet_name,
            None,
            json!([{"name": "db", "dnsLabel": "keyed", "mode": "tcp", "port": port, "backend": {"service": "db", "port": 5432}}]),
        )
    };
    apply(&ingresses, "keyed", keyed(6000))
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
    // No mint from a stale read: a later reconcile, demonstrably after this point, leaves
    // Headscale's keys of the tag as they are.
    let later = keys_unchanged_across_a_later_reconcile(
        operator,
        &headscale,
        &ingresses,
        keyed(6001),
        &tag,
    )
    .await;
    assert_eq!(valid_keys().await.expect("keys"), vec![second]);
    assert_eq!(key_in_secret().await.expect("key"), second);
    eprintln!("forced re-mint: key {first} → {second}, valid keys of {tag}: [{second}], {later}");
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

/// The witness that the operator looked again after a key settled: `changed` (the ingress with
/// a spec change) bumps the generation, the status reports that generation (a reconcile that
/// read the world after this point) and the ingress reconcile counter moved on. Then every key
/// of `tag` in Headscale (used or not) is exactly as before. Returns what was observed.
async fn keys_unchanged_across_a_later_reconcile(
    operator: &OperatorProcess,
    headscale: &tailnet_headscale::Client,
    ingresses: &Api<TailnetIngress>,
    changed: serde_json::Value,
    tag: &str,
) -> String {
    let all_keys = || async {
        let mut keys: Vec<(u64, bool)> = headscale
            .list_pre_auth_keys()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|k| k.acl_tags.iter().any(|t| t == tag))
            .map(|k| (k.id, k.used))
            .collect();
        keys.sort_unstable();
        Ok::<_, String>(keys)
    };
    let name = changed["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let keys_settled = all_keys().await.expect("keys of the tag");
    let reconciles_settled = reconciles(operator, "ingress").await;
    let generation = apply(ingresses, &name, changed)
        .await
        .expect("the changed ingress")
        .metadata
        .generation
        .expect("generation");
    wait_for("a reconcile of the new generation", WAIT, || async {
        let observed = ingresses
            .get(&name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .and_then(|s| s.observed_generation);
        let count = reconciles(operator, "ingress").await;
        if observed >= Some(generation) && count > reconciles_settled {
            Ok(())
        } else {
            Err(format!(
                "observedGeneration {observed:?} of {generation}, ingress reconciles {count} (were {reconciles_settled})"
            ))
        }
    })
    .await;
    assert_eq!(
        all_keys().await.expect("keys of the tag"),
        keys_settled,
        "a key was minted (or lost) although the Secret held a valid one"
    );
    format!(
        "keys {keys_settled:?} unchanged across {} later ingress reconciles (generation {generation} observed)",
        reconciles(operator, "ingress").await - reconciles_settled
    )
}
