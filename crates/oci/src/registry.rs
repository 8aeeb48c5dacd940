//! A small OCI distribution client: push a layout by digest, pull an image by reference with
//! every blob verified, unpack layers. Anonymous, or with credentials
//! ([`Client::with_credentials`], e.g. from [`crate::auth::docker_credentials`]): a request the
//! registry answers `401` is retried once after the challenge in its `WWW-Authenticate` header
//! (`Basic`: the credentials; `Bearer realm,service,scope`: a token from the realm, fetched with
//! the credentials, or anonymously without). Plain HTTP for loopback registries, HTTPS
//! otherwise.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest, MediaType};

use crate::auth::{Challenge, Credentials};
use crate::image::Blob;
use crate::layout::Layout;
use crate::{Error, IoContext, Platform, Result, sha256_digest};

/// `registry/repository[:tag][@sha256:…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    /// Parses a reference whose first component is a registry host (`host:port` or a name
    /// with a dot); Docker Hub's short forms are not resolved.
    pub fn parse(reference: &str) -> Result<Self> {
        let bad = |reason: &str| Error::Reference {
            reference: reference.to_string(),
            reason: reason.to_string(),
        };
        let (name, digest) = match reference.split_once('@') {
            Some((name, digest)) => {
                if !digest.starts_with("sha256:") || digest.len() != 71 {
                    return Err(bad("the digest must be sha256:<64 hex>"));
                }
                (name, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        let (registry, rest) = name
            .split_once('/')
            .ok_or_else(|| bad("no registry host"))?;
        if !(registry.contains(':') || registry.contains('.') || registry == "localhost") {
            return Err(bad("the first component is not a registry host"));
        }
        let last_slash = rest.rfind('/').map_or(0, |index| index + 1);
        let (repository, tag) = match rest[last_slash..].find(':') {
            Some(colon) => (
                &rest[..last_slash + colon],
                Some(rest[last_slash + colon + 1..].to_string()),
            ),
            None => (rest, None),
        };
        if repository.is_empty() {
            return Err(bad("empty repository"));
        }
        Ok(Self {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The digest if given, else the tag, else `latest`.
    pub fn reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// Whether the registry host is a loopback address (spoken to over plain HTTP).
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.registry)
    }
}

/// `127.0.0.1:5000`, `localhost:5000`, `[::1]:5000`.
pub fn is_loopback_host(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// Registry client; anonymous unless given credentials.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    credentials: Option<Credentials>,
    /// `Authorization` values that worked, by `registry/repository` (Bearer tokens are scoped
    /// to a repository). Never logged.
    authorization: Arc<Mutex<HashMap<String, String>>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`Client::pull`] fetched, verified.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The digest the reference resolved to (the index's, for a multi-platform image).
    pub digest: String,
    /// The platform manifest's digest.
    pub manifest_digest: String,
    pub config: ImageConfiguration,
    /// Compressed layers, in order.
    pub layers: Vec<Blob>,
}

impl Client {
    pub fn new() -> Self {
        Self {
            http: reqwest::Client::new(),
            credentials: None,
            authorization: Arc::default(),
        }
    }

    /// A client that answers the registry's challenges with `credentials`.
    pub fn with_credentials(credentials: Option<Credentials>) -> Self {
        Self {
            credentials,
            ..Self::new()
        }
    }

    fn base(registry: &str) -> String {
        let scheme = if is_loopback_host(registry) {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{registry}")
    }

    /// Sends the request `build` makes, with the authorization that worked for `scope`
    /// (`registry/repository`) before; on `401`, answers the challenge and sends it once more.
    async fn send(
        &self,
        method: &'static str,
        url: &str,
        scope: &str,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response> {
        let registry = scope
            .split_once('/')
            .map_or(scope, |(registry, _)| registry);
        let cached = self
            .cached_authorization(scope)
            .filter(|_| url.starts_with(&format!("{}/", Self::base(registry))));
        let response = self.attempt(method, url, &build, cached.as_deref()).await?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        // Credentials and tokens go to the registry only, never to another host (an upload
        // Location may point at storage elsewhere).
        if !url.starts_with(&format!("{}/", Self::base(registry))) {
            return Err(Error::Unauthorized {
                method,
                url: url.to_string(),
                reason: format!("401 from a host other than the registry {registry}"),
            });
        }
        let challenge = response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .and_then(Challenge::parse)
            .ok_or_else(|| Error::Unauthorized {
                method,
                url: url.to_string(),
                reason: "401 without a WWW-Authenticate challenge".into(),
            })?;
        let authorization = self.answer(method, url, &challenge).await?;
        let response = self
            .attempt(method, url, &build, Some(&authorization))
            .await?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(Error::Unauthorized {
                method,
                url: url.to_string(),
                reason: if self.credentials.is_some() {
                    "401 with the credentials from the Docker config".into()
                } else {
                    "401 and no credentials for this registry in the Docker config".into()
                },
            });
        }
        if let Ok(mut cache) = self.authorization.lock() {
            cache.insert(scope.to_string(), authorization);
        }
        Ok(response)
    }

    fn cached_authorization(&self, scope: &str) -> Option<String> {
        self.authorization
            .lock()
            .ok()
            .and_then(|cache| cache.get(scope).cloned())
    }

    async fn attempt(
        &self,
        method: &'static str,
        url: &str,
        build: &impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
        authorization: Option<&str>,
    ) -> Result<reqwest::Response> {
        let mut request = build(&self.http);
        if let Some(value) = authorization {
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        request.send().await.map_err(|source| Error::Http {
            method,
            url: url.to_string(),
            source,
        })
    }

    /// The `Authorization` value answering `challenge`: Basic credentials, or a Bearer token
    /// from the realm (`GET realm?service=…&scope=…`, with Basic credentials if any).
    async fn answer(
        &self,
        method: &'static str,
        url: &str,
        challenge: &Challenge,
    ) -> Result<String> {
        let refused = |reason: String| Error::Unauthorized {
            method,
            url: url.to_string(),
            reason,
        };
        match challenge.scheme.as_str() {
            "basic" => self
                .credentials
                .as_ref()
                .map(Credentials::basic_header)
                .ok_or_else(|| {
                    refused("Basic authentication asked, no credentials for this registry in the Docker config".into())
                }),
            "bearer" => {
                let realm = challenge
                    .param("realm")
                    .ok_or_else(|| refused("Bearer challenge without a realm".into()))?;
                let mut query = Vec::new();
                for name in ["service", "scope"] {
                    if let Some(value) = challenge.param(name) {
                        query.push((name, value));
                    }
                }
                let mut request = self.http.get(realm).query(&query);
                if let Some(credentials) = &self.credentials {
                    request = request.header(
                        reqwest::header::AUTHORIZATION,
                        credentials.basic_header(),
                    );
                }
                let response = request.send().await.map_err(|source| Error::Http {
                    method: "GET",
                    url: realm.to_string(),
                    source,
                })?;
                if !response.status().is_success() {
                    let hint = if self.credentials.is_some() {
                        "for the credentials from the Docker config"
                    } else {
                        "to an anonymous request; no credentials for this registry in the Docker config"
                    };
                    return Err(refused(format!(
                        "the token service {realm} answered {} {hint}",
                        response.status().as_u16()
                    )));
                }
                let body: serde_json::Value =
                    serde_json::from_slice(&Self::body("GET", realm, response).await?)?;
                let token = body["token"]
                    .as_str()
                    .or_else(|| body["access_token"].as_str())
                    .ok_or_else(|| refused(format!("the token service {realm} sent no token")))?;
                Ok(format!("Bearer {token}"))
            }
            other => Err(refused(format!("unsupported authentication scheme {other:?}"))),
        }
    }

    async fn expect_success(
        method: &'static str,
        url: &str,
        response: reqwest::Response,
    ) -> Result<reqwest::Response> {
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        Err(Error::Status {
            method,
            url: url.to_string(),
            status,
            body: body.chars().take(500).collect(),
        })
    }

    async fn body(method: &'static str, url: &str, response: reqwest::Response) -> Result<Vec<u8>> {
        Ok(response
            .bytes()
            .await
            .map_err(|source| Error::Http {
                method,
                url: url.to_string(),
                source,
            })?
            .to_vec())
    }

    /// Uploads a blob unless the registry has it (monolithic POST + PUT upload).
    pub async fn push_blob(&self, registry: &str, repository: &str, blob: &Blob) -> Result<()> {
        let base = Self::base(registry);
        let url = format!("{base}/v2/{repository}/blobs/{}", blob.digest);
        let scope = format!("{registry}/{repository}");
        let head = self
            .send("HEAD", &url, &scope, |http| http.head(&url))
            .await?;
        if head.status().is_success() {
            return Ok(());
        }
        let start = format!("{base}/v2/{repository}/blobs/uploads/");
        let response = self
            .send("POST", &start, &scope, |http| http.post(&start))
            .await?;
        let response = Self::expect_success("POST", &start, response).await?;
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| Error::Invalid(format!("POST {start}: no Location header")))?;
        let location = if location.starts_with("http://") || location.starts_with("https://") {
            location.to_string()
        } else {
            format!("{base}{location}")
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let put = format!("{location}{separator}digest={}", blob.digest);
        let response = self
            .send("PUT", &put, &scope, |http| {
                http.put(&put)
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(blob.bytes.clone())
            })
            .await?;
        Self::expect_success("PUT", &put, response).await?;
        Ok(())
    }

    /// Puts a manifest or index under `reference` (a digest or a tag).
    pub async fn push_manifest(
        &self,
        registry: &str,
        repository: &str,
        reference: &str,
        blob: &Blob,
    ) -> Result<()> {
        let url = format!(
            "{}/v2/{repository}/manifests/{reference}",
            Self::base(registry)
        );
        let response = self
            .send("PUT", &url, &format!("{registry}/{repository}"), |http| {
                http.put(&url)
                    .header(reqwest::header::CONTENT_TYPE, blob.media_type.to_string())
                    .body(blob.bytes.clone())
            })
            .await?;
        Self::expect_success("PUT", &url, response).await?;
        Ok(())
    }

    /// Pushes a layout to `<registry>/<repository>`: blobs, each platform manifest by digest,
    /// then the index by digest and under `tag` (or the layout's tag). Returns the reference
    /// by digest.
    pub async fn push_layout(
        &self,
        layout: &Layout,
        registry: &str,
        repository: &str,
        tag: Option<&str>,
    ) -> Result<String> {
        for (manifest, config, layers) in &layout.manifests {
            for blob in layers.iter().chain(std::iter::once(config)) {
                self.push_blob(registry, repository, blob).await?;
            }
            self.push_manifest(registry, repository, &manifest.digest, manifest)
                .await?;
        }
        self.push_manifest(registry, repository, layout.digest(), &layout.index)
            .await?;
        if let Some(tag) = tag.or(layout.tag.as_deref()) {
            self.push_manifest(registry, repository, tag, &layout.index)
                .await?;
        }
        Ok(format!("{registry}/{repository}@{}", layout.digest()))
    }

    async fn get_manifest(&self, reference: &Reference, name: &str) -> Result<(String, Vec<u8>)> {
        let url = format!(
            "{}/v2/{}/manifests/{name}",
            Self::base(&reference.registry),
            reference.repository
        );
        let response = self
            .send("GET", &url, &scope_of(reference), |http| {
                http.get(&url)
                    .header(reqwest::header::ACCEPT, MANIFEST_ACCEPT)
            })
            .await?;
        let response = Self::expect_success("GET", &url, response).await?;
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = Self::body("GET", &url, response).await?;
        if name.starts_with("sha256:") {
            verify(&url, name, &bytes)?;
        }
        Ok((media_type, bytes))
    }

    async fn get_blob(&self, reference: &Reference, digest: &str) -> Result<Vec<u8>> {
        let url = format!(
            "{}/v2/{}/blobs/{digest}",
            Self::base(&reference.registry),
            reference.repository
        );
        let response = self
            .send("GET", &url, &scope_of(reference), |http| http.get(&url))
            .await?;
        let response = Self::expect_success("GET", &url, response).await?;
        let bytes = Self::body("GET", &url, response).await?;
        verify(&url, digest, &bytes)?;
        Ok(bytes)
    }

    /// Pulls `reference` for `platform`: the index (if any), the platform's manifest, its
    /// config and layers, each checked against the digest that names it.
    pub async fn pull(&self, reference: &Reference, platform: Platform) -> Result<PulledImage> {
        let (media_type, bytes) = self.get_manifest(reference, reference.reference()).await?;
        let digest = sha256_digest(&bytes);
        let is_index = media_type.contains("index") || media_type.contains("manifest.list");
        let (manifest_digest, manifest_bytes) = if is_index {
            let index: ImageIndex = serde_json::from_slice(&bytes)?;
            let wanted = platform.arch();
            let entry = index
                .manifests()
                .iter()
                .find(|entry| {
                    entry.platform().as_ref().is_some_and(|p| {
                        *p.architecture() == wanted && *p.os() == oci_spec::image::Os::Linux
                    })
                })
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "{}: no manifest for {} in the index",
                        reference.repository,
                        platform.name()
                    ))
                })?;
            let name = entry.digest().to_string();
            let (_, manifest) = self.get_manifest(reference, &name).await?;
            (name, manifest)
        } else {
            (digest.clone(), bytes)
        };
        let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes)?;
        let config_bytes = self
            .get_blob(reference, manifest.config().digest().as_ref())
            .await?;
        let config: ImageConfiguration = serde_json::from_slice(&config_bytes)?;
        let mut layers = Vec::new();
        for layer in manifest.layers() {
            let digest = layer.digest().to_string();
            let bytes = self.get_blob(reference, &digest).await?;
            layers.push(Blob {
                media_type: layer.media_type().clone(),
                digest,
                bytes,
            });
        }
        Ok(PulledImage {
            digest,
            manifest_digest,
            config,
            layers,
        })
    }
}

