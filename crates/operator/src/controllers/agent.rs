//! What egress and ingress agents share: the Tailnet they belong to, Headscale access, the
//! node of their tag, the single-use pre-auth key, applying their objects, cleanup.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret as K8sSecret;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use tailnet_api::conditions::reasons;
use tailnet_api::{FIELD_MANAGER, Tailnet};
use tailnet_headscale::{Client as HeadscaleClient, CreatePreAuthKey, Node};
use tailnet_render::meta::Owner;

use super::ReconcileError;
use super::context::Context;

/// Annotations on the auth Secret: which key is in it and until when it is valid (the key
/// itself is never logged or put anywhere else).
pub const KEY_ID_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-id";
pub const KEY_EXPIRES_ANNOTATION: &str = "tailnet-operator.dev/pre-auth-key-expires";
/// How long a minted pre-auth key is valid: long enough for an image pull and a crash loop,
/// short enough to be useless if it leaks.
pub const PRE_AUTH_KEY_LIFETIME: SignedDuration = SignedDuration::from_mins(60);

/// The Tailnet an agent belongs to and a Headscale client for it, or why not.
pub struct TailnetAccess {
    pub tailnet: Tailnet,
    pub headscale: Result<HeadscaleClient, (String, String)>,
}

/// Looks up the Tailnet and builds its Headscale client. `Err` carries a reason and message
/// for `TailnetReady=False`.
pub async fn tailnet_access(ctx: &Context, name: &str) -> Result<TailnetAccess, (String, String)> {
    let api: Api<Tailnet> = Api::all(ctx.client.clone());
    let read = super::from_cache_or_get(
        &ctx.caches.tailnets,
        &api,
        &kube::runtime::reflector::ObjectRef::new(name),
    )
    .await;
    let tailnet = match read {
        Ok(Some(t)) => t,
        Ok(None) => {
            return Err((
                reasons::TAILNET_NOT_FOUND.to_string(),
                format!("Tailnet {name:?} (spec.tailnetRef.name) does not exist"),
            ));
        }
        Err(e) => {
            return Err((
                reasons::TAILNET_UNREADABLE.to_string(),
                format!("reading Tailnet {name}: {e}"),
            ));
        }
    };
    let headscale = match super::access::read_api_key(ctx, &tailnet).await {
        Ok(key) => ctx
            .headscale(&tailnet.spec.server, &key)
            .map_err(|e| (e.reason().to_string(), e.to_string())),
        Err(problem) => Err((problem.reason.to_string(), problem.message)),
    };
    Ok(TailnetAccess { tailnet, headscale })
}

/// The node carrying `tag` (an agent's identity). Several can exist after a lost state
/// Secret: prefer online, then the newest.
pub fn find_node<'a>(nodes: &'a [Node], tag: &str) -> Option<&'a Node> {
    nodes
        .iter()
        .filter(|n| n.tags.iter().any(|t| t == tag))
        .max_by_key(|n| (n.online, n.id))
}

/// Where the agent's login stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// The node exists: no key is needed (and none is kept).
    NodeExists,
    /// A valid key waits in the auth Secret for the agent's first login.
    Pending { expires: Timestamp },
    /// A key was minted in this reconcile.
    Minted { expires: Timestamp },
}

fn secret_annotation(secret: &K8sSecret, key: &str) -> Option<String> {
    secret.annotations().get(key).cloned()
}

/// An agent Secret: from the watch cache of the operator namespace when it is there,
/// otherwise a GET served from the apiserver's watch cache (no etcd read per poll). A stale
/// answer costs at most one superfluous key: the orphan sweep expires the other.
pub async fn read_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<K8sSecret>, ReconcileError> {
    if namespace == ctx.config.operator_namespace
        && let Some(secret) = ctx
            .caches
            .operator_secrets
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))
    {
        return Ok(Some((*secret).clone()));
    }
    let secrets: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), namespace);
    super::get_opt_cached(&secrets, name)
        .await
        .map_err(ReconcileError::kube(format!("get Secret {name}")))
}

