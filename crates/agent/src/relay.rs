//! Byte relay between a client connection and its upstream, counting as it goes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::limits::{Admission, Hold};

/// Per direction; two per connection. 256 KiB measured no better than 64 KiB on loopback
/// (the copies and wake-ups in the kernel dominate, docs/benchmarks.md); 32 KiB keeps the
/// default connection limit (1024, `agent_config::DEFAULT_MAX_CONNECTIONS`) at 64 MiB of
/// buffers, a quarter of the agent container's 256 Mi limit.
pub const RELAY_BUFFER_BYTES: usize = 32 * 1024;
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_PROBES: u32 = 4;

/// What to do when the client stops sending (reads EOF) while the upstream may still answer.
#[derive(Clone, Copy, Debug)]
pub enum HalfClose<'a> {
    /// Shut down the upstream's write side, keep reading its answer (plain TCP).
    Propagate,
    /// Keep the upstream fully open until it closes, or until it has sent nothing for
    /// `idle` after the client's EOF (a client that closed completely looks the same as one
    /// that only half-closed; this bound keeps such connections from living forever). For
    /// tailscaled's dial tunnel: its `serveDial` returns as soon as either copy direction
    /// ends and then closes both the tunnel and the target connection, so forwarding the
    /// client's EOF would cut off the target's answer. With `reclaim`, the held connection
    /// offers its slots to new connections of a full listener (`limits::Admission::hold`) and
    /// ends when one takes them.
    HoldUntilUpstreamCloses {
        idle: Duration,
        reclaim: Option<&'a Admission>,
    },
}

/// A byte count that feeds a Prometheus counter live and keeps the connection's own total.
#[derive(Debug)]
pub struct Tally {
    metric: Counter,
    total: AtomicU64,
}

impl Tally {
    pub fn new(metric: Counter) -> Self {
        Tally {
            metric,
            total: AtomicU64::new(0),
        }
    }

