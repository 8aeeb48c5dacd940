//! The Tailnet controller: Headscale reachability, the base policy, the rendered policy
//! (DryRun/Apply with ownership), route approval catch-up, DNS entries and which grants are
//! live. Triggered by the Tailnet, its Secret and ConfigMaps, every TailnetEgress/Ingress that
//! references it, their Services, and a poll interval for Headscale's own state.

mod dns;
pub mod effective;
mod headscale_state;

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, Secret as K8sSecret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tailnet_api::conditions::{self, Status, reasons, types};
use tailnet_api::tailnet::{PolicyMode, TailnetStatus};
use tailnet_api::{FIELD_MANAGER, Tailnet, validate};
use tailnet_headscale::Secret;
use tailnet_policy::{BasePolicy, RenderedPolicy};

use super::ReconcileError;
use super::context::Context;
use crate::metrics::TailnetLabels;

/// Key of the base policy in its ConfigMap.
pub const BASE_POLICY_KEY: &str = "policy.hujson";
const CONTROLLER: &str = "tailnet";

/// Name of the ConfigMap holding the rendered document, its diff and a summary.
pub fn rendered_policy_config_map(tailnet: &str) -> String {
    format!("{tailnet}-rendered-policy")
}

/// Installation identity written into this Tailnet's policy marker.
pub fn installation_id(ctx: &Context, tailnet: &str) -> String {
    format!("{}/{tailnet}", ctx.config.installation_id)
}

fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn owner_reference(tailnet: &Tailnet) -> Option<OwnerReference> {
    tailnet.controller_owner_ref(&())
}

pub async fn reconcile(tailnet: Arc<Tailnet>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let key = format!("tailnet/{}", tailnet.name_any());
    super::instrumented(&ctx, CONTROLLER, &key, reconcile_tailnet(&tailnet, &ctx)).await
}

pub fn error_policy(tailnet: Arc<Tailnet>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    super::backoff_on_error(
        &ctx,
        CONTROLLER,
        &format!("tailnet/{}", tailnet.name_any()),
        error,
    )
}

/// Conditions collected during one reconcile.
struct StatusBuilder {
    status: TailnetStatus,
    previous: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    generation: Option<i64>,
    now: Time,
}

impl StatusBuilder {
    fn set(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        let condition = conditions::condition(type_, status, reason, message, self.generation);
        conditions::upsert(&mut self.status.conditions, condition, &self.now);
    }

    fn previous_reason(&self, type_: &str) -> Option<String> {
        conditions::find(&self.previous, type_).map(|c| c.reason.clone())
    }
}

async fn publish(
    ctx: &Context,
    tailnet: &Tailnet,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tailnet.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing event failed");
    }
}

