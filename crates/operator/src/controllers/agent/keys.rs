//! An agent's identity in Headscale, carried out (I/O): reading the auth Secret, minting
//! and retiring the single-use pre-auth key the pure decision (`identity.rs`) asked for, and
//! forgetting the identity when the resource goes.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret as K8sSecret;
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::reflector::ObjectRef;
use tailnet_api::owner_feed::OwnerFeed;
use tailnet_headscale::{Client as HeadscaleClient, CreatePreAuthKey};
use tailnet_render::meta::Owner;
use tailnet_render::pod::TailscaledLogin;

use super::super::applied::{ABSENT, ChildRef, Decision, Live};
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::super::kube_io::{apply, get_opt_cached};
use super::super::publish::event;
use super::identity::{
    KEY_EXPIRES_ANNOTATION, KEY_ID_ANNOTATION, KeyAction, auth_secret_of, confirm_mint,
    orphaned_keys, own_nodes,
};
use super::observation::AuthSecret;

fn auth_child(owner: &Owner) -> ChildRef {
    ChildRef {
        kind: <K8sSecret as k8s_openapi::Resource>::KIND.to_string(),
        namespace: owner.namespace.clone(),
        name: owner.names().auth_secret,
    }
}

/// Reads the agent's auth Secret, unless this process removed it recently (nothing to read
/// on every poll; checked again after the re-apply interval).
pub async fn gather_auth_secret(
    ctx: &Context,
    owner: &Owner,
) -> Result<AuthSecret, ReconcileError> {
    if ctx
        .applied
        .decide(&auth_child(owner), &ABSENT, Live::Unwatched)
        == Decision::Unchanged
    {
        return Ok(AuthSecret::RemovedByUs);
    }
    let name = owner.names().auth_secret;
    let secret = read_secret(ctx, &owner.namespace, &name).await?;
    Ok(auth_secret_of(secret.as_ref()))
}

/// A Secret: from the watch cache of the operator namespace when it is there, otherwise a
/// GET served from the apiserver's watch cache (no etcd read per poll). Good enough for the
/// decision; a mint is confirmed by a quorum read first ([`confirm_mint`]).
pub async fn read_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<K8sSecret>, ReconcileError> {
    if namespace == ctx.config.operator_namespace
        && let Some(secret) = ctx
            .caches
            .operator_secrets
            .get(&ObjectRef::new(name).within(namespace))
    {
        return Ok(Some((*secret).clone()));
    }
    let secrets: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), namespace);
    get_opt_cached(&secrets, name)
        .await
        .map_err(ReconcileError::kube(format!("get Secret {name}")))
}

/// Where an agent's pre-auth keys come from in the act step.
#[derive(Clone)]
pub enum KeySource {
    /// This installation's own Headscale key: it mints and expires keys.
    Headscale(Box<HeadscaleClient>),
    /// A contributor without a Headscale key: the owner's feed holds the keys.
    Owner(Arc<OwnerFeed>),
    /// Neither can be used now: nothing is done about keys.
    Unusable,
}

impl KeySource {
    /// The Headscale client, when this installation has one.
    pub fn headscale(&self) -> Option<&HeadscaleClient> {
        match self {
            KeySource::Headscale(client) => Some(client.as_ref()),
            _ => None,
        }
    }
}

