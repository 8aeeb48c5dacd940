//! Gather step of the Tailnet controller: everything `decide` needs, read once — Headscale
//! (reachability, version, health, nodes, the live policy), the base policy text, the
//! egresses and ingresses (watch caches), the egress Services' ClusterIPs and the DNS
//! ConfigMap's current keys.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;
use tailnet_api::conditions::reasons;
use tailnet_api::naming::labels;
use tailnet_headscale::{Client as HeadscaleClient, Node};
use tailnet_policy::ObservedNode;
use tailnet_render::backends::ObjectKey;
use tailnet_render::dns::{EXTRA_RECORDS_KEY, HOSTS_KEY, SERVER_BLOCK_KEY};

use super::super::access::{read_api_key, read_owner_feed, read_server_ca};
use super::super::context::Context;
use super::super::entrances::services_of;
use super::super::error::ReconcileError;
use super::super::status::Problem;
use super::contributions::{parse_store, store_config_map};
use super::feed::node_of;
use super::locations::{BASE_POLICY_KEY, dns_config_map_location};
// The observation's types live in a module without I/O (decide reads them); re-exported
// here for callers that name them by the step that fills them.
pub use super::observation::{
    ApiKeyFacts, ContributorRead, CurrentDns, StoredFragment, TailnetObservation,
};
use super::role::Role;
use tailnet_api::fragment::FRAGMENT_KEY;
use tailnet_api::tailnet::Contributor;

/// Reads everything; the Headscale client (when Headscale is reachable) is returned beside
/// the observation, for the act step.
pub async fn gather(
    ctx: &Context,
    tailnet: &Tailnet,
) -> Result<(TailnetObservation, Option<HeadscaleClient>), ReconcileError> {
    let headscale = observe_headscale(ctx, tailnet).await;
    let base = read_base(ctx, tailnet).await;
    let egresses: Vec<_> = ctx.egresses.state().iter().map(|e| (**e).clone()).collect();
    let ingresses: Vec<_> = ctx
        .ingresses
        .state()
        .iter()
        .map(|i| (**i).clone())
        .collect();
    let services: Vec<_> = services_of(ctx, &tailnet.name_any())
        .iter()
        .map(|s| (**s).clone())
        .collect();
    let gateways = super::super::gateway::intents::of_tailnet(ctx, &tailnet.name_any()).await?;
    let (egress_cluster_ips, dns_config_map) = match dns_config_map_location(tailnet, &ctx.config) {
        Some((namespace, name)) => {
            let mut ips = egress_cluster_ips(ctx, tailnet).await?;
            ips.extend(in_cluster_ips(ctx, &tailnet.name_any()));
            (ips, current_dns(ctx, &namespace, &name).await?)
        }
        None => (BTreeMap::new(), None),
    };
    // Only an owner merges fragments.
    let role = Role::of(&tailnet.spec.policy);
    let (contributor_reads, contribution_store) = if role.contributors().is_empty() {
        (Vec::new(), BTreeMap::new())
    } else {
        let mut reads = Vec::new();
        for contributor in role.contributors() {
            reads.push(ContributorRead {
                name: contributor.name.clone(),
                read: read_fragment(ctx, contributor).await,
            });
        }
        (reads, read_store(ctx, tailnet).await?)
    };
    let observation = TailnetObservation {
        contributor_reads,
        contribution_store,
        headscale: headscale.version,
        nodes: headscale.nodes,
        live_policy: headscale.live_policy,
        api_key: headscale.api_key,
        base,
        egresses,
        ingresses,
        services,
        gateways,
        egress_cluster_ips,
        dns_config_map,
    };
    Ok((observation, headscale.client))
}

struct HeadscaleState {
    client: Option<HeadscaleClient>,
    version: Result<String, Problem>,
    nodes: Option<Vec<ObservedNode>>,
    live_policy: Option<String>,
    api_key: Option<ApiKeyFacts>,
}

