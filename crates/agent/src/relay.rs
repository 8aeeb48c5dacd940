//! Byte relay between a client connection and its upstream, counting as it goes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Per direction; two per connection.
const RELAY_BUFFER_BYTES: usize = 64 * 1024;
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
const KEEPALIVE_PROBES: u32 = 4;

/// What to do when the client stops sending (reads EOF) while the upstream may still answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfClose {
    /// Shut down the upstream's write side, keep reading its answer (plain TCP).
    Propagate,
    /// Keep the upstream fully open until it closes, or until it has sent nothing for
    /// `idle` after the client's EOF (a client that closed completely looks the same as one
    /// that only half-closed; this bound keeps such connections from living forever). For
    /// tailscaled's dial tunnel: its `serveDial` returns as soon as either copy direction
    /// ends and then closes both the tunnel and the target connection, so forwarding the
    /// client's EOF would cut off the target's answer.
    HoldUntilUpstreamCloses { idle: Duration },
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

/// Copies both ways until both directions are done (or, with
/// [`HalfClose::HoldUntilUpstreamCloses`], until the upstream is done). The first I/O error
/// ends the relay; dropping the streams then closes both connections.
pub async fn relay<C, U>(
    client: C,
    upstream: U,
    inbound: &Tally,
    outbound: &Tally,
    half_close: HalfClose,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let upload = pump(
        &mut client_read,
        &mut upstream_write,
        inbound,
        matches!(half_close, HalfClose::Propagate),
    );
    let download = pump(&mut upstream_read, &mut client_write, outbound, true);
    match half_close {
        HalfClose::Propagate => tokio::try_join!(upload, download).map(|_| ()),
        HalfClose::HoldUntilUpstreamCloses { idle } => {
            tokio::pin!(upload);
            tokio::pin!(download);
            let mut upload_done = false;
            let mut seen = outbound.total();
            loop {
                tokio::select! {
                    result = &mut upload, if !upload_done => {
                        result?;
                        upload_done = true;
                        seen = outbound.total();
                    }
                    result = &mut download => return result,
                    () = tokio::time::sleep(idle), if upload_done => {
                        if outbound.total() == seen {
                            return Ok(());
                        }
                        seen = outbound.total();
                    }
                }
            }
        }
    }
}

async fn pump<R, W>(
    reader: &mut R,
    writer: &mut W,
    tally: &Tally,
    shutdown_on_eof: bool,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; RELAY_BUFFER_BYTES];
    loop {
        let read = reader.read(&mut buffer).await?;
        if read == 0 {
            if shutdown_on_eof {
                // The peer may already be gone; the direction is finished either way.
                let _ = writer.shutdown().await;
            }
            return Ok(());
        }
        writer.write_all(&buffer[..read]).await?;
        writer.flush().await?;
        tally.add(read);
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
    use tokio::io::duplex;

    fn tally() -> Tally {
        Tally::new(Counter::default())
    }

    #[tokio::test]
    async fn propagate_forwards_eof_and_still_reads_the_answer() {
        let (client, mut client_peer) = duplex(1024);
        let (upstream, mut upstream_peer) = duplex(1024);
        let (inbound, outbound) = (tally(), tally());
        let relay = relay(client, upstream, &inbound, &outbound, HalfClose::Propagate);
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
            },
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
                },
            ),
        )
        .await;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
