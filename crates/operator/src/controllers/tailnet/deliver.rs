//! The owner's delivery to keyless contributors (I/O): for each contributor with
//! `keys`, read its Secret through the kubeconfig (size-capped), let `feed.rs` decide, expire
//! and mint pre-auth keys in Headscale, and write the feed back when it changed. Keys never
//! reach a log, an Event, a condition or a metric: the status gets `feed::summary`.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret as K8sSecret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tailnet_api::Tailnet;
use tailnet_api::owner_feed::{FEED_KEY, MAX_FEED_BYTES, OwnerFeed, parse_feed};
use tailnet_api::tailnet::{Contributor, KeysDelivery, TailnetStatus};
use tailnet_headscale::{Client as HeadscaleClient, CreatePreAuthKey};

use super::super::context::Context;
use super::decide::{PolicyOutcome, TailnetPlan, live_after};
use super::feed::{self, FeedInputs};
use super::gather::{get_capped, kubeconfig_client};

/// What was delivered to each contributor with `keys` (its `status.contributors[].keys`).
pub type Delivered = BTreeMap<String, String>;

/// Delivers every keyless contributor's feed; the summary per contributor.
pub async fn deliver(
    ctx: &Context,
    tailnet: &Tailnet,
    client: Option<&HeadscaleClient>,
    plan: &TailnetPlan,
    outcome: Option<&PolicyOutcome>,
    version: Option<&str>,
) -> Delivered {
    let mut out = Delivered::new();
    for contributor in plan.role.contributors() {
        let Some(keys) = &contributor.keys else {
            continue;
        };
        let summary = match (client, version) {
            (Some(client), Some(version)) => {
                let tags = plan
                    .contributed_tags
                    .get(&contributor.name)
                    .map_or(&[][..], Vec::as_slice);
                let live = live_after(plan, outcome);
                let job = Job {
                    tailnet,
                    contributor,
                    keys,
                    tags,
                    live,
                    version,
                };
                match one(ctx, client, &job).await {
                    Ok(summary) => summary,
                    Err(e) => format!("Secret {}/{}: {e}", keys.namespace, keys.secret),
                }
            }
            _ => format!(
                "Secret {}/{}: not written while Headscale is not reachable",
                keys.namespace, keys.secret
            ),
        };
        out.insert(contributor.name.clone(), summary);
    }
    out
}

/// Puts the summaries into the status's contributor entries.
pub fn record(status: &mut TailnetStatus, delivered: &Delivered) {
    for entry in &mut status.contributors {
        entry.keys = delivered.get(&entry.name).cloned();
    }
}

struct Job<'a> {
    tailnet: &'a Tailnet,
    contributor: &'a Contributor,
    keys: &'a KeysDelivery,
    tags: &'a [String],
    live: Option<&'a str>,
    version: &'a str,
}

/// One contributor: read, decide, expire, mint, write.
async fn one(ctx: &Context, headscale: &HeadscaleClient, job: &Job<'_>) -> Result<String, String> {
    let Job { keys, .. } = job;
    let path = format!(
        "/api/v1/namespaces/{}/secrets/{}",
        keys.namespace, keys.secret
    );
    let client = kubeconfig_client(ctx, &keys.secret_ref).await?;
    let timeout = ctx.config.headscale_timeout;
    let current: Option<K8sSecret> = tokio::time::timeout(
        timeout,
        get_capped(&client, &path, MAX_FEED_BYTES.saturating_mul(2)),
    )
    .await
    .map_err(|_| format!("reading it timed out after {timeout:?}"))?
    .map_err(|e| format!("reading it: {e}"))?;
    let Some(current) = current else {
        return Err("does not exist in the contributor's cluster (its operator creates it, empty, when its Tailnet has no apiSecretRef; the owner may not create it)".to_string());
    };
    let current_text = current
        .data
        .as_ref()
        .and_then(|d| d.get(FEED_KEY))
        .map(|b| b.0.clone())
        .unwrap_or_default();
    let held = parse_feed(&current_text, &job.contributor.tag_prefix).ok();
    let nodes = ctx
        .nodes
        .get(headscale.server(), || headscale.list_nodes())
        .await
        .map_err(|e| format!("listing Headscale's nodes: {e}"))?;
    let listed = ctx
        .pre_auth_keys
        .get(headscale.server(), || headscale.list_pre_auth_keys())
        .await;
    if let Err(e) = &listed {
        tracing::warn!(contributor = %job.contributor.name, error = %e, "listing pre-auth keys failed; no key minted or expired for the contributor");
    }
    let plan = feed::plan(&FeedInputs {
        contributor: job.contributor,
        route_approvers: &job.tailnet.spec.policy.route_approvers,
        headscale_version: job.version,
        nodes: &nodes,
        live_policy: job.live,
        accepted_tags: job.tags,
        keys: listed.as_ref().ok().map(|k| k.as_slice()),
        current: held.as_ref(),
        lease: feed::lease(ctx.config.headscale_poll),
        now: Timestamp::now(),
    });
    let changed_keys = !plan.expire.is_empty() || !plan.mint.is_empty();
    for id in &plan.expire {
        if let Err(e) = headscale.expire_pre_auth_key(*id).await {
            tracing::warn!(key_id = id, error = %e, "expiring a contributor's unused pre-auth key failed");
        }
    }
    let mut minted = Vec::new();
    for tag in &plan.mint {
        match headscale
            .create_pre_auth_key(&CreatePreAuthKey::single_use_tagged(
                vec![tag.clone()],
                plan.expires,
            ))
            .await
        {
            Ok(key) => minted.push(feed::feed_key(tag, &key, plan.expires)),
            Err(e) => {
                tracing::warn!(%tag, error = %e, "minting a contributor agent's pre-auth key failed")
            }
        }
    }
    if changed_keys {
        ctx.pre_auth_keys.invalidate(headscale.server());
    }
    let minted_ids: Vec<u64> = minted.iter().map(|k| k.id).collect();
    let feed = feed::with_minted(plan.feed, minted);
    let summary = feed::summary(&format!("{}/{}", keys.namespace, keys.secret), &feed);
    if held.as_ref() == Some(&feed) {
        return Ok(summary);
    }
    if let Err(e) = write(&client, keys, &feed, timeout).await {
        // Do not leave valid keys behind that nobody holds.
        for id in minted_ids {
            let _ = headscale.expire_pre_auth_key(id).await;
        }
        return Err(e);
    }
    Ok(summary)
}

/// Writes the feed with a merge patch of the one key (the Role allows `patch` on that one
/// Secret; no `create`).
async fn write(
    client: &kube::Client,
    keys: &KeysDelivery,
    feed: &OwnerFeed,
    timeout: std::time::Duration,
) -> Result<(), String> {
    let text = serde_json::to_vec(feed).map_err(|e| format!("encoding the feed: {e}"))?;
    if text.len() > MAX_FEED_BYTES {
        return Err(format!(
            "the feed would be {} bytes, more than {MAX_FEED_BYTES}; not written",
            text.len()
        ));
    }
    // ByteString serializes as base64, a Secret's `data` encoding.
    let encoded = serde_json::to_value(k8s_openapi::ByteString(text))
        .map_err(|e| format!("encoding the feed: {e}"))?;
    let patch = serde_json::json!({"data": {FEED_KEY: encoded}});
    let secrets: Api<K8sSecret> = Api::namespaced(client.clone(), &keys.namespace);
    tokio::time::timeout(
        timeout,
        secrets.patch(&keys.secret, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    .map_err(|_| format!("writing it timed out after {timeout:?}"))?
    .map(|_| ())
    .map_err(|e| format!("writing it: {e}"))
}
