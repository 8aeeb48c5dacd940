//! Headscale's nodes as the egress target classification sees them (read by the gather step
//! for the grant checks and by `decide` for the status).

use std::net::IpAddr;

use jiff::Timestamp;
use tailnet_headscale::Node;
use tailnet_render::targets::NodeView;

/// Headscale's nodes as the target classification sees them (`now` decides expiry).
pub fn node_views(nodes: &[Node], now: Timestamp) -> Vec<NodeView> {
    let rfc3339 = |t: &Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    nodes
        .iter()
        .map(|n| NodeView {
            id: n.id,
            name: if n.given_name.is_empty() {
                n.name.clone()
            } else {
                n.given_name.clone()
            },
            user: n.user.as_ref().map(|u| u.name.clone()),
            tags: n.tags.clone(),
            ips: n
                .ip_addresses
                .iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .collect(),
            online: n.online,
            // Only while offline: an online node's last-seen time moves on every poll.
            last_seen: n
                .last_seen
                .as_ref()
                .filter(|_| !n.online)
                .filter(|t| t.as_second() > 0)
                .map(rfc3339),
            // Headscale reports "no expiry" as the zero time (year 1).
            expired_at: n
                .expiry
                .as_ref()
                .filter(|t| t.as_second() > 0 && **t <= now)
                .map(rfc3339),
        })
        .collect()
}
