//! The TailnetEgress kind: one agent per egress in the operator namespace (tagged node,
//! Deployment, NetworkPolicy — see `agent/`) plus what is the egress's own: a Service per
//! target, Headscale's grant checks for MagicDNS targets, each target's class (subnet route,
//! tailnet node, MagicDNS name, DNS name) and its route in the status.

pub mod act;
pub mod decide;
pub mod gather;
pub mod node_views;
pub mod observation;
#[cfg(test)]
mod tests;

use tailnet_api::TailnetEgress;
use tailnet_api::validate::ValidEgress;

use super::agent::decide::AgentPlan;
use super::agent::kind::{AgentKind, GatherInput};
use super::context::Context;
use super::error::ReconcileError;
pub use decide::Egress;
use observation::EgressObserved;

impl AgentKind for Egress {
    const CONTROLLER: &'static str = "egress";
    const OWNS_OPERATOR_SERVICES: bool = true;

    async fn gather(
        ctx: &Context,
        egress: &TailnetEgress,
        _intent: &ValidEgress,
        input: GatherInput<'_>,
    ) -> Result<EgressObserved, ReconcileError> {
        gather::gather(ctx, egress, input).await
    }

    async fn act(
        ctx: &Context,
        _egress: &TailnetEgress,
        plan: &AgentPlan<Egress>,
    ) -> Result<(), ReconcileError> {
        act::act(ctx, plan).await
    }
}
