//! Concurrent connection limits, per listener and per agent (`limits` in the config).
//!
//! Every accepted connection holds a slot of its listener's [`Gate`] and one of the agent's
//! until it ends (an upgraded WebSocket tunnel too). A connection that finds either full is
//! reset at once ([`refuse`]): the client sees a prompt `ECONNRESET`, never a hang in the
//! backlog, and the agent spends no buffer on it. Limits are atomics, so a config reload
//! changes them for new connections; open ones keep their slots.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;

/// Open connections against a limit, and how many were refused.
#[derive(Debug)]
pub struct Gate {
    limit: AtomicU32,
    active: AtomicU64,
    refused: AtomicU64,
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
    _listener: Slot,
    _agent: Slot,
}

/// Both slots, or which limit is reached (counted on the listener's gate).
pub fn admit(listener: &Arc<Gate>, agent: &Arc<Gate>) -> Result<Admission, Refusal> {
    let refused = |refusal| {
        listener.refused.fetch_add(1, Ordering::Relaxed);
        refusal
    };
    let listener_slot = listener
        .try_enter()
        .ok_or_else(|| refused(Refusal::Listener))?;
    let agent_slot = agent.try_enter().ok_or_else(|| refused(Refusal::Agent))?;
    Ok(Admission {
        _listener: listener_slot,
        _agent: agent_slot,
    })
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
}
