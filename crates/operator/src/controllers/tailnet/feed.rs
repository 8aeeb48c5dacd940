//! What the owner writes into a keyless contributor's cluster, decided (pure): the node
//! facts its conditions need, the part of the live policy that concerns it, and its agents'
//! pre-auth keys (which to keep, which to mint, which to expire). Reading and writing the
//! contributor's Secret and calling Headscale are `deliver.rs`; the contributor's side
//! (reading the feed instead of Headscale) is `access.rs` and the agent controllers.
//!
//! Keys: one single-use, tagged key per tag of the contributor's accepted fragment that is
//! live in the policy (its tag owner is there) and has no node yet; never for a tag outside
//! its prefix. A key the feed holds is kept while Headscale lists it unused and valid for a
//! while; every other unused, valid key of a tag under the prefix is expired (a tag that
//! left the fragment, a node that registered meanwhile, a key lost between minting and
//! writing). Both lists are bounded per reconcile.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value};
use tailnet_api::owner_feed::{
    FEED_API_VERSION, FEED_KIND, FeedKey, FeedNode, MAX_FEED_NODES, OwnerFeed,
};
use tailnet_api::tailnet::Contributor;
use tailnet_headscale::{Node, PreAuthKey};
use tailnet_render::fragment::route_within_limits;

use super::super::agent::identity::PRE_AUTH_KEY_LIFETIME;

/// Most keys minted for one contributor in one reconcile.
pub const MAX_MINTS: usize = 20;
/// Most keys expired for one contributor in one reconcile.
pub const MAX_EXPIRES: usize = 50;
/// A held key that expires sooner than this is replaced (the contributor's agent may still
/// be pulling its image).
const KEEP_MARGIN: SignedDuration = SignedDuration::from_mins(10);

/// What the owner knows when it decides one contributor's feed.
#[derive(Clone, Copy, Debug)]
pub struct FeedInputs<'a> {
    pub contributor: &'a Contributor,
    /// The owner's `policy.routeApprovers`.
    pub route_approvers: &'a [String],
    pub headscale_version: &'a str,
    pub nodes: &'a [Node],
    /// The policy live after this reconcile (`None`: not read).
    pub live_policy: Option<&'a str>,
    /// The contributor's tags the owner accepted (its merged contribution).
    pub accepted_tags: &'a [String],
    /// Headscale's pre-auth keys (`None`: not listed: no key is minted or expired, the
    /// feed's keys stay as they are).
    pub keys: Option<&'a [PreAuthKey]>,
    /// The feed now in the contributor's Secret (`None`: empty or unparsable).
    pub current: Option<&'a OwnerFeed>,
    /// How long the owner vouches for a feed ([`lease`]).
    pub lease: SignedDuration,
    pub now: Timestamp,
}

/// How long a feed is valid: ten poll intervals, at least a minute. It is rewritten once
/// less than half of it is left, so a contributor the owner stops writing to (removed from
/// the list, or unreachable) stops trusting its facts within one lease.
pub fn lease(poll: std::time::Duration) -> SignedDuration {
    let ten = SignedDuration::try_from(poll.saturating_mul(10)).unwrap_or(SignedDuration::MAX);
    ten.max(SignedDuration::from_mins(1))
}

/// The current feed's `validUntil` while more than half the lease is left (so an unchanged
/// feed is not rewritten), else a new one.
fn valid_until(current: Option<&OwnerFeed>, lease: SignedDuration, now: Timestamp) -> String {
    let half = lease / 2;
    current
        .map(|f| f.valid_until.as_str())
        .filter(|v| {
            v.parse::<Timestamp>()
                .is_ok_and(|t| t > now + half && t <= now + lease)
        })
        .map_or_else(|| rfc3339(&(now + lease)), str::to_string)
}

/// The feed to write once `mint` is done, and the keys to expire first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedPlan {
    /// The feed with the keys that stay (minted keys are added by [`with_minted`]).
    pub feed: OwnerFeed,
    /// Tags to mint a key for (each valid until `expires`).
    pub mint: Vec<String>,
    pub expires: Timestamp,
    /// Unused, valid keys of tags under the prefix that nobody should hold.
    pub expire: Vec<u64>,
}

/// `tag:<prefix>-`.
fn tag_prefix(prefix: &str) -> String {
    format!("tag:{prefix}-")
}