/// Keeps exactly one valid single-use key while no node exists, none once it does. Never
/// mints while an unexpired key is pending, so a crash-looping agent cannot make it mint in
/// a loop.
pub async fn ensure_pre_auth_key(
    ctx: &Context,
    headscale: &HeadscaleClient,
    owner: &Owner,
    tag: &str,
    node_exists: bool,
) -> Result<KeyState, ReconcileError> {
    use super::applied::{ABSENT, ChildRef, Decision, Live};
    let names = owner.names();
    let secrets: Api<K8sSecret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let auth_child = ChildRef {
        kind: <K8sSecret as k8s_openapi::Resource>::KIND.to_string(),
        namespace: owner.namespace.clone(),
        name: names.auth_secret.clone(),
    };
    if node_exists {
        // This process already removed the Secret once the node existed: nothing to read
        // on every poll (checked again after the re-apply interval).
        if ctx.applied.decide(&auth_child, &ABSENT, Live::Unwatched) == Decision::Unchanged {
            return Ok(KeyState::NodeExists);
        }
        if let Some(secret) = read_secret(ctx, &owner.namespace, &names.auth_secret).await? {
            // The key is spent (single use) or unneeded: expire it and drop the Secret.
            if let Some(id) =
                secret_annotation(&secret, KEY_ID_ANNOTATION).and_then(|id| id.parse::<u64>().ok())
                && let Err(e) = headscale.expire_pre_auth_key(id).await
            {
                tracing::debug!(key_id = id, error = %e, "expiring a used pre-auth key failed");
            }
            match secrets
                .delete(&names.auth_secret, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(ReconcileError::kube("delete auth Secret")(e)),
            }
        }
        ctx.applied.record(auth_child, ABSENT, None);
        return Ok(KeyState::NodeExists);
    }
    ctx.applied.forget(&auth_child);
    let existing = read_secret(ctx, &owner.namespace, &names.auth_secret).await?;
    let now = Timestamp::now();
    if let Some(secret) = &existing
        && let Some(expires) = secret_annotation(secret, KEY_EXPIRES_ANNOTATION)
            .and_then(|e| e.parse::<Timestamp>().ok())
        && expires > now + SignedDuration::from_mins(2)
    {
        return Ok(KeyState::Pending { expires });
    }
    // A crash between minting and writing the Secret leaves a valid key nobody holds:
    // expire every such key of this tag before minting the one the Secret will carry.
    let held = existing
        .as_ref()
        .and_then(|secret| secret_annotation(secret, KEY_ID_ANNOTATION))
        .and_then(|id| id.parse::<u64>().ok());
    // A list up to a second old is enough here: keys of this tag are only minted by this
    // resource's reconciles, which never run concurrently.
    let keys = ctx
        .pre_auth_keys
        .get(headscale.server(), || headscale.list_pre_auth_keys())
        .await
        .map_err(|source| ReconcileError::Headscale {
            action: "list pre-auth keys".to_string(),
            source,
        })?;
    for id in orphaned_keys(&keys, tag, held, now) {
        headscale
            .expire_pre_auth_key(id)
            .await
            .map_err(|source| ReconcileError::Headscale {
                action: format!("expire orphaned pre-auth key {id} of {tag}"),
                source,
            })?;
        tracing::info!(key_id = id, %tag, "expired a pre-auth key that no Secret holds");
    }
    let expires = now + PRE_AUTH_KEY_LIFETIME;
    let key = headscale
        .create_pre_auth_key(&CreatePreAuthKey::single_use_tagged(
            vec![tag.to_string()],
            expires,
        ))
        .await
        .map_err(|source| ReconcileError::Headscale {
            action: format!("mint pre-auth key for {tag}"),
            source,
        })?;
    let mut secret = tailnet_render::pod::auth_secret(owner, key.key.expose());
    secret.metadata.annotations = Some(BTreeMap::from([
        (KEY_ID_ANNOTATION.to_string(), key.id.to_string()),
        (KEY_EXPIRES_ANNOTATION.to_string(), expires.to_string()),
    ]));
    if let Err(e) = super::apply(&secrets, &names.auth_secret, &secret).await {
        // Do not leave a valid key behind that nobody holds.
        let _ = headscale.expire_pre_auth_key(key.id).await;
        return Err(e);
    }
    Ok(KeyState::Minted { expires })
}

