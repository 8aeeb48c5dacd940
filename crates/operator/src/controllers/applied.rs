//! What the operator last applied to each child object, so that a resync which would change
//! nothing sends nothing.
//!
//! Every resource is reconciled again on each Headscale poll (to observe nodes, routes and the
//! agent). Server-side applying its ~9 unchanged child objects each time cost the apiserver a
//! full admission + diff per object (≈ 2,750 requests per 30 s at 100 resources, benchmark 4).
//! An apply is now skipped when the rendered object is byte-for-byte what this process applied
//! last, and
//! - for watched kinds (agent Deployments and NetworkPolicies, the egress Services): the
//!   watch cache still shows the object the apply returned: same uid and generation (or
//!   resourceVersion for kinds without one); an edit of the spec or a delete by someone else
//!   changes that, and the object is re-applied on the next reconcile;
//! - for every kind: the last apply is younger than the re-apply interval (`--reapply-interval`,
//!   10 min by default, ±10 % per object so they do not all come due at once). That interval
//!   is how long drift of an unwatched child (ServiceAccount, Role, RoleBinding, agent
//!   Secret/ConfigMap, Certificate) can go unrepaired. (Watching those too would need list and
//!   watch on Secrets and ConfigMaps in every namespace.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One child object: kind, namespace, name.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ChildRef {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// SHA-256 of the object as it would be sent (serde_json is deterministic for our types:
/// structs in field order, maps are BTreeMaps).
pub type Fingerprint = [u8; 32];

/// Recorded for an object this process deleted (no serialisation hashes to all zeros).
pub const ABSENT: Fingerprint = [0; 32];

pub fn fingerprint<T: Serialize>(object: &T) -> Result<Fingerprint, serde_json::Error> {
    let bytes = serde_json::to_vec(object)?;
    Ok(Sha256::digest(&bytes).into())
}

/// The object as the watch cache shows it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Live<'a> {
    /// Not a watched kind: only the age of the last apply counts.
    Unwatched,
    /// Watched, and absent from the cache (deleted, or not seen yet).
    Absent,
    /// Watched, with this version (uid and generation, or uid and resourceVersion).
    Present(&'a str),
}

#[derive(Clone, Debug)]
struct Record {
    fingerprint: Fingerprint,
    resource_version: Option<String>,
    applied_at: Instant,
}

/// Why an apply is (not) needed; `Unchanged` means skip it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Same object, still as applied, applied recently: nothing to send.
    Unchanged,
    /// Never applied by this process (new object, or the operator restarted).
    NotApplied,
    /// The rendered object differs from the last apply.
    Changed,
    /// Someone else changed or deleted it since (its version moved).
    Drifted,
    /// The re-apply interval passed.
    Due,
}

impl Decision {
    pub fn label(self) -> &'static str {
        match self {
            Decision::Unchanged => "unchanged",
            Decision::NotApplied => "not_applied",
            Decision::Changed => "changed",
            Decision::Drifted => "drifted",
            Decision::Due => "due",
        }
    }
}

/// The decision alone, as a pure function (unit-tested below).
fn decide(
    record: Option<&Record>,
    fingerprint: &Fingerprint,
    live: Live<'_>,
    now: Instant,
    reapply_after: Duration,
) -> Decision {
    let Some(record) = record else {
        return Decision::NotApplied;
    };
    if &record.fingerprint != fingerprint {
        return Decision::Changed;
    }
    match live {
        Live::Unwatched => {}
        Live::Absent => return Decision::Drifted,
        Live::Present(rv) => {
            if record.resource_version.as_deref() != Some(rv) {
                return Decision::Drifted;
            }
        }
    }
    if now.saturating_duration_since(record.applied_at) >= jittered(reapply_after, fingerprint) {
        return Decision::Due;
    }
    Decision::Unchanged
}

/// `interval` ± 10 %, fixed per object (from its fingerprint), so objects applied together at
/// start-up do not all come due in the same second.
fn jittered(interval: Duration, fingerprint: &Fingerprint) -> Duration {
    // 0..=200 → 90 % ..= 110 %
    let spread = u32::from(u16::from_le_bytes([fingerprint[0], fingerprint[1]]) % 201);
    interval.mul_f64(0.9 + f64::from(spread) / 1000.0)
}

/// The records of this process (lost on restart: then everything is applied once).
pub struct AppliedObjects {
    records: Mutex<HashMap<ChildRef, Record>>,
    reapply_after: Duration,
}

impl AppliedObjects {
    pub fn new(reapply_after: Duration) -> Self {
        AppliedObjects {
            records: Mutex::default(),
            reapply_after,
        }
    }

