//! Images from the lab's OCI registry: pulled over the distribution API (every blob checked
//! against its digest), unpacked once per manifest digest, then used as the read-only lower
//! layer of each container's root (see [`super::container`]). An image reference "resolves to
//! the lab registry" when its registry host is a loopback address with a port
//! (`127.0.0.1:<port>/…`), which is where `crane registry serve` listens in the tests; every
//! other reference goes through the [`super::ImageTable`] of local binaries.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tno_oci::Platform;
use tno_oci::registry::{Client, Reference};

use crate::error::{Error, Result};

/// What the image config says to run, and where its root file system is.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The reference's digest (the index's, for a multi-platform image).
    pub digest: String,
    pub manifest_digest: String,
    pub root: PathBuf,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `(uid, gid)` of the config's `User` (numeric only); `None` = root.
    pub user: Option<(u32, u32)>,
    pub working_dir: Option<String>,
}

impl PulledImage {
    /// The image's PATH (its `ENV PATH=…`, else the usual default).
    pub fn path_env(&self) -> String {
        self.env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.clone())
            .unwrap_or_else(|| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
            })
    }

    /// `program` as a path inside the container: absolute paths as given, names looked up
    /// on the image's PATH in its root file system (never on the host).
    pub fn resolve_program(&self, program: &str) -> Option<PathBuf> {
        if program.contains('/') {
            return Some(PathBuf::from(program));
        }
        self.path_env()
            .split(':')
            .map(|dir| Path::new(dir).join(program))
            .find(|candidate| {
                let inside = candidate.strip_prefix("/").unwrap_or(candidate);
                self.root.join(inside).is_file()
            })
    }
}

/// Pulled and unpacked images of one kubelet, by reference.
pub struct ImageStore {
    dir: PathBuf,
    client: Client,
    pulled: tokio::sync::Mutex<HashMap<String, Arc<PulledImage>>>,
    /// reference → `<registry>/<repository>@<digest>` (the pod status' `imageID`).
    ids: std::sync::Mutex<HashMap<String, String>>,
}

impl ImageStore {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            client: Client::new(),
            pulled: tokio::sync::Mutex::default(),
            ids: std::sync::Mutex::default(),
        }
    }

    /// Whether `image` is one this store pulls (a loopback registry with a port).
    pub fn handles(image: &str) -> bool {
        Reference::parse(image)
            .is_ok_and(|reference| reference.is_loopback() && reference.registry.contains(':'))
    }

    /// The `imageID` of a pulled reference: `<registry>/<repository>@<digest>`.
    pub fn image_id(&self, image: &str) -> Option<String> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(image)
            .cloned()
    }

    /// Pulls and unpacks `image` (once per reference with a digest; references by tag are
    /// resolved again on every call, like `imagePullPolicy: Always`).
    pub async fn get(&self, image: &str) -> Result<Arc<PulledImage>> {
        let fail = |reason: String| Error::Pod {
            pod: image.to_string(),
            reason,
        };
        let reference = Reference::parse(image).map_err(|e| fail(e.to_string()))?;
        let mut pulled = self.pulled.lock().await;
        if reference.digest.is_some()
            && let Some(found) = pulled.get(image)
        {
            return Ok(found.clone());
        }
        let platform = Platform::host()
            .ok_or_else(|| fail(format!("no image platform for {}", std::env::consts::ARCH)))?;
        let image_data = self
            .client
            .pull(&reference, platform)
            .await
            .map_err(|e| fail(format!("pulling: {e}")))?;
        let hex = image_data
            .manifest_digest
            .trim_start_matches("sha256:")
            .to_string();
        let root = self.dir.join(&hex).join("rootfs");
        if !root.exists() {
            let staging = self.dir.join(format!("{hex}.unpacking"));
            let layers = image_data.layers.clone();
            let target = staging.clone();
            tokio::task::spawn_blocking(move || {
                if target.exists() {
                    std::fs::remove_dir_all(&target).ok();
                }
                tno_oci::registry::unpack(&layers, &target)
            })
            .await
            .map_err(|e| fail(format!("unpack task: {e}")))?
            .map_err(|e| fail(format!("unpacking: {e}")))?;
            std::fs::create_dir_all(self.dir.join(&hex)).map_err(|source| Error::Io {
                context: format!("creating {:?}", self.dir.join(&hex)),
                source,
            })?;
            std::fs::rename(&staging, &root).map_err(|source| Error::Io {
                context: format!("moving {staging:?} to {root:?}"),
                source,
            })?;
        }
        let config = image_data.config.config().clone().unwrap_or_default();
        let user = match config.user().as_deref() {
            None | Some("") => None,
            Some(user) => Some(parse_user(user).map_err(fail)?),
        };
        let entry = Arc::new(PulledImage {
            digest: image_data.digest.clone(),
            manifest_digest: image_data.manifest_digest.clone(),
            root,
            entrypoint: config.entrypoint().clone().unwrap_or_default(),
            cmd: config.cmd().clone().unwrap_or_default(),
            env: config
                .env()
                .iter()
                .flatten()
                .filter_map(|pair| {
                    pair.split_once('=')
                        .map(|(name, value)| (name.to_string(), value.to_string()))
                })
                .collect(),
            user,
            working_dir: config.working_dir().clone().filter(|dir| !dir.is_empty()),
        });
        pulled.insert(image.to_string(), entry.clone());
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                image.to_string(),
                format!(
                    "{}/{}@{}",
                    reference.registry, reference.repository, image_data.digest
                ),
            );
        Ok(entry)
    }
}

/// `uid[:gid]`, numeric (user names would need the image's /etc/passwd: not supported).
fn parse_user(user: &str) -> std::result::Result<(u32, u32), String> {
    let (uid, gid) = match user.split_once(':') {
        Some((uid, gid)) => (uid, Some(gid)),
        None => (user, None),
    };
    let number = |text: &str| {
        text.parse::<u32>().map_err(|_| {
            format!(
                "image user {user:?} is not numeric (names are not resolved by the test kubelet)"
            )
        })
    };
    let uid = number(uid)?;
    let gid = gid.map(number).transpose()?.unwrap_or(uid);
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_registries_with_a_port_are_pulled() {
        assert!(ImageStore::handles(
            "127.0.0.1:5000/tno/tailnet-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        ));
        assert!(ImageStore::handles(
            "localhost:5000/tno/tailnet-agent:v0.1.0"
        ));
        assert!(!ImageStore::handles("ghcr.io/tailscale/tailscale:v1.102.5"));
        assert!(!ImageStore::handles("tno.local/tailnet-agent:workspace"));
        assert!(!ImageStore::handles("coredns/coredns:1.14.7"));
    }

    #[test]
    fn users_are_numeric() {
        assert_eq!(parse_user("65532:65532"), Ok((65532, 65532)));
        assert_eq!(parse_user("1000"), Ok((1000, 1000)));
        assert!(parse_user("nonroot").is_err());
    }
}