/// API key, client, version, health; then nodes and the live policy.
async fn observe_headscale(ctx: &Context, tailnet: &Tailnet) -> HeadscaleState {
    let failed = |problem: Problem| HeadscaleState {
        client: None,
        version: Err(problem),
        nodes: None,
        live_policy: None,
        api_key: None,
    };
    if tailnet.spec.api_secret_ref.is_none() {
        // A contributor without a key: what the owner wrote into its Secret.
        return match read_owner_feed(ctx, tailnet).await {
            Ok(feed) => HeadscaleState {
                client: None,
                version: Ok(feed.headscale_version.clone()),
                nodes: Some(
                    feed.nodes
                        .iter()
                        .map(|n| observed_node(&node_of(n)))
                        .collect(),
                ),
                live_policy: feed.live_policy,
                api_key: None,
            },
            Err(problem) => failed(problem),
        };
    }
    let key = match read_api_key(ctx, tailnet).await {
        Ok(key) => key,
        Err(problem) => return failed(problem),
    };
    let server_ca = match read_server_ca(ctx, tailnet).await {
        Ok(ca) => ca,
        Err(problem) => return failed(problem),
    };
    let client = match ctx.headscale(&tailnet.spec.server, &key, server_ca.as_deref()) {
        Ok(client) => client,
        Err(e) => return failed(Problem::headscale(&e, format!("{e}; fix spec.server"))),
    };
    let version = match client.version().await {
        Ok(v) => v.version,
        Err(e) => {
            let message = format!(
                "Headscale at {} is not reachable: {e}{}",
                tailnet.spec.server,
                untrusted_hint(&e, tailnet)
            );
            return failed(Problem::headscale(&e, message));
        }
    };
    if let Err(e) = client.health().await {
        return failed(Problem::headscale(&e, e.to_string()));
    }
    let nodes = match client.list_nodes().await {
        Ok(nodes) => Some(nodes.iter().map(observed_node).collect()),
        Err(e) => {
            tracing::warn!(tailnet = %tailnet.spec.server, error = %e, "listing nodes failed");
            None
        }
    };
    let live_policy = match client.get_policy().await {
        Ok(policy) => Some(policy.policy),
        Err(e) => {
            tracing::warn!(error = %e, "reading the live policy failed");
            None
        }
    };
    let api_key = own_api_key(&client, &key).await;
    HeadscaleState {
        client: Some(client),
        version: Ok(version),
        nodes,
        live_policy,
        api_key,
    }
}

/// What to do about a certificate the client does not trust: which CA it was checked against.
fn untrusted_hint(error: &tailnet_headscale::Error, tailnet: &Tailnet) -> String {
    let untrusted = matches!(
        error,
        tailnet_headscale::Error::Transport {
            kind: tailnet_headscale::TransportKind::CertificateUntrusted,
            ..
        }
    );
    if !untrusted {
        return String::new();
    }
    match &tailnet.spec.server_ca {
        Some(ca) => format!(
            " (checked against the system roots and spec.serverCA, ConfigMap {} key {:?}: that CA did not sign the server's certificate, or the certificate does not name the server's host; put the right CA there)",
            ca.config_map_ref.name, ca.config_map_ref.key
        ),
        None => " (checked against the system roots only: if a private CA signed it, set spec.serverCA to a ConfigMap key with that CA's PEM certificate)".to_string(),
    }
}

/// The operator's own key in Headscale's key list (its expiry); `None` when the list cannot
/// be read (the key still works: only the expiry is unknown) or does not show it.
async fn own_api_key(
    client: &HeadscaleClient,
    key: &tailnet_headscale::Secret,
) -> Option<ApiKeyFacts> {
    match client.list_api_keys().await {
        Ok(keys) => keys
            .into_iter()
            .find(|k| k.is(key.expose()))
            .map(|k| ApiKeyFacts {
                prefix: k.prefix,
                expiration: k.expiration,
            }),
        Err(e) => {
            tracing::warn!(error = %e, "listing API keys failed; the key's expiry is unknown");
            None
        }
    }
}

/// Converts a Headscale node into the policy renderer's plain data, skipping unparsable
/// addresses/routes (a newer Headscale may add formats we do not know).
pub fn observed_node(node: &Node) -> ObservedNode {
    let parse_ips = |v: &[String]| {
        v.iter()
            .filter_map(|s| s.parse::<IpAddr>().ok())
            .collect::<Vec<_>>()
    };
    let parse_nets = |v: &[String]| {
        v.iter()
            .filter_map(|s| s.parse::<IpNet>().ok())
            .collect::<Vec<_>>()
    };
    ObservedNode {
        id: node.id,
        name: if node.given_name.is_empty() {
            node.name.clone()
        } else {
            node.given_name.clone()
        },
        tags: node.tags.clone(),
        ip_addresses: parse_ips(&node.ip_addresses),
        available_routes: parse_nets(&node.available_routes),
        approved_routes: parse_nets(&node.approved_routes),
        online: node.online,
    }
}

