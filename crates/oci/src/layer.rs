//! Reproducible layers: entries sorted by path, fixed mtime, numeric owners, no names, gzip
//! without a file name or timestamp.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use flate2::{Compression, GzBuilder};

use crate::{Error, IoContext, Result, sha256_digest};

/// One file system entry of a layer. Paths are relative (`etc/passwd`), without `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Dir {
        mode: u32,
        uid: u64,
        gid: u64,
    },
    File {
        mode: u32,
        uid: u64,
        gid: u64,
        contents: Vec<u8>,
    },
}

/// The entries of one layer, by path. Parent directories must be listed too (as in a real
/// image: `usr/`, `usr/local/`, ...); [`LayerSpec::file`] adds missing ones as `0755 root`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerSpec {
    entries: BTreeMap<String, Entry>,
}

impl LayerSpec {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a directory (and its missing parents).
    pub fn dir(&mut self, path: &str, mode: u32, uid: u64, gid: u64) -> Result<&mut Self> {
        let path = clean(path)?;
        self.parents(&path);
        self.entries.insert(path, Entry::Dir { mode, uid, gid });
        Ok(self)
    }

    /// Adds a file (and its missing parents as `0755` root directories).
    pub fn file(
        &mut self,
        path: &str,
        mode: u32,
        uid: u64,
        gid: u64,
        contents: Vec<u8>,
    ) -> Result<&mut Self> {
        let path = clean(path)?;
        self.parents(&path);
        self.entries.insert(
            path,
            Entry::File {
                mode,
                uid,
                gid,
                contents,
            },
        );
        Ok(self)
    }

    /// Adds a host file with the given mode (its own mtime and owner are not used).
    pub fn host_file(&mut self, path: &str, mode: u32, source: &Path) -> Result<&mut Self> {
        let contents =
            std::fs::read(source).io_context(|| format!("reading {}", source.display()))?;
        self.file(path, mode, 0, 0, contents)
    }

    fn parents(&mut self, path: &str) {
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            self.entries.entry(prefix.clone()).or_insert(Entry::Dir {
                mode: 0o755,
                uid: 0,
                gid: 0,
            });
        }
    }

    /// The paths of the layer, in tar order (directories with a trailing `/`).
    pub fn paths(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|(path, entry)| match entry {
                Entry::Dir { .. } => format!("{path}/"),
                Entry::File { .. } => path.clone(),
            })
            .collect()
    }

    /// Writes the layer: `(uncompressed tar, gzip of it)`.
    pub fn build(&self, mtime: u64) -> Result<Layer> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_ustar();
            header.set_mtime(mtime);
            match entry {
                Entry::Dir { mode, uid, gid } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_uid(*uid);
                    header.set_gid(*gid);
                    header.set_size(0);
                    builder
                        .append_data(&mut header, format!("{path}/"), std::io::empty())
                        .io_context(|| format!("tar entry {path}/"))?;
                }
                Entry::File {
                    mode,
                    uid,
                    gid,
                    contents,
                } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_uid(*uid);
                    header.set_gid(*gid);
                    header.set_size(contents.len() as u64);
                    builder
                        .append_data(&mut header, path, contents.as_slice())
                        .io_context(|| format!("tar entry {path}"))?;
                }
            }
        }
        let tar = builder.into_inner().io_context(|| "finishing tar".into())?;
        let mut gzip = GzBuilder::new()
            .mtime(0)
            .operating_system(255)
            .write(Vec::new(), Compression::best());
        gzip.write_all(&tar).io_context(|| "gzip".into())?;
        let compressed = gzip.finish().io_context(|| "finishing gzip".into())?;
        Ok(Layer {
            diff_id: sha256_digest(&tar),
            digest: sha256_digest(&compressed),
            uncompressed_size: tar.len() as u64,
            compressed,
        })
    }
}

/// A built layer.
#[derive(Debug, Clone)]
pub struct Layer {
    /// `sha256:` of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: String,
    /// `sha256:` of the gzip stream (the manifest's layer descriptor).
    pub digest: String,
    pub uncompressed_size: u64,
    pub compressed: Vec<u8>,
}

fn clean(path: &str) -> Result<String> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty()
        || trimmed
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(Error::Invalid(format!("bad layer path {path:?}")));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_entries_in_any_insertion_order_give_the_same_digest() {
        let mut a = LayerSpec::new();
        a.file("usr/local/bin/x", 0o755, 0, 0, b"bin".to_vec())
            .expect("file");
        a.file("etc/passwd", 0o644, 0, 0, b"root".to_vec())
            .expect("file");
        let mut b = LayerSpec::new();
        b.file("etc/passwd", 0o644, 0, 0, b"root".to_vec())
            .expect("file");
        b.file("usr/local/bin/x", 0o755, 0, 0, b"bin".to_vec())
            .expect("file");
        let (a, b) = (a.build(1).expect("build"), b.build(1).expect("build"));
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.diff_id, b.diff_id);
        assert_eq!(a.compressed, b.compressed);
    }

    #[test]
    fn parents_are_added_and_listed_in_tar_order() {
        let mut layer = LayerSpec::new();
        layer
            .file("usr/local/bin/x", 0o755, 0, 0, Vec::new())
            .expect("file");
        layer.dir("tmp", 0o1777, 0, 0).expect("dir");
        assert_eq!(
            layer.paths(),
            [
                "tmp/",
                "usr/",
                "usr/local/",
                "usr/local/bin/",
                "usr/local/bin/x"
            ]
        );
        assert!(layer.file("../x", 0o644, 0, 0, Vec::new()).is_err());
    }

    #[test]
    fn the_mtime_is_part_of_the_digest_and_nothing_else_of_the_host_is() {
        let mut layer = LayerSpec::new();
        layer.file("a", 0o644, 0, 0, b"a".to_vec()).expect("file");
        assert_ne!(
            layer.build(1).expect("build").digest,
            layer.build(2).expect("build").digest
        );
        let built = layer.build(1).expect("build");
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&built.compressed[..]));
        let entries: Vec<(String, u64, u64)> = archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let entry = entry.expect("entry");
                let header = entry.header();
                (
                    entry.path().expect("path").display().to_string(),
                    header.mtime().expect("mtime"),
                    header.uid().expect("uid"),
                )
            })
            .collect();
        assert_eq!(entries, [("a".to_string(), 1, 0)]);
    }
}
