//! The Service kind: a `Service` of `type: LoadBalancer` and `loadBalancerClass:
//! tailnet-operator.dev/tailnet` gets one agent (one tailnet identity) exposing its TCP ports
//! on the tailnet, decided as the TailnetIngress it stands for (`decide.rs`); every other
//! Service is never touched. Its own reads (`gather.rs`): the Tailnet's ingresses and other
//! such Services (claims on tags and names) and the Service itself as the backend. Its own
//! act: Warning Events when ports or sources are refused.

pub mod decide;
pub mod gather;
#[cfg(test)]
mod tests;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::events::EventType;
use tailnet_api::conditions::{self, reasons, types};

use super::agent::decide::AgentPlan;
use super::agent::kind::{AgentKind, GatherInput};
use super::context::Context;
use super::error::ReconcileError;
use super::ingress::observation::IngressObserved;
use super::publish::event;
pub use decide::LoadBalancer;
use decide::{ServiceIntent, ports_problem};

impl AgentKind for LoadBalancer {
    const CONTROLLER: &'static str = "service";

    async fn gather(
        ctx: &Context,
        service: &Service,
        intent: &ServiceIntent,
        input: GatherInput<'_>,
    ) -> Result<IngressObserved, ReconcileError> {
        gather::gather(ctx, service, intent, input).await
    }

    /// Warning Events when a port or a source is refused (once per change of what is
    /// refused: the Service's conditions say it meanwhile).
    async fn act(
        ctx: &Context,
        service: &Service,
        plan: &AgentPlan<LoadBalancer>,
    ) -> Result<(), ReconcileError> {
        super::ingress::act::in_cluster_service(ctx, &plan.owner, plan.objects.as_ref()).await?;
        let previous = service
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let shown = |type_: &str| conditions::find(previous, type_).map(|c| c.message.clone());
        if let Some(problem) = ports_problem(&plan.kind.refused)
            && shown(types::PORTS_SUPPORTED).as_ref() != Some(&problem.message)
        {
            event(
                ctx,
                service,
                EventType::Warning,
                problem.reason,
                "Reconcile",
                problem.message,
            )
            .await;
        }
        let not_allowed = plan.kind.ingress.not_allowed();
        let sources_refused = conditions::find(previous, types::SOURCES_ALLOWED)
            .is_some_and(|c| c.reason == reasons::SOURCE_NOT_ALLOWED);
        if !not_allowed.is_empty() && !sources_refused {
            event(
                ctx,
                service,
                EventType::Warning,
                reasons::SOURCE_NOT_ALLOWED,
                "Reconcile",
                format!(
                    "{} not in the Tailnet's policy.ingressSourceAllowlist: they get no grant (annotation {})",
                    not_allowed.join(", "),
                    tailnet_api::service::annotations::ALLOW_FROM
                ),
            )
            .await;
        }
        Ok(())
    }
}
