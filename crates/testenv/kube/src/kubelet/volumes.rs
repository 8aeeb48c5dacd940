//! Pod volumes materialized as directories of the pod: ConfigMap, Secret, emptyDir, downwardAPI
//! and projected (service-account token, ConfigMap, Secret, downwardAPI) sources.
//!
//! Contents are synced into running pods every few seconds (see [`prepare_volumes`]); `subPath`
//! mounts keep the content they started with, as in Kubernetes.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, IoContext, KubeContext, Result};
use crate::kubelet::downward;

const DEFAULT_MODE: i32 = 0o644;

/// What a volume source needs from the API and the pod.
pub struct VolumeContext<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
}

/// Writes every volume of the pod under `volumes_dir/<name>` and returns name → directory.
/// Fails (for the caller to retry) while a referenced non-optional object is missing.
///
/// Called again periodically to sync ConfigMap/Secret/downward API contents into running
/// containers: each volume is rendered into a staging directory and changed files are renamed
/// into place (atomically per file; the directory itself, which containers have bind-mounted,
/// stays). Service-account tokens are reused until [`TOKEN_REFRESH`] has passed.
pub async fn prepare_volumes(
    context: &VolumeContext<'_>,
    volumes_dir: &Path,
) -> Result<HashMap<String, PathBuf>> {
    let mut prepared = HashMap::new();
    let volumes = context
        .pod
        .spec
        .as_ref()
        .and_then(|spec| spec.volumes.clone())
        .unwrap_or_default();
    for volume in &volumes {
        let live = volumes_dir.join(&volume.name);
        std::fs::create_dir_all(&live).io_context(|| format!("creating {live:?}"))?;
        if volume.empty_dir.is_some() {
            // Any user of the pod may write there, as with the real kubelet.
            set_mode(&live, 0o777)?;
        } else {
            let staging = volumes_dir.join(format!(".staging-{}", volume.name));
            if staging.exists() {
                std::fs::remove_dir_all(&staging).io_context(|| format!("clearing {staging:?}"))?;
            }
            std::fs::create_dir_all(&staging).io_context(|| format!("creating {staging:?}"))?;
            let filled = fill_volume(context, volume, &staging, &live).await;
            let synced = filled.and_then(|()| sync_dir(&staging, &live));
            let _ = std::fs::remove_dir_all(&staging);
            synced?;
        }
        prepared.insert(volume.name.clone(), live);
    }
    Ok(prepared)
}

/// How long a mounted service-account token is reused before a new one is requested.
pub const TOKEN_REFRESH: Duration = Duration::from_secs(600);

/// Makes `live` hold exactly the files of `staging` (same relative paths, contents, modes).
fn sync_dir(staging: &Path, live: &Path) -> Result<()> {
    let wanted = relative_files(staging)?;
    for relative in &wanted {
        let source = staging.join(relative);
        let target = live.join(relative);
        let unchanged = std::fs::read(&source).ok() == std::fs::read(&target).ok()
            && mode_of(&source) == mode_of(&target);
        if unchanged {
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).io_context(|| format!("creating {parent:?}"))?;
        }
        std::fs::rename(&source, &target)
            .io_context(|| format!("moving {source:?} to {target:?}"))?;
    }
    for relative in relative_files(live)? {
        if !wanted.contains(&relative) {
            let stale = live.join(&relative);
            std::fs::remove_file(&stale).io_context(|| format!("removing {stale:?}"))?;
        }
    }
    Ok(())
}

fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| meta.permissions().mode() & 0o7777)
}

/// Files below `root`, as paths relative to it.
fn relative_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).io_context(|| format!("listing {dir:?}"))? {
            let path = entry.io_context(|| format!("listing {dir:?}"))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(root) {
                files.push(relative.to_path_buf());
            }
        }
    }
    Ok(files)
}

