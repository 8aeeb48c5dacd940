//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas are safe: only the
//! holder reconciles (writes to Headscale and to status). Standby replicas keep trying; a
//! leader that cannot renew in time steps down by cancelling its work (the process exits and
//! restarts as a standby), never running two writers at once.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{PostParams, ResourceExt};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per replica (pod name + uid).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("Lease {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// How long `spec` stays valid without renewal at `now` (zero once expired); `None` without
/// a renew time.
fn lease_expires_in(spec: &LeaseSpec, default: Duration, now: Timestamp) -> Option<Duration> {
    let renewed = spec.renew_time.as_ref()?;
    let valid_for_ms = spec
        .lease_duration_seconds
        .map_or(default.as_millis(), |s| u128::from(s.unsigned_abs()) * 1000);
    let elapsed_ms = u128::try_from(now.duration_since(renewed.0).as_millis()).unwrap_or(0);
    let left = valid_for_ms.saturating_sub(elapsed_ms);
    Some(Duration::from_millis(
        u64::try_from(left).unwrap_or(u64::MAX),
    ))
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

enum Attempt {
    Acquired,
    /// Held by someone else; `expires_in`: how long the lease stays valid without renewal.
    HeldBy {
        holder: String,
        expires_in: Option<Duration>,
    },
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl LeaderElector {
    pub fn new(client: kube::Client, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    fn error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source,
        }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.config.duration.as_secs()).unwrap_or(i32::MAX)
    }

    fn expired(&self, spec: &LeaseSpec) -> bool {
        let Some(renewed) = spec.renew_time.as_ref() else {
            return true;
        };
        let valid_for = spec
            .lease_duration_seconds
            .map(i64::from)
            .unwrap_or(self.config.duration.as_secs() as i64);
        let elapsed = Timestamp::now().duration_since(renewed.0);
        elapsed.as_secs() >= valid_for
    }

    fn expires_in(&self, spec: &LeaseSpec) -> Option<Duration> {
        lease_expires_in(spec, self.config.duration, Timestamp::now())
    }

    /// One attempt to take or keep the lease, with optimistic concurrency (resourceVersion):
    /// of two replicas racing for an expired lease, exactly one replace succeeds.
    async fn try_acquire(&self) -> Result<Attempt, LeaseError> {
        let me = &self.config.identity;
        match self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.error(e))?
        {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(me.clone()),
                        lease_duration_seconds: Some(self.duration_seconds()),
                        acquire_time: Some(now()),
                        renew_time: Some(now()),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(Attempt::Acquired),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldBy {
                        holder: "another replica (just created)".to_string(),
                        expires_in: None,
                    }),
                    Err(e) => Err(self.error(e)),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let holder = spec.holder_identity.clone().unwrap_or_default();
                let mine = holder == *me;
                if !mine && !holder.is_empty() && !self.expired(&spec) {
                    return Ok(Attempt::HeldBy {
                        holder,
                        expires_in: self.expires_in(&spec),
                    });
                }
                let transitions = spec.lease_transitions.unwrap_or(0);
                lease.spec = Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: if mine {
                        spec.acquire_time.clone()
                    } else {
                        Some(now())
                    },
                    renew_time: Some(now()),
                    lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
                    ..spec
                });
                match self
                    .api
                    .replace(&lease.name_any(), &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(Attempt::Acquired),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::HeldBy {
                        holder: "another replica (conflict)".to_string(),
                        expires_in: None,
                    }),
                    Err(e) => Err(self.error(e)),
                }
            }
        }
    }

    /// Waits until this replica holds the lease (or `shutdown` is cancelled: returns false).
    pub async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        let mut last_holder = String::new();
        loop {
            let mut wait = self.config.renew_every;
            match self.try_acquire().await {
                Ok(Attempt::Acquired) => {
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "acquired leadership");
                    return true;
                }
                Ok(Attempt::HeldBy { holder, expires_in }) => {
                    // Try again right when the lease expires rather than up to one renew
                    // period later, so a standby takes over within the lease duration.
                    if let Some(expires_in) = expires_in {
                        wait = wait.min(expires_in + Duration::from_millis(100));
                    }
                    if holder != last_holder {
                        tracing::info!(lease = %self.config.name, %holder, "standing by: lease held by another replica");
                        last_holder = holder;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Renews until `shutdown` is cancelled (then releases the lease) or renewal fails for
    /// longer than the lease is valid (then cancels `lost` so the work stops).
    pub async fn keep(&self, shutdown: CancellationToken, lost: CancellationToken) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.release().await;
                    return;
                }
                _ = tokio::time::sleep(self.config.renew_every) => {}
            }
            match self.try_acquire().await {
                Ok(Attempt::Acquired) => last_renewal = tokio::time::Instant::now(),
                Ok(Attempt::HeldBy { holder, .. }) => {
                    tracing::error!(%holder, "lost leadership: another replica holds the lease");
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the lease failed");
                    // Step down before the lease can expire in the eyes of the others.
                    if last_renewal.elapsed() + self.config.renew_every >= self.config.duration {
                        tracing::error!("could not renew the lease in time; stepping down");
                        lost.cancel();
                        return;
                    }
                }
            }
        }
    }

    /// Gives the lease up so a standby takes over without waiting for expiry.
    async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await
            && lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.config.identity.as_str())
        {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
                spec.renew_time = None;
            }
            match self
                .api
                .replace(&lease.name_any(), &PostParams::default(), &lease)
                .await
            {
                Ok(_) => tracing::info!("released leadership"),
                Err(e) => tracing::warn!(error = %e, "releasing the lease failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_knows_when_the_lease_expires() {
        let now: Timestamp = "2026-01-01T00:00:10Z".parse().expect("time");
        let renewed: Timestamp = "2026-01-01T00:00:04Z".parse().expect("time");
        let spec = LeaseSpec {
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        let fifteen = Duration::from_secs(15);
        assert_eq!(
            lease_expires_in(&spec, fifteen, now),
            Some(Duration::from_secs(9))
        );
        let later: Timestamp = "2026-01-01T00:01:00Z".parse().expect("time");
        assert_eq!(
            lease_expires_in(&spec, fifteen, later),
            Some(Duration::ZERO)
        );
        assert_eq!(lease_expires_in(&LeaseSpec::default(), fifteen, now), None);
    }
}
