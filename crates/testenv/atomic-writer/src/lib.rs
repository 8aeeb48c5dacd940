//! The kubelet's `AtomicWriter` (Kubernetes `pkg/volume/util/atomic_writer.go`): how the
//! kubelet lays out ConfigMap, Secret, downward API and projected volumes, so that a reader
//! never sees a mix of old and new files:
//!
//! ```text
//! <volume>/..2026_12_04_13_45_57.12345/   the whole payload
//! <volume>/..data -> ..2026_12_04_13_45_57.12345
//! <volume>/<key>  -> ..data/<key>          one symlink per top-level path of the payload
//! ```
//!
//! An update writes the payload into a new timestamped directory, points a new symlink
//! `..data_tmp` at it and renames that over `..data` (the one atomic step), adds the symlinks of
//! new top-level paths, removes those of paths that left the payload, then removes the previous
//! directory. A program watching a projected file (Headscale's `dns.extra_records_path`,
//! CoreDNS's `hosts` file) sees the file it watched deleted and its path leading to the new one.
//!
//! As in the kubelet: nothing is written while every file's content is unchanged and no path
//! left the payload (a mode change alone is no change); entries of the target directory that
//! are not symlinks of this layout are left alone. Unlike the kubelet, a `..data_tmp` left by
//! an interrupted write is replaced instead of failing every later write.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The symlink to the current timestamped directory.
pub const DATA_DIR: &str = "..data";
/// The symlink that is renamed over [`DATA_DIR`].
const NEW_DATA_DIR: &str = "..data_tmp";
const MAX_FILE_NAME: usize = 255;
const MAX_PATH: usize = 4096;
/// Mode of the timestamped directories (the kubelet's).
const DATA_DIR_MODE: u32 = 0o755;

/// One file of a volume: contents and permission bits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

impl FileProjection {
    pub fn new(data: impl Into<Vec<u8>>, mode: u32) -> Self {
        FileProjection {
            data: data.into(),
            mode,
        }
    }
}

/// Relative path in the volume → file.
pub type Payload = BTreeMap<String, FileProjection>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid volume path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// What [`AtomicWriter::write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The payload was already there.
    Unchanged,
    /// `..data` now points at this new directory.
    Written { data_dir: String },
}

/// Writes payloads into one target directory (a volume).
#[derive(Clone, Debug)]
pub struct AtomicWriter {
    target: PathBuf,
}

impl AtomicWriter {
    /// A writer for `target`, which must exist.
    pub fn new(target: impl Into<PathBuf>) -> Result<Self> {
        let target = target.into();
        std::fs::metadata(&target).map_err(io_error("inspecting the volume directory", &target))?;
        Ok(AtomicWriter { target })
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The timestamped directory `..data` points at, `None` before the first write.
    pub fn current_data_dir(&self) -> Result<Option<String>> {
        let link = self.target.join(DATA_DIR);
        match std::fs::read_link(&link) {
            Ok(dir) => Ok(Some(dir.to_string_lossy().into_owned())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("reading the link", &link)(e)),
        }
    }

    /// Makes the volume hold exactly `payload` (see the module documentation for the steps).
    pub fn write(&self, payload: &Payload) -> Result<Outcome> {
        let payload = clean_payload(payload)?;
        let old = self.current_data_dir()?;
        let mut leaving = BTreeSet::new();
        let mut changed = true;
        if let Some(old) = &old {
            let old_dir = self.target.join(old);
            leaving = paths_leaving(&payload, &old_dir)?;
            changed = !leaving.is_empty() || differs(&payload, &old_dir)?;
        }
        let mut outcome = Outcome::Unchanged;
        if changed {
            let name = self.create_data_dir()?;
            if let Err(error) = self.swap_in(&payload, &name) {
                let _ = std::fs::remove_dir_all(self.target.join(&name));
                return Err(error);
            }
            outcome = Outcome::Written { data_dir: name };
        }
        self.link_user_visible(&payload)?;
        self.unlink_user_visible(&leaving)?;
        if changed && let Some(old) = old {
            let old_dir = self.target.join(old);
            std::fs::remove_dir_all(&old_dir)
                .map_err(io_error("removing the previous data directory", &old_dir))?;
        }
        Ok(outcome)
    }

    /// A new, empty `..<UTC time>.<n>` directory (the kubelet's `MkdirTemp` pattern).
    fn create_data_dir(&self) -> Result<String> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let stamp = jiff::Timestamp::now().strftime("..%Y_%m_%d_%H_%M_%S.");
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(DATA_DIR_MODE);
        loop {
            let suffix = std::process::id()
                .wrapping_mul(1_000_003)
                .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed));
            let name = format!("{stamp}{suffix}");
            let dir = self.target.join(&name);
            match builder.create(&dir) {
                Ok(()) => {
                    set_mode(&dir, DATA_DIR_MODE)?;
                    return Ok(name);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error("creating the data directory", &dir)(e)),
            }
        }
    }

    /// Writes the payload into `name` and renames a symlink to it over `..data`.
    fn swap_in(&self, payload: &Payload, name: &str) -> Result<()> {
        let dir = self.target.join(name);
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true).mode(DATA_DIR_MODE);
        for (path, file) in payload {
            let full = dir.join(path);
            if let Some(parent) = full.parent() {
                builder
                    .create(parent)
                    .map_err(io_error("creating the directory", parent))?;
            }
            std::fs::write(&full, &file.data).map_err(io_error("writing", &full))?;
            set_mode(&full, file.mode & 0o7777)?;
        }
        let new_link = self.target.join(NEW_DATA_DIR);
        match std::fs::remove_file(&new_link) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(io_error("removing a stale link", &new_link)(e));
            }
            _ => {}
        }
        symlink(name, &new_link).map_err(io_error("creating the link", &new_link))?;
        let data_link = self.target.join(DATA_DIR);
        std::fs::rename(&new_link, &data_link).map_err(|e| {
            let _ = std::fs::remove_file(&new_link);
            io_error("renaming ..data_tmp over", &data_link)(e)
        })
    }

    /// `<top> -> ..data/<top>` for each top-level path that has no entry yet.
    fn link_user_visible(&self, payload: &Payload) -> Result<()> {
        for path in payload.keys() {
            let top = path.split('/').next().unwrap_or(path);
            let visible = self.target.join(top);
            match std::fs::read_link(&visible) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    symlink(Path::new(DATA_DIR).join(top), &visible)
                        .map_err(io_error("creating the link", &visible))?;
                }
                // Our link already, or an entry that is not ours: left as it is.
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes the top-level entries of paths that left the payload; tries every one and
    /// reports the last failure.
    fn unlink_user_visible(&self, leaving: &BTreeSet<String>) -> Result<()> {
        let mut last = Ok(());
        for path in leaving.iter().filter(|p| !p.contains('/')) {
            let visible = self.target.join(path);
            if let Err(e) = std::fs::remove_file(&visible) {
                last = Err(io_error("removing the link", &visible)(e));
            }
        }
        last
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_error("setting the mode of", path))
}

