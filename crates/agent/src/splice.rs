//! Zero-copy relay for plain TCP-to-TCP connections (the `tcp` ingress listener): each
//! direction moves bytes socket → pipe → socket with `splice(2)`, so they are never copied
//! into user space (two copies and a user-space buffer less per direction than
//! [`relay::relay`](crate::relay::relay)).
//!
//! Semantics are those of [`relay::relay`](crate::relay::relay) with
//! [`HalfClose::Propagate`](crate::relay::HalfClose::Propagate): a reader's EOF becomes a
//! `shutdown(SHUT_WR)` of the other socket once everything read was written, the relay ends
//! when both directions are done, and the first I/O error ends it (dropping the streams then
//! closes both connections). The byte tallies count live.
//!
//! Bounded: one pipe per direction at the kernel's default capacity (16 pages, 64 KiB on
//! x86-64/arm64; less when the user is over `/proc/sys/fs/pipe-user-pages-soft`, which only
//! makes the pipe smaller), and a socket is read only when its pipe is empty, so a `splice`
//! into the pipe that finds nothing to move (`EAGAIN`) can only mean "socket not readable",
//! never "pipe full". If no pipe can be created (e.g. out of file descriptors), the relay
//! falls back to the copying one.

//! Relay for plain TCP-to-TCP connections (the `tcp` ingress listener) that moves bulk data
//! with `splice(2)`: socket → pipe → socket, never copied into user space.
//!
//! Each direction starts as the copying relay does ([`relay::relay`](crate::relay::relay):
//! a [`RELAY_BUFFER_BYTES`] buffer, tokio's read/write). A read that fills the whole buffer
//! means the socket had more queued than one buffer: that direction is bulk, and from then on
//! it moves bytes through a pipe of its own. Short and interactive connections (the first
//! bytes, ping-pong) never pay for the pipe's two descriptors and the extra `EAGAIN` a splice
//! read ends with.
//!
//! Semantics are those of [`relay::relay`](crate::relay::relay) with
//! [`HalfClose::Propagate`](crate::relay::HalfClose::Propagate): a reader's EOF becomes a
//! `shutdown(SHUT_WR)` of the other socket once everything read was written, the relay ends
//! when both directions are done, and the first I/O error ends it (dropping the streams then
//! closes both connections). The byte tallies count live.
//!
//! Bounded: one pipe per bulk direction at the kernel's default capacity (16 pages, 64 KiB on
//! x86-64/arm64). A socket is spliced from only while its pipe is empty, so a splice that
//! finds nothing to move (`EAGAIN`) can only mean "socket not readable", never "pipe full".
//! A pipe that cannot be created (out of descriptors) or that the kernel made smaller (the
//! user is over `/proc/sys/fs/pipe-user-pages-soft`) keeps the direction copying.

use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::relay::{IdleBound, RELAY_BUFFER_BYTES, Tally};

/// Bytes asked for per `splice` into the pipe: the default pipe capacity. The kernel moves
/// what fits and what the socket holds.
const SPLICE_CHUNK: usize = 64 * 1024;

/// Relays `client` ↔ `upstream` (both plain TCP) until both directions reached EOF, or the
/// first error.
pub async fn relay_tcp(
    client: TcpStream,
    upstream: TcpStream,
    inbound: &Tally,
    outbound: &Tally,
    idle_timeout: Option<Duration>,
) -> io::Result<()> {
    relay_counting_splices(client, upstream, inbound, outbound, idle_timeout)
        .await
        .0
}

/// [`relay_tcp`], and whether each direction (upload, download) switched to splice.
async fn relay_counting_splices(
    mut client: TcpStream,
    mut upstream: TcpStream,
    inbound: &Tally,
    outbound: &Tally,
    idle_timeout: Option<Duration>,
) -> (io::Result<()>, bool, bool) {
    let mut upload = Pump::new(inbound);
    let mut download = Pump::new(outbound);
    let moved = || inbound.total().wrapping_add(outbound.total());
    let mut idle_bound = idle_timeout.map(|every| IdleBound::new(every, moved()));
    let result = std::future::poll_fn(|cx| {
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
    .await;
    (result, upload.spliced(), download.spliced())
}

/// Both ends of a non-blocking pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A pipe of at least [`SPLICE_CHUNK`] bytes, or why not.
    fn for_splice() -> io::Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let capacity = fcntl(&write, FcntlArg::F_GETPIPE_SZ)?;
        if usize::try_from(capacity).unwrap_or(0) < SPLICE_CHUNK {
            return Err(io::Error::other(format!(
                "the kernel gave a pipe of {capacity} bytes (pipe-user-pages-soft reached)"
            )));
        }
        Ok(Pipe { read, write })
    }
}