async fn fill_volume(
    context: &VolumeContext<'_>,
    volume: &Volume,
    dir: &Path,
    live: &Path,
) -> Result<()> {
    let unsupported = || Error::Pod {
        pod: context.pod.metadata.name.clone().unwrap_or_default(),
        reason: format!(
            "volume {} has a type the test kubelet does not support \
             (supported: emptyDir, configMap, secret, downwardAPI, projected)",
            volume.name
        ),
    };
    if let Some(source) = &volume.config_map {
        let data = config_map_data(context, &source.name, source.optional).await?;
        let items = source.items.as_deref();
        return write_items(dir, &data, items, source.default_mode, source.optional);
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = secret_data(context, &name, source.optional).await?;
        let items = source.items.as_deref();
        return write_items(dir, &data, items, source.default_mode, source.optional);
    }
    if let Some(source) = &volume.downward_api {
        let items = source.items.clone().unwrap_or_default();
        return write_downward(context, dir, &items, source.default_mode);
    }
    if let Some(projected) = &volume.projected {
        let default_mode = projected.default_mode;
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let jwt = match reusable_token(&live.join(&token.path)) {
                    Some(jwt) => jwt,
                    None => request_token(
                        context,
                        token.audience.clone(),
                        token.expiration_seconds.unwrap_or(3600),
                    )
                    .await?
                    .into_bytes(),
                };
                write_file(
                    dir,
                    &token.path,
                    jwt.as_ref(),
                    default_mode.unwrap_or(DEFAULT_MODE),
                )?;
            }
            if let Some(source) = &source.config_map {
                let data = config_map_data(context, &source.name, source.optional).await?;
                let items = source.items.as_deref();
                write_items(dir, &data, items, default_mode, source.optional)?;
            }
            if let Some(source) = &source.secret {
                let data = secret_data(context, &source.name, source.optional).await?;
                let items = source.items.as_deref();
                write_items(dir, &data, items, default_mode, source.optional)?;
            }
            if let Some(source) = &source.downward_api {
                let items = source.items.clone().unwrap_or_default();
                write_downward(context, dir, &items, default_mode)?;
            }
        }
        return Ok(());
    }
    Err(unsupported())
}

type Data = BTreeMap<String, Vec<u8>>;

async fn config_map_data(
    context: &VolumeContext<'_>,
    name: &str,
    optional: Option<bool>,
) -> Result<Data> {
    let api: Api<ConfigMap> = Api::namespaced(context.client.clone(), context.namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading ConfigMap {}/{name}", context.namespace))?
    {
        Some(config_map) => {
            let mut data: Data = config_map
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.into_bytes()))
                .collect();
            data.extend(
                config_map
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, ByteString(value))| (key, value)),
            );
            Ok(data)
        }
        None if optional == Some(true) => Ok(Data::new()),
        None => Err(missing(context, "ConfigMap", name)),
    }
}

async fn secret_data(
    context: &VolumeContext<'_>,
    name: &str,
    optional: Option<bool>,
) -> Result<Data> {
    let api: Api<Secret> = Api::namespaced(context.client.clone(), context.namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading Secret {}/{name}", context.namespace))?
    {
        Some(secret) => Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, ByteString(value))| (key, value))
            .chain(
                secret
                    .string_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, value)| (key, value.into_bytes())),
            )
            .collect()),
        None if optional == Some(true) => Ok(Data::new()),
        None => Err(missing(context, "Secret", name)),
    }
}

fn missing(context: &VolumeContext<'_>, kind: &str, name: &str) -> Error {
    Error::Pod {
        pod: context.pod.metadata.name.clone().unwrap_or_default(),
        reason: format!("{kind} {}/{name} not found", context.namespace),
    }
}

/// The mounted token, if it is younger than [`TOKEN_REFRESH`].
fn reusable_token(path: &Path) -> Option<Vec<u8>> {
    let age = std::fs::metadata(path)
        .ok()?
        .modified()
        .ok()?
        .elapsed()
        .ok()?;
    (age < TOKEN_REFRESH)
        .then(|| std::fs::read(path).ok())
        .flatten()
}

