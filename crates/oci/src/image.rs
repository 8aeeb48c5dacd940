//! Image config, manifest and index from layers (`oci-spec` types, canonical JSON).

use std::collections::{BTreeMap, HashMap};

use oci_spec::image::{
    ConfigBuilder, Descriptor, DescriptorBuilder, HistoryBuilder, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder,
};

use crate::layer::Layer;
use crate::{Error, Platform, Result, canonical_json, sha256_digest};

/// A content-addressed blob.
#[derive(Debug, Clone)]
pub struct Blob {
    pub media_type: MediaType,
    pub digest: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    pub fn new(media_type: MediaType, bytes: Vec<u8>) -> Self {
        Self {
            media_type,
            digest: sha256_digest(&bytes),
            bytes,
        }
    }

    pub fn descriptor(&self) -> Result<Descriptor> {
        Ok(DescriptorBuilder::default()
            .media_type(self.media_type.clone())
            .digest(parse_digest(&self.digest)?)
            .size(self.bytes.len() as u64)
            .build()?)
    }
}

pub(crate) fn parse_digest(digest: &str) -> Result<oci_spec::image::Digest> {
    digest
        .parse()
        .map_err(|e: oci_spec::OciSpecError| Error::Invalid(format!("digest {digest:?}: {e}")))
}

/// What runs: the image config's `config` part.
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    /// `uid:gid`, numeric.
    pub user: String,
    pub working_dir: String,
    pub labels: BTreeMap<String, String>,
}

/// One platform's image: its layers, config and manifest.
#[derive(Debug, Clone)]
pub struct PlatformImage {
    pub platform: Platform,
    pub layers: Vec<(Layer, String)>,
    pub config: Blob,
    pub manifest: Blob,
}

impl PlatformImage {
    /// `layers`: each with a one-line history entry (`created_by`). `created`: RFC 3339.
    pub fn build(
        platform: Platform,
        layers: Vec<(Layer, String)>,
        run: &RunConfig,
        created: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let mut config = ConfigBuilder::default()
            .env(run.env.clone())
            .entrypoint(run.entrypoint.clone())
            .user(run.user.clone())
            .working_dir(run.working_dir.clone());
        if !run.cmd.is_empty() {
            config = config.cmd(run.cmd.clone());
        }
        if !run.labels.is_empty() {
            config = config.labels(to_hash_map(&run.labels));
        }
        let history = layers
            .iter()
            .map(|(_, created_by)| {
                HistoryBuilder::default()
                    .created(created.to_string())
                    .created_by(created_by.clone())
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let image_config = ImageConfigurationBuilder::default()
            .created(created.to_string())
            .architecture(platform.arch())
            .os(Os::Linux)
            .config(config.build()?)
            .rootfs(
                RootFsBuilder::default()
                    .typ("layers")
                    .diff_ids(
                        layers
                            .iter()
                            .map(|(layer, _)| layer.diff_id.clone())
                            .collect::<Vec<_>>(),
                    )
                    .build()?,
            )
            .history(history)
            .build()?;
        let config = Blob::new(MediaType::ImageConfig, canonical_json(&image_config)?);
        let layer_descriptors = layers
            .iter()
            .map(|(layer, _)| {
                Ok(DescriptorBuilder::default()
                    .media_type(MediaType::ImageLayerGzip)
                    .digest(parse_digest(&layer.digest)?)
                    .size(layer.compressed.len() as u64)
                    .build()?)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut manifest = ImageManifestBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageManifest)
            .config(config.descriptor()?)
            .layers(layer_descriptors);
        if !annotations.is_empty() {
            manifest = manifest.annotations(to_hash_map(annotations));
        }
        let manifest = Blob::new(
            MediaType::ImageManifest,
            canonical_json(&manifest.build()?)?,
        );
        Ok(Self {
            platform,
            layers,
            config,
            manifest,
        })
    }

    /// Every blob of this image (layers, config, manifest).
    pub fn blobs(&self) -> Vec<Blob> {
        let mut blobs: Vec<Blob> = self
            .layers
            .iter()
            .map(|(layer, _)| Blob {
                media_type: MediaType::ImageLayerGzip,
                digest: layer.digest.clone(),
                bytes: layer.compressed.clone(),
            })
            .collect();
        blobs.push(self.config.clone());
        blobs.push(self.manifest.clone());
        blobs
    }

    /// Compressed size of the image (layers + config + manifest), as a registry stores it.
    pub fn compressed_size(&self) -> u64 {
        self.blobs()
            .iter()
            .map(|blob| blob.bytes.len() as u64)
            .sum()
    }

    /// Uncompressed size of its layers.
    pub fn uncompressed_size(&self) -> u64 {
        self.layers
            .iter()
            .map(|(layer, _)| layer.uncompressed_size)
            .sum()
    }
}

/// The multi-platform index over `images` (one entry per platform).
pub fn index(images: &[PlatformImage], annotations: &BTreeMap<String, String>) -> Result<Blob> {
    let manifests = images
        .iter()
        .map(|image| {
            let mut descriptor = image.manifest.descriptor()?;
            descriptor.set_platform(Some(
                PlatformBuilder::default()
                    .architecture(image.platform.arch())
                    .os(Os::Linux)
                    .build()?,
            ));
            Ok(descriptor)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests);
    if !annotations.is_empty() {
        index = index.annotations(to_hash_map(annotations));
    }
    Ok(Blob::new(
        MediaType::ImageIndex,
        canonical_json(&index.build()?)?,
    ))
}

fn to_hash_map(map: &BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}
