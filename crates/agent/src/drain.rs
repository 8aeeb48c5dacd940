//! Telling open HTTP connections to finish their requests and close (agent shutdown).
//!
//! A connection checks for this on every wake-up of its task. A shared `CancellationToken`
//! costs a lock of the token's tree node and of its `Notify` per check, on a lock every
//! connection of every connection thread shares. Here a check is one load of a flag that is
//! written once (at shutdown) and sits on a cache line of its own, so every core keeps it
//! cached; each connection registers its waker once, and only opening and closing a
//! connection touch the shared list.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

/// The signal, held by whoever shuts the agent down; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    started: StartedFlag,
    next_key: AtomicU64,
    watching: Mutex<HashMap<u64, Arc<AtomicWaker>>>,
}

/// Apart from the counter and the list (written at every connection's open and close), so
/// reading it never misses the cache.
#[derive(Debug, Default)]
#[repr(align(128))]
struct StartedFlag(AtomicBool);

/// One connection's view of the signal; leaves the shared list when dropped.
#[derive(Debug)]
pub struct DrainWatch {
    waker: Arc<AtomicWaker>,
    key: u64,
    shared: Arc<Shared>,
    /// The waker is registered at the first poll only: a connection is polled by one task
    /// for its whole life, and any of that task's wakers wakes it.
    registered: bool,
}

impl Drain {
    pub fn new() -> Self {
        Drain::default()
    }

    /// Asks every connection, open now or accepted later, to finish.
    pub fn start(&self) {
        self.shared.started.0.store(true, Ordering::SeqCst);
        let watching = self
            .shared
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for waker in watching.values() {
            waker.wake();
        }
    }

    pub fn is_started(&self) -> bool {
        self.shared.started.0.load(Ordering::SeqCst)
    }

    /// A watch for one connection (already draining if [`Drain::start`] was called).
    pub fn watch(&self) -> DrainWatch {
        let waker = Arc::new(AtomicWaker::new());
        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        self.shared
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, waker.clone());
        DrainWatch {
            waker,
            key,
            shared: self.shared.clone(),
            registered: false,
        }
    }
}

impl DrainWatch {
    /// Ready once the connection should finish. Registers `cx`'s waker at the first call
    /// only: every later call must come from the same task (the connection's own).
    pub fn poll_draining(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_draining() {
            return Poll::Ready(());
        }
        if self.registered {
            return Poll::Pending;
        }
        self.registered = true;
        self.waker.register(cx.waker());
        // `start` may have set the flag and woken the list between the load and the
        // registration: the flag is set before the wake, so this load sees it.
        if self.is_draining() {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    pub fn is_draining(&self) -> bool {
        self.shared.started.0.load(Ordering::SeqCst)
    }

    /// Resolves once the connection should finish (in the task that awaits it).
    pub async fn draining(&mut self) {
        std::future::poll_fn(|cx| self.poll_draining(cx)).await;
    }
}

impl Drop for DrainWatch {
    fn drop(&mut self) {
        self.shared
            .watching
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn open_connections_are_woken_and_later_ones_start_draining() {
        let drain = Drain::new();
        let watch = drain.watch();
        assert!(!watch.is_draining());
        let waiting = tokio::spawn(async move {
            let mut watch = watch;
            watch.draining().await;
            watch.is_draining()
        });
        // The watcher is parked on its waker (a positive witness follows: it wakes).
        tokio::task::yield_now().await;
        drain.start();
        let woke = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert!(matches!(woke, Ok(Ok(true))), "{woke:?}");
        assert!(drain.is_started());
        assert!(drain.watch().is_draining(), "accepted after start");
    }

    #[test]
    fn a_closed_connection_leaves_the_list() {
        let drain = Drain::new();
        let first = drain.watch();
        let second = drain.watch();
        let count = || {
            drain
                .shared
                .watching
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
        };
        assert_eq!(count(), 2);
        drop(first);
        assert_eq!(count(), 1);
        drop(second);
        assert_eq!(count(), 0);
    }

    #[test]
    fn an_undisturbed_watch_stays_pending() {
        let drain = Drain::new();
        let mut watch = drain.watch();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(watch.poll_draining(&mut cx).is_pending());
        drain.start();
        assert!(watch.poll_draining(&mut cx).is_ready());
    }
}
