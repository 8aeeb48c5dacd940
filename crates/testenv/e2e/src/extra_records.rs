//! Headscale's `dns.extra_records_path` fed from the operator's DNS ConfigMap the way a
//! Headscale pod that mounts it is fed (docs/dns.md): Headscale runs as a process of the lab,
//! not as a pod, so the test kubelet's volume code projects the ConfigMap onto Headscale's
//! extra-records directory with the kubelet's layout and sync period
//! ([`tno_testenv_kube::kubelet::ConfigMapProjection`]: `extra-records.json ->
//! ..data/extra-records.json`, `..data` swapped on each change). Nothing copies records.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, KeyToPath};
use tno_testenv_kube::kubelet::ConfigMapProjection;
use tno_testenv_tailnet::EXTRA_RECORDS_FILE;
use tokio::sync::OwnedMutexGuard;

use crate::env::E2eEnv;
use crate::error::{E2eError, Result};

/// The key of the operator's DNS ConfigMap that Headscale reads (`dns.extra_records_path`).
pub const EXTRA_RECORDS_KEY: &str = "extra-records.json";

/// One ConfigMap projected onto Headscale's extra-records directory; stops on drop (the
/// directory keeps the last records, as a volume keeps its contents).
pub struct ExtraRecordsProjection {
    projection: ConfigMapProjection,
    _only_writer: OwnedMutexGuard<()>,
}

impl ExtraRecordsProjection {
    /// Waits for a sync that starts after this call to succeed: Headscale's file then holds
    /// the ConfigMap's key as it was at that moment or later.
    pub async fn wait_synced(&self, timeout: Duration) -> Result<()> {
        Ok(self.projection.wait_synced(timeout).await?)
    }
}

impl E2eEnv {
    /// Mounts key `extra-records.json` of ConfigMap `namespace/config_map` (what the Tailnet's
    /// `spec.dns.hostsConfigMap` names) "into Headscale", as a volume with
    /// `items: [{key: extra-records.json, path: extra-records.json}]`, not optional (Headscale
    /// needs the file). Until the ConfigMap or its key exists, Headscale keeps the records it
    /// had. One projection per environment at a time: a second one while the first lives is
    /// refused.
    pub fn project_extra_records(
        &self,
        client: kube::Client,
        namespace: &str,
        config_map: &str,
    ) -> Result<ExtraRecordsProjection> {
        let only_writer =
            self.extra_records_slot()
                .try_lock_owned()
                .map_err(|_| E2eError::ExtraRecordsBusy {
                    requested: format!("{namespace}/{config_map}"),
                })?;
        let source = ConfigMapVolumeSource {
            name: config_map.to_string(),
            items: Some(vec![KeyToPath {
                key: EXTRA_RECORDS_KEY.to_string(),
                path: EXTRA_RECORDS_FILE.to_string(),
                mode: None,
            }]),
            default_mode: None,
            optional: None,
        };
        let projection = ConfigMapProjection::start(
            client,
            namespace,
            source,
            self.tailnet().headscale.extra_records_dir(),
        )?;
        Ok(ExtraRecordsProjection {
            projection,
            _only_writer: only_writer,
        })
    }
}
