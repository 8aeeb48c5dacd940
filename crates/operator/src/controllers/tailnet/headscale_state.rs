//! What the Tailnet controller reads from Headscale in one reconcile.

use std::net::IpAddr;

use ipnet::IpNet;
use tailnet_api::Tailnet;
use tailnet_headscale::{Client, Node};
use tailnet_policy::ObservedNode;

use super::super::context::Context;

pub struct HeadscaleState {
    pub client: Option<Client>,
    /// Server version when reachable with a working key, else reason and message.
    pub reachability: Result<String, (String, String)>,
    pub nodes: Vec<Node>,
    pub policy_nodes: Vec<ObservedNode>,
    /// False when the node list could not be read (then nothing is approved or removed).
    pub nodes_known: bool,
    pub live_policy: Option<String>,
}

/// Converts a Headscale node into the policy renderer's plain data, skipping unparsable
/// addresses/routes (a newer Headscale may add formats we do not know).
pub fn observed_node(node: &Node) -> ObservedNode {
    let parse_ips = |v: &[String]| {
        v.iter()
            .filter_map(|s| s.parse::<IpAddr>().ok())
            .collect::<Vec<_>>()
    };
    let parse_nets = |v: &[String]| {
        v.iter()
            .filter_map(|s| s.parse::<IpNet>().ok())
            .collect::<Vec<_>>()
    };
    ObservedNode {
        id: node.id,
        name: if node.given_name.is_empty() {
            node.name.clone()
        } else {
            node.given_name.clone()
        },
        tags: node.tags.clone(),
        ip_addresses: parse_ips(&node.ip_addresses),
        available_routes: parse_nets(&node.available_routes),
        approved_routes: parse_nets(&node.approved_routes),
        online: node.online,
    }
}

pub async fn observe(ctx: &Context, tailnet: &Tailnet) -> HeadscaleState {
    let mut state = HeadscaleState {
        client: None,
        reachability: Err(("Unknown".to_string(), String::new())),
        nodes: Vec::new(),
        policy_nodes: Vec::new(),
        nodes_known: false,
        live_policy: None,
    };
    let key = match super::read_api_key(ctx, tailnet).await {
        Ok(key) => key,
        Err(problem) => {
            state.reachability = Err(problem);
            return state;
        }
    };
    let client = match ctx.headscale(&tailnet.spec.server, &key) {
        Ok(client) => client,
        Err(e) => {
            state.reachability = Err((e.reason().to_string(), format!("{e}; fix spec.server")));
            return state;
        }
    };
    let version = match client.version().await {
        Ok(v) => v.version,
        Err(e) => {
            state.reachability = Err((
                e.reason().to_string(),
                format!("Headscale at {} is not reachable: {e}", tailnet.spec.server),
            ));
            return state;
        }
    };
    if let Err(e) = client.health().await {
        state.reachability = Err((e.reason().to_string(), e.to_string()));
        return state;
    }
    state.reachability = Ok(version);
    match client.list_nodes().await {
        Ok(nodes) => {
            state.policy_nodes = nodes.iter().map(observed_node).collect();
            state.nodes = nodes;
            state.nodes_known = true;
        }
        Err(e) => {
            tracing::warn!(tailnet = %tailnet.spec.server, error = %e, "listing nodes failed")
        }
    }
    match client.get_policy().await {
        Ok(policy) => state.live_policy = Some(policy.policy),
        Err(e) => tracing::warn!(error = %e, "reading the live policy failed"),
    }
    state.client = Some(client);
    state
}
