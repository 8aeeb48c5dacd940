//! When the agent asks tailscaled to log in again (pure). tailscaled reads its login config
//! (with the pre-auth key) once, at start; with a key that control refused or that expired
//! before the first login it retries that key for good (`NoState`; `NeedsLogin` once it gives
//! up), while the operator writes a fresh key into the auth Secret. After
//! [`NEEDS_LOGIN_GRACE`] in one of these states the agent has tailscaled re-read its config
//! and start again ([`crate::localapi::LocalApi::retry_login`]), at most every
//! [`RETRY_EVERY`]; a normal start passes through them in a second or two.

use std::time::{Duration, Instant};

/// How long tailscaled stays without a login before the first retry.
pub const NEEDS_LOGIN_GRACE: Duration = Duration::from_secs(15);
/// Least time between two retries.
pub const RETRY_EVERY: Duration = Duration::from_secs(30);

/// What the status poll saw of tailscaled's login.
#[derive(Clone, Debug, Default)]
pub struct LoginWatch {
    needs_login_since: Option<Instant>,
    last_retry: Option<Instant>,
}

impl LoginWatch {
    /// Records tailscaled's `BackendState` at `now` (`None`: the LocalAPI did not answer);
    /// returns whether to retry the login now.
    pub fn observe(&mut self, backend_state: Option<&str>, now: Instant) -> bool {
        if !matches!(backend_state, Some("NeedsLogin" | "NoState")) {
            // Unknown counts as no evidence either way: the timer keeps running.
            if backend_state.is_some() {
                self.needs_login_since = None;
            }
            return false;
        }
        let since = *self.needs_login_since.get_or_insert(now);
        let waited = now.duration_since(since) >= NEEDS_LOGIN_GRACE;
        let rested = self
            .last_retry
            .is_none_or(|last| now.duration_since(last) >= RETRY_EVERY);
        if waited && rested {
            self.last_retry = Some(now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_after_the_grace_then_at_most_every_retry_period() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut watch = LoginWatch::default();
        assert!(!watch.observe(Some("NeedsLogin"), at(0)));
        assert!(!watch.observe(Some("NeedsLogin"), at(14)));
        assert!(watch.observe(Some("NeedsLogin"), at(15)), "grace over");
        assert!(!watch.observe(Some("NeedsLogin"), at(16)));
        assert!(!watch.observe(Some("NeedsLogin"), at(44)));
        assert!(
            watch.observe(Some("NeedsLogin"), at(45)),
            "retry period over"
        );
    }

    #[test]
    fn a_normal_start_never_retries_and_other_states_reset_the_grace() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut watch = LoginWatch::default();
        for (second, state) in [
            (0, "NoState"),
            (1, "NeedsLogin"),
            (2, "Starting"),
            (3, "Running"),
        ] {
            assert!(!watch.observe(Some(state), at(second)));
        }
        // NeedsLogin again (node deleted in Headscale): the grace starts anew.
        assert!(!watch.observe(Some("NeedsLogin"), at(100)));
        assert!(!watch.observe(Some("NeedsLogin"), at(114)));
        assert!(watch.observe(Some("NeedsLogin"), at(115)));
    }

    #[test]
    fn a_refused_key_keeps_tailscaled_in_nostate_which_counts_too() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut watch = LoginWatch::default();
        assert!(!watch.observe(Some("NoState"), at(0)));
        assert!(!watch.observe(Some("NoState"), at(14)));
        assert!(watch.observe(Some("NoState"), at(15)));
        assert!(!watch.observe(Some("Starting"), at(16)));
        assert!(
            !watch.observe(Some("NoState"), at(40)),
            "the grace starts anew"
        );
    }

    #[test]
    fn an_unanswered_status_neither_starts_nor_resets_the_grace() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut watch = LoginWatch::default();
        assert!(!watch.observe(None, at(0)));
        assert!(!watch.observe(None, at(20)), "no evidence of NeedsLogin");
        assert!(!watch.observe(Some("NeedsLogin"), at(21)));
        assert!(!watch.observe(None, at(30)));
        assert!(watch.observe(Some("NeedsLogin"), at(36)));
    }
}