/// The base policy text from `spec.policy.baseConfigMap` (operator namespace), or why not.
async fn read_base(ctx: &Context, tailnet: &Tailnet) -> Result<Option<String>, Problem> {
    let Some(name) = &tailnet.spec.policy.base_config_map else {
        return Ok(None);
    };
    let ns = &ctx.config.operator_namespace;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let cm = match api.get_opt(name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => {
            return Err(Problem::new(
                reasons::CONFIG_MAP_NOT_FOUND,
                format!(
                    "ConfigMap {ns}/{name} (spec.policy.baseConfigMap) does not exist; create it with the base policy under key {BASE_POLICY_KEY:?}"
                ),
            ));
        }
        Err(e) => {
            return Err(Problem::new(
                reasons::CONFIG_MAP_UNREADABLE,
                format!("reading ConfigMap {ns}/{name}: {e}"),
            ));
        }
    };
    match cm.data.as_ref().and_then(|d| d.get(BASE_POLICY_KEY)) {
        Some(text) => Ok(Some(text.clone())),
        None => Err(Problem::new(
            reasons::KEY_MISSING,
            format!("ConfigMap {ns}/{name} has no key {BASE_POLICY_KEY:?}"),
        )),
    }
}

/// The largest answer read for a contributor's ConfigMap, in bytes: the 512 KiB fragment,
/// JSON-escaped inside the ConfigMap (at most doubled), and its metadata. Reading stops at
/// this many bytes, before anything is parsed.
pub const MAX_CONTRIBUTOR_ANSWER_BYTES: usize = 2 * 1024 * 1024;

/// A contributor's `fragment.json`: from a ConfigMap of the operator namespace, or through
/// the contributor cluster's API with the kubeconfig in a Secret (bounded in time and size;
/// the kubeconfig never reaches a message).
async fn read_fragment(ctx: &Context, contributor: &Contributor) -> Result<String, Problem> {
    let ns = &ctx.config.operator_namespace;
    let unreadable = |message: String| Problem::new(reasons::CONTRIBUTOR_STALE, message);
    let (client, namespace, name): (kube::Client, String, String) = match (
        &contributor.source.config_map,
        &contributor.source.kubeconfig,
    ) {
        (Some(name), _) => (ctx.client.clone(), ns.clone(), name.clone()),
        (None, Some(source)) => {
            let client = kubeconfig_client(ctx, &source.secret_ref)
                .await
                .map_err(unreadable)?;
            (client, source.namespace.clone(), source.config_map.clone())
        }
        (None, None) => {
            return Err(unreadable("no source set".to_string()));
        }
    };
    let read = tokio::time::timeout(
        ctx.config.headscale_timeout,
        get_config_map_capped(&client, &namespace, &name, MAX_CONTRIBUTOR_ANSWER_BYTES),
    )
    .await
    .map_err(|_| {
        unreadable(format!(
            "reading ConfigMap {namespace}/{name} timed out after {:?}",
            ctx.config.headscale_timeout
        ))
    })?
    .map_err(|e| unreadable(format!("reading ConfigMap {namespace}/{name}: {e}")))?;
    let Some(config_map) = read else {
        return Err(unreadable(format!(
            "ConfigMap {namespace}/{name} does not exist"
        )));
    };
    config_map
        .data
        .and_then(|d| d.get(FRAGMENT_KEY).cloned())
        .ok_or_else(|| {
            unreadable(format!(
                "ConfigMap {namespace}/{name} has no key {FRAGMENT_KEY:?}"
            ))
        })
}

