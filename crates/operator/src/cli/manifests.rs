//! Loading manifests for the offline `render` command: files or directories of multi-document
//! YAML, each object remembered with where it came from so errors can name file and object.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use serde::de::DeserializeOwned;
use tailnet_api::gateway_parameters::TailnetGatewayParameters;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tailnet_gateway_api::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TCPRoute, TLSRoute};

/// The type of the Secrets `render` reads: certificate Secrets a Gateway listener's
/// `tls.certificateRefs` may name (other Secrets are ignored, never kept).
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// Where an object came from.
#[derive(Clone, Debug)]
pub struct Origin {
    pub file: PathBuf,
    /// 1-based index of the YAML document in the file.
    pub document: usize,
    /// `Kind namespace/name`.
    pub object: String,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (document {}, {})",
            self.file.display(),
            self.document,
            self.object
        )
    }
}

#[derive(Clone, Debug)]
pub struct Sourced<T> {
    pub origin: Origin,
    pub object: T,
}

#[derive(Debug, Default)]
pub struct Manifests {
    pub tailnets: Vec<Sourced<Tailnet>>,
    pub egresses: Vec<Sourced<TailnetEgress>>,
    pub ingresses: Vec<Sourced<TailnetIngress>>,
    pub config_maps: Vec<Sourced<ConfigMap>>,
    pub services: Vec<Sourced<Service>>,
    /// Gateway API objects (any served version of `gateway.networking.k8s.io`).
    pub gateway_classes: Vec<Sourced<GatewayClass>>,
    pub gateway_parameters: Vec<Sourced<TailnetGatewayParameters>>,
    pub gateways: Vec<Sourced<Gateway>>,
    pub http_routes: Vec<Sourced<HTTPRoute>>,
    pub tls_routes: Vec<Sourced<TLSRoute>>,
    pub tcp_routes: Vec<Sourced<TCPRoute>>,
    pub reference_grants: Vec<Sourced<ReferenceGrant>>,
    /// Secrets of type `kubernetes.io/tls` (listeners' certificates; their content is never
    /// printed).
    pub tls_secrets: Vec<Sourced<Secret>>,
    /// Namespaces (their labels, for listeners' `allowedRoutes.namespaces.selector`).
    pub namespaces: Vec<Sourced<Namespace>>,
    /// Documents of other kinds (ignored, listed for the user).
    pub ignored: Vec<Origin>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file} (document {document}): not valid YAML: {message}")]
    Yaml {
        file: PathBuf,
        document: usize,
        message: String,
    },
    #[error("{origin}: {field}: {message}")]
    Field {
        origin: Origin,
        field: String,
        message: String,
    },
    #[error("{0}: no .yaml, .yml or .json files found")]
    Empty(PathBuf),
}

