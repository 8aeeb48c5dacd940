//! The lab topology: one router netns with a gateway address, and netns hanging off it on
//! routed /32 veths (no bridge, so no br_netfilter or hairpin questions for kube-proxy).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{NetlabError, Result};
use crate::forward::TcpForwarder;
use crate::netns::Netns;
use crate::run::RunId;
use crate::stun::StunResponder;

/// The lab's own address: the default gateway of every attached netns and the address on which
/// root-namespace servers are exposed inside the lab.
pub const LAB_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

/// Addresses for [`Lab::attach_netns`] are chosen by the caller from `10.244.0.2–254`; pods get
/// `10.<pod network>.1.1` upwards (`10.244.1.1` in the default lab).
const FIRST_POD_OCTETS: (u8, u8) = (1, 1);

/// The second octet of the default lab's pod addresses (`10.244.0.0/16`).
pub const DEFAULT_POD_NETWORK: u8 = 244;

/// The router netns `<run>-lab` and everything attached to it. Dropping the lab deletes the
/// lab netns and every pod netns (killing their processes); netns returned by
/// [`Lab::attach_netns`] belong to the caller.
#[derive(Debug)]
pub struct Lab {
    run_id: RunId,
    netns: Netns,
    /// Second octet of the pod addresses: pods are `10.<pod_network>.1.1` upwards.
    pod_network: u8,
    state: Mutex<LabState>,
}

#[derive(Debug, Default)]
struct LabState {
    next_link: u32,
    next_pod_host: u32,
    attached: Vec<String>,
    pods: HashMap<String, PodNet>,
}

/// A pod's network: its netns and its address (also the address of its `eth0`).
#[derive(Clone, Debug)]
pub struct PodNet {
    pub netns: Arc<Netns>,
    pub ip: Ipv4Addr,
}

impl Lab {
    /// Creates the lab netns `<run>-lab` with [`LAB_GATEWAY`] and IPv4 forwarding on.
    pub fn create(run_id: &RunId) -> Result<Lab> {
        Self::create_named(run_id, "lab", DEFAULT_POD_NETWORK)
    }

