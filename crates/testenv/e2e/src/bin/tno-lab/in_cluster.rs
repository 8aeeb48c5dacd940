//! The cluster's DNS wired as docs/dns.md says for a kubeadm-style CoreDNS, and the names used
//! from inside the cluster:
//!
//! - [`wire_coredns`]: one `import` line at the top level of the `kube-system/coredns` Corefile
//!   and the Tailnet's DNS ConfigMap (`tailnet-hosts` in `kube-system`, key `tailnet.server`)
//!   mounted into the CoreDNS Deployment, as an admin would do it;
//! - [`demo`]: a pod of a namespace the ingress lists (`spec.inCluster.namespaces`) opens
//!   `https://portal.team-a.lab.example.net` — the name resolves to the in-cluster Service in
//!   front of the agent (split horizon: never a tailnet address), the certificate is the
//!   portal's, the frontend answers; the same request from a namespace it does not list is
//!   refused by the agent's NetworkPolicy (enforced by kube-router) while that pod reaches the
//!   admin backend directly (the positive witness); and a pod of `team-a` uses the egress alias
//!   `api.site.example.net`, completing TLS with that SNI against the remote site's own
//!   certificate (the agent forwards bytes, it does not terminate TLS).

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tno_testenv::{CLIENT_POD_DEADLINE, E2eEnv, tls_check_pod};

use crate::CONSUMER_NAMESPACE;

/// Where CoreDNS and the Tailnet's DNS ConfigMap live in the lab (docs/dns.md, kubeadm).
pub const DNS_NAMESPACE: &str = "kube-system";
/// The line docs/dns.md adds at the top level of the Corefile.
const IMPORT_LINE: &str = "import /etc/coredns-tailnet/*.server";
/// A namespace the portal does not list.
const UNLISTED_NAMESPACE: &str = "elsewhere";

