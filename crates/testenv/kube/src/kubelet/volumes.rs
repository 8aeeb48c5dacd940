//! Pod volumes materialized as directories of the pod: ConfigMap, Secret, emptyDir, downwardAPI
//! and projected (service-account token, ConfigMap, Secret, downwardAPI) sources.
//!
//! Every volume but emptyDir is written as the kubelet writes it, with its `AtomicWriter`
//! ([`tno_atomic_writer`]): the files in a timestamped directory `..<UTC time>.<n>`, a symlink
//! `..data` to it and one symlink `<key> -> ..data/<key>` per top-level path. Contents are synced
//! into running pods every [`VOLUME_SYNC`] (see [`prepare_volumes`]): a change is a new
//! directory and one atomic rename of `..data`, as in Kubernetes. `subPath` mounts keep the
//! content they started with, as in Kubernetes. [`ConfigMapProjection`] runs the same code
//! and period for a host directory (a program of the lab that is not a pod).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, DownwardAPIVolumeFile, KeyToPath, Pod, Secret,
    ServiceAccount, Volume,
};
use kube::Api;
use kube::api::PostParams;
use tno_atomic_writer::{AtomicWriter, FileProjection, Payload};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, IoContext, KubeContext, Result, error_chain};
use crate::kubelet::downward;

const DEFAULT_MODE: i32 = 0o644;

/// How often ConfigMap/Secret/downward API volume contents are synced into running pods. The
/// real kubelet does it on its pod sync (`syncFrequency`, default 1 min, plus its ConfigMap
/// cache's propagation), so a change can take a minute or more to appear there; the test
/// kubelet is faster so that tests need not wait that long.
pub const VOLUME_SYNC: Duration = Duration::from_secs(3);

/// What a volume source needs from the API and the pod.
pub struct VolumeContext<'a> {
    pub client: &'a kube::Client,
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
}

/// Writes every volume of the pod under `volumes_dir/<name>` and returns name → directory.
/// Fails (for the caller to retry) while a referenced non-optional object is missing; a volume
/// that was written before keeps its contents then (as when an object vanishes in Kubernetes).
///
/// Called again every [`VOLUME_SYNC`] to sync ConfigMap/Secret/downward API contents into
/// running containers: the directory containers have bind-mounted stays, its `..data` link is
/// swapped (see the module documentation). Service-account tokens are reused until
/// [`TOKEN_REFRESH`] has passed since they were issued.
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
            let payload = volume_payload(context, volume, &live).await?;
            write_payload(&live, &payload)?;
        }
        prepared.insert(volume.name.clone(), live);
    }
    Ok(prepared)
}

/// How long a mounted service-account token is reused before a new one is requested.
pub const TOKEN_REFRESH: Duration = Duration::from_secs(600);

fn write_payload(dir: &Path, payload: &Payload) -> Result<()> {
    AtomicWriter::new(dir)
        .and_then(|writer| writer.write(payload))
        .map(|_| ())
        .map_err(|source| Error::Volume {
            dir: dir.to_path_buf(),
            source,
        })
}

/// A ConfigMap projected onto a directory of the host by the kubelet's volume code: the same
/// `items`/`defaultMode`/`optional` handling, the same [`AtomicWriter`] layout and the same
/// [`VOLUME_SYNC`] period as a pod's ConfigMap volume. For lab programs that are not pods
/// (Headscale reading `dns.extra_records_path` from a mounted ConfigMap). Stops on drop; the
/// directory keeps the last contents.
pub struct ConfigMapProjection {
    dir: PathBuf,
    /// How many syncs have started.
    started: Arc<AtomicU64>,
    /// The latest finished sync: its number (1 = the first started) and outcome.
    finished: watch::Receiver<Option<(u64, std::result::Result<(), String>)>>,
    task: JoinHandle<()>,
}

impl ConfigMapProjection {
    /// Starts syncing ConfigMap `namespace/source.name` into `dir` (created if missing) now and
    /// every [`VOLUME_SYNC`]. While a non-optional ConfigMap (or a listed key) is missing, the
    /// directory keeps what it had.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        source: ConfigMapVolumeSource,
        dir: &Path,
    ) -> Result<ConfigMapProjection> {
        std::fs::create_dir_all(dir).io_context(|| format!("creating {dir:?}"))?;
        let (report, finished) = watch::channel(None);
        let started = Arc::new(AtomicU64::new(0));
        let namespace = namespace.to_string();
        let target = dir.to_path_buf();
        let counter = started.clone();
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(VOLUME_SYNC);
            loop {
                ticker.tick().await;
                let number = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let outcome = config_map_payload(&client, &namespace, &source)
                    .await
                    .and_then(|payload| write_payload(&target, &payload))
                    .map_err(|error| error_chain(&error));
                report.send_replace(Some((number, outcome)));
            }
        });
        Ok(ConfigMapProjection {
            dir: dir.to_path_buf(),
            started,
            finished,
            task,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Waits for a sync that started after this call to succeed (the directory then holds the
    /// ConfigMap as it was at this call or later); the last failure if none does in `timeout`.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<()> {
        let after = self.started.load(Ordering::SeqCst);
        let mut finished = self.finished.clone();
        let succeeded =
            finished.wait_for(|latest| matches!(latest, Some((number, Ok(()))) if *number > after));
        match tokio::time::timeout(timeout, succeeded).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::Setup {
                what: format!("the ConfigMap projection onto {:?}", self.dir),
                reason: "its sync task stopped".into(),
            }),
            Err(_) => {
                let last = match &*self.finished.borrow() {
                    Some((_, Err(error))) => format!(": the last sync failed: {error}"),
                    Some((_, Ok(()))) => ": no sync since the call".into(),
                    None => ": no sync yet".into(),
                };
                Err(Error::Timeout {
                    what: format!("a sync of the ConfigMap projection onto {:?}", self.dir),
                    seconds: timeout.as_secs(),
                    details: last,
                })
            }
        }
    }
}

