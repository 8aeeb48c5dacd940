//! An agent's tailnet identity in Headscale: the node carrying its tag, the single-use
//! pre-auth key in its auth Secret, and forgetting both on deletion. The key decision is pure
//! ([`decide_key`]); gathering the auth Secret and carrying out the decision are I/O.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret as K8sSecret;
use kube::api::DeleteParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tailnet_headscale::{Client as HeadscaleClient, CreatePreAuthKey, Node, PreAuthKey};
use tailnet_render::meta::Owner;

use super::access::TailnetAccess;
use super::applied::{ABSENT, ChildRef, Decision, Live};
use super::context::Context;
use super::error::ReconcileError;
use super::kube_io::{apply, get_opt_cached};
use super::publish::event;
use super::status::{ConditionSet, Problem};
use tailnet_api::conditions::{reasons, types};
use tailnet_api::naming::{AgentKind, AgentNames};

/// Annotations on the auth Secret: which key is in it and until when it is valid (the key
/// itself is never logged or put anywhere else).
pub const KEY_ID_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-id";
pub const KEY_EXPIRES_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-expires";
/// How long a minted pre-auth key is valid: long enough for an image pull and a crash loop,
/// short enough to be useless if it leaks.
pub const PRE_AUTH_KEY_LIFETIME: SignedDuration = SignedDuration::from_mins(60);
/// A pending key that expires sooner than this is replaced rather than waited for.
const PENDING_KEY_MARGIN: SignedDuration = SignedDuration::from_mins(2);

/// The tailnet hostnames an agent's node may have, the current one first: an ingress's node
/// is named after its tag ([`tailnet_api::naming::tag_hostname`]; releases before it used the
/// object name, `tailnet-ingress-<name>`, which a node keeps until its pod restarts), an
/// egress's after its objects. An agent's identity is its tag **and** one of these: a node that
/// carries the tag under another hostname (a device tagged by hand, another installation's
/// agent) is never taken for the agent's, nor deleted with it.
pub fn agent_hostnames(kind: AgentKind, names: &AgentNames, tag: &str) -> Vec<String> {
    match kind {
        AgentKind::Egress => vec![names.base.clone()],
        AgentKind::Ingress => vec![tailnet_api::naming::tag_hostname(tag), names.base.clone()],
    }
}

fn carries(node: &Node, tag: &str) -> bool {
    node.tags.iter().any(|t| t == tag)
}

/// The agent's node: carrying `tag` under one of `hostnames`. Several can exist after a lost
/// state Secret: prefer online, then the newest.
pub fn find_node<'a>(nodes: &'a [Node], tag: &str, hostnames: &[String]) -> Option<&'a Node> {
    nodes
        .iter()
        .filter(|n| carries(n, tag) && hostnames.contains(&n.name))
        .max_by_key(|n| (n.online, n.id))
}

/// Nodes that carry `tag` but are not the agent's (another hostname).
pub fn foreign_nodes<'a>(nodes: &'a [Node], tag: &str, hostnames: &[String]) -> Vec<&'a Node> {
    nodes
        .iter()
        .filter(|n| carries(n, tag) && !hostnames.contains(&n.name))
        .collect()
}

/// `AgentReady=False/TagConflict` when nodes that are not the agent's carry its tag: they
/// would receive the resource's grants too. Nothing of them is touched, and without a node of
/// its own the agent gets no pre-auth key (returns whether minting is allowed).
pub fn tag_shared(c: &mut ConditionSet, tag: &str, foreign: &[&Node], own: bool) -> bool {
    if foreign.is_empty() {
        return true;
    }
    let list: Vec<String> = foreign
        .iter()
        .map(|n| format!("{} (id {}, hostname {:?})", n.given_name, n.id, n.name))
        .collect();
    c.fail(
        types::AGENT_READY,
        Problem::new(
            reasons::TAG_CONFLICT,
            format!(
                "{tag} is also carried by {}, which is not this agent's node (a device tagged by hand or another installation's agent): this resource's grants reach it too. The operator leaves it alone{}; remove the tag from it (headscale nodes tag -i <id> -t <its other tags>) or rename this resource",
                list.join(", "),
                if own { "" } else { " and mints no key for this agent" }
            ),
        ),
    );
    false
}

