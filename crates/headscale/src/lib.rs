//! Headscale REST API v1 client.
//!
//! Placeholder: the typed client (policy, nodes, routes, pre-auth and API keys) arrives with
//! the Tailnet controller. The observed-state types the renderers consume live in
//! `tailnet-policy` so that they stay pure data.