    pub fn decide(&self, child: &ChildRef, fingerprint: &Fingerprint, live: Live<'_>) -> Decision {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        decide(
            records.get(child),
            fingerprint,
            live,
            Instant::now(),
            self.reapply_after,
        )
    }

    /// Remembers a successful apply and the version of the object it returned.
    pub fn record(
        &self,
        child: ChildRef,
        fingerprint: Fingerprint,
        resource_version: Option<String>,
    ) {
        let now = Instant::now();
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records.insert(
            child,
            Record {
                fingerprint,
                resource_version,
                applied_at: now,
            },
        );
        // Records of deleted objects would pile up: drop the ones too old to skip anything.
        // (Amortised: only when the map has doubled since the last sweep.)
        let limit = self.reapply_after.mul_f64(1.1);
        if records.len() > 64 && records.len().is_power_of_two() {
            records.retain(|_, r| now.saturating_duration_since(r.applied_at) < limit);
        }
    }

    /// Forgets a child (after deleting it), so a later object of the same name is applied.
    pub fn forget(&self, child: &ChildRef) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(child);
    }

    /// Forgets every child in `namespace` whose name starts with `prefix` (an agent's objects
    /// share its base name), when the owner is deleted.
    pub fn forget_prefixed(&self, namespace: &str, prefix: &str) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|c, _| !(c.namespace == namespace && c.name.starts_with(prefix)));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.lock().map(|r| r.len()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_MIN: Duration = Duration::from_secs(600);

    fn record(fp: Fingerprint, rv: Option<&str>, age: Duration, now: Instant) -> Record {
        Record {
            fingerprint: fp,
            resource_version: rv.map(str::to_string),
            applied_at: now - age,
        }
    }

    #[test]
    fn unchanged_only_when_same_object_same_version_and_recent() {
        let now = Instant::now() + Duration::from_secs(3600);
        let fp = [7u8; 32];
        let fresh = record(fp, Some("41"), Duration::from_secs(5), now);
        assert_eq!(
            decide(None, &fp, Live::Unwatched, now, TEN_MIN),
            Decision::NotApplied
        );
        assert_eq!(
            decide(Some(&fresh), &fp, Live::Present("41"), now, TEN_MIN),
            Decision::Unchanged
        );
        assert_eq!(
            decide(Some(&fresh), &fp, Live::Unwatched, now, TEN_MIN),
            Decision::Unchanged
        );
        assert_eq!(
            decide(Some(&fresh), &[8u8; 32], Live::Present("41"), now, TEN_MIN),
            Decision::Changed
        );
        // Edited by someone else, or deleted.
        assert_eq!(
            decide(Some(&fresh), &fp, Live::Present("42"), now, TEN_MIN),
            Decision::Drifted
        );
        assert_eq!(
            decide(Some(&fresh), &fp, Live::Absent, now, TEN_MIN),
            Decision::Drifted
        );
        // Old enough: applied again even though nothing seems to have changed.
        let old = record(fp, Some("41"), Duration::from_secs(700), now);
        assert_eq!(
            decide(Some(&old), &fp, Live::Present("41"), now, TEN_MIN),
            Decision::Due
        );
    }

    #[test]
    fn jitter_stays_within_ten_percent_and_differs_between_objects() {
        let mut seen = std::collections::BTreeSet::new();
        for b in 0..=255u8 {
            let mut fp = [0u8; 32];
            fp[0] = b;
            fp[1] = b.wrapping_mul(31);
            let d = jittered(TEN_MIN, &fp);
            assert!(
                d >= Duration::from_secs(540) && d <= Duration::from_secs(660),
                "{d:?}"
            );
            seen.insert(d.as_secs());
        }
        assert!(seen.len() > 50, "only {} distinct intervals", seen.len());
    }

    #[test]
    fn fingerprint_follows_content() {
        let a = serde_json::json!({"metadata": {"name": "a"}, "data": {"k": "v"}});
        let b = serde_json::json!({"metadata": {"name": "a"}, "data": {"k": "w"}});
        assert_eq!(
            fingerprint(&a).expect("serializes"),
            fingerprint(&a.clone()).expect("serializes")
        );
        assert_ne!(
            fingerprint(&a).expect("serializes"),
            fingerprint(&b).expect("serializes")
        );
    }

    #[test]
    fn records_are_forgotten_by_name_and_prefix() {
        let applied = AppliedObjects::new(TEN_MIN);
        let child = |ns: &str, name: &str| ChildRef {
            kind: "ConfigMap".into(),
            namespace: ns.into(),
            name: name.into(),
        };
        applied.record(child("a", "tn-egress-db"), [1; 32], Some("1".into()));
        applied.record(child("a", "tn-egress-db-state"), [1; 32], None);
        applied.record(child("a", "tn-egress-web"), [1; 32], None);
        applied.record(child("b", "tn-egress-db"), [1; 32], None);
        assert_eq!(
            applied.decide(&child("a", "tn-egress-db"), &[1; 32], Live::Present("1")),
            Decision::Unchanged
        );
        applied.forget_prefixed("a", "tn-egress-db");
        assert_eq!(applied.len(), 2);
        assert_eq!(
            applied.decide(&child("a", "tn-egress-db"), &[1; 32], Live::Present("1")),
            Decision::NotApplied
        );
        applied.forget(&child("b", "tn-egress-db"));
        assert_eq!(applied.len(), 1);
    }
}
