//! The agent pod's memory: resident set size (VmRSS) of each process of a running agent pod,
//! read from `/proc` of the processes in the pod's network namespace (the test kubelet runs
//! each container as processes there): idle, and the highest seen while connections go
//! through it. Part of the startup benchmark, which has the pods of both builds at hand.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tno_testenv::E2eEnv;

/// MiB of each process name (`/proc/<pid>/comm`) of one pod; a name that several processes
/// share is summed.
pub type ProcessRss = BTreeMap<String, f64>;

/// One reading of a pod's processes: resident (VmRSS) and private (USS: pages no other
/// process maps; the shared pages of a binary that many agent pods run are counted once per
/// node, not once per pod).
#[derive(Clone, Debug, Default)]
pub struct PodMemory {
    pub rss: ProcessRss,
    pub private: ProcessRss,
}

/// The processes of the pod selected by `selector` (the only running one) and their memory.
pub async fn pod_memory(env: &E2eEnv, pods: &Api<Pod>, selector: &str) -> Result<PodMemory> {
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    let running: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    let [pod] = running.as_slice() else {
        bail!("{} running pods for {selector}", running.len());
    };
    let uid = pod.metadata.uid.as_deref().context("pod uid")?;
    let pids = env
        .pod_netns(uid)
        .pids()
        .map_err(|e| anyhow::anyhow!("processes of pod {uid}: {e}"))?;
    let mut memory = PodMemory::default();
    for pid in pids {
        // A process may exit between the listing and the reads.
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let Some(rss_kib) = vm_rss_kib(&status) else {
            continue;
        };
        let name = comm.trim().to_string();
        *memory.rss.entry(name.clone()).or_default() += rss_kib as f64 / 1024.0;
        let private_kib = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|rollup| private_kib(&rollup));
        if let Some(kib) = private_kib {
            *memory.private.entry(name).or_default() += kib as f64 / 1024.0;
        }
    }
    if memory.rss.is_empty() {
        bail!("no process with an RSS in pod {uid}");
    }
    Ok(memory)
}

/// `Private_Clean` + `Private_Dirty` of a `/proc/<pid>/smaps_rollup` text, in KiB.
fn private_kib(rollup: &str) -> Option<u64> {
    let field = |name: &str| {
        rollup
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
    };
    Some(field("Private_Clean:")? + field("Private_Dirty:")?)
}

/// `VmRSS:` of a `/proc/<pid>/status` text, in KiB.
fn vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
}

/// The larger value of each process over `a` and `b`.
pub fn max_each(a: &ProcessRss, b: &ProcessRss) -> ProcessRss {
    let mut out = a.clone();
    for (name, mib) in b {
        let entry = out.entry(name.clone()).or_default();
        *entry = entry.max(*mib);
    }
    out
}

/// The pod's total.
pub fn total(rss: &ProcessRss) -> f64 {
    rss.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_kib() {
        let status =
            "Name:\ttailscaled\nVmPeak:\t  1300000 kB\nVmRSS:\t   37120 kB\nThreads:\t12\n";
        assert_eq!(vm_rss_kib(status), Some(37120));
        assert_eq!(vm_rss_kib("Name:\tkthreadd\nThreads:\t1\n"), None);
    }

    #[test]
    fn private_is_clean_plus_dirty_in_kib() {
        let rollup = "55d0-7ff rw-p 00000000 00:00 0 [rollup]\nRss:   37476 kB\nPss:   13144 kB\nShared_Clean:  26000 kB\nPrivate_Clean:   1200 kB\nPrivate_Dirty:   10276 kB\n";
        assert_eq!(private_kib(rollup), Some(11476));
        assert_eq!(private_kib("Rss: 1 kB\nPrivate_Dirty: 2 kB\n"), None);
    }

    #[test]
    fn max_each_keeps_every_process_and_the_larger_value() {
        let a = ProcessRss::from([("tailscaled".into(), 30.0), ("tailnet-agent".into(), 7.0)]);
        let b = ProcessRss::from([("tailscaled".into(), 28.0), ("containerboot".into(), 20.0)]);
        let max = max_each(&a, &b);
        assert_eq!(
            max,
            ProcessRss::from([
                ("containerboot".into(), 20.0),
                ("tailnet-agent".into(), 7.0),
                ("tailscaled".into(), 30.0),
            ])
        );
        assert_eq!(total(&max), 57.0);
    }
}
