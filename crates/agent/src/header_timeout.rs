//! hyper's HTTP/1.1 header read timeout, kept per connection instead of per request.
//!
//! hyper arms its header read timer for every request head (and between requests: it is the
//! keep-alive idle timeout too) through [`hyper::rt::Timer::sleep_until`] and drops it once
//! the head is in. With `TokioTimer` each request pays a clock read, a boxed tokio `Sleep`
//! and an insert into and a removal from the runtime's timer wheel, for a timer that almost
//! never fires. Here, as with nginx's lazy timers, hyper gets a zero-sized sleep (boxing it
//! allocates nothing) that only counts the head waits, and the connection keeps one tokio
//! timer of its own, a [`HeadWatch`] that looks every eighth of the timeout: a head wait it
//! finds unchanged for the whole timeout has expired. hyper is then polled once with its
//! sleep reporting that, and closes the connection exactly as it does on its own timer. A
//! head wait ends between `timeout` and `timeout * 9/8` after it began (30–34 s for
//! the agent's 30 s), one wake-up per connection every `timeout / 8`.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// Looks per timeout: a head wait is expired at the first look that is a whole timeout after
/// the look that first saw it.
const LOOKS_PER_TIMEOUT: u32 = 8;
/// Looks after expiry at which a connection hyper did not close is dropped by the watch.
const LOOKS_TO_ABANDON: u32 = LOOKS_PER_TIMEOUT + 2;

thread_local! {
    /// Set only while [`HeadWatch`]'s connection is polled after its head wait expired: the
    /// one [`HeadSleep`] hyper polls then is that connection's (a connection waiting for a
    /// head has no request in flight that could poll another).
    static HEAD_WAIT_EXPIRED: Cell<bool> = const { Cell::new(false) };
}

/// Head waits begun by hyper and heads handed to the service, for one connection.
#[derive(Debug, Default)]
pub struct HeadWaits {
    begun: AtomicU64,
    arrived: AtomicU64,
}

impl HeadWaits {
    /// The service got a request head: the wait for it is over.
    pub fn head_arrived(&self) {
        // One writer (the connection's task): a load and a store, no locked instruction.
        let arrived = self.arrived.load(Ordering::Relaxed);
        self.arrived.store(arrived + 1, Ordering::Relaxed);
    }

    fn begin(&self) {
        let begun = self.begun.load(Ordering::Relaxed);
        self.begun.store(begun + 1, Ordering::Relaxed);
    }

    /// The wait hyper is in now, if any (numbered from 1).
    fn current(&self) -> Option<u64> {
        let begun = self.begun.load(Ordering::Relaxed);
        (begun > self.arrived.load(Ordering::Relaxed)).then_some(begun)
    }
}

/// The [`Timer`] given to hyper's HTTP/1.1 connection (its only use of a timer).
#[derive(Debug)]
pub struct HeadTimer {
    waits: Arc<HeadWaits>,
    /// hyper adds the timeout to `now()` for a deadline this timer does not use: no clock read.
    made: Instant,
}

impl HeadTimer {
    pub fn new(waits: Arc<HeadWaits>) -> Self {
        HeadTimer {
            waits,
            made: Instant::now(),
        }
    }
}

impl Timer for HeadTimer {
    fn sleep(&self, _duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.waits.begin();
        Box::pin(HeadSleep)
    }

    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn Sleep>> {
        self.waits.begin();
        Box::pin(HeadSleep)
    }

    fn now(&self) -> Instant {
        self.made
    }

    fn reset(&self, _sleep: &mut Pin<Box<dyn Sleep>>, _new_deadline: Instant) {
        self.waits.begin();
    }
}

/// hyper's header read sleep: ready only when polled while its connection's wait expired.
struct HeadSleep;

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if HEAD_WAIT_EXPIRED.with(Cell::get) {
            Poll::Ready(())
        } else {
            // The watch's own timer wakes the connection's task when it is time to look.
            Poll::Pending
        }
    }
}

impl Sleep for HeadSleep {}

/// What the watch makes of the connection's head waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadVerdict {
    /// Poll the connection as usual.
    Serve,
    /// Poll it with hyper's header read sleep ready: hyper closes it.
    Expire,
    /// hyper did not close it when told: drop it.
    Abandon,
}

/// The wait the watch has been seeing and at how many looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sighting {
    wait: u64,
    looks: u32,
}

/// One look: the sighting after it (pure).
fn look(previous: Option<Sighting>, current_wait: Option<u64>) -> Option<Sighting> {
    let wait = current_wait?;
    match previous {
        Some(seen) if seen.wait == wait => Some(Sighting {
            wait,
            looks: seen.looks.saturating_add(1),
        }),
        _ => Some(Sighting { wait, looks: 1 }),
    }
}

/// The verdict for a sighting (pure). The first look at a wait comes within a look period of
/// its start; `LOOKS_PER_TIMEOUT` periods later the wait has lasted at least the timeout.
fn verdict(sighting: Option<Sighting>) -> HeadVerdict {
    match sighting {
        Some(seen) if seen.looks > LOOKS_TO_ABANDON => HeadVerdict::Abandon,
        Some(seen) if seen.looks > LOOKS_PER_TIMEOUT => HeadVerdict::Expire,
        _ => HeadVerdict::Serve,
    }
}

