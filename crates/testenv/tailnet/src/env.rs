//! The tailnet side of the test environment: lab, Headscale, remote site with a subnet router,
//! a laptop node, and helpers to join more nodes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use tno_netlab::{Lab, Netns, RunId, cleanup_stale_runs};

use crate::api::{PreAuthKeyRequest, User};
use crate::binaries::Binaries;
use crate::error::{Result, TailnetError};
use crate::headscale::Headscale;
use crate::node::{NodeConfig, TailscaleNode, TunMode};
use crate::servers::{Behaviour, DnsRecord, DnsTestServer, TcpTestServer};

/// Lab address of the remote-site netns.
pub const REMOTE_SITE_LAB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 10);
/// Lab address of the laptop netns.
pub const LAPTOP_LAB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 11);
/// Nodes joined with [`TailnetEnv::join_node`] get lab addresses from here upwards.
const FIRST_NODE_HOST: u8 = 20;

/// TCP echo server at the remote site, reachable only through the subnet router.
pub const SITE_ECHO: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 10), 5432);
/// TLS server at the remote site: completes a handshake with its own certificate for
/// [`SITE_API_NAME`] (issued by [`RemoteSite::ca_pem`]), writes [`SITE_BANNER_TEXT`] inside the
/// session and closes. Stands in for a remote HTTPS API that the egress must not terminate.
pub const SITE_BANNER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 20), 443);
pub const SITE_BANNER_TEXT: &str = "remote-site 198.51.100.20:443\n";
/// The name in the remote site's certificate (and the egress alias the tests use).
pub const SITE_API_NAME: &str = "api.site.example.net";
/// TCP echo server at the remote site on its IPv6 ULA network ([`SITE_V6_ROUTE`]).
pub const SITE_ECHO_V6: SocketAddrV6 = SocketAddrV6::new(
    Ipv6Addr::new(0xfd00, 0x5ee, 0, 0, 0, 0, 0, 0x10),
    5432,
    0,
    0,
);
/// The remote site's IPv6 ULA prefix, advertised by the router besides the IPv4 ones.
pub const SITE_V6_ROUTE: &str = "fd00:5ee::/64";
/// Routes the subnet router advertises.
pub const SITE_ROUTES: [&str; 3] = ["192.0.2.0/24", "198.51.100.0/24", SITE_V6_ROUTE];
// The remote site's DNS server and zone live beside Headscale's DNS config, which hands them
// out as split DNS.
pub use crate::headscale::{SITE_DNS, SITE_DNS_ZONE};
/// A site-internal name: A 192.0.2.10 and AAAA fd00:5ee::10, both the site's echo servers.
pub const SITE_DB_NAME: &str = "db.site.internal";

/// The tailnet device ([`TailnetEnv::start_device`]): hostname (= MagicDNS given name),
/// owner, and the ports its servers listen on (loopback IPv4 and IPv6; tailscaled's
/// userspace networking delivers connections to its tailnet addresses there).
pub const DEVICE_HOSTNAME: &str = "nas";
pub const DEVICE_USER: &str = "dana";
pub const DEVICE_ECHO_PORT: u16 = 7100;
pub const DEVICE_TLS_PORT: u16 = 7443;
pub const DEVICE_BANNER_TEXT: &str = "nas device\n";
/// The device's lab address.
pub const DEVICE_LAB_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 12);

pub const ROUTER_TAG: &str = "tag:router";
pub const CLIENT_TAG: &str = "tag:client";
pub const SERVER_TAG: &str = "tag:server";
/// The port on `tag:server` nodes that the base policy opens to `tag:client` and team-a.
pub const SERVER_PORT: u16 = 7000;
pub const ADMIN_USER: &str = "admin";
pub const LAPTOP_USER: &str = "alice";
pub const TEAM_A_GROUP: &str = "group:team-a";

/// The remote site netns `<run>-remote`: 192.0.2.10 and 198.51.100.20 on its loopback, test
/// servers on them, and a subnet router tagged `tag:router` advertising [`SITE_ROUTES`]
/// (not approved: tests approve via the API).
#[derive(Debug)]
pub struct RemoteSite {
    // Field order is drop order: processes and servers before their netns.
    pub router: TailscaleNode,
    _echo: TcpTestServer,
    _echo_v6: TcpTestServer,
    _banner: TcpTestServer,
    _dns: DnsTestServer,
    /// PEM of the CA that issued the site's certificate (clients verify against it).
    pub ca_pem: String,
    pub netns: Netns,
}

