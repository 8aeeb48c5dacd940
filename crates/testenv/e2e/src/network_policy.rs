//! A real NetworkPolicy enforcer for the lab: kube-router's firewall controller
//! (`kube-router --run-firewall=true --run-router=false --run-service-proxy=false`), started
//! only by the tests that ask for it ([`E2eEnv::start_network_policy_enforcer`]).
//!
//! It runs in the lab netns, "the node": every pod's traffic is routed there (routed /32 veths,
//! no bridge), kube-proxy's DNAT has already happened in prerouting, so the `filter` table's
//! FORWARD chain sees pod → pod IP packets with the real source pod IP, and INPUT sees pod →
//! node packets. kube-router adds its jumps there (`KUBE-ROUTER-FORWARD`, `KUBE-ROUTER-INPUT`,
//! `KUBE-ROUTER-OUTPUT`), one `KUBE-POD-FW-*` chain per pod of the node (pods whose
//! `status.hostIP` is the node's InternalIP 10.244.0.1) and ipsets for the peers of each
//! policy; traffic no policy admits is REJECTed (ICMP port unreachable, so a TCP client sees
//! "connection refused").
//!
//! iptables backend: kube-router runs the `iptables`/`iptables-restore` on PATH (Debian's
//! alternative: `iptables-nft`, the nf_tables backend); kube-proxy programs its own nftables
//! table (`table ip kube-proxy`). Both are nf_tables base chains on the same hooks of the lab
//! netns, and a packet must be accepted by every base chain, so kube-router's REJECT holds
//! whatever kube-proxy's chains say. [`NetworkPolicyEnforcer::iptables_backend`] reports what
//! was used.
//!
//! kube-router v2.1.0's own `--cleanup-config` crashes (nil handler in the service-proxy part)
//! and leaves the firewall rules, so [`NetworkPolicyEnforcer::stop`] (and drop) removes what it
//! added itself: its chains and jumps in the `filter` table and its ipsets.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tno_netlab::{ChildProcess, Lab, Netns, run_checked};
use tno_testenv_kube::control_plane::SERVICE_CIDR;
use tno_testenv_kube::env::NODE_NAME;

use crate::env::E2eEnv;
use crate::error::{E2eError, Result};

/// How long kube-router may take from start to its first full sync (jumps and pod chains).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Chain name prefixes kube-router's firewall controller creates in the `filter` table.
const CHAIN_PREFIXES: [&str; 3] = ["KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"];
/// ipset name prefixes it creates (`KUBE-SRC-*`, `KUBE-DST-*`; `inet6:` for IPv6, unused).
const IPSET_PREFIXES: [&str; 2] = ["KUBE-SRC-", "KUBE-DST-"];

/// kube-router's firewall controller running in the lab netns. Stop it with
/// [`NetworkPolicyEnforcer::stop`]; dropping it does the same, ignoring errors.
pub struct NetworkPolicyEnforcer {
    process: Option<ChildProcess>,
    lab: Arc<Lab>,
    log_path: PathBuf,
    backend: String,
}

