//! cert-manager's real controller in the lab: `cert-manager-controller`, our thin main over
//! the cert-manager module's controller packages (Certificates, CertificateRequests with the
//! approver and the CA / self-signed issuers, (Cluster)Issuers), built by
//! `deps/build.sh cert-manager-controller` from the Go module proxy. It runs as a process of
//! the test host against the lab's kube-apiserver (admin kubeconfig, no leader election) and
//! works on the cert-manager CRDs every lab cluster has installed.
//!
//! One controller per cluster at a time: two would both act on every Certificate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams};
use serde_json::{Value, json};
use tno_netlab::ChildProcess;

use crate::env::E2eEnv;
use crate::error::{E2eError, Result};
use crate::stand_ins::LabCa;

/// Where the controller looks for the Secrets that ClusterIssuers name
/// (`--cluster-resource-namespace`, upstream's default).
pub const CLUSTER_RESOURCE_NAMESPACE: &str = "cert-manager";
/// The field manager of what the tests apply for cert-manager.
const FIELD_MANAGER: &str = "tno-e2e-cert-manager";
/// From start to the controllers running (informers registered, log line written).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// For a ClusterIssuer to become Ready.
const ISSUER_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The running controller; killed on drop.
pub struct CertManagerController {
    process: ChildProcess,
    started_in: Duration,
}

impl std::fmt::Debug for CertManagerController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManagerController")
            .field("log", &self.process.log_path())
            .finish_non_exhaustive()
    }
}

impl CertManagerController {
    /// The last `lines` lines of its log (klog text), for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// From spawn to its "starting controllers" log line.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// SIGKILL (it keeps no state of its own: everything is in the API objects).
    pub fn stop(mut self) {
        self.process.kill();
    }
}

/// The `cert-manager.io/v1` resource `kind`.
pub fn cert_manager_resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", kind))
}

impl E2eEnv {
    /// Starts cert-manager's controller (`TNO_BIN_CERT_MANAGER_CONTROLLER`, else the pinned
    /// build of `deps/build.sh cert-manager-controller`) with the admin kubeconfig and
    /// `--cluster-resource-namespace=cert-manager` (created here), and waits for its
    /// "starting controllers" line.
    pub async fn start_cert_manager(&self) -> Result<CertManagerController> {
        self.spawn_cert_manager(&[]).await
    }

    /// [`Self::start_cert_manager`] with `-enable-gateway-api`: also cert-manager's
    /// gateway-shim, which creates a Certificate for the `certificateRefs` of every Gateway
    /// annotated `cert-manager.io/issuer` or `cert-manager.io/cluster-issuer` (the Gateway API
    /// CRDs must be installed before).
    pub async fn start_cert_manager_with_gateway_api(&self) -> Result<CertManagerController> {
        self.spawn_cert_manager(&["-enable-gateway-api"]).await
    }