/// Keys of `tag` that could still register a node (unused, unexpired) other than `held`,
/// the one in the agent's auth Secret.
pub fn orphaned_keys(
    keys: &[tailnet_headscale::PreAuthKey],
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

/// Removes the agent's identity from Headscale: its nodes and any unexpired keys of its tag.
pub async fn forget_identity(headscale: &HeadscaleClient, tag: &str) -> Result<(), ReconcileError> {
    // Keys first: once none is valid, no agent can register a node any more, so the node list
    // read afterwards is complete. (Nodes first left a window in which an agent that was
    // still starting registered after the list and stayed behind as an orphan.)
    let keys =
        headscale
            .list_pre_auth_keys()
            .await
            .map_err(|source| ReconcileError::Headscale {
                action: "list pre-auth keys".to_string(),
                source,
            })?;
    let now = Timestamp::now();
    for key in keys
        .iter()
        .filter(|k| k.acl_tags.iter().any(|t| t == tag) && k.expiration.is_some_and(|e| e > now))
    {
        headscale
            .expire_pre_auth_key(key.id)
            .await
            .map_err(|source| ReconcileError::Headscale {
                action: format!("expire pre-auth key {}", key.id),
                source,
            })?;
    }
    let nodes = headscale
        .list_nodes()
        .await
        .map_err(|source| ReconcileError::Headscale {
            action: "list nodes".to_string(),
            source,
        })?;
    for node in nodes.iter().filter(|n| n.tags.iter().any(|t| t == tag)) {
        headscale
            .delete_node(node.id)
            .await
            .map_err(|source| ReconcileError::Headscale {
                action: format!("delete node {}", node.id),
                source,
            })?;
    }
    Ok(())
}

/// Whether the agent Deployment has an available pod, and a message saying what is missing.
pub fn deployment_state(deployment: Option<&Deployment>) -> (bool, String) {
    let Some(d) = deployment else {
        return (false, "the agent Deployment does not exist yet".to_string());
    };
    let status = d.status.clone().unwrap_or_default();
    let available = status.available_replicas.unwrap_or(0);
    if available >= 1 {
        return (true, "the agent pod is ready".to_string());
    }
    let why = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.status != "True")
        .filter_map(|c| c.message)
        .next()
        .unwrap_or_else(|| "waiting for the agent pod to become ready (see its tailscale and tailnet-agent containers)".to_string());
    (false, why)
}

/// Collects conditions with stable transition times.
pub struct Conditions {
    pub list: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    pub generation: Option<i64>,
    pub now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

impl Conditions {
    pub fn set(
        &mut self,
        type_: &str,
        status: tailnet_api::conditions::Status,
        reason: &str,
        message: impl Into<String>,
    ) {
        let condition =
            tailnet_api::conditions::condition(type_, status, reason, message, self.generation);
        tailnet_api::conditions::upsert(&mut self.list, condition, &self.now);
    }

    /// Adds `Ready` derived from `required` and returns the list.
    pub fn finish(
        mut self,
        required: &[&str],
    ) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        let ready = tailnet_api::conditions::ready_from(&self.list, required, self.generation);
        tailnet_api::conditions::upsert(&mut self.list, ready, &self.now);
        self.list
    }
}

