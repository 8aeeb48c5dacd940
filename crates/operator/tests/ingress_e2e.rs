//! Ingress end to end: a member of group:team-a (the laptop node) opens
//! https://portal.<ns>.lab.example.net through the tailnet and reaches the `frontend` Service;
//! a tcp expose forwards raw bytes; a node outside allowFrom gets no connection; without a
//! certificate covering the names, http is never served (no plaintext fallback).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tailnet_api::TailnetIngress;
use tno_testenv::{E2eEnv, OperatorArgs};
use tno_testenv_tailnet::Dialed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

fn describe(i: &TailnetIngress) -> String {
    let status = i.status.clone().unwrap_or_default();
    let mut lines: Vec<String> = status
        .conditions
        .iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    lines.push(format!(
        "hostnames {:?} ips {:?}",
        status.hostnames, status.tailnet_ips
    ));
    lines.join("\n")
}

fn condition(i: &TailnetIngress, type_: &str) -> Option<(String, String)> {
    i.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// A self-signed certificate for `names` (the client pins it as its only root).
fn certificate(names: &[String]) -> (String, String) {
    let params = rcgen::CertificateParams::new(names.to_vec()).expect("params");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    (cert.pem(), key.serialize_pem())
}

/// HTTPS GET through a LocalAPI dial from `node` to `ip:443`, verifying the server's
/// certificate against `ca_pem` and `sni`. Returns the whole response text.
async fn https_get(
    node: &tno_testenv_tailnet::LocalApi,
    ip: &str,
    sni: &str,
    ca_pem: &str,
) -> Result<String, String> {
    let stream = match tokio::time::timeout(Duration::from_secs(10), node.dial(ip, 443)).await {
        Ok(Ok(Dialed::Tailnet(stream))) => stream,
        Ok(Ok(Dialed::DialSelf { addr })) => return Err(format!("dial-self {addr}")),
        Ok(Err(e)) => return Err(format!("dial: {e}")),
        Err(_) => return Err("dial timed out".to_string()),
    };
    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject;
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()).flatten() {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name =
        rustls_pki_types::ServerName::try_from(sni.to_string()).map_err(|e| e.to_string())?;
    let mut tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, stream))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS: {e}"))?;
    let request = format!(
        "GET /hello HTTP/1.1\r\nHost: {sni}\r\nTailscale-User-Login: forged@evil\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut response))
        .await
        .map_err(|_| "response timed out".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// Raw TCP through the tailnet: send a line, expect it back.
async fn tcp_echo(node: &tno_testenv_tailnet::LocalApi, ip: &str, port: u16) -> Result<(), String> {
    let mut stream = match tokio::time::timeout(Duration::from_secs(8), node.dial(ip, port)).await {
        Ok(Ok(Dialed::Tailnet(stream))) => stream,
        Ok(Ok(Dialed::DialSelf { addr })) => return Err(format!("dial-self {addr}")),
        Ok(Err(e)) => return Err(format!("dial: {e}")),
        Err(_) => return Err("dial timed out".to_string()),
    };
    stream
        .write_all(b"ping through the ingress\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 25];
    tokio::time::timeout(Duration::from_secs(8), stream.read_exact(&mut buf))
        .await
        .map_err(|_| "echo timed out".to_string())?
        .map_err(|e| e.to_string())?;
    if buf == b"ping through the ingress\n" {
        Ok(())
    } else {
        Err(format!("got {:?}", String::from_utf8_lossy(&buf)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_serves_https_and_tcp_only_to_allowed_sources() {
    let env = E2eEnv::shared()
        .await
        .unwrap_or_else(|e| panic!("e2e environment: {e}"));
    let ops = env.namespace("in").await.expect("namespace");
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
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), &ns);
        deployments
            .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}},
                                      "spec": {"containers": [{"name": "server", "image": tno_testenv_kube::env::TEST_SERVERS_IMAGE, "args": args}]}}}
            })))
            .await
            .expect("backend Deployment");
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns)
            .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {"app": name}, "ports": [{"name": "main", "port": port, "targetPort": port}]}
            })))
            .await
            .expect("backend Service");
    }

    // The ingress: https portal (named TLS Secret, not created yet) and a tcp expose.
    let portal = format!("portal.{ns}.lab.example.net");
    let ingresses: Api<TailnetIngress> = Api::namespaced(client.clone(), &ns);
    ingresses
        .patch("portal", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": "portal", "namespace": ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "allowFrom": ["group:team-a"],
                     "tls": {"secretName": "portal-tls"},
                     "exposes": [
                        {"name": "web", "dnsLabel": "portal", "mode": "http", "port": 443, "backend": {"service": "frontend", "port": "main"}},
                        {"name": "db", "dnsLabel": "db", "mode": "tcp", "port": 5432, "backend": {"service": "db", "port": 5432}}
                     ]}
        })))
        .await
        .expect("ingress");

    // Without the Secret: SecretMissing, tcp works, https gets no plaintext and no TLS.
    let ingress = eventually(
        "the node online and CertificateReady=False/SecretMissing",
        || async {
            let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
            let online = condition(&i, "NodeOnline").is_some_and(|c| c.0 == "True");
            let effective = condition(&i, "PolicyEffective").is_some_and(|c| c.0 == "True");
            match condition(&i, "CertificateReady") {
                Some((s, r)) if s == "False" && r == "SecretMissing" && online && effective => {
                    Ok(i)
                }
                _ => Err(format!(
                    "{}\n--- operator ---\n{}",
                    describe(&i),
                    operator.log_tail(10)
                )),
            }
        },
    )
    .await;
    assert_eq!(
        condition(&ingress, "Ready").map(|c| c.1).as_deref(),
        Some("SecretMissing")
    );
    let ip = ingress
        .status
        .clone()
        .unwrap_or_default()
        .tailnet_ips
        .into_iter()
        .find(|a| a.contains('.'))
        .expect("tailnet IPv4");
    let laptop = env.tailnet().laptop.node.local_api();
    eventually("the tcp expose to echo for the laptop", || async {
        tcp_echo(&laptop, &ip, 5432).await
    })
    .await;
    let (cert_pem, key_pem) = certificate(std::slice::from_ref(&portal));
    let refused = https_get(&laptop, &ip, &portal, &cert_pem).await;
    assert!(
        refused.is_err(),
        "http must not be served without a certificate: {refused:?}"
    );

    // With a certificate covering the name: served, identity added, forged header dropped.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("portal-tls".into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(cert_pem.clone().into_bytes()),
                    ),
                    ("tls.key".to_string(), ByteString(key_pem.into_bytes())),
                ])),
                ..Default::default()
            },
        )
        .await
        .expect("TLS Secret");
    let response = eventually("https through the ingress", || async {
        let text = https_get(&laptop, &ip, &portal, &cert_pem).await?;
        if text.starts_with("HTTP/1.1 200") {
            Ok(text)
        } else {
            Err(text)
        }
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
    let ready = eventually("Ready", || async {
        let i = ingresses.get("portal").await.map_err(|e| e.to_string())?;
        if condition(&i, "Ready").is_some_and(|c| c.0 == "True") {
            Ok(i)
        } else {
            Err(describe(&i))
        }
    })
    .await;
    assert_eq!(
        condition(&ready, "BackendsReachable")
            .map(|c| c.1)
            .as_deref(),
        Some("Reachable"),
        "{}",
        describe(&ready)
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

    // A node outside allowFrom (tag:client) gets no connection at all.
    let outsider = env
        .tailnet()
        .join_node(
            &format!("outsider-{}", &ns[ns.len() - 5..]),
            tno_testenv_tailnet::JoinOptions {
                tags: vec!["tag:client".into()],
                ..Default::default()
            },
        )
        .await
        .expect("outsider node");
    let denied = tcp_echo(&outsider.node.local_api(), &ip, 5432).await;
    assert!(
        denied.is_err(),
        "a node outside allowFrom must not get a TCP connection: {denied:?}"
    );
    let denied_https = https_get(&outsider.node.local_api(), &ip, &portal, &cert_pem).await;
    assert!(denied_https.is_err(), "{denied_https:?}");
    // ... while the laptop still does (the policy did not just break everything).
    tcp_echo(&laptop, &ip, 5432)
        .await
        .expect("laptop still allowed");
    assert_eq!(ready.name_any(), "portal");

    // Without tls.secretName: a cert-manager Certificate for every http name, and http stays
    // unserved (Issuing) until it is issued.
    let mut tailnet = env.tailnet_object(&tailnet_name, "Apply");
    tailnet["spec"]["defaults"] =
        json!({"tls": {"issuerRef": {"name": "apps-ca", "kind": "ClusterIssuer"}}});
    Api::<tailnet_api::Tailnet>::all(client.clone())
        .patch(
            &tailnet_name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(tailnet),
        )
        .await
        .expect("Tailnet with a default issuer");
    ingresses
        .patch("issued", &PatchParams::apply("test").force(), &Patch::Apply(json!({
            "apiVersion": "tailnet-operator.dev/v1alpha1", "kind": "TailnetIngress",
            "metadata": {"name": "issued", "namespace": ns},
            "spec": {"tailnetRef": {"name": tailnet_name}, "allowFrom": ["group:team-a"],
                     "exposes": [{"name": "web", "dnsLabel": "issued", "mode": "http", "port": 443, "backend": {"service": "frontend", "port": 8080}}]}
        })))
        .await
        .expect("ingress with issuer");
    let issuing = eventually("CertificateReady=False/Issuing", || async {
        let i = ingresses.get("issued").await.map_err(|e| e.to_string())?;
        match condition(&i, "CertificateReady") {
            Some((s, r)) if s == "False" && r == "Issuing" => Ok(i),
            _ => Err(describe(&i)),
        }
    })
    .await;
    assert_eq!(
        condition(&issuing, "Ready").map(|c| c.1).as_deref(),
        Some("Issuing")
    );
    let certificates: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
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
    let issued = eventually("the issued ingress's node online", || async {
        let i = ingresses.get("issued").await.map_err(|e| e.to_string())?;
        let ip = i
            .status
            .clone()
            .unwrap_or_default()
            .tailnet_ips
            .into_iter()
            .find(|a| a.contains('.'));
        match (condition(&i, "NodeOnline"), ip) {
            (Some((s, _)), Some(ip)) if s == "True" => Ok(ip),
            _ => Err(describe(&i)),
        }
    })
    .await;
    let (issued_cert, issued_key) = certificate(std::slice::from_ref(&issued_name));
    let unserved = https_get(&laptop, &issued, &issued_name, &issued_cert).await;
    assert!(unserved.is_err(), "no answer while Issuing: {unserved:?}");
    let agent_pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let selector =
        ListParams::default().labels("app.kubernetes.io/instance=tailnet-ingress-issued");
    let uids = |pods: Vec<k8s_openapi::api::core::v1::Pod>| {
        let mut uids: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        uids.sort();
        uids
    };
    let before = uids(agent_pods.list(&selector).await.expect("agent pods").items);
    assert!(!before.is_empty(), "the issued ingress has an agent pod");
    // cert-manager (not run here: its controller is not buildable from the module proxy)
    // would now write the Secret; the test writes it the same way.
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some("tailnet-ingress-issued-tls".into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(BTreeMap::from([
                    (
                        "tls.crt".to_string(),
                        ByteString(issued_cert.clone().into_bytes()),
                    ),
                    ("tls.key".to_string(), ByteString(issued_key.into_bytes())),
                ])),
                ..Default::default()
            },
        )
        .await
        .expect("issued TLS Secret");
    let answer = eventually("https once the certificate is issued", || async {
        let text = https_get(&laptop, &issued, &issued_name, &issued_cert).await?;
        if text.starts_with("HTTP/1.1 200") {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    assert!(answer.contains("frontend"), "{answer}");
    let after = uids(agent_pods.list(&selector).await.expect("agent pods").items);
    assert_eq!(before, after, "served without restarting the agent pod");
    operator.terminate().await.expect("operator stops cleanly");
}