fn scope_of(reference: &Reference) -> String {
    format!("{}/{}", reference.registry, reference.repository)
}

fn verify(what: &str, expected: &str, bytes: &[u8]) -> Result<()> {
    let actual = sha256_digest(bytes);
    if actual == expected {
        Ok(())
    } else {
        Err(Error::DigestMismatch {
            what: what.to_string(),
            expected: expected.to_string(),
            actual,
        })
    }
}

/// Unpacks layers in order into `root` (created), honouring OCI whiteouts (`.wh.<name>`
/// removes `<name>`; `.wh..wh..opq` empties its directory). Owners and modes are kept (the
/// caller is root); paths escaping `root` are refused by the tar crate.
pub fn unpack(layers: &[Blob], root: &Path) -> Result<()> {
    std::fs::create_dir_all(root).io_context(|| format!("creating {}", root.display()))?;
    for layer in layers {
        let reader: Box<dyn std::io::Read> = match layer.media_type {
            MediaType::ImageLayerGzip => {
                Box::new(flate2::read::GzDecoder::new(layer.bytes.as_slice()))
            }
            MediaType::ImageLayer => Box::new(layer.bytes.as_slice()),
            MediaType::Other(ref other) if other.ends_with("tar.gzip") => {
                Box::new(flate2::read::GzDecoder::new(layer.bytes.as_slice()))
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "layer {}: unsupported media type {other}",
                    layer.digest
                )));
            }
        };
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_unpack_xattrs(false);
        archive.set_overwrite(true);
        let entries = archive
            .entries()
            .io_context(|| format!("reading layer {}", layer.digest))?;
        for entry in entries {
            let mut entry = entry.io_context(|| format!("reading layer {}", layer.digest))?;
            let path = entry
                .path()
                .io_context(|| format!("entry path in layer {}", layer.digest))?
                .into_owned();
            let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
                entry
                    .unpack_in(root)
                    .io_context(|| format!("unpacking {}", path.display()))?;
                continue;
            };
            if name == ".wh..wh..opq" {
                let dir = root.join(path.parent().unwrap_or(Path::new("")));
                if let Ok(children) = std::fs::read_dir(&dir) {
                    for child in children.flatten() {
                        remove(&child.path())?;
                    }
                }
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                let target = root
                    .join(path.parent().unwrap_or(Path::new("")))
                    .join(hidden);
                if target.starts_with(root) {
                    remove(&target)?;
                }
                continue;
            }
            entry
                .unpack_in(root)
                .io_context(|| format!("unpacking {}", path.display()))?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => Ok(()),
    };
    result.io_context(|| format!("removing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_with_port_tag_and_digest() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let reference = Reference::parse(&format!("127.0.0.1:5000/tno/tailnet-agent:v1@{digest}"))
            .expect("parses");
        assert_eq!(reference.registry, "127.0.0.1:5000");
        assert_eq!(reference.repository, "tno/tailnet-agent");
        assert_eq!(reference.tag.as_deref(), Some("v1"));
        assert_eq!(reference.reference(), digest);
        assert!(reference.is_loopback());
        let plain = Reference::parse("ghcr.io/tailscale/tailscale").expect("parses");
        assert_eq!(plain.reference(), "latest");
        assert!(!plain.is_loopback());
        assert!(Reference::parse("tailscale/tailscale:v1").is_err());
        assert!(Reference::parse("localhost:5000/x@sha256:short").is_err());
        assert!(is_loopback_host("[::1]:5000"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("10.0.0.1:5000"));
    }
}