fn under(tag: &str, prefix: &str) -> bool {
    tag.strip_prefix(&tag_prefix(prefix))
        .is_some_and(|rest| !rest.is_empty())
}

/// Decides one contributor's feed.
pub fn plan(inputs: &FeedInputs<'_>) -> FeedPlan {
    let prefix = &inputs.contributor.tag_prefix;
    let nodes = nodes_for(inputs.contributor, inputs.route_approvers, inputs.nodes);
    let live_policy = inputs
        .live_policy
        .and_then(|live| policy_view(live, inputs.contributor));
    let live_tags = live_policy
        .as_deref()
        .map(live_tag_owners)
        .unwrap_or_default();
    let expires = inputs.now + PRE_AUTH_KEY_LIFETIME;
    let feed = OwnerFeed {
        api_version: FEED_API_VERSION.into(),
        kind: FEED_KIND.into(),
        headscale_version: inputs.headscale_version.to_string(),
        tag_prefix: prefix.clone(),
        valid_until: valid_until(inputs.current, inputs.lease, inputs.now),
        nodes,
        live_policy,
        keys: Vec::new(),
    };
    let current_keys: &[FeedKey] = inputs.current.map_or(&[], |f| &f.keys);
    let Some(listed) = inputs.keys else {
        // Without Headscale's key list nothing is known about the held keys: they stay.
        return FeedPlan {
            feed: OwnerFeed {
                keys: current_keys
                    .iter()
                    .filter(|k| under(&k.tag, prefix))
                    .cloned()
                    .collect(),
                ..feed
            },
            mint: Vec::new(),
            expires,
            expire: Vec::new(),
        };
    };
    let with_node: BTreeSet<&str> = inputs
        .nodes
        .iter()
        .flat_map(|n| n.tags.iter().map(String::as_str))
        .collect();
    let wanted: Vec<&String> = inputs
        .accepted_tags
        .iter()
        .filter(|t| under(t, prefix) && live_tags.contains(t.as_str()))
        .filter(|t| !with_node.contains(t.as_str()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut keep = Vec::new();
    let mut mint = Vec::new();
    for tag in wanted {
        match usable_key(current_keys, listed, tag, inputs.now) {
            Some(key) => keep.push(key.clone()),
            None if mint.len() < MAX_MINTS => mint.push(tag.clone()),
            None => {}
        }
    }
    let kept: BTreeSet<u64> = keep.iter().map(|k| k.id).collect();
    let expire = listed
        .iter()
        .filter(|k| k.acl_tags.iter().any(|t| under(t, prefix)))
        .filter(|k| !k.used && k.expiration.is_some_and(|e| e > inputs.now))
        .filter(|k| !kept.contains(&k.id))
        .map(|k| k.id)
        .take(MAX_EXPIRES)
        .collect();
    FeedPlan {
        feed: OwnerFeed { keys: keep, ..feed },
        mint,
        expires,
        expire,
    }
}

/// The feed's key for `tag` when Headscale lists it as that tag's only tag, unused and valid
/// for at least [`KEEP_MARGIN`].
fn usable_key<'k>(
    held: &'k [FeedKey],
    listed: &[PreAuthKey],
    tag: &str,
    now: Timestamp,
) -> Option<&'k FeedKey> {
    held.iter().filter(|k| k.tag == tag).find(|k| {
        listed.iter().any(|l| {
            l.id == k.id
                && l.acl_tags == [tag.to_string()]
                && !l.used
                && !l.reusable
                && l.expiration.is_some_and(|e| e > now + KEEP_MARGIN)
        })
    })
}

/// The feed with the keys minted now.
pub fn with_minted(mut feed: OwnerFeed, minted: Vec<FeedKey>) -> OwnerFeed {
    feed.keys.extend(minted);
    feed.keys.sort_by(|a, b| a.tag.cmp(&b.tag));
    feed
}

/// A key as the feed carries it.
pub fn feed_key(tag: &str, key: &PreAuthKey, expires: Timestamp) -> FeedKey {
    FeedKey {
        tag: tag.to_string(),
        id: key.id,
        key: key.key.expose().to_string(),
        expires: expires.to_string(),
    }
}