/// A client for a contributor's cluster from the kubeconfig in Secret `reference` (operator
/// namespace), honoured as [`contributor_client`] says. The error names the Secret and the
/// field, never a value.
pub async fn kubeconfig_client(
    ctx: &Context,
    reference: &tailnet_api::common::KeyRef,
) -> Result<kube::Client, String> {
    let ns = &ctx.config.operator_namespace;
    let secret_name = &reference.name;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets
        .get_opt(secret_name)
        .await
        .map_err(|e| format!("reading Secret {ns}/{secret_name}: {e}"))?;
    let bytes = secret
        .and_then(|s| s.data)
        .and_then(|d| d.get(&reference.key).cloned())
        .ok_or_else(|| {
            format!(
                "Secret {ns}/{secret_name} has no key {:?} (the contributor's kubeconfig)",
                reference.key
            )
        })?;
    contributor_client(&bytes.0, ctx.config.headscale_timeout)
        .await
        .map_err(|e| format!("Secret {ns}/{secret_name}: {e}"))
}

/// Why a capped read gave no ConfigMap.
#[derive(Debug, thiserror::Error)]
pub enum CappedReadError {
    #[error("the answer is larger than {limit} bytes; stopped reading it")]
    TooLarge { limit: usize },
    #[error("the request failed")]
    Request(#[source] kube::Error),
    #[error("reading the answer failed")]
    Body(#[source] kube::Error),
    #[error("HTTP {status}")]
    Status { status: u16 },
    #[error("the answer is not the object asked for")]
    Decode(#[source] serde_json::Error),
}

/// A ConfigMap read with a byte cap: the answer is read frame by frame and the read stops
/// (dropping the connection) as soon as it exceeds `limit`, before anything is parsed.
/// `Ok(None)` when it does not exist.
pub async fn get_config_map_capped(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    limit: usize,
) -> Result<Option<ConfigMap>, CappedReadError> {
    get_capped(
        client,
        &format!("/api/v1/namespaces/{namespace}/configmaps/{name}"),
        limit,
    )
    .await
}

/// A GET of `path` read with a byte cap, as [`get_config_map_capped`]; `Ok(None)` on 404.
pub async fn get_capped<T: serde::de::DeserializeOwned>(
    client: &kube::Client,
    path: &str,
    limit: usize,
) -> Result<Option<T>, CappedReadError> {
    let request = http::Request::get(path)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|e| CappedReadError::Request(kube::Error::HttpError(e)))?;
    let response = client
        .send(request)
        .await
        .map_err(CappedReadError::Request)?;
    let status = response.status();
    let body = read_capped(response.into_body(), limit).await?;
    if status == http::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(CappedReadError::Status {
            status: status.as_u16(),
        });
    }
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(CappedReadError::Decode)
}

/// Reads a body frame by frame; stops with [`CappedReadError::TooLarge`] once it holds more
/// than `limit` bytes.
async fn read_capped(
    mut body: kube::client::Body,
    limit: usize,
) -> Result<Vec<u8>, CappedReadError> {
    use http_body_util::BodyExt;
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(CappedReadError::Body)?;
        if let Some(data) = frame.data_ref() {
            if read.len().saturating_add(data.len()) > limit {
                return Err(CappedReadError::TooLarge { limit });
            }
            read.extend_from_slice(data);
        }
    }
    Ok(read)
}

/// A client for a contributor's cluster from the kubeconfig in its Secret, honoured only for
/// what [`super::kubeconfig::restrict`] keeps (https server, CA data, token, client
/// certificate data): no command runs, no file is read, no proxy is used, and nothing is sent
/// when the kubeconfig asks for more. The error names the field, never a value.
pub async fn contributor_client(
    kubeconfig: &[u8],
    timeout: std::time::Duration,
) -> Result<kube::Client, String> {
    let restricted = super::kubeconfig::restrict(kubeconfig).map_err(|e| e.to_string())?;
    let mut config = kube::Config::from_custom_kubeconfig(
        restricted,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| format!("kubeconfig: {e}"))?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    kube::Client::try_from(config)
        .map_err(|e| format!("a client for the contributor's cluster: {e}"))
}

/// The owner's store of accepted fragments (empty when it does not exist yet).
async fn read_store(
    ctx: &Context,
    tailnet: &Tailnet,
) -> Result<BTreeMap<String, StoredFragment>, ReconcileError> {
    let name = store_config_map(&tailnet.name_any());
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.config.operator_namespace);
    let current = api
        .get_opt(&name)
        .await
        .map_err(ReconcileError::kube(format!("get ConfigMap {name}")))?;
    Ok(current
        .and_then(|cm| cm.data)
        .map(|data| parse_store(&data))
        .unwrap_or_default())
}