/// Carries out a key decision. Returns whether a key was minted (or taken from the owner).
pub async fn act_on_key(
    ctx: &Context,
    source: &KeySource,
    owner: &Owner,
    tag: &str,
    action: &KeyAction,
    login: Option<&TailscaledLogin>,
) -> Result<bool, ReconcileError> {
    let child = auth_child(owner);
    let secrets: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let name = child.name.clone();
    match action {
        KeyAction::Keep => Ok(false),
        KeyAction::Retire {
            key_id,
            delete_secret,
        } => {
            if let (Some(id), Some(headscale)) = (key_id, source.headscale())
                && let Err(e) = headscale.expire_pre_auth_key(*id).await
            {
                tracing::debug!(key_id = id, error = %e, "expiring a used pre-auth key failed");
            }
            if *delete_secret {
                match secrets.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(ReconcileError::kube("delete auth Secret")(e)),
                }
            }
            ctx.applied.record(child, ABSENT, None);
            Ok(false)
        }
        KeyAction::Mint { .. } => {
            ctx.applied.forget(&child);
            // Keys are minted only for a deployed agent, which has a login.
            let Some(login) = login else {
                return Ok(false);
            };
            let to = KeyTo {
                owner,
                tag,
                login,
                secrets: &secrets,
            };
            match source {
                KeySource::Headscale(headscale) => mint(ctx, headscale.as_ref(), action, &to).await,
                KeySource::Owner(feed) => take_owners_key(action, feed, &to).await,
                KeySource::Unusable => Ok(false),
            }
        }
    }
}

/// Where a key goes: the auth Secret of `owner`'s agent for `tag`, with tailscaled's `login`.
struct KeyTo<'a> {
    owner: &'a Owner,
    tag: &'a str,
    login: &'a TailscaledLogin,
    secrets: &'a Api<K8sSecret>,
}

/// The auth Secret holding `key` (id and expiry annotated; the key itself nowhere else).
fn auth_secret_with(to: &KeyTo<'_>, key: &str, id: u64, expires: &Timestamp) -> K8sSecret {
    let mut secret = tailnet_render::pod::auth_secret(to.owner, key, to.login);
    secret.metadata.annotations = Some(BTreeMap::from([
        (KEY_ID_ANNOTATION.to_string(), id.to_string()),
        (KEY_EXPIRES_ANNOTATION.to_string(), expires.to_string()),
    ]));
    secret
}

/// A contributor without a Headscale key: copies the owner's key for `tag` from the feed
/// into the agent's auth Secret, after the same strong read as a mint. Returns whether it did.
async fn take_owners_key(
    action: &KeyAction,
    feed: &OwnerFeed,
    to: &KeyTo<'_>,
) -> Result<bool, ReconcileError> {
    let (tag, secrets) = (to.tag, to.secrets);
    let name = to.owner.names().auth_secret;
    let fresh = secrets
        .get_opt(&name)
        .await
        .map_err(ReconcileError::kube(format!("get Secret {name}")))?;
    let KeyAction::Mint { expires, .. } =
        confirm_mint(action, &auth_secret_of(fresh.as_ref()), Timestamp::now())
    else {
        return Ok(false);
    };
    let Some(key) = feed.keys.iter().find(|k| k.tag == tag) else {
        return Ok(false);
    };
    let secret = auth_secret_with(to, &key.key, key.id, &expires);
    apply(secrets, &name, &secret).await?;
    Ok(true)
}

/// Mints a key for `tag` after a strong read of the auth Secret (see [`confirm_mint`]),
/// expiring keys of the tag that no Secret holds first. Returns whether a key was minted.
async fn mint(
    ctx: &Context,
    headscale: &HeadscaleClient,
    action: &KeyAction,
    to: &KeyTo<'_>,
) -> Result<bool, ReconcileError> {
    let (tag, secrets) = (to.tag, to.secrets);
    let name = to.owner.names().auth_secret;
    // The gather step read the Secret from a watch cache: a key minted by the
    // previous reconcile may not be in it yet. Read it strongly (quorum GET) right
    // before minting, and decide again on that.
    let fresh = secrets
        .get_opt(&name)
        .await
        .map_err(ReconcileError::kube(format!("get Secret {name}")))?;
    let KeyAction::Mint { held, expires } =
        confirm_mint(action, &auth_secret_of(fresh.as_ref()), Timestamp::now())
    else {
        return Ok(false);
    };
    let (held, expires) = (&held, &expires);
    // A list up to a second old is enough here: keys of this tag are only minted by
    // this resource's reconciles, which never run concurrently, and the list is
    // dropped after every mint (below), so it always holds this resource's last key.
    let keys = ctx
        .pre_auth_keys
        .get(headscale.server(), || headscale.list_pre_auth_keys())
        .await
        .map_err(ReconcileError::headscale("list pre-auth keys"))?;
    for id in orphaned_keys(&keys, tag, *held, Timestamp::now()) {
        headscale
            .expire_pre_auth_key(id)
            .await
            .map_err(ReconcileError::headscale(format!(
                "expire orphaned pre-auth key {id} of {tag}"
            )))?;
        tracing::info!(key_id = id, %tag, "expired a pre-auth key that no Secret holds");
    }
    let minted = headscale
        .create_pre_auth_key(&CreatePreAuthKey::single_use_tagged(
            vec![tag.to_string()],
            *expires,
        ))
        .await;
    // The list no longer holds every key of the tag (nor the expired orphans' state).
    ctx.pre_auth_keys.invalidate(headscale.server());
    let key = minted.map_err(ReconcileError::headscale(format!(
        "mint pre-auth key for {tag}"
    )))?;
    let secret = auth_secret_with(to, key.key.expose(), key.id, expires);
    if let Err(e) = apply(secrets, &name, &secret).await {
        // Do not leave a valid key behind that nobody holds.
        let _ = headscale.expire_pre_auth_key(key.id).await;
        return Err(e);
    }
    Ok(true)
}

