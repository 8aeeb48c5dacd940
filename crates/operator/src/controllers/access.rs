//! Access to a Tailnet and its Headscale server (gather step of every controller): the
//! Tailnet object, its API key Secret, a Headscale client — or the problem that prevents it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret as K8sSecret};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_api::Tailnet;
use tailnet_api::conditions::reasons;
use tailnet_api::owner_feed::{FEED_KEY, OwnerFeed, owner_keys_secret, parse_feed};
use tailnet_headscale::{Client as HeadscaleClient, Secret};

use super::agent::observation::TailnetView;
use super::context::Context;
use super::kube_io::from_cache_or_get;
use super::status::Problem;

/// The Tailnet an agent belongs to and a Headscale client for it, or why not.
#[derive(Clone)]
pub struct TailnetAccess {
    pub tailnet: Tailnet,
    pub headscale: Result<HeadscaleClient, Problem>,
    /// The PEM bundle of `spec.serverCA` (when set and readable).
    pub server_ca: Option<String>,
    /// A contributor without a Headscale key (no `spec.apiSecretRef`): the owner's feed
    /// (keys and node facts) instead of a client, or why it cannot be used. `None`: the
    /// installation has its own key.
    pub feed: Option<Result<Arc<OwnerFeed>, Problem>>,
}

impl TailnetAccess {
    /// What `decide` may know of it: the Tailnet, and whether Headscale (or, without a key,
    /// the owner's feed) can be used.
    pub fn view(&self) -> TailnetView {
        let headscale = match &self.feed {
            Some(feed) => feed.as_ref().map(|_| ()).map_err(Clone::clone),
            None => self.headscale.as_ref().map(|_| ()).map_err(Clone::clone),
        };
        let owner_keys = match &self.feed {
            Some(Ok(feed)) => Some(
                feed.keys
                    .iter()
                    .filter_map(|k| Some((k.tag.clone(), k.expires.parse().ok()?)))
                    .collect(),
            ),
            Some(Err(_)) => Some(BTreeMap::new()),
            None => None,
        };
        TailnetView {
            tailnet: self.tailnet.clone(),
            headscale,
            server_ca: self.server_ca.clone(),
            owner_keys,
        }
    }
}

/// [`tailnet_access`] of the Tailnet `name`, or of the default Tailnet (the only one in the
/// cache) when `None`.
pub async fn tailnet_access_of(
    ctx: &Context,
    name: Option<&str>,
) -> Result<TailnetAccess, Problem> {
    match name {
        Some(name) => tailnet_access(ctx, name).await,
        None => tailnet_access(ctx, &default_tailnet(ctx)?).await,
    }
}

/// The default Tailnet: the only one there is (Tailnet cache).
pub fn default_tailnet(ctx: &Context) -> Result<String, Problem> {
    use tailnet_api::service::NoTailnet;
    let names: Vec<String> = ctx
        .caches
        .tailnets
        .state()
        .iter()
        .map(|t| t.name_any())
        .collect();
    tailnet_api::service::default_tailnet(&names).map_err(|e| {
        let reason = match e {
            NoTailnet::NoneExists => reasons::TAILNET_NOT_FOUND,
            NoTailnet::Several(_) => reasons::TAILNET_REQUIRED,
        };
        Problem::new(reason, e.to_string())
    })
}

/// Looks up the Tailnet and builds its Headscale client. `Err`: why `TailnetReady` is False.
pub async fn tailnet_access(ctx: &Context, name: &str) -> Result<TailnetAccess, Problem> {
    let api: Api<Tailnet> = Api::all(ctx.client.clone());
    let tailnet = match from_cache_or_get(&ctx.caches.tailnets, &api, &ObjectRef::new(name)).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err(Problem::new(
                reasons::TAILNET_NOT_FOUND,
                format!("Tailnet {name:?} (spec.tailnetRef.name) does not exist"),
            ));
        }
        Err(e) => {
            return Err(Problem::new(
                reasons::TAILNET_UNREADABLE,
                format!("reading Tailnet {name}: {e}"),
            ));
        }
    };
    let server_ca = read_server_ca(ctx, &tailnet).await;
    if tailnet.spec.api_secret_ref.is_none() {
        let feed = read_owner_feed(ctx, &tailnet).await.map(Arc::new);
        return Ok(TailnetAccess {
            headscale: Err(no_api_key(&tailnet)),
            server_ca: server_ca.ok().flatten(),
            feed: Some(feed),
            tailnet,
        });
    }
    let headscale = match (read_api_key(ctx, &tailnet).await, &server_ca) {
        (Ok(key), Ok(ca)) => ctx
            .headscale(&tailnet.spec.server, &key, ca.as_deref())
            .map_err(|e| Problem::headscale(&e, e.to_string())),
        (Err(problem), _) => Err(problem),
        (_, Err(problem)) => Err(problem.clone()),
    };
    Ok(TailnetAccess {
        tailnet,
        headscale,
        server_ca: server_ca.ok().flatten(),
        feed: None,
    })
}

/// Why there is no Headscale client for a Tailnet without `spec.apiSecretRef`.
pub fn no_api_key(tailnet: &Tailnet) -> Problem {
    Problem::new(
        reasons::AWAITING_OWNER,
        format!(
            "Tailnet {} has no spec.apiSecretRef: this installation holds no Headscale key and reads its agents' keys and node facts from Secret {} (written by the owner)",
            tailnet.name_any(),
            owner_keys_secret(&tailnet.name_any())
        ),
    )
}