/// Validated, normalized paths (`a//b/./c` → `a/b/c`), as the kubelet's `validatePayload`.
fn clean_payload(payload: &Payload) -> Result<Payload> {
    payload
        .iter()
        .map(|(path, file)| Ok((clean_path(path)?, file.clone())))
        .collect()
}

fn clean_path(path: &str) -> Result<String> {
    let invalid = |reason| Error::InvalidPath {
        path: path.to_string(),
        reason,
    };
    if path.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if path.starts_with('/') {
        return Err(invalid("must be relative"));
    }
    if path.len() > MAX_PATH {
        return Err(invalid("must be at most 4096 characters"));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(invalid("must not contain '..'"));
    }
    if parts.iter().any(|part| part.len() > MAX_FILE_NAME) {
        return Err(invalid("file names must be at most 255 characters"));
    }
    match parts.first() {
        None => Err(invalid("names no file")),
        Some(first) if first.starts_with("..") => Err(invalid("must not start with '..'")),
        Some(_) => Ok(parts.join("/")),
    }
}

/// Paths below the previous data directory that neither are nor contain a path of `payload`.
fn paths_leaving(payload: &Payload, old_dir: &Path) -> Result<BTreeSet<String>> {
    let mut present = BTreeSet::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let dir = old_dir.join(&relative);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // The link pointed nowhere: nothing of it to remove.
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(e) => return Err(io_error("listing", &dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_error("listing", &dir))?;
            let path = relative.join(entry.file_name());
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            present.insert(path.to_string_lossy().into_owned());
            if is_dir {
                pending.push(path);
            }
        }
    }
    let mut wanted = BTreeSet::new();
    for path in payload.keys() {
        let mut prefix = path.as_str();
        loop {
            wanted.insert(prefix.to_string());
            match prefix.rsplit_once('/') {
                Some((parent, _)) => prefix = parent,
                None => break,
            }
        }
    }
    Ok(present.difference(&wanted).cloned().collect())
}

/// Whether any file of `payload` is missing from `old_dir` or has other contents.
fn differs(payload: &Payload, old_dir: &Path) -> Result<bool> {
    for (path, file) in payload {
        let old = old_dir.join(path);
        if std::fs::symlink_metadata(&old).is_err_and(|e| e.kind() == ErrorKind::NotFound) {
            return Ok(true);
        }
        if std::fs::read(&old).map_err(io_error("reading", &old))? != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