/// Publishes an Event about `object` (failures are logged, never fatal).
pub async fn publish<K>(
    ctx: &Context,
    object: &K,
    type_: kube::runtime::events::EventType,
    reason: &str,
    note: String,
) where
    K: kube::Resource<DynamicType = ()>,
{
    let event = kube::runtime::events::Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing event failed");
    }
}

/// Publishes a Warning/Normal event when `Ready` changed status or reason.
pub async fn publish_ready_transition<K>(
    ctx: &Context,
    object: &K,
    before: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    after: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) where
    K: kube::Resource<DynamicType = ()>,
{
    use tailnet_api::conditions::{find, types};
    let was = find(before, types::READY).map(|r| (r.status.clone(), r.reason.clone()));
    if let Some(now) = find(after, types::READY)
        && was != Some((now.status.clone(), now.reason.clone()))
    {
        let kind = if now.status == "True" {
            kube::runtime::events::EventType::Normal
        } else {
            kube::runtime::events::EventType::Warning
        };
        publish(ctx, object, kind, &now.reason, now.message.clone()).await;
    }
}

/// Server-side applies a namespaced child object of a kind the operator does not watch into
/// `namespace`, unless it was applied unchanged recently (see applied.rs).
pub async fn apply_in<K>(ctx: &Context, namespace: &str, object: &K) -> Result<(), ReconcileError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + 'static,
{
    super::apply_cached(
        ctx,
        &Api::namespaced(ctx.client.clone(), namespace),
        namespace,
        object,
        super::Watched::No,
    )
    .await
    .map(|_| ())
}

/// Applies the agent Deployment (skipped when unchanged and still as applied, per the watch
/// cache) and returns it as it is now, status included.
pub async fn apply_deployment(
    ctx: &Context,
    namespace: &str,
    deployment: &Deployment,
) -> Result<Deployment, ReconcileError> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let store = &ctx.caches.deployments;
    match super::apply_cached(ctx, &api, namespace, deployment, super::Watched::In(store)).await? {
        Some(live) => Ok(live),
        // Not reachable for a watched kind (a skip needs the cached copy); read it to be sure.
        None => api
            .get(&deployment.name_any())
            .await
            .map_err(ReconcileError::kube("get Deployment")),
    }
}

/// The objects every agent has besides its Deployment (which is applied last, once
/// everything it mounts exists).
pub struct AgentBasics<'a> {
    pub service_account: &'a k8s_openapi::api::core::v1::ServiceAccount,
    pub role: &'a k8s_openapi::api::rbac::v1::Role,
    pub role_binding: &'a k8s_openapi::api::rbac::v1::RoleBinding,
    pub state_secret: &'a K8sSecret,
    pub config_map: &'a k8s_openapi::api::core::v1::ConfigMap,
    pub network_policy: &'a k8s_openapi::api::networking::v1::NetworkPolicy,
}

pub async fn apply_basics(
    ctx: &Context,
    namespace: &str,
    o: AgentBasics<'_>,
) -> Result<(), ReconcileError> {
    apply_in(ctx, namespace, o.service_account).await?;
    apply_in(ctx, namespace, o.role).await?;
    apply_in(ctx, namespace, o.role_binding).await?;
    apply_in(ctx, namespace, o.state_secret).await?;
    apply_in(ctx, namespace, o.config_map).await?;
    let policies = Api::namespaced(ctx.client.clone(), namespace);
    super::apply_cached(
        ctx,
        &policies,
        namespace,
        o.network_policy,
        super::Watched::In(&ctx.caches.network_policies),
    )
    .await?;
    Ok(())
}

/// Writes `status` only when it differs from `previous`, ignoring condition timestamps.
pub async fn write_status_if_changed<K, S>(
    api: &Api<K>,
    name: &str,
    kind: &str,
    previous: &S,
    status: S,
    conditions: impl Fn(&mut S) -> &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
) -> Result<(), ReconcileError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: Clone + PartialEq + serde::Serialize,
{
    let mut before = previous.clone();
    let mut compare = status.clone();
    let previous_conditions = conditions(&mut before).clone();
    let same =
        tailnet_api::conditions::same_ignoring_time(&previous_conditions, conditions(&mut compare));
    *conditions(&mut compare) = previous_conditions;
    if same && compare == before {
        return Ok(());
    }
    patch_status(api, name, kind, &status).await
}

