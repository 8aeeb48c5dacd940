//! Daemonless, reproducible OCI images and a small OCI distribution client.
//!
//! - [`layer`]: a layer from a list of entries, written as a tar stream in path order with a
//!   fixed mtime, numeric owners and no user/group names, gzip-compressed without a file name
//!   or timestamp: the same entries give the same bytes (and digest) on every machine.
//! - [`image`]: config, manifest and (multi-platform) index from layers, with the
//!   `oci-spec` types, serialised as canonical JSON (object keys sorted) so that maps such as
//!   labels do not reorder between runs.
//! - [`layout`]: an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/`).
//! - [`auth`]: credentials from the user's Docker config, `WWW-Authenticate` challenges.
//! - [`registry`]: push a layout to a registry by digest (and a tag), pull an image by
//!   reference with every blob's digest verified, unpack its layers into a directory.

pub mod auth;
pub mod image;
pub mod layer;
pub mod layout;
pub mod registry;

use sha2::{Digest as _, Sha256};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("OCI data: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("HTTP {method} {url}: {source}")]
    Http {
        method: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("registry answered {method} {url} with {status}: {body}")]
    Status {
        method: &'static str,
        url: String,
        status: u16,
        body: String,
    },
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
    #[error("{method} {url}: the registry refused access ({reason})")]
    Unauthorized {
        method: &'static str,
        url: String,
        reason: String,
    },
    #[error("bad image reference {reference:?}: {reason}")]
    Reference { reference: String, reason: String },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) trait IoContext<T> {
    fn io_context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: context(),
            source,
        })
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// JSON with every object's keys sorted (and no insignificant whitespace): the bytes whose
/// digest names a config, manifest or index. `oci-spec` keeps labels and annotations in hash
/// maps, whose iteration order changes from run to run.
pub fn canonical_json(value: &impl serde::Serialize) -> Result<Vec<u8>> {
    fn sort(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries
                        .into_iter()
                        .map(|(key, value)| (key, sort(value)))
                        .collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    Ok(serde_json::to_vec(&sort(serde_json::to_value(value)?))?)
}

/// A platform as OCI indexes name it (`linux/amd64`) and the Rust target that builds for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    LinuxAmd64,
    LinuxArm64,
}

impl Platform {
    pub const ALL: [Platform; 2] = [Platform::LinuxAmd64, Platform::LinuxArm64];

    pub fn name(self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "linux/amd64",
            Platform::LinuxArm64 => "linux/arm64",
        }
    }

    /// The static (musl) Rust target of this platform.
    pub fn rust_target(self) -> &'static str {
        match self {
            Platform::LinuxAmd64 => "x86_64-unknown-linux-musl",
            Platform::LinuxArm64 => "aarch64-unknown-linux-musl",
        }
    }

    pub fn arch(self) -> oci_spec::image::Arch {
        match self {
            Platform::LinuxAmd64 => oci_spec::image::Arch::Amd64,
            Platform::LinuxArm64 => oci_spec::image::Arch::ARM64,
        }
    }

    /// The platform of the running machine, if it is one of ours.
    pub fn host() -> Option<Platform> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Platform::LinuxAmd64),
            "aarch64" => Some(Platform::LinuxArm64),
            _ => None,
        }
    }

    pub fn parse(name: &str) -> Result<Platform> {
        Platform::ALL
            .into_iter()
            .find(|platform| platform.name() == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown platform {name:?} (known: linux/amd64, linux/arm64)"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let value = serde_json::json!({"b": 1, "a": {"d": [ {"z": 0, "y": 1} ], "c": "x"}});
        let bytes = canonical_json(&value).expect("serialises");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            r#"{"a":{"c":"x","d":[{"y":1,"z":0}]},"b":1}"#
        );
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            sha256_digest(b"{}"),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