    pub fn add(&self, bytes: usize) {
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self.metric.inc_by(bytes);
        self.total.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// Ends a relay after `every` in which no byte moved (either way): the timer is checked
/// only when it fires, so bytes cost nothing here.
pub struct IdleBound {
    every: Duration,
    seen: u64,
    timer: Pin<Box<Sleep>>,
}

impl IdleBound {
    pub fn new(every: Duration, moved: u64) -> Self {
        IdleBound {
            every,
            seen: moved,
            timer: Box::pin(tokio::time::sleep(every)),
        }
    }

    /// True once `every` passed without `moved` changing.
    pub fn expired(&mut self, cx: &mut Context<'_>, moved: u64) -> bool {
        while self.timer.as_mut().poll(cx).is_ready() {
            if moved == self.seen {
                return true;
            }
            self.seen = moved;
            self.timer.as_mut().reset(Instant::now() + self.every);
        }
        false
    }
}

/// Copies both ways until both directions are done (or, with
/// [`HalfClose::HoldUntilUpstreamCloses`], until the upstream is done), or until
/// `idle_timeout` passed without a byte either way. The first I/O error ends the relay;
/// dropping the streams then closes both connections.
///
/// Both directions are polled by one future that owns both streams (like
/// `tokio::io::copy_bidirectional`, which cannot be used as is: it counts bytes only at the
/// end, while the byte metrics and the idle check below need them live, and it always
/// forwards EOF). Unlike `tokio::io::split` halves, this takes no lock per read or write.
pub async fn relay<C, U>(
    mut client: C,
    mut upstream: U,
    inbound: &Tally,
    outbound: &Tally,
    half_close: HalfClose<'_>,
    idle_timeout: Option<Duration>,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let mut upload = Pump::new(inbound, matches!(half_close, HalfClose::Propagate));
    let mut download = Pump::new(outbound, true);
    let moved = || inbound.total().wrapping_add(outbound.total());
    let mut idle_bound = idle_timeout.map(|every| IdleBound::new(every, moved()));
    match half_close {
        HalfClose::Propagate => {
            std::future::poll_fn(|cx| {
                let up = upload.poll_copy(cx, &mut client, &mut upstream)?;
                let down = download.poll_copy(cx, &mut upstream, &mut client)?;
                if up.is_ready() && down.is_ready() {
                    return Poll::Ready(Ok(()));
                }
                if idle_bound
                    .as_mut()
                    .is_some_and(|bound| bound.expired(cx, moved()))
                {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            })
            .await
        }
        HalfClose::HoldUntilUpstreamCloses { idle, reclaim } => {
            let mut upload_done = false;
            // Armed at the client's EOF: from then on, the relay ends after `idle` in which
            // the upstream sent nothing, or when a new connection takes its slots (only while
            // the download is idle: the pump marks its hold busy before writing).
            let mut silence: Option<IdleBound> = None;
            let mut reclaimed: Option<Pin<Box<_>>> = None;
            std::future::poll_fn(|cx| {
                if !upload_done && upload.poll_copy(cx, &mut client, &mut upstream)?.is_ready() {
                    upload_done = true;
                    silence = Some(IdleBound::new(idle, outbound.total()));
                    if let Some(admission) = reclaim {
                        let hold = admission.hold();
                        if download.start < download.end {
                            // Still writing what it read: busy, not to be taken.
                            hold.busy();
                        }
                        reclaimed = Some(Box::pin(hold.reclaimed()));
                        download.hold = Some(hold);
                    }
                }
                if reclaimed
                    .as_mut()
                    .is_some_and(|taken| taken.as_mut().poll(cx).is_ready())
                {
                    return Poll::Ready(Ok(()));
                }
                if download
                    .poll_copy(cx, &mut upstream, &mut client)?
                    .is_ready()
                {
                    return Poll::Ready(Ok(()));
                }
                if silence
                    .as_mut()
                    .is_some_and(|bound| bound.expired(cx, outbound.total()))
                {
                    return Poll::Ready(Ok(()));
                }
                if idle_bound
                    .as_mut()
                    .is_some_and(|bound| bound.expired(cx, moved()))
                {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            })
            .await
        }
    }
}

/// One direction of a relay: a buffer between a reader and a writer.
struct Pump<'a> {
    buffer: Box<[u8]>,
    /// `buffer[start..end]` is read and not yet written.
    start: usize,
    end: usize,
    read_done: bool,
    /// Written since the last flush (a TLS or HTTP/2 writer may hold bytes back until then).
    need_flush: bool,
    shutdown_on_eof: bool,
    tally: &'a Tally,
    /// A held connection's offer: marked busy before bytes read are written, idle after.
    hold: Option<Hold>,
}

impl<'a> Pump<'a> {
    fn new(tally: &'a Tally, shutdown_on_eof: bool) -> Self {
        Pump {
            buffer: vec![0u8; RELAY_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            read_done: false,
            need_flush: false,
            shutdown_on_eof,
            tally,
            hold: None,
        }
    }

    /// Ready once the reader reached EOF and everything read was written (and, with
    /// `shutdown_on_eof`, the writer shut down); stays ready after that.
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        loop {
            if self.start == self.end && !self.read_done {
                let mut read = ReadBuf::new(&mut self.buffer);
                match Pin::new(&mut *reader).poll_read(cx, &mut read) {
                    Poll::Ready(Ok(())) => {
                        let filled = read.filled().len();
                        if filled == 0 {
                            self.read_done = true;
                        } else if self.hold.as_ref().is_some_and(|hold| !hold.busy()) {
                            // Taken by a newcomer while idle: these bytes are not written, the
                            // relay ends (it polls the reclaim before this pump again).
                            return Poll::Pending;
                        } else {
                            (self.start, self.end) = (0, filled);
                        }
                    }
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                    Poll::Pending => {
                        // Nothing more to write for now: push out what the writer holds.
                        if self.need_flush {
                            ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                            self.need_flush = false;
                        }
                        return Poll::Pending;
                    }
                }
            }
            while self.start < self.end {
                let written = ready!(
                    Pin::new(&mut *writer).poll_write(cx, &self.buffer[self.start..self.end])
                )?;
                if written == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.start += written;
                self.need_flush = true;
                self.tally.add(written);
                if self.start == self.end
                    && let Some(hold) = &self.hold
                {
                    hold.idle();
                }
            }
            if self.read_done {
                if self.need_flush {
                    ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                    self.need_flush = false;
                }
                if self.shutdown_on_eof {
                    // The peer may already be gone; the direction is finished either way.
                    let _ = ready!(Pin::new(&mut *writer).poll_shutdown(cx));
                    self.shutdown_on_eof = false;
                }
                return Poll::Ready(Ok(()));
            }
        }
    }
}

/// TCP keepalive (dead peers behind NAT or a vanished tailnet path get noticed) and no
/// Nagle delay for interactive protocols.
pub fn tune_tcp(stream: &TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "could not set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%error, "could not enable TCP keepalive");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    const LOCAL: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn tally() -> Tally {
        Tally::new(Counter::default())
    }

    #[tokio::test]
    async fn propagate_forwards_eof_and_still_reads_the_answer() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(
            client,
            upstream,
            &inbound,
            &outbound,
            HalfClose::Propagate,
            None,
        );
        let peers = async {
            client_peer.write_all(b"request").await?;
            client_peer.shutdown().await?;
            let mut request = Vec::new();
            upstream_peer.read_to_end(&mut request).await?;
            assert_eq!(request, b"request");
            upstream_peer.write_all(b"answer").await?;
            upstream_peer.shutdown().await?;
            let mut answer = Vec::new();
            client_peer.read_to_end(&mut answer).await?;
            assert_eq!(answer, b"answer");
            io::Result::Ok(())
        };
        let (relayed, peers) = tokio::join!(relay, peers);
        assert!(relayed.is_ok() && peers.is_ok(), "{relayed:?} {peers:?}");
        assert_eq!((inbound.total(), outbound.total()), (7, 6));
    }

    #[tokio::test]
    async fn hold_keeps_the_upstream_open_after_client_eof() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(
            client,
            upstream,
            &inbound,
            &outbound,
            HalfClose::HoldUntilUpstreamCloses {
                idle: Duration::from_secs(5),
                reclaim: None,
            },
            None,
        );
        let peers = async {
            client_peer.write_all(b"ping").await?;
            client_peer.shutdown().await?;
            let mut request = [0u8; 4];
            upstream_peer.read_exact(&mut request).await?;
            // No EOF reaches the upstream: it can still answer after the client's EOF.
            let pending =
                tokio::time::timeout(Duration::from_millis(100), upstream_peer.read_u8()).await;
            assert!(pending.is_err(), "upstream saw {pending:?}");
            upstream_peer.write_all(b"pong").await?;
            upstream_peer.shutdown().await?;
            let mut answer = Vec::new();
            client_peer.read_to_end(&mut answer).await?;
            assert_eq!(answer, b"pong");
            io::Result::Ok(())
        };
        let (relayed, peers) = tokio::join!(relay, peers);
        assert!(relayed.is_ok() && peers.is_ok(), "{relayed:?} {peers:?}");
    }

