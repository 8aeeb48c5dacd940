//! The TailnetIngress kind: one agent per ingress in the application's namespace (tagged
//! node, Deployment, NetworkPolicy — see `agent/`) plus what is the ingress's own: names from
//! the Tailnet's templates with claims (first claim wins), a certificate that must cover
//! every http name before http is served, backends, and grants from `allowFrom`.

pub mod act;
pub mod certificates;
pub mod decide;
pub mod desired;
pub mod gather;
pub mod observation;
#[cfg(test)]
mod tests;

use tailnet_api::TailnetIngress;
use tailnet_api::validate::ValidIngress;

use super::agent::decide::AgentPlan;
use super::agent::kind::{AgentKind, GatherInput};
use super::context::Context;
use super::error::ReconcileError;
use decide::Acted;
pub use decide::Ingress;
use observation::IngressObserved;

impl AgentKind for Ingress {
    const CONTROLLER: &'static str = "ingress";

    async fn gather(
        ctx: &Context,
        ingress: &TailnetIngress,
        valid: &ValidIngress,
        input: GatherInput<'_>,
    ) -> Result<IngressObserved, ReconcileError> {
        gather::gather(ctx, ingress, valid, input).await
    }

    async fn act(
        ctx: &Context,
        _ingress: &TailnetIngress,
        plan: &AgentPlan<Ingress>,
    ) -> Result<Acted, ReconcileError> {
        act::act(ctx, plan).await
    }
}