/// Server-side apply of a status subresource for namespaced resource `K`.
pub async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    kind: &str,
    status: &impl serde::Serialize,
) -> Result<(), ReconcileError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", tailnet_api::GROUP, tailnet_api::VERSION),
        "kind": kind,
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(ReconcileError::kube(format!(
        "patch status of {kind} {name}"
    )))?;
    Ok(())
}

/// The agent's node as Headscale sees it, after keeping its pre-auth key in order.
pub struct NodeObservation {
    /// Every node (routes of approver nodes matter to egresses), shared with other reconciles.
    pub nodes: std::sync::Arc<Vec<Node>>,
    /// The node carrying the agent's tag.
    pub node: Option<Node>,
}

/// Lists nodes, finds the agent's, keeps exactly the pre-auth key it needs, and sets
/// `NodeOnline`.
pub async fn observe_node<K>(
    ctx: &Context,
    object: &K,
    access: &TailnetAccess,
    owner: &Owner,
    tag: &str,
    deployable: bool,
    c: &mut Conditions,
) -> Result<NodeObservation, ReconcileError>
where
    K: kube::Resource<DynamicType = ()>,
{
    use tailnet_api::conditions::{Status, types};
    let Ok(headscale) = &access.headscale else {
        c.set(
            types::NODE_ONLINE,
            Status::Unknown,
            reasons::HEADSCALE_UNREACHABLE,
            "cannot observe the node (see TailnetReady)",
        );
        return Ok(NodeObservation {
            nodes: Default::default(),
            node: None,
        });
    };
    let nodes = match ctx
        .nodes
        .get(headscale.server(), || headscale.list_nodes())
        .await
    {
        Ok(nodes) => nodes,
        Err(e) => {
            // Without the node list nothing is minted: the node may well exist.
            c.set(
                types::NODE_ONLINE,
                Status::Unknown,
                e.reason(),
                format!("listing Headscale nodes failed: {e}"),
            );
            return Ok(NodeObservation {
                nodes: Default::default(),
                node: None,
            });
        }
    };
    let node = find_node(&nodes, tag).cloned();
    if node.is_none() && !deployable {
        // No agent will be deployed while the resource has problems: a key minted now would
        // only lie in a Secret, valid and unused.
        c.set(
            types::NODE_ONLINE,
            Status::False,
            reasons::NODE_NOT_REGISTERED,
            "no agent is deployed while the problems in the other conditions remain; no pre-auth key is minted until then",
        );
        return Ok(NodeObservation { nodes, node });
    }
    let key_state = ensure_pre_auth_key(ctx, headscale, owner, tag, node.is_some()).await?;
    if let KeyState::Minted { expires } = &key_state {
        publish(
            ctx,
            object,
            kube::runtime::events::EventType::Normal,
            "PreAuthKeyMinted",
            format!("minted a single-use pre-auth key for {tag}, valid until {expires}"),
        )
        .await;
    }
    match (&node, &key_state) {
        (Some(n), _) if n.online => c.set(
            types::NODE_ONLINE,
            Status::True,
            reasons::ONLINE,
            format!("node {} (id {}) is online at {}", n.given_name, n.id, n.ip_addresses.join(", ")),
        ),
        (Some(n), _) => c.set(
            types::NODE_ONLINE,
            Status::False,
            reasons::NODE_OFFLINE,
            format!("node {} (id {}) is registered but offline; check the agent pod's tailscale container", n.given_name, n.id),
        ),
        (None, KeyState::Pending { expires } | KeyState::Minted { expires }) => c.set(
            types::NODE_ONLINE,
            Status::False,
            reasons::NODE_NOT_REGISTERED,
            format!("waiting for the agent to log in with its pre-auth key (valid until {expires})"),
        ),
        (None, KeyState::NodeExists) => {}
    }
    Ok(NodeObservation { nodes, node })
}