pub async fn read_api_key(ctx: &Context, tailnet: &Tailnet) -> Result<Secret, (String, String)> {
    let reference = &tailnet.spec.api_secret_ref;
    let ns = &ctx.config.operator_namespace;
    let api: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), ns);
    // Read on every reconcile of every resource: from the watch cache when it has it.
    let read = super::from_cache_or_get(
        &ctx.caches.operator_secrets,
        &api,
        &kube::runtime::reflector::ObjectRef::new(&reference.name).within(ns),
    )
    .await;
    let secret = match read {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            return Err((
                reasons::SECRET_MISSING.to_string(),
                format!(
                    "Secret {ns}/{} (spec.apiSecretRef) does not exist; create it with the Headscale API key under key {:?}",
                    reference.name, reference.key
                ),
            ));
        }
        Err(e) => {
            return Err((
                reasons::SECRET_UNREADABLE.to_string(),
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
        _ => Err((
            reasons::SECRET_KEY_MISSING.to_string(),
            format!(
                "Secret {ns}/{} has no non-empty key {:?} (spec.apiSecretRef.key)",
                reference.name, reference.key
            ),
        )),
    }
}

async fn load_base(ctx: &Context, tailnet: &Tailnet) -> Result<BasePolicy, (String, String)> {
    let Some(name) = &tailnet.spec.policy.base_config_map else {
        return tailnet_policy::parse_base("{}")
            .map_err(|e| (reasons::INVALID_BASE.to_string(), e.to_string()));
    };
    let ns = &ctx.config.operator_namespace;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let cm = match api.get_opt(name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => {
            return Err((
                reasons::CONFIG_MAP_NOT_FOUND.to_string(),
                format!(
                    "ConfigMap {ns}/{name} (spec.policy.baseConfigMap) does not exist; create it with the base policy under key {BASE_POLICY_KEY:?}"
                ),
            ));
        }
        Err(e) => {
            return Err((
                reasons::CONFIG_MAP_UNREADABLE.to_string(),
                format!("reading ConfigMap {ns}/{name}: {e}"),
            ));
        }
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(BASE_POLICY_KEY)) else {
        return Err((
            reasons::KEY_MISSING.to_string(),
            format!("ConfigMap {ns}/{name} has no key {BASE_POLICY_KEY:?}"),
        ));
    };
    tailnet_policy::parse_base(text).map_err(|e| {
        (
            reasons::SYNTAX_ERROR.to_string(),
            format!(
                "ConfigMap {ns}/{name} key {BASE_POLICY_KEY}: line {}, column {}: {}",
                e.line, e.column, e.message
            ),
        )
    })
}

/// Upper bound for the rendered-policy ConfigMap's data: the apiserver refuses a ConfigMap
/// whose data exceeds 1 MiB (1,048,576 bytes); some room is left for the key names.
const RENDERED_POLICY_BUDGET: usize = 1_000_000;

/// The rendered-policy ConfigMap's data: the document, its diff against the live policy and a
/// summary. At about 1,000 resources document + diff passed the apiserver's limit and the
/// refused write stopped the whole policy sync (benchmark 4): when they do not fit, the diff
/// is left out, then the document, each replaced by a line that says so.
pub fn rendered_policy_data(document: &str, diff: &str, summary: &str) -> BTreeMap<String, String> {
    let omitted = |what: &str, bytes: usize| {
        format!(
            "omitted: the {what} is {bytes} bytes; the ConfigMap would exceed the apiserver's 1 MiB limit (the policy itself is synced regardless)\n"
        )
    };
    let mut document_value = document.to_string();
    let mut diff_value = diff.to_string();
    if summary.len() + document.len() + diff.len() > RENDERED_POLICY_BUDGET {
        diff_value = omitted("diff", diff.len());
    }
    if summary.len() + document.len() + diff_value.len() > RENDERED_POLICY_BUDGET {
        document_value = omitted("rendered document", document.len());
    }
    BTreeMap::from([
        (BASE_POLICY_KEY.to_string(), document_value),
        ("diff".to_string(), diff_value),
        ("summary".to_string(), summary.to_string()),
    ])
}

async fn write_rendered_policy(
    ctx: &Context,
    tailnet: &Tailnet,
    rendered: &RenderedPolicy,
    diff: &str,
    summary: &str,
) -> Result<(), ReconcileError> {
    let ns = &ctx.config.operator_namespace;
    let name = rendered_policy_config_map(&tailnet.name_any());
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(BTreeMap::from([
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    "tailnet-operator".to_string(),
                ),
                (
                    tailnet_api::naming::labels::TAILNET.to_string(),
                    tailnet.name_any(),
                ),
            ])),
            owner_references: owner_reference(tailnet).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some(rendered_policy_data(&rendered.document, diff, summary)),
        ..ConfigMap::default()
    };
    // Written on every reconcile of the Tailnet: sent only when it changed (see applied.rs).
    super::apply_cached(
        ctx,
        &Api::<ConfigMap>::namespaced(ctx.client.clone(), ns),
        ns,
        &cm,
        super::Watched::No,
    )
    .await
    .map(|_| ())
}

