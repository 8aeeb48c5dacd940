//! Concurrent connection limits, per listener, per source and per agent (`limits` in the
//! config).
//!
//! Every accepted connection holds a slot of its listener's [`Gate`], one of its source
//! address's share on that listener (`maxConnectionsPerSource`; not for loopback sources:
//! ingress connections all arrive from tailscaled on 127.0.0.1, so the share cannot tell
//! their clients apart) and one of the agent's, until it ends (an upgraded WebSocket tunnel
//! too). A connection that finds any of them full is reset at once ([`refuse`]): the client
//! sees a prompt `ECONNRESET`, never a hang in the backlog, and the agent spends no buffer on
//! it. Limits are atomics, so a config reload changes them for new connections; open ones keep
//! their slots.
//!
//! Except for **held** connections: an egress tunnel whose client sent EOF stays open while
//! the target may still answer (tailscaled's dial tunnel cannot carry a half-close, see
//! `relay::HalfClose`), and a client that closed completely looks the same. Such a
//! connection offers its slots back ([`Admission::hold`]): a new connection that finds its
//! gate (or its source's share) full ends the oldest held one that is **idle** — no byte
//! relayed for [`RECLAIM_QUIET`] and none being written — and takes its place instead of
//! being reset, the way nginx closes idle keep-alive connections when it runs out of
//! connections. A held tunnel that is still streaming an answer is never taken: the relay
//! marks it busy before it writes a byte it read ([`Hold::busy`]) and the taking is one
//! compare-and-swap against that mark, so a tunnel is either taken before a new byte goes out
//! or not at all. Without pressure a held connection lives until its target closes or stays
//! silent for the idle bound.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tailnet_api::agent_config::ConnectionLimits;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long a held connection must have relayed nothing before a newcomer may take its
/// slots: a target that pauses shorter than this while answering keeps its tunnel.
pub const RECLAIM_QUIET: Duration = Duration::from_millis(200);

/// Open connections against a limit, and how many were refused.
#[derive(Debug)]
pub struct Gate {
    limit: AtomicU32,
    active: AtomicU64,
    refused: AtomicU64,
    /// Held connections, oldest first (entries of ended ones are skipped and pruned).
    held: Mutex<VecDeque<Weak<Held>>>,
    reclaimed: AtomicU64,
    /// Per source address (never loopback): at most `source_limit` of this gate's slots.
    source_limit: AtomicU32,
    sources: Mutex<HashMap<IpAddr, u32>>,
    /// Relay idle timeout of this listener's connections, in milliseconds (0: none).
    idle_timeout_ms: AtomicU64,
}

/// A held connection's offer: its state word is `milliseconds since `epoch` of its last
/// activity << 2 | tag`, so a taker's idle check and its taking are one compare-and-swap.
#[derive(Debug)]
struct Held {
    state: AtomicU64,
    epoch: Instant,
    source: Option<IpAddr>,
    ended: CancellationToken,
}

/// Offered and idle since the stamp.
const IDLE: u64 = 0;
/// Writing bytes it read: not to be taken.
const BUSY: u64 = 1;
/// Taken by a newcomer (its `ended` is cancelled).
const TAKEN: u64 = 2;
/// Withdrawn (the connection ended or resumed).
const WITHDRAWN: u64 = 3;
const TAG: u64 = 3;

impl Held {
    fn stamp(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX >> 2) << 2
    }

    /// Takes it if it has been idle for `quiet`; the one compare-and-swap decides.
    fn take_if_idle(&self, quiet: Duration) -> Taking {
        let state = self.state.load(Ordering::Acquire);
        match state & TAG {
            IDLE => {
                let since = state >> 2;
                let now = self.stamp() >> 2;
                let quiet_ms = u64::try_from(quiet.as_millis()).unwrap_or(u64::MAX);
                if now.saturating_sub(since) < quiet_ms {
                    return Taking::NotIdle;
                }
                match self.state.compare_exchange(
                    state,
                    (state & !TAG) | TAKEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        self.ended.cancel();
                        Taking::Taken
                    }
                    Err(_) => Taking::NotIdle,
                }
            }
            BUSY => Taking::NotIdle,
            _ => Taking::Gone,
        }
    }
}