/// ClusterIPs of this Tailnet's egress Services (operator namespace); unparsable ones are left
/// out (their aliases stay pending).
async fn egress_cluster_ips(
    ctx: &Context,
    tailnet: &Tailnet,
) -> Result<BTreeMap<ObjectKey, IpAddr>, ReconcileError> {
    let ns = &ctx.config.operator_namespace;
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{}=TailnetEgress,{}={}",
        labels::OWNER_KIND,
        labels::TAILNET,
        tailnet.name_any()
    );
    let listed = services
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(ReconcileError::kube("list egress Services"))?;
    Ok(listed
        .items
        .iter()
        .filter_map(|s| {
            let ip = s.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()?;
            Some((ObjectKey::new(ns, s.name_any()), ip))
        })
        .collect())
}

/// ClusterIPs of this Tailnet's in-cluster entrance Services (split horizon: an ingress's or a
/// load balancer's names resolve to them in-cluster), from the Service cache of the watched
/// namespaces; only Services the operator labelled for an agent of this Tailnet.
fn in_cluster_ips(ctx: &Context, tailnet: &str) -> Vec<(ObjectKey, IpAddr)> {
    ctx.kinds
        .objects::<Service>()
        .iter()
        .filter(|s| {
            let labels = s.labels();
            labels.get(labels::MANAGED_BY).map(String::as_str) == Some("tailnet-operator")
                && labels.get(labels::TAILNET).map(String::as_str) == Some(tailnet)
                && labels.get(labels::NAME).map(String::as_str) == Some("tailnet-agent")
        })
        .filter_map(|s| {
            let ip = s.spec.as_ref()?.cluster_ip.as_deref()?.parse().ok()?;
            Some((ObjectKey::new(s.namespace()?, s.name_any()), ip))
        })
        .collect()
}

