//! The Gateways of a Tailnet as the Tailnet controller reads its entrances (I/O: each
//! Gateway's class and parameters are read): their tags, grants (`allowFrom` of the class's
//! parameters to the listener ports) and listener hostnames (DNS records), through
//! `tailnet_render::gateway::intent`.

use tailnet_gateway_api::Gateway;
use tailnet_render::gateway::intent::gateway_intent;
use tailnet_render::intent::IngressIntent;

use super::super::access::default_tailnet;
use super::super::context::Context;
use super::super::error::ReconcileError;
use super::gather::class_state;
use super::observation::ClassState;

/// The intents of the cached Gateways whose class is ours and Accepted and whose Tailnet is
/// `tailnet`. A class that cannot be read now fails the render (retried): grants never come
/// and go with a transient read error.
pub async fn of_tailnet(
    ctx: &Context,
    tailnet: &str,
) -> Result<Vec<IngressIntent>, ReconcileError> {
    let default = default_tailnet(ctx).ok();
    let mut intents = Vec::new();
    for gateway in ctx.kinds.objects::<Gateway>() {
        let class = class_state(ctx, &gateway).await?;
        intents.extend(intent_in(&gateway, &class, default.as_deref(), tailnet));
    }
    Ok(intents)
}

/// The intent of `gateway` when its class (`class`) is ours and Accepted and its Tailnet (the
/// parameters', else `default`) is `tailnet` (pure; `tailnet-operator render` calls it too).
pub fn intent_in(
    gateway: &Gateway,
    class: &ClassState,
    default: Option<&str>,
    tailnet: &str,
) -> Option<IngressIntent> {
    let ClassState::Ours(Ok(parameters)) = class else {
        return None;
    };
    let own = parameters.tailnet.as_deref().or(default);
    (own == Some(tailnet)).then(|| gateway_intent(gateway, tailnet, parameters))
}