enum Mode {
    Copy,
    Splice {
        pipe: Pipe,
        /// Bytes in the pipe, read and not yet written.
        in_pipe: usize,
    },
}

/// One direction: reader socket → buffer or pipe → writer socket.
struct Pump<'a> {
    buffer: Box<[u8]>,
    /// `buffer[start..end]` is read and not yet written.
    start: usize,
    end: usize,
    mode: Mode,
    /// The last read filled the buffer: switch to splice once it is written.
    bulk: bool,
    /// False once a pipe could not be had: this direction keeps copying.
    may_splice: bool,
    read_done: bool,
    /// The writer's write side was shut down after the reader's EOF: the direction is done.
    finished: bool,
    tally: &'a Tally,
}

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

impl<'a> Pump<'a> {
    fn new(tally: &'a Tally) -> Self {
        Pump {
            buffer: vec![0u8; RELAY_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            mode: Mode::Copy,
            bulk: false,
            may_splice: true,
            read_done: false,
            finished: false,
            tally,
        }
    }

    fn spliced(&self) -> bool {
        matches!(self.mode, Mode::Splice { .. })
    }

    /// Ready once the reader reached EOF, everything read was written and the writer was shut
    /// down; stays ready after that.
    fn poll_copy(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut TcpStream,
        writer: &mut TcpStream,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.finished {
                return Poll::Ready(Ok(()));
            }
            let drained = self.start == self.end
                && match &self.mode {
                    Mode::Copy => true,
                    Mode::Splice { in_pipe, .. } => *in_pipe == 0,
                };
            if self.read_done && drained {
                // The peer may already be gone; the direction is finished either way.
                let _ = socket2::SockRef::from(&*writer).shutdown(std::net::Shutdown::Write);
                self.finished = true;
                return Poll::Ready(Ok(()));
            }
            // Each step returns Ready(Ok) after progress (loop again), Pending when it waits.
            ready!(match self.mode {
                Mode::Copy => self.step_copy(cx, reader, writer),
                Mode::Splice { .. } => self.step_splice(cx, reader, writer),
            })?;
        }
    }

