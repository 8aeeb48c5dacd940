//! TLS material: the serving certificates (reloaded when cert-manager renews them in place),
//! the certificate resolver of `http` listeners (SNI picks the route, the route its
//! certificate), and backend client configs that trust only the configured CA bundle.

use std::io::Read;
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
    #[error("{path} is larger than {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
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

/// The largest certificate, key or CA file read: a Kubernetes Secret or ConfigMap holds at
/// most 1 MiB, so nothing a volume can carry is refused, and a stray huge file is not read
/// whole on every poll.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_PEM_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(TlsError::TooLarge {
            path: path.to_owned(),
            limit: MAX_PEM_FILE_BYTES,
        });
    }
    Ok(bytes)
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

/// One serving certificate (the agent-level one, or a route's own). Files are re-read on every poll and
/// compared by content: kubelet swaps Secret volumes by symlink, so mtimes of the visible
/// paths are not reliable.
///
/// The certificate and key are read as one pair, parsed, and checked to belong together (the
/// key's public key is the leaf's) before the pair replaces the served one in one swap. A
/// pair that fails — a file missing or unreadable, not PEM, a key that does not match (such
/// as a read that caught kubelet's swap between the two files) — is rejected and the
/// previous certificate keeps serving. Only removed files (not found) unload it: the names it
/// serves then fail their handshakes (an `http` listener without any loaded certificate
/// stops).
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

/// The certificates of one `http` listener: each route's own, and the agent-level one for
/// the routes without one.
#[derive(Clone, Debug, Default)]
pub struct ListenerCertificates {
    /// The agent-level certificate (`tls`).
    pub agent: Option<Arc<CertStore>>,
    /// By route index: the route's own certificate (`routes[].tls`); routes beyond the end
    /// have none.
    pub routes: Vec<Option<Arc<CertStore>>>,
}

impl From<Arc<CertStore>> for ListenerCertificates {
    /// One certificate for every route.
    fn from(store: Arc<CertStore>) -> Self {
        ListenerCertificates {
            agent: Some(store),
            routes: Vec::new(),
        }
    }
}

impl ListenerCertificates {
    /// The certificate of route `index`: its own, else the agent-level one.
    pub fn of_route(&self, index: usize) -> Option<&Arc<CertStore>> {
        self.routes
            .get(index)
            .and_then(Option::as_ref)
            .or(self.agent.as_ref())
    }

    /// The certificate a ClientHello gets: SNI selects the route (with routing's precedence:
    /// exact, longest wildcard, `*`) and the route its certificate; a name no route serves
    /// gets none. Without SNI: the `*` route's certificate if there is such a route, else the
    /// agent-level one.
    pub fn for_server_name(
        &self,
        routes: &RouteTable,
        server_name: Option<&str>,
    ) -> Option<&Arc<CertStore>> {
        match server_name {
            Some(name) => self.of_route(routes.index_of(name)?),
            None => match routes.catch_all() {
                Some(index) => self.of_route(index),
                None => self.agent.as_ref(),
            },
        }
    }

    /// Every distinct store the listener's `route_count` routes use.
    pub fn in_use(&self, route_count: usize) -> Vec<&Arc<CertStore>> {
        let mut stores: Vec<&Arc<CertStore>> = Vec::new();
        for store in (0..route_count).filter_map(|index| self.of_route(index)) {
            if !stores.iter().any(|known| Arc::ptr_eq(known, store)) {
                stores.push(store);
            }
        }
        stores
    }

    /// The same stores (by identity) for the same routes: a site built with `other` serves
    /// exactly what one built with these does.
    pub fn same_as(&self, other: &ListenerCertificates) -> bool {
        fn same(a: Option<&Arc<CertStore>>, b: Option<&Arc<CertStore>>) -> bool {
            match (a, b) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
        }
        let longest = self.routes.len().max(other.routes.len());
        same(self.agent.as_ref(), other.agent.as_ref())
            && (0..longest).all(|index| {
                same(
                    self.routes.get(index).and_then(Option::as_ref),
                    other.routes.get(index).and_then(Option::as_ref),
                )
            })
    }
}

/// Answers a ClientHello only for names this listener serves (or without SNI, see
/// [`ListenerCertificates::for_server_name`]) and only while that route's certificate is
/// loaded; everything else fails the handshake (never a wrong certificate).
#[derive(Debug)]
pub struct SniResolver {
    certificates: ListenerCertificates,
    routes: RouteTable,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.certificates
            .for_server_name(&self.routes, hello.server_name())?
            .current()
    }
}