/// A device that is itself on the tailnet (a NAS running tailscale): netns `<run>-nas` with a
/// node owned by user [`DEVICE_USER`], named [`DEVICE_HOSTNAME`] (MagicDNS
/// `nas.<BASE_DOMAIN>`), a TCP echo on [`DEVICE_ECHO_PORT`] and a TLS banner on
/// [`DEVICE_TLS_PORT`] (certificate for the MagicDNS name from [`Device::ca_pem`]), both on
/// its tailnet IPv4 and IPv6 addresses. [`Device::switch_off`] / [`Device::switch_on`] stop
/// and restart its tailscaled (same node, no new login).
#[derive(Debug)]
pub struct Device {
    pub node: TailscaleNode,
    _servers: Vec<TcpTestServer>,
    pub ca_pem: String,
    pub user: User,
    pub netns: Netns,
}

impl Device {
    /// Stops its tailscaled: Headscale marks the node offline.
    pub fn switch_off(&self) {
        self.node.kill();
    }

    /// Starts its tailscaled again and waits until it is `Running`.
    pub async fn switch_on(&self, binaries: &Binaries) -> Result<()> {
        self.node.restart(binaries).await
    }

    /// The device's MagicDNS name.
    pub fn magic_dns_name(&self) -> String {
        format!("{DEVICE_HOSTNAME}.{}", crate::headscale::BASE_DOMAIN)
    }

    /// Its tailnet addresses (IPv4 first).
    pub async fn tailnet_ips(&self) -> Result<Vec<IpAddr>> {
        let status = self.node.local_api().status().await?;
        let mut ips: Vec<IpAddr> = status
            .tailscale_ips
            .unwrap_or_default()
            .iter()
            .filter_map(|ip| ip.parse().ok())
            .collect();
        ips.sort_by_key(|ip| ip.is_ipv6());
        Ok(ips)
    }
}

/// The laptop netns `<run>-laptop` with a node owned by user `alice` (member of
/// `group:team-a`), accepting routes.
#[derive(Debug)]
pub struct Laptop {
    pub node: TailscaleNode,
    pub user: User,
    pub netns: Netns,
}

/// A node joined by [`TailnetEnv::join_node`] in its own netns; both go away on drop.
#[derive(Debug)]
pub struct JoinedNode {
    pub node: TailscaleNode,
    pub netns: Netns,
    pub lab_addr: Ipv4Addr,
}

/// Options for [`TailnetEnv::join_node`].
#[derive(Clone, Debug, Default)]
pub struct JoinOptions {
    pub tags: Vec<String>,
    pub advertise_routes: Vec<String>,
    pub accept_routes: bool,
    /// The user whose pre-auth key joins the node (created if missing), e.g. [`LAPTOP_USER`]
    /// for a second device of alice; `None`: a tags-only key.
    pub owner: Option<String>,
    /// Userspace networking (default) or a kernel TUN device ([`TunMode::Kernel`]).
    pub tun: TunMode,
}

/// A second, independent Headscale in the same lab ([`TailnetEnv::start_second_headscale`]):
/// its own port, lab CA, API key, users `admin` and `alice` and the base policy; its own
/// subnet router in the remote site's netns (the same site, another control server) and its
/// own laptop node for alice in the laptop's netns. Drop order: nodes, then Headscale.
#[derive(Debug)]
pub struct SecondHeadscale {
    /// `router-<suffix>`, tagged `tag:router`, advertising [`SITE_ROUTES`] (not approved).
    pub router: TailscaleNode,
    /// `laptop-<suffix>`, owned by alice (`group:team-a`), accepting routes.
    pub laptop: TailscaleNode,
    pub headscale: Headscale,
}

