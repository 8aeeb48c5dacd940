//! Controllers, each as gather → decide → act: the gather step reads what the decision needs
//! (Kubernetes objects, Headscale state, the agent's report) into one observation; `decide`
//! is pure and returns the status (every condition) and what to apply or ask Headscale to
//! do; the act step carries it out (server-side apply with one field manager, Headscale
//! calls), then the status is written once when it changed.
//!
//! Modules, from the ground up: `error`, `config` and `status` (plain data, the condition
//! toolkit), `applied` and `shared_list` (what this process remembers), `context`, `kube_io`
//! and `publish` (thin Kubernetes I/O), `access` (a Tailnet and its Headscale client), then
//! the controllers: `tailnet`, and `agent` — the one controller of every agent-backed kind —
//! with its kinds `egress`, `ingress` and `service` (Services of the tailnet
//! `loadBalancerClass`), registered in [`agent_kinds`]. Each controller wires
//! itself (`agent/wiring.rs`, `tailnet/wiring.rs`). Decide modules import only pure modules
//! (checked by `purity_check`).

pub mod access;
pub mod agent;
pub mod applied;
pub mod config;
pub mod context;
pub mod egress;
pub mod entrances;
pub mod error;
pub mod gateway;
pub mod gateway_class;
pub mod ingress;
pub mod instrument;
pub mod kube_io;
pub mod publish;
#[cfg(test)]
mod purity_check;
pub mod reach;
#[cfg(test)]
pub mod reason_coverage;
pub mod service;
pub mod shared_list;
pub mod status;
pub mod tailnet;
#[cfg(test)]
pub mod test_fixtures;

use agent::wiring::{Registration, register};

/// The agent-backed kinds the operator runs: one line per kind (its folder implements
/// `agent::decide::Decide` and `agent::kind::AgentKind`). `gateway_api`: the Gateway API
/// CRDs are installed (else the Gateway kind is not registered).
pub fn agent_kinds(gateway_api: bool) -> Vec<Box<dyn Registration>> {
    let mut kinds = vec![
        register::<egress::Egress>(),
        register::<ingress::Ingress>(),
        register::<service::LoadBalancer>(),
    ];
    if gateway_api {
        kinds.push(register::<gateway::GatewayEntrance>());
    }
    kinds
}
