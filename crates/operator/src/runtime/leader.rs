//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas are safe: only the
//! holder reconciles (writes to Headscale and to status). Standby replicas keep trying; a
//! leader that cannot renew in time steps down by cancelling its work (the process exits and
//! restarts as a standby), never running two writers at once.
//!
//! As client-go's `leaderelection`: every renewal (each attempt, and all retries together) is
//! bounded by the renew deadline ([`LeaseConfig::renew_deadline`], 2/3 of the lease duration),
//! counted from the start of the last successful renewal; past it the holder steps down, while
//! the lease still has a third of its duration to run in the eyes of the others. A standby
//! judges expiry by its own monotonic clock since it last saw the record change, never by the
//! holder's `renewTime` (another machine's clock).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    #[error("Lease {namespace}/{name}: no answer within the renew deadline")]
    Timeout { namespace: String, name: String },
}

/// The parts of a Lease that change when its holder renews (client-go's
/// `LeaderElectionRecord`): a standby compares them between reads.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    holder: Option<String>,
    duration_seconds: Option<i32>,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone(),
            duration_seconds: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time.clone(),
            renew_time: spec.renew_time.clone(),
            transitions: spec.lease_transitions,
        }
    }
}

/// What this replica last saw of the Lease and when (its own monotonic clock).
#[derive(Clone, Debug)]
struct Observation {
    record: Record,
    at: Instant,
}

impl Observation {
    /// `previous` if the record is unchanged (the lease ages from its first sighting), else
    /// the record seen at `now`.
    fn update(previous: Option<Observation>, spec: &LeaseSpec, now: Instant) -> Observation {
        let record = Record::of(spec);
        match previous {
            Some(p) if p.record == record => p,
            _ => Observation { record, at: now },
        }
    }

    /// How long the observed lease stays valid at `now` (zero once expired): its duration
    /// (the holder's `leaseDurationSeconds`, else `default`) from when this replica saw the
    /// record change, on this replica's monotonic clock.
    fn expires_in(&self, default: Duration, now: Instant) -> Duration {
        let valid_for = self.record.duration_seconds.map_or(default, |s| {
            Duration::from_secs(u64::from(s.unsigned_abs()))
        });
        valid_for.saturating_sub(now.saturating_duration_since(self.at))
    }
}

/// The holder's next step in `keep`.
#[derive(Debug, PartialEq)]
enum Renewal {
    /// Try to renew; the attempt must finish within `within`.
    Attempt { within: Duration },
    /// Too late to renew safely: stop the work.
    StepDown,
}

impl LeaseConfig {
    /// How long after the start of its last successful renewal a holder keeps trying
    /// (client-go's `RenewDeadline`): 2/3 of the lease duration (10 s of 15 s), so it steps
    /// down a third of the duration before a standby can take the lease.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// How often a standby reads the lease, and how soon a failed renewal is retried
    /// (client-go's `RetryPeriod`): 1/10 of the duration. A standby sees a renewal at most this
    /// late, so it takes over at most this long after the lease expired.
    pub fn retry_period(&self) -> Duration {
        (self.duration / 10).max(Duration::from_millis(100))
    }