/// Sets `PolicyEffective` from the Tailnet's view of which grants are live. `blocked` names
/// a reason of the resource's own that prevents any grant (e.g. `SourceNotAllowed`).
pub fn policy_effective(
    c: &mut Conditions,
    tailnet: &Tailnet,
    resource_key: &str,
    live_message: &str,
    blocked: Option<(&str, &str)>,
) {
    use tailnet_api::conditions::{Status, find, reasons, types};
    use tailnet_api::tailnet::PolicyMode;
    let status = tailnet.status.clone().unwrap_or_default();
    if status
        .policy
        .as_ref()
        .is_some_and(|p| p.effective_for.iter().any(|k| k == resource_key))
    {
        c.set(
            types::POLICY_EFFECTIVE,
            Status::True,
            reasons::READY,
            live_message,
        );
        return;
    }
    let name = tailnet.name_any();
    let applied = find(&status.conditions, types::POLICY_APPLIED);
    let (reason, message) = match (blocked, tailnet.spec.policy.mode, applied) {
        (Some((reason, message)), _, _) => (reason.to_string(), message.to_string()),
        (None, PolicyMode::DryRun, _) => (
            reasons::DRY_RUN.to_string(),
            format!("Tailnet {name} is in DryRun: grants are rendered but not written"),
        ),
        (None, _, Some(a)) if a.status != "True" => {
            (a.reason.clone(), format!("Tailnet {name}: {}", a.message))
        }
        _ => (
            reasons::NOT_EFFECTIVE.to_string(),
            "the grants are not live in Headscale yet".to_string(),
        ),
    };
    c.set(types::POLICY_EFFECTIVE, Status::False, &reason, message);
}