    fn step_copy(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut TcpStream,
        writer: &mut TcpStream,
    ) -> Poll<io::Result<()>> {
        if self.start == self.end {
            let mut read = ReadBuf::new(&mut self.buffer);
            ready!(Pin::new(&mut *reader).poll_read(cx, &mut read))?;
            let filled = read.filled().len();
            if filled == 0 {
                self.read_done = true;
                return Poll::Ready(Ok(()));
            }
            self.bulk = filled == self.buffer.len();
            (self.start, self.end) = (0, filled);
        }
        while self.start < self.end {
            let pending = self.buffer.get(self.start..self.end).unwrap_or_default();
            let written = ready!(Pin::new(&mut *writer).poll_write(cx, pending))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.start += written;
            self.tally.add(written);
        }
        if self.bulk && self.may_splice {
            self.bulk = false;
            match Pipe::for_splice() {
                Ok(pipe) => self.mode = Mode::Splice { pipe, in_pipe: 0 },
                Err(error) => {
                    self.may_splice = false;
                    tracing::debug!(%error, "no pipe for splice; this direction keeps copying");
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn step_splice(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut TcpStream,
        writer: &mut TcpStream,
    ) -> Poll<io::Result<()>> {
        let Mode::Splice { pipe, in_pipe } = &mut self.mode else {
            return Poll::Ready(Ok(()));
        };
        if *in_pipe == 0 {
            // The pipe is empty, so EAGAIN here means the socket has nothing (see the module
            // docs); `try_io` then clears the socket's readiness.
            let moved = reader.try_io(Interest::READABLE, || {
                splice(&*reader, None, &pipe.write, None, SPLICE_CHUNK, flags())
                    .map_err(io::Error::from)
            });
            match moved {
                Ok(0) => {
                    self.read_done = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(bytes) => *in_pipe = bytes,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    ready!(reader.poll_read_ready(cx))?;
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                    return Poll::Ready(Ok(()));
                }
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        while *in_pipe > 0 {
            // The pipe holds bytes, so EAGAIN here means the socket's send buffer is full.
            let moved = writer.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, &*writer, None, *in_pipe, flags()).map_err(io::Error::from)
            });
            match moved {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(bytes) => {
                    // splice never moves more than asked; saturating keeps that an invariant
                    // without a panic path.
                    *in_pipe = in_pipe.saturating_sub(bytes);
                    self.tally.add(bytes);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    ready!(writer.poll_write_ready(cx))?;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn tally() -> Tally {
        Tally::new(Counter::default())
    }

    /// A connected pair of loopback sockets: (ours, the peer's).
    async fn socket_pair() -> io::Result<(TcpStream, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (connected, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        Ok((connected?, accepted?.0))
    }

    /// Deterministic, non-repeating-looking bytes (so shifted or dropped chunks show up).
    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state.to_le_bytes()[0]
            })
            .collect()
    }

    /// client_peer ↔ [client | relay | upstream] ↔ upstream_peer
    /// The task yields (result, bytes in, bytes out, (upload spliced, download spliced)).
    type Relayed = tokio::task::JoinHandle<(io::Result<()>, u64, u64, (bool, bool))>;

    async fn relayed() -> io::Result<(TcpStream, TcpStream, Relayed)> {
        let (client_peer, client) = socket_pair().await?;
        let (upstream, upstream_peer) = socket_pair().await?;
        let task = tokio::spawn(async move {
            let (inbound, outbound) = (tally(), tally());
            let (result, up, down) =
                relay_counting_splices(client, upstream, &inbound, &outbound, None).await;
            (result, inbound.total(), outbound.total(), (up, down))
        });
        Ok((client_peer, upstream_peer, task))
    }

    #[test]
    fn pipes_for_splice_can_be_created_here() {
        assert!(Pipe::for_splice().is_ok());
    }

    #[tokio::test]
    async fn large_transfers_both_ways_arrive_byte_for_byte() -> io::Result<()> {
        const UP: usize = 24 << 20;
        const DOWN: usize = 40 << 20;
        let (client_peer, upstream_peer, task) = relayed().await?;
        let (up, down) = (pattern(UP, 1), pattern(DOWN, 2));
        let (mut client_read, mut client_write) = client_peer.into_split();
        let (mut upstream_read, mut upstream_write) = upstream_peer.into_split();
        let sent_up = up.clone();
        let sent_down = down.clone();
        let (a, b, c, d) = tokio::join!(
            async move {
                client_write.write_all(&sent_up).await?;
                client_write.shutdown().await
            },
            async move {
                upstream_write.write_all(&sent_down).await?;
                upstream_write.shutdown().await
            },
            async move {
                let mut got = Vec::new();
                upstream_read.read_to_end(&mut got).await.map(|_| got)
            },
            async move {
                let mut got = Vec::new();
                client_read.read_to_end(&mut got).await.map(|_| got)
            },
        );
        a?;
        b?;
        let (at_upstream, at_client) = (c?, d?);
        assert!(
            at_upstream == up,
            "upload differs ({} bytes)",
            at_upstream.len()
        );
        assert!(
            at_client == down,
            "download differs ({} bytes)",
            at_client.len()
        );
        let (result, inbound, outbound, spliced) = task.await.map_err(io::Error::other)?;
        assert_eq!(spliced, (true, true), "bulk directions switch to splice");
        result?;
        assert_eq!((inbound, outbound), (UP as u64, DOWN as u64));
        Ok(())
    }

    #[tokio::test]
    async fn a_half_close_is_forwarded_and_the_answer_still_arrives() -> io::Result<()> {
        let (mut client_peer, mut upstream_peer, task) = relayed().await?;
        client_peer.write_all(b"request").await?;
        client_peer.shutdown().await?;
        // The upstream sees the request and then EOF (not a reset, not a hang) …
        let mut request = Vec::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            upstream_peer.read_to_end(&mut request),
        )
        .await
        .map_err(io::Error::other)??;
        assert_eq!(request, b"request");
        // … and can still answer on its open write side.
        let answer = pattern(3 << 20, 7);
        upstream_peer.write_all(&answer).await?;
        upstream_peer.shutdown().await?;
        let mut got = Vec::new();
        client_peer.read_to_end(&mut got).await?;
        assert!(got == answer, "answer differs ({} bytes)", got.len());
        let (result, inbound, outbound, spliced) = task.await.map_err(io::Error::other)?;
        assert!(spliced.1, "the 3 MiB answer went through the pipe");
        result?;
        assert_eq!((inbound, outbound), (7, answer.len() as u64));
        Ok(())
    }

    #[tokio::test]
    async fn a_slow_reader_gets_everything_without_unbounded_buffering() -> io::Result<()> {
        const TOTAL: usize = 8 << 20;
        let (client_peer, mut upstream_peer, task) = relayed().await?;
        let data = pattern(TOTAL, 3);
        let sent = data.clone();
        let (_client_read, mut client_write) = client_peer.into_split();
        let writer = tokio::spawn(async move {
            client_write.write_all(&sent).await?;
            client_write.shutdown().await
        });
        // Read in small bites with pauses: the relay must wait on the full socket buffer
        // (EAGAIN on the way out) and resume.
        let mut got = Vec::with_capacity(TOTAL);
        let mut bite = vec![0u8; 4096];
        let mut reads = 0u32;
        loop {
            let n = upstream_peer.read(&mut bite).await?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(bite.get(..n).unwrap_or_default());
            reads += 1;
            if reads.is_multiple_of(256) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        writer.await.map_err(io::Error::other)??;
        assert!(got == data, "upload differs ({} bytes)", got.len());
        upstream_peer.shutdown().await?;
        let (result, inbound, _, spliced) = task.await.map_err(io::Error::other)?;
        assert!(spliced.0, "the upload went through the pipe");
        result?;
        assert_eq!(inbound, TOTAL as u64);
        Ok(())
    }

    #[tokio::test]
    async fn a_reset_upstream_ends_the_relay_with_an_error_and_closes_the_client() -> io::Result<()>
    {
        let (mut client_peer, upstream_peer, task) = relayed().await?;
        client_peer.write_all(b"hello").await?;
        // RST instead of FIN.
        socket2::SockRef::from(&upstream_peer).set_linger(Some(Duration::ZERO))?;
        drop(upstream_peer);
        let (result, _, _, _) = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .map_err(io::Error::other)?
            .map_err(io::Error::other)?;
        assert!(result.is_err(), "the relay ended without error: {result:?}");
        // The client's side is closed (EOF or reset), not left hanging.
        let mut rest = Vec::new();
        let ended =
            tokio::time::timeout(Duration::from_secs(10), client_peer.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "the client connection was left open");
        Ok(())
    }

    #[tokio::test]
    async fn ping_pong_messages_pass_one_by_one() -> io::Result<()> {
        let (mut client_peer, mut upstream_peer, task) = relayed().await?;
        for round in 0..200u32 {
            let message = pattern(64, round);
            client_peer.write_all(&message).await?;
            let mut got = [0u8; 64];
            upstream_peer.read_exact(&mut got).await?;
            assert_eq!(got.as_slice(), message.as_slice(), "round {round} upload");
            upstream_peer.write_all(&got).await?;
            let mut back = [0u8; 64];
            client_peer.read_exact(&mut back).await?;
            assert_eq!(
                back.as_slice(),
                message.as_slice(),
                "round {round} download"
            );
        }
        drop((client_peer, upstream_peer));
        let (result, inbound, outbound, spliced) = task.await.map_err(io::Error::other)?;
        assert_eq!(
            spliced,
            (false, false),
            "64-byte messages never need a pipe"
        );
        result?;
        assert_eq!((inbound, outbound), (200 * 64, 200 * 64));
        Ok(())
    }

    /// A relayed TCP connection without a byte either way for the idle timeout ends (both
    /// peers see EOF); one that keeps talking is not ended early.
    #[tokio::test]
    async fn the_idle_timeout_ends_a_silent_connection_only() -> io::Result<()> {
        let (mut client_peer, client) = socket_pair().await?;
        let (upstream, mut upstream_peer) = socket_pair().await?;
        let task = tokio::spawn(async move {
            let (inbound, outbound) = (tally(), tally());
            let timeout = Some(Duration::from_millis(300));
            relay_counting_splices(client, upstream, &inbound, &outbound, timeout)
                .await
                .0
        });
        // 10 round trips 50 ms apart (500 ms, longer than the timeout): still open.
        for round in 0..10u32 {
            let message = pattern(16, round);
            client_peer.write_all(&message).await?;
            let mut got = [0u8; 16];
            upstream_peer.read_exact(&mut got).await?;
            upstream_peer.write_all(&got).await?;
            client_peer.read_exact(&mut got).await?;
            assert_eq!(got.as_slice(), message.as_slice(), "round {round}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Silence: the relay ends and closes both.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client_peer.read_to_end(&mut rest))
            .await
            .map_err(io::Error::other)??;
        tokio::time::timeout(
            Duration::from_secs(10),
            upstream_peer.read_to_end(&mut rest),
        )
        .await
        .map_err(io::Error::other)??;
        assert!(rest.is_empty());
        task.await.map_err(io::Error::other)?
    }
}