/// A printer-column sized summary: `3 tags, 4 grants, 2 routes` (+ `, 1 with issues`).
fn short_summary(rendered: &RenderedPolicy) -> String {
    let s = &rendered.summary;
    let mut text = format!(
        "{} tags, {} grants, {} routes",
        s.generated_tag_owners,
        s.egress_grants + s.ingress_grants,
        s.auto_approver_routes
    );
    if s.resources_with_issues > 0 {
        text.push_str(&format!(", {} with issues", s.resources_with_issues));
    }
    text
}

/// `+`/`-` line counts of a unified diff.
fn diff_stats(diff: &str) -> (usize, usize) {
    let added = diff
        .lines()
        .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
        .count();
    let removed = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .count();
    (added, removed)
}

/// The removed lines of a diff, for an Event about a manual edit being overwritten.
fn lost_lines(diff: &str, limit: usize) -> String {
    let lost: Vec<&str> = diff
        .lines()
        .filter(|l| l.starts_with('-') && !l.starts_with("---"))
        .collect();
    let mut text = lost
        .iter()
        .take(limit)
        .map(|l| l.trim_start_matches('-').trim())
        .collect::<Vec<_>>()
        .join(" | ");
    if lost.len() > limit {
        text.push_str(&format!(" | … ({} more lines)", lost.len() - limit));
    }
    text
}