/// Our keys and the owners of the DNS ConfigMap, `None` when it does not exist.
async fn current_dns(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<CurrentDns>, ReconcileError> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let current = api
        .get_opt(name)
        .await
        .map_err(ReconcileError::kube(format!(
            "get ConfigMap {namespace}/{name}"
        )))?;
    Ok(current.map(|cm| CurrentDns {
        keys: cm
            .data
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k == HOSTS_KEY || k == EXTRA_RECORDS_KEY || k == SERVER_BLOCK_KEY)
            .collect(),
        owner_uids: cm
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.uid)
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::contributor_client;

    /// The Authorization header of each request (`<none>` without one).
    type Seen = Arc<Mutex<Vec<String>>>;

    /// A TLS server standing in for the contributor's apiserver: records each request's
    /// Authorization header and answers 404 (no such ConfigMap). Returns its CA (the
    /// self-signed certificate), its port and what it saw.
    async fn recording_apiserver() -> (String, u16, Seen) {
        recording_apiserver_answering(false).await
    }

    /// With `endless`, every answer is `200 OK` with a chunked body that never ends (JSON
    /// whitespace); `seen` then gets one entry per MiB written.
    async fn recording_apiserver_answering(endless: bool) -> (String, u16, Seen) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let private = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], private)
        .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let seen: Seen = Arc::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, record) = (acceptor.clone(), record.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buffer = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head).to_string();
                    let authorization = text
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                        .map_or_else(|| "<none>".to_string(), str::to_string);
                    if let Ok(mut seen) = record.lock() {
                        seen.push(authorization);
                    }
                    if endless {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                        if tls.write_all(head.as_bytes()).await.is_err() {
                            return;
                        }
                        let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, " ".repeat(1 << 20));
                        // At most 1 GiB, so a client that never stops cannot hang the test.
                        for _ in 0..1024 {
                            if tls.write_all(chunk.as_bytes()).await.is_err() {
                                return;
                            }
                            if let Ok(mut seen) = record.lock() {
                                seen.push("MiB".to_string());
                            }
                        }
                        return;
                    }
                    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
                    let answer = format!(
                        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (cert.pem(), port, seen)
    }

    fn seen(seen: &Seen) -> Vec<String> {
        seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Issue 26 item 2: `tokenFile` pointing at a file of the owner's pod (here a marker file
    /// standing in for its ServiceAccount token) is refused before a client exists: the
    /// contributor's server sees no request, the error names the field. The control shows the
    /// server records what a client sends (an inline token).
    #[tokio::test]
    async fn a_token_file_is_never_read_nor_sent() {
        let (ca, port, requests) = recording_apiserver().await;
        let ca_data = serde_json::to_value(k8s_openapi::ByteString(ca.into_bytes()))
            .expect("base64")
            .as_str()
            .map(str::to_string)
            .expect("string");
        let kubeconfig = |user: &str| {
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
                 clusters:\n- name: b\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca_data}\n\
                 users:\n- name: reader\n  user:\n{user}\
                 contexts:\n- name: b\n  context:\n    cluster: b\n    user: reader\n"
            )
        };
        let get = |client: kube::Client| async move {
            Api::<ConfigMap>::namespaced(client, "cosmos")
                .get_opt("cosmos-fragment")
                .await
        };
        let timeout = Duration::from_secs(5);

        let inline =
            contributor_client(kubeconfig("    token: inline-token\n").as_bytes(), timeout)
                .await
                .expect("a kubeconfig with an inline token");
        assert!(matches!(get(inline).await, Ok(None)));
        let control = seen(&requests);
        assert_eq!(control.len(), 1, "{control:?}");
        assert!(
            control[0].eq_ignore_ascii_case("authorization: bearer inline-token"),
            "{control:?}"
        );

        let marker = tempfile::NamedTempFile::new().expect("marker file");
        std::fs::write(marker.path(), "marker-token-of-the-owner-pod").expect("write marker");
        let with_file = kubeconfig(&format!("    tokenFile: {}\n", marker.path().display()));
        let result = contributor_client(with_file.as_bytes(), timeout).await;
        if let Ok(client) = &result {
            let _ = get(client.clone()).await;
        }
        let after = seen(&requests);
        assert!(
            !after.iter().any(|h| h.contains("marker-token")),
            "the owner's token file reached the contributor's server: {after:?}"
        );
        assert_eq!(after.len(), 1, "a request was sent: {after:?}");
        let error = result.err().expect("tokenFile is refused");
        assert!(
            error.contains("users[\"reader\"].user.tokenFile")
                && error.contains("nothing was sent"),
            "{error}"
        );
    }

    /// Issue 26 item 6: a contributor's answer is read with a byte cap before parsing. The
    /// stand-in apiserver answers 200 with a body that never ends; the read stops with a named
    /// error after about `MAX_CONTRIBUTOR_ANSWER_BYTES`, and the server could write only a few
    /// MiB more (socket buffers) before the connection closed. Before, `Api::get_opt` read the
    /// whole answer into memory before the fragment's 512 KiB check (here: until the server's
    /// 1 GiB, or the owner ran out of memory).
    #[tokio::test]
    async fn a_contributors_answer_is_read_with_a_cap() {
        let (ca, port, written) = recording_apiserver_answering(true).await;
        let ca_data = serde_json::to_value(k8s_openapi::ByteString(ca.into_bytes()))
            .expect("base64")
            .as_str()
            .map(str::to_string)
            .expect("string");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters:\n- name: b\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {ca_data}\n\
             users:\n- name: reader\n  user:\n    token: inline-token\n\
             contexts:\n- name: b\n  context:\n    cluster: b\n    user: reader\n"
        );
        let client = contributor_client(kubeconfig.as_bytes(), Duration::from_secs(5))
            .await
            .expect("client");
        let result = tokio::time::timeout(
            Duration::from_secs(30),
            super::get_config_map_capped(
                &client,
                "cosmos",
                "cosmos-fragment",
                super::MAX_CONTRIBUTOR_ANSWER_BYTES,
            ),
        )
        .await
        .expect("the capped read ended");
        let error = result.expect_err("an endless answer is refused");
        assert!(
            matches!(error, super::CappedReadError::TooLarge { limit } if limit == super::MAX_CONTRIBUTOR_ANSWER_BYTES),
            "{error}"
        );
        assert!(
            error.to_string().contains("larger than 2097152 bytes"),
            "{error}"
        );
        // The server stops once the connection is gone (its writes fail).
        let mut last = 0;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = seen(&written).len();
            if now == last {
                break;
            }
            last = now;
        }
        let mib = seen(&written).iter().filter(|e| *e == "MiB").count();
        assert!(
            mib < 64,
            "the server wrote {mib} MiB: the read did not stop"
        );
    }
}
