//! Controllers, each as gather → decide → act: the gather step reads what the decision needs
//! (Kubernetes objects, Headscale state, the agent's report) into one observation; `decide`
//! is pure and returns the status (every condition) and what to apply or ask Headscale to
//! do; the act step carries it out (server-side apply with one field manager, Headscale
//! calls), then the status is written once when it changed.
//!
//! Modules, from the ground up: `error`, `status` (pure condition toolkit), `applied` and
//! `shared_list` (what this process remembers), `context`, `kube_io` and `publish` (thin
//! Kubernetes I/O), `access`, `identity`, `agent_report`, `agent_conditions`, `lifecycle`
//! (what both agent kinds share), `certificates`, then the three controllers.

pub mod access;
pub mod agent_conditions;
pub mod agent_gather;
pub mod agent_report;
pub mod applied;
pub mod certificates;
pub mod config;
pub mod context;
pub mod egress;
pub mod error;
pub mod identity;
pub mod ingress;
pub mod instrument;
pub mod kube_io;
pub mod lifecycle;
pub mod publish;
#[cfg(test)]
pub mod reason_coverage;
pub mod shared_list;
pub mod status;
pub mod tailnet;
#[cfg(test)]
pub mod test_fixtures;