    async fn spawn_cert_manager(&self, extra_args: &[&str]) -> Result<CertManagerController> {
        let binary =
            tno_testenv_kube::binaries::tool("cert-manager-controller", "cert-manager-controller")?;
        ensure_namespace(&self.kube().client().await?, CLUSTER_RESOURCE_NAMESPACE).await?;
        let log_path = self.dir().join(format!(
            "cert-manager-controller-{}.log",
            self.next_operator
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut command = Command::new(&binary);
        command.args([
            format!("-kubeconfig={}", self.kubeconfig().display()),
            format!("-cluster-resource-namespace={CLUSTER_RESOURCE_NAMESPACE}"),
            "-v=2".to_string(),
        ]);
        command.args(extra_args);
        let started = Instant::now();
        let mut process = ChildProcess::spawn("cert-manager-controller", command, &log_path)?;
        loop {
            if let Some(status) = process.exit_status()? {
                return Err(E2eError::CommandFailed {
                    command: binary.display().to_string(),
                    status,
                    output: process.log_tail(30),
                });
            }
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("starting controllers") {
                return Ok(CertManagerController {
                    process,
                    started_in: started.elapsed(),
                });
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(E2eError::Timeout {
                    what: "cert-manager-controller to start its controllers".into(),
                    seconds: START_TIMEOUT.as_secs(),
                    last: process.log_tail(20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A CA ClusterIssuer `name` signing with `ca`: its key pair as Secret `<name>-ca` in
    /// [`CLUSTER_RESOURCE_NAMESPACE`], then the ClusterIssuer; waits until the controller
    /// reports it Ready (it has read and checked the key pair).
    pub async fn apply_ca_cluster_issuer(
        &self,
        client: &kube::Client,
        name: &str,
        ca: &LabCa,
    ) -> Result<DynamicObject> {
        let secret_name = format!("{name}-ca");
        let secret = ca.key_pair_secret(&secret_name, CLUSTER_RESOURCE_NAMESPACE)?;
        Api::<Secret>::namespaced(client.clone(), CLUSTER_RESOURCE_NAMESPACE)
            .patch(
                &secret_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(|e| E2eError::kube(format!("writing the CA Secret {secret_name}"), e))?;
        let issuers: Api<DynamicObject> =
            Api::all_with(client.clone(), &cert_manager_resource("ClusterIssuer"));
        let issuer = json!({
            "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer",
            "metadata": {"name": name},
            "spec": {"ca": {"secretName": secret_name}},
        });
        issuers
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&issuer),
            )
            .await
            .map_err(|e| E2eError::kube(format!("applying ClusterIssuer {name}"), e))?;
        let started = Instant::now();
        loop {
            let current = issuers
                .get(name)
                .await
                .map_err(|e| E2eError::kube(format!("reading ClusterIssuer {name}"), e))?;
            if condition_status(&current.data, "Ready") == Some("True") {
                return Ok(current);
            }
            if started.elapsed() > ISSUER_READY_TIMEOUT {
                return Err(E2eError::Timeout {
                    what: format!("ClusterIssuer {name} Ready"),
                    seconds: ISSUER_READY_TIMEOUT.as_secs(),
                    last: current.data["status"].to_string(),
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// `status` of the condition `type_` in an object's `status.conditions`.
pub fn condition_status<'a>(object: &'a Value, type_: &str) -> Option<&'a str> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?["status"]
        .as_str()
}

/// What `cmctl renew` does: sets the Certificate's `Issuing` condition to True (reason
/// `ManuallyTriggered`), which cert-manager's controllers act on by issuing a new revision.
/// The other conditions are kept.
pub async fn trigger_renewal(client: &kube::Client, namespace: &str, name: &str) -> Result<()> {
    let certificates: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &cert_manager_resource("Certificate"),
    );
    let current = certificates
        .get_status(name)
        .await
        .map_err(|e| E2eError::kube(format!("reading Certificate {namespace}/{name}"), e))?;
    let mut conditions: Vec<Value> = current.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c["type"] != "Issuing")
        .collect();
    conditions.push(json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered",
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
        "observedGeneration": current.metadata.generation,
    }));
    certificates
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"conditions": conditions}})),
        )
        .await
        .map_err(|e| {
            E2eError::kube(format!("marking Certificate {namespace}/{name} Issuing"), e)
        })?;
    Ok(())
}

async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&namespace),
        )
        .await
        .map_err(|e| E2eError::kube(format!("creating namespace {name}"), e))?;
    Ok(())
}

impl LabCa {
    /// The CA's own key pair as a `kubernetes.io/tls` Secret (what a CA issuer reads).
    pub fn key_pair_secret(&self, name: &str, namespace: &str) -> Result<Secret> {
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                (
                    "tls.crt".to_string(),
                    ByteString(self.pem().as_bytes().to_vec()),
                ),
                (
                    "tls.key".to_string(),
                    ByteString(self.key_pem().into_bytes()),
                ),
            ])),
            ..Secret::default()
        })
    }
}