/// What the gather step knows of the agent's auth Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthSecret {
    /// Not read: this process removed it once the node existed, recently (see applied.rs).
    RemovedByUs,
    Absent,
    Present {
        key_id: Option<u64>,
        expires: Option<Timestamp>,
    },
}

/// What to do about the agent's pre-auth key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Nothing (the Secret is already gone, or a valid key waits in it).
    Keep,
    /// The node exists: expire the spent key (single use) and remove the Secret.
    Retire {
        key_id: Option<u64>,
        delete_secret: bool,
    },
    /// No node and no usable key: expire keys of the tag that no Secret holds (a crash
    /// between minting and writing leaves one), then mint one valid until `expires`.
    Mint {
        held: Option<u64>,
        expires: Timestamp,
    },
}

/// Where the agent's login stands after the key decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// The node exists: no key is needed (and none is kept).
    NodeExists,
    /// A valid key waits in the auth Secret (or is minted now) for the agent's first login.
    Waiting { expires: Timestamp },
    /// No agent is deployed yet, so no key is minted.
    NotDeployable,
}

/// Keeps exactly one valid single-use key while no node exists, none once it does. Never
/// mints while an unexpired key is pending, so a crash-looping agent cannot make it mint in
/// a loop; never mints for an agent that will not be deployed (the key would lie unused).
pub fn decide_key(
    node_exists: bool,
    deployable: bool,
    secret: &AuthSecret,
    now: Timestamp,
) -> (KeyAction, KeyState) {
    if node_exists {
        let action = match secret {
            AuthSecret::RemovedByUs => KeyAction::Keep,
            AuthSecret::Absent => KeyAction::Retire {
                key_id: None,
                delete_secret: false,
            },
            AuthSecret::Present { key_id, .. } => KeyAction::Retire {
                key_id: *key_id,
                delete_secret: true,
            },
        };
        return (action, KeyState::NodeExists);
    }
    if !deployable {
        return (KeyAction::Keep, KeyState::NotDeployable);
    }
    let held = match secret {
        AuthSecret::Present {
            expires: Some(expires),
            ..
        } if *expires > now + PENDING_KEY_MARGIN => {
            return (KeyAction::Keep, KeyState::Waiting { expires: *expires });
        }
        AuthSecret::Present { key_id, .. } => *key_id,
        AuthSecret::Absent | AuthSecret::RemovedByUs => None,
    };
    let expires = now + PRE_AUTH_KEY_LIFETIME;
    (
        KeyAction::Mint { held, expires },
        KeyState::Waiting { expires },
    )
}

fn auth_child(owner: &Owner) -> ChildRef {
    ChildRef {
        kind: <K8sSecret as k8s_openapi::Resource>::KIND.to_string(),
        namespace: owner.namespace.clone(),
        name: owner.names().auth_secret,
    }
}

/// What an auth Secret says about its key (`None`: it does not exist).
pub fn auth_secret_of(secret: Option<&K8sSecret>) -> AuthSecret {
    match secret {
        None => AuthSecret::Absent,
        Some(secret) => {
            let annotation = |key: &str| secret.annotations().get(key).cloned();
            AuthSecret::Present {
                key_id: annotation(KEY_ID_ANNOTATION).and_then(|id| id.parse().ok()),
                expires: annotation(KEY_EXPIRES_ANNOTATION).and_then(|e| e.parse().ok()),
            }
        }
    }
}

/// A planned mint checked against the auth Secret as read strongly right before it: a valid
/// key already there (minted by a reconcile the cached read did not see yet) means no second
/// key; otherwise mint, holding on to the key the fresh read names. Other actions stand.
pub fn confirm_mint(planned: &KeyAction, fresh: &AuthSecret, now: Timestamp) -> KeyAction {
    let KeyAction::Mint { expires, .. } = planned else {
        return planned.clone();
    };
    match decide_key(false, true, fresh, now).0 {
        KeyAction::Mint { held, .. } => KeyAction::Mint {
            held,
            expires: *expires,
        },
        _ => KeyAction::Keep,
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

/// Carries out a key decision. Returns whether a key was minted.
pub async fn act_on_key(
    ctx: &Context,
    headscale: &HeadscaleClient,
    owner: &Owner,
    tag: &str,
    action: &KeyAction,
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
            if let Some(id) = key_id
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
            let mut secret = tailnet_render::pod::auth_secret(owner, key.key.expose());
            secret.metadata.annotations = Some(BTreeMap::from([
                (KEY_ID_ANNOTATION.to_string(), key.id.to_string()),
                (KEY_EXPIRES_ANNOTATION.to_string(), expires.to_string()),
            ]));
            if let Err(e) = apply(&secrets, &name, &secret).await {
                // Do not leave a valid key behind that nobody holds.
                let _ = headscale.expire_pre_auth_key(key.id).await;
                return Err(e);
            }
            Ok(true)
        }
    }
}

