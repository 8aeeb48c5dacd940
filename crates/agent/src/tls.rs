//! TLS material: the serving certificate (reloaded when cert-manager renews it in place), the
//! SNI-checking certificate resolver of `http` listeners, and backend client configs that
//! trust only the configured CA bundle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::routing::RouteTable;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path} is not valid PEM")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path} holds no usable private key")]
    Key {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the private key does not belong to the certificate")]
    KeyMismatch {
        #[source]
        source: rustls::Error,
    },
    #[error("CA bundle {path} has no usable certificate")]
    CaBundle {
        path: PathBuf,
        #[source]
        source: Option<rustls::Error>,
    },
    #[error("TLS configuration")]
    Config {
        #[source]
        source: rustls::Error,
    },
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Parses a PEM chain and key into a rustls key, checking that they belong together.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: cert_path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| TlsError::Pem {
        path: key_path.to_owned(),
        source,
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| match source {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch { source },
        source => TlsError::Key {
            path: key_path.to_owned(),
            source,
        },
    })
}

/// What a reload found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    Unchanged,
    Loaded,
}

/// A reload that found files it could not use; the store keeps what it had.
#[derive(Debug)]
pub struct Rejected {
    pub error: TlsError,
    /// The same files were rejected at the previous reload already (count and log once).
    pub repeated: bool,
}

/// The serving certificate of all `http` listeners. Files are re-read on every poll and
/// compared by content: kubelet swaps Secret volumes by symlink, so mtimes of the visible
/// paths are not reliable.
///
/// The certificate and key are read as one pair, parsed, and checked to belong together (the
/// key's public key is the leaf's) before the pair replaces the served one in one swap. A
/// pair that fails — a file missing or unreadable, not PEM, a key that does not match (such
/// as a read that caught kubelet's swap between the two files) — is rejected and the
/// previous certificate keeps serving. Only removed files (not found) unload it: the `http`
/// listeners then stop serving.
#[derive(Debug)]
pub struct CertStore {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The files of the served certificate, and those last rejected.
    files: Mutex<Files>,
}

#[derive(Debug, Default)]
struct Files {
    loaded: Option<(Vec<u8>, Vec<u8>)>,
    rejected: Option<Option<(Vec<u8>, Vec<u8>)>>,
}

impl CertStore {
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        CertStore {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            current: RwLock::new(None),
            files: Mutex::new(Files::default()),
        }
    }

    pub fn paths(&self) -> (&Path, &Path) {
        (&self.cert_file, &self.key_file)
    }

    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads both files; a valid, matching, changed pair replaces the served certificate,
    /// removed files unload it, anything else keeps it.
    pub fn reload(&self) -> Result<Reload, Rejected> {
        let pair = read(&self.cert_file).and_then(|cert| Ok((cert, read(&self.key_file)?)));
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        let parsed = match pair {
            Ok(pair) if files.loaded.as_ref() == Some(&pair) => {
                files.rejected = None;
                return Ok(Reload::Unchanged);
            }
            Ok(pair) => match certified_key(&pair.0, &pair.1, &self.cert_file, &self.key_file) {
                Ok(key) => Ok((key, pair)),
                Err(error) => Err((error, Some(pair))),
            },
            Err(error) => {
                if let TlsError::Read { source, .. } = &error
                    && source.kind() == std::io::ErrorKind::NotFound
                {
                    // Removed files are an explicit "stop serving", not a torn update.
                    *self.current.write().unwrap_or_else(PoisonError::into_inner) = None;
                    files.loaded = None;
                }
                Err((error, None))
            }
        };
        match parsed {
            Ok((key, pair)) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
                files.loaded = Some(pair);
                files.rejected = None;
                Ok(Reload::Loaded)
            }
            Err((error, pair)) => {
                let repeated = files.rejected.as_ref() == Some(&pair);
                files.rejected = Some(pair);
                Err(Rejected { error, repeated })
            }
        }
    }
}

/// Answers a ClientHello only for names this listener serves (or without SNI) and only while
/// a certificate is loaded; everything else fails the handshake.
#[derive(Debug)]
pub struct SniResolver {
    store: Arc<CertStore>,
    routes: RouteTable,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(name) = hello.server_name()
            && !self.routes.serves(name)
        {
            return None;
        }
        self.store.current()
    }
}

/// Server config of one `http` listener: TLS 1.2/1.3, ALPN h2 and http/1.1.
pub fn server_config(store: Arc<CertStore>, routes: RouteTable) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config { source })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver { store, routes }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Client config for a backend: trusts exactly the certificates in the CA bundle (no system
/// roots, and there is no code path that skips verification).
pub fn backend_client_config(ca_pem: &[u8], ca_path: &Path) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|source| TlsError::Pem {
            path: ca_path.to_owned(),
            source,
        })?;
        roots.add(cert).map_err(|source| TlsError::CaBundle {
            path: ca_path.to_owned(),
            source: Some(source),
        })?;
    }
    if roots.is_empty() {
        return Err(TlsError::CaBundle {
            path: ca_path.to_owned(),
            source: None,
        });
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config { source })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A CA bundle file, re-read when it changes (ConfigMap volumes update in place).
#[derive(Debug)]
pub struct CaBundle {
    path: PathBuf,
    cached: Mutex<Option<(Vec<u8>, Arc<ClientConfig>)>>,
}

