//! A stand-in for a piece of cluster plumbing the lab cannot run for real:
//!
//! - [`LabIssuer`]: a CA ClusterIssuer as cert-manager would act on it: this task watches
//!   `cert-manager.io/v1` Certificates and, for each whose Secret is missing, writes a
//!   `kubernetes.io/tls` Secret for its `dnsNames` signed by the lab CA and marks it Ready.
//!   Where the real controller is wanted (issuance, renewal), tests start it instead:
//!   [`E2eEnv::start_cert_manager`](crate::E2eEnv::start_cert_manager).
//!
//! It is lab plumbing, not product code: the operator only ever sees the Certificate and Secret
//! objects, exactly as in a cluster. (Headscale's extra records are not copied either: see
//! `E2eEnv::project_extra_records`.)

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::error::{E2eError, Result};

/// A CA that signs certificates for the lab (the "cluster CA" clients trust).
pub struct LabCa {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl std::fmt::Debug for LabCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabCa").finish_non_exhaustive()
    }
}

impl LabCa {
    pub fn generate(common_name: &str) -> Result<LabCa> {
        let failed = |e: rcgen::Error| E2eError::Certificate(e.to_string());
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let pem = params.self_signed(&key).map_err(failed)?.pem();
        Ok(LabCa { params, key, pem })
    }

    /// The CA certificate (PEM), for clients' trust stores and CA ConfigMaps.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The CA's private key (PEM, PKCS#8), for a CA issuer's key pair Secret.
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A leaf certificate for `names`: (certificate PEM, private key PEM).
    pub fn issue(&self, names: &[String]) -> Result<(String, String)> {
        let failed = |e: rcgen::Error| E2eError::Certificate(e.to_string());
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = rcgen::CertificateParams::new(names.to_vec())
            .map_err(failed)?
            .signed_by(&key, &issuer)
            .map_err(failed)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A `kubernetes.io/tls` Secret for `names` (with `ca.crt`, as cert-manager writes it).
    pub fn tls_secret(&self, name: &str, namespace: &str, names: &[String]) -> Result<Secret> {
        let (cert, key) = self.issue(names)?;
        Ok(Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), ByteString(cert.into_bytes())),
                ("tls.key".to_string(), ByteString(key.into_bytes())),
                (
                    "ca.crt".to_string(),
                    ByteString(self.pem.clone().into_bytes()),
                ),
            ])),
            ..Default::default()
        })
    }
}

/// The issuing loop of [`LabCa`] for cert-manager Certificates; aborted on drop.
#[derive(Debug)]
pub struct LabIssuer {
    task: JoinHandle<()>,
}

impl Drop for LabIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cert-manager.io",
        "v1",
        "Certificate",
    ))
}

impl LabIssuer {
    /// Every 2 s: each Certificate (any namespace) whose `spec.secretName` Secret is missing
    /// gets one for its `spec.dnsNames`, signed by `ca`, and status Ready=True. Errors are
    /// printed and retried.
    pub fn spawn(client: kube::Client, ca: LabCa) -> LabIssuer {
        let task = tokio::spawn(async move {
            loop {
                if let Err(error) = issue_pending(&client, &ca).await {
                    eprintln!("lab issuer: {error}");
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        LabIssuer { task }
    }
}

async fn issue_pending(client: &kube::Client, ca: &LabCa) -> Result<()> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &certificate_resource());
    let certificates = all
        .list(&ListParams::default())
        .await
        .map_err(|e| E2eError::kube("listing cert-manager Certificates", e))?;
    for certificate in certificates.items {
        let (Some(name), Some(namespace)) = (
            certificate.metadata.name.clone(),
            certificate.metadata.namespace.clone(),
        ) else {
            continue;
        };
        let Some(secret_name) = certificate.data["spec"]["secretName"].as_str() else {
            continue;
        };
        let names: Vec<String> = certificate.data["spec"]["dnsNames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let existing = secrets
            .get_opt(secret_name)
            .await
            .map_err(|e| E2eError::kube(format!("reading Secret {namespace}/{secret_name}"), e))?;
        if existing.is_some() || names.is_empty() {
            continue;
        }
        let secret = ca.tls_secret(secret_name, &namespace, &names)?;
        secrets
            .patch(
                secret_name,
                &PatchParams::apply("lab-issuer").force(),
                &Patch::Apply(&secret),
            )
            .await
            .map_err(|e| E2eError::kube(format!("writing Secret {namespace}/{secret_name}"), e))?;
        let namespaced: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &certificate_resource());
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": "True", "reason": "Ready",
            "message": "issued by the lab CA (cert-manager stand-in)"
        }]}});
        namespaced
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| {
                E2eError::kube(format!("marking Certificate {namespace}/{name} Ready"), e)
            })?;
        println!(
            "lab issuer: issued {namespace}/{secret_name} for {}",
            names.join(", ")
        );
    }
    Ok(())
}