/// A token bound to this pod (TokenRequest API), as the kubelet mounts it.
pub async fn request_token(
    context: &VolumeContext<'_>,
    audience: Option<String>,
    expiration_seconds: i64,
) -> Result<String> {
    let service_account = context
        .pod
        .spec
        .as_ref()
        .and_then(|spec| spec.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audience.into_iter().filter(|aud| !aud.is_empty()).collect(),
            expiration_seconds: Some(expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: context.pod.metadata.name.clone(),
                uid: context.pod.metadata.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(context.client.clone(), context.namespace);
    let answer: TokenRequest = api
        .create_subresource("token", &service_account, &PostParams::default(), &request)
        .await
        .kube_context(|| {
            format!(
                "requesting a token for ServiceAccount {}/{service_account}",
                context.namespace
            )
        })?;
    answer
        .status
        .map(|status| status.token)
        .ok_or_else(|| Error::Pod {
            pod: context.pod.metadata.name.clone().unwrap_or_default(),
            reason: "TokenRequest answered without a token".into(),
        })
}

fn write_items(
    dir: &Path,
    data: &Data,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: Option<bool>,
) -> Result<()> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    match items {
        None => {
            for (key, value) in data {
                write_file(dir, key, value, default_mode)?;
            }
        }
        Some(items) => {
            for item in items {
                // A missing key in `items` fails the mount in Kubernetes too, unless the
                // source is optional (which covers its keys as well as the object).
                let Some(value) = data.get(&item.key) else {
                    if optional == Some(true) {
                        continue;
                    }
                    return Err(Error::Pod {
                        pod: dir.display().to_string(),
                        reason: format!("key {} is not in the referenced object", item.key),
                    });
                };
                write_file(dir, &item.path, value, item.mode.unwrap_or(default_mode))?;
            }
        }
    }
    Ok(())
}

fn write_downward(
    context: &VolumeContext<'_>,
    dir: &Path,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<()> {
    for item in items {
        let Some(field) = &item.field_ref else {
            continue;
        };
        let value = downward::field_value(
            context.pod,
            context.pod_ip,
            context.host_ip,
            &field.field_path,
        )
        .ok_or_else(|| Error::Pod {
            pod: context.pod.metadata.name.clone().unwrap_or_default(),
            reason: format!("unsupported downward API field {}", field.field_path),
        })?;
        write_file(
            dir,
            &item.path,
            value.as_bytes(),
            item.mode.or(default_mode).unwrap_or(DEFAULT_MODE),
        )?;
    }
    Ok(())
}

/// Writes `dir/relative` (relative paths only: a key must not escape its volume).
fn write_file(dir: &Path, relative: &str, contents: &[u8], mode: i32) -> Result<()> {
    let relative_path = Path::new(relative);
    if relative_path.is_absolute()
        || relative_path
            .components()
            .any(|part| matches!(part, std::path::Component::ParentDir))
    {
        return Err(Error::Pod {
            pod: dir.display().to_string(),
            reason: format!("volume item path {relative:?} must be relative without '..'"),
        });
    }
    let path = dir.join(relative_path);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).io_context(|| format!("creating {parent:?}"))?;
    }
    std::fs::write(&path, contents).io_context(|| format!("writing {path:?}"))?;
    set_mode(&path, mode as u32 & 0o7777)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .io_context(|| format!("setting the mode of {path:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: key.into(),
            mode: None,
        }
    }

    /// `items` naming a key the object lacks: the mount fails unless the source is optional
    /// (then the key is left out, as Kubernetes does: CoreDNS mounting a ConfigMap the
    /// operator has not written yet).
    #[test]
    fn a_missing_item_key_fails_only_a_required_source() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = Data::from([("present".to_string(), b"x".to_vec())]);
        let items = [item("present"), item("missing")];
        let required = write_items(dir.path(), &data, Some(&items), None, None);
        assert!(required.is_err_and(|e| e.to_string().contains("key missing")));
        write_items(dir.path(), &data, Some(&items), None, Some(true)).expect("optional");
        assert!(dir.path().join("present").is_file());
        assert!(!dir.path().join("missing").exists());
    }
}