/// The connection's one timer for its header read timeout.
pub struct HeadWatch {
    waits: Arc<HeadWaits>,
    period: Duration,
    tick: Pin<Box<tokio::time::Sleep>>,
    /// Whether the tick has been polled (its waker registered) since it was last reset.
    registered: bool,
    sighting: Option<Sighting>,
}

impl HeadWatch {
    pub fn new(waits: Arc<HeadWaits>, timeout: Duration) -> Self {
        let period = (timeout / LOOKS_PER_TIMEOUT).max(Duration::from_millis(1));
        HeadWatch {
            waits,
            period,
            // Once per connection, not per request.
            tick: Box::pin(tokio::time::sleep(period)),
            registered: false,
            sighting: None,
        }
    }

    /// Looks at the head waits if it is time to, then polls `connection` accordingly:
    /// `None` when the connection is to be dropped ([`HeadVerdict::Abandon`]).
    pub fn poll_connection<T>(
        &mut self,
        cx: &mut Context<'_>,
        connection: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Option<Poll<T>> {
        // Between looks the timer is only checked (one load), not polled: polling a tokio
        // timer registers the waker again and takes from the task's budget every time.
        let mut fired = self.registered && self.tick.is_elapsed();
        if fired || !self.registered {
            self.registered = true;
            loop {
                if fired {
                    self.sighting = look(self.sighting, self.waits.current());
                    let next = tokio::time::Instant::now() + self.period;
                    self.tick.as_mut().reset(next);
                }
                // Registers the task's waker for the next look; outside the task's budget,
                // which could otherwise refuse it.
                let mut tick = tokio::task::unconstrained(self.tick.as_mut());
                if Pin::new(&mut tick).poll(cx).is_pending() {
                    break;
                }
                fired = true;
            }
        }
        poll_with_verdict(verdict(self.sighting), || connection(cx))
    }
}

/// Polls `connection` the way `verdict` says; `None` for [`HeadVerdict::Abandon`].
fn poll_with_verdict<T>(
    verdict: HeadVerdict,
    connection: impl FnOnce() -> Poll<T>,
) -> Option<Poll<T>> {
    match verdict {
        HeadVerdict::Serve => Some(connection()),
        HeadVerdict::Expire => {
            HEAD_WAIT_EXPIRED.with(|expired| expired.set(true));
            let polled = connection();
            HEAD_WAIT_EXPIRED.with(|expired| expired.set(false));
            Some(polled)
        }
        HeadVerdict::Abandon => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(wait: u64, looks: u32) -> Option<Sighting> {
        Some(Sighting { wait, looks })
    }

    #[test]
    fn no_wait_is_never_expired() {
        assert_eq!(look(seen(3, 9), None), None);
        assert_eq!(verdict(None), HeadVerdict::Serve);
    }

    #[test]
    fn a_new_wait_starts_counting_again() {
        assert_eq!(look(None, Some(1)), seen(1, 1));
        assert_eq!(look(seen(1, 4), Some(2)), seen(2, 1));
    }

    #[test]
    fn the_same_wait_expires_after_the_whole_timeout_then_is_abandoned() {
        let mut sighting = None;
        let mut verdicts = Vec::new();
        for _ in 0..12 {
            sighting = look(sighting, Some(7));
            verdicts.push(verdict(sighting));
        }
        use HeadVerdict::{Abandon, Expire, Serve};
        // The first look comes within a period of the start: expired at the ninth, when the
        // wait has lasted at least 8 periods (the timeout).
        assert_eq!(
            verdicts,
            [
                Serve, Serve, Serve, Serve, Serve, Serve, Serve, Serve, Expire, Expire, Abandon,
                Abandon
            ]
        );
    }

    #[test]
    fn waits_are_counted_by_the_timer_and_ended_by_arrivals() {
        let waits = Arc::new(HeadWaits::default());
        let timer = HeadTimer::new(waits.clone());
        assert_eq!(waits.current(), None);
        let _sleep = timer.sleep_until(timer.now() + Duration::from_secs(30));
        assert_eq!(waits.current(), Some(1));
        waits.head_arrived();
        assert_eq!(waits.current(), None);
        let mut sleep = timer.sleep(Duration::from_secs(30));
        assert_eq!(waits.current(), Some(2));
        timer.reset(&mut sleep, timer.now());
        assert_eq!(waits.current(), Some(3));
    }

    #[test]
    fn the_sleep_is_ready_only_inside_an_expired_poll() {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut sleep = HeadSleep;
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        let inside = poll_with_verdict(HeadVerdict::Expire, || {
            Pin::new(&mut HeadSleep).poll(&mut Context::from_waker(waker))
        });
        assert_eq!(inside, Some(Poll::Ready(())));
        assert!(Pin::new(&mut sleep).poll(&mut cx).is_pending());
        let served = poll_with_verdict(HeadVerdict::Serve, || {
            Pin::new(&mut HeadSleep).poll(&mut Context::from_waker(waker))
        });
        assert_eq!(served, Some(Poll::Pending));
        assert_eq!(
            poll_with_verdict(HeadVerdict::Abandon, || Poll::Ready(())),
            None
        );
    }

    #[test]
    fn a_zero_sized_sleep_is_boxed_without_allocating() {
        assert_eq!(std::mem::size_of::<HeadSleep>(), 0);
    }
}
