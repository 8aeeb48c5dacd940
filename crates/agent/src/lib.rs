//! `tailnet-agent`: the data plane of tailnet-operator. It runs next to tailscaled
//! (`--tun=userspace-networking`) in the agent pod, talks to it only through the LocalAPI
//! unix socket, and is configured only by the JSON file of
//! [`tailnet_api::agent_config::AgentConfig`].
//!
//! - egress: pod IP:port → LocalAPI dial through the tailnet ([`dial`], [`listeners`]);
//! - per-listener and per-agent connection limits ([`limits`]);
//! - ingress `tcp`: 127.0.0.1:port → backend ([`listeners`], zero-copy via [`splice`]);
//! - ingress `http`: TLS termination, virtual hosts, reverse proxy ([`proxy`], [`site`]),
//!   a certificate per route chosen by SNI ([`tls`], [`certificates`]);
//! - ingress `plainHttp`: the same without TLS (Gateway API `HTTP` listeners);
//! - Gateway API HTTP rules: matches, filters, weighted backends ([`http_rules`]);
//! - ingress `tlsPassthrough`: routed by the ClientHello's SNI, relayed unopened
//!   ([`passthrough`]);
//! - HTTP/1.1 header read timeout: one timer per connection, not per request
//!   ([`header_timeout`]);
//! - connection threads: each connection runs on one single-threaded runtime ([`workers`]),
//!   each giving a burst's memory back when it is over ([`memory`]);
//! - admin: `/metrics`, `/livez`, `/readyz`, `/status` on the pod IP ([`admin`]).

pub mod admin;
pub mod backend;
pub mod body;
pub mod certificates;
pub mod config;
pub mod dedicated;
pub mod dial;
pub mod drain;
pub mod header_timeout;
pub mod headers;
pub mod http_rules;
pub mod limits;
pub mod listeners;
pub mod localapi;
pub mod login;
pub mod memory;
pub mod metrics;
pub mod passthrough;
pub mod probe;
pub mod proxy;
pub mod relay;
pub mod routing;
pub mod run;
pub mod site;
pub mod splice;
pub mod state;
pub mod tls;
pub mod workers;