/// Carries out a key decision for an agent of `object` (`source`: where keys come from), and
/// publishes `PreAuthKeyMinted` (or, from the owner, `PreAuthKeyReceived`) when a key went
/// into the auth Secret.
pub async fn act_on_agent_key<K>(
    ctx: &Context,
    object: &K,
    source: &KeySource,
    owner: &Owner,
    tag: &str,
    action: &KeyAction,
    login: Option<&TailscaledLogin>,
) -> Result<(), ReconcileError>
where
    K: kube::Resource<DynamicType = ()>,
{
    if matches!(source, KeySource::Unusable) || *action == KeyAction::Keep {
        return Ok(());
    }
    if act_on_key(ctx, source, owner, tag, action, login).await?
        && let KeyAction::Mint { expires, .. } = action
    {
        let (reason, note) = match source {
            KeySource::Owner(_) => (
                "PreAuthKeyReceived",
                format!(
                    "took the single-use pre-auth key the owner wrote for {tag}, valid until {expires}"
                ),
            ),
            _ => (
                "PreAuthKeyMinted",
                format!("minted a single-use pre-auth key for {tag}, valid until {expires}"),
            ),
        };
        event(
            ctx,
            object,
            kube::runtime::events::EventType::Normal,
            reason,
            "Reconcile",
            note,
        )
        .await;
    }
    Ok(())
}

/// Removes the agent's identity from Headscale: its nodes (the tag under one of `hostnames`,
/// see [`super::identity::Identity::hostnames`]) and any unexpired keys of its tag.
pub async fn forget_identity(
    headscale: &HeadscaleClient,
    tag: &str,
    hostnames: &[String],
) -> Result<(), ReconcileError> {
    // Keys first: once none is valid, no agent can register a node any more, so the node list
    // read afterwards is complete. (Nodes first left a window in which an agent that was
    // still starting registered after the list and stayed behind as an orphan.)
    let keys = headscale
        .list_pre_auth_keys()
        .await
        .map_err(ReconcileError::headscale("list pre-auth keys"))?;
    let now = Timestamp::now();
    for key in keys
        .iter()
        .filter(|k| k.acl_tags.iter().any(|t| t == tag) && k.expiration.is_some_and(|e| e > now))
    {
        headscale
            .expire_pre_auth_key(key.id)
            .await
            .map_err(ReconcileError::headscale(format!(
                "expire pre-auth key {}",
                key.id
            )))?;
    }
    let nodes = headscale
        .list_nodes()
        .await
        .map_err(ReconcileError::headscale("list nodes"))?;
    for node in own_nodes(&nodes, tag, hostnames) {
        headscale
            .delete_node(node.id)
            .await
            .map_err(ReconcileError::headscale(format!(
                "delete node {}",
                node.id
            )))?;
    }
    Ok(())
}
