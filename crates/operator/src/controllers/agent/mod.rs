//! The one agent-resource controller, generic over the kind. Everything the agent-backed
//! kinds share runs here once: Tailnet access, the identity (tag, node, pre-auth key,
//! forgetting it), the agent's ServiceAccount/Role/Secrets/ConfigMap/NetworkPolicy/Deployment,
//! the agent's `/status` report, the finalizer and cleanup, the status publish, the reconcile
//! metrics, the poll interval, and the controller's wiring.
//!
//! A kind (a folder next to this one, e.g. `egress/`, `ingress/`) implements [`decide::Decide`]
//! (pure: its intent, its conditions, its objects) in its `decide.rs` and [`kind::AgentKind`]
//! (its own gather and act steps, wiring extras) in its `mod.rs`, and is registered with one
//! line in `controllers::agent_kinds`.
//!
//! Pure modules (no I/O; what decide steps may import): `decide`, `identity`, `conditions`,
//! `observation`. The rest reads and writes: `gather`, `report`, `keys`, `act`, `lifecycle`,
//! `reconcile`, `wiring`, `fan_out`, `kind`.
//!
//! Adding a kind touches, in the operator: a new folder `controllers/<kind>/` (`decide.rs`:
//! the marker type and `impl Decide`; `mod.rs`: `impl AgentKind`; its observation, gather and
//! act modules) and one line in `controllers::agent_kinds` (plus its `pub mod`). Outside:
//! its API type and an `AgentKind` variant (`tailnet_api::naming`), its rendered objects
//! (`tailnet_render`, with `pod::agent_pods` saying how many pods it runs), the CLI's offline
//! render, RBAC in the chart, and docs. A kind that reconciles only some objects of a type
//! (the `service` kind: Services of one `loadBalancerClass`) answers
//! [`decide::Admission::Ignore`] for the others; one it handled before is released
//! (`lifecycle::release`: agent, identity, status, finalizer). Its objects' owner references
//! take the kind's `apiVersion` (`AgentKind::api_version`), and its Tailnet may be the default
//! one ([`decide::Decide::tailnet_name`] returns `None`).

pub mod act;
pub mod conditions;
pub mod decide;
pub mod fan_out;
pub mod gather;
pub mod identity;
pub mod keys;
pub mod kind;
pub mod lifecycle;
pub mod observation;
pub mod reconcile;
pub mod report;
pub mod wiring;
