//! The lab's private CA: Headscale serves HTTPS with a certificate it signs, the way a home or
//! company installation does. Everything that talks to Headscale trusts this CA explicitly (the
//! test clients, the operator through the Tailnet's `spec.serverCA`, tailscaled through
//! `SSL_CERT_DIR`), never by switching verification off.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::{Result, TailnetError};

/// The CA certificate's file name inside [`LabCa::dir`] (and the ConfigMap key e2e tests use).
pub const LAB_CA_FILE: &str = "ca.crt";

/// A CA generated for one run, written to `<dir>/ca.crt`.
pub struct LabCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    dir: PathBuf,
}

impl std::fmt::Debug for LabCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LabCa").field("dir", &self.dir).finish()
    }
}

/// A serving certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct ServingCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn failed(what: &str, e: impl std::fmt::Display) -> TailnetError {
    TailnetError::SiteCertificate(format!("lab CA: {what}: {e}"))
}

impl LabCa {
    /// A new CA named `common_name`; its certificate goes to `dir/ca.crt` (the directory holds
    /// nothing else, so it can be given to Go programs as `SSL_CERT_DIR`).
    pub fn generate(dir: &Path, common_name: &str) -> Result<LabCa> {
        std::fs::create_dir_all(dir)
            .map_err(|e| TailnetError::io(format!("creating {}", dir.display()), e))?;
        let key = KeyPair::generate().map_err(|e| failed("key", e))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|e| failed("certificate", e))?;
        let cert_pem = cert.pem();
        write(&dir.join(LAB_CA_FILE), &cert_pem)?;
        Ok(LabCa {
            issuer: Issuer::new(params, key),
            cert_pem,
            dir: dir.to_owned(),
        })
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The directory holding only `ca.crt`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A serving certificate for `dns_names` and `ips`, written to `out_dir/<name>.{crt,key}`.
    pub fn issue_server(
        &self,
        out_dir: &Path,
        name: &str,
        dns_names: &[&str],
        ips: &[IpAddr],
    ) -> Result<ServingCert> {
        let key = KeyPair::generate().map_err(|e| failed("server key", e))?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        for dns in dns_names {
            let dns = (*dns).try_into().map_err(|e| failed("DNS name", e))?;
            params.subject_alt_names.push(SanType::DnsName(dns));
        }
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| failed("server certificate", e))?;
        let files = ServingCert {
            cert: out_dir.join(format!("{name}.crt")),
            key: out_dir.join(format!("{name}.key")),
        };
        write(&files.cert, &cert.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)
        .map_err(|e| TailnetError::io(format!("writing {}", path.display()), e))
}