async fn reconcile_tailnet(tailnet: &Tailnet, ctx: &Context) -> Result<Action, ReconcileError> {
    let name = tailnet.name_any();
    let previous = tailnet.status.clone().unwrap_or_default();
    let mut b = StatusBuilder {
        status: TailnetStatus {
            observed_generation: tailnet.metadata.generation,
            conditions: previous.conditions.clone(),
            headscale_version: previous.headscale_version.clone(),
            policy: previous.policy.clone(),
        },
        previous: previous.conditions.clone(),
        generation: tailnet.metadata.generation,
        now: Time(Timestamp::now()),
    };
    let tailnet_label = TailnetLabels {
        tailnet: name.clone(),
    };
    let poll = Action::requeue(ctx.config.headscale_poll);

    // Validate the spec (the schema already did; this catches what slipped past, e.g. objects
    // stored before a schema change).
    let errors = validate::tailnet(&tailnet.spec);
    if !errors.is_empty() {
        b.set(
            types::READY,
            Status::False,
            reasons::INVALID_SPEC,
            validate::summarize(&errors),
        );
        write_status(ctx, tailnet, &previous, b.status).await?;
        return Ok(poll);
    }

    // Headscale: API key, reachability, nodes and live policy.
    let state = headscale_state::observe(ctx, tailnet).await;
    match &state.reachability {
        Ok(version) => {
            b.status.headscale_version = Some(version.clone());
            b.set(
                types::HEADSCALE_REACHABLE,
                Status::True,
                reasons::REACHABLE,
                format!(
                    "Headscale {version} at {} accepts the API key",
                    tailnet.spec.server
                ),
            );
            ctx.metrics
                .headscale_reachable
                .get_or_create(&tailnet_label)
                .set(1);
        }
        Err((reason, message)) => {
            b.set(
                types::HEADSCALE_REACHABLE,
                Status::False,
                reason,
                message.clone(),
            );
            ctx.metrics
                .headscale_reachable
                .get_or_create(&tailnet_label)
                .set(0);
        }
    }

    // Base policy.
    let base = load_base(ctx, tailnet).await;
    match &base {
        Ok(_) => b.set(
            types::BASE_VALID,
            Status::True,
            reasons::VALID,
            "the base policy parses",
        ),
        Err((reason, message)) => b.set(types::BASE_VALID, Status::False, reason, message.clone()),
    }

    // Render.
    let egresses: Vec<_> = ctx.egresses.state().iter().map(|e| (**e).clone()).collect();
    let ingresses: Vec<_> = ctx
        .ingresses
        .state()
        .iter()
        .map(|i| (**i).clone())
        .collect();
    let mut inputs = tailnet_render::policy_inputs::policy_inputs(
        tailnet,
        &installation_id(ctx, &name),
        &ctx.config.operator_namespace,
        &egresses,
        &ingresses,
        &state.policy_nodes,
    );
    if !ctx.config.approve_routes {
        // Route approval left to the Headscale admin: no autoApprovers either (Headscale
        // 0.29 evaluates them when the policy is set, not only when a route changes).
        inputs.route_approvers.clear();
    }
    let rendered = match &base {
        Ok(base) => match tailnet_policy::render(base, &inputs) {
            Ok(rendered) => Some(rendered),
            Err(e) => {
                b.set(
                    types::BASE_VALID,
                    Status::False,
                    reasons::INVALID_BASE,
                    e.to_string(),
                );
                None
            }
        },
        Err(_) => None,
    };

    let mut live_document = state.live_policy.clone();
    let mut policy_status = previous.policy.clone().unwrap_or_default();
    policy_status.rendered_hash = rendered.as_ref().map(|r| sha256(&r.document));
    if let Some(rendered) = &rendered {
        ctx.metrics
            .policy_size_bytes
            .get_or_create(&tailnet_label)
            .set(i64::try_from(rendered.document.len()).unwrap_or(i64::MAX));
        policy_status.summary = Some(short_summary(rendered));
    }

    match (&rendered, &state.client, &state.live_policy) {
        (Some(rendered), Some(client), Some(live)) => {
            let diff = tailnet_policy::diff(live, &rendered.document);
            let (added, removed) = diff_stats(&diff);
            let summary = format!("{} (+{added}/-{removed} lines against the live policy)", rendered.summary);
            // A debugging copy: failing to write it must not stop the sync itself.
            if let Err(error) = write_rendered_policy(ctx, tailnet, rendered, &diff, &summary).await {
                tracing::warn!(tailnet = %name, %error, "writing the rendered-policy ConfigMap failed; syncing the policy anyway");
            }
            let cm = rendered_policy_config_map(&name);
            let check = client.check_policy(&rendered.document).await;
            match (check, tailnet.spec.policy.mode) {
                (Err(tailnet_headscale::Error::Api { message, .. }), _) => {
                    ctx.metrics.policy_sync(&name, "rejected");
                    if b.previous_reason(types::POLICY_APPLIED).as_deref() != Some(reasons::REJECTED) {
                        publish(ctx, tailnet, EventType::Warning, reasons::REJECTED, "CheckPolicy", format!("Headscale rejected the rendered policy: {message}")).await;
                    }
                    b.set(types::POLICY_APPLIED, Status::False, reasons::REJECTED, format!("Headscale rejected the rendered policy (the previous one stays live): {message}; see ConfigMap {cm}"));
                }
                (Err(e), _) => {
                    b.set(types::POLICY_APPLIED, Status::Unknown, e.reason(), format!("checking the policy failed: {e}"));
                }
                (Ok(()), PolicyMode::DryRun) => {
                    ctx.metrics.policy_sync(&name, "dry_run");
                    let change = if diff.is_empty() { "no change to the live policy".to_string() } else { format!("would change the live policy by +{added}/-{removed} lines") };
                    b.set(types::POLICY_APPLIED, Status::False, reasons::DRY_RUN, format!("DryRun: {change}; {}; review ConfigMap {cm}, then set spec.policy.mode: Apply", rendered.summary));
                }
                (Ok(()), PolicyMode::Apply) => {
                    let ours = tailnet_policy::ownership_marker(&rendered.document);
                    let theirs = tailnet_policy::ownership_marker(live);
                    if theirs.is_some() && theirs != ours {
                        ctx.metrics.policy_sync(&name, "owned_elsewhere");
                        let owner = theirs.unwrap_or_default();
                        b.set(types::POLICY_APPLIED, Status::False, reasons::OWNED_ELSEWHERE, format!("the live policy is owned by installation {owner:?}; refusing to overwrite it (only one installation per Headscale server may write)"));
                    } else if tailnet_policy::up_to_date(live, &rendered.document).unwrap_or(false) {
                        ctx.metrics.policy_sync(&name, "unchanged");
                        policy_status.applied_hash = Some(sha256(&rendered.document));
                        b.set(types::POLICY_APPLIED, Status::True, reasons::APPLIED, format!("live: {}", rendered.summary));
                    } else {
                        let live_hash = sha256(live);
                        let manual_edit = theirs.is_some() && policy_status.applied_hash.as_deref().is_some_and(|h| h != live_hash);
                        match client.set_policy(&rendered.document).await {
                            Ok(_) => {
                                ctx.metrics.policy_sync(&name, "applied");
                                if manual_edit {
                                    publish(ctx, tailnet, EventType::Warning, "ManualEditOverwritten", "SetPolicy", format!("the live policy had been edited outside the operator; overwritten. Lost: {}", lost_lines(&diff, 10))).await;
                                } else if theirs.is_none() && !live.trim().is_empty() {
                                    publish(ctx, tailnet, EventType::Normal, "PolicyTakenOver", "SetPolicy", format!("the operator now owns the policy; replaced: {}", lost_lines(&diff, 10))).await;
                                } else {
                                    publish(ctx, tailnet, EventType::Normal, "PolicyApplied", "SetPolicy", format!("+{added}/-{removed} lines; {}", rendered.summary)).await;
                                }
                                policy_status.applied_hash = Some(sha256(&rendered.document));
                                live_document = Some(rendered.document.clone());
                                b.set(types::POLICY_APPLIED, Status::True, reasons::APPLIED, format!("live: {}", rendered.summary));
                            }
                            Err(tailnet_headscale::Error::Api { message, .. }) => {
                                ctx.metrics.policy_sync(&name, "rejected");
                                publish(ctx, tailnet, EventType::Warning, reasons::REJECTED, "SetPolicy", format!("Headscale rejected the policy: {message}")).await;
                                b.set(types::POLICY_APPLIED, Status::False, reasons::REJECTED, format!("Headscale rejected the rendered policy (the previous one stays live): {message}; see ConfigMap {cm}"));
                            }
                            Err(e) => b.set(types::POLICY_APPLIED, Status::Unknown, e.reason(), format!("writing the policy failed: {e}")),
                        }
                    }
                }
            }
        }
        (None, _, _) => b.set(types::POLICY_APPLIED, Status::False, reasons::BASE_INVALID, "the policy cannot be rendered until the base policy is fixed (see BaseValid)"),
        _ => b.set(types::POLICY_APPLIED, Status::Unknown, reasons::HEADSCALE_UNREACHABLE, "the live policy cannot be compared until Headscale is reachable (see HeadscaleReachable)"),
    }

    // Route approval catch-up: autoApprovers only fire when a route changes.
    if tailnet.spec.policy.mode == PolicyMode::Apply
        && ctx.config.approve_routes
        && let Some(client) = &state.client
        && state.nodes_known
    {
        for approval in tailnet_policy::routes_needing_approval(&inputs) {
            match client
                .approve_routes(approval.node_id, &approval.approved_routes)
                .await
            {
                Ok(_) => {
                    ctx.metrics
                        .routes_approved
                        .get_or_create(&tailnet_label)
                        .inc_by(approval.added.len() as u64);
                    let added: Vec<String> =
                        approval.added.iter().map(ToString::to_string).collect();
                    publish(
                        ctx,
                        tailnet,
                        EventType::Normal,
                        "RoutesApproved",
                        "ApproveRoutes",
                        format!(
                            "approved {} on node {} (id {})",
                            added.join(", "),
                            approval.node_name,
                            approval.node_id
                        ),
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!(tailnet = %name, node = approval.node_id, error = %e, "approving routes failed")
                }
            }
        }
    }

    // Which resources' grants are live.
    policy_status.effective_for = match (&rendered, &live_document) {
        (Some(rendered), Some(live)) => effective::effective_resources(live, &rendered.resources),
        _ => previous.policy.clone().unwrap_or_default().effective_for,
    };
    b.status.policy = Some(policy_status);

    // DNS.
    dns::sync(
        ctx,
        tailnet,
        &ingresses,
        &state,
        &mut b.status.conditions,
        &b.now,
    )
    .await?;

    let ready = conditions::ready_from(
        &b.status.conditions,
        &[
            types::HEADSCALE_REACHABLE,
            types::BASE_VALID,
            types::POLICY_APPLIED,
            types::DNS_RENDERED,
        ],
        tailnet.metadata.generation,
    );
    conditions::upsert(&mut b.status.conditions, ready, &b.now);
    for c in &b.status.conditions {
        ctx.metrics
            .resources_by_condition
            .get_or_create(&crate::metrics::ConditionLabels {
                kind: "Tailnet".to_string(),
                condition: c.type_.clone(),
                status: c.status.clone(),
            })
            .set(1);
    }
    write_status(ctx, tailnet, &previous, b.status).await?;
    Ok(poll)
}

/// Writes the status only when it changed (ignoring condition timestamps).
async fn write_status(
    ctx: &Context,
    tailnet: &Tailnet,
    previous: &TailnetStatus,
    status: TailnetStatus,
) -> Result<(), ReconcileError> {
    let unchanged = conditions::same_ignoring_time(&previous.conditions, &status.conditions)
        && previous.observed_generation == status.observed_generation
        && previous.headscale_version == status.headscale_version
        && previous.policy == status.policy;
    if unchanged {
        return Ok(());
    }
    let api: Api<Tailnet> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", tailnet_api::GROUP, tailnet_api::VERSION),
        "kind": "Tailnet",
        "status": status,
    });
    api.patch_status(
        &tailnet.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(ReconcileError::kube(format!(
        "patch status of Tailnet {}",
        tailnet.name_any()
    )))?;
    Ok(())
}