enum Taking {
    Taken,
    /// Offered, but relaying or not quiet long enough: stays in the queue.
    NotIdle,
    /// Taken or withdrawn already: its entry can go.
    Gone,
}

/// One open connection's place in a [`Gate`]; freed on drop.
#[derive(Debug)]
pub struct Slot(Arc<Gate>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One open connection's place in its source's share of a [`Gate`]; freed on drop.
#[derive(Debug)]
pub struct SourceSlot(Arc<Gate>, IpAddr);

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut sources = self
            .0
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = sources.get_mut(&self.1) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                sources.remove(&self.1);
            }
        }
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
            source_limit: AtomicU32::new(u32::MAX),
            sources: Mutex::new(HashMap::new()),
            idle_timeout_ms: AtomicU64::new(0),
        })
    }

    /// A listener's gate as `limits` says: its slots, the per-source share, the relay idle
    /// timeout.
    pub fn for_listener(limits: &ConnectionLimits) -> Arc<Gate> {
        let gate = Gate::new(limits.max_connections_per_listener);
        gate.configure_listener(limits);
        gate
    }

    /// Applies `limits` to a listener's gate (for new connections).
    pub fn configure_listener(&self, limits: &ConnectionLimits) {
        self.set_limit(limits.max_connections_per_listener);
        self.set_source_limit(limits.max_connections_per_source);
        self.set_idle_timeout(Some(Duration::from_secs(u64::from(
            limits.idle_timeout_seconds,
        ))));
    }

    pub fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// At most this many of the gate's slots per (non-loopback) source address.
    pub fn set_source_limit(&self, limit: u32) {
        self.source_limit.store(limit, Ordering::Relaxed);
    }

    /// The relay idle timeout of this listener's connections (`None`: none).
    pub fn set_idle_timeout(&self, timeout: Option<Duration>) {
        let millis = timeout.map_or(0, |timeout| {
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
        });
        self.idle_timeout_ms.store(millis, Ordering::Relaxed);
    }

    pub fn idle_timeout(&self) -> Option<Duration> {
        match self.idle_timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(Duration::from_millis(millis)),
        }
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Connections from `source` open on this gate.
    pub fn from_source(&self, source: IpAddr) -> u32 {
        self.sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&source)
            .copied()
            .unwrap_or(0)
    }

    /// Connections this gate's listener refused (for any limit).
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

    /// A place in `source`'s share: `None` for loopback (not counted), `Some(Err(()))` if the
    /// share is used up.
    fn try_enter_source(self: &Arc<Self>, source: IpAddr) -> Option<Result<SourceSlot, ()>> {
        if source.is_loopback() {
            return None;
        }
        let limit = self.source_limit.load(Ordering::Relaxed);
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let count = sources.entry(source).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                sources.remove(&source);
            }
            return Some(Err(()));
        }
        *count += 1;
        Some(Ok(SourceSlot(self.clone(), source)))
    }

    /// A place in `source`'s share beyond it: the one a taken held connection of that source
    /// is about to free.
    fn take_over_source(self: &Arc<Self>, source: IpAddr) -> SourceSlot {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        *sources.entry(source).or_insert(0) += 1;
        SourceSlot(self.clone(), source)
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
                entry.upgrade().is_some_and(|held| {
                    let tag = held.state.load(Ordering::Acquire) & TAG;
                    tag == IDLE || tag == BUSY
                })
            });
        }
        queue.push_back(Arc::downgrade(held));
    }

    /// Ends the oldest held connection (of `source`, if given) that is idle and nobody took
    /// yet; false if there is none.
    fn reclaim_oldest(&self, source: Option<IpAddr>) -> bool {
        let mut queue = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mut index = 0;
        while let Some(entry) = queue.get(index) {
            let Some(held) = entry.upgrade() else {
                queue.remove(index);
                continue;
            };
            if source.is_some_and(|source| held.source != Some(source)) {
                index += 1;
                continue;
            }
            match held.take_if_idle(RECLAIM_QUIET) {
                Taking::Taken => {
                    queue.remove(index);
                    self.reclaimed.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Taking::NotIdle => index += 1,
                Taking::Gone => {
                    queue.remove(index);
                }
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
    /// The source address's `maxConnectionsPerSource` on the listener.
    Source,
    /// The agent's `maxConnections` (all listeners together).
    Agent,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Listener => "limit",
            Refusal::Source => "source_limit",
            Refusal::Agent => "agent_limit",
        }
    }
}

/// The slots one connection holds.
#[derive(Debug)]
pub struct Admission {
    listener: Slot,
    agent: Slot,
    source: Option<SourceSlot>,
    /// How many held connections were ended to admit this one (0 or 1).
    reclaimed: u8,
}

impl Admission {
    /// Held connections ended to admit this one.
    pub fn reclaimed(&self) -> u8 {
        self.reclaimed
    }

    /// The relay idle timeout of the listener this connection came through.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.listener.0.idle_timeout()
    }

    /// Offers this connection's slots to newcomers (see the module docs) until the returned
    /// [`Hold`] is dropped; [`Hold::reclaimed`] completes when one takes them. Idle from now.
    pub fn hold(&self) -> Hold {
        let epoch = Instant::now();
        let held = Arc::new(Held {
            state: AtomicU64::new(IDLE),
            epoch,
            source: self.source.as_ref().map(|slot| slot.1),
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

    /// Marks the connection busy before it writes bytes it read; false if it was taken
    /// already (then it must end without writing them).
    pub fn busy(&self) -> bool {
        let mut state = self.0.state.load(Ordering::Acquire);
        loop {
            match state & TAG {
                IDLE => match self.0.state.compare_exchange(
                    state,
                    (state & !TAG) | BUSY,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return true,
                    Err(current) => state = current,
                },
                TAKEN => return false,
                _ => return true,
            }
        }
    }

    /// Marks the connection idle from now, after it wrote what it read.
    pub fn idle(&self) {
        let stamp = self.0.stamp();
        // Only BUSY → IDLE: a taken or withdrawn offer stays so.
        let _ = self
            .0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                (state & TAG == BUSY).then_some(stamp | IDLE)
            });
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self
            .0
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                let tag = state & TAG;
                (tag == IDLE || tag == BUSY).then_some((state & !TAG) | WITHDRAWN)
            });
    }
}