    /// What the holder does `since_renewal` after the start of its last successful renewal.
    fn next_renewal(&self, since_renewal: Duration) -> Renewal {
        match self.renew_deadline().checked_sub(since_renewal) {
            Some(within) if !within.is_zero() => Renewal::Attempt { within },
            _ => Renewal::StepDown,
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The lease as this replica last saw it change.
    observed: Mutex<Option<Observation>>,
    /// Start of the attempt that acquired the lease (the renew deadline counts from it).
    acquired_at: Mutex<Option<Instant>>,
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
            observed: Mutex::new(None),
            acquired_at: Mutex::new(None),
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

    /// How long the lease in `spec` stays valid by this replica's observation (records it).
    fn observe(&self, spec: &LeaseSpec) -> Duration {
        let now = Instant::now();
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        let current = Observation::update(observed.take(), spec, now);
        let left = current.expires_in(self.config.duration, now);
        *observed = Some(current);
        left
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
                let expires_in = self.observe(&spec);
                // Released (no holder or no renew time): free at once.
                let released = holder.is_empty() || spec.renew_time.is_none();
                if !mine && !released && !expires_in.is_zero() {
                    return Ok(Attempt::HeldBy {
                        holder,
                        expires_in: Some(expires_in),
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
            let mut wait = self.config.retry_period();
            let started = Instant::now();
            // Bounded like a renewal: an attempt that succeeds late would start the work with
            // little or nothing left of the renew deadline.
            let attempt = tokio::time::timeout(self.config.renew_deadline(), self.try_acquire())
                .await
                .unwrap_or_else(|_| Err(self.timed_out()));
            match attempt {
                Ok(Attempt::Acquired) => {
                    *self
                        .acquired_at
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(started);
                    tracing::info!(lease = %self.config.name, identity = %self.config.identity, "acquired leadership");
                    return true;
                }
                Ok(Attempt::HeldBy { holder, expires_in }) => {
                    // Try again right when the lease expires rather than up to one retry
                    // period later.
                    if let Some(expires_in) = expires_in {
                        wait = wait.min(expires_in + Duration::from_millis(10));
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

    /// Renews until `shutdown` is cancelled (then releases the lease) or renewal does not
    /// succeed within the renew deadline (then cancels `lost` so the work stops, while the
    /// lease is still valid for `duration - renew_deadline` in the eyes of the others).
    pub async fn keep(&self, shutdown: CancellationToken, lost: CancellationToken) {
        let deadline = self.config.renew_deadline();
        let mut renewed = self
            .acquired_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or_else(Instant::now);
        let mut wait = self.config.renew_every;
        loop {
            // Never sleep past the deadline.
            let left = deadline.saturating_sub(renewed.elapsed());
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.release().await;
                    return;
                }
                _ = tokio::time::sleep(wait.min(left)) => {}
            }
            let started = Instant::now();
            let within = match self.config.next_renewal(renewed.elapsed()) {
                Renewal::Attempt { within } => within,
                Renewal::StepDown => {
                    tracing::error!(
                        deadline_ms = deadline.as_millis() as u64,
                        "could not renew the lease within the renew deadline; stepping down"
                    );
                    lost.cancel();
                    return;
                }
            };
            let attempt = tokio::time::timeout(within, self.try_acquire())
                .await
                .unwrap_or_else(|_| Err(self.timed_out()));
            match attempt {
                Ok(Attempt::Acquired) => {
                    renewed = started;
                    wait = self.config.renew_every;
                }
                Ok(Attempt::HeldBy { holder, .. }) => {
                    tracing::error!(%holder, "lost leadership: another replica holds the lease");
                    lost.cancel();
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the lease failed");
                    wait = self.config.retry_period();
                }
            }
        }
    }

    fn timed_out(&self) -> LeaseError {
        LeaseError::Timeout {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
        }
    }

    /// Gives the lease up so a standby takes over without waiting for expiry.
    async fn release(&self) {
        let bounded = tokio::time::timeout(self.config.renew_deadline(), self.release_now());
        if bounded.await.is_err() {
            tracing::warn!("releasing the lease did not finish in time");
        }
    }

    async fn release_now(&self) {
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
    use jiff::SignedDuration;

    fn config(duration: Duration) -> LeaseConfig {
        LeaseConfig {
            name: "lease".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            duration,
            renew_every: duration / 3,
        }
    }

    fn held(renewed: Timestamp, holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn expiry_is_judged_by_when_the_record_last_changed_not_the_holders_clock() {
        let fifteen = Duration::from_secs(15);
        let start = Instant::now();
        // The holder's clock is an hour behind: its renewTime looks stale, yet the record just
        // changed, so the lease is valid for a whole duration from now.
        let behind = Timestamp::now() - SignedDuration::from_hours(1);
        let seen = Observation::update(None, &held(behind, "a"), start);
        assert_eq!(seen.expires_in(fifteen, start), fifteen);
        assert_eq!(
            seen.expires_in(fifteen, start + Duration::from_secs(5)),
            Duration::from_secs(10)
        );
        // A renewal (new renewTime, still an hour behind) starts the count again.
        let renewed = behind + SignedDuration::from_secs(5);
        let later = start + Duration::from_secs(10);
        let seen = Observation::update(Some(seen), &held(renewed, "a"), later);
        assert_eq!(seen.expires_in(fifteen, later), fifteen);

        // The holder's clock is an hour ahead: its renewTime looks fresh for an hour, but the
        // record has not changed for longer than the duration: expired.
        let ahead = Timestamp::now() + SignedDuration::from_hours(1);
        let seen = Observation::update(None, &held(ahead, "b"), start);
        let unchanged = start + Duration::from_secs(16);
        let seen = Observation::update(Some(seen), &held(ahead, "b"), unchanged);
        assert_eq!(
            seen.at, start,
            "an unchanged record keeps its first sighting"
        );
        assert_eq!(seen.expires_in(fifteen, unchanged), Duration::ZERO);
    }

    #[test]
    fn renewals_are_bounded_by_a_deadline_below_the_lease_duration() {
        for duration in [1, 6, 15, 60].map(Duration::from_secs) {
            let config = config(duration);
            let deadline = config.renew_deadline();
            assert!(
                deadline < duration && deadline >= config.renew_every,
                "{duration:?}: deadline {deadline:?}"
            );
            // Right after a renewal: one attempt, bounded by what is left of the deadline.
            assert_eq!(
                config.next_renewal(config.renew_every),
                Renewal::Attempt {
                    within: deadline - config.renew_every
                }
            );
            // At the deadline (the lease still has duration - deadline to run): step down.
            assert_eq!(config.next_renewal(deadline), Renewal::StepDown);
        }
        // client-go's defaults: lease 15 s, renew deadline 10 s.
        assert_eq!(
            config(Duration::from_secs(15)).renew_deadline(),
            Duration::from_secs(10)
        );
    }
}
