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
        let ClassState::Ours(Ok(parameters)) = class_state(ctx, &gateway).await? else {
            continue;
        };
        let own = parameters.tailnet.as_deref().or(default.as_deref());
        if own == Some(tailnet) {
            intents.push(gateway_intent(&gateway, tailnet, &parameters.allow_from));
        }
    }
    Ok(intents)
}
