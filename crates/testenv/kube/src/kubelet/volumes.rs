//! Pod volumes materialized as directories of the pod: ConfigMap, Secret, emptyDir, downwardAPI
//! and projected (service-account token, ConfigMap, Secret, downwardAPI) sources.
//!
//! Contents are written once when the pod starts; later ConfigMap/Secret changes are not
//! propagated (the real kubelet syncs them every minute or so).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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
        let dir = volumes_dir.join(&volume.name);
        // Rewritten from scratch on every attempt, so a retry never sees half a volume.
        if dir.exists() && volume.empty_dir.is_none() {
            std::fs::remove_dir_all(&dir).io_context(|| format!("clearing {dir:?}"))?;
        }
        std::fs::create_dir_all(&dir).io_context(|| format!("creating {dir:?}"))?;
        fill_volume(context, volume, &dir).await?;
        prepared.insert(volume.name.clone(), dir);
    }
    Ok(prepared)
}

async fn fill_volume(context: &VolumeContext<'_>, volume: &Volume, dir: &Path) -> Result<()> {
    let unsupported = || Error::Pod {
        pod: context.pod.metadata.name.clone().unwrap_or_default(),
        reason: format!(
            "volume {} has a type the test kubelet does not support \
             (supported: emptyDir, configMap, secret, downwardAPI, projected)",
            volume.name
        ),
    };
    if volume.empty_dir.is_some() {
        // Any user of the pod may write there, as with the real kubelet.
        return set_mode(dir, 0o777);
    }
    if let Some(source) = &volume.config_map {
        let data = config_map_data(context, &source.name, source.optional).await?;
        return write_items(dir, &data, source.items.as_deref(), source.default_mode);
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = secret_data(context, &name, source.optional).await?;
        return write_items(dir, &data, source.items.as_deref(), source.default_mode);
    }
    if let Some(source) = &volume.downward_api {
        let items = source.items.clone().unwrap_or_default();
        return write_downward(context, dir, &items, source.default_mode);
    }
    if let Some(projected) = &volume.projected {
        let default_mode = projected.default_mode;
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let jwt = request_token(
                    context,
                    token.audience.clone(),
                    token.expiration_seconds.unwrap_or(3600),
                )
                .await?;
                write_file(
                    dir,
                    &token.path,
                    jwt.as_bytes(),
                    default_mode.unwrap_or(DEFAULT_MODE),
                )?;
            }
            if let Some(source) = &source.config_map {
                let data = config_map_data(context, &source.name, source.optional).await?;
                write_items(dir, &data, source.items.as_deref(), default_mode)?;
            }
            if let Some(source) = &source.secret {
                let data = secret_data(context, &source.name, source.optional).await?;
                write_items(dir, &data, source.items.as_deref(), default_mode)?;
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
                // A missing key in `items` fails the mount in Kubernetes too.
                let value = data.get(&item.key).ok_or_else(|| Error::Pod {
                    pod: dir.display().to_string(),
                    reason: format!("key {} is not in the referenced object", item.key),
                })?;
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