impl E2eEnv {
    /// Starts kube-router's NetworkPolicy controller in the lab netns, with the lab's admin
    /// kubeconfig and `--hostname-override` = the test kubelet's node, and waits until it has
    /// hooked its chains into INPUT/FORWARD/OUTPUT and written a chain for each local pod.
    /// Needs `deps/build.sh kube-router` and the `iptables` and `ipset` programs.
    pub async fn start_network_policy_enforcer(&self) -> Result<NetworkPolicyEnforcer> {
        let binary = self.kube().binaries().kube_router.clone();
        if !binary.is_file() {
            return Err(E2eError::MissingBinary {
                name: binary.display().to_string(),
                hint: "build it with deps/build.sh kube-router (or set TNO_BIN_KUBE_ROUTER)".into(),
            });
        }
        let lab = self.lab().clone();
        for program in ["iptables", "iptables-save", "iptables-restore", "ipset"] {
            if lab_command(&lab, program)?
                .arg("--version")
                .output()
                .is_err()
            {
                return Err(E2eError::MissingBinary {
                    name: program.into(),
                    hint: "apt-get install -y iptables ipset".into(),
                });
            }
        }
        let backend = run_checked(lab_command(&lab, "iptables")?.arg("--version"))?
            .trim()
            .to_owned();
        let log_path = self.dir().join("kube-router.log");
        let mut command = lab.netns().command(&binary)?;
        command.args([
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            &format!("--kubeconfig={}", self.lab_kubeconfig().display()),
            &format!("--hostname-override={NODE_NAME}"),
            &format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--health-port=0",
            "--metrics-port=0",
            "-v=1",
        ]);
        let process = ChildProcess::spawn("kube-router", command, &log_path)?;
        let mut enforcer = NetworkPolicyEnforcer {
            process: Some(process),
            lab,
            log_path,
            backend,
        };
        let started = Instant::now();
        loop {
            if let Some(process) = enforcer.process.as_mut()
                && let Ok(Some(status)) = process.exit_status()
            {
                let output = process.log_tail(30);
                return Err(E2eError::CommandFailed {
                    command: "kube-router --run-firewall=true".into(),
                    status,
                    output,
                });
            }
            let rules = enforcer.filter_rules()?;
            let hooked = ["INPUT", "FORWARD", "OUTPUT"].iter().all(|chain| {
                rules.lines().map(without_counters).any(|line| {
                    line.starts_with(&format!("-A {chain} "))
                        && line.ends_with(&format!("-j KUBE-ROUTER-{chain}"))
                })
            });
            if hooked && rules.contains(":KUBE-POD-FW-") {
                return Ok(enforcer);
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(E2eError::Timeout {
                    what: "kube-router to hook its firewall chains into the lab".into(),
                    seconds: READY_TIMEOUT.as_secs(),
                    last: format!(
                        "filter table:\n{rules}\nkube-router log:\n{}",
                        enforcer.log_tail(30)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

impl E2eEnv {
    /// The network namespace of a pod the test kubelet runs (by the pod's uid), to open
    /// connections from exactly where its containers would (its IP as the source). Not deleted
    /// on drop: it belongs to the kubelet.
    pub fn pod_netns(&self, pod_uid: &str) -> Netns {
        Netns::adopt(self.lab().run_id().netns_name(&format!("pod-{pod_uid}")))
    }
}

impl NetworkPolicyEnforcer {
    /// `iptables --version` in the lab, e.g. `iptables v1.8.9 (nf_tables)`.
    pub fn iptables_backend(&self) -> &str {
        &self.backend
    }

    /// The lab's `filter` table with packet counters (`iptables-save -c -t filter`).
    pub fn filter_rules(&self) -> Result<String> {
        Ok(run_checked(
            lab_command(&self.lab, "iptables-save")?.args(["-c", "-t", "filter"]),
        )?)
    }

    /// Packets counted so far by the rules of `chain` that jump to kube-router's chains or
    /// REJECT (from [`NetworkPolicyEnforcer::filter_rules`]): how much traffic it saw there.
    pub fn packets_through(&self, chain: &str) -> Result<u64> {
        let rules = self.filter_rules()?;
        Ok(rules
            .lines()
            .filter(|line| without_counters(line).starts_with(&format!("-A {chain} ")))
            .filter(|line| {
                CHAIN_PREFIXES
                    .iter()
                    .any(|prefix| line.contains(&format!("-j {prefix}")))
                    || line.contains("-j REJECT")
            })
            .filter_map(|line| {
                let counters = line.strip_prefix('[')?.split(']').next()?;
                counters.split(':').next()?.parse::<u64>().ok()
            })
            .sum())
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tno_netlab::process::log_tail(&self.log_path, lines)
    }

    /// Kills kube-router and removes its chains, jumps and ipsets from the lab, so pod traffic
    /// is unfiltered again.
    pub fn stop(mut self) -> Result<()> {
        self.stop_and_clean()
    }

    fn stop_and_clean(&mut self) -> Result<()> {
        let Some(mut process) = self.process.take() else {
            return Ok(());
        };
        process.kill();
        let rules = run_checked(lab_command(&self.lab, "iptables-save")?.args(["-t", "filter"]))?;
        let kept: String = rules
            .lines()
            .filter(|line| !CHAIN_PREFIXES.iter().any(|prefix| line.contains(prefix)))
            .map(|line| format!("{line}\n"))
            .collect();
        restore(&self.lab, &kept)?;
        let sets = run_checked(lab_command(&self.lab, "ipset")?.args(["list", "-n"]))?;
        for set in sets
            .lines()
            .map(str::trim)
            .filter(|s| IPSET_PREFIXES.iter().any(|p| s.contains(p)))
        {
            run_checked(lab_command(&self.lab, "ipset")?.args(["destroy", set]))?;
        }
        Ok(())
    }
}

impl Drop for NetworkPolicyEnforcer {
    fn drop(&mut self) {
        if let Err(error) = self.stop_and_clean() {
            eprintln!("removing kube-router's rules from the lab: {error}");
        }
    }
}

/// An `iptables-save -c` line without its `[packets:bytes] ` prefix.
fn without_counters(line: &str) -> &str {
    match line
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("] "))
    {
        Some((_, rule)) => rule,
        None => line,
    }
}

/// `program` prepared to run in the lab netns.
fn lab_command(lab: &Lab, program: &str) -> Result<Command> {
    Ok(lab.netns().command(program)?)
}

/// `iptables-restore` of a whole `filter` table document in the lab.
fn restore(lab: &Lab, document: &str) -> Result<()> {
    use std::io::Write;
    let mut command = lab_command(lab, "iptables-restore")?;
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| E2eError::io("starting iptables-restore in the lab", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(document.as_bytes())
            .map_err(|e| E2eError::io("writing to iptables-restore", e))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| E2eError::io("waiting for iptables-restore", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(E2eError::CommandFailed {
            command: "iptables-restore (filter table without kube-router's chains)".into(),
            status: output.status,
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// The lab cluster's own address ranges, as `run --cluster-cidrs` (chart
/// `operator.clusterCIDRs`) takes them: the Service CIDR and the pods' part of 10.244.0.0/16.
/// Pods get 10.244.1.1 upward; 10.244.0.0/24 holds what a real cluster has outside its ranges
/// (the node's gateway with Headscale and the apiserver, the laptop, the remote site), so it
/// is left out: 10.244.1.0/24, 10.244.2.0/23, … 10.244.128.0/17.
pub fn lab_cluster_cidrs() -> Vec<String> {
    let mut cidrs: Vec<String> = (17..=24u32)
        .rev()
        .map(|prefix| format!("10.244.{}.0/{prefix}", 1u32 << (24 - prefix)))
        .collect();
    cidrs.push(tno_testenv_kube::control_plane::SERVICE_CIDR.to_string());
    cidrs
}