impl CaBundle {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CaBundle {
            path: path.into(),
            cached: Mutex::new(None),
        }
    }

    /// The client config for the bundle as it is on disk now.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let pem = read(&self.path)?;
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((cached_pem, config)) = cached.as_ref()
            && *cached_pem == pem
        {
            return Ok(config.clone());
        }
        let config = Arc::new(backend_client_config(&pem, &self.path)?);
        *cached = Some((pem, config.clone()));
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
        let params = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap_or_else(|e| panic!("params: {e}"));
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("cert: {e}"));
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_matching_pair_loads_and_a_foreign_key_does_not() {
        let (cert, key) = self_signed("a.example");
        let (_, other_key) = self_signed("b.example");
        let paths = (Path::new("tls.crt"), Path::new("tls.key"));
        assert!(certified_key(cert.as_bytes(), key.as_bytes(), paths.0, paths.1).is_ok());
        assert!(matches!(
            certified_key(cert.as_bytes(), other_key.as_bytes(), paths.0, paths.1),
            Err(TlsError::KeyMismatch { .. })
        ));
        assert!(matches!(
            certified_key(b"", key.as_bytes(), paths.0, paths.1),
            Err(TlsError::NoCertificate { .. })
        ));
        assert!(certified_key(cert.as_bytes(), b"nonsense", paths.0, paths.1).is_err());
    }

    #[test]
    fn the_store_follows_the_files() {
        let dir = std::env::temp_dir().join(format!("tailnet-agent-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let store = CertStore::new(&cert_path, &key_path);
        assert!(matches!(
            store.reload(),
            Err(Rejected {
                error: TlsError::Read { .. },
                repeated: false
            })
        ));
        assert!(matches!(
            store.reload(),
            Err(Rejected { repeated: true, .. })
        ));
        assert!(store.current().is_none());

        let (cert, key) = self_signed("a.example");
        std::fs::write(&cert_path, &cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key_path, &key).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.reload().ok(), Some(Reload::Loaded));
        assert_eq!(store.reload().ok(), Some(Reload::Unchanged));
        let first = store.current();

        let (cert, key) = self_signed("a.example");
        std::fs::write(&cert_path, &cert).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key_path, &key).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.reload().ok(), Some(Reload::Loaded));
        assert!(!Arc::ptr_eq(
            &first.unwrap_or_else(|| panic!("loaded")),
            &store.current().unwrap_or_else(|| panic!("reloaded"))
        ));

        let served = store.current().unwrap_or_else(|| panic!("reloaded"));
        std::fs::write(&key_path, "garbage").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            store.reload(),
            Err(Rejected {
                repeated: false,
                ..
            })
        ));
        assert!(
            store
                .current()
                .is_some_and(|current| Arc::ptr_eq(&current, &served)),
            "a rejected pair keeps the previous certificate"
        );
        std::fs::remove_file(&key_path).unwrap_or_else(|e| panic!("{e}"));
        assert!(store.reload().is_err());
        assert!(store.current().is_none(), "removed files unload it");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_ca_bundle_without_certificates_is_rejected() {
        assert!(matches!(
            backend_client_config(b"", Path::new("ca.crt")),
            Err(TlsError::CaBundle { .. })
        ));
        let (cert, _) = self_signed("ca.example");
        assert!(backend_client_config(cert.as_bytes(), Path::new("ca.crt")).is_ok());
    }

    /// The bug: crt and key were read separately and a pair that did not match unloaded the
    /// certificate (the `http` listeners stopped). Now a mismatched pair — here the new
    /// certificate with the old key, as a read between kubelet's two file swaps would see —
    /// is rejected, counted once, and the old certificate keeps serving until a matching pair
    /// arrives.
    #[test]
    fn a_mismatched_pair_keeps_the_old_certificate_until_a_matching_one_arrives() {
        let dir =
            std::env::temp_dir().join(format!("tailnet-agent-tls-pair-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        let write = |cert: &str, key: &str| {
            std::fs::write(&cert_path, cert).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&key_path, key).unwrap_or_else(|e| panic!("{e}"));
        };
        let store = CertStore::new(&cert_path, &key_path);
        let (old_cert, old_key) = self_signed("a.example");
        write(&old_cert, &old_key);
        assert_eq!(store.reload().ok(), Some(Reload::Loaded));
        let old = store.current().unwrap_or_else(|| panic!("loaded"));

        let (new_cert, new_key) = self_signed("a.example");
        write(&new_cert, &old_key);
        let rejected = store
            .reload()
            .err()
            .unwrap_or_else(|| panic!("mismatch loaded"));
        assert!(
            matches!(rejected.error, TlsError::KeyMismatch { .. }),
            "{:?}",
            rejected.error
        );
        assert!(!rejected.repeated);
        assert!(matches!(
            store.reload(),
            Err(Rejected { repeated: true, .. })
        ));
        let served = store
            .current()
            .unwrap_or_else(|| panic!("the certificate was unloaded"));
        assert!(Arc::ptr_eq(&served, &old), "the old pair keeps serving");

        write(&new_cert, &new_key);
        assert_eq!(store.reload().ok(), Some(Reload::Loaded));
        let served = store.current().unwrap_or_else(|| panic!("loaded"));
        assert!(
            !Arc::ptr_eq(&served, &old),
            "the matching new pair replaced it"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