/// Everything of one run. Drop order: nodes, Headscale, lab.
#[derive(Debug)]
pub struct TailnetEnv {
    pub site: RemoteSite,
    pub laptop: Laptop,
    pub headscale: Headscale,
    /// The lab everything hangs off: this environment's own ([`TailnetEnv::start`]) or one
    /// shared with another environment ([`TailnetEnv::start_in`]).
    pub lab: Arc<Lab>,
    pub binaries: Binaries,
    pub run_id: RunId,
    dir: PathBuf,
    /// Whether teardown deletes the lab: not when it belongs to someone else (the kube env).
    owns_lab: bool,
    next_node_host: Mutex<u8>,
}

impl TailnetEnv {
    /// Cleans leftovers of dead runs, then builds its own lab and everything of
    /// [`TailnetEnv::start_in`] in it, with the scratch directory `$TMPDIR/<run>`.
    pub async fn start() -> Result<TailnetEnv> {
        cleanup_stale_runs()?;
        let run_id = RunId::generate()?;
        let lab = Arc::new(Lab::create(&run_id)?);
        let mut env = TailnetEnv::start_in(lab, run_id.scratch_dir()).await?;
        env.owns_lab = true;
        Ok(env)
    }

    /// Builds the tailnet side inside an existing lab (e.g. the Kubernetes environment's, so
    /// pods reach Headscale and the tailnet): Headscale (users `admin` and `alice`,
    /// [`TailnetEnv::base_policy`]), the remote site with its router and the laptop. Netns are
    /// named after the lab's run id; configs, state and logs go to `dir` (created if missing).
    /// Teardown leaves the lab itself to its owner. The lab's `10.244.0.10`, `.11` and `.20`
    /// upwards ([`TailnetEnv::join_node`]) must be free.
    pub async fn start_in(lab: Arc<Lab>, dir: impl Into<PathBuf>) -> Result<TailnetEnv> {
        let dir = dir.into();
        let binaries = Binaries::locate()?;
        let run_id = lab.run_id().clone();
        std::fs::create_dir_all(&dir)
            .map_err(|e| TailnetError::io(format!("creating {}", dir.display()), e))?;
        let headscale = Headscale::start(&binaries, &lab, &dir.join("headscale")).await?;
        let api = headscale.api();
        api.create_user(ADMIN_USER).await?;
        let alice = api.create_user(LAPTOP_USER).await?;
        api.set_policy(&policy_document(&[])?).await?;

        let nodes_dir = dir.join("nodes");
        let site_netns = lab.attach_netns("remote", REMOTE_SITE_LAB_ADDR)?;
        for addr in [SITE_ECHO.ip(), SITE_BANNER.ip(), SITE_DNS.ip()] {
            site_netns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "lo"])?;
        }
        site_netns.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{}/128", SITE_ECHO_V6.ip()),
            "dev",
            "lo",
            "nodad",
        ])?;
        let echo = TcpTestServer::start(Some(&site_netns), SITE_ECHO.into(), Behaviour::Echo)?;
        let echo_v6 =
            TcpTestServer::start(Some(&site_netns), SITE_ECHO_V6.into(), Behaviour::Echo)?;
        let dns = DnsTestServer::start(
            &site_netns,
            SITE_DNS.into(),
            SITE_DNS_ZONE,
            vec![DnsRecord {
                name: SITE_DB_NAME.into(),
                addresses: vec![IpAddr::V4(*SITE_ECHO.ip()), IpAddr::V6(*SITE_ECHO_V6.ip())],
            }],
        )?;
        let site_tls = SiteTls::generate(&[SITE_API_NAME])?;
        std::fs::write(dir.join("site-ca.pem"), &site_tls.ca_pem)
            .map_err(|e| TailnetError::io("writing the remote site's CA", e))?;
        let banner = TcpTestServer::start(
            Some(&site_netns),
            SITE_BANNER.into(),
            Behaviour::TlsBanner {
                config: site_tls.server_config,
                text: SITE_BANNER_TEXT.into(),
            },
        )?;
        let laptop_netns = lab.attach_netns("laptop", LAPTOP_LAB_ADDR)?;

        let router_key = api
            .create_preauth_key(&PreAuthKeyRequest::tagged([ROUTER_TAG]))
            .await?;
        let laptop_key = api
            .create_preauth_key(&PreAuthKeyRequest::for_user(alice.id))
            .await?;
        let router_config = NodeConfig {
            hostname: "router".into(),
            login_server: headscale.lab_url(),
            server_ca_dir: Some(headscale.ca_dir().to_owned()),
            auth_key: router_key.key,
            advertise_routes: SITE_ROUTES.iter().map(|route| route.to_string()).collect(),
            accept_routes: false,
            tun: TunMode::Userspace,
        };
        let laptop_config = NodeConfig {
            hostname: "laptop".into(),
            login_server: headscale.lab_url(),
            server_ca_dir: Some(headscale.ca_dir().to_owned()),
            auth_key: laptop_key.key,
            advertise_routes: Vec::new(),
            accept_routes: true,
            tun: TunMode::Userspace,
        };
        let (router, laptop) = tokio::join!(
            TailscaleNode::start(&binaries, &site_netns, &nodes_dir, &router_config),
            TailscaleNode::start(&binaries, &laptop_netns, &nodes_dir, &laptop_config),
        );
        Ok(TailnetEnv {
            site: RemoteSite {
                router: router?,
                _echo: echo,
                _echo_v6: echo_v6,
                _banner: banner,
                _dns: dns,
                ca_pem: site_tls.ca_pem,
                netns: site_netns,
            },
            laptop: Laptop {
                node: laptop?,
                user: alice,
                netns: laptop_netns,
            },
            headscale,
            lab,
            binaries,
            run_id,
            dir,
            owns_lab: false,
            next_node_host: Mutex::new(FIRST_NODE_HOST),
        })
    }

    /// One environment per test process, started by the first caller and torn down (processes
    /// killed, netns deleted, scratch directory removed unless `TNO_KEEP_SCRATCH` is set) when
    /// the process exits. Tests sharing it must not depend on each other's policy changes.
    pub async fn shared() -> Result<&'static TailnetEnv> {
        static SHARED: tokio::sync::OnceCell<std::result::Result<TailnetEnv, String>> =
            tokio::sync::OnceCell::const_new();
        let started = SHARED
            .get_or_init(|| async {
                let started = TailnetEnv::start().await.map_err(|error| error.to_string());
                if started.is_ok() {
                    extern "C" fn teardown_shared_at_exit() {
                        if let Some(Ok(env)) = SHARED.get() {
                            env.teardown();
                        }
                    }
                    // SAFETY: registers a plain function; it only touches the static above.
                    unsafe { libc::atexit(teardown_shared_at_exit) };
                }
                started
            })
            .await;
        started
            .as_ref()
            .map_err(|message| TailnetError::SharedStartFailed(message.clone()))
    }

    /// The run's scratch directory (`$TMPDIR/<run>`): configs, state and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The base policy as JSON text (what [`TailnetEnv::start_in`] sets; valid HuJSON, so
    /// usable as an operator's base-policy ConfigMap).
    pub fn base_policy(&self) -> Result<String> {
        policy_document(&[])
    }

    /// The base policy plus `extra_grants` (Tailscale `grants` entries), as JSON text.
    pub fn policy_with_grants(&self, extra_grants: &[Value]) -> Result<String> {
        policy_document(extra_grants)
    }

    /// Creates netns `<run>-<hostname>` on the lab, mints a single-use pre-auth key with
    /// `options.tags` and starts a node there.
    pub async fn join_node(&self, hostname: &str, options: JoinOptions) -> Result<JoinedNode> {
        let lab_addr = {
            let mut next = self
                .next_node_host
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let addr = Ipv4Addr::new(10, 244, 0, *next);
            *next = next
                .checked_add(1)
                .ok_or(tno_netlab::NetlabError::AddressPoolExhausted)?;
            addr
        };
        let netns = self.lab.attach_netns(hostname, lab_addr)?;
        let mut request = PreAuthKeyRequest::tagged(options.tags);
        if let Some(owner) = &options.owner {
            request.user = Some(self.user_named(owner).await?.id);
        }
        let key = self.headscale.api().create_preauth_key(&request).await?;
        let config = NodeConfig {
            hostname: hostname.to_owned(),
            login_server: self.headscale.lab_url(),
            server_ca_dir: Some(self.headscale.ca_dir().to_owned()),
            auth_key: key.key,
            advertise_routes: options.advertise_routes,
            accept_routes: options.accept_routes,
            tun: options.tun,
        };
        let node =
            TailscaleNode::start(&self.binaries, &netns, &self.dir.join("nodes"), &config).await?;
        Ok(JoinedNode {
            node,
            netns,
            lab_addr,
        })
    }

    /// Starts the tailnet device ([`Device`]): user [`DEVICE_USER`] (created on first use),
    /// netns `<run>-nas` at [`DEVICE_LAB_ADDR`], its servers, and its node logged in with a
    /// single-use key of that user. One per environment.
    pub async fn start_device(&self) -> Result<Device> {
        let api = self.headscale.api();
        let user = self.user_named(DEVICE_USER).await?;
        let netns = self.lab.attach_netns(DEVICE_HOSTNAME, DEVICE_LAB_ADDR)?;
        let name = format!("{DEVICE_HOSTNAME}.{}", crate::headscale::BASE_DOMAIN);
        let tls = SiteTls::generate(&[name.as_str()])?;
        let mut servers = Vec::new();
        for loopback in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            servers.push(TcpTestServer::start(
                Some(&netns),
                SocketAddr::new(loopback, DEVICE_ECHO_PORT),
                Behaviour::Echo,
            )?);
            servers.push(TcpTestServer::start(
                Some(&netns),
                SocketAddr::new(loopback, DEVICE_TLS_PORT),
                Behaviour::TlsBanner {
                    config: tls.server_config.clone(),
                    text: DEVICE_BANNER_TEXT.into(),
                },
            )?);
        }
        let key = api
            .create_preauth_key(&PreAuthKeyRequest::for_user(user.id))
            .await?;
        let config = NodeConfig {
            hostname: DEVICE_HOSTNAME.into(),
            login_server: self.headscale.lab_url(),
            server_ca_dir: Some(self.headscale.ca_dir().to_owned()),
            auth_key: key.key,
            advertise_routes: Vec::new(),
            accept_routes: false,
            tun: TunMode::Userspace,
        };
        let node =
            TailscaleNode::start(&self.binaries, &netns, &self.dir.join("nodes"), &config).await?;
        Ok(Device {
            node,
            _servers: servers,
            ca_pem: tls.ca_pem,
            user,
            netns,
        })
    }

    /// The Headscale user `name`, created if it does not exist yet.
    async fn user_named(&self, name: &str) -> Result<User> {
        let api = self.headscale.api();
        match api.list_users().await?.into_iter().find(|u| u.name == name) {
            Some(user) => Ok(user),
            None => Ok(api.create_user(name).await?),
        }
    }

    /// Starts another Headscale in this lab (see [`SecondHeadscale`]), with its files under
    /// `<dir>/headscale-<suffix>` and its nodes `router-<suffix>` and `laptop-<suffix>`.
    /// Both Headscales serve on the lab gateway, on different ports, each with its own CA.
    pub async fn start_second_headscale(&self, suffix: &str) -> Result<SecondHeadscale> {
        let headscale = Headscale::start(
            &self.binaries,
            &self.lab,
            &self.dir.join(format!("headscale-{suffix}")),
        )
        .await?;
        let api = headscale.api();
        api.create_user(ADMIN_USER).await?;
        let alice = api.create_user(LAPTOP_USER).await?;
        api.set_policy(&policy_document(&[])?).await?;
        let router_key = api
            .create_preauth_key(&PreAuthKeyRequest::tagged([ROUTER_TAG]))
            .await?;
        let laptop_key = api
            .create_preauth_key(&PreAuthKeyRequest::for_user(alice.id))
            .await?;
        let node = |hostname: String, auth_key: String, routes: &[&str], accept: bool| NodeConfig {
            hostname,
            login_server: headscale.lab_url(),
            server_ca_dir: Some(headscale.ca_dir().to_owned()),
            auth_key,
            advertise_routes: routes.iter().map(|route| route.to_string()).collect(),
            accept_routes: accept,
            tun: TunMode::Userspace,
        };
        let router_config = node(
            format!("router-{suffix}"),
            router_key.key,
            &SITE_ROUTES,
            false,
        );
        let laptop_config = node(format!("laptop-{suffix}"), laptop_key.key, &[], true);
        let nodes_dir = self.dir.join("nodes");
        let (router, laptop) = tokio::join!(
            TailscaleNode::start(&self.binaries, &self.site.netns, &nodes_dir, &router_config),
            TailscaleNode::start(
                &self.binaries,
                &self.laptop.netns,
                &nodes_dir,
                &laptop_config
            ),
        );
        Ok(SecondHeadscale {
            router: router?,
            laptop: laptop?,
            headscale,
        })
    }

    /// Headscale's id of the node with this hostname.
    pub async fn node_id(&self, hostname: &str) -> Result<Option<u64>> {
        let nodes = self.headscale.api().list_nodes().await?;
        Ok(nodes
            .into_iter()
            .find(|node| node.given_name == hostname || node.name == hostname)
            .map(|node| node.id))
    }

    /// Log tails of Headscale, the router, the laptop and `extra` nodes, for failure output.
    pub fn log_report(&self, extra: &[&TailscaleNode]) -> String {
        let mut report = format!(
            "==== headscale ({}) ====\n{}\n",
            self.headscale.log_path().display(),
            self.headscale.log_tail(60)
        );
        for node in [&self.site.router, &self.laptop.node]
            .into_iter()
            .chain(extra.iter().copied())
        {
            report.push_str(&format!(
                "==== tailscaled {} ({}) ====\n{}\n",
                node.hostname(),
                node.log_path().display(),
                node.log_tail(40)
            ));
        }
        report
    }

    /// Kills every process and deletes every netns of this environment now (the lab only if
    /// it is its own); removes the scratch directory unless `TNO_KEEP_SCRATCH` is set.
    /// Idempotent.
    pub fn teardown(&self) {
        self.site.router.kill();
        self.laptop.node.kill();
        self.headscale.kill();
        for netns in [&self.site.netns, &self.laptop.netns] {
            if let Err(error) = netns.delete() {
                eprintln!("tailnet env: {error}");
            }
        }
        if self.owns_lab
            && let Err(error) = self.lab.delete()
        {
            eprintln!("tailnet env: {error}");
        }
        if std::env::var_os("TNO_KEEP_SCRATCH").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for TailnetEnv {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The base policy: tag owners for the test tags, `group:team-a` = alice, and a grant from
/// `tag:client` and team-a to `tag:server` on [`SERVER_PORT`]. Nothing reaches the remote
/// site unless a test adds a grant.
fn policy_document(extra_grants: &[Value]) -> Result<String> {
    let admin = format!("{ADMIN_USER}@");
    let mut grants = vec![json!({
        "src": [CLIENT_TAG, TEAM_A_GROUP],
        "dst": [SERVER_TAG],
        "ip": [format!("tcp:{SERVER_PORT}")],
    })];
    grants.extend_from_slice(extra_grants);
    let policy = json!({
        "groups": { TEAM_A_GROUP: [format!("{LAPTOP_USER}@")] },
        "tagOwners": {
            ROUTER_TAG: [admin],
            CLIENT_TAG: [admin],
            SERVER_TAG: [admin],
        },
        "grants": grants,
    });
    serde_json::to_string_pretty(&policy).map_err(TailnetError::Policy)
}

/// A CA and a server certificate for some names (the remote site's [`SITE_API_NAME`], the
/// device's MagicDNS name).
struct SiteTls {
    ca_pem: String,
    server_config: Arc<rustls::ServerConfig>,
}

impl SiteTls {
    fn generate(names: &[&str]) -> Result<SiteTls> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            TailnetError::SiteCertificate(format!("{what}: {e}"))
        };
        let ca_key = KeyPair::generate().map_err(|e| failed("CA key", &e))?;
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "remote-site test CA");
        let ca = ca_params
            .self_signed(&ca_key)
            .map_err(|e| failed("CA certificate", &e))?;
        let server_key = KeyPair::generate().map_err(|e| failed("server key", &e))?;
        let server_params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .map_err(|e| failed("server certificate parameters", &e))?;
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let server = server_params
            .signed_by(&server_key, &issuer)
            .map_err(|e| failed("server certificate", &e))?;
        let key_der = rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der())
            .map_err(|e| failed("server key encoding", &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| failed("TLS versions", &e))?
            .with_no_client_auth()
            .with_single_cert(vec![server.der().clone(), ca.der().clone()], key_der)
            .map_err(|e| failed("server TLS configuration", &e))?;
        Ok(SiteTls {
            ca_pem: ca.pem(),
            server_config: Arc::new(server_config),
        })
    }
}