/// All slots (taking them from idle held connections if needed), or which limit is reached
/// (counted on the listener's gate).
pub fn admit(
    listener: &Arc<Gate>,
    agent: &Arc<Gate>,
    source: IpAddr,
) -> Result<Admission, Refusal> {
    let refused = |refusal| {
        listener.refused.fetch_add(1, Ordering::Relaxed);
        refusal
    };
    let source_slot = match listener.try_enter_source(source) {
        None => None,
        Some(Ok(slot)) => Some(slot),
        // The source used up its share: only one of its own idle held connections makes room.
        Some(Err(())) => {
            if listener.reclaim_oldest(Some(source)) {
                return Ok(Admission {
                    listener: listener.take_over(),
                    agent: agent.take_over(),
                    source: Some(listener.take_over_source(source)),
                    reclaimed: 1,
                });
            }
            return Err(refused(Refusal::Source));
        }
    };
    if let Some(listener_slot) = listener.try_enter() {
        let (agent_slot, reclaimed) = match agent.try_enter() {
            Some(slot) => (slot, 0),
            None if agent.reclaim_oldest(None) => (agent.take_over(), 1),
            None => return Err(refused(Refusal::Agent)),
        };
        return Ok(Admission {
            listener: listener_slot,
            agent: agent_slot,
            source: source_slot,
            reclaimed,
        });
    }
    if listener.reclaim_oldest(None) {
        // The ended connection held an agent slot too: this one takes both.
        return Ok(Admission {
            listener: listener.take_over(),
            agent: agent.take_over(),
            source: source_slot,
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
    use std::net::{Ipv4Addr, Ipv6Addr};

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const POD_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 0, 7));
    const POD_B: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 8));

    /// Admits, polling until a held connection became idle long enough to be taken.
    async fn admit_eventually(
        listener: &Arc<Gate>,
        agent: &Arc<Gate>,
        source: IpAddr,
    ) -> Admission {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(admission) = admit(listener, agent, source) {
                    return admission;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("never admitted"))
    }

    #[test]
    fn slots_are_bounded_freed_on_drop_and_follow_a_new_limit() {
        let (listener, agent) = (Gate::new(2), Gate::new(3));
        let first = admit(&listener, &agent, LOCAL).ok();
        let second = admit(&listener, &agent, LOCAL).ok();
        assert!(first.is_some() && second.is_some());
        assert_eq!(
            admit(&listener, &agent, LOCAL).err(),
            Some(Refusal::Listener)
        );
        assert_eq!(
            (listener.active(), agent.active(), listener.refused()),
            (2, 2, 1)
        );
        drop(first);
        assert_eq!((listener.active(), agent.active()), (1, 1));
        let third = admit(&listener, &agent, LOCAL).ok();
        assert!(third.is_some());
        listener.set_limit(10);
        let other = Gate::new(10);
        let fourth = admit(&other, &agent, LOCAL).ok();
        assert!(fourth.is_some(), "the agent gate has its third slot");
        assert_eq!(admit(&other, &agent, LOCAL).err(), Some(Refusal::Agent));
        // A refusal by the agent limit frees the listener slot it had taken.
        assert_eq!((other.active(), other.refused()), (1, 1));
        drop((second, third, fourth));
        assert_eq!(
            (listener.active(), agent.active(), other.active()),
            (0, 0, 0)
        );
    }

    #[test]
    fn one_source_gets_its_share_and_loopback_is_not_counted() {
        let (listener, agent) = (Gate::new(10), Gate::new(10));
        listener.set_source_limit(2);
        let a1 = admit(&listener, &agent, POD_A).ok();
        let a2 = admit(&listener, &agent, POD_A).ok();
        assert!(a1.is_some() && a2.is_some());
        assert_eq!(admit(&listener, &agent, POD_A).err(), Some(Refusal::Source));
        // Other sources still get in, and loopback (tailscaled's ingress) is not a source.
        let b = admit(&listener, &agent, POD_B).ok();
        let locals: Vec<_> = (0..5)
            .map(|_| admit(&listener, &agent, LOCAL).ok())
            .collect();
        assert!(b.is_some() && locals.iter().all(Option::is_some));
        assert_eq!(
            (listener.from_source(POD_A), listener.from_source(POD_B)),
            (2, 1)
        );
        assert_eq!((listener.active(), listener.refused()), (8, 1));
        drop(a1);
        assert_eq!(listener.from_source(POD_A), 1);
        assert!(admit(&listener, &agent, POD_A).is_ok());
        drop((a2, b, locals));
        assert_eq!((listener.from_source(POD_A), listener.active()), (0, 0));
    }

    #[tokio::test]
    async fn a_source_over_its_share_takes_only_its_own_idle_held_connection() {
        let (listener, agent) = (Gate::new(10), Gate::new(10));
        listener.set_source_limit(1);
        let other = admit(&listener, &agent, POD_B).unwrap_or_else(|r| panic!("{r:?}"));
        let _other_hold = other.hold();
        let own = admit(&listener, &agent, POD_A).unwrap_or_else(|r| panic!("{r:?}"));
        let own_hold = own.hold();
        let newcomer = admit_eventually(&listener, &agent, POD_A).await;
        assert_eq!(newcomer.reclaimed(), 1);
        tokio::time::timeout(Duration::from_secs(1), own_hold.reclaimed())
            .await
            .unwrap_or_else(|_| panic!("its own held connection was not ended"));
        drop((own_hold, own));
        assert_eq!(listener.from_source(POD_A), 1);
        assert_eq!(
            listener.from_source(POD_B),
            1,
            "the other source's is untouched"
        );
    }

    #[test]
    fn a_busy_hold_is_never_taken_and_an_idle_one_at_once() {
        // Quiet 0: time plays no part, only the state word does.
        let (listener, agent) = (Gate::new(1), Gate::new(10));
        let admission = admit(&listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let hold = admission.hold();
        assert!(hold.busy());
        assert!(matches!(
            hold.0.take_if_idle(Duration::ZERO),
            Taking::NotIdle
        ));
        hold.idle();
        assert!(matches!(hold.0.take_if_idle(Duration::ZERO), Taking::Taken));
        assert!(!hold.busy(), "taken: the relay must not write what it read");
        assert!(matches!(hold.0.take_if_idle(Duration::ZERO), Taking::Gone));
        drop(hold);
        let withdrawn = admission.hold();
        drop(withdrawn);
        let hold = admission.hold();
        drop(hold);
        assert!(
            !listener.reclaim_oldest(None),
            "withdrawn holds are not taken"
        );
    }

    #[tokio::test]
    async fn a_full_gate_ends_the_oldest_idle_held_connection_and_never_an_active_one() {
        let (listener, agent) = (Gate::new(2), Gate::new(10));
        let active = admit(&listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let older = admit(&listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        // Full, and nothing held: refused.
        assert_eq!(
            admit(&listener, &agent, LOCAL).err(),
            Some(Refusal::Listener)
        );
        let older_hold = older.hold();
        let newcomer = admit_eventually(&listener, &agent, LOCAL).await;
        assert_eq!(newcomer.reclaimed(), 1);
        tokio::time::timeout(Duration::from_secs(1), older_hold.reclaimed())
            .await
            .unwrap_or_else(|_| panic!("the held connection was not ended"));
        assert_eq!((listener.reclaimed(), listener.active()), (1, 3));
        drop((older_hold, older));
        assert_eq!(listener.active(), 2);
        // Taken once only: the next one is refused again, the active connection untouched.
        assert_eq!(
            admit(&listener, &agent, LOCAL).err(),
            Some(Refusal::Listener)
        );
        let active_hold = active.hold();
        drop(active_hold);
        // A hold that was withdrawn (its connection resumed or ended) is not taken either.
        assert!(!listener.reclaim_oldest(None));
        drop((active, newcomer));
        assert_eq!((listener.active(), agent.active()), (0, 0));
    }

    #[tokio::test]
    async fn held_connections_are_taken_oldest_first_and_by_the_agent_limit_too() {
        let (first_listener, second_listener, agent) = (Gate::new(5), Gate::new(5), Gate::new(2));
        let first = admit(&first_listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let second = admit(&first_listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let (first_hold, second_hold) = (first.hold(), second.hold());
        // Another listener's connection, refused by the agent's limit alone, takes the oldest.
        let other = admit_eventually(&second_listener, &agent, LOCAL).await;
        assert_eq!(other.reclaimed(), 1);
        assert_eq!(agent.reclaimed(), 1);
        tokio::time::timeout(Duration::from_secs(1), first_hold.reclaimed())
            .await
            .unwrap_or_else(|_| panic!("the oldest held connection was not ended"));
        assert!(
            !second_hold.0.ended.is_cancelled(),
            "only the oldest is ended"
        );
    }
}