/// The path argument that means standard input.
pub const STDIN: &str = "-";
/// How standard input is named in messages.
pub const STDIN_NAME: &str = "<stdin>";

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    if path == Path::new(STDIN) {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let meta = std::fs::metadata(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let entries = std::fs::read_dir(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        let is_manifest = child
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        // Like `kubectl apply -f <dir>`: not recursive.
        if is_manifest && child.is_file() {
            out.push(child);
        }
    }
    Ok(())
}

/// Deserializes one object, naming the failing field (`spec.targets[0].port`).
fn typed<T: DeserializeOwned>(
    value: serde_json::Value,
    origin: &Origin,
) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize(value).map_err(|e| ManifestError::Field {
        origin: origin.clone(),
        field: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

fn describe(value: &serde_json::Value) -> String {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or("<no kind>");
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("<no name>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(|n| n.as_str())
    {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

impl Manifests {
    /// Loads every manifest under `paths` (`-`: standard input); `default_namespace` is given to namespaced objects
    /// without one (as `kubectl apply -n` would).
    pub fn load(paths: &[PathBuf], default_namespace: &str) -> Result<Manifests, ManifestError> {
        let mut files = Vec::new();
        for path in paths {
            let before = files.len();
            collect_files(path, &mut files)?;
            if files.len() == before {
                return Err(ManifestError::Empty(path.clone()));
            }
        }
        let mut manifests = Manifests::default();
        let mut stdin_read = false;
        for file in files {
            let (file, text) = if file == Path::new(STDIN) {
                if std::mem::replace(&mut stdin_read, true) {
                    // `-` given twice: standard input is read once.
                    continue;
                }
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(
                    |source| ManifestError::Read {
                        path: PathBuf::from(STDIN_NAME),
                        source,
                    },
                )?;
                (PathBuf::from(STDIN_NAME), text)
            } else {
                let text =
                    std::fs::read_to_string(&file).map_err(|source| ManifestError::Read {
                        path: file.clone(),
                        source,
                    })?;
                (file, text)
            };
            for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
                let value: serde_json::Value =
                    serde::Deserialize::deserialize(document).map_err(|e| ManifestError::Yaml {
                        file: file.clone(),
                        document: index + 1,
                        message: e.to_string(),
                    })?;
                if value.is_null() {
                    continue;
                }
                manifests.add(value, &file, index + 1, default_namespace)?;
            }
        }
        Ok(manifests)
    }

    fn add(
        &mut self,
        mut value: serde_json::Value,
        file: &Path,
        document: usize,
        default_namespace: &str,
    ) -> Result<(), ManifestError> {
        let kind = value
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string();
        let api_version = value
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string();
        let namespaced = matches!(
            kind.as_str(),
            "TailnetEgress"
                | "TailnetIngress"
                | "ConfigMap"
                | "Service"
                | "Secret"
                | "TailnetGatewayParameters"
                | "Gateway"
                | "HTTPRoute"
                | "TLSRoute"
                | "TCPRoute"
                | "ReferenceGrant"
        );
        if namespaced
            && let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut())
            && !meta.contains_key("namespace")
        {
            meta.insert("namespace".to_string(), default_namespace.into());
        }
        let origin = Origin {
            file: file.to_path_buf(),
            document,
            object: describe(&value),
        };
        let ours = api_version == format!("{}/{}", tailnet_api::GROUP, tailnet_api::VERSION);
        if api_version
            .strip_prefix(tailnet_gateway_api::GROUP)
            .is_some_and(|v| v.starts_with('/'))
        {
            return self.add_gateway_api(&kind, value, origin);
        }
        if kind == "Secret" && api_version == "v1" {
            // Only certificate Secrets are read; the others' content is not even kept.
            if value.get("type").and_then(|t| t.as_str()) == Some(TLS_SECRET_TYPE) {
                self.tls_secrets.push(Sourced {
                    object: typed(value, &origin)?,
                    origin,
                });
            } else {
                self.ignored.push(origin);
            }
            return Ok(());
        }
        match (kind.as_str(), ours, api_version.as_str()) {
            ("Tailnet", true, _) => self.tailnets.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("TailnetEgress", true, _) => self.egresses.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("TailnetIngress", true, _) => self.ingresses.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("TailnetGatewayParameters", true, _) => self.gateway_parameters.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            (
                "Tailnet" | "TailnetEgress" | "TailnetIngress" | "TailnetGatewayParameters",
                false,
                _,
            ) => {
                return Err(ManifestError::Field {
                    origin,
                    field: "apiVersion".to_string(),
                    message: format!(
                        "{api_version:?} is not served; use {}/{}",
                        tailnet_api::GROUP,
                        tailnet_api::VERSION
                    ),
                });
            }
            ("ConfigMap", _, "v1") => self.config_maps.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("Service", _, "v1") => self.services.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("Namespace", _, "v1") => self.namespaces.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            ("List", _, "v1") => {
                let items = value
                    .get("items")
                    .and_then(|i| i.as_array())
                    .cloned()
                    .unwrap_or_default();
                for item in items {
                    self.add(item, file, document, default_namespace)?;
                }
            }
            _ => self.ignored.push(origin),
        }
        Ok(())
    }

    /// A Gateway API object (group `gateway.networking.k8s.io`, any version: the apiserver
    /// converts between the served ones).
    fn add_gateway_api(
        &mut self,
        kind: &str,
        value: serde_json::Value,
        origin: Origin,
    ) -> Result<(), ManifestError> {
        use tailnet_gateway_api::kinds;
        match kind {
            kinds::GATEWAY_CLASS => self.gateway_classes.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            kinds::GATEWAY => self.gateways.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            kinds::HTTP_ROUTE => self.http_routes.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            kinds::TLS_ROUTE => self.tls_routes.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            kinds::TCP_ROUTE => self.tcp_routes.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            kinds::REFERENCE_GRANT => self.reference_grants.push(Sourced {
                object: typed(value, &origin)?,
                origin,
            }),
            _ => self.ignored.push(origin),
        }
        Ok(())
    }
}
