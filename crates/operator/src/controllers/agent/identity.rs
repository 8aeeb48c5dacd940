//! An agent's tailnet identity, decided (pure): the nodes carrying its tag under one of its
//! hostnames, nodes that carry the tag but are someone else's, and the single-use pre-auth key
//! in its auth Secret. Reading the auth Secret, minting and expiring keys and forgetting the
//! identity in Headscale are `keys.rs`.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Secret as K8sSecret;
use kube::ResourceExt;
use tailnet_headscale::{Node, PreAuthKey};

use super::super::status::{ConditionSet, Problem};
use super::observation::{AuthSecret, NodeList};
use tailnet_api::conditions::{reasons, types};

/// Annotations on the auth Secret: which key is in it and until when it is valid (the key
/// itself is never logged or put anywhere else).
pub const KEY_ID_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-id";
pub const KEY_EXPIRES_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-expires";
/// How long a minted pre-auth key is valid: long enough for an image pull and a crash loop,
/// short enough to be useless if it leaks.
pub const PRE_AUTH_KEY_LIFETIME: SignedDuration = SignedDuration::from_mins(60);
/// A pending key that expires sooner than this is replaced rather than waited for.
const PENDING_KEY_MARGIN: SignedDuration = SignedDuration::from_mins(2);

/// An agent's identity as decided for one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    pub tag: String,
    /// The tailnet hostnames its nodes may have (the kind's `hostnames`): an identity is the
    /// tag **and** one of these, so a node that carries the tag under another hostname (a
    /// device tagged by hand, another installation's agent) is never taken for the agent's,
    /// nor deleted with it.
    pub hostnames: Vec<String>,
    /// The agent's own nodes, the one to report first (online, then newest). Several exist
    /// after a lost state Secret (and would with several pods).
    pub nodes: Vec<Node>,
    /// Nodes that carry the tag under another hostname.
    pub foreign: Vec<Node>,
    pub key: KeyAction,
    pub key_state: KeyState,
}

impl Identity {
    /// The node the status reports.
    pub fn node(&self) -> Option<&Node> {
        self.nodes.first()
    }
}

/// Decides the identity of an agent with `tag` and `hostnames` from Headscale's node list
/// and its auth Secret. `deployable`: the agent is (or stays) deployed; no key is minted for
/// an agent that is not, nor while someone else's node carries the tag, nor without the node
/// list (the node may well exist).
pub fn decide(
    tag: &str,
    hostnames: Vec<String>,
    nodes: &NodeList,
    secret: &AuthSecret,
    deployable: bool,
    now: Timestamp,
) -> Identity {
    let listed: &[Node] = nodes.as_deref().map_or(&[], |n| n);
    let own: Vec<Node> = own_nodes(listed, tag, &hostnames)
        .into_iter()
        .cloned()
        .collect();
    let foreign: Vec<Node> = foreign_nodes(listed, tag, &hostnames)
        .into_iter()
        .cloned()
        .collect();
    let (key, key_state) = match nodes {
        Ok(_) => decide_key(
            !own.is_empty(),
            deployable && foreign.is_empty(),
            secret,
            now,
        ),
        Err(_) => (KeyAction::Keep, KeyState::NodeExists),
    };
    Identity {
        tag: tag.to_string(),
        hostnames,
        nodes: own,
        foreign,
        key,
        key_state,
    }
}

fn carries(node: &Node, tag: &str) -> bool {
    node.tags.iter().any(|t| t == tag)
}

/// The agent's nodes: carrying `tag` under one of `hostnames`, online first, then the newest.
pub fn own_nodes<'a>(nodes: &'a [Node], tag: &str, hostnames: &[String]) -> Vec<&'a Node> {
    let mut own: Vec<&Node> = nodes
        .iter()
        .filter(|n| carries(n, tag) && hostnames.contains(&n.name))
        .collect();
    own.sort_by_key(|n| std::cmp::Reverse((n.online, n.id)));
    own
}

/// The agent's node the status reports (see [`own_nodes`]).
#[cfg(test)]
pub fn find_node<'a>(nodes: &'a [Node], tag: &str, hostnames: &[String]) -> Option<&'a Node> {
    own_nodes(nodes, tag, hostnames).into_iter().next()
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
    /// A contributor without a Headscale key: the owner has not written a usable key for the
    /// tag into the feed yet.
    AwaitingOwner,
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

/// The identity of a contributor's agent without a Headscale key: a planned mint takes the
/// owner's key for the tag (`owner_key`: until when it is valid) when it is valid for long
/// enough, else waits for it (nothing to mint here); a spent key is retired by deleting the
/// auth Secret only (the owner expires what is unused). Other decisions stand.
pub fn from_owner(
    mut identity: Identity,
    owner_key: Option<Timestamp>,
    now: Timestamp,
) -> Identity {
    match identity.key {
        KeyAction::Mint { held, .. } => match owner_key {
            Some(expires) if expires > now + PENDING_KEY_MARGIN => {
                identity.key = KeyAction::Mint { held, expires };
                identity.key_state = KeyState::Waiting { expires };
            }
            _ => {
                identity.key = KeyAction::Keep;
                identity.key_state = KeyState::AwaitingOwner;
            }
        },
        KeyAction::Retire { delete_secret, .. } => {
            identity.key = KeyAction::Retire {
                key_id: None,
                delete_secret,
            };
        }
        KeyAction::Keep => {}
    }
    identity
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::decide::Decide;
    use super::*;
    use crate::controllers::egress::Egress;
    use crate::controllers::ingress::Ingress;
    use tailnet_api::naming::{AgentKind, AgentNames};

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
            Ingress::hostnames(&names, "tag:tno-ingress-team-a-api"),
            vec![
                "tno-ingress-team-a-api".to_string(),
                "tailnet-ingress-api".to_string()
            ]
        );
        assert_eq!(
            Egress::hostnames(&AgentNames::new(AgentKind::Egress, "site"), "tag:x"),
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

    /// Without a Headscale key the agent takes the owner's key for its tag, or waits for it
    /// (`AwaitingOwner`); a spent one is retired without a Headscale call.
    #[test]
    fn a_keyless_agent_takes_the_owners_key_or_waits() {
        let now = now();
        let nodes: NodeList = Ok(std::sync::Arc::new(Vec::new()));
        let fresh = || {
            decide(
                "tag:cob-a",
                vec!["agent".into()],
                &nodes,
                &AuthSecret::Absent,
                true,
                now,
            )
        };
        let owner = now + SignedDuration::from_mins(50);
        let taken = from_owner(fresh(), Some(owner), now);
        assert_eq!(
            taken.key,
            KeyAction::Mint {
                held: None,
                expires: owner
            }
        );
        assert_eq!(taken.key_state, KeyState::Waiting { expires: owner });
        for missing in [None, Some(now + SignedDuration::from_mins(1))] {
            let waiting = from_owner(fresh(), missing, now);
            assert_eq!(waiting.key, KeyAction::Keep);
            assert_eq!(waiting.key_state, KeyState::AwaitingOwner);
        }
        let with_node: NodeList = Ok(std::sync::Arc::new(vec![node(1, "tag:cob-a", true)]));
        let present = AuthSecret::Present {
            key_id: Some(4),
            expires: Some(owner),
        };
        let spent = decide(
            "tag:cob-a",
            vec!["agent".into()],
            &with_node,
            &present,
            true,
            now,
        );
        assert_eq!(
            from_owner(spent, None, now).key,
            KeyAction::Retire {
                key_id: None,
                delete_secret: true
            }
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
