//! OCI image layout directories (<https://github.com/opencontainers/image-spec/blob/main/image-layout.md>).

use std::path::{Path, PathBuf};

use oci_spec::image::{ImageIndex, ImageIndexBuilder, ImageManifest, MediaType};

use crate::image::{Blob, PlatformImage};
use crate::{Error, IoContext, Result, canonical_json, sha256_digest};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Writes `dir` (emptied first) as a layout holding one multi-platform image: the index
/// blob, every platform's blobs, and `index.json` pointing at the index under `tag`.
pub fn write(dir: &Path, index: &Blob, images: &[PlatformImage], tag: &str) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).io_context(|| format!("removing {}", dir.display()))?;
    }
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).io_context(|| format!("creating {}", blobs.display()))?;
    let mut all: Vec<Blob> = images.iter().flat_map(PlatformImage::blobs).collect();
    all.push(index.clone());
    for blob in all {
        let path = blob_path(dir, &blob.digest)?;
        std::fs::write(&path, &blob.bytes).io_context(|| format!("writing {}", path.display()))?;
    }
    let mut descriptor = index.descriptor()?;
    descriptor.set_annotations(Some([(REF_NAME.to_string(), tag.to_string())].into()));
    let top = ImageIndexBuilder::default()
        .schema_version(2u32)
        .manifests(vec![descriptor])
        .build()?;
    write_file(&dir.join("index.json"), &canonical_json(&top)?)?;
    write_file(
        &dir.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).io_context(|| format!("writing {}", path.display()))
}

fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| Error::Invalid(format!("not a sha256 digest: {digest:?}")))?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// A layout read back: the image index and every blob it reaches, verified.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    pub tag: Option<String>,
    /// The multi-platform index.
    pub index: Blob,
    /// Per platform: (manifest, config, layers).
    pub manifests: Vec<(Blob, Blob, Vec<Blob>)>,
}

impl Layout {
    pub fn read(dir: &Path) -> Result<Self> {
        let top_path = dir.join("index.json");
        let top: ImageIndex = serde_json::from_slice(
            &std::fs::read(&top_path).io_context(|| format!("reading {}", top_path.display()))?,
        )?;
        let [descriptor] = top.manifests().as_slice() else {
            return Err(Error::Invalid(format!(
                "{} must name exactly one image index",
                top_path.display()
            )));
        };
        let tag = descriptor
            .annotations()
            .as_ref()
            .and_then(|annotations| annotations.get(REF_NAME).cloned());
        let index = read_blob(dir, MediaType::ImageIndex, descriptor.digest().as_ref())?;
        let parsed: ImageIndex = serde_json::from_slice(&index.bytes)?;
        let mut manifests = Vec::new();
        for entry in parsed.manifests() {
            let manifest = read_blob(dir, MediaType::ImageManifest, entry.digest().as_ref())?;
            let parsed: ImageManifest = serde_json::from_slice(&manifest.bytes)?;
            let config = read_blob(
                dir,
                MediaType::ImageConfig,
                parsed.config().digest().as_ref(),
            )?;
            let layers = parsed
                .layers()
                .iter()
                .map(|layer| read_blob(dir, layer.media_type().clone(), layer.digest().as_ref()))
                .collect::<Result<Vec<_>>>()?;
            manifests.push((manifest, config, layers));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            tag,
            index,
            manifests,
        })
    }

    /// The digest that names the image (of its multi-platform index).
    pub fn digest(&self) -> &str {
        &self.index.digest
    }
}

fn read_blob(dir: &Path, media_type: MediaType, digest: &str) -> Result<Blob> {
    let path = blob_path(dir, digest)?;
    let bytes = std::fs::read(&path).io_context(|| format!("reading {}", path.display()))?;
    let actual = sha256_digest(&bytes);
    if actual != digest {
        return Err(Error::DigestMismatch {
            what: path.display().to_string(),
            expected: digest.to_string(),
            actual,
        });
    }
    Ok(Blob {
        media_type,
        digest: actual,
        bytes,
    })
}
