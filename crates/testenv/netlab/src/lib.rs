//! Network plumbing of the test environment: named network namespaces, processes inside them,
//! routed veths, userspace TCP forwarders, and the [`Lab`] topology built from them.
//!
//! # Topology
//!
//! ```text
//!  root netns (never modified)              <run>-lab netns ("the node")
//!  127.0.0.1:<p>  headscale,                lo: 10.244.0.1/32 (LAB_GATEWAY), ip_forward=1
//!                 apiserver, …  ◀─ TcpForwarder ─  10.244.0.1:<p>   (Lab::expose_root_port)
//!                                           tv0 ──veth── eth0 10.244.0.10  <run>-remote (attach_netns)
//!                                           tv1 ──veth── eth0 10.244.0.11  <run>-laptop (attach_netns)
//!                                           tv2 ──veth── eth0 10.244.1.1   <run>-pod-<uid> (add_pod_netns)
//! ```
//!
//! - Every netns hangs off the lab on a routed /32 veth: the attached side has `addr/32` on
//!   `eth0`, a link route to the gateway and a default route via it; the lab has a host route
//!   per attached address. No bridge, so kube-proxy's DNAT in the lab needs neither
//!   br_netfilter nor hairpin mode.
//! - The lab has no default route and no link to the root netns: traffic leaves the lab only
//!   through userspace forwarders, and addresses such as 192.0.2.0/24 are unreachable from it
//!   unless something (a tailnet) carries them.
//! - Names carry the [`RunId`] (`tno-<pid>-<starttime>-<seq>`), so [`cleanup_stale_runs`]
//!   removes the netns and scratch directories of dead runs and leaves parallel live runs alone.
//!
//! # Cleanup
//!
//! [`Netns`] created here are deleted on drop after SIGKILLing their processes; [`Lab`] deletes
//! its pod netns on drop; [`ChildProcess`] gets `PR_SET_PDEATHSIG(SIGKILL)` (forked by a thread
//! that never exits, see [`process`]) and is killed on drop; [`TcpForwarder`] closes its
//! listener and connections on drop.
//!
//! # Example
//!
//! ```no_run
//! # fn main() -> Result<(), tno_netlab::NetlabError> {
//! use tno_netlab::{cleanup_stale_runs, ChildProcess, Lab, RunId};
//! cleanup_stale_runs()?;
//! let run = RunId::generate()?;
//! let lab = Lab::create(&run)?;
//! let _apiserver = lab.expose_root_port(6443)?; // 10.244.0.1:6443 in the lab → 127.0.0.1:6443
//! let pod = lab.add_pod_netns("8d6f…uid")?;
//! let mut command = pod.netns.command("/bin/server")?;
//! command.env("POD_IP", pod.ip.to_string());
//! let _server = ChildProcess::spawn("server", command, &run.scratch_dir().join("server.log"))?;
//! lab.remove_pod_netns("8d6f…uid")?;
//! # Ok(()) }
//! ```
//!
//! Requires root (or CAP_SYS_ADMIN + CAP_NET_ADMIN) and iproute2's `ip`.

mod error;
mod forward;
mod lab;
mod netns;
pub mod ports;
pub mod process;
mod run;
mod stun;

pub use error::{NetlabError, Result};
pub use forward::TcpForwarder;
pub use lab::{DEFAULT_POD_NETWORK, LAB_GATEWAY, Lab, PodNet};
pub use netns::{Netns, list_netns};
pub use process::{ChildProcess, run_checked};
pub use run::{RUN_PREFIX, RunId, StaleCleanup, cleanup_stale_runs};
pub use stun::StunResponder;
