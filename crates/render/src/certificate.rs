//! cert-manager `Certificate` for the http names of a TailnetIngress. Rendered as a typed
//! struct of our own (cert-manager publishes no Rust types), serialized as `cert-manager.io/v1`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use tailnet_api::tailnet::{IssuerKind, IssuerRef};

use crate::meta::Owner;

pub const API_VERSION: &str = "cert-manager.io/v1";
pub const KIND: &str = "Certificate";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CertificateSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    pub secret_name: String,
    pub dns_names: Vec<String>,
    pub issuer_ref: CertificateIssuerRef,
    pub private_key: PrivateKey,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CertificateIssuerRef {
    pub name: String,
    pub kind: String,
    pub group: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKey {
    pub algorithm: String,
    pub size: u32,
    pub rotation_policy: String,
}

/// One certificate covering every http name and alias of the resource (sorted, unique).
pub fn certificate(owner: &Owner, issuer: &IssuerRef, dns_names: &[String]) -> Certificate {
    let mut names = dns_names.to_vec();
    names.sort();
    names.dedup();
    let tls = owner.names().tls;
    Certificate {
        api_version: API_VERSION.to_string(),
        kind: KIND.to_string(),
        metadata: owner.meta(&tls),
        spec: CertificateSpec {
            secret_name: tls,
            dns_names: names,
            issuer_ref: CertificateIssuerRef {
                name: issuer.name.clone(),
                kind: match issuer.kind {
                    IssuerKind::Issuer => "Issuer",
                    IssuerKind::ClusterIssuer => "ClusterIssuer",
                }
                .to_string(),
                group: issuer.group.clone(),
            },
            private_key: PrivateKey {
                algorithm: "ECDSA".to_string(),
                size: 256,
                rotation_policy: "Always".to_string(),
            },
        },
    }
}
