//! Real Headscale 0.29 and real tailscaled nodes for tests, on top of the [`tno_netlab`] lab.
//!
//! - [`Headscale`]: runs in the root netns on `127.0.0.1:<port>`, HTTPS with a certificate of
//!   the run's [`LabCa`] (sqlite, `policy.mode: database`, embedded DERP on the same TLS
//!   listener, MagicDNS base domain [`BASE_DOMAIN`], `dns.extra_records_path`), exposed in the
//!   lab as `https://10.244.0.1:<port>` (its `server_url`); an admin API key is created with
//!   the CLI. [`HeadscaleApi`] covers users,
//!   pre-auth keys (always with `expiration`), nodes, route approval and policy.
//! - [`TailscaleNode`]: `tailscaled --tun=userspace-networking` inside a netns, with its own
//!   state dir and LocalAPI socket, logged in with `tailscale up --authkey`; or, with
//!   [`TunMode::Kernel`], a `tailscale0` TUN device whose routes let every process of the
//!   netns reach tailnet IPs with plain sockets ([`JoinOptions::tun`]). [`LocalApi`] is an
//!   async client for `status`, `whois` and `dial` (`Upgrade: ts-dial`, answering
//!   [`Dialed::Tailnet`] or [`Dialed::DialSelf`]).
//! - [`TailnetEnv`]: lab + Headscale + [`RemoteSite`] (`<run>-remote`: 192.0.2.10:5432 and
//!   [fd00:5ee::10]:5432 echo, 198.51.100.20:443 TLS banner (own CA), DNS server 192.0.2.53
//!   for `site.internal` (Headscale split DNS), subnet router `tag:router` advertising [`SITE_ROUTES`], routes
//!   not approved) + [`Laptop`] (`<run>-laptop`: user `alice` in `group:team-a`), and
//!   [`TailnetEnv::join_node`] for more tagged nodes; [`TailnetEnv::start_second_headscale`]
//!   adds an independent Headscale with its own router and laptop node ([`SecondHeadscale`]). [`TailnetEnv::shared`] gives one per test
//!   process, torn down at exit. [`TailnetEnv::start_in`] builds the same inside another
//!   environment's lab (the Kubernetes one, so pods join the same tailnet).
//!
//! Binaries come from `deps/build.sh` (see [`Binaries::locate`]). Child process output goes to
//! log files under the run's scratch dir; [`TailnetEnv::log_report`] collects their tails.

mod api;
mod binaries;
mod env;
mod error;
mod headscale;
mod lab_ca;
mod localapi;
mod node;
mod servers;

pub use api::{ApiError, HeadscaleApi, Node, PreAuthKey, PreAuthKeyRequest, User};
pub use binaries::Binaries;
pub use env::{
    ADMIN_USER, CLIENT_TAG, DEVICE_BANNER_TEXT, DEVICE_ECHO_PORT, DEVICE_HOSTNAME, DEVICE_LAB_ADDR,
    DEVICE_TLS_PORT, DEVICE_USER, Device, JoinOptions, JoinedNode, LAPTOP_LAB_ADDR, LAPTOP_USER,
    Laptop, REMOTE_SITE_LAB_ADDR, ROUTER_TAG, RemoteSite, SERVER_PORT, SERVER_TAG, SITE_API_NAME,
    SITE_BANNER, SITE_BANNER_TEXT, SITE_DB_NAME, SITE_DNS, SITE_DNS_ZONE, SITE_ECHO, SITE_ECHO_V6,
    SITE_ROUTES, SITE_V6_ROUTE, SecondHeadscale, TEAM_A_GROUP, TailnetEnv,
};
pub use error::{Result, TailnetError};
pub use headscale::{BASE_DOMAIN, EXTRA_RECORDS_FILE, ExtraRecord, Headscale};
pub use lab_ca::{LAB_CA_FILE, LabCa, ServingCert};
pub use localapi::{
    Dialed, DialedStream, LocalApi, LocalApiError, PeerStatus, Status, UserProfile, WhoIs,
    WhoIsNode,
};
pub use node::{KERNEL_TUN_DEVICE, NodeConfig, TailscaleNode, TunMode};
pub use servers::{Behaviour, DnsRecord, DnsTestServer, TcpTestServer};
