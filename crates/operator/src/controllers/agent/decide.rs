//! The decide step of every agent-backed kind (pure), generic over the kind: the Tailnet,
//! the identity (tag, node, key) and `Ready` are decided here once; the kind decides what is
//! its own in two steps around the identity ([`Decide::plan`] before, [`Decide::report`]
//! after), which keeps every kind's conditions in the order they always had.
//!
//! A kind is a type implementing [`Decide`] (this pure half, in its `decide.rs`) and
//! `AgentKind` (the I/O half, `kind.rs`: its gather and act steps and its wiring).

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::{Resource, ResourceExt};
use tailnet_api::Tailnet;
use tailnet_api::conditions::types;
use tailnet_api::naming::{AgentKind, AgentNames};
use tailnet_api::validate::FieldError;
use tailnet_headscale::Node;
use tailnet_render::images::Images;
use tailnet_render::meta::Owner;
use tailnet_render::pod::TailscaledLogin;
use tailnet_render::{RenderContext, RenderError};

use super::super::config::OperatorConfig;
use super::super::status::{ConditionSet, WithConditions};
use super::conditions;
use super::identity::{self, Identity, KeyAction};
use super::observation::{AgentObserved, Observation};

/// The status an agent-backed kind writes.
pub trait AgentStatus: WithConditions + Default + std::fmt::Debug + Send + Sync + 'static {
    /// Records the generation decided (kinds whose status has no such field ignore it; their
    /// conditions carry it).
    fn set_observed_generation(&mut self, generation: Option<i64>);
    /// Records the agent's node (its id and tailnet addresses) once it exists.
    fn record_node(&mut self, node: &Node);
}

/// Whether the controller takes an object on at all, decided before anything is read.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission<S> {
    /// Reconciled: finalizer, agent, status.
    Handle,
    /// Not honoured here: only this status is written (no finalizer, no objects).
    Refuse(S),
    /// Not the controller's object at all (e.g. a Service of another `loadBalancerClass`):
    /// never touched. One it handled before (it carries the finalizer) is released: its agent
    /// and Headscale identity go, its status becomes [`Decide::released`], the finalizer goes.
    Ignore,
}

/// The objects every agent has, borrowed from the kind's rendered objects (listed
/// exhaustively by each kind's [`Decide::agent_objects`], so none can be forgotten).
pub struct AgentObjects<'a> {
    pub service_account: &'a ServiceAccount,
    pub role: &'a Role,
    pub role_binding: &'a RoleBinding,
    pub state_secret: &'a Secret,
    pub config_map: &'a ConfigMap,
    pub network_policy: &'a NetworkPolicy,
    /// Applied last, once everything it mounts exists.
    pub deployment: &'a Deployment,
    /// tailscaled's first login, written with a pre-auth key into the auth Secret.
    pub login: &'a TailscaledLogin,
}