    #[tokio::test]
    async fn hold_ends_when_the_upstream_stays_silent_after_client_eof() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, _upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        client_peer
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let started = std::time::Instant::now();
        let ended = tokio::time::timeout(
            Duration::from_secs(2),
            relay(
                client,
                upstream,
                &inbound,
                &outbound,
                HalfClose::HoldUntilUpstreamCloses {
                    idle: Duration::from_millis(100),
                    reclaim: None,
                },
                None,
            ),
        )
        .await;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_held_connection_ends_when_a_newcomer_takes_its_slots() {
        let (listener, agent) = (crate::limits::Gate::new(1), crate::limits::Gate::new(10));
        let admission =
            crate::limits::admit(&listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(
            client,
            upstream,
            &inbound,
            &outbound,
            HalfClose::HoldUntilUpstreamCloses {
                idle: Duration::from_secs(30),
                reclaim: Some(&admission),
            },
            None,
        );
        let newcomer = async {
            // Before the client's EOF the connection is active: a newcomer is refused.
            client_peer.write_all(b"ping").await?;
            let mut request = [0u8; 4];
            upstream_peer.read_exact(&mut request).await?;
            assert!(crate::limits::admit(&listener, &agent, LOCAL).is_err());
            client_peer.shutdown().await?;
            // Held now: the next newcomer takes its slots.
            let started = std::time::Instant::now();
            loop {
                if let Ok(taken) = crate::limits::admit(&listener, &agent, LOCAL) {
                    return io::Result::Ok((taken, started.elapsed()));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let (relayed, newcomer) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(relay, newcomer)
        })
        .await
        .unwrap_or_else(|_| panic!("the held relay did not end for the newcomer"));
        assert!(relayed.is_ok(), "{relayed:?}");
        let (taken, waited) = newcomer.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(taken.reclaimed(), 1);
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        drop(admission);
        assert_eq!(listener.active(), 1, "only the newcomer's slot is left");
    }

    /// The bug: a held tunnel was offered from the client's EOF on, so a newcomer at the
    /// limit ended it while the answer was still streaming, and the client got a clean FIN
    /// after a prefix. Now only a tunnel that relayed nothing for `RECLAIM_QUIET` is taken.
    #[tokio::test]
    async fn a_streaming_held_connection_is_not_taken_and_its_answer_arrives_whole() {
        const ANSWER: usize = 2 << 20;
        let (listener, agent) = (crate::limits::Gate::new(1), crate::limits::Gate::new(10));
        let admission =
            crate::limits::admit(&listener, &agent, LOCAL).unwrap_or_else(|r| panic!("{r:?}"));
        let (client, mut client_peer) = duplex(4096);
        let (upstream, mut upstream_peer) = duplex(4096);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(
            client,
            upstream,
            &inbound,
            &outbound,
            HalfClose::HoldUntilUpstreamCloses {
                idle: Duration::from_secs(30),
                reclaim: Some(&admission),
            },
            None,
        );
        let streamed = std::sync::atomic::AtomicBool::new(false);
        let upstream_side = async {
            let mut request = [0u8; 4];
            upstream_peer.read_exact(&mut request).await?;
            upstream_peer.write_all(&vec![7u8; ANSWER]).await?;
            streamed.store(true, std::sync::atomic::Ordering::SeqCst);
            // Then silent and open: only a reclaim or the 30 s bound ends the relay.
            std::future::pending::<()>().await;
            io::Result::Ok(())
        };
        let client_side = async {
            client_peer.write_all(b"ping").await?;
            client_peer.shutdown().await?;
            let mut answer = Vec::new();
            client_peer.read_to_end(&mut answer).await?;
            io::Result::Ok(answer.len())
        };
        let newcomer = async {
            loop {
                if let Ok(taken) = crate::limits::admit(&listener, &agent, LOCAL) {
                    return (taken, streamed.load(std::sync::atomic::Ordering::SeqCst));
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let outcome = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::select! {
                ended = upstream_side => panic!(
                    "the relay closed the upstream before its answer was through: {ended:?}"
                ),
                all = async { tokio::join!(relay, client_side, newcomer) } => all,
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the held relay was never taken"));
        let (relayed, received, (taken, after_stream)) = outcome;
        assert!(relayed.is_ok(), "{relayed:?}");
        let received = received.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            received, ANSWER,
            "the client got the whole answer before the FIN"
        );
        assert!(
            after_stream,
            "taken only once the upstream had written everything"
        );
        assert_eq!(taken.reclaimed(), 1);
    }

    #[tokio::test]
    async fn the_idle_timeout_ends_a_silent_relay_and_spares_a_talking_one() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(
            client,
            upstream,
            &inbound,
            &outbound,
            HalfClose::Propagate,
            Some(Duration::from_millis(300)),
        );
        let peers = async {
            // 10 round trips 50 ms apart: 500 ms in all, longer than the timeout, never idle.
            for _ in 0..10 {
                client_peer.write_all(b"x").await?;
                let mut byte = [0u8; 1];
                upstream_peer.read_exact(&mut byte).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Then silence: the relay ends and both peers see EOF.
            let mut rest = Vec::new();
            client_peer.read_to_end(&mut rest).await?;
            upstream_peer.read_to_end(&mut rest).await?;
            io::Result::Ok(rest.len())
        };
        let (relayed, peers) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(relay, peers)
        })
        .await
        .unwrap_or_else(|_| panic!("the idle relay did not end"));
        assert!(relayed.is_ok(), "{relayed:?}");
        assert_eq!(peers.ok(), Some(0));
        assert_eq!(
            inbound.total(),
            10,
            "every byte of the talking phase passed"
        );
    }
}
