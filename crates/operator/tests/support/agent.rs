//! An agent pod seen from the lab: its `/metrics` (admin port on the pod IP), read the way
//! Prometheus would, so a negative check can show what the agent itself saw.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tno_testenv::E2eEnv;

/// Scrapes the agent's `/metrics` (admin port on the pod IP) from the lab network.
pub async fn agent_metrics(env: &E2eEnv, pod_ip: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = format!("{pod_ip}:{}", tailnet_api::agent_config::ADMIN_PORT)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let lab = env.lab().clone();
    tokio::task::spawn_blocking(move || {
        let mut stream = lab
            .netns()
            .connect_tcp(addr, Duration::from_secs(5))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        stream
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        if !text.starts_with("HTTP/1.") || !text.contains("tailnet_agent_") {
            return Err(format!(
                "not the agent's metrics: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        Ok(text)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Sum of the samples of `metric` whose line contains every fragment of `labels`.
pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(metric) && labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Whether `text` has a sample of `metric` with every fragment of `labels` (any value).
pub fn has_sample(text: &str, metric: &str, labels: &[&str]) -> bool {
    text.lines()
        .any(|l| l.starts_with(metric) && labels.iter().all(|f| l.contains(f)))
}

/// The pod IP of a running, Ready pod (what a Service endpoint needs), else why not.
pub fn ready_pod_ip(pod: &Pod) -> Result<String, String> {
    let status = pod.status.as_ref().ok_or("pod without status")?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    match (
        &status.pod_ip,
        ready,
        pod.metadata.deletion_timestamp.is_some(),
    ) {
        (Some(ip), true, false) => Ok(ip.clone()),
        (ip, ready, deleting) => Err(format!(
            "pod phase {:?}, IP {ip:?}, Ready {ready}, deleting {deleting}",
            status.phase
        )),
    }
}