/// The label selector of an agent's pods.
fn agent_pod_selector(owner: &Owner) -> String {
    owner
        .selector_labels()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Scales the agent's Deployment to zero and waits (at most 45 s: the agent drains for up to
/// its grace period) until its pods are gone. A missing Deployment is already stopped.
async fn stop_agent(ctx: &Context, owner: &Owner) -> Result<(), ReconcileError> {
    use k8s_openapi::api::core::v1::Pod;
    let name = owner.names().base.clone();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    // A merge patch, not server-side apply: an apply with only `replicas` would drop every
    // other field this manager owns.
    let scale = serde_json::json!({"spec": {"replicas": 0}});
    match deployments
        .patch(
            &name,
            &kube::api::PatchParams::default(),
            &Patch::Merge(&scale),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => {
            return Err(ReconcileError::kube(format!(
                "scale Deployment {name} to 0"
            ))(e));
        }
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = agent_pod_selector(owner);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(45);
    loop {
        let left = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .map_err(ReconcileError::kube(format!("list pods of {name}")))?;
        if left.items.is_empty() || tokio::time::Instant::now() > deadline {
            if !left.items.is_empty() {
                tracing::warn!(agent = %name, pods = left.items.len(), "agent pods still terminating; forgetting the identity anyway");
            }
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Deletion of an egress/ingress: its Headscale node(s) go and unexpired keys of its tag are
/// expired; owned objects go by GC; the Tailnet controller drops grants and DNS entries once
/// the object is gone. Headscale unusable ⇒ the finalizer stays (an orphaned tagged node
/// would keep its identity) and the cleanup is retried with backoff.
pub async fn cleanup<K>(
    ctx: &Context,
    object: &K,
    kind: tailnet_api::naming::AgentKind,
    tailnet_name: &str,
    tag_of: impl FnOnce(&Tailnet) -> String,
) -> Result<kube::runtime::controller::Action, ReconcileError>
where
    K: kube::Resource<DynamicType = ()>,
{
    use kube::runtime::controller::Action;
    let access = match tailnet_access(ctx, tailnet_name).await {
        Ok(access) => access,
        Err((reason, message)) => {
            tracing::warn!(object = %object.meta().name.clone().unwrap_or_default(), %reason, %message, "Tailnet gone: nothing to clean up in Headscale");
            return Ok(Action::await_change());
        }
    };
    let tag = tag_of(&access.tailnet);
    match &access.headscale {
        Ok(headscale) => {
            // Stop the agent first: a pod that is still running (or still starting) can
            // register a node after its identity was forgotten and leave it behind (seen in
            // the egress e2e test). Garbage collection would only stop it after the finalizer
            // is gone, which is too late.
            let owner = Owner::from_meta(kind, object.meta(), &access.tailnet.name_any())?;
            stop_agent(ctx, &owner).await?;
            forget_identity(headscale, &tag).await?;
            // A registration already in flight when the keys were expired can still land a
            // moment later; a second pass removes it.
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            forget_identity(headscale, &tag).await?;
            ctx.nodes.invalidate(headscale.server());
            ctx.pre_auth_keys.invalidate(headscale.server());
            // Garbage collection removes the children; a new resource of the same name
            // must not be taken for them.
            ctx.applied
                .forget_prefixed(&owner.namespace, &owner.names().base);
        }
        Err((reason, message)) => {
            return Err(ReconcileError::HeadscaleUnusable {
                action: format!("clean up node {tag}"),
                reason: "HeadscaleUnusable",
                message: message.clone(),
            });
        }
    }
    publish(
        ctx,
        object,
        kube::runtime::events::EventType::Normal,
        "Cleaned",
        format!("deleted the Headscale node(s) and expired the keys of {tag}"),
    )
    .await;
    Ok(Action::await_change())
}

/// Reads the agent's `/status` from its running pod (admin port on the pod IP). `None` when
/// no pod runs or it does not answer (e.g. a NetworkPolicy keeps the operator out):
/// reachability is then reported as not observed, never guessed.
pub async fn agent_status(
    ctx: &Context,
    owner: &Owner,
) -> Option<tailnet_api::agent_status::StatusReport> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let selector = agent_pod_selector(owner);
    // Served from the apiserver's watch cache (no etcd read on every poll).
    let list = pods
        .list(
            &kube::api::ListParams::default()
                .labels(&selector)
                .match_any(),
        )
        .await
        .ok()?;
    let ip = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .find_map(|p| p.status.as_ref()?.pod_ip.clone())?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip
    };
    let url = format!(
        "http://{host}:{}/status",
        tailnet_api::agent_config::ADMIN_PORT
    );
    let response = ctx.agent_http.get(&url).send().await.ok()?;
    response.json().await.ok()
}

/// Sets a reachability condition (`TargetsReachable`/`BackendsReachable`) from probe views.
/// Returns the per-name probe, for per-target status.
pub fn reachability(
    c: &mut Conditions,
    type_: &str,
    report: Option<&[tailnet_api::agent_status::ProbeView]>,
) -> BTreeMap<String, tailnet_api::agent_status::ProbeView> {
    use tailnet_api::agent_status::ProbeState;
    use tailnet_api::conditions::{Status, reasons};
    let Some(probes) = report else {
        c.set(type_, Status::Unknown, reasons::NOT_OBSERVED, "the agent's /status could not be read (pod not running, or not reachable from the operator)");
        return BTreeMap::new();
    };
    let failing: Vec<_> = probes
        .iter()
        .filter(|p| !matches!(p.state, ProbeState::Reachable | ProbeState::Unknown))
        .collect();
    match failing.first() {
        Some(first) => {
            let list: Vec<String> = failing
                .iter()
                .map(|p| {
                    format!(
                        "{} ({}): {} {}",
                        p.name,
                        p.address,
                        p.state.label(),
                        p.message
                    )
                    .trim()
                    .to_string()
                })
                .collect();
            c.set(type_, Status::False, first.state.label(), list.join("; "));
        }
        None if probes.iter().all(|p| p.state == ProbeState::Unknown) => {
            c.set(
                type_,
                Status::Unknown,
                reasons::NOT_PROBED_YET,
                "no probe result yet (or probing is switched off)",
            );
        }
        None => c.set(
            type_,
            Status::True,
            reasons::REACHABLE,
            "every probed address answers",
        ),
    }
    probes.iter().map(|p| (p.name.clone(), p.clone())).collect()
}

/// `required` plus `optional` conditions that have been observed (not `Unknown`): an
/// unobserved reachability does not block `Ready`, an observed failure does.
pub fn required_with_observed<'a>(
    c: &Conditions,
    required: &[&'a str],
    optional: &[&'a str],
) -> Vec<&'a str> {
    let mut all = required.to_vec();
    for type_ in optional {
        if tailnet_api::conditions::find(&c.list, type_).is_some_and(|x| x.status != "Unknown") {
            all.push(type_);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, tag: &str, online: bool) -> Node {
        Node {
            id,
            tags: vec![tag.to_string()],
            online,
            ..Node::default()
        }
    }

    #[test]
    fn orphaned_keys_are_the_valid_unheld_ones_of_the_tag() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let key = |id, tag: &str, used, minutes: i64| tailnet_headscale::PreAuthKey {
            id,
            used,
            acl_tags: vec![tag.to_string()],
            expiration: Some(now + SignedDuration::from_mins(minutes)),
            ..tailnet_headscale::PreAuthKey::default()
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
        assert_eq!(find_node(&nodes, "tag:a").map(|n| n.id), Some(1));
        let nodes = vec![node(1, "tag:a", false), node(2, "tag:a", false)];
        assert_eq!(find_node(&nodes, "tag:a").map(|n| n.id), Some(2));
        assert!(find_node(&nodes, "tag:c").is_none());
    }

    fn probe(
        name: &str,
        state: tailnet_api::agent_status::ProbeState,
    ) -> tailnet_api::agent_status::ProbeView {
        tailnet_api::agent_status::ProbeView {
            name: name.into(),
            address: "192.0.2.10:5432".into(),
            state,
            message: String::new(),
            last_probe: None,
        }
    }

    #[test]
    fn reachability_names_the_first_failing_cause() {
        use tailnet_api::agent_status::ProbeState;
        let conditions = || Conditions {
            list: Vec::new(),
            generation: Some(1),
            now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        };
        let mut c = conditions();
        reachability(
            &mut c,
            "TargetsReachable",
            Some(&[
                probe("db", ProbeState::Reachable),
                probe("api", ProbeState::NoRoute),
            ]),
        );
        let cond = &c.list[0];
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "NoRoute")
        );
        assert!(cond.message.starts_with("api (192.0.2.10:5432): NoRoute"));
        let mut c = conditions();
        reachability(&mut c, "TargetsReachable", None);
        assert_eq!(c.list[0].status, "Unknown");
        assert_eq!(
            required_with_observed(&c, &["A"], &["TargetsReachable"]),
            vec!["A"],
            "unobserved does not block Ready"
        );
        let mut c = conditions();
        reachability(
            &mut c,
            "TargetsReachable",
            Some(&[probe("db", ProbeState::Reachable)]),
        );
        assert_eq!(c.list[0].reason, "Reachable");
        assert_eq!(
            required_with_observed(&c, &["A"], &["TargetsReachable"]),
            vec!["A", "TargetsReachable"]
        );
    }

    #[test]
    fn deployment_without_status_is_not_ready() {
        assert!(!deployment_state(None).0);
        assert!(!deployment_state(Some(&Deployment::default())).0);
    }
}
