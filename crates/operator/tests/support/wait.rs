//! Polling until something observable holds.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long an e2e step may take to converge (agents starting, nodes joining, policy
/// syncing); generous because the machine may be busy.
pub const WAIT: Duration = Duration::from_secs(180);

/// Between two checks: short, so the measured convergence times stay accurate.
const POLL: Duration = Duration::from_millis(300);

/// Polls `check` until it returns `Ok`, or fails with `what` and the last observation.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(observed) => observed,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "timed out after {timeout:?} waiting for {what}; last observed: {last}"
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`], failing the test when it times out.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    eventually(what, timeout, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