impl Drop for ConfigMapProjection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The files of a ConfigMap volume.
async fn config_map_payload(
    client: &kube::Client,
    namespace: &str,
    source: &ConfigMapVolumeSource,
) -> Result<Payload> {
    let data = config_map_data(client, namespace, &source.name, source.optional).await?;
    let mut payload = Payload::new();
    add_items(
        &mut payload,
        &data,
        source.items.as_deref(),
        source.default_mode,
        source.optional,
    )?;
    Ok(payload)
}

async fn volume_payload(
    context: &VolumeContext<'_>,
    volume: &Volume,
    live: &Path,
) -> Result<Payload> {
    let mut payload = Payload::new();
    if let Some(source) = &volume.config_map {
        return config_map_payload(context.client, context.namespace, source).await;
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = secret_data(context.client, context.namespace, &name, source.optional).await?;
        let items = source.items.as_deref();
        add_items(
            &mut payload,
            &data,
            items,
            source.default_mode,
            source.optional,
        )?;
        return Ok(payload);
    }
    if let Some(source) = &volume.downward_api {
        let items = source.items.clone().unwrap_or_default();
        add_downward(&mut payload, context, &items, source.default_mode)?;
        return Ok(payload);
    }
    let Some(projected) = &volume.projected else {
        return Err(Error::Pod {
            pod: context.pod.metadata.name.clone().unwrap_or_default(),
            reason: format!(
                "volume {} has a type the test kubelet does not support \
                 (supported: emptyDir, configMap, secret, downwardAPI, projected)",
                volume.name
            ),
        });
    };
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
            add_file(
                &mut payload,
                &token.path,
                jwt,
                default_mode.unwrap_or(DEFAULT_MODE),
            )?;
        }
        if let Some(source) = &source.config_map {
            let data = config_map_data(
                context.client,
                context.namespace,
                &source.name,
                source.optional,
            )
            .await?;
            let items = source.items.as_deref();
            add_items(&mut payload, &data, items, default_mode, source.optional)?;
        }
        if let Some(source) = &source.secret {
            let data = secret_data(
                context.client,
                context.namespace,
                &source.name,
                source.optional,
            )
            .await?;
            let items = source.items.as_deref();
            add_items(&mut payload, &data, items, default_mode, source.optional)?;
        }
        if let Some(source) = &source.downward_api {
            let items = source.items.clone().unwrap_or_default();
            add_downward(&mut payload, context, &items, default_mode)?;
        }
    }
    Ok(payload)
}

type Data = BTreeMap<String, Vec<u8>>;

/// The ConfigMap's `data` and `binaryData`; empty for a missing optional one.
async fn config_map_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<Data> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading ConfigMap {namespace}/{name}"))?
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
        None => Err(missing("ConfigMap", namespace, name)),
    }
}

/// The Secret's `data` (and `stringData`); empty for a missing optional one.
async fn secret_data(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: Option<bool>,
) -> Result<Data> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api
        .get_opt(name)
        .await
        .kube_context(|| format!("reading Secret {namespace}/{name}"))?
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
        None => Err(missing("Secret", namespace, name)),
    }
}

fn missing(kind: &str, namespace: &str, name: &str) -> Error {
    Error::Setup {
        what: format!("{kind} {namespace}/{name}"),
        reason: "not found".into(),
    }
}

/// The mounted token, if it was issued less than [`TOKEN_REFRESH`] ago (its `iat` claim: a
/// rewrite of the volume for another file's sake does not make it younger).
fn reusable_token(path: &Path) -> Option<Vec<u8>> {
    let jwt = std::fs::read(path).ok()?;
    let claims = jwt.split(|b| *b == b'.').nth(1)?;
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims)
        .ok()?;
    let issued_at = serde_json::from_slice::<serde_json::Value>(&claims)
        .ok()?
        .get("iat")?
        .as_u64()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    (now.saturating_sub(issued_at) < TOKEN_REFRESH.as_secs()).then_some(jwt)
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