/// Carries out a key decision for an agent of `object` when Headscale is usable, and
/// publishes `PreAuthKeyMinted` when a key was minted.
pub async fn act_on_agent_key<K>(
    ctx: &Context,
    object: &K,
    access: &Result<TailnetAccess, Problem>,
    owner: &Owner,
    tag: &str,
    action: &KeyAction,
) -> Result<(), ReconcileError>
where
    K: kube::Resource<DynamicType = ()>,
{
    let (Ok(access), false) = (access, *action == KeyAction::Keep) else {
        return Ok(());
    };
    let Ok(headscale) = &access.headscale else {
        return Ok(());
    };
    if act_on_key(ctx, headscale, owner, tag, action).await?
        && let KeyAction::Mint { expires, .. } = action
    {
        event(
            ctx,
            object,
            kube::runtime::events::EventType::Normal,
            "PreAuthKeyMinted",
            "Reconcile",
            format!("minted a single-use pre-auth key for {tag}, valid until {expires}"),
        )
        .await;
    }
    Ok(())
}

/// Keys of `tag` that could still register a node (unused, unexpired) other than `held`,
/// the one in the agent's auth Secret.
pub fn orphaned_keys(
    keys: &[PreAuthKey],
    tag: &str,
    held: Option<u64>,
    now: Timestamp,
) -> Vec<u64> {
    keys.iter()
        .filter(|k| k.acl_tags.iter().any(|t| t == tag))
        .filter(|k| !k.used && k.expiration.is_some_and(|e| e > now))
        .filter(|k| Some(k.id) != held)
        .map(|k| k.id)
        .collect()
}

