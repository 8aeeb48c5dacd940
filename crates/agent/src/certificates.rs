//! The serving certificates an agent config names: the agent-level `tls` and the own `tls` of
//! `http` routes (a Gateway's HTTPS listeners each bring their `certificateRefs`). One
//! [`CertStore`] per distinct file pair, kept while the config names the pair (so the sites
//! built on it stay valid across reloads) and re-read at every poll.

use std::collections::BTreeMap;
use std::sync::Arc;

use tailnet_api::agent_config::{AgentConfig, HttpRoute, IngressListener, TlsFiles};
use tailnet_api::agent_status::CertificateView;
use tracing::{error, info, warn};

use crate::dial::error_chain;
use crate::metrics::Metrics;
use crate::tls::{CertStore, ListenerCertificates, Reload};

/// A certificate's files: (certFile, keyFile).
type FilePair = (String, String);

fn file_pair(files: &TlsFiles) -> FilePair {
    (files.cert_file.clone(), files.key_file.clone())
}

/// The certificate file pairs `config` names, each once: the agent-level one first, then the
/// routes' own in config order. Bounded by the routes (validated).
pub fn named_file_pairs(config: &AgentConfig) -> Vec<FilePair> {
    let routes = config.ingress.iter().flat_map(|listener| match listener {
        IngressListener::Http { routes, .. } => routes.as_slice(),
        _ => &[],
    });
    let mut pairs: Vec<FilePair> = Vec::new();
    for files in config
        .tls
        .iter()
        .chain(routes.filter_map(|route| route.tls.as_ref()))
    {
        let pair = file_pair(files);
        if !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    pairs
}

#[derive(Debug)]
struct Slot {
    store: Arc<CertStore>,
    /// Why the pair is not served as it is on disk (empty: it is).
    problem: String,
}

/// The agent's certificate stores.
#[derive(Debug, Default)]
pub struct Certificates {
    slots: BTreeMap<FilePair, Slot>,
    /// The status message of the last refresh (a change is logged).
    message: String,
}

impl Certificates {
    /// Re-reads every pair `config` names (new pairs get a store, pairs no longer named lose
    /// theirs), counts and logs what changed, and returns the `/status` view: loaded when
    /// every named certificate is.
    pub fn refresh(&mut self, config: &AgentConfig, metrics: &Metrics) -> CertificateView {
        let named = named_file_pairs(config);
        self.slots.retain(|pair, _| named.contains(pair));
        for pair in &named {
            let slot = self.slots.entry(pair.clone()).or_insert_with(|| Slot {
                store: Arc::new(CertStore::new(&pair.0, &pair.1)),
                problem: String::new(),
            });
            slot.problem = reload(&slot.store, metrics);
        }
        let required = config
            .ingress
            .iter()
            .any(|listener| matches!(listener, IngressListener::Http { .. }));
        let loaded = !named.is_empty()
            && self
                .slots
                .values()
                .all(|slot| slot.store.current().is_some());
        let message = if named.is_empty() {
            if required {
                "no certificate configured".to_owned()
            } else {
                String::new()
            }
        } else {
            self.problems(&named)
        };
        if message != self.message {
            if !message.is_empty() && required {
                warn!(detail = %message, "names whose certificate is not valid do not serve until it is");
            }
            self.message = message.clone();
        }
        metrics.certificate_loaded.set(i64::from(loaded));
        CertificateView {
            required,
            loaded,
            message,
        }
    }

    /// The problems of `pairs`, each prefixed with its certificate file when there are
    /// several pairs (one pair reads as it always did).
    fn problems(&self, pairs: &[FilePair]) -> String {
        pairs
            .iter()
            .filter_map(|pair| {
                let slot = self.slots.get(pair)?;
                if slot.problem.is_empty() {
                    None
                } else if pairs.len() == 1 {
                    Some(slot.problem.clone())
                } else {
                    Some(format!("{}: {}", pair.0, slot.problem))
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The certificates of an `http` listener with `routes`. `Err` (why) when none of them
    /// is loaded: the listener does not serve at all. With some loaded, it serves, and the
    /// names of a route whose certificate is not loaded fail their handshakes.
    pub fn for_listener(
        &self,
        config: &AgentConfig,
        routes: &[HttpRoute],
    ) -> Result<ListenerCertificates, String> {
        let store_of = |files: &TlsFiles| {
            self.slots
                .get(&file_pair(files))
                .map(|slot| slot.store.clone())
                .ok_or_else(|| format!("no certificate store for {}", files.cert_file))
        };
        let agent = config.tls.as_ref().map(store_of).transpose()?;
        // A route naming files never falls back to the agent-level certificate.
        let routes_own = routes
            .iter()
            .map(|route| route.tls.as_ref().map(store_of).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let certificates = ListenerCertificates {
            agent,
            routes: routes_own,
        };
        // A listener nothing is attached to yet (a Gateway listener) serves no name: it is up
        // with whatever it has, and every handshake finds no route.
        if routes.is_empty() {
            return Ok(certificates);
        }
        let in_use = certificates.in_use(routes.len());
        if in_use.is_empty() {
            return Err("no certificate configured".into());
        }
        if in_use.iter().any(|store| store.current().is_some()) {
            return Ok(certificates);
        }
        let pairs: Vec<FilePair> = in_use
            .iter()
            .map(|store| {
                let (cert, key) = store.paths();
                (
                    cert.to_string_lossy().into_owned(),
                    key.to_string_lossy().into_owned(),
                )
            })
            .collect();
        let problems = self.problems(&pairs);
        Err(if problems.is_empty() {
            "no valid certificate".into()
        } else {
            problems
        })
    }
}

/// Re-reads one store; returns why its files are not served as they are on disk (empty: they
/// are).
fn reload(store: &CertStore, metrics: &Metrics) -> String {
    let cert = store.paths().0.display().to_string();
    match store.reload() {
        Ok(Reload::Loaded) => {
            metrics.certificate_reloads.inc();
            info!(%cert, "serving certificate loaded");
            String::new()
        }
        Ok(Reload::Unchanged) => String::new(),
        Err(rejected) => {
            let reason = error_chain(&rejected.error);
            if !rejected.repeated {
                metrics.certificate_reload_failures.inc();
                error!(%cert, error = %reason, "certificate files rejected");
            }
            if store.current().is_some() {
                format!("certificate files rejected, serving the previous one: {reason}")
            } else {
                format!("no valid certificate: {reason}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;
    use serde_json::json;

    use super::*;

    fn config(value: serde_json::Value) -> AgentConfig {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("config: {e}"))
    }

    fn route(name: &str, host: &str, tls: Option<(&str, &str)>) -> serde_json::Value {
        let mut route = json!({"name": name, "hostnames": [host],
                               "backend": {"host": "b", "port": 80}});
        if let Some((cert, key)) = tls {
            route["tls"] = json!({"certFile": cert, "keyFile": key});
        }
        route
    }

    fn gateway(dir: &std::path::Path, agent_tls: bool) -> AgentConfig {
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let (a_crt, a_key, b_crt, b_key) =
            (file("a.crt"), file("a.key"), file("b.crt"), file("b.key"));
        let mut value = json!({
            "localapiSocket": "/s", "adminPort": 9180,
            "ingress": [
                {"mode": "http", "port": 443, "routes": [
                    route("foo", "foo.example.test", Some((&a_crt, &a_key))),
                    route("wild", "*.example.test", Some((&b_crt, &b_key))),
                    route("other", "other.test", None),
                ]},
                {"mode": "http", "port": 8443, "routes": [
                    route("again", "again.example.test", Some((&a_crt, &a_key))),
                ]},
                {"mode": "plainHttp", "port": 80, "routes": [route("plain", "p.test", None)]},
            ],
        });
        if agent_tls {
            value["tls"] = json!({"certFile": file("c.crt"), "keyFile": file("c.key")});
        }
        config(value)
    }

    fn write_pair(dir: &std::path::Path, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
        let cert = rcgen::CertificateParams::new(vec![format!("{name}.example.test")])
            .and_then(|params| params.self_signed(&key))
            .unwrap_or_else(|e| panic!("cert: {e}"));
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem())
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem())
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn each_file_pair_is_named_once_agent_level_first() {
        let dir = std::path::Path::new("/d");
        let pairs = named_file_pairs(&gateway(dir, true));
        let names: Vec<&str> = pairs.iter().map(|(cert, _)| cert.as_str()).collect();
        assert_eq!(names, ["/d/c.crt", "/d/a.crt", "/d/b.crt"]);
        assert_eq!(named_file_pairs(&gateway(dir, false)).len(), 2);
    }

    /// A listener serves while any of its certificates is loaded; a route's own certificate
    /// never falls back to the agent-level one; the view is loaded only when all are.
    #[test]
    fn listeners_serve_with_the_certificates_they_have() {
        let dir = std::env::temp_dir().join(format!("tailnet-agent-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let metrics = Metrics::new(&mut Registry::default());
        let config = gateway(&dir, true);
        let IngressListener::Http { routes, .. } = &config.ingress[0] else {
            panic!("http listener first");
        };
        let mut certificates = Certificates::default();

        let view = certificates.refresh(&config, &metrics);
        assert!(view.required && !view.loaded, "{view:?}");
        assert_eq!(view.message.matches("no valid certificate").count(), 3);
        assert!(view.message.contains("a.crt: "), "{}", view.message);
        let down = certificates.for_listener(&config, routes).err();
        assert!(down.is_some_and(|why| why.contains("no valid certificate")));

        write_pair(&dir, "b");
        let view = certificates.refresh(&config, &metrics);
        assert!(!view.loaded);
        let up = certificates
            .for_listener(&config, routes)
            .unwrap_or_else(|why| panic!("one certificate is enough: {why}"));
        let own_a = up.of_route(0).unwrap_or_else(|| panic!("foo has its own"));
        assert!(
            own_a.current().is_none(),
            "foo's is not loaded, and no fallback"
        );
        assert!(
            up.of_route(1)
                .is_some_and(|store| store.current().is_some())
        );
        assert!(
            matches!((up.of_route(2), up.agent.as_ref()),
                     (Some(route), Some(agent)) if Arc::ptr_eq(route, agent)),
            "other.test uses the agent-level certificate"
        );
        let IngressListener::Http { routes: only_a, .. } = &config.ingress[1] else {
            panic!("second http listener");
        };
        assert!(certificates.for_listener(&config, only_a).is_err());

        write_pair(&dir, "a");
        write_pair(&dir, "c");
        let view = certificates.refresh(&config, &metrics);
        assert!(view.loaded && view.message.is_empty(), "{view:?}");
        let again = certificates
            .for_listener(&config, routes)
            .unwrap_or_else(|why| panic!("{why}"));
        assert!(again.same_as(&up), "a refresh keeps the stores");
        let port_8443 = certificates
            .for_listener(&config, only_a)
            .unwrap_or_else(|why| panic!("{why}"));
        assert!(
            port_8443
                .of_route(0)
                .is_some_and(|store| Arc::ptr_eq(store, own_a)),
            "one store per file pair, shared by the listeners"
        );

        // Without the agent-level certificate its store goes; routes without their own then
        // have none (validation refuses such a config; the set does not invent one).
        let without_agent = gateway(&dir, false);
        let view = certificates.refresh(&without_agent, &metrics);
        assert!(view.loaded);
        assert_eq!(certificates.slots.len(), 2);
        let listener = certificates
            .for_listener(&without_agent, routes)
            .unwrap_or_else(|why| panic!("{why}"));
        assert!(listener.of_route(2).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_config_without_any_certificate_says_so() {
        let metrics = Metrics::new(&mut Registry::default());
        let config = config(json!({
            "localapiSocket": "/s", "adminPort": 9180,
            "ingress": [{"mode": "http", "port": 443, "routes": [route("a", "a.test", None)]}],
        }));
        let mut certificates = Certificates::default();
        let view = certificates.refresh(&config, &metrics);
        assert_eq!(view.message, "no certificate configured");
        assert!(view.required && !view.loaded);
        let IngressListener::Http { routes, .. } = &config.ingress[0] else {
            panic!("http listener");
        };
        assert_eq!(
            certificates.for_listener(&config, routes).err().as_deref(),
            Some("no certificate configured")
        );
        // Without routes (a Gateway listener nothing is attached to) the listener is up and
        // serves no name.
        let listener = certificates
            .for_listener(&config, &[])
            .unwrap_or_else(|why| panic!("{why}"));
        assert!(listener.in_use(0).is_empty() && listener.agent.is_none());
    }
}