pub use headscale_state::HeadscaleState;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_policy_data_fits_the_configmap_limit() {
        let small = rendered_policy_data("{}", "+a\n", "1 grant");
        assert_eq!(small.get("diff").map(String::as_str), Some("+a\n"));
        assert_eq!(small.get(BASE_POLICY_KEY).map(String::as_str), Some("{}"));
        // Document and diff together too big: the diff goes, the document stays.
        let document = "x".repeat(600_000);
        let diff = "+".repeat(500_000);
        let data = rendered_policy_data(&document, &diff, "s");
        assert_eq!(data.get(BASE_POLICY_KEY), Some(&document));
        let diff_value = data.get("diff").cloned().unwrap_or_default();
        assert!(
            diff_value.starts_with("omitted: the diff is 500000 bytes"),
            "{diff_value}"
        );
        // The document alone too big: both go, the summary stays.
        let huge = "x".repeat(1_200_000);
        let data = rendered_policy_data(&huge, "", "s");
        let document_value = data.get(BASE_POLICY_KEY).cloned().unwrap_or_default();
        assert!(
            document_value.starts_with("omitted: the rendered document is 1200000 bytes"),
            "{document_value}"
        );
        assert_eq!(data.get("summary").map(String::as_str), Some("s"));
        let total: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= 1_048_576);
    }

    #[test]
    fn diff_helpers() {
        let diff = "--- live\n+++ rendered\n@@ -1,2 +1,2 @@\n-old line\n+new line\n context\n";
        assert_eq!(diff_stats(diff), (1, 1));
        assert_eq!(lost_lines(diff, 10), "old line");
        let many: String = (0..15).map(|i| format!("-line {i}\n")).collect();
        assert!(lost_lines(&many, 3).ends_with("… (12 more lines)"));
    }
}
