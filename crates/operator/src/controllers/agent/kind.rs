//! The I/O half of an agent-backed kind: what its gather and act steps read and write beyond
//! what every agent shares, and how its controller is wired. The pure half is
//! [`super::decide::Decide`]; a kind implements both and is registered in
//! `controllers::agent_kinds`.

use std::future::Future;

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tailnet_render::meta::Owner;

use super::super::access::TailnetAccess;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::decide::{Admission, AgentPlan, Decide};
use super::observation::AgentObserved;

/// What the kind's gather step gets from the generic one.
#[derive(Clone, Copy)]
pub struct GatherInput<'a> {
    /// The Tailnet and its Headscale client.
    pub access: &'a TailnetAccess,
    /// The agent's owner (names and namespace of its objects).
    pub owner: &'a Owner,
    /// What was observed of the agent (e.g. Headscale's node list).
    pub agent: &'a AgentObserved,
}

/// An agent-backed kind: its decisions ([`Decide`]), its own reads and writes, its wiring.
pub trait AgentKind:
    Decide<Object: Resource<Scope = NamespaceResourceScope> + Serialize + DeserializeOwned>
{
    /// Label of the kind's reconcile metrics and prefix of its backoff keys.
    const CONTROLLER: &'static str;
    /// Its agents own Services in the operator namespace (egress target Services): the shared
    /// cache of those triggers its controller.
    const OWNS_OPERATOR_SERVICES: bool = false;

    /// The watch of the kind's objects (e.g. a label selector).
    fn watcher_config() -> watcher::Config {
        watcher::Config::default()
    }

    /// Watches of other objects that should reconcile the kind's objects (e.g. the routes of
    /// a Gateway); the Tailnet, the agent's Deployment and the shared caches are wired for
    /// every kind.
    fn extra_watches(
        controller: Controller<Self::Object>,
        _client: &kube::Client,
    ) -> Controller<Self::Object> {
        controller
    }

    /// Whether the controller takes `object` on, when deciding that needs a read (e.g. a
    /// Gateway's class); by default [`Decide::admit`].
    fn admission(
        ctx: &Context,
        object: &Self::Object,
        now: jiff::Timestamp,
    ) -> impl Future<Output = Result<Admission<Self::Status>, ReconcileError>> + Send {
        async move { Ok(Self::admit(object, &ctx.config, now)) }
    }

    /// The name of the object's Tailnet when it is not on the object itself (e.g. a
    /// Gateway's comes from its class's parameters); by default [`Decide::tailnet_name`].
    fn tailnet_of(
        ctx: &Context,
        object: &Self::Object,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = ctx;
        async move { Self::tailnet_name(object).map(str::to_string) }
    }

    /// Reads what the kind's decisions need besides the agent (after the agent's gather).
    fn gather(
        ctx: &Context,
        object: &Self::Object,
        intent: &Self::Intent,
        input: GatherInput<'_>,
    ) -> impl Future<Output = Result<Self::Observed, ReconcileError>> + Send;

    /// Applies the kind's own objects, after the agent's ServiceAccount, Role, Secrets,
    /// ConfigMap and NetworkPolicy and before its key and Deployment.
    fn act(
        ctx: &Context,
        object: &Self::Object,
        plan: &AgentPlan<Self>,
    ) -> impl Future<Output = Result<Self::Acted, ReconcileError>> + Send;
}
