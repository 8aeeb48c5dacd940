//! Headscale lists (nodes, pre-auth keys) shared by concurrent reconciles.
//!
//! Every TailnetEgress/TailnetIngress reconcile needs the Tailnet's node list, and every one
//! that mints a key lists all pre-auth keys. Fetched per reconcile, Headscale's work grew with
//! N² (N resources, each list N long, every poll): at 400 resources its API timed out and
//! nothing converged (benchmark 4). Now one fetch per Headscale server serves every reconcile
//! for `ttl`; reconciles that arrive while a fetch runs wait for it instead of starting their
//! own. Only decisions that tolerate a list `ttl` old use this (status, "does the node exist",
//! orphaned keys of a tag whose reconciles are serialised anyway); deletion reads fresh lists.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Slot<T> = Arc<tokio::sync::Mutex<Option<(Instant, Arc<Vec<T>>)>>>;

pub struct SharedList<T> {
    slots: Mutex<HashMap<String, Slot<T>>>,
    ttl: Duration,
}

impl<T> SharedList<T> {
    pub fn new(ttl: Duration) -> Self {
        SharedList {
            slots: Mutex::default(),
            ttl,
        }
    }

    fn slot(&self, server: &str) -> Slot<T> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(server.to_string())
            .or_default()
            .clone()
    }

    /// The list of `server`, fetched with `fetch` unless one younger than the TTL exists.
    /// Errors are not cached: the next caller fetches again.
    pub async fn get<E, F, Fut>(&self, server: &str, fetch: F) -> Result<Arc<Vec<T>>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<T>, E>>,
    {
        let slot = self.slot(server);
        let mut cached = slot.lock().await;
        if let Some((at, list)) = cached.as_ref()
            && at.elapsed() < self.ttl
        {
            return Ok(list.clone());
        }
        let list = Arc::new(fetch().await?);
        *cached = Some((Instant::now(), list.clone()));
        Ok(list)
    }

    /// Drops the cached list of `server` (after the operator changed it, e.g. deleted nodes).
    pub fn invalidate(&self, server: &str) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_callers_share_one_fetch_and_errors_are_not_cached() {
        let lists: Arc<SharedList<u32>> = Arc::new(SharedList::new(Duration::from_secs(60)));
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (lists, fetches) = (lists.clone(), fetches.clone());
            tasks.push(tokio::spawn(async move {
                lists
                    .get("https://hs", || async {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, String>(vec![1, 2, 3])
                    })
                    .await
            }));
        }
        for task in tasks {
            let list = task.await.expect("task").expect("list");
            assert_eq!(*list, vec![1, 2, 3]);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);

        // Another server has its own list; an error is returned and not kept.
        let failed = lists
            .get("https://other", || async {
                Err::<Vec<u32>, _>("down".to_string())
            })
            .await;
        assert_eq!(failed, Err("down".to_string()));
        let again = lists
            .get("https://other", || async { Ok::<_, String>(vec![9]) })
            .await
            .expect("list");
        assert_eq!(*again, vec![9]);

        // After invalidation the next caller fetches.
        lists.invalidate("https://hs");
        let fresh = lists
            .get("https://hs", || async { Ok::<_, String>(vec![4]) })
            .await
            .expect("list");
        assert_eq!(*fresh, vec![4]);
    }

    #[tokio::test]
    async fn a_list_older_than_the_ttl_is_fetched_again() {
        let lists: SharedList<u32> = SharedList::new(Duration::from_millis(30));
        let first = lists
            .get("s", || async { Ok::<_, String>(vec![1]) })
            .await
            .expect("list");
        let cached = lists
            .get("s", || async { Ok::<_, String>(vec![2]) })
            .await
            .expect("list");
        assert_eq!((first.as_slice(), cached.as_slice()), (&[1][..], &[1][..]));
        tokio::time::sleep(Duration::from_millis(40)).await;
        let refetched = lists
            .get("s", || async { Ok::<_, String>(vec![3]) })
            .await
            .expect("list");
        assert_eq!(*refetched, vec![3]);
    }
}