/// Removes the agent's identity from Headscale: its nodes (the tag under one of `hostnames`,
/// see [`agent_hostnames`]) and any unexpired keys of its tag.
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
    for node in nodes
        .iter()
        .filter(|n| carries(n, tag) && hostnames.contains(&n.name))
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, tag: &str, online: bool) -> Node {
        Node {
            id,
            name: "agent".to_string(),
            tags: vec![tag.to_string()],
            online,
            ..Node::default()
        }
    }

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().expect("time")
    }

    #[test]
    fn orphaned_keys_are_the_valid_unheld_ones_of_the_tag() {
        let now = now();
        let key = |id, tag: &str, used, minutes: i64| PreAuthKey {
            id,
            used,
            acl_tags: vec![tag.to_string()],
            expiration: Some(now + SignedDuration::from_mins(minutes)),
            ..PreAuthKey::default()
        };
        let keys = vec![
            key(1, "tag:a", false, 60), // orphan
            key(2, "tag:a", true, 60),  // used
            key(3, "tag:a", false, -1), // expired
            key(4, "tag:b", false, 60), // another agent's
            key(5, "tag:a", false, 30), // held by the Secret
        ];
        assert_eq!(orphaned_keys(&keys, "tag:a", Some(5), now), vec![1]);
        assert_eq!(orphaned_keys(&keys, "tag:a", None, now), vec![1, 5]);
    }

    #[test]
    fn prefers_online_then_newest_node() {
        let nodes = vec![
            node(1, "tag:a", true),
            node(2, "tag:a", false),
            node(3, "tag:b", true),
        ];
        let agent = ["agent".to_string()];
        assert_eq!(find_node(&nodes, "tag:a", &agent).map(|n| n.id), Some(1));
        let nodes = vec![node(1, "tag:a", false), node(2, "tag:a", false)];
        assert_eq!(find_node(&nodes, "tag:a", &agent).map(|n| n.id), Some(2));
        assert!(find_node(&nodes, "tag:c", &agent).is_none());
    }

    #[test]
    fn a_node_with_the_tag_under_another_hostname_is_foreign() {
        let device = Node {
            name: "nas".to_string(),
            ..node(7, "tag:a", true)
        };
        let nodes = vec![device, node(2, "tag:a", false), node(3, "tag:b", true)];
        let agent = ["agent".to_string()];
        assert_eq!(find_node(&nodes, "tag:a", &agent).map(|n| n.id), Some(2));
        let foreign: Vec<u64> = foreign_nodes(&nodes, "tag:a", &agent)
            .iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(foreign, vec![7]);
        assert!(foreign_nodes(&nodes, "tag:b", &agent).is_empty());
        // Ingress: today's hostname (the tag's name) and the one of earlier releases.
        let names = AgentNames::new(AgentKind::Ingress, "api");
        assert_eq!(
            agent_hostnames(AgentKind::Ingress, &names, "tag:tno-ingress-team-a-api"),
            vec![
                "tno-ingress-team-a-api".to_string(),
                "tailnet-ingress-api".to_string()
            ]
        );
        assert_eq!(
            agent_hostnames(
                AgentKind::Egress,
                &AgentNames::new(AgentKind::Egress, "site"),
                "tag:x"
            ),
            vec!["tailnet-egress-site".to_string()]
        );
    }

    /// The gather step's cached read saw no Secret (or an old one), but the previous
    /// reconcile already wrote a valid key: the strong read before minting stops a second
    /// valid key; a fresh read that also shows nothing usable mints, holding the key it names.
    #[test]
    fn a_mint_is_confirmed_against_a_strong_read() {
        let now = now();
        let planned = KeyAction::Mint {
            held: None,
            expires: now + PRE_AUTH_KEY_LIFETIME,
        };
        let secret = |id, expires| {
            let mut s = K8sSecret::default();
            s.metadata.annotations = Some(BTreeMap::from([
                (KEY_ID_ANNOTATION.to_string(), format!("{id}")),
                (KEY_EXPIRES_ANNOTATION.to_string(), format!("{expires}")),
            ]));
            s
        };
        let valid = secret(8, now + SignedDuration::from_mins(59));
        assert_eq!(
            confirm_mint(&planned, &auth_secret_of(Some(&valid)), now),
            KeyAction::Keep,
            "a valid key minted meanwhile: no second key"
        );
        let nearly = secret(8, now + SignedDuration::from_mins(1));
        assert_eq!(
            confirm_mint(&planned, &auth_secret_of(Some(&nearly)), now),
            KeyAction::Mint {
                held: Some(8),
                expires: now + PRE_AUTH_KEY_LIFETIME
            }
        );
        assert_eq!(
            confirm_mint(&planned, &auth_secret_of(None), now),
            planned,
            "still absent: mint"
        );
        assert_eq!(
            confirm_mint(&KeyAction::Keep, &AuthSecret::Absent, now),
            KeyAction::Keep
        );
    }

    #[test]
    fn key_decisions() {
        let now = now();
        let valid = AuthSecret::Present {
            key_id: Some(7),
            expires: Some(now + SignedDuration::from_mins(30)),
        };
        let nearly_expired = AuthSecret::Present {
            key_id: Some(7),
            expires: Some(now + SignedDuration::from_mins(1)),
        };
        let minted = now + PRE_AUTH_KEY_LIFETIME;
        let table = [
            // (node exists, deployable, secret) → action
            (true, true, AuthSecret::RemovedByUs, KeyAction::Keep),
            (
                true,
                false,
                AuthSecret::Absent,
                KeyAction::Retire {
                    key_id: None,
                    delete_secret: false,
                },
            ),
            (
                true,
                true,
                valid.clone(),
                KeyAction::Retire {
                    key_id: Some(7),
                    delete_secret: true,
                },
            ),
            (false, false, AuthSecret::Absent, KeyAction::Keep),
            (false, true, valid.clone(), KeyAction::Keep),
            (
                false,
                true,
                nearly_expired,
                KeyAction::Mint {
                    held: Some(7),
                    expires: minted,
                },
            ),
            (
                false,
                true,
                AuthSecret::Absent,
                KeyAction::Mint {
                    held: None,
                    expires: minted,
                },
            ),
            (
                false,
                true,
                AuthSecret::RemovedByUs,
                KeyAction::Mint {
                    held: None,
                    expires: minted,
                },
            ),
        ];
        for (node_exists, deployable, secret, expected) in table {
            let (action, _) = decide_key(node_exists, deployable, &secret, now);
            assert_eq!(
                action, expected,
                "node {node_exists}, deployable {deployable}, {secret:?}"
            );
        }
    }
}