/// The summary in `status.contributors[].keys` (never a key).
pub fn summary(secret: &str, feed: &OwnerFeed) -> String {
    let waiting: Vec<&str> = feed.keys.iter().map(|k| k.tag.as_str()).collect();
    format!(
        "Secret {secret}: {} nodes, {}",
        feed.nodes.len(),
        if waiting.is_empty() {
            "no pre-auth key waiting".to_string()
        } else {
            format!("pre-auth keys waiting for {}", waiting.join(", "))
        }
    )
}

fn limit_nets(contributor: &Contributor) -> Vec<IpNet> {
    contributor
        .limits
        .egress_destinations
        .iter()
        .filter_map(|l| {
            l.parse::<IpNet>()
                .ok()
                .or_else(|| l.parse::<IpAddr>().ok().map(IpNet::from))
        })
        .collect()
}

fn rfc3339(t: &Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The nodes the contributor's conditions need, and no more: its own nodes (a tag under its
/// prefix) in full; any other node only with its addresses inside `egressDestinations`
/// (tailnet-node targets), and route approvers (the owner's `routeApprovers`) only with their
/// routes inside them (subnet targets) — never an exit route. At most [`MAX_FEED_NODES`].
pub fn nodes_for(contributor: &Contributor, approvers: &[String], nodes: &[Node]) -> Vec<FeedNode> {
    let prefix = &contributor.tag_prefix;
    let nets = limit_nets(contributor);
    let routes_inside = |routes: &[String]| -> Vec<String> {
        routes
            .iter()
            .filter(|r| {
                r.parse::<IpNet>().is_ok_and(|net| {
                    net.prefix_len() > 0
                        && route_within_limits(&net, &contributor.limits.egress_destinations)
                })
            })
            .cloned()
            .collect()
    };
    let mut out: Vec<FeedNode> = nodes
        .iter()
        .filter_map(|n| {
            let base = FeedNode {
                id: n.id,
                name: n.given_name.clone(),
                given_name: n.given_name.clone(),
                online: n.online,
                last_seen: n
                    .last_seen
                    .as_ref()
                    .filter(|_| !n.online)
                    .filter(|t| t.as_second() > 0)
                    .map(rfc3339),
                expiry: n.expiry.as_ref().filter(|t| t.as_second() > 0).map(rfc3339),
                ..FeedNode::default()
            };
            if n.tags.iter().any(|t| under(t, prefix)) {
                return Some(FeedNode {
                    name: n.name.clone(),
                    tags: n.tags.clone(),
                    ip_addresses: n.ip_addresses.clone(),
                    available_routes: routes_inside(&n.available_routes),
                    approved_routes: routes_inside(&n.approved_routes),
                    ..base
                });
            }
            let ips: Vec<String> = n
                .ip_addresses
                .iter()
                .filter(|ip| {
                    ip.parse::<IpAddr>()
                        .is_ok_and(|ip| nets.iter().any(|net| net.contains(&ip)))
                })
                .cloned()
                .collect();
            let approver_tags: Vec<String> = n
                .tags
                .iter()
                .filter(|t| approvers.contains(t))
                .cloned()
                .collect();
            let available = if approver_tags.is_empty() {
                Vec::new()
            } else {
                routes_inside(&n.available_routes)
            };
            if ips.is_empty() && available.is_empty() {
                return None;
            }
            let approved = routes_inside(&n.approved_routes)
                .into_iter()
                .filter(|r| available.contains(r))
                .collect();
            Some(FeedNode {
                tags: if available.is_empty() {
                    Vec::new()
                } else {
                    approver_tags
                },
                ip_addresses: ips,
                available_routes: available,
                approved_routes: approved,
                ..base
            })
        })
        .collect();
    out.sort_by_key(|n| n.id);
    out.truncate(MAX_FEED_NODES);
    out
}

/// The part of the live policy that concerns the contributor: the tag owners of its tags,
/// the grants that name one of its tags, and the auto-approved routes inside its limits
/// (what its `FragmentLive` and its resources' `PolicyEffective` compare with). `None` when
/// the live policy does not parse.
pub fn policy_view(live: &str, contributor: &Contributor) -> Option<String> {
    let parsed = tailnet_policy::parse_base(live).ok()?;
    let doc = parsed.value();
    let prefix = &contributor.tag_prefix;
    let names_own = |v: &Value| {
        v.as_array().is_some_and(|a| {
            a.iter()
                .any(|s| s.as_str().is_some_and(|s| under(s, prefix)))
        })
    };
    let tag_owners: Map<String, Value> = doc["tagOwners"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(tag, _)| under(tag, prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let grants: Vec<Value> = doc["grants"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|g| names_own(&g["src"]) || names_own(&g["dst"]))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let routes: BTreeMap<String, Value> = doc["autoApprovers"]["routes"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(route, _)| {
                    route.parse::<IpNet>().is_ok_and(|net| {
                        net.prefix_len() > 0
                            && route_within_limits(&net, &contributor.limits.egress_destinations)
                    })
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let view = serde_json::json!({
        "tagOwners": tag_owners,
        "grants": grants,
        "autoApprovers": {"routes": routes},
    });
    serde_json::to_string_pretty(&view).ok()
}

/// The tags with an owner in a policy view.
fn live_tag_owners(view: &str) -> BTreeSet<String> {
    serde_json::from_str::<Value>(view)
        .ok()
        .and_then(|v| {
            v["tagOwners"]
                .as_object()
                .map(|o| o.keys().cloned().collect())
        })
        .unwrap_or_default()
}

/// A feed node as the agent controllers read Headscale's (the contributor's side).
pub fn node_of(node: &FeedNode) -> Node {
    let time = |t: &Option<String>| t.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
    Node {
        id: node.id,
        name: node.name.clone(),
        given_name: node.given_name.clone(),
        ip_addresses: node.ip_addresses.clone(),
        online: node.online,
        last_seen: time(&node.last_seen),
        expiry: time(&node.expiry),
        tags: node.tags.clone(),
        available_routes: node.available_routes.clone(),
        approved_routes: node.approved_routes.clone(),
        subnet_routes: node
            .approved_routes
            .iter()
            .filter(|r| node.available_routes.contains(r))
            .cloned()
            .collect(),
        ..Node::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::tailnet::{ContributorLimits, FragmentSource};
    use tailnet_headscale::Secret;

    fn contributor() -> Contributor {
        Contributor {
            name: "cosmos".into(),
            tag_prefix: "cob".into(),
            source: FragmentSource::default(),
            limits: ContributorLimits {
                egress_destinations: vec!["192.0.2.0/24".into(), "db.site.internal".into()],
                ..ContributorLimits::default()
            },
            keys: None,
        }
    }

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().expect("time")
    }

    fn node(id: u64, name: &str, tags: &[&str], ips: &[&str]) -> Node {
        Node {
            id,
            name: name.into(),
            given_name: name.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ip_addresses: ips.iter().map(|t| t.to_string()).collect(),
            online: true,
            ..Node::default()
        }
    }

    fn key(id: u64, tag: &str, used: bool, minutes: i64) -> PreAuthKey {
        PreAuthKey {
            id,
            key: Secret::new(format!("key-{id}")),
            used,
            acl_tags: vec![tag.into()],
            expiration: Some(now() + SignedDuration::from_mins(minutes)),
            ..PreAuthKey::default()
        }
    }

    const LIVE: &str = r#"{
        "groups": {"group:ops": ["a@"]},
        "tagOwners": {"tag:hyd-egress-a": ["group:ops"], "tag:cob-egress-b": ["group:ops"],
                      "tag:cob-ingress-ns-c": ["group:ops"]},
        "grants": [
            {"src": ["tag:hyd-egress-a"], "dst": ["10.0.0.1"], "ip": ["tcp:22"]},
            {"src": ["tag:cob-egress-b"], "dst": ["192.0.2.10"], "ip": ["tcp:5432"]},
            {"src": ["group:ops"], "dst": ["tag:cob-ingress-ns-c"], "ip": ["tcp:443"]}
        ],
        "autoApprovers": {"routes": {"10.0.0.0/24": ["tag:router"], "192.0.2.0/24": ["tag:router"]}}
    }"#;

    fn inputs<'a>(
        nodes: &'a [Node],
        keys: Option<&'a [PreAuthKey]>,
        current: Option<&'a OwnerFeed>,
        accepted: &'a [String],
        c: &'a Contributor,
    ) -> FeedInputs<'a> {
        FeedInputs {
            contributor: c,
            route_approvers: &[],
            headscale_version: "0.29.3",
            nodes,
            live_policy: Some(LIVE),
            accepted_tags: accepted,
            keys,
            current,
            lease: lease(std::time::Duration::from_secs(2)),
            now: now(),
        }
    }

    #[test]
    fn the_lease_is_kept_while_more_than_half_is_left() {
        let c = contributor();
        assert_eq!(
            lease(std::time::Duration::from_secs(2)),
            SignedDuration::from_mins(1)
        );
        assert_eq!(
            lease(std::time::Duration::from_secs(30)),
            SignedDuration::from_mins(5)
        );
        let first = plan(&inputs(&[], Some(&[]), None, &[], &c)).feed;
        assert_eq!(first.valid_until, "2026-01-01T00:01:00Z");
        let later = |seconds: i64| {
            plan(&FeedInputs {
                now: now() + SignedDuration::from_secs(seconds),
                ..inputs(&[], Some(&[]), Some(&first), &[], &c)
            })
            .feed
        };
        assert_eq!(later(20), first, "unchanged: not rewritten");
        assert_eq!(later(40).valid_until, "2026-01-01T00:01:40Z");
    }

    #[test]
    fn the_policy_view_holds_only_what_concerns_the_contributor() {
        let view = policy_view(LIVE, &contributor()).expect("view");
        assert!(!view.contains("hyd-egress-a"), "{view}");
        assert!(!view.contains("10.0.0"), "{view}");
        assert!(!view.contains("group:ops\": ["), "{view}");
        let fragment_grant = tailnet_api::fragment::FragmentGrant {
            owner: "TailnetEgress/x/b".into(),
            src: vec!["tag:cob-egress-b".into()],
            dst: vec!["192.0.2.10".into()],
            ip: vec!["tcp:5432".into()],
        };
        let fragment = tailnet_api::fragment::PolicyFragment {
            tags: vec!["tag:cob-egress-b".into(), "tag:cob-ingress-ns-c".into()],
            grants: vec![fragment_grant],
            routes: vec![tailnet_api::fragment::FragmentRoute {
                route: "192.0.2.0/24".into(),
                approvers: vec!["tag:router".into()],
            }],
            ..Default::default()
        };
        assert_eq!(
            super::super::contributions::not_live(&fragment, &view),
            Vec::<String>::new(),
            "the contributor's entries are all in its view"
        );
    }

    #[test]
    fn nodes_are_the_contributors_own_and_what_its_limits_reach() {
        let mut router = node(3, "router", &["tag:router"], &["100.64.0.3"]);
        router.available_routes = vec![
            "192.0.2.0/24".into(),
            "10.0.0.0/8".into(),
            "0.0.0.0/0".into(),
        ];
        router.approved_routes = vec!["192.0.2.0/24".into(), "10.0.0.0/8".into()];
        let nodes = vec![
            node(
                1,
                "tailnet-egress-b",
                &["tag:cob-egress-b"],
                &["100.64.0.1"],
            ),
            node(2, "owner-agent", &["tag:hyd-egress-a"], &["100.64.0.2"]),
            router,
            node(4, "nas", &[], &["192.0.2.44", "100.64.0.4"]),
        ];
        let fed = nodes_for(&contributor(), &["tag:router".to_string()], &nodes);
        let ids: Vec<u64> = fed.iter().map(|n| n.id).collect();
        assert_eq!(ids, vec![1, 3, 4], "the owner's agent is not shown");
        assert_eq!(fed[0].name, "tailnet-egress-b");
        assert_eq!(fed[0].ip_addresses, vec!["100.64.0.1"]);
        assert_eq!(
            fed[1].available_routes,
            vec!["192.0.2.0/24"],
            "no exit route, nothing outside the limits"
        );
        assert_eq!(fed[1].approved_routes, vec!["192.0.2.0/24"]);
        assert!(fed[1].ip_addresses.is_empty());
        assert_eq!(fed[2].ip_addresses, vec!["192.0.2.44"]);
        assert!(fed[2].tags.is_empty());
        let back = node_of(&fed[1]);
        assert_eq!(back.subnet_routes, vec!["192.0.2.0/24"]);
    }

    #[test]
    fn keys_only_for_live_accepted_tags_under_the_prefix_without_a_node() {
        let c = contributor();
        let accepted: Vec<String> = vec![
            "tag:cob-egress-b".into(),
            "tag:cob-ingress-ns-c".into(),
            "tag:cob-egress-notlive".into(),
            "tag:hyd-egress-a".into(),
        ];
        let listed = vec![key(9, "tag:cob-egress-gone", false, 30)];
        let p = plan(&inputs(&[], Some(&listed), None, &accepted, &c));
        assert_eq!(p.mint, vec!["tag:cob-egress-b", "tag:cob-ingress-ns-c"]);
        assert_eq!(p.expire, vec![9], "a key of a tag that left is expired");
        assert_eq!(p.expires, now() + PRE_AUTH_KEY_LIFETIME);
        // A node exists for b: no key for it; its unused key goes.
        let nodes = vec![node(1, "x", &["tag:cob-egress-b"], &["100.64.0.1"])];
        let listed = vec![key(5, "tag:cob-egress-b", false, 30)];
        let p = plan(&inputs(&nodes, Some(&listed), None, &accepted, &c));
        assert_eq!(p.mint, vec!["tag:cob-ingress-ns-c"]);
        assert_eq!(p.expire, vec![5]);
    }

    #[test]
    fn a_held_key_is_kept_while_headscale_lists_it_unused_and_valid() {
        let c = contributor();
        let accepted = vec!["tag:cob-egress-b".to_string()];
        let held = OwnerFeed {
            keys: vec![FeedKey {
                tag: "tag:cob-egress-b".into(),
                id: 5,
                key: "key-5".into(),
                expires: "x".into(),
            }],
            ..OwnerFeed::default()
        };
        let listed = vec![
            key(5, "tag:cob-egress-b", false, 30),
            key(6, "tag:cob-egress-b", false, 30),
        ];
        let p = plan(&inputs(&[], Some(&listed), Some(&held), &accepted, &c));
        assert!(p.mint.is_empty());
        assert_eq!(p.feed.keys, held.keys);
        assert_eq!(p.expire, vec![6], "a second valid key nobody holds");
        // Used, nearly expired, or a forged id: a new key.
        for listed in [
            vec![key(5, "tag:cob-egress-b", true, 30)],
            vec![key(5, "tag:cob-egress-b", false, 5)],
            vec![key(5, "tag:cob-egress-other", false, 30)],
        ] {
            let p = plan(&inputs(&[], Some(&listed), Some(&held), &accepted, &c));
            assert_eq!(p.mint, vec!["tag:cob-egress-b"], "{listed:?}");
            assert!(p.feed.keys.is_empty());
        }
        // Without Headscale's key list nothing is minted or expired; the held key stays.
        let p = plan(&inputs(&[], None, Some(&held), &accepted, &c));
        assert!(p.mint.is_empty() && p.expire.is_empty());
        assert_eq!(p.feed.keys, held.keys);
    }

    #[test]
    fn mints_and_expiries_are_bounded() {
        let c = contributor();
        let accepted: Vec<String> = (0..100).map(|i| format!("tag:cob-egress-{i}")).collect();
        let tag_owners: Map<String, Value> = accepted
            .iter()
            .map(|t| (t.clone(), serde_json::json!(["group:ops"])))
            .collect();
        let live = serde_json::json!({"tagOwners": tag_owners}).to_string();
        let listed: Vec<PreAuthKey> = (0..100).map(|i| key(i, "tag:cob-old", false, 30)).collect();
        let p = plan(&FeedInputs {
            live_policy: Some(&live),
            ..inputs(&[], Some(&listed), None, &accepted, &c)
        });
        assert_eq!(p.mint.len(), MAX_MINTS);
        assert_eq!(p.expire.len(), MAX_EXPIRES);
    }

    #[test]
    fn the_summary_names_tags_never_keys() {
        let feed = with_minted(
            OwnerFeed::default(),
            vec![feed_key(
                "tag:cob-egress-b",
                &key(5, "tag:cob-egress-b", false, 60),
                now(),
            )],
        );
        let text = summary("ns/cosmos-owner-keys", &feed);
        assert!(
            text.contains("tag:cob-egress-b") && !text.contains("key-5"),
            "{text}"
        );
    }
}