/// Adds the object's keys (all, or those `items` list, under their paths and modes).
fn add_items(
    payload: &mut Payload,
    data: &Data,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: Option<bool>,
) -> Result<()> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    match items {
        None => {
            for (key, value) in data {
                add_file(payload, key, value.clone(), default_mode)?;
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
                    return Err(Error::Setup {
                        what: format!("volume item {}", item.path),
                        reason: format!("key {} is not in the referenced object", item.key),
                    });
                };
                add_file(
                    payload,
                    &item.path,
                    value.clone(),
                    item.mode.unwrap_or(default_mode),
                )?;
            }
        }
    }
    Ok(())
}

fn add_downward(
    payload: &mut Payload,
    context: &VolumeContext<'_>,
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
        add_file(
            payload,
            &item.path,
            value.into_bytes(),
            item.mode.or(default_mode).unwrap_or(DEFAULT_MODE),
        )?;
    }
    Ok(())
}

/// Adds `relative` (relative paths only: a key must not escape its volume; the writer checks
/// the rest of the kubelet's rules).
fn add_file(payload: &mut Payload, relative: &str, contents: Vec<u8>, mode: i32) -> Result<()> {
    let relative_path = Path::new(relative);
    if relative_path.is_absolute()
        || relative_path
            .components()
            .any(|part| matches!(part, std::path::Component::ParentDir))
    {
        return Err(Error::Setup {
            what: format!("volume item path {relative:?}"),
            reason: "must be relative without '..'".into(),
        });
    }
    payload.insert(
        relative.to_string(),
        FileProjection::new(contents, mode as u32 & 0o7777),
    );
    Ok(())
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
        let data = Data::from([("present".to_string(), b"x".to_vec())]);
        let items = [item("present"), item("missing")];
        let required = add_items(&mut Payload::new(), &data, Some(&items), None, None);
        assert!(required.is_err_and(|e| e.to_string().contains("key missing")));
        let mut payload = Payload::new();
        add_items(&mut payload, &data, Some(&items), None, Some(true)).expect("optional");
        assert_eq!(payload.keys().collect::<Vec<_>>(), ["present"]);
    }

    /// A ConfigMap volume through its life in a running pod, as the kubelet writes it: created
    /// with one listed key present (the other optional and missing), updated, the key removed,
    /// the missing key added. Each step is a `..data` swap; the visible links follow the keys.
    #[test]
    fn a_config_map_volume_follows_its_object() {
        let volume = tempfile::tempdir().expect("tempdir");
        let items = [item("hosts"), item("extra-records.json")];
        let sync = |data: &[(&str, &str)]| {
            let data: Data = data
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect();
            let mut payload = Payload::new();
            add_items(&mut payload, &data, Some(&items), Some(0o640), Some(true))
                .expect("optional items");
            write_payload(volume.path(), &payload).expect("write");
            std::fs::read_link(volume.path().join("..data")).expect("..data")
        };
        let visible = || {
            let mut names: Vec<String> = std::fs::read_dir(volume.path())
                .expect("list")
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with(".."))
                .collect();
            names.sort();
            names
        };
        let read = |key: &str| std::fs::read_to_string(volume.path().join(key)).expect(key);

        let first = sync(&[("hosts", "a")]);
        assert_eq!(visible(), ["hosts"]);
        assert_eq!(read("hosts"), "a");
        let mode = std::fs::metadata(volume.path().join("hosts"))
            .expect("hosts")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640, "defaultMode");

        let second = sync(&[("hosts", "b")]);
        assert_ne!(first, second, "an update is a new data directory");
        assert!(
            !volume.path().join(&first).exists(),
            "the old one is removed"
        );
        assert_eq!(read("hosts"), "b");

        let third = sync(&[]);
        assert_ne!(second, third);
        assert!(visible().is_empty(), "{:?}", visible());

        sync(&[("hosts", "c"), ("extra-records.json", "[]")]);
        assert_eq!(visible(), ["extra-records.json", "hosts"]);
        assert_eq!(
            std::fs::read_link(volume.path().join("extra-records.json")).expect("link"),
            Path::new("..data/extra-records.json")
        );
        assert_eq!(read("extra-records.json"), "[]");
    }

    /// A token is reused by its `iat`, not by the file's age.
    #[test]
    fn a_token_is_reused_until_refresh_after_issue() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let jwt = |iat: u64| {
            let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(format!("{{\"iat\":{iat},\"sub\":\"x\"}}"));
            format!("e30.{claims}.sig")
        };
        std::fs::write(&path, jwt(now - 10)).expect("write");
        assert!(reusable_token(&path).is_some());
        std::fs::write(&path, jwt(now - TOKEN_REFRESH.as_secs() - 1)).expect("write");
        assert!(
            reusable_token(&path).is_none(),
            "too old, though just written"
        );
        std::fs::write(&path, "not a jwt").expect("write");
        assert!(reusable_token(&path).is_none());
    }
}
