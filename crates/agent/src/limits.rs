//! Concurrent connection limits, per listener and per agent (`limits` in the config).
//!
//! Every accepted connection holds a slot of its listener's [`Gate`] and one of the agent's
//! until it ends (an upgraded WebSocket tunnel too). A connection that finds either full is
//! reset at once ([`refuse`]): the client sees a prompt `ECONNRESET`, never a hang in the
//! backlog, and the agent spends no buffer on it. Limits are atomics, so a config reload
//! changes them for new connections; open ones keep their slots.
//!
//! Except for **held** connections: an egress tunnel whose client sent EOF stays open while
//! the target may still answer (tailscaled's dial tunnel cannot carry a half-close, see
//! `relay::HalfClose`), and a client that closed completely looks the same. Such a
//! connection offers its slots back ([`Admission::hold`]): a new connection that finds its
//! gate full ends the oldest held one and takes its place instead of being reset — the way
//! nginx closes idle keep-alive connections when it runs out of connections. Without
//! pressure a held connection lives until its target closes or stays silent for the idle
//! bound; under pressure a half-closed client still waiting for an answer can lose it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Open connections against a limit, and how many were refused.
#[derive(Debug)]
pub struct Gate {
    limit: AtomicU32,
    active: AtomicU64,
    refused: AtomicU64,
    /// Held connections, oldest first (entries of ended ones are skipped and pruned).
    held: Mutex<VecDeque<Weak<Held>>>,
    reclaimed: AtomicU64,
}

/// A held connection's offer: ended (cancelled) once by whoever reclaims it first.
#[derive(Debug)]
struct Held {
    taken: AtomicBool,
    ended: CancellationToken,
}

/// One open connection's place in a [`Gate`]; freed on drop.
#[derive(Debug)]
pub struct Slot(Arc<Gate>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    pub fn new(limit: u32) -> Arc<Gate> {
        Arc::new(Gate {
            limit: AtomicU32::new(limit),
            active: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            held: Mutex::new(VecDeque::new()),
            reclaimed: AtomicU64::new(0),
        })
    }

    pub fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Connections this gate's listener refused (for either limit).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A slot, if fewer than the limit are open.
    pub fn try_enter(self: &Arc<Self>) -> Option<Slot> {
        let limit = u64::from(self.limit());
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < limit).then_some(open + 1)
            })
            .ok()
            .map(|_| Slot(self.clone()))
    }

    /// Held connections this gate ended to admit new ones.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    fn offer(&self, held: &Arc<Held>) {
        let mut queue = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        // Ended connections leave their entries behind; keep the queue near the open count.
        if queue.len() >= 2 * usize::try_from(self.limit()).unwrap_or(usize::MAX) + 16 {
            queue.retain(|entry| {
                entry
                    .upgrade()
                    .is_some_and(|held| !held.taken.load(Ordering::Acquire))
            });
        }
        queue.push_back(Arc::downgrade(held));
    }

    /// Ends the oldest held connection that nobody took yet; false if there is none.
    fn reclaim_oldest(&self) -> bool {
        let mut queue = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(entry) = queue.pop_front() {
            if let Some(held) = entry.upgrade()
                && !held.taken.swap(true, Ordering::AcqRel)
            {
                held.ended.cancel();
                self.reclaimed.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// A slot beyond the limit: the one an ended held connection is about to free (it frees
    /// it when its task sees the cancellation, so `active` can exceed the limit by the reclaims
    /// in flight for a moment).
    fn take_over(self: &Arc<Self>) -> Slot {
        self.active.fetch_add(1, Ordering::AcqRel);
        Slot(self.clone())
    }
}

/// Which limit refused a connection; the `reason` label of
/// `tailnet_agent_connections_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The listener's `maxConnectionsPerListener`.
    Listener,
    /// The agent's `maxConnections` (all listeners together).
    Agent,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Listener => "limit",
            Refusal::Agent => "agent_limit",
        }
    }
}

/// The slots one connection holds.
#[derive(Debug)]
pub struct Admission {
    listener: Slot,
    agent: Slot,
    /// How many held connections were ended to admit this one (0 or 1).
    reclaimed: u8,
}

impl Admission {
    /// Held connections ended to admit this one.
    pub fn reclaimed(&self) -> u8 {
        self.reclaimed
    }

    /// Offers this connection's slots to newcomers (see the module docs) until the returned
    /// [`Hold`] is dropped; [`Hold::reclaimed`] completes when one takes them.
    pub fn hold(&self) -> Hold {
        let held = Arc::new(Held {
            taken: AtomicBool::new(false),
            ended: CancellationToken::new(),
        });
        self.listener.0.offer(&held);
        self.agent.0.offer(&held);
        Hold(held)
    }
}

/// A connection's standing offer of its slots; withdrawn on drop.
#[derive(Debug)]
pub struct Hold(Arc<Held>);

impl Hold {
    /// Completes when a new connection took this one's slots: end it now.
    pub fn reclaimed(&self) -> WaitForCancellationFutureOwned {
        self.0.ended.clone().cancelled_owned()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.taken.store(true, Ordering::Release);
    }
}