    /// Creates another node netns `<run>-<name>` (a second cluster's node) whose pods get
    /// `10.<pod_network>.1.1` upwards. It has [`LAB_GATEWAY`] too: each lab is a network of its
    /// own, joined to the others only through root-netns forwarders and the tailnet, so a
    /// server exposed at `10.244.0.1:<port>` (Headscale) has the same URL in every lab.
    pub fn create_named(run_id: &RunId, name: &str, pod_network: u8) -> Result<Lab> {
        let netns = Netns::create(run_id.netns_name(name))?;
        netns.ip(&["addr", "add", &format!("{LAB_GATEWAY}/32"), "dev", "lo"])?;
        netns.set_sysctl("net.ipv4.ip_forward", "1")?;
        Ok(Lab {
            run_id: run_id.clone(),
            netns,
            pod_network,
            state: Mutex::new(LabState::default()),
        })
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The router netns itself (where kube-proxy and forwarders live).
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    pub fn gateway(&self) -> Ipv4Addr {
        LAB_GATEWAY
    }

    /// Creates netns `<run>-<name>` with `addr` on a routed veth and a default route via the
    /// gateway. `addr` should come from `10.244.0.2–254` (pods use `10.244.1.0` upwards).
    pub fn attach_netns(&self, name: &str, addr: Ipv4Addr) -> Result<Netns> {
        let mut state = self.state();
        if state.attached.iter().any(|attached| attached == name) {
            return Err(NetlabError::AlreadyAttached {
                name: name.to_owned(),
            });
        }
        let netns = Netns::create(self.run_id.netns_name(name))?;
        self.link_routed(&mut state, &netns, addr)?;
        state.attached.push(name.to_owned());
        Ok(netns)
    }

    /// Creates the netns `<run>-pod-<uid>` for a pod with the next free pod address, `eth0`
    /// routed from the lab and a default route via the gateway.
    pub fn add_pod_netns(&self, pod_uid: &str) -> Result<PodNet> {
        let mut state = self.state();
        let ip = next_pod_ip(self.pod_network, state.next_pod_host)
            .ok_or(NetlabError::AddressPoolExhausted)?;
        let netns = Netns::create(self.run_id.netns_name(&format!("pod-{pod_uid}")))?;
        self.link_routed(&mut state, &netns, ip)?;
        state.next_pod_host += 1;
        let pod = PodNet {
            netns: Arc::new(netns),
            ip,
        };
        state.pods.insert(pod_uid.to_owned(), pod.clone());
        Ok(pod)
    }

    /// Kills the pod's processes and deletes its netns (its veth and route go with it).
    pub fn remove_pod_netns(&self, pod_uid: &str) -> Result<()> {
        let pod = self
            .state()
            .pods
            .remove(pod_uid)
            .ok_or_else(|| NetlabError::UnknownPod {
                pod_uid: pod_uid.to_owned(),
            })?;
        pod.netns.delete()
    }

    /// Exposes a server of the root netns inside the lab: listens on `gateway:port` in the lab
    /// and forwards to `127.0.0.1:port` in the root netns. Same port on both sides, so a URL
    /// like `http://10.244.0.1:<port>` differs from the root one only in the host.
    pub fn expose_root_port(&self, port: u16) -> Result<TcpForwarder> {
        TcpForwarder::start(
            Some(&self.netns),
            SocketAddr::V4(SocketAddrV4::new(LAB_GATEWAY, port)),
            None,
            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)),
        )
    }

    /// Answers STUN binding requests on `gateway:port` in the lab (see [`StunResponder`]).
    pub fn serve_stun(&self, port: u16) -> Result<StunResponder> {
        StunResponder::start(
            &self.netns,
            SocketAddr::V4(SocketAddrV4::new(LAB_GATEWAY, port)),
        )
    }

    /// Veth `<lab side>` ⇄ `eth0`, `addr/32` on `eth0`, host route in the lab, default route in
    /// the attached netns. The lab side has no address: the gateway lives on the lab's `lo` and
    /// answers ARP on every link.
    fn link_routed(&self, state: &mut LabState, netns: &Netns, addr: Ipv4Addr) -> Result<()> {
        // Interface names are limited to 15 bytes, so the lab side gets a counter, not a name.
        let lab_side = format!("tv{}", state.next_link);
        state.next_link += 1;
        self.netns.ip(&[
            "link",
            "add",
            &lab_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            netns.name(),
        ])?;
        self.netns.ip(&["link", "set", &lab_side, "up"])?;
        self.netns
            .ip(&["route", "add", &format!("{addr}/32"), "dev", &lab_side])?;
        netns.ip(&["addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
        netns.ip(&["link", "set", "eth0", "up"])?;
        let gateway = LAB_GATEWAY.to_string();
        netns.ip(&["route", "add", &gateway, "dev", "eth0", "scope", "link"])?;
        netns.ip(&["route", "add", "default", "via", &gateway, "dev", "eth0"])?;
        Ok(())
    }

    /// Deletes every pod netns and the lab netns now (also happens on drop). For owners that
    /// cannot drop the lab, such as a process-wide shared environment torn down at exit.
    pub fn delete(&self) -> Result<()> {
        let pods: Vec<PodNet> = self.state().pods.drain().map(|(_, pod)| pod).collect();
        for pod in pods {
            pod.netns.delete()?;
        }
        self.netns.delete()
    }

    fn state(&self) -> MutexGuard<'_, LabState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, pod) in self.state().pods.drain() {
            if let Err(error) = pod.netns.delete() {
                eprintln!(
                    "netlab: could not delete pod netns {}: {error}",
                    pod.netns.name()
                );
            }
        }
    }
}

/// The `n`th pod address: 10.<network>.1.1 … 10.<network>.255.254, skipping .0 and .255.
fn next_pod_ip(network: u8, n: u32) -> Option<Ipv4Addr> {
    const HOSTS_PER_OCTET: u32 = 254;
    let third = u32::from(FIRST_POD_OCTETS.0) + n / HOSTS_PER_OCTET;
    let fourth = u32::from(FIRST_POD_OCTETS.1) + n % HOSTS_PER_OCTET;
    Some(Ipv4Addr::new(
        10,
        network,
        u8::try_from(third).ok()?,
        u8::try_from(fourth).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses_skip_network_and_broadcast() {
        assert_eq!(next_pod_ip(244, 0), Some(Ipv4Addr::new(10, 244, 1, 1)));
        assert_eq!(next_pod_ip(244, 253), Some(Ipv4Addr::new(10, 244, 1, 254)));
        assert_eq!(next_pod_ip(244, 254), Some(Ipv4Addr::new(10, 244, 2, 1)));
        assert_eq!(next_pod_ip(244, 254 * 255), None);
        assert_eq!(next_pod_ip(245, 0), Some(Ipv4Addr::new(10, 245, 1, 1)));
    }
}