/// The owner's feed for a keyless contributor: Secret `<tailnet>-owner-keys` (operator
/// namespace), key `feed.json`, size-capped and checked for this Tailnet's tag prefix.
pub async fn read_owner_feed(ctx: &Context, tailnet: &Tailnet) -> Result<OwnerFeed, Problem> {
    let ns = &ctx.config.operator_namespace;
    let name = owner_keys_secret(&tailnet.name_any());
    let api: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), ns);
    let read = from_cache_or_get(
        &ctx.caches.operator_secrets,
        &api,
        &ObjectRef::new(&name).within(ns),
    )
    .await;
    let awaiting = |what: String| {
        Problem::new(
            reasons::AWAITING_OWNER,
            format!(
                "{what}: the owner writes its Headscale facts and this installation's pre-auth keys there once its Tailnet lists this one under policy.contributors with keys (see docs/several-clusters.md); no API key is used here"
            ),
        )
    };
    let secret = match read {
        Ok(Some(secret)) => secret,
        Ok(None) => return Err(awaiting(format!("Secret {ns}/{name} does not exist yet"))),
        Err(e) => {
            return Err(Problem::new(
                reasons::SECRET_UNREADABLE,
                format!("reading Secret {ns}/{name}: {e}"),
            ));
        }
    };
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(FEED_KEY)) else {
        return Err(awaiting(format!(
            "Secret {ns}/{name} has no {FEED_KEY} yet"
        )));
    };
    let feed = parse_feed(&bytes.0, &tailnet.spec.policy.tag_prefix).map_err(|e| {
        Problem::new(
            reasons::OWNER_FEED_INVALID,
            format!("Secret {ns}/{name}: {e}; the owner rewrites it on its next poll"),
        )
    })?;
    let valid_until = feed.valid_until.parse::<jiff::Timestamp>().ok();
    match valid_until {
        Some(until) if until > jiff::Timestamp::now() => Ok(feed),
        _ => Err(awaiting(format!(
            "the owner's facts in Secret {ns}/{name} expired at {:?} (the owner refreshes them while it lists this installation and can reach this cluster)",
            feed.valid_until
        ))),
    }
}

/// The PEM bundle of the Tailnet's `spec.serverCA` (a ConfigMap key in the operator
/// namespace); `None` without `spec.serverCA`. The PEM is checked (at least one certificate)
/// so that a wrong key is named here, not as a TLS failure later.
pub async fn read_server_ca(ctx: &Context, tailnet: &Tailnet) -> Result<Option<String>, Problem> {
    let Some(server_ca) = &tailnet.spec.server_ca else {
        return Ok(None);
    };
    let reference = &server_ca.config_map_ref;
    let ns = &ctx.config.operator_namespace;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let read = from_cache_or_get(
        &ctx.caches.operator_config_maps,
        &api,
        &ObjectRef::new(&reference.name).within(ns),
    )
    .await;
    let config_map = match read {
        Ok(Some(config_map)) => config_map,
        Ok(None) => {
            return Err(Problem::new(
                reasons::SERVER_CA_MISSING,
                format!(
                    "ConfigMap {ns}/{} (spec.serverCA.configMapRef) does not exist; create it with the PEM certificate of the CA that signed {}'s certificate under key {:?}",
                    reference.name, tailnet.spec.server, reference.key
                ),
            ));
        }
        Err(e) => {
            return Err(Problem::new(
                reasons::SERVER_CA_MISSING,
                format!(
                    "reading ConfigMap {ns}/{} (spec.serverCA): {e}",
                    reference.name
                ),
            ));
        }
    };
    let Some(pem) = config_map
        .data
        .as_ref()
        .and_then(|data| data.get(&reference.key))
    else {
        return Err(Problem::new(
            reasons::SERVER_CA_MISSING,
            format!(
                "ConfigMap {ns}/{} has no key {:?} (spec.serverCA.configMapRef.key)",
                reference.name, reference.key
            ),
        ));
    };
    match tailnet_headscale::server_ca_certificates(pem) {
        Ok(_) => Ok(Some(pem.clone())),
        Err(e) => Err(Problem::new(
            reasons::SERVER_CA_INVALID,
            format!(
                "ConfigMap {ns}/{} key {:?} (spec.serverCA) is not a PEM CA bundle: {e}",
                reference.name, reference.key
            ),
        )),
    }
}

/// The Headscale API key from the Tailnet's `spec.apiSecretRef` (operator namespace).
pub async fn read_api_key(ctx: &Context, tailnet: &Tailnet) -> Result<Secret, Problem> {
    let Some(reference) = &tailnet.spec.api_secret_ref else {
        return Err(no_api_key(tailnet));
    };
    let ns = &ctx.config.operator_namespace;
    let api: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), ns);
    // Read on every reconcile of every resource: from the watch cache when it has it.
    let read = from_cache_or_get(
        &ctx.caches.operator_secrets,
        &api,
        &ObjectRef::new(&reference.name).within(ns),
    )
    .await;
    let secret = match read {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            return Err(Problem::new(
                reasons::SECRET_MISSING,
                format!(
                    "Secret {ns}/{} (spec.apiSecretRef) does not exist; create it with the Headscale API key under key {:?}",
                    reference.name, reference.key
                ),
            ));
        }
        Err(e) => {
            return Err(Problem::new(
                reasons::SECRET_UNREADABLE,
                format!("reading Secret {ns}/{}: {e}", reference.name),
            ));
        }
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&reference.key))
        .map(|b| String::from_utf8_lossy(&b.0).trim().to_string());
    match value {
        Some(key) if !key.is_empty() => Ok(Secret::new(key)),
        _ => Err(Problem::new(
            reasons::SECRET_KEY_MISSING,
            format!(
                "Secret {ns}/{} has no non-empty key {:?} (spec.apiSecretRef.key)",
                reference.name, reference.key
            ),
        )),
    }
}