/// Server config of one `http` listener: TLS 1.2/1.3, ALPN h2 and http/1.1.
pub fn server_config(
    certificates: ListenerCertificates,
    routes: RouteTable,
) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Config { source })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver {
            certificates,
            routes,
        }));
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

    fn http_route(name: &str, hostnames: &[&str]) -> tailnet_api::agent_config::HttpRoute {
        serde_json::from_value(serde_json::json!({
            "name": name, "hostnames": hostnames, "backend": {"host": "b", "port": 80},
        }))
        .unwrap_or_else(|e| panic!("route: {e}"))
    }

    fn store(name: &str) -> Arc<CertStore> {
        Arc::new(CertStore::new(format!("{name}.crt"), format!("{name}.key")))
    }

    /// SNI picks the route with routing's precedence, the route its certificate; routes
    /// without one get the agent-level certificate; no SNI gets the `*` route's, else the
    /// agent-level one; an unknown name gets none.
    #[test]
    fn the_certificate_follows_the_route_sni_selects() {
        let (exact, wildcard, deeper, any, agent) = (
            store("exact"),
            store("wildcard"),
            store("deeper"),
            store("any"),
            store("agent"),
        );
        let routes = RouteTable::new(&[
            http_route("exact", &["foo.example.test"]),
            http_route("wildcard", &["*.example.test"]),
            http_route("deeper", &["*.b.example.test"]),
            http_route("plain", &["plain.test"]),
        ]);
        let certificates = ListenerCertificates {
            agent: Some(agent.clone()),
            routes: vec![
                Some(exact.clone()),
                Some(wildcard.clone()),
                Some(deeper.clone()),
            ],
        };
        let cases: [(Option<&str>, Option<&Arc<CertStore>>); 9] = [
            (Some("foo.example.test"), Some(&exact)),
            (Some("FOO.Example.Test."), Some(&exact)),
            (Some("bar.example.test"), Some(&wildcard)),
            (Some("x.y.example.test"), Some(&wildcard)),
            (Some("x.b.example.test"), Some(&deeper)),
            (Some("plain.test"), Some(&agent)),
            (Some("example.test"), None),
            (Some("unknown.test"), None),
            (None, Some(&agent)),
        ];
        for (name, expected) in cases {
            let chosen = certificates.for_server_name(&routes, name);
            assert!(
                match (chosen, expected) {
                    (Some(chosen), Some(expected)) => Arc::ptr_eq(chosen, expected),
                    (chosen, expected) => chosen.is_none() && expected.is_none(),
                },
                "{name:?}: {chosen:?}"
            );
        }

        let with_catch_all = RouteTable::new(&[
            http_route("exact", &["foo.example.test"]),
            http_route("any", &["*"]),
        ]);
        let certificates = ListenerCertificates {
            agent: Some(agent.clone()),
            routes: vec![None, Some(any.clone())],
        };
        let without_sni = certificates.for_server_name(&with_catch_all, None);
        assert!(without_sni.is_some_and(|chosen| Arc::ptr_eq(chosen, &any)));
        let elsewhere = certificates.for_server_name(&with_catch_all, Some("other.test"));
        assert!(elsewhere.is_some_and(|chosen| Arc::ptr_eq(chosen, &any)));
        let foo = certificates.for_server_name(&with_catch_all, Some("foo.example.test"));
        assert!(foo.is_some_and(|chosen| Arc::ptr_eq(chosen, &agent)));

        // Neither a `*` route nor an agent-level certificate: no SNI, no certificate.
        let own_only = ListenerCertificates {
            agent: None,
            routes: vec![Some(exact.clone())],
        };
        assert!(own_only.for_server_name(&routes, None).is_none());
        assert!(
            own_only
                .for_server_name(&routes, Some("plain.test"))
                .is_none()
        );
    }

    #[test]
    fn the_stores_in_use_are_distinct_and_compared_by_identity() {
        let (a, agent) = (store("a"), store("agent"));
        let certificates = ListenerCertificates {
            agent: Some(agent.clone()),
            routes: vec![Some(a.clone()), None, Some(a.clone())],
        };
        let in_use = certificates.in_use(4);
        assert_eq!(in_use.len(), 2);
        assert!(Arc::ptr_eq(in_use[0], &a) && Arc::ptr_eq(in_use[1], &agent));
        assert_eq!(certificates.in_use(0).len(), 0);

        assert!(certificates.same_as(&certificates.clone()));
        let trimmed = ListenerCertificates {
            routes: vec![Some(a.clone()), None, Some(a.clone()), None],
            ..certificates.clone()
        };
        assert!(
            certificates.same_as(&trimmed),
            "trailing Nones change nothing"
        );
        let other_file = ListenerCertificates {
            routes: vec![Some(store("a")), None, Some(a.clone())],
            ..certificates.clone()
        };
        assert!(!certificates.same_as(&other_file));
        let without_agent = ListenerCertificates {
            agent: None,
            ..certificates.clone()
        };
        assert!(!certificates.same_as(&without_agent));
    }

    #[test]
    fn files_beyond_the_size_bound_are_refused() {
        let dir =
            std::env::temp_dir().join(format!("tailnet-agent-tls-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("huge.crt");
        let size = usize::try_from(MAX_PEM_FILE_BYTES).unwrap_or(usize::MAX);
        std::fs::write(&path, vec![b'a'; size]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&path).map(|bytes| bytes.len()).ok(), Some(size));
        std::fs::write(&path, vec![b'a'; size + 1]).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&path), Err(TlsError::TooLarge { .. })));
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