/// The pure half of an agent-backed kind.
pub trait Decide: Sized + std::fmt::Debug + Send + Sync + 'static {
    /// The resource the kind reconciles (namespaced; its own API group or another's).
    type Object: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static;
    type Status: AgentStatus;
    /// The typed intent: the validated spec, built once per reconcile.
    type Intent: Send + Sync;
    /// What the kind's own gather step observes (besides the agent and the Tailnet).
    type Observed: Default + Send + Sync;
    /// The agent's rendered objects (the kind's `tailnet_render` output).
    type Objects: std::fmt::Debug + Send + Sync;
    /// What the kind decided beyond the agent: its own objects for its act step, and what
    /// its [`Decide::report`] reads.
    type Plan: std::fmt::Debug + Send + Sync;
    /// What the kind's act step reports back for the status (see [`Decide::amend`]).
    type Acted: Send;

    const AGENT: AgentKind;
    /// Conditions that must hold for `Ready`, in the order of their dependencies.
    const REQUIRED: &'static [&'static str];
    /// Conditions that count for `Ready` once they have been observed.
    const OBSERVED_IF_KNOWN: &'static [&'static str];

    fn status(object: &Self::Object) -> Option<&Self::Status>;
    /// The name of the Tailnet the object belongs to; `None`: the default Tailnet (the only
    /// one there is).
    fn tailnet_name(object: &Self::Object) -> Option<&str>;
    /// Whether the object is of the kind at all (a kind of a shared type, e.g. Services of one
    /// `loadBalancerClass`, says no for the others: they get [`Admission::Ignore`] and are not
    /// in the kind's `/metrics` conditions).
    fn ours(_object: &Self::Object) -> bool {
        true
    }
    /// Whether the object is taken on (e.g. an egress outside the operator namespace is not).
    fn admit(
        _object: &Self::Object,
        _config: &OperatorConfig,
        _now: Timestamp,
    ) -> Admission<Self::Status> {
        Admission::Handle
    }
    /// Validates the spec into the kind's intent, or names every field to fix.
    fn intent(object: &Self::Object) -> Result<Self::Intent, Vec<FieldError>>;
    /// The tailnet hostnames the agent's node may have with `tag`, the current one first.
    fn hostnames(names: &AgentNames, tag: &str) -> Vec<String>;
    /// Before the identity: the kind's conditions on its own inputs, the agent's tag and its
    /// objects. `None`: nothing is done for the agent (the conditions set say why).
    fn plan(
        input: &Input<'_, Self>,
        c: &mut ConditionSet,
        status: &mut Self::Status,
    ) -> Result<Option<Planned<Self>>, RenderError>;
    /// After the identity: the conditions that depend on the agent (policy, reachability, …).
    fn report(
        input: &Input<'_, Self>,
        planned: &Planned<Self>,
        identity: &Identity,
        c: &mut ConditionSet,
        status: &mut Self::Status,
    );
    /// The agent's shared objects among the kind's rendered objects.
    fn agent_objects(objects: &Self::Objects) -> AgentObjects<'_>;
    /// The tag whose nodes and keys are the object's to forget when it goes (`all`: every
    /// object of the kind in the cache); `None`: nothing in Headscale is its own.
    fn cleanup_tag(
        tailnet: &Tailnet,
        object: &Self::Object,
        all: &[Arc<Self::Object>],
    ) -> Option<String>;
    /// The status of an object the controller stops handling ([`Admission::Ignore`] after it
    /// was handled): what the controller wrote is withdrawn (server-side apply drops the
    /// fields it no longer sets).
    fn released(_status: &Self::Status) -> Self::Status {
        Self::Status::default()
    }
    /// The decided status corrected by what the act step reported.
    fn amend(
        object: &Self::Object,
        status: Self::Status,
        acted: &Self::Acted,
        now: Timestamp,
    ) -> Self::Status;
}

/// What a kind's `plan` and `report` read.
pub struct Input<'a, K: Decide> {
    pub object: &'a K::Object,
    pub intent: &'a K::Intent,
    /// The status as the object has it (the new one starts as a copy).
    pub previous: &'a K::Status,
    pub tailnet: &'a Tailnet,
    pub owner: &'a Owner,
    pub observed: &'a Observation<K::Observed>,
    pub config: &'a OperatorConfig,
    pub now: Timestamp,
}

impl<K: Decide> Input<'_, K> {
    pub fn agent(&self) -> &AgentObserved {
        &self.observed.agent
    }

    pub fn kind(&self) -> &K::Observed {
        &self.observed.kind
    }

    /// What the renderer needs of the Tailnet and the operator.
    pub fn render_context(&self) -> RenderContext<'_> {
        RenderContext {
            operator_namespace: &self.config.operator_namespace,
            tailnet_name: &self.owner.tailnet,
            tailnet: &self.tailnet.spec,
            images: Images::resolve(&self.config.images, self.tailnet.spec.agent.as_ref()),
            cluster_domain: &self.config.cluster_domain,
            server_ca_pem: self
                .observed
                .access
                .as_ref()
                .ok()
                .and_then(|view| view.server_ca.as_deref()),
            cluster_network: self.config.cluster_network.as_ref(),
            restrict_agent_egress: self.config.restrict_agent_egress,
        }
    }
}

/// A kind's plan for its agent.
#[derive(Debug)]
pub struct Planned<K: Decide> {
    pub tag: String,
    /// `None`: the agent is not (re)deployed now (the last good configuration stays applied)
    /// and no pre-auth key is minted for it.
    pub objects: Option<K::Objects>,
    pub plan: K::Plan,
}

