//! Certificates and kubeconfigs for the control plane, generated fresh for every run.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{IoContext, Result};

/// A certificate and its key, written as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The cluster CA. It signs serving and client certificates alike, like kubeadm's `ca`.
pub struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    pub files: CertFiles,
    pub cert_pem: String,
}

impl ClusterCa {
    pub fn generate(dir: &Path) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "tno-testenv-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let files = write_pair(dir, "ca", &cert_pem, &key.serialize_pem())?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            files,
            cert_pem,
        })
    }

    /// A serving certificate for the given DNS names and IPs.
    pub fn issue_server(
        &self,
        dir: &Path,
        name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        for dns in dns_names {
            params
                .subject_alt_names
                .push(SanType::DnsName((*dns).try_into()?));
        }
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(dir, name, params)
    }

    /// A client certificate: Kubernetes reads the user from CN and groups from O.
    pub fn issue_client(
        &self,
        dir: &Path,
        file_name: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<CertFiles> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(dir, file_name, params)
    }

    fn sign(&self, dir: &Path, name: &str, params: CertificateParams) -> Result<CertFiles> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        write_pair(dir, name, &cert.pem(), &key.serialize_pem())
    }
}

/// The key pair that signs (private) and verifies (public) service-account tokens.
#[derive(Debug, Clone)]
pub struct ServiceAccountKey {
    pub private: PathBuf,
    pub public: PathBuf,
}

/// A fresh service-account signing key pair.
pub fn generate_service_account_key(dir: &Path) -> Result<ServiceAccountKey> {
    let key = KeyPair::generate()?;
    let files = ServiceAccountKey {
        private: dir.join("sa.key"),
        public: dir.join("sa.pub"),
    };
    write_private(&files.private, &key.serialize_pem())?;
    std::fs::write(&files.public, key.public_key_pem())
        .io_context(|| format!("writing {:?}", files.public))?;
    Ok(files)
}

fn write_pair(dir: &Path, name: &str, cert_pem: &str, key_pem: &str) -> Result<CertFiles> {
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.cert, cert_pem).io_context(|| format!("writing {:?}", files.cert))?;
    write_private(&files.key, key_pem)?;
    Ok(files)
}

fn write_private(path: &Path, pem: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .io_context(|| format!("creating {path:?}"))?;
    file.write_all(pem.as_bytes())
        .io_context(|| format!("writing {path:?}"))
}

/// Writes a kubeconfig that authenticates with a client certificate.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    client: &CertFiles,
    user: &str,
) -> Result<()> {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tno", "cluster": {
            "server": server,
            "certificate-authority": ca,
        }}],
        "users": [{"name": user, "user": {
            "client-certificate": client.cert,
            "client-key": client.key,
        }}],
        "contexts": [{"name": "tno", "context": {"cluster": "tno", "user": user}}],
        "current-context": "tno",
    });
    // YAML is a superset of JSON, and every Kubernetes component reads it.
    let text = serde_json::to_string_pretty(&config).map_err(|source| crate::Error::Json {
        context: "kubeconfig".into(),
        source,
    })?;
    std::fs::write(path, text).io_context(|| format!("writing {path:?}"))
}