/// Adds the import line to the Corefile (once) and mounts `tailnet-hosts`'s `tailnet.server`
/// key into CoreDNS; waits for the rolled-out CoreDNS.
pub async fn wire_coredns(client: &kube::Client) -> Result<(), String> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), DNS_NAMESPACE);
    let corefile = config_maps
        .get("coredns")
        .await
        .map_err(|e| format!("ConfigMap {DNS_NAMESPACE}/coredns: {e}"))?
        .data
        .and_then(|data| data.get("Corefile").cloned())
        .ok_or("ConfigMap kube-system/coredns has no Corefile")?;
    if !corefile.lines().any(|line| line.trim() == IMPORT_LINE) {
        let patch = serde_json::json!({"data": {"Corefile": format!("{IMPORT_LINE}\n{corefile}")}});
        config_maps
            .patch("coredns", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("Corefile: {e}"))?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), DNS_NAMESPACE);
    let mount = serde_json::json!({"spec": {"template": {"spec": {
        "volumes": [{"name": "tailnet-hosts", "configMap": {
            "name": tno_testenv::HOSTS_CONFIG_MAP, "optional": true,
            "items": [{"key": "tailnet.server", "path": "tailnet.server"}]}}],
        "containers": [{"name": "coredns", "volumeMounts": [
            {"name": "tailnet-hosts", "mountPath": "/etc/coredns-tailnet", "readOnly": true}]}],
    }}}});
    deployments
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Strategic(&mount),
        )
        .await
        .map_err(|e| format!("Deployment {DNS_NAMESPACE}/coredns: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let deployment = deployments
            .get("coredns")
            .await
            .map_err(|e| e.to_string())?;
        let generation = deployment.metadata.generation.unwrap_or_default();
        let status = deployment.status.unwrap_or_default();
        let rolled_out = status.observed_generation.unwrap_or_default() >= generation
            && status.updated_replicas.unwrap_or_default() >= 1
            && status.available_replicas.unwrap_or_default() >= 1
            && status.replicas.unwrap_or_default() == status.updated_replicas.unwrap_or_default();
        if rolled_out {
            println!(
                "demo: CoreDNS wired as docs/dns.md says (kubeadm): `{IMPORT_LINE}` in the Corefile, {DNS_NAMESPACE}/{} key tailnet.server mounted",
                tno_testenv::HOSTS_CONFIG_MAP
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "CoreDNS did not roll out with the mount: {status:?}"
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// An HTTPS request by `tls-check`: the name resolved through the cluster's DNS, the session
/// verified for it against `ca_pem`, `expect` in the answer.
fn https_pod(
    name: &str,
    host: &str,
    port: u16,
    ca_pem: &str,
    expect: &str,
    attempts: u32,
) -> serde_json::Value {
    let mut pod = tls_check_pod(
        name,
        &format!("{host}:{port}"),
        host,
        ca_pem,
        expect,
        attempts,
    );
    if let Some(args) = pod["spec"]["containers"][0]["args"].as_array_mut() {
        args.push("--send".into());
        args.push(
            format!("GET /in-cluster HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").into(),
        );
    }
    pod
}

/// The in-cluster part of the demo (see the module comment).
pub async fn demo(env: &E2eEnv, client: &kube::Client, ca_pem: &str) -> Result<(), String> {
    let portal = format!("portal.{CONSUMER_NAMESPACE}.lab.example.net");
    println!(
        "demo: a pod in {CONSUMER_NAMESPACE} (listed in spec.inCluster.namespaces) opens https://{portal}/ …"
    );
    let listed = run(
        env,
        client,
        CONSUMER_NAMESPACE,
        https_pod(
            "in-cluster-client",
            &portal,
            443,
            ca_pem,
            "server: frontend",
            60,
        ),
    )
    .await?;
    if !listed.succeeded() {
        return Err(format!(
            "https://{portal}/ from {CONSUMER_NAMESPACE} failed:\n{listed}"
        ));
    }
    if listed
        .log("client")
        .to_lowercase()
        .contains("tailscale-user-")
    {
        return Err(format!(
            "an in-cluster client got tailnet identity headers:\n{listed}"
        ));
    }
    println!(
        "demo: OK — in-cluster: {CONSUMER_NAMESPACE} → https://{portal}/ (cluster DNS → in-cluster Service → agent → frontend, certificate verified): {}",
        status_line(listed.log("client"))
    );

    crate::apply_namespaces(client, &[UNLISTED_NAMESPACE]).await?;
    let admin = format!("admin.{CONSUMER_NAMESPACE}.svc.cluster.local");
    let witness = run(
        env,
        client,
        UNLISTED_NAMESPACE,
        https_pod("witness", &admin, 8443, ca_pem, "HTTP/1.1 ", 60),
    )
    .await?;
    if !witness.succeeded() {
        return Err(format!(
            "the witness from {UNLISTED_NAMESPACE} did not reach https://{admin}:8443/:\n{witness}"
        ));
    }
    let refused = run(
        env,
        client,
        UNLISTED_NAMESPACE,
        https_pod(
            "in-cluster-client",
            &portal,
            443,
            ca_pem,
            "server: frontend",
            8,
        ),
    )
    .await?;
    if refused.succeeded() {
        return Err(format!(
            "https://{portal}/ from {UNLISTED_NAMESPACE}, which the ingress does not list, got through:\n{refused}"
        ));
    }
    println!(
        "demo: OK — in-cluster: {UNLISTED_NAMESPACE} (not listed) is refused at https://{portal}/ ({}) while it reaches https://{admin}:8443/ directly",
        refused
            .log("client")
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
    );

    let site = &env.tailnet().site;
    let alias = tno_testenv_tailnet::SITE_API_NAME;
    println!(
        "demo: a pod in {CONSUMER_NAMESPACE} opens {alias}:443 (the egress alias) with SNI {alias} …"
    );
    let pod = tls_check_pod(
        "alias-client",
        &format!("{alias}:443"),
        alias,
        &site.ca_pem,
        tno_testenv_tailnet::SITE_BANNER_TEXT.trim_end(),
        60,
    );
    let through = run(env, client, CONSUMER_NAMESPACE, pod).await?;
    if !through.succeeded() {
        return Err(format!(
            "TLS to {alias}:443 through the egress failed:\n{through}"
        ));
    }
    println!(
        "demo: OK — egress alias: {alias} → Service → agent → tailnet → 198.51.100.20:443, TLS with SNI {alias} verified against the site's own certificate"
    );
    Ok(())
}

async fn run(
    env: &E2eEnv,
    client: &kube::Client,
    namespace: &str,
    pod: serde_json::Value,
) -> Result<tno_testenv::PodRun, String> {
    env.run_pod(
        client,
        namespace,
        pod,
        CLIENT_POD_DEADLINE + Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.to_string())
}

/// `HTTP/1.1 200 OK` out of tls-check's report of what it read.
fn status_line(report: &str) -> String {
    report
        .split("HTTP/1.1 ")
        .nth(1)
        .and_then(|rest| rest.split("\\r\\n").next())
        .map(|status| format!("HTTP/1.1 {status}"))
        .unwrap_or_else(|| report.trim().to_string())
}