/// What the act step does for one object, and the status to write.
#[derive(Debug)]
pub struct Decision<K: Decide> {
    pub status: K::Status,
    /// `None`: nothing is applied (the Tailnet is missing, or the spec is invalid in itself or
    /// in the Tailnet's context: the last valid configuration stays applied).
    pub agent: Option<Box<AgentPlan<K>>>,
}

#[derive(Debug)]
pub struct AgentPlan<K: Decide> {
    pub owner: Owner,
    pub tag: String,
    pub objects: Option<K::Objects>,
    pub key: KeyAction,
    /// A contributor without a Headscale key waits for the owner's key: the Deployment is not
    /// applied yet (a pod started without its key waits for an interactive login instead).
    pub hold_deployment: bool,
    /// The kind's own part.
    pub kind: K::Plan,
}

/// The typed intent; an invalid spec is refused with a decision that only says what to fix
/// (nothing is applied: the last good configuration stays).
pub fn validated<K: Decide>(
    object: &K::Object,
    now: Timestamp,
) -> Result<K::Intent, Box<Decision<K>>> {
    let errors = match K::intent(object) {
        Ok(intent) => return Ok(intent),
        Err(errors) => errors,
    };
    let generation = object.meta().generation;
    let mut status = K::status(object).cloned().unwrap_or_default();
    let conditions = conditions::invalid_spec(status.conditions(), generation, &errors, now);
    status.set_observed_generation(generation);
    *status.conditions_mut() = conditions;
    Err(Box::new(Decision {
        status,
        agent: None,
    }))
}

/// Decides a valid object (see [`validated`]) from what was observed.
pub fn decide<K: Decide>(
    object: &K::Object,
    intent: &K::Intent,
    observed: &Observation<K::Observed>,
    config: &OperatorConfig,
    now: Timestamp,
) -> Result<Decision<K>, RenderError> {
    let previous = K::status(object).cloned().unwrap_or_default();
    let generation = object.meta().generation;
    let mut c = ConditionSet::new(previous.conditions(), generation, now);
    c.remove(types::SPEC_VALID);
    let mut status = previous.clone();
    status.set_observed_generation(generation);
    let view = match &observed.access {
        Ok(view) => view,
        Err(problem) => {
            c.fail(types::TAILNET_READY, problem.clone());
            return Ok(finish(status, c, None));
        }
    };
    conditions::tailnet_ready(&mut c, view);
    let owner = Owner::from_meta(K::AGENT, object.meta(), &view.tailnet.name_any())?;
    let input = Input::<K> {
        object,
        intent,
        previous: &previous,
        tailnet: &view.tailnet,
        owner: &owner,
        observed,
        config,
        now,
    };
    let Some(planned) = K::plan(&input, &mut c, &mut status)? else {
        return Ok(finish(status, c, None));
    };
    let agent = &observed.agent;
    let identity = identity::decide(
        &planned.tag,
        K::hostnames(&owner.names(), &planned.tag),
        &agent.nodes,
        &agent.auth_secret,
        planned.objects.is_some(),
        now,
    );
    // Without a Headscale key, the owner's key for the tag (or waiting for it).
    let identity = match &view.owner_keys {
        Some(keys) => identity::from_owner(identity, keys.get(&planned.tag).copied(), now),
        None => identity,
    };
    if let Some(node) = identity.node() {
        status.record_node(node);
    }
    conditions::identity(&mut c, &identity, &agent.nodes, agent.deployment.as_ref());
    K::report(&input, &planned, &identity, &mut c, &mut status);
    let Planned { tag, objects, plan } = planned;
    let agent = AgentPlan {
        owner: owner.clone(),
        tag,
        objects,
        // Without a Headscale key: no pod before it has the owner's key (or a node).
        hold_deployment: view.owner_keys.is_some()
            && identity.node().is_none()
            && !matches!(identity.key_state, identity::KeyState::Waiting { .. }),
        key: identity.key,
        kind: plan,
    };
    Ok(finish(status, c, Some(Box::new(agent))))
}

fn finish<K: Decide>(
    mut status: K::Status,
    c: ConditionSet,
    agent: Option<Box<AgentPlan<K>>>,
) -> Decision<K> {
    *status.conditions_mut() = c.finish(K::REQUIRED, K::OBSERVED_IF_KNOWN);
    Decision { status, agent }
}