/// Both slots (taking them from held connections if needed), or which limit is reached
/// (counted on the listener's gate).
pub fn admit(listener: &Arc<Gate>, agent: &Arc<Gate>) -> Result<Admission, Refusal> {
    let refused = |refusal| {
        listener.refused.fetch_add(1, Ordering::Relaxed);
        refusal
    };
    if let Some(listener_slot) = listener.try_enter() {
        let (agent_slot, reclaimed) = match agent.try_enter() {
            Some(slot) => (slot, 0),
            None if agent.reclaim_oldest() => (agent.take_over(), 1),
            None => return Err(refused(Refusal::Agent)),
        };
        return Ok(Admission {
            listener: listener_slot,
            agent: agent_slot,
            reclaimed,
        });
    }
    if listener.reclaim_oldest() {
        // The ended connection held an agent slot too: this one takes both.
        return Ok(Admission {
            listener: listener.take_over(),
            agent: agent.take_over(),
            reclaimed: 1,
        });
    }
    Err(refused(Refusal::Listener))
}

/// Resets a connection that got no slot: `SO_LINGER` 0 makes the close an RST, so the
/// client fails at once instead of waiting for an answer that never comes.
pub fn refuse(stream: TcpStream) {
    if let Err(error) = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO)) {
        tracing::debug!(%error, "could not set SO_LINGER 0 on a refused connection");
    }
    drop(stream);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_freed_on_drop_and_follow_a_new_limit() {
        let (listener, agent) = (Gate::new(2), Gate::new(3));
        let first = admit(&listener, &agent).ok();
        let second = admit(&listener, &agent).ok();
        assert!(first.is_some() && second.is_some());
        assert_eq!(admit(&listener, &agent).err(), Some(Refusal::Listener));
        assert_eq!(
            (listener.active(), agent.active(), listener.refused()),
            (2, 2, 1)
        );
        drop(first);
        assert_eq!((listener.active(), agent.active()), (1, 1));
        let third = admit(&listener, &agent).ok();
        assert!(third.is_some());
        listener.set_limit(10);
        let other = Gate::new(10);
        let fourth = admit(&other, &agent).ok();
        assert!(fourth.is_some(), "the agent gate has its third slot");
        assert_eq!(admit(&other, &agent).err(), Some(Refusal::Agent));
        // A refusal by the agent limit frees the listener slot it had taken.
        assert_eq!((other.active(), other.refused()), (1, 1));
        drop((second, third, fourth));
        assert_eq!(
            (listener.active(), agent.active(), other.active()),
            (0, 0, 0)
        );
    }

    #[tokio::test]
    async fn a_full_gate_ends_the_oldest_held_connection_and_never_an_active_one() {
        let (listener, agent) = (Gate::new(2), Gate::new(10));
        let active = admit(&listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        let older = admit(&listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        // Full, and nothing held: refused.
        assert_eq!(admit(&listener, &agent).err(), Some(Refusal::Listener));
        let older_hold = older.hold();
        let newcomer = admit(&listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        assert_eq!(newcomer.reclaimed(), 1);
        tokio::time::timeout(Duration::from_secs(1), older_hold.reclaimed())
            .await
            .unwrap_or_else(|_| panic!("the held connection was not ended"));
        assert_eq!((listener.reclaimed(), listener.active()), (1, 3));
        drop((older_hold, older));
        assert_eq!(listener.active(), 2);
        // Taken once only: the next one is refused again, the active connection untouched.
        assert_eq!(admit(&listener, &agent).err(), Some(Refusal::Listener));
        let active_hold = active.hold();
        drop(active_hold);
        // A hold that was withdrawn (its connection resumed or ended) is not taken either.
        assert_eq!(admit(&listener, &agent).err(), Some(Refusal::Listener));
        assert_eq!(listener.refused(), 3);
        drop((active, newcomer));
        assert_eq!((listener.active(), agent.active()), (0, 0));
    }

    #[tokio::test]
    async fn held_connections_are_taken_oldest_first_and_by_the_agent_limit_too() {
        let (first_listener, second_listener, agent) = (Gate::new(5), Gate::new(5), Gate::new(2));
        let first = admit(&first_listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        let second = admit(&first_listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        let (first_hold, second_hold) = (first.hold(), second.hold());
        // Another listener's connection, refused by the agent's limit alone, takes the oldest.
        let other = admit(&second_listener, &agent).unwrap_or_else(|r| panic!("{r:?}"));
        assert_eq!(other.reclaimed(), 1);
        assert_eq!(agent.reclaimed(), 1);
        tokio::time::timeout(Duration::from_secs(1), first_hold.reclaimed())
            .await
            .unwrap_or_else(|_| panic!("the oldest held connection was not ended"));
        let second_still_held =
            tokio::time::timeout(Duration::from_millis(50), second_hold.reclaimed()).await;
        assert!(second_still_held.is_err(), "only the oldest is ended");
    }
}
